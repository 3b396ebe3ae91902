"""Where the time per append goes when many sessions write at once (issue 11): a diagnostic.

Usage::

    python benchmarks/many_breakdown.py [--rounds 3] [--sessions 200] [--flat] [--freeze]
    python benchmarks/many_breakdown.py --postgres [--rounds 2]   # needs NOUS_SESSION_TEST_POSTGRES

SQLite (asyncio, one file, WAL, FULL): ``--sessions`` sessions, each awaiting its own 20 appends,
all at once; then the same on a MemoryStore (the actor and its callers alone); then one session
awaiting 300 appends. The sessions are opened nested in one ``AsyncExitStack`` as the suite
does, or with ``--flat`` each in its own task; ``--freeze`` calls ``gc.freeze()`` once they are
open, as an application may. Per append: wall time, the event loop thread's
CPU, the part of it the cyclic garbage collector took (``gc.callbacks``; with the collections
per generation), and the writer thread's CPU and wall time in its jobs, its BEGIN and
savepoints, its COMMIT (the fsync) and its wake-ups of the event loop (measured by wrapping the
writer's methods).

PostgreSQL: 200 sessions over 4 processes (50 each, ``suites/_many_worker.py``), the store's
group commit and the pool side by side: appends/s and the client processes' CPU per append
(from 'go' to 'done', the mean of the four; the server's own CPU is not counted).

The wrapping costs a little itself; the figures are for finding where the time goes, not for
quoting as rates (``run.py --only many`` measures those).
"""

from __future__ import annotations

import argparse
import functools
import gc
import logging
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import anyio
import structlog

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from nous_session import EventType, SessionActor  # noqa: E402
from nous_session.stores import MemoryStore, Store  # noqa: E402
from nous_session.stores.sqlite import SQLiteStore  # noqa: E402
from nous_session.stores.sqlite._writer import instrument  # noqa: E402

PAYLOAD = {"content": "x" * 200}
EACH = 20
WRITER = ("cpu", "jobs", "begin", "commit", "wakeups")
_spent: dict[str, float] = dict.fromkeys(WRITER, 0.0)


def _instrument() -> None:
    """Wrap the writer's methods to add up where its thread spends its time."""
    originals: dict[str, Callable[..., Any]] = {}

    def timed_group(self: Any, connection: Any, calls: Any) -> None:
        cpu = time.thread_time()
        originals["write_group"](self, connection, calls)
        _spent["cpu"] += time.thread_time() - cpu

    def timed_write(self: Any, connection: Any, call: Any) -> None:
        start = time.perf_counter()
        originals["run_write"](self, connection, call)
        _spent["jobs"] += time.perf_counter() - start

    def timed_execute(cursor: Any, sql: str, what: str) -> None:
        start = time.perf_counter()
        originals["execute"](cursor, sql, what)
        _spent["commit" if sql == "COMMIT" else "begin"] += time.perf_counter() - start

    def timed_deliver(self: Any, calls: Any) -> None:
        start, cpu = time.perf_counter(), time.thread_time()
        originals["deliver"](self, calls)
        _spent["wakeups"] += time.perf_counter() - start
        _spent["cpu"] += time.thread_time() - cpu

    timed: dict[str, Callable[..., Any]] = {
        "write_group": timed_group,
        "run_write": timed_write,
        "execute": timed_execute,
        "deliver": timed_deliver,
    }

    def wrap(step: str, function: Callable[..., Any]) -> Callable[..., Any]:
        originals[step] = function
        return timed.get(step, function)

    instrument(wrap)


async def _run(
    make: Callable[[], Store], sessions: int, each: int, flat: bool, freeze: bool = False
) -> dict[str, Any]:
    """``sessions`` sessions, each awaiting ``each`` appends, all at once; the figures per append.

    Nested (the suite's way): the sessions are opened one inside the other in one
    ``AsyncExitStack``, so each actor's cancel scopes sit under those of every session opened
    before it. Flat: each session is opened in its own task, as a server's per-connection
    handlers would.
    """
    collected = {"time": 0.0, "start": 0.0, "runs": [0, 0, 0]}

    def callback(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            collected["start"] = time.thread_time()
        else:
            collected["time"] += time.thread_time() - collected["start"]
            collected["runs"][info["generation"]] += 1  # type: ignore[index]

    async def produce(actor: SessionActor) -> None:
        for _ in range(each):
            await actor.append(EventType.USER_MESSAGE, PAYLOAD)

    def begin() -> tuple[float, float]:
        if freeze:  # what an application can do once its sessions are open
            gc.collect()
            gc.freeze()
        for key in WRITER:
            _spent[key] = 0.0
        gc.callbacks.append(callback)
        return time.perf_counter(), time.thread_time()

    async with make() as store:  # type: ignore[attr-defined]
        if flat:
            opened: list[SessionActor] = []
            ready, go = anyio.Event(), anyio.Event()

            async def session(index: int) -> None:
                async with SessionActor.open(session_id=f"s{index}", store=store) as actor:
                    opened.append(actor)
                    if len(opened) == sessions:
                        ready.set()
                    await go.wait()
                    await produce(actor)
                    counts.append(actor.log.count)

            counts: list[int] = []
            async with anyio.create_task_group() as task_group:
                for index in range(sessions):
                    task_group.start_soon(session, index)
                await ready.wait()
                start, cpu = begin()
                go.set()
            wall, cpu = time.perf_counter() - start, time.thread_time() - cpu
        else:
            async with AsyncExitStack() as stack:
                actors = [
                    await stack.enter_async_context(
                        SessionActor.open(session_id=f"s{i}", store=store)
                    )
                    for i in range(sessions)
                ]
                start, cpu = begin()
                async with anyio.create_task_group() as task_group:
                    for actor in actors:
                        task_group.start_soon(produce, actor)
                wall, cpu = time.perf_counter() - start, time.thread_time() - cpu
                counts = [actor.log.count for actor in actors]
        gc.callbacks.remove(callback)
        if freeze:
            gc.unfreeze()
        if counts != [each] * sessions:
            raise SystemExit("an append is missing")
    n = sessions * each
    return {
        "wall": wall / n * 1e6,
        "loop CPU": cpu / n * 1e6,
        "of which GC": collected["time"] / n * 1e6,  # type: ignore[operator]
        "GC runs per generation": collected["runs"],
        **{f"writer {key}": _spent[key] / n * 1e6 for key in WRITER},
    }


def _print(name: str, row: dict[str, Any]) -> None:
    parts = [
        f"{key} {value:.1f}" if isinstance(value, float) else f"{key} {value}"
        for key, value in row.items()
    ]
    print(f"{name:>14}: us/append: " + ", ".join(parts), flush=True)


def sqlite(rounds: int, sessions: int, flat: bool, freeze: bool) -> None:
    _instrument()
    how = (" flat" if flat else "") + (" frozen" if freeze else "")
    for _ in range(rounds):
        with tempfile.TemporaryDirectory(prefix="nous-breakdown-") as name:
            many = functools.partial(SQLiteStore, Path(name) / "many.sqlite3")
            row = anyio.run(_run, many, sessions, EACH, flat, freeze, backend="asyncio")
        _print(f"sqlite x{sessions}{how}", row)
        row = anyio.run(_run, MemoryStore, sessions, EACH, flat, freeze, backend="asyncio")
        _print(f"memory x{sessions}{how}", row)
        with tempfile.TemporaryDirectory(prefix="nous-breakdown-") as name:
            one = functools.partial(SQLiteStore, Path(name) / "one.sqlite3")
            row = anyio.run(_run, one, 1, 300, False, backend="asyncio")
        _print("sqlite x1", row)


def postgres(rounds: int) -> None:
    import psycopg

    url = os.environ.get("NOUS_SESSION_TEST_POSTGRES")
    if not url:
        raise SystemExit("set NOUS_SESSION_TEST_POSTGRES")
    worker = Path(__file__).with_name("suites") / "_many_worker.py"
    for index in range(rounds):
        for mode in ("grouped", "pool") if index % 2 == 0 else ("pool", "grouped"):
            schema = f"breakdown_{uuid.uuid4().hex[:10]}"
            try:
                children = [
                    subprocess.Popen(
                        [
                            *(sys.executable, str(worker), f"{url}?schema={schema}", f"p{i}"),
                            *("50", str(EACH), mode, "cpu"),
                        ],
                        stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE,
                        text=True,
                    )
                    for i in range(4)
                ]
                for child in children:
                    assert child.stdout is not None
                    if child.stdout.readline().strip() != "ready":
                        raise SystemExit("a worker did not start")
                start = time.perf_counter()
                for child in children:
                    assert child.stdin is not None
                    child.stdin.write("go\n")
                    child.stdin.flush()
                cpu = []
                for child in children:
                    assert child.stdout is not None
                    if child.stdout.readline().strip() != "done":
                        raise SystemExit("a worker failed")
                elapsed = time.perf_counter() - start
                for child in children:
                    assert child.stdout is not None
                    cpu.append(float(child.stdout.readline().split()[1]))
                    child.communicate(timeout=60)
            finally:
                with psycopg.connect(url, autocommit=True) as connection:
                    connection.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
            n = 4 * 50 * EACH
            print(
                f"postgres {mode:>7}: {n / elapsed:,.0f} appends/s; client CPU per append "
                f"{sum(cpu) / len(cpu):.0f} us (mean of the 4 processes)",
                flush=True,
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--postgres", action="store_true")
    parser.add_argument(
        "--flat", action="store_true", help="open each session in its own task, not nested"
    )
    parser.add_argument(
        "--freeze",
        action="store_true",
        help="gc.freeze() once the sessions are open (an application's choice, not the library's)",
    )
    args = parser.parse_args()
    # As run.py does: a deployment's filter (the actor logs every commit at debug level).
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.INFO))
    if args.postgres:
        postgres(args.rounds)
    else:
        sqlite(args.rounds, args.sessions, args.flat, args.freeze)


if __name__ == "__main__":
    main()
