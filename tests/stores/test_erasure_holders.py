"""An erasure holds for every holder of a session: actors in this process and in others (those
that follow the store and those that do not), compactions in flight, summaries that copy the
erased events, forks (linked by identity, not by a reusable name), the stores' listing copies,
and a scrub that fails.

Runs on memory, SQLite and PostgreSQL (``NOUS_SESSION_TEST_POSTGRES``), on asyncio and trio.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from nous_session import (
    CompactionPolicy,
    ConflictError,
    EventType,
    Message,
    SessionActor,
)
from nous_session.erasure import ERASED_CONTENT
from nous_session.metadata import SessionMetadata
from tests.support.erasure import Backend, make_backend, secret, text_of
from tests.support.processes import Lines, ending

pytestmark = pytest.mark.anyio

BOT = Path(__file__).parents[1] / "support" / "erasure_bot.py"


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    yield from make_backend(request.param, tmp_path)


@pytest.fixture(params=["sqlite", "postgres"])
def durable(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    yield from make_backend(request.param, tmp_path)


class Gate:
    """A summarizer that quotes what it summarises, and waits at its first call until
    released (a compaction in flight)."""

    def __init__(self) -> None:
        self.started = anyio.Event()
        self.release = anyio.Event()
        self.calls = 0

    async def __call__(self, messages: Sequence[Message]) -> str:
        self.calls += 1
        if self.calls == 1:
            self.started.set()
            await self.release.wait()
        return "summary: " + " | ".join(message.text for message in messages)


async def _other(backend: Backend, store: Any) -> Any:
    """Another holder's store: a store object of its own (another process's, as far as the
    store can tell), but the same one for memory (a process's memory is its own)."""
    return store if backend.kind == "memory" else backend.make()


async def _close(other: Any, store: Any) -> None:
    if other is not store:
        await other.aclose()


async def _until_started(session: SessionActor, gate: Gate) -> None:
    """Append until the compaction starts and waits in the summarizer."""
    index = 0
    while not gate.started.is_set():
        await session.add_message(Message.user(f"filler {index}"))
        index += 1
        await anyio.lowlevel.checkpoint()


async def test_the_erasing_actors_compaction_in_flight_is_refused_as_stale(
    backend: Backend, store: Any
) -> None:
    gate = Gate()
    hidden = secret()
    policy = CompactionPolicy(keep_last=2, every=6, summarizer=gate)
    async with SessionActor.open(session_id="s", store=store, compaction=policy) as session:
        said = await session.add_message(Message.user(f"my secret is {hidden}"))
        await session.add_message(Message.assistant("noted"))
        await _until_started(session, gate)
        result = await session.erase([said.seq], reason="gdpr")
        assert result.proven is (backend.kind != "memory"), result.detail
        gate.release.set()
        await session.wait_for_compaction()
        assert session.statistics().compactions_stale >= 1
        assert hidden not in text_of(session.log.events())
        assert all(hidden not in message.text for message in session.messages())
    assert hidden not in text_of(await store.load("s"))
    assert sum(backend.hits(hidden).values()) == 0


@pytest.mark.parametrize("follow", [False, True])
async def test_another_holders_compaction_in_flight_cannot_write_the_text_back(
    backend: Backend, store: Any, follow: bool
) -> None:
    if follow and backend.kind == "memory":
        pytest.skip("a MemoryStore has no change feed to follow")
    gate = Gate()
    hidden = secret()
    policy = CompactionPolicy(keep_last=2, every=6, summarizer=gate)
    other = await _other(backend, store)
    try:
        async with SessionActor.open(
            session_id="s", store=other, compaction=policy, follow=follow
        ) as bot:
            said = await bot.add_message(Message.user(f"my secret is {hidden}"))
            await bot.add_message(Message.assistant("noted"))
            await _until_started(bot, gate)
            result = await store.erase("s", [said.seq], reason="gdpr")
            assert result.erased == (said.seq,)
            gate.release.set()
            for index in range(8):  # a later compaction plans on the bot's log
                await bot.add_message(Message.user(f"more {index}"))
            await bot.wait_for_compaction()
            assert bot.statistics().compactions_stale >= 1
            assert hidden not in text_of(bot.log.events())
    finally:
        await _close(other, store)
    assert hidden not in text_of(await store.load("s"))


async def test_a_holder_that_does_not_follow_has_its_replace_refused_after_an_erasure(
    backend: Backend, store: Any
) -> None:
    hidden = secret()
    other = await _other(backend, store)
    try:
        async with SessionActor.open(
            session_id="s", store=other, follow=False, on_conflict="rebase"
        ) as holder:
            said = await holder.add_message(Message.user(f"my secret is {hidden}"))
            await holder.add_message(Message.assistant("noted"))
            # What the holder's caller planned on the content before the erasure.
            copied = Message.system(f"the user said: {holder.messages()[0].text}")
            await store.erase("s", [said.seq], reason="gdpr")
            with pytest.raises(ConflictError, match="erased since this was planned"):
                await holder.replace(0, 0, [copied])
            assert hidden not in text_of(holder.log.events())  # it read the erased log
            # A plain append is new content: it lands, after the erasure's record.
            event = await holder.add_message(Message.user("and now?"))
            assert holder.log.events()[event.seq - 1].type is EventType.ERASURE
    finally:
        await _close(other, store)
    assert hidden not in text_of(await store.load("s"))


async def test_a_follower_and_its_subscribers_hear_of_an_erasure_made_elsewhere(
    durable: Backend,
) -> None:
    hidden = secret()
    store = durable.make()
    other = durable.make()
    try:
        async with SessionActor.open(session_id="s", store=store, follow=True) as bot:
            said = await bot.add_message(Message.user(f"my secret is {hidden}"))
            await bot.add_message(Message.assistant("noted"))
            seen: list[Any] = []
            async with bot.subscribe(0) as events:
                result = await other.erase("s", [said.seq], reason="gdpr")
                assert result.proven, result.detail
                with anyio.fail_after(20):
                    async for event in events:
                        seen.append(event)
                        if event.type is EventType.ERASURE:
                            break
            record = seen[-1]
            assert record.data["seqs"] == [said.seq]
            assert record.data["reason"] == "gdpr"
            # The follower replaced its copy: its log, and what a subscriber reads from now.
            assert hidden not in text_of(bot.log.events())
            async with bot.subscribe(0) as again:
                replay = []
                async for event in again:
                    replay.append(event)
                    if event.seq == record.seq:
                        break
            assert hidden not in text_of(replay)
    finally:
        await other.aclose()
        await store.aclose()


async def test_a_subscriber_gets_the_seqs_to_redact(store: Any) -> None:
    hidden = secret()
    async with SessionActor.open(session_id="s", store=store) as session:
        said = await session.add_message(Message.user(f"my secret is {hidden}"))
        async with session.subscribe(0) as events:
            first = [await events.__anext__()]
            assert hidden in text_of(first)  # on screen before the erasure
            await session.erase([said.seq], reason="gdpr")
            after = []
            async for event in events:
                after.append(event)
                if event.type is EventType.ERASURE:
                    break
        assert after[-1].data["seqs"] == [said.seq]
        assert hidden not in text_of(after)


async def test_erasing_by_seq_erases_the_summaries_that_copy_it(store: Any) -> None:
    hidden = secret()
    async with SessionActor.open(session_id="s", store=store) as session:
        await session.add_message(Message.system("be brief"))
        said = await session.add_message(Message.user(f"my secret is {hidden}"))
        await session.add_message(Message.assistant("noted"))
        first = await session.replace(1, 2, [Message.system(f"summary: said {hidden}")])
        await session.add_message(Message.user("later"))
        # A summary of the summary copies it too.
        second = await session.replace(1, 4, [Message.system(f"older: {hidden}")])
        kept = await session.erase([said.seq], reason="gdpr", summaries=False)
        assert kept.summaries == ()
        assert hidden in text_of(session.log.events())
        result = await session.erase([said.seq], reason="gdpr")
        assert result.summaries == (first.seq, second.seq)
        assert result.erased == (first.seq, second.seq)
        assert result.already == (said.seq,)
        assert hidden not in text_of(session.log.events())
        assert [message.text for message in session.messages()] == ["be brief", ERASED_CONTENT]
    assert hidden not in text_of(await store.load("s"))


async def test_erasure_does_not_follow_a_stale_fork_link_into_a_new_session_of_that_name(
    store: Any,
) -> None:
    old, new = secret(), secret()
    async with SessionActor.open(session_id="a", store=store) as session:
        await session.add_message(Message.system("prompt"))
        await session.add_message(Message.user(f"old a: {old}"))
    await store.fork("a", "b", at=1)
    assert await store.delete("a")  # b keeps its own copy
    async with SessionActor.open(session_id="a", store=store) as session:
        await session.add_message(Message.system("prompt"))
        await session.add_message(Message.user(f"new a: {new}"))
    result = await store.erase("a", [1], reason="r")
    assert result.sessions == ()
    assert old in text_of(await store.load("b"))
    assert new not in text_of(await store.load("a"))
    back = await store.erase("b", [1], reason="r")
    assert back.sessions == ()
    assert old not in text_of(await store.load("b"))
    assert (await store.load("a"))[1].data["content"] == ERASED_CONTENT  # erased by the first


async def test_erase_session_reaches_what_a_fork_kept_after_the_sessions_own_snapshot(
    backend: Backend, store: Any
) -> None:
    hidden = secret()
    async with SessionActor.open(session_id="a", store=store) as session:
        await session.add_message(Message.system("prompt"))
        await session.add_message(Message.user(f"my secret is {hidden}"))
        await session.add_message(Message.assistant("noted"))
    await store.fork("a", "b", at=2)
    async with SessionActor.open(session_id="a", store=store) as session:
        await session.replace(0, 2, [Message.system("a summary with no secret")])
        await session.snapshot()  # drops seqs 0..2 from a; b keeps its copy
        assert hidden not in text_of(session.log.events())
    assert hidden in text_of(await store.load("b"))
    result = await store.erase_session("a", reason="account closed")
    assert result.sessions == ("b",)
    assert {0, 1, 2} <= set(result.erased)
    assert result.absent == ()
    assert hidden not in text_of(await store.load("b"))
    assert sum(backend.hits(hidden).values()) == 0


async def test_erase_session_lists_what_no_session_holds_any_more(store: Any) -> None:
    async with SessionActor.open(session_id="a", store=store) as session:
        await session.add_message(Message.user("one"))
        await session.add_message(Message.user("two"))
        await session.replace(0, 0, [Message.user("one, again")])
        await session.snapshot()  # seq 0 goes, held by nobody
        result = await store.erase_session("a", reason="r")
    assert result.absent == (0,)
    assert result.erased == (1, 2)


async def test_listing_copies_and_their_index_entries_go_with_an_erased_metadata_event(
    backend: Backend, store: Any
) -> None:
    owner, title = secret(), secret()
    metadata = SessionMetadata(owner=owner, title=title)
    async with SessionActor.open(session_id="s", store=store, metadata=metadata) as session:
        await session.add_message(Message.user("hello"))
        assert (await store.list_sessions(where={"owner": owner})).sessions
        if backend.kind != "memory":  # the scan sees them before: it can fail
            assert sum(backend.hits(owner).values()) > 0
        record = next(e for e in session.log.events() if e.type is EventType.METADATA)
        result = await session.erase([record.seq], reason="account closed")
        assert result.proven is (backend.kind != "memory"), result.detail
    assert (await store.list_sessions(where={"owner": owner})).sessions == ()
    assert sum(backend.hits(owner).values()) == 0
    assert sum(backend.hits(title).values()) == 0


async def test_a_fork_racing_erase_session_never_keeps_the_erased_metadata(
    backend: Backend, store: Any
) -> None:
    other = await _other(backend, store)
    try:
        for round_ in range(6):
            owner = secret()
            name = f"s{round_}"
            metadata = SessionMetadata(owner=owner, title="t")
            async with SessionActor.open(session_id=name, store=store, metadata=metadata) as s:
                await s.add_message(Message.user("hello"))
            results: dict[str, Any] = {}

            async def erase(name: str = name, results: dict[str, Any] = results) -> None:
                results["erasure"] = await store.erase_session(name, reason="r")

            async def fork(name: str = name) -> None:
                await other.fork(name, f"{name}-fork", at=1)

            async with anyio.create_task_group() as group:
                group.start_soon(erase)
                group.start_soon(fork)
            listed = await store.list_sessions(where={"owner": owner})
            assert listed.sessions == (), (round_, results["erasure"], listed)
            assert owner not in text_of(await store.load(f"{name}-fork"))
    finally:
        await _close(other, store)


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_a_failed_scrub_still_leaves_every_holder_with_the_erased_form(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nous_session.errors import StoreError

    def fail(*args: object, **kwargs: object) -> tuple[bool, str]:
        raise StoreError("the server went away")

    if kind == "sqlite":
        from nous_session.stores.sqlite import _erasure as module

        monkeypatch.setattr(module, "_scrub", fail)
    else:
        from nous_session.stores.postgres import _erasure as module  # type: ignore[no-redef]

        monkeypatch.setattr(module, "scrub_tables", fail)
    for backend in make_backend(kind, tmp_path):
        hidden = secret()
        store = backend.make()
        try:
            async with SessionActor.open(session_id="s", store=store) as session:
                said = await session.add_message(Message.user(f"my secret is {hidden}"))
                result = await session.erase([said.seq], reason="gdpr")
                assert result.erased == (said.seq,)
                assert not result.proven
                assert "not proven" in result.detail
                assert "went away" in result.detail
                assert hidden not in text_of(session.log.events())
                async with session.subscribe(0) as events:
                    replay = [await events.__anext__()]
                assert hidden not in text_of(replay)
            assert hidden not in text_of(await store.load("s"))
        finally:
            await store.aclose()


@pytest.mark.parametrize("loop", ["asyncio", "trio"])
@pytest.mark.parametrize("follow", ["yes", "no"])
def test_a_bot_in_another_process_cannot_write_the_erased_text_back(
    durable: Backend, follow: str, loop: str
) -> None:
    """The bot (erasure_bot.py) has the session open with a compaction waiting in its
    summarizer, which quotes what it summarises; this process erases the text meanwhile."""
    hidden = secret()

    async def erase(seq: int) -> None:
        store = durable.make()
        try:
            result = await store.erase("s", [seq], reason="gdpr")
            assert result.proven, result.detail
        finally:
            await store.aclose()

    async def stored() -> str:
        store = durable.make()
        try:
            return text_of(await store.load("s"))
        finally:
            await store.aclose()

    command = [sys.executable, str(BOT), durable.url(), "s", hidden, follow, loop]
    with (
        subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as bot,
        ending(bot),
    ):
        lines = Lines(bot)
        said = lines.next()
        assert said.startswith("said "), said
        assert lines.next() == "summarizing\n"
        anyio.run(erase, int(said.split()[1]), backend=loop)
        assert bot.stdin is not None
        bot.stdin.write("release\n")
        bot.stdin.flush()
        done = lines.next(timeout=60).split()
        assert done[0] == "done", done
        assert int(done[1]) >= 1  # its compaction in flight was stale
        assert done[2] == "False"  # its log no longer holds the text
        assert bot.wait(timeout=30) == 0
    assert hidden not in anyio.run(stored, backend=loop)
    assert sum(durable.hits(hidden).values()) == 0


def _downgrade(backend: Backend) -> None:
    """Make the store's file or schema as the version before fork identities left it: no
    ``uid`` and ``parent_uid`` columns (nor what encryption at rest added after them: the key
    and key holders tables and the ``kid`` columns), schema version 3."""
    statements = [
        "DROP INDEX {prefix}nous_sessions_kid",
        *(
            f"ALTER TABLE {{prefix}}{table} DROP COLUMN kid"
            for table in ("nous_sessions", "nous_events", "nous_kept")
        ),
        "DROP TABLE {prefix}nous_data_keys",
        "DROP TABLE {prefix}nous_key_holders",
        "DROP INDEX {prefix}nous_sessions_parent_uid",
        "ALTER TABLE {prefix}nous_sessions DROP COLUMN parent_uid",
        "ALTER TABLE {prefix}nous_sessions DROP COLUMN uid",
        "UPDATE {prefix}nous_schema SET version = 3",
    ]
    if backend.kind == "sqlite":
        import sqlite3
        from contextlib import closing

        # closing(): a connection's own `with` commits but does not close it (Python 3.13
        # warns about a connection left to the collector).
        with closing(sqlite3.connect(str(backend.path), isolation_level=None)) as connection:
            for statement in statements:
                connection.execute(statement.format(prefix=""))
        return
    import psycopg

    from tests.support.erasure import POSTGRES_URL

    assert POSTGRES_URL is not None
    with psycopg.connect(POSTGRES_URL, autocommit=True) as connection:
        for statement in statements:
            connection.execute(statement.format(prefix=f"{backend.schema}."))


async def test_a_store_from_before_links_forks_to_their_parents_by_identity(
    durable: Backend,
) -> None:
    """Forks made before sessions had identities: the migration links each to the session of
    its parent's name unless that one is younger than the fork (its parent was deleted and a
    new session took the name)."""
    kept, old = secret(), secret()
    store = durable.make()
    try:
        for name, text in (("p", kept), ("q", old)):
            async with SessionActor.open(session_id=name, store=store) as session:
                await session.add_message(Message.user(f"{name}: {text}"))
            await store.fork(name, f"{name}-fork", at=0)
        assert await store.delete("q")
        async with SessionActor.open(session_id="q", store=store) as session:
            await session.add_message(Message.user("the new q"))
    finally:
        await store.aclose()
    _downgrade(durable)
    store = durable.make()
    try:
        reached = await store.erase("p", [0], reason="r")  # migrates first
        assert reached.sessions == ("p-fork",)
        assert kept not in text_of(await store.load("p-fork"))
        apart = await store.erase("q", [0], reason="r")
        assert apart.sessions == ()
        assert old in text_of(await store.load("q-fork"))
    finally:
        await store.aclose()


async def test_a_summary_of_a_summary_a_snapshot_dropped_goes_with_the_text(
    backend: Backend, store: Any
) -> None:
    """The first summary quoted the text and the second quoted the first; a snapshot dropped
    the text and the first summary. The second one still holds the words: it goes too."""
    hidden = secret()
    async with SessionActor.open(session_id="s", store=store) as session:
        await session.add_message(Message.user("hello"))
        said = await session.add_message(Message.user(f"my secret is {hidden}"))
        await session.add_message(Message.assistant("noted"))
        await session.replace(0, 2, [Message.system(f"summary: {hidden}")])
        second = await session.replace(0, 0, [Message.system(f"older: {hidden}")])
        await session.snapshot()  # drops the messages and the first summary
        result = await session.erase([said.seq], reason="gdpr")
        assert result.absent == (said.seq,)
        assert result.summaries == (second.seq,)
        assert hidden not in text_of(session.log.events())
    assert hidden not in text_of(await store.load("s"))
    assert sum(backend.hits(hidden).values()) == 0


async def test_erasure_reaches_the_forks_of_a_deleted_fork(backend: Backend, store: Any) -> None:
    """A -> B -> C, then B is deleted: C is linked to A (at the lower fork point), so erasing
    A's events reaches C's copy of them."""
    hidden = secret()
    async with SessionActor.open(session_id="a", store=store) as session:
        await session.add_message(Message.user(f"a says {hidden}"))
        await session.add_message(Message.assistant("noted"))
    await store.fork("a", "b", at=1)
    async with SessionActor.open(session_id="b", store=store) as session:
        await session.add_message(Message.user("b's own"))
    await store.fork("b", "c", at=2)
    assert await store.delete("b")
    assert hidden in text_of(await store.load("c"))
    result = await store.erase("a", [0], reason="gdpr")
    assert result.sessions == ("c",)
    assert hidden not in text_of(await store.load("c"))
    stored = await store.read("c")
    assert (stored.parent, stored.fork_point) == ("a", 1)
    assert "b's own" in text_of(await store.load("c"))  # what b wrote is c's own copy now
    assert sum(backend.hits(hidden).values()) == 0
