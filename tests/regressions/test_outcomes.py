"""Every outcome knowable (issue 9): each test here failed on the code before its fix.

Cancellation while waiting for queue space, lone surrogates and out-of-range times, session-id
rules on every store, corrupt heads and counts that do not match the rows, cancelled opens, a
role no event type stands for, a SQLite file replaced under a running store, foreign databases,
an unreachable PostgreSQL, and a library that stays silent unless asked.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import suppress
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import anyio
import pytest
from structlog.testing import capture_logs

from nous_session import (
    ConflictError,
    CorruptRecordError,
    InvalidEventError,
    Log,
    Message,
    Role,
    SessionActor,
    SessionClosedError,
    Store,
    StoreError,
)
from nous_session._loops import Done
from nous_session.event import message_event
from nous_session.stores import MemoryStore
from nous_session.stores.sqlite import SQLiteStore

pytestmark = pytest.mark.anyio
POSTGRES_URL = os.environ.get("NOUS_SESSION_TEST_POSTGRES")


class GatedStore(MemoryStore):
    """Commits wait for ``gate`` (when set) before doing anything."""

    gate: anyio.Event | None = None
    waiting = 0

    async def commit(self, session_id: str, **kwargs: Any) -> str | None:
        gate = self.gate
        if gate is not None:
            self.waiting += 1
            with anyio.move_on_after(5):  # a safety net: a failing test must not hang
                await gate.wait()
            self.waiting -= 1
        return await super().commit(session_id, **kwargs)


# 3. Cancelled while waiting for queue space ---------------------------------------------------


async def test_a_call_cancelled_while_waiting_for_queue_space_sends_nothing() -> None:
    """The actor takes every waiting request in one go (the whole queue). Before the fix, a
    caller blocked in send() could have its item taken in that step and still be cancelled:
    told nothing happened, while its event was committed."""
    store = GatedStore()
    store.gate = anyio.Event()
    async with SessionActor.open(session_id="s", store=store, queue_size=1) as session:
        scope = anyio.CancelScope()
        outcome: list[str] = []

        async def first() -> None:
            await session.append("user_message", {"content": "in the commit"})

        async def queued() -> None:
            await session.append("user_message", {"content": "in the queue"})

        async def waiting() -> None:
            with scope:
                await session.append("user_message", {"content": "waiting for space"})
                outcome.append("returned")
            if scope.cancelled_caught:
                outcome.append("cancelled")

        armed = anyio.Event()

        class CancelThenTake(list[Any]):
            def __bool__(self) -> bool:
                # The waiting caller is cancelled in the very step the actor takes the queue
                # (it looks whether the queue holds anything, then takes the whole list).
                held = len(self) > 0
                if held and armed.is_set():
                    scope.cancel()
                return held

        async with anyio.create_task_group() as tg:
            tg.start_soon(first)
            while store.waiting == 0:  # the first request is in the (gated) commit
                await anyio.lowlevel.checkpoint()
            tg.start_soon(queued)
            while session.statistics().queue_depth == 0:
                await anyio.lowlevel.checkpoint()
            tg.start_soon(waiting)
            for _ in range(10):  # let the third caller reach its wait for space
                await anyio.lowlevel.checkpoint()
            # Put in now: the actor replaces its queue with a fresh list at every take, and
            # the second request is in the queue until the commit in flight ends.
            session._engine._queue = CancelThenTake(session._engine._queue)
            armed.set()
            store.gate.set()
        contents = [e.data["content"] for e in session.log.events()]
    assert outcome == ["cancelled"]
    assert "waiting for space" not in contents
    assert contents == ["in the commit", "in the queue"]


# 4. A bad request fails only its caller -------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [
        {"content": "bad \ud800 text"},
        {"content": "fine", "metadata": {"note": "\udfff"}},
        {"content": "fine", "metadata": {"k\ud83d": 1}},
        {"\udc80": "a key"},
    ],
    ids=["content", "metadata-value", "metadata-key", "data-key"],
)
async def test_a_lone_surrogate_fails_its_caller_and_not_its_batch_mates(
    store: Store, data: dict[str, Any]
) -> None:
    async with SessionActor.open(session_id="s", store=store) as session:
        good: list[Any] = []

        async def batch_mate() -> None:
            good.append(await session.append("user_message", {"content": "fine ✓"}))

        async with anyio.create_task_group() as tg:
            tg.start_soon(batch_mate)
            with pytest.raises(InvalidEventError, match="surrogate"):
                await session.append("user_message", data)
        assert [e.data["content"] for e in session.log.events()] == ["fine ✓"]
    assert [e.data["content"] for e in await store.load("s")] == ["fine ✓"]


async def test_a_message_with_a_lone_surrogate_is_refused(store: Store) -> None:
    async with SessionActor.open(session_id="s", store=store) as session:
        with pytest.raises(InvalidEventError, match="surrogate"):
            await session.add_message(Message.user("\ud800"))
        with pytest.raises(InvalidEventError, match="surrogate"):
            await session.replace(0, 0, [Message.system("x\udc00")])
        with pytest.raises(InvalidEventError, match="surrogate"):
            await session.append("user_message", {"content": "x"}, key="k\ud800")
        await session.add_message(Message.user("after"))
    assert len(await store.load("s")) == 1


@pytest.mark.parametrize(
    "when",
    [
        datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=5))),
        datetime(9999, 12, 31, 23, 0, tzinfo=timezone(timedelta(hours=-5))),
    ],
)
async def test_a_time_at_the_datetime_limits_is_an_invalid_event(when: datetime) -> None:
    with pytest.raises(InvalidEventError, match="out of range"):
        Log().append("user_message", {"content": "x"}, time=when)
    async with SessionActor.open(session_id="s") as session:
        with pytest.raises(InvalidEventError, match="out of range"):
            await session.append("user_message", {"content": "x"}, time=when)
    with pytest.raises(ValueError, match="out of range"):
        Message.user("x", created_at=when)


# 5. Session ids: one rule for every store ------------------------------------------------------


@pytest.mark.parametrize(
    ("session_id", "match"),
    [
        ("a" * 257, "at most 256 UTF-8 bytes"),
        ("é" * 129, "at most 256 UTF-8 bytes"),
        ("half \ud800", "lone surrogate"),
        ("nul\x00", "NUL"),
    ],
    ids=["257-ascii", "258-bytes", "surrogate", "nul"],
)
async def test_a_session_id_breaking_the_rule_is_refused_at_open(
    stores: Callable[[], Store], session_id: str, match: str
) -> None:
    store = stores()
    try:
        with pytest.raises(ValueError, match=match):
            async with SessionActor.open(session_id=session_id, store=store):
                pytest.fail("the block must not run")
        assert await store.sessions() == []
    finally:
        await store.aclose()


async def test_the_longest_session_id_works_on_every_store(store: Store) -> None:
    for session_id in ("a" * 256, "é" * 128, "🚀" * 64):
        async with SessionActor.open(session_id=session_id, store=store) as session:
            await session.append("user_message", {"content": "hi"})
            await session.append("user_message", {"content": "again"})
        assert len(await store.load(session_id)) == 2


# 6. Corrupt heads and counts that do not match the rows ----------------------------------------


def _sql(path: Path, statement: str, *params: object) -> None:
    # A connection's `with` commits but does not close: closing() does (3.13 warns otherwise).
    with contextlib.closing(sqlite3.connect(path)) as connection, connection:
        connection.execute(statement, params)


async def _fill(path: Path, n: int) -> None:
    async with SQLiteStore(path) as store, SessionActor.open(session_id="s", store=store) as s:
        for index in range(n):
            await s.append("user_message", {"content": f"m{index}"})


async def test_a_count_past_the_rows_is_corruption_not_another_writer(tmp_path: Path) -> None:
    path = tmp_path / "count.sqlite3"
    await _fill(path, 3)
    _sql(path, "UPDATE nous_sessions SET count = 7")
    with pytest.raises(CorruptRecordError, match=r"count is 7.*end at seq 2.*rows are missing"):
        async with SQLiteStore(path) as store, SessionActor.open(session_id="s", store=store):
            pytest.fail("the block must not run")


async def test_a_corrupt_head_reaches_the_callers_in_raise_mode(tmp_path: Path) -> None:
    path = tmp_path / "head.sqlite3"
    await _fill(path, 2)
    async with (
        SQLiteStore(path) as store,
        SessionActor.open(session_id="s", store=store, follow=False) as session,
    ):
        # Another writer stores a record nobody can read, at the head.
        _sql(path, "INSERT INTO nous_events (sid, seq, record) VALUES (1, 2, X'7b6e6f')")
        _sql(path, "UPDATE nous_sessions SET count = 3, held = 3")
        for _ in range(2):  # every retry: the record, not "another writer"
            with pytest.raises(CorruptRecordError, match="seq 2"):
                await session.append("user_message", {"content": "blocked"})


# 7. A cancelled open() --------------------------------------------------------------------------


async def test_a_cancelled_open_leaves_nothing_unclosed() -> None:
    store = MemoryStore()
    await store.commit("s", expected_count=0, events=Log.seed([Message.user("a")]).events())
    for attempt in range(60):
        with anyio.move_on_after(attempt * 1e-5):
            async with SessionActor.open(session_id="s", store=store) as session:
                with suppress(SessionClosedError):  # the block's own calls, once cancelled
                    await session.append("user_message", {"content": "x"})
                await anyio.sleep(1)
    gc.collect()  # an unclosed memory stream would warn here (warnings are errors)


# 8. A role no event type stands for -----------------------------------------------------------


def test_a_message_with_an_unknown_role_is_an_invalid_event_or_dropped_by_seed() -> None:
    forced = Message.user("odd")
    object.__setattr__(forced, "role", "narrator")
    with pytest.raises(InvalidEventError, match="role 'narrator'"):
        message_event(forced)
    with capture_logs() as logs:
        log = Log.seed([Message.user("a"), forced, Message.assistant("b")])
    assert [m.text for m in log.derive_messages()] == ["a", "b"]
    assert [e.seq for e in log.events()] == [0, 1]
    assert any(entry["event"] == "nous_session.value_dropped" for entry in logs)
    assert Role.USER.value == "user"


async def test_add_message_refuses_an_unknown_role() -> None:
    forced = Message.user("odd")
    object.__setattr__(forced, "role", "narrator")
    async with SessionActor.open(session_id="s") as session:
        with pytest.raises(InvalidEventError, match="role"):
            await session.add_message(forced)


# 10. A SQLite file deleted or replaced under a running store ------------------------------------


@pytest.mark.parametrize("how", ["deleted", "replaced"])
async def test_a_sqlite_file_gone_from_under_the_store_fails_the_commit(
    tmp_path: Path, how: str
) -> None:
    path = tmp_path / "gone.sqlite3"
    async with SQLiteStore(path) as store, SessionActor.open(session_id="s", store=store) as s:
        await s.append("user_message", {"content": "kept"})
        for suffix in ("", "-wal", "-shm"):
            await anyio.Path(f"{path}{suffix}").unlink(missing_ok=True)
        if how == "replaced":
            await _fill(tmp_path / "other.sqlite3", 1)
            (tmp_path / "other.sqlite3").rename(path)
        with pytest.raises(StoreError, match="deleted or replaced"):
            await s.append("user_message", {"content": "would be lost"})


# 11. Writing into a database that is not ours --------------------------------------------------


async def test_a_foreign_database_is_refused_for_writing_unless_adopted(tmp_path: Path) -> None:
    path = tmp_path / "app.db"
    _sql(path, "CREATE TABLE invoices (id INTEGER PRIMARY KEY)")
    before = path.read_bytes()
    with pytest.raises(StoreError, match="holds other tables"):
        async with SQLiteStore(path) as store:
            await store.load("s")
    assert path.read_bytes() == before
    async with SQLiteStore(path, adopt=True) as store:
        await store.commit("s", expected_count=0, events=Log.seed([Message.user("a")]).events())
    with contextlib.closing(sqlite3.connect(path)) as connection:
        tables = {name for (name,) in connection.execute("SELECT name FROM sqlite_master")}
    assert {"invoices", "nous_events"} <= tables


async def test_a_read_only_store_creates_and_changes_nothing(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "x.sqlite3"
    with pytest.raises(StoreError, match="no store file"):
        async with SQLiteStore(missing, read_only=True) as store:
            await store.sessions()
    assert not (tmp_path / "nowhere").exists()
    path = tmp_path / "ours.sqlite3"
    await _fill(path, 2)
    listing = sorted(os.listdir(tmp_path))
    before = path.read_bytes()
    async with SQLiteStore(path, read_only=True) as store:
        assert len(await store.load("s")) == 2
        with pytest.raises(StoreError, match="read-only"):
            await store.commit("s", expected_count=2, events=[])
    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == listing


# 13. An unreachable PostgreSQL ------------------------------------------------------------------


def test_an_unreachable_postgresql_is_one_line_after_one_bounded_attempt() -> None:
    pytest.importorskip("psycopg")
    started = time.monotonic()
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "nous_session",
            "--store",
            "postgresql://nobody@127.0.0.1:9/none?connect_timeout=2",
            "sessions",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    took = time.monotonic() - started
    assert result.returncode == 1
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("nous-session: error: cannot connect to postgresql://")
    assert took < 8, f"took {took:.1f} s"


# 14. A library is silent --------------------------------------------------------------------------

_COMPACTING = """
import anyio, logging, sys
from nous_session import CompactionPolicy, Message, SessionActor
if sys.argv[1] == "info":
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
async def main() -> None:
    policy = CompactionPolicy(token_budget=300, keep_last=2)
    async with SessionActor.open(session_id="quiet", compaction=policy) as session:
        for _ in range(60):
            await session.add_message(Message.user("word " * 20))
        await session.wait_for_compaction()
anyio.run(main)
"""


def test_an_unconfigured_program_sees_nothing_from_the_library() -> None:
    result = subprocess.run(
        [sys.executable, "-c", _COMPACTING, "none"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert (result.stdout, result.stderr) == ("", "")


def test_logging_configured_by_the_application_gets_the_events_on_its_handlers() -> None:
    result = subprocess.run(
        [sys.executable, "-c", _COMPACTING, "info"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert result.stdout == ""
    assert "INFO:nous_session:event='nous_session.compaction_started'" in result.stderr
    assert "session_id='quiet'" in result.stderr


async def test_structlog_configured_by_the_application_gets_structured_events() -> None:
    with capture_logs() as logs:  # configures structlog for the block
        policy_session = SessionActor.open(
            session_id="structured",
            compaction=__import__("nous_session").CompactionPolicy(every=4, keep_last=2),
        )
        async with policy_session as session:
            for index in range(8):
                await session.add_message(Message.user(f"m{index}"))
            await session.wait_for_compaction()
    started = [entry for entry in logs if entry["event"] == "nous_session.compaction_started"]
    assert started
    assert started[0]["session_id"] == "structured"
    assert started[0]["log_level"] == "info"


def test_warnings_reach_stderr_when_nothing_is_configured() -> None:
    code = (
        "import anyio\n"
        "from nous_session import CompactionPolicy, Message, SessionActor\n"
        "async def boom(messages): raise RuntimeError('summarizer down')\n"
        "async def main():\n"
        "    policy = CompactionPolicy(every=3, keep_last=1, summarizer=boom)\n"
        "    async with SessionActor.open(session_id='w', compaction=policy) as s:\n"
        "        for i in range(6):\n"
        "            await s.add_message(Message.user(f'm{i}'))\n"
        "        await s.wait_for_compaction()\n"
        "anyio.run(main)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout == ""
    assert "nous_session.compaction_failed" in result.stderr
    assert "summarizer down" in result.stderr
    assert logging.getLogger("nous_session").level == logging.NOTSET  # this process: untouched


async def test_conflict_errors_are_still_conflicts_for_another_writer(tmp_path: Path) -> None:
    """The corrupt-head fix must not turn an ordinary conflict into something else."""
    path = tmp_path / "plain.sqlite3"
    async with (
        SQLiteStore(path) as one,
        SQLiteStore(path) as two,
        SessionActor.open(session_id="s", store=one, follow=False) as first,
        SessionActor.open(session_id="s", store=two, follow=False) as second,
    ):
        await first.append("user_message", {"content": "a"})
        # A plain append would land after "a" (it has no precondition); a conditional one
        # planned on the stale log conflicts.
        with pytest.raises(ConflictError):
            await second.append_many([("user_message", {"content": "b"})], expect_count=0)
        assert (await second.append("user_message", {"content": "b"})).seq == 1
    assert UTC is not None


async def test_a_request_wakes_every_waiter_even_after_one_was_cancelled() -> None:
    # Request.done waits on the loop's own primitive, one per waiting call: a cancelled
    # caller (whose asyncio future is cancelled with it) must not cancel another's wait.
    done = Done()
    woken: list[str] = []
    scopes: dict[str, anyio.CancelScope] = {}

    async def wait(name: str) -> None:
        with anyio.CancelScope() as scope:
            scopes[name] = scope
            await done.wait()
            woken.append(name)

    async with anyio.create_task_group() as group:
        for name in ("first", "second", "third"):
            group.start_soon(wait, name)
        await anyio.wait_all_tasks_blocked()
        scopes["first"].cancel()  # it leaves, unwoken
        await anyio.wait_all_tasks_blocked()
        assert not done.is_set()
        done.set()
        done.set()  # once is enough; again changes nothing
    assert sorted(woken) == ["second", "third"]
    with anyio.fail_after(1):
        await done.wait()  # set already: returns at once
