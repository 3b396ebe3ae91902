"""The writer process of the ``followers.latency_sqlite`` benchmark.

``python -m benchmarks.suites._follow_worker PATH SESSION RATE COUNT OUT`` opens ``SESSION`` on
the SQLite file ``PATH`` and appends ``COUNT`` events paced at ``RATE`` commits per second, each
append awaited; then writes to ``OUT`` one line per append: its seq and the
``time.monotonic_ns()`` at which the append returned (committed). Linux's monotonic clock is
one clock for every process on the machine, so the follower can subtract it from its own.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import anyio

from nous_session import EventType, SessionActor
from nous_session.stores.sqlite import SQLiteStore


async def write(path: str, session_id: str, rate: float, count: int) -> list[tuple[int, int]]:
    committed: list[tuple[int, int]] = []
    async with (
        SQLiteStore(path) as store,
        SessionActor.open(session_id=session_id, store=store, follow=False) as session,
    ):
        start = time.monotonic()
        for index in range(count):
            delay = start + index / rate - time.monotonic()
            if delay > 0:
                await anyio.sleep(delay)  # the pace: one commit every 1/rate seconds
            event = await session.append(EventType.USER_MESSAGE, {"content": f"m{index}"})
            committed.append((event.seq, time.monotonic_ns()))
    return committed


def main() -> None:
    path, session_id, rate, count, out = sys.argv[1:6]
    committed = anyio.run(write, path, session_id, float(rate), int(count))
    Path(out).write_text("".join(f"{seq} {at}\n" for seq, at in committed), encoding="utf-8")


if __name__ == "__main__":
    main()
