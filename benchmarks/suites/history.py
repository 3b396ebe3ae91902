"""Suite "history": forks and rewinds, against issue 10's targets.

* ``fork_sqlite`` / ``fork_postgres``: ``store.fork`` of a 100,000-event session (at its head
  and at its middle), which must not copy the history (< 5 ms); then opening the child and
  reading its surface vs the same for the parent, side by side (the same cost).
  ``fork_postgres`` runs when ``NOUS_SESSION_TEST_POSTGRES`` names a server.
* ``fork_memory``: ``Log.upto`` (the in-memory fork) at 100,000 vs 1,000 events: O(1).
* ``rewind_then_continue``: rewind a 100,000-event log to its middle, then an agent loop (append
  a message, read the messages) after it, vs the same loop on a log that was never rewound;
  the rewind's own cost is reported too.
"""

from __future__ import annotations

import os
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import anyio

from benchmarks.harness import (
    Context,
    Measurement,
    Target,
    ainterleave,
    expect,
    interleave,
    measure,
    ratio,
)
from benchmarks.workloads import chat_messages
from nous_session import EventType, Log, SessionActor
from nous_session.stores.sqlite import SQLiteStore

ISSUE_10 = "issue 10"
MS = 1e3
US = 1e6


def _history(size: int) -> Log:
    log = Log.seed(chat_messages(size))
    expect(log.count == size, f"the workload made {log.count} events, not {size}")
    return log


async def _fill(store: Any, session_id: str, log: Log) -> None:
    events = log.events()
    count = 0
    for start in range(0, len(events), 10_000):
        part = events[start : start + 10_000]
        await store.commit(session_id, expected_count=count, events=part)
        count = part[-1].seq + 1


async def _forks(ctx: Context, make: Any) -> dict[str, list[float]]:
    size = ctx.size(100_000, 10_000)
    log = _history(size)
    store = make()
    try:
        await _fill(store, "parent", log)
        names = iter(range(10**6))
        samples: dict[str, list[float]] = {"head": [], "middle": []}
        for _ in range(ctx.rounds):
            for where, at in (("head", size - 1), ("middle", size // 2)):
                child = f"child-{where}-{next(names)}"
                start = time.perf_counter()
                await store.fork("parent", child, at=at)
                samples[where].append((time.perf_counter() - start) * MS)

        async def read(session_id: str) -> float:
            start = time.perf_counter()
            async with SessionActor.open(session_id=session_id, store=store) as session:
                messages = session.messages()
                elapsed = time.perf_counter() - start
            expect(len(messages) == size, f"{session_id}: {len(messages)} messages, not {size}")
            return elapsed * MS

        reads = await ainterleave(
            ctx.rounds,
            {"parent": lambda: read("parent"), "child": lambda: read("child-head-0")},
        )
        samples.update(reads)
        return samples
    finally:
        await store.aclose()


def _fork_measurements(kind: str, rows: dict[str, list[float]], size: int) -> list[Measurement]:
    return [
        measure(
            f"history.fork_{kind}.at_head",
            "ms",
            rows["head"],
            target=Target("<=", 5, ISSUE_10),
            note=f"`store.fork(parent, child, at=count-1)` of a {size:,}-event session",
        ),
        measure(
            f"history.fork_{kind}.at_middle",
            "ms",
            rows["middle"],
            target=Target("<=", 5, ISSUE_10),
            note="the same, at the middle of the history",
        ),
        measure(
            f"history.fork_{kind}.open_parent",
            "ms",
            rows["parent"],
            note="SessionActor.open of the parent until its messages are read",
        ),
        measure(
            f"history.fork_{kind}.open_child",
            "ms",
            rows["child"],
            note="the same for a child forked at the head (its history read through the parent)",
        ),
        ratio(
            f"history.fork_{kind}.open_ratio",
            rows["child"],
            rows["parent"],
            target=Target("<=", 1.25, ISSUE_10),
            note="child / parent: reading a fork costs what reading its parent does",
        ),
    ]


def fork_sqlite(ctx: Context) -> list[Measurement]:
    """Forking a 100,000-event SQLite session, and reading the fork."""
    with tempfile.TemporaryDirectory(prefix="nous-bench-history-") as name:
        path = Path(name) / "fork.sqlite3"
        rows = anyio.run(_forks, ctx, lambda: SQLiteStore(path), backend="asyncio")
    return _fork_measurements("sqlite", rows, ctx.size(100_000, 10_000))


def fork_postgres(ctx: Context) -> list[Measurement]:
    """Forking a 100,000-event PostgreSQL session, and reading the fork."""
    url = os.environ.get("NOUS_SESSION_TEST_POSTGRES")
    if not url:
        return []
    import psycopg

    from nous_session.stores.postgres import PostgresStore

    schema = f"bench_{uuid.uuid4().hex[:10]}"
    try:
        rows = anyio.run(_forks, ctx, lambda: PostgresStore(url, schema=schema), backend="asyncio")
    finally:
        with psycopg.connect(url, autocommit=True) as connection:
            connection.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    return _fork_measurements("postgres", rows, ctx.size(100_000, 10_000))


def fork_memory(ctx: Context) -> list[Measurement]:
    """``Log.upto`` (a fork of the immutable value) at 100,000 vs 1,000 events."""
    small, large = _history(1_000), _history(ctx.size(100_000, 20_000))
    small.surface()
    large.surface()
    repeat = 2_000

    def fork(log: Log) -> float:
        at = log.count // 2
        start = time.perf_counter()
        for _ in range(repeat):
            log.upto(at)
        return (time.perf_counter() - start) / repeat * US

    rows = interleave(ctx.rounds, {"at_1k": lambda: fork(small), "at_100k": lambda: fork(large)})
    return [
        measure("history.fork_memory.at_1k", "us/op", rows["at_1k"], note="Log.upto(count // 2)"),
        measure("history.fork_memory.at_100k", "us/op", rows["at_100k"], note="the same"),
        ratio(
            "history.fork_memory.ratio",
            rows["at_100k"],
            rows["at_1k"],
            target=Target("<=", 2, ISSUE_10),
            note="100k / 1k: a fork in memory shares the history (O(1))",
        ),
    ]


def rewind_then_continue(ctx: Context) -> list[Measurement]:
    """An agent loop after rewinding a 100,000-event log, vs one on a log never rewound."""
    size = ctx.size(100_000, 20_000)
    base = _history(size)
    base.derive_messages()
    steps = 1_000
    rewinds: list[float] = []

    def loop(rewound: bool) -> float:
        log = base
        if rewound:
            start = time.perf_counter()
            log = log.append(EventType.REWIND, {"surface_op": ["rewind", size // 2]})
            log.derive_messages()
            rewinds.append((time.perf_counter() - start) * MS)
        expected = len(log.derive_messages())
        start = time.perf_counter()
        for step in range(steps):
            log = log.append(EventType.USER_MESSAGE, {"content": f"after {step}"})
            messages = log.derive_messages()
        elapsed = time.perf_counter() - start
        expect(len(messages) == expected + steps, "the loop lost messages")
        return elapsed / steps * US

    rows = interleave(ctx.rounds, {"rewound": lambda: loop(True), "straight": lambda: loop(False)})
    return [
        measure(
            "history.rewind_then_continue.rewind",
            "ms",
            rewinds,
            note=f"append a rewind to seq {size // 2} of a {size:,}-event log, fold it once",
        ),
        measure(
            "history.rewind_then_continue.after_rewind",
            "us/iter",
            rows["rewound"],
            note="append a message, read the messages; after the rewind",
        ),
        measure(
            "history.rewind_then_continue.no_rewind",
            "us/iter",
            rows["straight"],
            note="the same loop on the log never rewound",
        ),
        ratio(
            "history.rewind_then_continue.ratio",
            rows["rewound"],
            rows["straight"],
            target=Target("<=", 1.5, ISSUE_10),
            note="after a rewind, continuing costs what it does without one",
        ),
    ]


BENCHMARKS: list[Any] = [fork_memory, fork_sqlite, fork_postgres, rewind_then_continue]
