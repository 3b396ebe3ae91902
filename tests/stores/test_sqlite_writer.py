"""SQLiteWriter: group commits, per-job failures, whole-group failures, close, cancellation.

Groups are formed deterministically: every call sent in one event-loop iteration reaches the
writer's thread in one hand-off, so tasks started together (one task group, no awaits before
their call) share a transaction. Where a test needs the thread busy, a job blocks on a
``threading.Event`` the test sets.
"""

from __future__ import annotations

import gc
import os
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import anyio
import anyio.to_thread
import pytest

from nous_session.errors import StoreError
from nous_session.stores.sqlite._writer import SQLiteWriter, WriterStatistics

THREAD_PREFIX = "nous_session-sqlite-writer"
ROOT = Path(__file__).resolve().parents[2]

SCHEMA = (
    "CREATE TABLE IF NOT EXISTS rows (session TEXT NOT NULL, n INTEGER NOT NULL)",
    "CREATE TABLE IF NOT EXISTS parent (id INTEGER PRIMARY KEY)",
    # Deferred: an orphan passes its INSERT and its savepoint, and fails only at COMMIT.
    "CREATE TABLE IF NOT EXISTS child (parent_id INTEGER NOT NULL"
    " REFERENCES parent (id) DEFERRABLE INITIALLY DEFERRED)",
)


def factory(
    path: Path, *, synchronous: str = "NORMAL", timeout: float = 5.0
) -> Callable[[], sqlite3.Connection]:
    """A connection factory for a WAL file with the test schema."""

    def connect() -> sqlite3.Connection:
        connection = sqlite3.connect(path, timeout=timeout, isolation_level=None)
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute(f"PRAGMA synchronous={synchronous}")
        connection.execute("PRAGMA foreign_keys=ON")
        for statement in SCHEMA:
            connection.execute(statement)
        return connection

    return connect


def insert(session: str, n: int) -> Callable[[sqlite3.Connection], int]:
    def job(connection: sqlite3.Connection) -> int:
        connection.execute("INSERT INTO rows (session, n) VALUES (?, ?)", (session, n))
        return n

    return job


def failing(session: str, n: int, error: Exception) -> Callable[[sqlite3.Connection], int]:
    """Insert a row, then raise: the row must be rolled back with the job."""

    def job(connection: sqlite3.Connection) -> int:
        connection.execute("INSERT INTO rows (session, n) VALUES (?, ?)", (session, n))
        raise error

    return job


def rows(connection: sqlite3.Connection) -> list[tuple[str, int]]:
    return connection.execute("SELECT session, n FROM rows ORDER BY session, n").fetchall()


def on_disk(path: Path) -> list[tuple[str, int]]:
    """The committed rows, through a connection of our own (not the writer's)."""
    connection = sqlite3.connect(path)
    try:
        return rows(connection)
    finally:
        connection.close()


def writer_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name.startswith(THREAD_PREFIX)]


def delta(after: WriterStatistics, before: WriterStatistics) -> dict[str, int]:
    return {
        name: getattr(after, name) - getattr(before, name)
        for name in ("transactions", "failed_transactions", "writes", "reads", "wakeups")
    }


@pytest.fixture(autouse=True)
def no_writer_thread_left() -> Iterator[None]:
    """Every test closes its writers: no writer thread outlives a test."""
    assert writer_threads() == []
    yield
    assert writer_threads() == []


# Results and errors --------------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_write_returns_its_result_and_a_read_sees_it(tmp_path: Path) -> None:
    path = tmp_path / "w.sqlite3"
    async with SQLiteWriter(factory(path, synchronous="FULL")) as writer:
        assert await writer.write(insert("a", 7)) == 7
        assert await writer.read(rows) == [("a", 7)]
        assert on_disk(path) == [("a", 7)]  # committed, not just visible to the writer
        stats = writer.statistics()
        assert (stats.transactions, stats.writes, stats.reads, stats.max_group) == (1, 1, 1, 1)
        assert stats.jobs == 2


@pytest.mark.anyio
async def test_the_thread_starts_on_first_use_and_is_not_a_daemon(tmp_path: Path) -> None:
    writer = SQLiteWriter(factory(tmp_path / "w.sqlite3"))
    assert writer_threads() == []
    await writer.write(insert("a", 1))
    (thread,) = writer_threads()
    assert not thread.daemon
    await writer.aclose()
    assert not thread.is_alive()


@pytest.mark.anyio
async def test_results_and_errors_reach_the_right_callers(tmp_path: Path) -> None:
    path = tmp_path / "w.sqlite3"
    outcomes: dict[int, object] = {}

    async with SQLiteWriter(factory(path)) as writer:

        async def one(n: int) -> None:
            job = failing("s", n, ValueError(f"job {n}")) if n % 3 == 0 else insert("s", n)
            try:
                outcomes[n] = await writer.write(job)
            except ValueError as error:
                outcomes[n] = error

        async with anyio.create_task_group() as group:
            for n in range(30):
                group.start_soon(one, n)
        assert writer.statistics().max_group == 30  # they did share one transaction

    for n in range(30):
        if n % 3 == 0:
            assert isinstance(outcomes[n], ValueError)
            assert str(outcomes[n]) == f"job {n}"
        else:
            assert outcomes[n] == n
    assert on_disk(path) == [("s", n) for n in range(30) if n % 3]


@pytest.mark.anyio
async def test_a_failing_job_in_a_group_fails_only_itself(tmp_path: Path) -> None:
    path = tmp_path / "w.sqlite3"
    async with SQLiteWriter(factory(path, synchronous="FULL")) as writer:
        before = writer.statistics()
        results: list[int] = []
        errors: list[BaseException] = []

        async def good(n: int) -> None:
            results.append(await writer.write(insert("good", n)))

        async def bad() -> None:
            try:
                await writer.write(failing("bad", 0, KeyError("nope")))
            except KeyError as error:
                errors.append(error)

        async with anyio.create_task_group() as group:
            for n in range(5):
                group.start_soon(good, n)
            group.start_soon(bad)
            for n in range(5, 10):
                group.start_soon(good, n)

        after = writer.statistics()
        # One transaction held all eleven jobs, and one wake-up answered them all.
        assert delta(after, before) == {
            "transactions": 1,
            "failed_transactions": 0,
            "writes": 11,
            "reads": 0,
            "wakeups": 1,
        }
        assert after.max_group == 11
    assert sorted(results) == list(range(10))
    assert len(errors) == 1
    assert on_disk(path) == [("good", n) for n in range(10)]  # no ("bad", 0)


@pytest.mark.anyio
async def test_a_failing_job_alone_in_its_transaction_is_rolled_back(tmp_path: Path) -> None:
    path = tmp_path / "w.sqlite3"
    async with SQLiteWriter(factory(path)) as writer:
        with pytest.raises(ZeroDivisionError):
            await writer.write(failing("alone", 1, ZeroDivisionError("alone")))
        assert await writer.write(insert("next", 2)) == 2
        stats = writer.statistics()
        assert (stats.transactions, stats.failed_transactions, stats.writes) == (1, 0, 2)
    assert on_disk(path) == [("next", 2)]


# Whole-group failures --------------------------------------------------------------------------


def orphan(connection: sqlite3.Connection) -> str:
    """Insert a child without its parent: fine until the deferred check at COMMIT."""
    connection.execute("INSERT INTO child (parent_id) VALUES (42)")
    return "inserted"


@pytest.mark.anyio
async def test_a_commit_failure_fails_the_whole_group_and_commits_nothing(
    tmp_path: Path,
) -> None:
    path = tmp_path / "w.sqlite3"
    outcomes: dict[str, object] = {}

    async with SQLiteWriter(factory(path)) as writer:

        async def call(name: str, job: Callable[[sqlite3.Connection], object]) -> None:
            try:
                outcomes[name] = await writer.write(job)
            except (StoreError, ValueError) as error:
                outcomes[name] = error

        async with anyio.create_task_group() as group:
            group.start_soon(call, "first", insert("g", 1))
            group.start_soon(call, "orphan", orphan)
            group.start_soon(call, "own error", failing("g", 2, ValueError("mine")))
            group.start_soon(call, "last", insert("g", 3))

        stats = writer.statistics()
        assert (stats.transactions, stats.failed_transactions, stats.writes) == (0, 1, 4)
        for name in ("first", "orphan", "last"):
            error = outcomes[name]
            assert isinstance(error, StoreError), name
            assert "none of the 4 writes of its group were committed" in str(error)
            assert isinstance(error.__cause__, sqlite3.IntegrityError)  # chained, as `from`
            assert "FOREIGN KEY" in str(error.__cause__)
        own = outcomes["own error"]
        assert isinstance(own, ValueError)  # a job that raised keeps its own exception
        assert str(own) == "mine"
        assert on_disk(path) == []
        # The connection is usable again: the failed transaction was rolled back.
        assert await writer.write(insert("after", 4)) == 4
        assert await writer.read(lambda c: c.execute("SELECT count(*) FROM child").fetchone()) == (
            0,
        )
    assert on_disk(path) == [("after", 4)]


@pytest.mark.anyio
async def test_a_full_disk_mid_group_fails_the_group_and_keeps_the_jobs_own_error(
    tmp_path: Path,
) -> None:
    """SQLITE_FULL rolls the whole transaction back by itself: no write of the group stays."""
    path = tmp_path / "w.sqlite3"
    outcomes: dict[str, object] = {}

    def huge(connection: sqlite3.Connection) -> None:
        connection.execute("INSERT INTO rows VALUES ('huge', ?)", (0,))
        connection.execute("CREATE TABLE blobs (data BLOB)")
        connection.execute("INSERT INTO blobs VALUES (?)", (b"z" * 200_000,))

    async with SQLiteWriter(factory(path)) as writer:
        await writer.write(insert("before", 0))
        pages = await writer.read(lambda c: c.execute("PRAGMA page_count").fetchone()[0])
        await writer.read(lambda c: c.execute(f"PRAGMA max_page_count = {pages + 4}"))

        async def call(name: str, job: Callable[[sqlite3.Connection], object]) -> None:
            try:
                outcomes[name] = await writer.write(job)
            except (StoreError, sqlite3.Error) as error:
                outcomes[name] = error

        async with anyio.create_task_group() as group:
            group.start_soon(call, "first", insert("g", 1))
            group.start_soon(call, "huge", huge)
            group.start_soon(call, "third", insert("g", 2))

        full = outcomes["huge"]
        assert isinstance(full, sqlite3.OperationalError)
        assert "full" in str(full)
        for name in ("first", "third"):
            error = outcomes[name]
            assert isinstance(error, StoreError), name
            assert "rolled the transaction back" in str(error)
            assert "none of the 3 writes of its group were committed" in str(error)
            assert error.__cause__ is full
        assert writer.statistics().failed_transactions == 1
        await writer.read(lambda c: c.execute("PRAGMA max_page_count = 1073741823"))
        assert await writer.write(insert("after", 3)) == 3
    assert on_disk(path) == [("after", 3), ("before", 0)]


@pytest.mark.anyio
async def test_a_begin_failure_fails_the_group_and_the_next_one_succeeds(
    tmp_path: Path,
) -> None:
    path = tmp_path / "w.sqlite3"
    async with SQLiteWriter(factory(path, timeout=0)) as writer:
        await writer.write(insert("first", 0))
        other = sqlite3.connect(path, isolation_level=None)
        try:
            other.execute("BEGIN IMMEDIATE")  # holds the write lock: our BEGIN cannot get it
            with pytest.raises(StoreError, match="cannot begin the transaction") as caught:
                await writer.write(insert("blocked", 1))
            assert isinstance(caught.value.__cause__, sqlite3.OperationalError)
            assert "locked" in str(caught.value.__cause__)
            other.execute("ROLLBACK")
        finally:
            other.close()
        await writer.write(insert("then", 2))
        assert writer.statistics().failed_transactions == 1
    assert on_disk(path) == [("first", 0), ("then", 2)]


@pytest.mark.anyio
async def test_a_job_that_commits_itself_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "w.sqlite3"

    def rogue(connection: sqlite3.Connection) -> None:
        connection.execute("COMMIT")

    async with SQLiteWriter(factory(path)) as writer:
        with pytest.raises(StoreError, match="must not COMMIT or ROLLBACK"):
            await writer.write(rogue)
        assert await writer.write(insert("after", 1)) == 1
    assert on_disk(path) == [("after", 1)]


# The connection factory -------------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_failing_connection_factory_fails_the_waiting_jobs_and_is_retried(
    tmp_path: Path,
) -> None:
    path = tmp_path / "w.sqlite3"
    attempts: list[str] = []
    good = factory(path)
    opened_on: list[threading.Thread] = []

    def connect() -> sqlite3.Connection:
        attempts.append("try")
        opened_on.append(threading.current_thread())
        if len(attempts) == 1:
            raise OSError("no disk today")
        return good()

    async with SQLiteWriter(connect) as writer:
        with pytest.raises(StoreError, match="cannot open the database") as caught:
            await writer.write(insert("a", 1))
        assert isinstance(caught.value.__cause__, OSError)
        assert await writer.write(insert("a", 2)) == 2
        assert await writer.read(rows) == [("a", 2)]
    assert len(attempts) == 2
    assert all(thread.name.startswith(THREAD_PREFIX) for thread in opened_on)


# Reads --------------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_reads_run_after_the_writes_sent_with_them(tmp_path: Path) -> None:
    path = tmp_path / "w.sqlite3"
    seen: list[list[tuple[str, int]]] = []

    async with SQLiteWriter(factory(path)) as writer:

        async def read() -> None:
            seen.append(await writer.read(rows))

        async with anyio.create_task_group() as group:
            group.start_soon(read)  # sent first, yet it runs after the writes of its batch
            for n in range(3):
                group.start_soon(writer.write, insert("r", n))
        assert writer.statistics().max_group == 3
    assert seen == [[("r", 0), ("r", 1), ("r", 2)]]


@pytest.mark.anyio
async def test_a_read_error_reaches_its_caller_and_an_open_transaction_is_rolled_back(
    tmp_path: Path,
) -> None:
    path = tmp_path / "w.sqlite3"

    def left_open(connection: sqlite3.Connection) -> None:
        connection.execute("BEGIN")
        connection.execute("INSERT INTO rows VALUES ('sneaky', 1)")

    async with SQLiteWriter(factory(path)) as writer:
        with pytest.raises(sqlite3.OperationalError, match="no such table"):
            await writer.read(lambda c: c.execute("SELECT * FROM missing").fetchall())
        with pytest.raises(StoreError, match="left a transaction open"):
            await writer.read(left_open)
        assert await writer.write(insert("ok", 2)) == 2
    assert on_disk(path) == [("ok", 2)]


# Concurrency --------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_many_concurrent_writers_share_transactions_and_lose_nothing(
    tmp_path: Path,
) -> None:
    path = tmp_path / "w.sqlite3"
    sessions, writes = 40, 15

    async with SQLiteWriter(factory(path)) as writer:

        async def session(name: str) -> None:
            for n in range(writes):
                assert await writer.write(insert(name, n)) == n

        async with anyio.create_task_group() as group:
            for index in range(sessions):
                group.start_soon(session, f"s{index:02}")
        stats = writer.statistics()
    assert stats.writes == sessions * writes
    assert stats.max_group > 1
    assert stats.transactions < sessions * writes
    # One wake-up per transaction (one event loop), not one per waiter.
    assert stats.wakeups == stats.transactions
    assert on_disk(path) == sorted((f"s{i:02}", n) for i in range(sessions) for n in range(writes))


@pytest.mark.anyio
async def test_the_group_cap_bounds_a_transaction(tmp_path: Path) -> None:
    path = tmp_path / "w.sqlite3"
    async with SQLiteWriter(factory(path), group_cap=4) as writer:
        async with anyio.create_task_group() as group:
            for n in range(10):
                group.start_soon(writer.write, insert("c", n))
        stats = writer.statistics()
    assert stats.max_group == 4
    assert stats.transactions == 3  # 4 + 4 + 2
    assert on_disk(path) == [("c", n) for n in range(10)]


def test_the_group_cap_must_be_a_positive_int(tmp_path: Path) -> None:
    for cap in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="group_cap"):
            SQLiteWriter(factory(tmp_path / "w.sqlite3"), group_cap=cap)  # type: ignore[arg-type]


def test_event_loops_in_two_threads_share_one_writer(tmp_path: Path) -> None:
    """An asyncio loop and a trio run, each in its own thread, write through one writer."""
    path = tmp_path / "w.sqlite3"
    writer = SQLiteWriter(factory(path))
    failures: list[BaseException] = []

    async def sessions(prefix: str) -> None:
        async def session(name: str) -> None:
            for n in range(10):
                assert await writer.write(insert(name, n)) == n

        async with anyio.create_task_group() as group:
            for index in range(5):
                group.start_soon(session, f"{prefix}{index}")

    def run(backend: str) -> None:
        try:
            anyio.run(sessions, backend, backend=backend)
        except BaseException as error:  # reported below, from the test's thread
            failures.append(error)

    threads = [threading.Thread(target=run, args=(backend,)) for backend in ("asyncio", "trio")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    anyio.run(writer.aclose)
    assert failures == []
    assert on_disk(path) == sorted(
        (f"{backend}{index}", n)
        for backend in ("asyncio", "trio")
        for index in range(5)
        for n in range(10)
    )


# Cancellation -------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_cancelled_write_still_commits(tmp_path: Path) -> None:
    path = tmp_path / "w.sqlite3"
    async with SQLiteWriter(factory(path)) as writer:
        with anyio.CancelScope() as scope:
            scope.cancel()
            await writer.write(insert("cancelled", 1))  # queued, then the wait is cancelled
        assert scope.cancelled_caught
        # Sent after it, this read runs after it: the write committed all the same.
        assert await writer.read(rows) == [("cancelled", 1)]
    assert on_disk(path) == [("cancelled", 1)]


@pytest.mark.anyio
async def test_a_write_cancelled_while_on_the_thread_still_commits(tmp_path: Path) -> None:
    path = tmp_path / "w.sqlite3"
    entered, release = threading.Event(), threading.Event()

    def slow(connection: sqlite3.Connection) -> None:
        entered.set()
        release.wait()
        connection.execute("INSERT INTO rows VALUES ('slow', 1)")

    async with SQLiteWriter(factory(path)) as writer:
        async with anyio.create_task_group() as group:
            scope = anyio.CancelScope()

            async def caller() -> None:
                with scope:
                    await writer.write(slow)

            group.start_soon(caller)
            await anyio.to_thread.run_sync(entered.wait)  # the job runs on the writer thread
            scope.cancel()
        assert scope.cancelled_caught  # the caller returned at once, the job still running
        release.set()
        assert await writer.read(rows) == [("slow", 1)]
    assert on_disk(path) == [("slow", 1)]


@pytest.mark.anyio
async def test_a_read_by_a_cancelled_caller_is_not_run(tmp_path: Path) -> None:
    ran: list[str] = []

    def read(connection: sqlite3.Connection) -> None:
        ran.append("ran")

    async with SQLiteWriter(factory(tmp_path / "w.sqlite3")) as writer:
        with anyio.CancelScope() as scope:
            scope.cancel()
            await writer.read(read)
        assert scope.cancelled_caught
        await writer.read(lambda connection: None)
        assert writer.statistics().reads == 1
    assert ran == []


@pytest.mark.anyio
async def test_a_read_cancelled_while_it_waits_is_dropped(tmp_path: Path) -> None:
    entered, release = threading.Event(), threading.Event()
    ran: list[str] = []

    def slow(connection: sqlite3.Connection) -> None:
        entered.set()
        release.wait()

    def read(connection: sqlite3.Connection) -> int:
        ran.append("ran")
        return 1

    async with SQLiteWriter(factory(tmp_path / "w.sqlite3")) as writer:
        async with anyio.create_task_group() as group:
            group.start_soon(writer.write, slow)
            await anyio.to_thread.run_sync(entered.wait)  # the thread is busy: reads queue up
            scope = anyio.CancelScope()
            sending = anyio.Event()

            async def reader() -> None:
                with scope:
                    sending.set()  # no checkpoint from here until the read is sent
                    await writer.read(read)

            async with anyio.create_task_group() as readers:
                readers.start_soon(reader)
                await sending.wait()
                scope.cancel()
            assert scope.cancelled_caught  # the reader is gone before the thread is free
            release.set()
        assert await writer.read(lambda connection: 2) == 2
        assert writer.statistics().reads == 1  # the abandoned read was skipped, not run
    assert ran == []


# Closing ------------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_close_runs_the_queued_jobs_then_refuses_new_ones(tmp_path: Path) -> None:
    path = tmp_path / "w.sqlite3"
    writer = SQLiteWriter(factory(path))
    results: list[int] = []
    await writer.write(insert("q", 0))
    (thread,) = writer_threads()
    all_sent = anyio.Event()
    sent: list[int] = []

    async def write(n: int) -> None:
        sent.append(n)
        if len(sent) == 5:
            all_sent.set()  # no checkpoint between this and the job's sending
        results.append(await writer.write(insert("q", n)))

    async with anyio.create_task_group() as group:
        for n in range(1, 6):
            group.start_soon(write, n)
        await all_sent.wait()
        await writer.aclose()  # queued behind the five writes: they run, then it closes
        assert writer.closed
    assert sorted(results) == [1, 2, 3, 4, 5]
    assert not thread.is_alive()
    with pytest.raises(StoreError, match="closed"):
        await writer.write(insert("late", 6))
    with pytest.raises(StoreError, match="closed"):
        await writer.read(rows)
    await writer.aclose()  # idempotent
    assert on_disk(path) == [("q", n) for n in range(6)]


@pytest.mark.anyio
async def test_concurrent_closes_all_wait_for_the_thread(tmp_path: Path) -> None:
    writer = SQLiteWriter(factory(tmp_path / "w.sqlite3"))
    await writer.write(insert("a", 1))
    (thread,) = writer_threads()
    alive_after: list[bool] = []

    async def close() -> None:
        await writer.aclose()
        alive_after.append(thread.is_alive())

    async with anyio.create_task_group() as group:
        for _ in range(3):
            group.start_soon(close)
    assert alive_after == [False, False, False]


@pytest.mark.anyio
async def test_a_cancelled_close_still_closes(tmp_path: Path) -> None:
    writer = SQLiteWriter(factory(tmp_path / "w.sqlite3"))
    await writer.write(insert("a", 1))
    (thread,) = writer_threads()
    with anyio.CancelScope() as scope:
        scope.cancel()
        await writer.aclose()  # shielded: it waits for the thread all the same
    assert not thread.is_alive()


@pytest.mark.anyio
async def test_closing_an_unused_writer_needs_no_thread(tmp_path: Path) -> None:
    writer = SQLiteWriter(factory(tmp_path / "w.sqlite3"))
    await writer.aclose()
    assert writer_threads() == []
    with pytest.raises(StoreError, match="closed"):
        await writer.write(insert("a", 1))
    assert writer_threads() == []


@pytest.mark.anyio
async def test_an_unclosed_writer_warns_and_its_thread_stops(tmp_path: Path) -> None:
    path = tmp_path / "w.sqlite3"
    writer = SQLiteWriter(factory(path))
    await writer.write(insert("a", 1))
    (thread,) = writer_threads()
    with pytest.warns(ResourceWarning, match="not closed"):
        del writer  # its thread holds only the engine, not the writer: refcounting frees it
    # Collected, it asked its thread to stop after the queued jobs; wait for that off the loop.
    await anyio.to_thread.run_sync(thread.join)
    assert not thread.is_alive()
    assert on_disk(path) == [("a", 1)]


def test_an_unused_writer_collects_silently(tmp_path: Path) -> None:
    writer = SQLiteWriter(factory(tmp_path / "w.sqlite3"))
    del writer
    gc.collect()  # warnings are errors here: a warning would fail the test


FORGOTTEN = """
import logging, sqlite3, sys, anyio
from nous_session.stores.sqlite._writer import SQLiteWriter
# The library logs through the standard library: let its debug events reach stdout here.
logging.basicConfig(level=logging.DEBUG, stream=sys.stdout, format="%(message)s")

def connect():
    return sqlite3.connect(sys.argv[1], isolation_level=None)

WRITER = SQLiteWriter(connect)  # a global: never collected before the interpreter exits

async def main():
    await WRITER.write(lambda c: c.execute("CREATE TABLE t (n INTEGER)"))
    await WRITER.write(lambda c: c.execute("INSERT INTO t VALUES (1)"))

anyio.run(main)
print("main done", flush=True)
"""


def test_a_writer_nobody_closed_does_not_keep_the_process_alive(tmp_path: Path) -> None:
    """The non-daemon thread closes the writer itself once the main thread has finished."""
    path = tmp_path / "forgotten.sqlite3"
    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", FORGOTTEN, str(path)],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    # The writer's debug events (logged through the standard library): it closed itself.
    lines = done.stdout.splitlines()
    assert lines[-2] == "main done", done.stdout
    assert "nous_session.writer_closed" in lines[-1], done.stdout
    assert "Warning" not in done.stderr
    connection = sqlite3.connect(path)
    try:
        assert connection.execute("SELECT n FROM t").fetchall() == [(1,)]
    finally:
        connection.close()
