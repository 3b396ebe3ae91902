"""Erasure: the erased text is gone from the store's bytes, and everything else still works.

Runs on memory, SQLite and PostgreSQL (``NOUS_SESSION_TEST_POSTGRES``; the byte scan needs
``pageinspect``, which needs a superuser), on asyncio and trio.
"""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from nous_session import (
    ErasingStore,
    Erasure,
    EventType,
    Message,
    SessionActor,
    ToolCall,
    select_events,
)
from nous_session.cli import main
from nous_session.erasure import ERASED_CONTENT, erase_event, erased_record
from nous_session.metadata import SessionMetadata
from nous_session.stores import MemoryStore
from nous_session.stores.base import supports
from nous_session.stores.sqlite import SQLiteStore
from tests.support.erasure import (
    POSTGRES_URL,
    Backend,
    make_backend,
)
from tests.support.erasure import secret as _secret
from tests.support.erasure import text_of as _text
from tests.support.erasure import toast_uncompressed as _toast_uncompressed

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    yield from make_backend(request.param, tmp_path)


async def test_an_erased_text_leaves_no_byte_in_the_store(backend: Backend, store: Any) -> None:
    await _toast_uncompressed(backend, store)
    secret = _secret()
    long_secret = _secret()
    async with SessionActor.open(session_id="alice", store=store) as session:
        for index in range(40):
            await session.add_message(Message.user(f"filler {index} " * 20))
        short = await session.add_message(Message.user(f"my number is {secret}", name="alice"))
        # A long one: out of line (TOAST on PostgreSQL, overflow pages on SQLite).
        long = await session.add_message(
            Message.user(long_secret + " " + uuid.uuid4().hex * 200, name="alice")
        )
        for index in range(40):
            await session.add_message(Message.assistant(f"reply {index} " * 20))
        before_secret = backend.hits(secret)
        before_long = backend.hits(long_secret)
        if backend.kind != "memory":  # the scan sees the text before: it can fail
            assert sum(before_secret.values()) > 0, before_secret
            assert sum(before_long.values()) > 0, before_long
        result = await session.erase([short.seq, long.seq], reason="request 17")
        assert result.erased == (short.seq, long.seq)
        assert result.reason == "request 17"
        assert not result.dry_run
        assert result.proven is (backend.kind != "memory"), result.detail
        assert secret not in _text(session.log.events())
    assert sum(backend.hits(secret).values()) == 0
    assert sum(backend.hits(long_secret).values()) == 0
    loaded = await store.load("alice")
    assert secret not in _text(loaded)
    assert long_secret not in _text(loaded)


async def test_the_fold_and_a_reopened_session_show_placeholders_with_tool_calls_paired(
    store: Any,
) -> None:
    call = ToolCall("call-1", "lookup", {"query": "where does alice live"})
    async with SessionActor.open(session_id="s", store=store) as session:
        await session.add_message(Message.system("be brief"))
        asked = await session.add_message(Message.user("I live at 1 Secret Road", name="alice"))
        called = await session.add_message(
            Message.assistant("checking", tool_calls=(call,), reasoning_content="she said 1 Secret")
        )
        answered = await session.add_message(Message.tool("call-1", "1 Secret Road", name="lookup"))
        await session.add_message(Message.assistant("done"))
        count = session.log.count
        result = await session.erase([asked.seq, called.seq, answered.seq], reason="asked to")
        assert result.erased == (asked.seq, called.seq, answered.seq)
        messages = session.messages()
        assert [message.role.value for message in messages] == [
            "system",
            "user",
            "assistant",
            "tool",
            "assistant",
        ]
        assert [message.text for message in messages[1:4]] == [ERASED_CONTENT] * 3
        assert messages[1].name is None
        assert messages[2].reasoning_content is None
        assert [(c.id, c.name, dict(c.arguments)) for c in messages[2].tool_calls] == [  # type: ignore[call-overload]
            ("call-1", "lookup", {})
        ]
        assert messages[3].tool_call_id == "call-1"
        assert messages[1].metadata["erased"]["reason"] == "asked to"
        assert "Secret" not in repr(messages)
        # The erasure is recorded as the session's next event (no text of its own).
        record_event = session.log.events()[-1]
        assert session.log.count == count + 1
        assert record_event.type is EventType.ERASURE
        assert record_event.data["seqs"] == [asked.seq, called.seq, answered.seq]
        assert record_event.data["reason"] == "asked to"
        # The session goes on after an erasure.
        after = await session.add_message(Message.user("next"))
        assert after.seq == count + 1
        erased = session.log.events()
    async with SessionActor.open(session_id="s", store=store) as again:
        assert list(again.log.events()) == list(erased)
        assert again.messages()[-1].text == "next"
        record = erased_record(again.log.events()[asked.seq])
        assert record is not None
        assert record[1] == "asked to"


async def test_a_subscriber_reads_the_erased_form_of_what_it_had_not_reached(store: Any) -> None:
    secret = _secret()
    async with SessionActor.open(session_id="s", store=store) as session:
        await session.add_message(Message.user("first"))
        said = await session.add_message(Message.user(secret))
        await session.add_message(Message.user("third"))
        async with session.subscribe(0) as events:
            first = await events.__anext__()  # reads ahead the events committed so far
            assert first.data["content"] == "first"
            await session.erase([said.seq], reason="r")
            second = await events.__anext__()
            assert second.seq == said.seq
            assert second.data["content"] == ERASED_CONTENT
            third = await events.__anext__()
            assert third.data["content"] == "third"


async def test_forks_that_hold_the_erased_events_are_erased_and_named(store: Any) -> None:
    secret = _secret()
    async with SessionActor.open(session_id="root", store=store) as session:
        await session.add_message(Message.system("hi"))
        said = await session.add_message(Message.user(secret))
        for index in range(3):
            await session.add_message(Message.assistant(f"a{index}"))
    await store.fork("root", "child", at=3)
    await store.fork("child", "grandchild", at=2)
    await store.fork("root", "early", at=0)  # forked before the text: untouched
    # The child gets its own copy (a snapshot of the root copies what it shares first).
    async with SessionActor.open(session_id="root", store=store) as session:
        await session.remove(0, 0)
        await session.snapshot()
    # Erased from the grandchild: the event came from the root, so all of them lose it.
    result = await store.erase("grandchild", [said.seq], reason="gdpr")
    assert result.erased == (said.seq,)
    assert result.sessions == ("child", "root")
    for name in ("root", "child", "grandchild"):
        events = await store.load(name)
        assert secret not in _text(events), name
        held = {event.seq: event for event in events}
        assert erased_record(held[said.seq]) is not None
    assert [event.seq for event in await store.load("early")] == [0]
    # Erasing again finds it erased, everywhere.
    again = await store.erase("root", [said.seq], reason="gdpr")
    assert again.erased == ()
    assert again.already == (said.seq,)


async def test_an_event_a_snapshot_kept_for_its_idempotency_key_is_erased_too(
    backend: Backend, store: Any
) -> None:
    secret = _secret()
    async with SessionActor.open(session_id="s", store=store) as session:
        said = await session.add_message(Message.user(secret), key="call-1")
        edit = await session.replace(said.position, said.position, Message.user("edited"))
        await session.snapshot()  # drops the original, kept aside for its key
        stored = await store.read("s")
        assert [event.seq for event in stored.kept] == [said.seq]
        assert said.seq not in {event.seq for event in session.log.events()}
        result = await session.erase([said.seq], reason="r")
        # The replace that took its place may copy it: it goes too, by default.
        assert result.erased == (said.seq, edit.seq)
        assert result.summaries == (edit.seq,)
        # A retry with the key still gets its (erased) event, at its seq.
        again = await session.add_message(Message.user(secret), key="call-1")
        assert again.seq == said.seq
        assert again.data["content"] == ERASED_CONTENT
    stored = await store.read("s")
    assert secret not in _text(stored.kept)
    assert sum(backend.hits(secret).values()) == 0


async def test_a_bad_seq_or_reason_raises_and_changes_nothing(store: Any) -> None:
    async with SessionActor.open(session_id="s", store=store) as session:
        for index in range(3):
            await session.add_message(Message.user(f"m{index}"))
        before = list(session.log.events())
        for seqs in ([3], [-1], [0, 99], ["0"], [True], 5, "0"):
            with pytest.raises(ValueError, match="seq"):
                await session.erase(seqs, reason="r")  # type: ignore[arg-type]
        for reason in ("", "  ", None, "x" * 1001):
            with pytest.raises(ValueError, match="reason"):
                await session.erase([0], reason=reason)  # type: ignore[arg-type]
        assert list(session.log.events()) == before
        with pytest.raises(ValueError, match="no session"):
            await store.erase("nobody", [0], reason="r")
        with pytest.raises(ValueError, match="seq 3"):
            await store.erase("s", [0, 3], reason="r")
    assert list(await store.load("s")) == before


async def test_a_dry_run_says_what_it_would_erase_and_changes_nothing(store: Any) -> None:
    async with SessionActor.open(session_id="s", store=store) as session:
        for index in range(3):
            await session.add_message(Message.user(f"m{index}"))
    await store.fork("s", "f", at=1)
    before = list(await store.load("s"))
    result = await store.erase("s", [0, 2], reason="r", dry_run=True)
    assert result.dry_run
    assert not result.proven
    assert result.erased == (0, 2)
    assert result.sessions == ("f",)
    assert list(await store.load("s")) == before


async def test_an_event_a_snapshot_dropped_is_reported_absent(store: Any) -> None:
    async with SessionActor.open(session_id="s", store=store) as session:
        gone = await session.add_message(Message.user("dropped"))
        await session.add_message(Message.user("kept"))
        await session.remove(gone.position, gone.position)
        await session.snapshot()
        assert gone.seq not in {event.seq for event in session.log.events()}
        result = await session.erase([gone.seq, 1], reason="r")
    assert result.absent == (gone.seq,)
    assert result.erased == (1,)


async def test_erase_session_erases_what_the_session_wrote(store: Any) -> None:
    async with SessionActor.open(session_id="parent", store=store) as session:
        await session.add_message(Message.system("shared prompt"))
        await session.add_message(Message.user("parent's own"))
    await store.fork("parent", "fork", at=1)
    async with SessionActor.open(session_id="fork", store=store) as session:
        await session.add_message(Message.user("the fork's own words"))
        await session.add_message(Message.assistant("and its reply"))
    result = await store.erase_session("fork", reason="account closed")
    assert result.erased == (2, 3)
    assert result.sessions == ()
    assert result.absent == ()
    texts = [event.data["content"] for event in await store.load("fork") if event.is_surface]
    assert texts == ["shared prompt", "parent's own", ERASED_CONTENT, ERASED_CONTENT]
    assert [event.type for event in await store.load("fork")][-1] is EventType.ERASURE
    assert [event.data["content"] for event in await store.load("parent")] == [
        "shared prompt",
        "parent's own",
    ]
    inherited = await store.erase_session("fork", reason="everything", inherited=True)
    assert inherited.erased == (0, 1)
    assert inherited.already == (2, 3)
    assert inherited.sessions == ("parent",)
    parent = await store.load("parent")
    assert [event.data.get("content") for event in parent] == [ERASED_CONTENT] * 2 + [None]
    assert parent[-1].type is EventType.ERASURE
    assert parent[-1].data["seqs"] == [0, 1]


async def test_erasing_a_metadata_event_erases_the_stores_copy_of_it(
    backend: Backend, store: Any
) -> None:
    # The store keeps each session's current metadata record beside it, for listing; erasing
    # the event that set it must not leave the record there (nor in a fork that inherited it).
    await _toast_uncompressed(backend, store)
    secret = _secret()
    metadata = SessionMetadata(owner="ann", title=f"about {secret}")
    async with SessionActor.open(session_id="s", store=store, metadata=metadata) as session:
        await session.add_message(Message.user("hello"))
    await store.fork("s", "f", at=1)
    listed = await store.list_sessions(where={"owner": "ann"})
    assert sorted(entry.session_id for entry in listed.sessions) == ["f", "s"]
    result = await store.erase_session("s", reason="account closed")
    assert result.sessions == ("f",)
    assert (await store.list_sessions(where={"owner": "ann"})).sessions == ()
    for entry in (await store.list_sessions()).sessions:
        assert entry.metadata == SessionMetadata(), entry
    assert sum(backend.hits(secret).values()) == 0


async def test_erasure_keeps_appends_another_actor_makes_meanwhile(
    backend: Backend, store: Any
) -> None:
    secret = _secret()
    writer_store = store
    other = backend.make() if backend.kind != "memory" else store
    try:
        async with SessionActor.open(session_id="s", store=writer_store) as writer:
            said = await writer.add_message(Message.user(secret))
            appended: list[int] = []

            async def write() -> None:
                for index in range(60):
                    event = await writer.add_message(Message.assistant(f"w{index}"))
                    appended.append(event.seq)

            async with anyio.create_task_group() as group:
                group.start_soon(write)
                async with SessionActor.open(session_id="s", store=other) as eraser:
                    result = await eraser.erase([said.seq], reason="r")
            assert result.erased == (said.seq,)
            assert len(appended) == 60
        events = await store.load("s")
        assert [event.seq for event in events] == list(range(62))
        records = [event for event in events if event.type is EventType.ERASURE]
        assert [record.data["seqs"] for record in records] == [[said.seq]]
        messages = [event for event in events if event.is_surface]
        assert [event.data["content"] for event in messages[1:]] == [f"w{i}" for i in range(60)]
        assert secret not in _text(events)
    finally:
        if other is not store:
            await other.aclose()


async def test_an_erased_summary_or_removal_keeps_the_surface_it_made(store: Any) -> None:
    async with SessionActor.open(session_id="s", store=store) as session:
        for index in range(4):
            await session.add_message(Message.user(f"secret {index}"))
        summary = await session.replace(0, 2, [Message.system("summary: secret 0..2")])
        removal = await session.remove(3, 3)
        shape = [message.role for message in session.messages()]
        await session.erase([summary.seq, removal.seq, 1], reason="r")
        assert [message.role for message in session.messages()] == shape
        assert [message.text for message in session.messages()] == [ERASED_CONTENT]
        assert session.log.events()[summary.seq].op == summary.op


def test_select_events_finds_a_persons_messages_and_the_summaries_quoting_them() -> None:
    from nous_session import Log

    log = Log()
    log = log.append(EventType.USER_MESSAGE, {"content": "hi", "name": "alice"})
    log = log.append(EventType.USER_MESSAGE, {"content": "yo", "name": "bob"})
    log = log.append(EventType.ASSISTANT_MESSAGE, {"content": "hello both"})
    log = log.append(
        EventType.REPLACE,
        {"surface_op": ["replace", 0, 2], "messages": [{"role": "system", "content": "sum"}]},
    )
    log = log.append(EventType.TURN_END, {})
    events = log.events()
    assert select_events(events, name="alice") == (0, 3)
    assert select_events(events, name="alice", summaries=False) == (0,)
    assert select_events(events, role="assistant", summaries=False) == (2,)
    assert select_events(events, where=lambda event: event.type == "turn_end") == (4,)
    with pytest.raises(ValueError, match="needs"):
        select_events(events)


def test_erase_event_keeps_place_type_time_and_op_and_is_idempotent() -> None:
    from datetime import UTC, datetime

    from nous_session import Log

    log = Log().append(EventType.USER_MESSAGE, {"content": "a"})
    written = "2025-03-04T05:06:07+00:00"
    compacted = {
        "content": "b",
        "surface_op": ["replace", 0, 0],
        "source": "compaction",
        "created_at": written,
    }
    log = log.append(EventType.SYSTEM_MESSAGE, compacted)
    event = log.events()[1]
    at = datetime(2026, 1, 2, tzinfo=UTC)
    erased = erase_event(event, reason="why", at=at)
    assert (erased.seq, erased.type, erased.time, erased.op) == (
        event.seq,
        event.type,
        event.time,
        event.op,
    )
    # The library's marks stay (history still says it was a compaction, dated as it was).
    assert (erased.data["source"], erased.data["created_at"]) == ("compaction", written)
    assert erased.data["content"] == ERASED_CONTENT
    assert erased_record(erased) == (at.isoformat(), "why")
    assert erase_event(erased, reason="other", at=datetime.now(UTC)) is erased
    # An event that only carries an "erased" key of its own is still erased.
    posing = Log().append(
        EventType.USER_MESSAGE,
        {"content": "secret", "erased": {"at": at.isoformat(), "reason": "not really"}},
    )
    assert erase_event(posing.events()[0], reason="why", at=at).data["content"] == ERASED_CONTENT
    with pytest.raises(ValueError, match="timezone"):
        erase_event(event, reason="why", at=datetime(2026, 1, 2))


def test_every_built_in_store_can_erase() -> None:
    assert supports(MemoryStore(), ErasingStore)
    assert supports(SQLiteStore(":memory:"), ErasingStore)


async def test_sqlite_a_reader_holding_an_old_snapshot_makes_it_unproven_until_erased_again(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.sqlite3"
    secret = _secret()
    async with SQLiteStore(path, busy_timeout=0.2) as store:
        async with SessionActor.open(session_id="s", store=store) as session:
            said = await session.add_message(Message.user(secret))
            await session.add_message(Message.user("later"))
        reader = sqlite3.connect(path, isolation_level=None)
        try:
            reader.execute("BEGIN")
            reader.execute("SELECT count(*) FROM nous_events").fetchone()  # holds a snapshot
            result = await store.erase("s", [said.seq], reason="r")
            assert result.erased == (said.seq,)
            assert not result.proven
            assert "snapshot" in result.detail
        finally:
            reader.execute("COMMIT")
            reader.close()
        again = await store.erase("s", [said.seq], reason="r")
        assert again.already == (said.seq,)
        assert again.proven, again.detail
    assert secret.encode() not in _file_bytes(path)


def _file_bytes(path: Path) -> bytes:
    """The database file, its WAL and its shared-memory file, as one string of bytes."""
    files = (Path(f"{path}{suffix}") for suffix in ("", "-wal", "-shm"))
    return b"".join(file.read_bytes() for file in files if file.exists())


async def test_sqlite_without_vacuum_a_copy_an_earlier_delete_left_survives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Why the SQLite store rebuilds the file: with ``secure_delete`` off (SQLite's own
    default, though some builds turn it on), a row deleted before the erasure (here by a
    snapshot, after giving a fork its own copy) leaves its bytes in free space, which only
    a rebuild removes."""
    import nous_session.stores.sqlite._schema as sqlite_module

    opened = sqlite_module.enable_wal

    def without_secure_delete(connection: sqlite3.Connection, busy_timeout: float) -> None:
        opened(connection, busy_timeout)
        connection.execute("PRAGMA secure_delete = OFF")

    monkeypatch.setattr(sqlite_module, "enable_wal", without_secure_delete)
    path = tmp_path / "s.sqlite3"
    secret = _secret()
    async with SQLiteStore(path) as store:
        async with SessionActor.open(session_id="root", store=store) as session:
            for index in range(20):
                await session.add_message(Message.user(f"filler {index}" * 10))
            said = await session.add_message(Message.user(secret + " tail" * 30))
            for index in range(20):
                await session.add_message(Message.user(f"after {index}" * 10))
        await store.fork("root", "child", at=30)
        async with SessionActor.open(session_id="root", store=store) as session:
            await session.remove(said.position, said.position)
            await session.snapshot()  # the fork gets its own copy; the root's row is deleted
        plain = await store.erase("child", [said.seq], reason="r", rewrite=False)
        assert plain.erased == (said.seq,)
        assert not plain.proven
        assert secret.encode() in _file_bytes(path)  # the deleted row's bytes, in free space
        rebuilt = await store.erase("child", [said.seq], reason="r")
        assert rebuilt.proven, rebuilt.detail
        # The secure_delete setting the connection had is back.
        assert store._writer is not None
        assert await store._run(lambda c: c.execute("PRAGMA secure_delete").fetchone()[0]) == 0
    assert secret.encode() not in _file_bytes(path)


def test_cli_erase_is_a_dry_run_without_yes(tmp_path: Path, capsys: Any) -> None:
    path = tmp_path / "cli.sqlite3"
    secret = _secret()

    async def write() -> None:
        async with (
            SQLiteStore(path) as store,
            SessionActor.open(session_id="s", store=store) as session,
        ):
            await session.add_message(Message.user(secret, name="alice"))
            await session.add_message(Message.user("hi", name="bob"))
            await session.add_message(Message.assistant("hello"))

    anyio.run(write)
    url = f"sqlite:///{path}"
    import io

    out = io.StringIO()
    assert main(["--store", url, "erase", "s", "--name", "alice", "--reason", "r"], out=out) == 0
    assert "would erase 1 events of 's': 0" in out.getvalue()
    assert "dry run" in out.getvalue()
    assert secret.encode() in _file_bytes(path)
    out = io.StringIO()
    status = main(
        ["--store", url, "erase", "s", "--name", "alice", "--reason", "r", "--yes", "--json"],
        out=out,
    )
    assert status == 0
    assert '"erased":[0]' in out.getvalue().replace(" ", "")
    assert '"proven":true' in out.getvalue().replace(" ", "")
    assert secret.encode() not in _file_bytes(path)
    assert main(["--store", url, "erase", "s", "9", "--reason", "r", "--yes"], out=out) == 1
    assert "seq 9" in capsys.readouterr().err
    assert main(["--store", url, "erase", "s", "--reason", "r"], out=out) == 1
    assert "name the events to erase" in capsys.readouterr().err
    out = io.StringIO()
    assert main(["--store", url, "erase", "s", "--all", "--reason", "r"], out=out) == 0
    assert "would erase 2 events of 's': 1, 2" in out.getvalue()
    assert "erased before: 0" in out.getvalue()


def test_erasure_to_json_names_everything() -> None:
    from datetime import UTC, datetime

    value = Erasure("s", "r", datetime(2026, 1, 1, tzinfo=UTC), (1,), (2,), (3,), ("f",), True)
    assert value.to_json() == {
        "session": "s",
        "reason": "r",
        "at": "2026-01-01T00:00:00+00:00",
        "erased": [1],
        "already": [2],
        "absent": [3],
        "sessions": ["f"],
        "summaries": [],
        "proven": True,
        "detail": "",
        "dry_run": False,
    }


async def test_postgres_plain_vacuum_leaves_the_bytes_and_vacuum_full_removes_them(
    postgres: Backend,
) -> None:
    """Why the PostgreSQL store rewrites its tables: an UPDATE leaves the old row version in
    the page, and a plain VACUUM only marks its space free (the bytes stay there until a
    later row is written over them)."""
    secret = _secret()
    store: Any = postgres.make()
    async with store:
        async with SessionActor.open(session_id="s", store=store) as session:
            await session.add_message(Message.user("before"))
            said = await session.add_message(Message.user(f"{secret} " + "padding " * 120))
        plain = await store.erase("s", [said.seq], reason="r", rewrite=False)
        assert plain.erased == (said.seq,)
        assert not plain.proven
        assert "not proven" in plain.detail
        assert sum(postgres.hits(secret).values()) > 0  # still in the page's free space
        full = await store.erase("s", [said.seq], reason="r")
        assert full.already == (said.seq,)
        assert full.proven, full.detail
        assert sum(postgres.hits(secret).values()) == 0


async def test_postgres_an_older_snapshot_makes_it_unproven(postgres: Backend) -> None:
    import psycopg

    store: Any = postgres.make()
    async with store:
        async with SessionActor.open(session_id="s", store=store) as session:
            said = await session.add_message(Message.user("text"))
        assert POSTGRES_URL is not None
        with psycopg.connect(POSTGRES_URL, autocommit=True) as reader:
            reader.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            reader.execute("SELECT 1").fetchone()  # takes a snapshot older than the erasure
            result = await store.erase("s", [said.seq], reason="r", lock_timeout=0.3)
            reader.execute("ROLLBACK")
        assert result.erased == (said.seq,)
        assert not result.proven
        assert "older than the erasure" in result.detail
        again = await store.erase("s", [said.seq], reason="r")
        assert again.proven, again.detail


async def test_postgres_a_role_that_cannot_vacuum_the_tables_is_not_proven(
    postgres: Backend,
) -> None:
    """A VACUUM the server skips (the role does not own the tables) is only a warning."""
    import psycopg

    from nous_session.stores.postgres import PostgresStore

    assert POSTGRES_URL is not None
    role = f"nous_erase_{uuid.uuid4().hex[:8]}"
    owner: Any = postgres.make()
    async with owner:
        async with SessionActor.open(session_id="s", store=owner) as session:
            said = await session.add_message(Message.user("text"))
    with psycopg.connect(POSTGRES_URL, autocommit=True) as connection:
        connection.execute(f"CREATE ROLE {role} LOGIN")
        # (CREATE on the database and schema: opening a store creates them if missing.)
        (database,) = connection.execute("SELECT current_database()").fetchone()  # type: ignore[misc]
        connection.execute(f'GRANT CREATE ON DATABASE "{database}" TO {role}')
        connection.execute(f"GRANT USAGE, CREATE ON SCHEMA {postgres.schema} TO {role}")
        connection.execute(
            f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {postgres.schema}"
            f" TO {role}"
        )
    try:
        url = POSTGRES_URL.replace("postgres@", f"{role}@", 1)
        async with PostgresStore(url, schema=postgres.schema or "") as store:
            result = await store.erase("s", [said.seq], reason="r")
        assert result.erased == (said.seq,)
        assert not result.proven
        assert "did not run" in result.detail
    finally:
        with psycopg.connect(POSTGRES_URL, autocommit=True) as connection:
            connection.execute(f"DROP OWNED BY {role}")
            connection.execute(f"DROP ROLE {role}")


async def test_an_option_the_store_does_not_take_is_refused_before_anything_changes(
    backend: Backend, store: Any
) -> None:
    async with SessionActor.open(session_id="s", store=store) as session:
        said = await session.add_message(Message.user("keep me"))
    with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
        await store.erase("s", [said.seq], reason="r", bogus=True)
    with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
        await store.erase_session("s", reason="r", bogus=True)
    if backend.kind == "memory":
        with pytest.raises(TypeError, match=r"'rewrite'.*its options: none"):
            await store.erase("s", [said.seq], reason="r", rewrite=False)
    else:
        with pytest.raises(ValueError, match="rewrite is True or False"):
            await store.erase("s", [said.seq], reason="r", rewrite="no")
    with pytest.raises(ValueError, match="summaries is True or False"):
        await store.erase("s", [said.seq], reason="r", summaries=None)
    assert (await store.load("s"))[0].data["content"] == "keep me"
