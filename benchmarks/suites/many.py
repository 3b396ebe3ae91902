"""Suite "many": many sessions on one store, and one session against the disk's floor (issue 11).

Everything at the store's default durability (SQLite WAL with ``synchronous=FULL``: every
commit fsyncs), on asyncio.

* ``sessions_sqlite``: N sessions on one SQLite file, all at once, each awaiting its own 20
  appends in order; appends/s and events per transaction, for N = 200 (the target), 1,000 and
  10,000 (the curve).
* ``one_session_sqlite``: one session awaiting each append vs a raw ``sqlite3`` loop of one-row
  transactions on the same kind of file (WAL, FULL), side by side in slices: the floor is the
  fsync, and the ratio says how close to it the library gets. Beside them, the steps between:
  the raw loop in a thread (the floor for anything that keeps the disk off the event loop), the
  same raw transaction run by the library's own SQLite writer thread (its hand-over, group
  machinery and wake-up, and nothing of the store), the same relayed through a server task (an
  actor's shape), ``SQLiteStore.commit`` awaited directly (the store without the actor), the
  session opened with ``follow=False`` (no change feed polling the file), and the raw thread
  also moving a session count per transaction (the second page a store that checks counts
  writes).
* ``sessions_postgres``: 200 sessions spread over 4 processes (50 each), each awaiting its own 20
  appends; appends/s over all of them (needs ``NOUS_SESSION_TEST_POSTGRES``).
* ``idle_memory``: 10,000 open, idle sessions in one process: bytes per session (traced by
  tracemalloc, and resident).
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import tempfile
import time
import tracemalloc
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import anyio

from benchmarks.floors import (
    RawThread,
    Relay,
    Row,
    insert_only,
    insert_row,
    insert_row_and_count,
    raw_connection,
)
from benchmarks.harness import (
    AsyncSide,
    Context,
    Measurement,
    Target,
    ainterleave_slices,
    expect,
    measure,
    ratio,
)
from benchmarks.workloads import content
from nous_session import EventType, SessionActor
from nous_session.codec import encode
from nous_session.event import make_event
from nous_session.stores import MemoryStore
from nous_session.stores.sqlite import SQLiteStore
from nous_session.stores.sqlite._store import writer_of
from nous_session.stores.sqlite._writer import SQLiteWriter

ISSUE_11 = "issue 11"
USER = EventType.USER_MESSAGE
EACH = 20


async def _sessions(path: Path, count: int, each: int) -> tuple[float, float]:
    """``count`` sessions, each awaiting ``each`` appends in order, all at once: (rate, mean
    events per transaction)."""
    payload = {"content": content(1)}
    async with SQLiteStore(path) as store, AsyncExitStack() as stack:
        sessions = [
            await stack.enter_async_context(SessionActor.open(session_id=f"s{i}", store=store))
            for i in range(count)
        ]
        writer = writer_of(store)
        before = writer.statistics()

        async def produce(session: SessionActor) -> None:
            for _ in range(each):
                await session.append(USER, payload)

        start = time.perf_counter()
        async with anyio.create_task_group() as task_group:
            for session in sessions:
                task_group.start_soon(produce, session)
        elapsed = time.perf_counter() - start
        after = writer.statistics()
        expect(
            all(session.log.count == each for session in sessions), "sessions: an append is lost"
        )
        stored = sum(info.count for info in await store.sessions())
        expect(stored == count * each, f"sessions: the file holds {stored} events")
    transactions = max(after.transactions - before.transactions, 1)
    return count * each / elapsed, count * each / transactions


def sessions_sqlite(ctx: Context) -> list[Measurement]:
    """200, 1,000 and 10,000 sessions on one SQLite file, each awaiting its own 20 appends."""
    out: list[Measurement] = []
    sizes = (200, 1_000, 10_000) if not ctx.quick else (200, 1_000)
    for count in sizes:
        rates, groups = [], []
        rounds = ctx.rounds if count <= 1_000 else max(1, ctx.rounds // 3)
        for _ in range(rounds):
            with tempfile.TemporaryDirectory(prefix="nous-bench-many-") as name:
                rate, group = anyio.run(
                    _sessions, Path(name) / "many.sqlite3", count, EACH, backend="asyncio"
                )
            rates.append(rate)
            groups.append(group)
        target = Target(">=", 20_000, ISSUE_11) if count == 200 else None
        out.append(
            measure(
                f"many.sessions_sqlite.rate_{count}",
                "appends/s",
                rates,
                target=target,
                note=f"{count:,} sessions on one SQLite file (WAL, FULL), all at once, each"
                f" awaiting its own {EACH} appends in order",
            )
        )
        out.append(
            measure(
                f"many.sessions_sqlite.per_transaction_{count}",
                "events/txn",
                groups,
                note="events committed per SQLite transaction (one fsync each): group commit "
                "across sessions",
            )
        )
    return out


async def _one_session(ctx: Context, directory: Path) -> dict[str, list[float]]:
    slices, per_slice = ctx.size(10, 4), ctx.size(100, 25)
    payload = {"content": content(2)}
    raw = raw_connection(directory / "raw.sqlite3")
    threaded = RawThread(directory / "threaded.sqlite3")
    counted = RawThread(directory / "counted.sqlite3")
    relay_thread = RawThread(directory / "relayed.sqlite3")
    relayed = Relay(relay_thread.insert)
    writer_path = directory / "writer.sqlite3"
    async with (
        SQLiteWriter(lambda: raw_connection(writer_path)) as writer,
        SQLiteStore(directory / "one.sqlite3") as store,
        SQLiteStore(directory / "direct.sqlite3") as direct_store,
        SQLiteStore(directory / "alone.sqlite3") as alone_store,
        SessionActor.open(session_id="one", store=store) as session,
        SessionActor.open(session_id="one", store=alone_store, follow=False) as alone,
        anyio.create_task_group() as servers,
    ):
        servers.start_soon(relayed.serve)
        direct_count = [0]

        def appending(actor: SessionActor) -> Callable[[], AsyncIterator[float | None]]:
            """A side of awaited ``actor.append`` calls, checked to have all landed."""

            async def side() -> AsyncIterator[float | None]:
                before = actor.log.count
                yield None
                for _ in range(slices):
                    start = time.perf_counter()
                    for _ in range(per_slice):
                        await actor.append(USER, payload)
                    yield time.perf_counter() - start
                expect(actor.log.count == before + slices * per_slice, "one: appends missing")

            return side

        def raw_rows(
            write: Callable[[Row], Awaitable[object] | None],
        ) -> Callable[[], AsyncIterator[float | None]]:
            """A side that writes each slice's rows (made and encoded before its clock starts)
            one by one through ``write``, awaiting what it returns."""
            seq = [0]

            async def side() -> AsyncIterator[float | None]:
                yield None
                for _ in range(slices):
                    rows = []
                    for _ in range(per_slice):
                        rows.append((1, seq[0], encode(make_event(seq[0], USER, payload))))
                        seq[0] += 1
                    start = time.perf_counter()
                    for row in rows:
                        written = write(row)
                        if written is not None:
                            await written
                    yield time.perf_counter() - start

            return side

        async def store_commit() -> AsyncIterator[float | None]:
            yield None
            for _ in range(slices):
                start = time.perf_counter()
                for _ in range(per_slice):
                    count = direct_count[0]
                    event = make_event(count, USER, payload)
                    await direct_store.commit("one", expected_count=count, events=(event,))
                    direct_count[0] = count + 1
                yield time.perf_counter() - start

        samples = await ainterleave_slices(
            ctx.rounds,
            {
                "ours": AsyncSide(appending(session), slices),
                "alone": AsyncSide(appending(alone), slices),
                "raw": AsyncSide(raw_rows(lambda row: insert_row(raw, row)), slices),
                "thread": AsyncSide(raw_rows(threaded.insert), slices),
                "writer": AsyncSide(
                    raw_rows(lambda row: writer.write(lambda c: insert_only(c, row))), slices
                ),
                "relay": AsyncSide(raw_rows(relayed.call), slices),
                "counted": AsyncSide(
                    raw_rows(lambda row: counted.run(insert_row_and_count, row)), slices
                ),
                "store": AsyncSide(store_commit, slices),
            },
        )
        servers.cancel_scope.cancel()
    raw.close()
    threaded.close()
    counted.close()
    relay_thread.close()
    n = slices * per_slice
    return {key: [n / s for s in values] for key, values in samples.items()}


def one_session_sqlite(ctx: Context) -> list[Measurement]:
    """One session awaiting each append vs a raw sqlite3 loop of one-row transactions."""
    with tempfile.TemporaryDirectory(prefix="nous-bench-one-") as name:
        rows = anyio.run(_one_session, ctx, Path(name), backend="asyncio")
    return [
        measure(
            "many.one_session_sqlite.ours",
            "appends/s",
            rows["ours"],
            note="`await session.append(...)`, one at a time, on SQLiteStore (WAL, FULL)",
        ),
        measure(
            "many.one_session_sqlite.raw",
            "rows/s",
            rows["raw"],
            note="the floor: a plain sqlite3 loop of BEGIN IMMEDIATE / one-row INSERT / COMMIT "
            "on the same kind of file (WAL, FULL), in the event loop's own thread",
        ),
        ratio(
            "many.one_session_sqlite.ratio",
            rows["ours"],
            rows["raw"],
            target=Target(">=", 0.8, ISSUE_11),
            note="ours / raw, side by side in 100-append slices",
        ),
        measure(
            "many.one_session_sqlite.raw_thread",
            "rows/s",
            rows["thread"],
            note="the floor with the disk off the event loop: the same raw transactions, each"
            " run by one long-lived thread and awaited through an asyncio future",
        ),
        ratio(
            "many.one_session_sqlite.raw_thread_ratio",
            rows["thread"],
            rows["raw"],
            note="raw in a thread / raw on the loop: what one thread hop per commit costs",
        ),
        ratio(
            "many.one_session_sqlite.ratio_vs_thread",
            rows["ours"],
            rows["thread"],
            note="ours / raw in a thread: what the actor, the store and the writer add",
        ),
        ratio(
            "many.one_session_sqlite.writer_vs_thread",
            rows["writer"],
            rows["thread"],
            note="the same raw transactions run by nous_session's SQLite writer thread (the "
            "hand-over, the group machinery, the wake-up; none of the store's statements) / raw "
            "in a thread: what the writer's machinery alone costs",
        ),
        ratio(
            "many.one_session_sqlite.relay_vs_thread",
            rows["relay"],
            rows["thread"],
            note="the same raw transactions relayed through a server task (a deque, a parked "
            "future, an answer future: an actor's two task switches and nothing else) / raw "
            "in a thread: what an actor's shape alone costs",
        ),
        ratio(
            "many.one_session_sqlite.session_row_vs_thread",
            rows["counted"],
            rows["thread"],
            note="raw in a thread, each transaction also moving a session's count in a second "
            "table (the least a store that checks counts writes: a second page) / raw in a "
            "thread",
        ),
        ratio(
            "many.one_session_sqlite.not_following_vs_ours",
            rows["alone"],
            rows["ours"],
            note="the same session opened with follow=False (no change feed: the store's feed"
            " thread polls the file every 5 ms by default, to see other processes' commits) /"
            " ours: what following costs while this session is the only writer",
        ),
        ratio(
            "many.one_session_sqlite.store_vs_thread",
            rows["store"],
            rows["thread"],
            note="`SQLiteStore.commit` of one event awaited directly (no actor: the count "
            "check, the session row, the writer's group machinery) / raw in a thread",
        ),
        ratio(
            "many.one_session_sqlite.ours_vs_store",
            rows["ours"],
            rows["store"],
            note="ours / `SQLiteStore.commit` awaited directly: what the actor (its request, "
            "the fold, publishing and answering, two task switches) adds to the store's commit",
        ),
    ]


def _postgres_round(url: str, mode: str) -> float:
    """One round of 200 sessions over 4 processes: appends/s from 'go' to the last answer."""
    import psycopg

    worker = Path(__file__).with_name("_many_worker.py")
    schema = f"bench_{uuid.uuid4().hex[:10]}"
    try:
        children = [
            subprocess.Popen(
                [
                    sys.executable,
                    str(worker),
                    f"{url}?schema={schema}",
                    f"p{i}",
                    "50",
                    str(EACH),
                    mode,
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            for i in range(4)
        ]
        for child in children:  # every process has its sessions open
            assert child.stdout is not None
            expect(child.stdout.readline().strip() == "ready", "a worker did not start")
        start = time.perf_counter()
        for child in children:
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
        for child in children:
            assert child.stdout is not None
            expect(child.stdout.readline().strip() == "done", "a worker failed")
        elapsed = time.perf_counter() - start
        for child in children:
            child.communicate(timeout=60)
            expect(child.returncode == 0, "a worker failed")
        with psycopg.connect(url, autocommit=True) as connection:
            stored = connection.execute(f"SELECT count(*) FROM {schema}.nous_events").fetchone()
        expect(stored is not None and stored[0] == 4 * (50 * EACH + 1), "postgres: events lost")
        return 4 * 50 * EACH / elapsed
    finally:
        with psycopg.connect(url, autocommit=True) as connection:
            connection.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def sessions_postgres(ctx: Context) -> list[Measurement]:
    """200 sessions spread over 4 processes on PostgreSQL, each awaiting its own 20 appends:
    the store's group commit across sessions (the default) vs each commit on its own pooled
    connection, alternating round by round."""
    url = os.environ.get("NOUS_SESSION_TEST_POSTGRES")
    if not url:
        return []
    rates: dict[str, list[float]] = {"grouped": [], "pool": []}
    for index in range(ctx.rounds):
        for mode in ("grouped", "pool") if index % 2 == 0 else ("pool", "grouped"):
            rates[mode].append(_postgres_round(url, mode))
    note = (
        f"200 sessions over 4 processes (50 each) on one PostgreSQL database, each awaiting "
        f"its own {EACH} appends in order; from 'go' to the last acknowledgement"
    )
    return [
        measure(
            "many.sessions_postgres.rate",
            "appends/s",
            rates["grouped"],
            target=Target(">=", 20_000, ISSUE_11),
            note=note + "; the store's default: each process's commits of one round in one "
            "transaction (one set-based statement, one WAL flush)",
        ),
        measure(
            "many.sessions_postgres.pool",
            "appends/s",
            rates["pool"],
            note=note + "; group commit off: each commit one autocommitted statement on a "
            "pooled connection (8 per process)",
        ),
        ratio(
            "many.sessions_postgres.grouped_vs_pool",
            rates["grouped"],
            rates["pool"],
            note="grouped / pool, rounds alternating",
        ),
    ]


async def _idle(count: int) -> tuple[float, float]:
    def resident() -> int:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmRSS"):
                    return int(line.split()[1]) * 1024
        return 0

    store = MemoryStore()
    gc.collect()
    rss_before = resident()
    tracemalloc.start()
    traced_before = tracemalloc.get_traced_memory()[0]
    async with AsyncExitStack() as stack:
        for index in range(count):
            await stack.enter_async_context(SessionActor.open(session_id=f"s{index}", store=store))
        gc.collect()
        traced = tracemalloc.get_traced_memory()[0] - traced_before
        rss = resident() - rss_before
    tracemalloc.stop()
    return traced / count, rss / count


def idle_memory(ctx: Context) -> list[Measurement]:
    """10,000 open idle sessions in one process: bytes per session."""
    count = ctx.size(10_000, 2_000)
    traced, rss = [], []
    for _ in range(max(1, ctx.rounds // 3)):
        a, b = anyio.run(_idle, count, backend="asyncio")
        traced.append(a)
        rss.append(b)
    return [
        measure(
            "many.idle_memory.traced",
            "B/session",
            traced,
            note=f"{count:,} open, idle sessions (SessionActor.open on a MemoryStore, no "
            "events): Python allocations per session (tracemalloc)",
        ),
        measure(
            "many.idle_memory.resident",
            "B/session",
            rss,
            note="the process's resident memory per session, the same sessions",
        ),
    ]


BENCHMARKS: list[Any] = [one_session_sqlite, sessions_sqlite, sessions_postgres, idle_memory]
