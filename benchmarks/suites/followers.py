"""Suite "followers": SQLite's change feed, across processes and at scale (issue 21).

* ``latency_sqlite``: another process commits to one session at 1,000 commits/s, each append
  awaited (``_follow_worker.py``); this process follows the session with an actor
  (``follow`` left at its default) and a subscription, and notes when each event arrives.
  Commit-to-delivery latency (the writer's acknowledgement to the subscriber's receipt, one
  machine-wide monotonic clock): p50, p99 and max per round. Target: p99 <= 50 ms.
* ``cost_sqlite``: 200 sessions x 20 awaited appends on one SQLite file, every actor following
  (the default) vs none following (``follow=False``), interleaved rounds: the rate ratio, and
  whether a store nobody follows started the feed's thread (it must not).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from contextlib import AsyncExitStack
from pathlib import Path

import anyio

from benchmarks.harness import Context, Measurement, Target, expect, interleave, measure, ratio
from benchmarks.workloads import content
from nous_session import EventType, SessionActor
from nous_session.stores.sqlite import SQLiteStore
from nous_session.stores.sqlite._store import feed_running

SOURCE = "issue 21"
RATE = 1_000.0
ROOT = Path(__file__).resolve().parents[2]


async def _follow_round(directory: Path, seconds: float) -> list[float]:
    """One round: the latencies (ms) of every event another process commits at ``RATE``."""
    path = directory / "follow.sqlite3"
    count = int(RATE * seconds)
    out = directory / "committed.txt"
    arrived: dict[int, int] = {}
    async with (
        SQLiteStore(path) as store,
        SessionActor.open(session_id="live", store=store) as follower,
        follower.subscribe(0) as events,
    ):
        environment = {**os.environ, "PYTHONPATH": str(ROOT)}
        with anyio.fail_after(60 + seconds * 5):
            async with anyio.create_task_group() as task_group:

                async def writer() -> None:
                    await anyio.run_process(
                        [
                            sys.executable,
                            "-m",
                            "benchmarks.suites._follow_worker",
                            str(path),
                            "live",
                            str(RATE),
                            str(count),
                            str(out),
                        ],
                        cwd=ROOT,
                        env=environment,
                    )

                task_group.start_soon(writer)
                async for event in events:
                    arrived[event.seq] = time.monotonic_ns()
                    if len(arrived) == count:
                        break
    committed = [line.split() for line in out.read_text(encoding="utf-8").splitlines()]
    expect(len(committed) == count, f"the writer committed {len(committed)} of {count}")
    expect(set(arrived) == {int(seq) for seq, _ in committed}, "an event was not delivered")
    return [(arrived[int(seq)] - int(at)) / 1e6 for seq, at in committed]


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def latency_sqlite(ctx: Context) -> list[Measurement]:
    """Commit in one process, delivery to a subscriber in another, at 1,000 commits/s."""
    seconds = ctx.size(3, 1)
    p50s, p99s, maxima = [], [], []
    for _ in range(ctx.rounds):
        with tempfile.TemporaryDirectory(prefix="nous-bench-follow-") as name:
            latencies = anyio.run(_follow_round, Path(name), seconds, backend="asyncio")
        p50s.append(_percentile(latencies, 0.5))
        p99s.append(_percentile(latencies, 0.99))
        maxima.append(max(latencies))
    note = (
        f"another process appends {int(RATE * seconds):,} events at {RATE:,.0f} commits/s, each"
        " awaited; this one follows with an actor and a subscription"
    )
    return [
        measure("followers.latency_sqlite.p50", "ms", p50s, note=note),
        measure(
            "followers.latency_sqlite.p99", "ms", p99s, target=Target("<=", 50, SOURCE), note=note
        ),
        measure("followers.latency_sqlite.max", "ms", maxima, note=note),
    ]


async def _sessions(path: Path, count: int, each: int, follow: bool | None) -> float:
    """``count`` sessions each awaiting ``each`` appends, all at once: appends/s."""
    payload = {"content": content(1)}
    async with SQLiteStore(path) as store, AsyncExitStack() as stack:
        sessions = [
            await stack.enter_async_context(
                SessionActor.open(session_id=f"s{i}", store=store, follow=follow)
            )
            for i in range(count)
        ]

        async def produce(session: SessionActor) -> None:
            for _ in range(each):
                await session.append(EventType.USER_MESSAGE, payload)

        start = time.perf_counter()
        async with anyio.create_task_group() as task_group:
            for session in sessions:
                task_group.start_soon(produce, session)
        elapsed = time.perf_counter() - start
        expect(all(s.log.count == each for s in sessions), "an append is lost")
        started = feed_running(store)
        expect(started == (follow is not False), f"follow={follow}: feed thread {started}")
    return count * each / elapsed


def cost_sqlite(ctx: Context) -> list[Measurement]:
    """200 sessions x 20 appends, all following vs none following, interleaved."""
    count, each = 200, 20

    def side(follow: bool | None) -> float:
        with tempfile.TemporaryDirectory(prefix="nous-bench-follow-") as name:
            return anyio.run(
                _sessions, Path(name) / "many.sqlite3", count, each, follow, backend="asyncio"
            )

    rates = interleave(
        ctx.rounds, {"following": lambda: side(None), "not_following": lambda: side(False)}
    )
    note = f"{count} sessions x {each} awaited appends on one SQLite file (WAL, FULL)"
    return [
        measure("followers.cost_sqlite.following", "appends/s", rates["following"], note=note),
        measure(
            "followers.cost_sqlite.not_following", "appends/s", rates["not_following"], note=note
        ),
        ratio(
            "followers.cost_sqlite.ratio",
            rates["following"],
            rates["not_following"],
            note="every actor following (the default) / none following (follow=False)",
        ),
    ]


BENCHMARKS = [latency_sqlite, cost_sqlite]
