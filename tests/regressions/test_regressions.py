"""Regression tests for bugs found by review: each failed before its fix."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from nous_session import (
    CorruptRecordError,
    InvalidEventError,
    Log,
    MemoryStore,
    Message,
    SessionActor,
    StoreError,
)
from nous_session.codec import decode
from nous_session.stores.sqlite import SQLiteStore

pytestmark = pytest.mark.anyio


async def test_a_request_queued_for_the_parked_actor_is_applied_at_close() -> None:
    """A request queued while the actor is parked, before it has run, still counts when the
    block exits right after (it was handed straight to the parked actor once, uncounted)."""
    for _ in range(20):
        await _close_right_after_a_handoff()


async def _close_right_after_a_handoff() -> None:
    sent = anyio.Event()
    outcome: list[Any] = []
    async with anyio.create_task_group() as outer:
        async with SessionActor.open(session_id="s") as session:

            class Traced(list[Any]):
                def append(self, item: Any) -> None:
                    super().append(item)
                    sent.set()

            session._engine._queue = Traced()

            async def caller() -> None:
                outcome.append(await session.append("user_message", {"content": "hi"}))

            outer.start_soon(caller)
            await sent.wait()  # queued; the block exits before or as the actor takes it
    assert session.log.count == 1
    assert outcome[0].seq == 0


@pytest.mark.parametrize("kind", [["user_message"], {"a": 1}, {1, 2}])
async def test_an_unhashable_type_is_an_invalid_event_not_a_crash(kind: Any) -> None:
    with pytest.raises(InvalidEventError, match="unknown event type"):
        Log().append(kind)
    log = Log()
    assert log.try_append(kind) is log
    async with SessionActor.open(session_id="s") as session:
        with pytest.raises(InvalidEventError):
            await session.append(kind)
        assert (await session.append("user_message", {"content": "still serving"})).seq == 0


async def test_unencodable_data_is_refused_up_front_not_at_commit(tmp_path: Path) -> None:
    deep: Any = 1
    for _ in range(300):
        deep = [deep]
    async with SQLiteStore(tmp_path / "s.sqlite3") as store:
        async with SessionActor.open(session_id="s", store=store) as session:
            with pytest.raises(InvalidEventError, match="nest deeper"):
                await session.append("step_end", {"deep": deep})
            with pytest.raises(InvalidEventError, match="beyond 64 bits"):
                await session.append("user_message", {"surface_op": ["replace", 0, 2**64]})
            assert (await session.append("user_message", {"content": "fine"})).seq == 0
    for bad in (
        b'[1,0,["user_message"],0,{}]',
        b'[1,0,{"t":1},0,{}]',
        b'[1,9223372036854775808,"user_message",0,{}]',
    ):
        with pytest.raises(CorruptRecordError):
            decode(bad)


class BrokenLoadStore(MemoryStore):
    """Reads fail with a non-StoreError after the first one."""

    loads = 0

    async def read(self, session_id: str, *, since: int = 0) -> Any:
        self.loads += 1
        if self.loads > 1:
            raise OSError("disk went away")
        return await super().read(session_id, since=since)


async def test_a_failing_load_during_reload_is_a_store_error_and_the_actor_lives() -> None:
    async with SessionActor.open(session_id="s", store=BrokenLoadStore()) as session:
        await session.append("user_message", {"content": "a"})
        with pytest.raises(StoreError, match="disk went away"):
            await session.reload()
        assert (await session.append("user_message", {"content": "b"})).seq == 1


async def test_sqlite_path_under_a_file_is_a_store_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    async with SQLiteStore(blocker / "sub" / "x.sqlite3") as store:
        with pytest.raises(StoreError, match="cannot open"):
            await store.sessions()


async def test_calls_waiting_when_a_sqlite_store_closes_do_not_reopen_it(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "x.sqlite3")
    await store.sessions()
    outcomes: list[Any] = []

    async def read() -> None:
        try:
            outcomes.append(await store.sessions())
        except StoreError as error:
            outcomes.append(error)

    async with anyio.create_task_group() as tg:
        for _ in range(5):
            tg.start_soon(read)
        await anyio.lowlevel.checkpoint()
        await store.aclose()
    assert store._connection is None
    assert len(outcomes) == 5


async def test_data_changed_after_the_call_changes_nothing() -> None:
    data: dict[str, Any] = {"content": "original", "metadata": {"k": ["v"]}}
    async with SessionActor.open(session_id="s") as session:
        started = anyio.Event()

        async def call() -> None:
            started.set()  # append's synchronous part (copy and send) runs right after this
            await session.append("user_message", data)

        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            await started.wait()
            data["content"] = "mutated"
            data["metadata"]["k"].append("w")
        event = session.log.events()[0]
        assert event.data["content"] == "original"
        assert event.data["metadata"] == {"k": ["v"]}


def test_a_single_content_part_gets_the_constructors_error() -> None:
    with pytest.raises(ValueError, match="list of content parts, not dict"):
        Message.user({"type": "text", "text": "hi"})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not bytes"):
        Message.user(b"hi")  # type: ignore[arg-type]


async def test_a_nul_in_a_session_id_is_refused_everywhere() -> None:
    with pytest.raises(ValueError, match="NUL"):
        async with SessionActor.open(session_id="a\x00b"):
            pass
    with pytest.raises(ValueError, match="NUL"):
        await MemoryStore().commit("a\x00b", expected_count=0, events=[])


def test_the_cli_without_the_postgres_extra_prints_one_line() -> None:
    code = (
        "import sys; sys.modules['psycopg'] = None; from nous_session.cli import main;"
        " sys.exit(main(['--store', 'postgresql://h/db', 'sessions']))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False
    )
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "nous-session: error: the PostgreSQL store needs psycopg 3 and psycopg-pool: "
        "pip install 'nous_session[postgres]'"
    ]


def test_cli_reading_commands_never_create_a_database(tmp_path: Path) -> None:
    target = tmp_path / "typo" / "dir" / "x.sqlite3"
    result = subprocess.run(
        [sys.executable, "-m", "nous_session", "--store", f"sqlite:///{target}", "events", "s"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 1
    assert "no store file at" in result.stderr
    assert not (tmp_path / "typo").exists()


async def test_rebase_applies_a_losing_batch_again_after_the_winner() -> None:
    store = MemoryStore()
    async with (
        SessionActor.open(session_id="s", store=store, on_conflict="rebase") as first,
        SessionActor.open(session_id="s", store=store, on_conflict="rebase") as second,
    ):
        await first.append("user_message", {"content": "first"})
        event = await second.append("user_message", {"content": "second"})  # no ConflictError
        assert event.seq == 1
        assert [e.data["content"] for e in await store.load("s")] == ["first", "second"]
        assert list(second.log.events()) == list(await store.load("s"))
        # A replace is re-checked against the caught-up log, not blindly re-applied.
        assert (await first.append("user_message", {"content": "third"})).seq == 2
        summary = await second.replace(0, 1, Message.system("summary"))
        assert summary.seq == 3
        assert [m.text for m in second.messages()] == ["summary", "third"]
    with pytest.raises(ValueError, match="on_conflict"):
        async with SessionActor.open(session_id="s", on_conflict="merge"):  # type: ignore[arg-type]
            pass


async def test_store_commits_read_an_iterator_once_and_refuse_what_is_not_an_event() -> None:
    store = MemoryStore()
    log = Log().append("user_message", {"content": "a"}).append("user_message", {"content": "b"})
    done = await store.commit_rebased("s", expected_count=0, events=iter(log.events()))  # type: ignore[arg-type]
    assert list(done.events) == list(log.events())
    with pytest.raises(ValueError, match="at least one event"):
        await store.commit_rebased("t", expected_count=0, events=iter([]))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="must be Events"):
        await store.commit("t", expected_count=0, events=[{"seq": 0}])  # type: ignore[list-item]
    assert [info.session_id for info in await store.sessions()] == ["s"]
    assert list(await store.load("t")) == []


async def test_a_segment_applied_again_after_a_conflict_answers_a_request_its_key_answered() -> (
    None
):
    # A replace keeps the segment off the rebasing commit: it is applied again after the
    # conflict, and the append whose key the session had committed must be answered too.
    store = MemoryStore()
    async with (
        SessionActor.open(session_id="s", store=store, on_conflict="rebase", follow=False) as a,
        SessionActor.open(session_id="s", store=store, follow=False) as b,
    ):
        first = await a.append("user_message", {"content": "first"}, key="k")
        await b.reload()
        await b.append("user_message", {"content": "other"})  # `a` is behind now
        answers: dict[str, Any] = {}

        async def keyed() -> None:
            answers["keyed"] = await a.append("user_message", {"content": "again"}, key="k")

        async def replace() -> None:
            answers["replace"] = await a.replace(0, 0, Message.system("summary"))

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(keyed)  # both queued before the actor takes them: one segment
                tg.start_soon(replace)
        assert answers["keyed"] == first
        assert answers["replace"].seq == 2
