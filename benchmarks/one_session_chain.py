"""Where one awaited append to one SQLite session spends its time: ours and the floor, step by
step, side by side in one run.

Usage: ``PYTHONPATH=. python benchmarks/one_session_chain.py [--appends 2000] [--rounds 6]
[--output FILE.md]``

Both sides append the same event (~250 bytes of JSON) to a fresh file in WAL mode at
``synchronous=FULL``, each append awaited before the next:

* ``ours``: ``SessionActor.open(session_id=..., store=SQLiteStore(path))`` and ``append``, as a
  user writes it (following the file, the default);
* ``floor``: no library: the event made and encoded in the caller, handed to one thread through
  a ``queue.SimpleQueue`` (``BEGIN IMMEDIATE``, one ``INSERT``, ``COMMIT``) and awaited through
  a future woken with ``loop.call_soon_threadsafe``; :class:`benchmarks.floors.RawThread`
  with a clock read between its steps.

Each append's path is stamped (``time.perf_counter_ns``) where it crosses from one step to the
next; on our side by wrapping the functions at those points (the actor's commit of a segment,
the writer's hand-over, its transaction, the commit's statements, the loop's wake-up), which
adds a few microseconds per wrapped call: the steps are for comparing, the uninstrumented
rates (measured in the same rounds, wrappers off) are the figures. Sides alternate in every
round; the table gives medians over every append of every round. CPU: the event loop's thread
(``time.thread_time``) and the disk thread's inside its transactions, per append. Last, each
side's transaction alone (BEGIN, the statements, COMMIT) in a plain loop on one thread: the
SQLite work without the event loop and the threads around it.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import platform
import shutil
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks import floors
from benchmarks.floors import RawThread, raw_connection
from benchmarks.harness import write_markdown
from nous_session import SessionActor
from nous_session._engine import Engine
from nous_session.codec import encode
from nous_session.event import EventType, make_event
from nous_session.stores._common import Commit
from nous_session.stores.sqlite import SQLiteStore, _writer
from nous_session.stores.sqlite import _commit as sqlite_commit

DATA = {"content": "hello there, " * 18}
WARMUP = 200
ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUTPUT = ROOT / "benchmarks" / "results" / "issue20" / "one_session_chain.md"

# (label, from stamp, to stamp) per side; a step a side does not have is left out.
STEPS: dict[str, list[tuple[str, str, str]]] = {
    "ours": [
        ("the caller's request reaches the actor task", "call", "taken"),
        ("applied, checked, encoded, handed to the disk thread", "taken", "handed"),
        ("the disk thread wakes and takes it", "handed", "begun"),
        ("file check and BEGIN IMMEDIATE", "begun", "statements"),
        ("the commit's statements", "statements", "written"),
        ("COMMIT (the fsync)", "written", "durable"),
        ("back on the event loop", "durable", "woken"),
        ("the actor publishes and answers", "woken", "answered"),
        ("the caller resumes", "answered", "returned"),
    ],
    "floor": [
        ("event made, encoded, handed to the disk thread", "call", "handed"),
        ("the disk thread wakes and takes it", "handed", "begun"),
        ("BEGIN IMMEDIATE", "begun", "statements"),
        ("the INSERT", "statements", "written"),
        ("COMMIT (the fsync)", "written", "durable"),
        ("back on the event loop", "durable", "woken"),
        ("the caller resumes", "woken", "returned"),
    ],
}


class Stamps:
    """The current append's stamps; the first stamp of a name wins (a step may recur)."""

    def __init__(self) -> None:
        self.on = False
        self.now: dict[str, int] = {}
        self.thread_cpu = 0.0  # the disk thread's CPU inside its transactions

    def stamp(self, name: str) -> None:
        if self.on and name not in self.now:
            self.now[name] = time.perf_counter_ns()


STAMPS = Stamps()


def _wrapped(function: Callable[..., Any], before: str | None, after: str | None) -> Any:
    if asyncio.iscoroutinefunction(function):

        @functools.wraps(function)
        async def wrapper_async(*args: Any, **kwargs: Any) -> Any:
            if before:
                STAMPS.stamp(before)
            result = await function(*args, **kwargs)
            if after:
                STAMPS.stamp(after)
            return result

        return wrapper_async

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if before:
            STAMPS.stamp(before)
        result = function(*args, **kwargs)
        if after:
            STAMPS.stamp(after)
        return result

    return wrapper


def _timed_transaction(function: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        STAMPS.stamp("begun")
        began = time.thread_time()
        function(*args, **kwargs)
        STAMPS.thread_cpu += time.thread_time() - began
        STAMPS.stamp("durable")

    return wrapper


def instrument() -> None:
    """Wrap our functions at the step boundaries (before any store or actor is made: the
    actor binds its commit, and the writer its loop's wake-up, when they are created)."""
    # The actor's documented benchmarking hook (see Engine.commit_segment).
    engine_commit = Engine.commit_segment
    Engine.commit_segment = _wrapped(engine_commit, "taken", "answered")  # type: ignore[method-assign]
    stamps = {"flush": (None, "handed"), "set_futures": ("woken", None)}

    def writer_step(step: str, function: Callable[..., Any]) -> Callable[..., Any]:
        if step == "write_group":
            return _timed_transaction(function)
        return _wrapped(function, *stamps[step]) if step in stamps else function

    _writer.instrument(writer_step)
    sqlite_commit.instrument(lambda _, function: _wrapped(function, "statements", "written"))
    # The floor's side: RawThread answers through floors._answer on the loop.
    floors._answer = _wrapped(floors._answer, "woken", None)


def _floor_append(connection: sqlite3.Connection, row: tuple[str, int, bytes]) -> None:
    """:func:`benchmarks.floors.insert_row`, with a clock read between its steps (run by
    :class:`benchmarks.floors.RawThread`)."""
    STAMPS.stamp("begun")
    began = time.thread_time()
    connection.execute("BEGIN IMMEDIATE")
    STAMPS.stamp("statements")
    connection.execute("INSERT INTO nous_events VALUES (?, ?, ?)", row)
    STAMPS.stamp("written")
    connection.execute("COMMIT")
    STAMPS.thread_cpu += time.thread_time() - began
    STAMPS.stamp("durable")


class Round:
    """One side's figures of one round."""

    def __init__(self) -> None:
        self.stamps: list[dict[str, int]] = []
        self.rate = 0.0
        self.loop_cpu = 0.0
        self.thread_cpu = 0.0


async def _run(side: str, path: Path, appends: int) -> Round:
    out = Round()

    async def drive(append: Callable[[int], Any]) -> None:
        for seq in range(WARMUP):
            await append(seq)
        # Instrumented: every append stamped.
        STAMPS.on = True
        for seq in range(WARMUP, WARMUP + appends):
            STAMPS.now = {"call": time.perf_counter_ns()}
            await append(seq)
            STAMPS.now["returned"] = time.perf_counter_ns()
            out.stamps.append(STAMPS.now)
        STAMPS.on = False
        # Uninstrumented: the rate and the CPU.
        STAMPS.thread_cpu = 0.0
        first = WARMUP + appends
        wall, cpu = time.perf_counter(), time.thread_time()
        for seq in range(first, first + appends):
            await append(seq)
        wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
        out.rate, out.loop_cpu = appends / wall, cpu / appends
        out.thread_cpu = STAMPS.thread_cpu / appends

    if side == "floor":
        thread = RawThread(path)

        async def floor_append(seq: int) -> None:
            record = encode(make_event(seq, EventType.USER_MESSAGE, DATA))
            STAMPS.stamp("handed")  # run() queues the job before its first await
            await thread.run(_floor_append, ("one", seq, record))

        try:
            await drive(floor_append)
        finally:
            thread.close()
        return out
    async with (
        SQLiteStore(path) as store,
        SessionActor.open(session_id="one", store=store) as actor,
    ):

        async def append(seq: int) -> None:
            await actor.append(EventType.USER_MESSAGE, DATA)

        await drive(append)
    return out


def isolated(directory: Path, appends: int) -> dict[str, dict[str, float]]:
    """The disk thread's work alone: each side's transaction run in a plain loop on this
    thread (no event loop, no other thread), medians in µs of BEGIN, the statements and
    COMMIT."""
    ours_path, floor_path = directory / "isolated-ours.db", directory / "isolated-floor.db"

    async def create() -> None:
        async with SQLiteStore(ours_path) as store:
            await store.sessions()  # the file and its tables

    asyncio.run(create())
    ours = sqlite3.connect(ours_path, isolation_level=None)
    ours.execute("PRAGMA synchronous=FULL")
    floor = raw_connection(floor_path)
    records = [encode(make_event(seq, EventType.USER_MESSAGE, DATA)) for seq in range(appends)]

    ids: dict[str, int] = {}  # as the store keeps them
    commits = [Commit("one", seq, []) for seq in range(appends)]  # made before the clock runs

    def ours_statements(connection: sqlite3.Connection, seq: int) -> None:
        sqlite_commit.write_commit(connection, commits[seq], [(seq, records[seq])], ids=ids)

    def floor_statements(connection: sqlite3.Connection, seq: int) -> None:
        connection.execute("INSERT INTO nous_events VALUES (?, ?, ?)", ("one", seq, records[seq]))

    out: dict[str, dict[str, float]] = {}
    for side, connection, statements in (
        ("ours", ours, ours_statements),
        ("floor", floor, floor_statements),
    ):
        steps: dict[str, list[int]] = {"BEGIN": [], "statements": [], "COMMIT": []}
        for seq in range(appends):
            began = time.perf_counter_ns()
            connection.execute("BEGIN IMMEDIATE")
            written = time.perf_counter_ns()
            statements(connection, seq)
            committing = time.perf_counter_ns()
            connection.execute("COMMIT")
            done = time.perf_counter_ns()
            steps["BEGIN"].append(written - began)
            steps["statements"].append(committing - written)
            steps["COMMIT"].append(done - committing)
        connection.close()
        out[side] = {name: statistics.median(values) / 1000 for name, values in steps.items()}
    return out


def _median_step(rounds: list[Round], start: str, end: str) -> float:
    return statistics.median(
        (stamps[end] - stamps[start]) / 1000
        for one in rounds
        for stamps in one.stamps
        if start in stamps and end in stamps
    )


def report(
    results: dict[str, list[Round]],
    alone: dict[str, dict[str, float]],
    args: argparse.Namespace,
    elapsed: float,
) -> str:
    ours, floor = results["ours"], results["floor"]
    lines = [
        "# One awaited append to one SQLite session, step by step: ours and the floor",
        "",
        f"Measured {datetime.now(UTC):%Y-%m-%d %H:%M} UTC by `PYTHONPATH=. python "
        f"benchmarks/one_session_chain.py --appends {args.appends} --rounds {args.rounds}` in "
        f"{elapsed:.0f} s: Python {platform.python_version()}, {len(os.sched_getaffinity(0))} "
        "usable cores shared with other jobs (the ratios come from the same rounds).",
        "",
        "Medians over every instrumented append (µs); the wrappers add a few µs to each of "
        "our steps. The totals and rates below the steps are uninstrumented.",
        "",
        "| step | ours | floor |",
        "|---|---:|---:|",
    ]
    floor_steps = {label: (a, b) for label, a, b in STEPS["floor"]}
    shared = {
        "the disk thread wakes and takes it",
        "back on the event loop",
        "COMMIT (the fsync)",
    }
    done_floor: set[str] = set()
    for label, start, end in STEPS["ours"]:
        mine = _median_step(ours, start, end)
        theirs = ""
        if label in shared:
            theirs = f"{_median_step(floor, *floor_steps[label]):,.0f}"
            done_floor.add(label)
        elif label == "applied, checked, encoded, handed to the disk thread":
            label_floor = "event made, encoded, handed to the disk thread"
            theirs = f"{_median_step(floor, *floor_steps[label_floor]):,.0f} (made and encoded)"
        elif label == "file check and BEGIN IMMEDIATE":
            theirs = f"{_median_step(floor, *floor_steps['BEGIN IMMEDIATE']):,.0f} (BEGIN)"
        elif label == "the commit's statements":
            theirs = f"{_median_step(floor, *floor_steps['the INSERT']):,.0f} (one INSERT)"
        elif label == "the caller resumes":
            theirs = f"{_median_step(floor, *floor_steps['the caller resumes']):,.0f}"
        lines.append(f"| {label} | {mine:,.0f} | {theirs} |")
    lines.append(
        f"| **call to return, instrumented** | **{_median_step(ours, 'call', 'returned'):,.0f}**"
        f" | **{_median_step(floor, 'call', 'returned'):,.0f}** |"
    )

    def median(rounds: list[Round], attribute: str, scale: float = 1.0) -> float:
        return statistics.median(getattr(one, attribute) * scale for one in rounds)

    ratio = statistics.median(a.rate / b.rate for a, b in zip(ours, floor, strict=True))
    lines += [
        f"| appends/s, uninstrumented | {median(ours, 'rate'):,.0f} | "
        f"{median(floor, 'rate'):,.0f} |",
        f"| ours / the floor (median of per-round ratios) | {ratio:.2f}x | |",
        f"| event loop thread CPU per append | {median(ours, 'loop_cpu', 1e6):,.0f} | "
        f"{median(floor, 'loop_cpu', 1e6):,.0f} |",
        f"| disk thread CPU per append, in its transaction | "
        f"{median(ours, 'thread_cpu', 1e6):,.0f} | {median(floor, 'thread_cpu', 1e6):,.0f} |",
        "",
        "The disk thread's work alone (each side's transaction in a plain loop on one thread, "
        f"{args.appends:,} appends to a fresh file, medians in µs):",
        "",
        "| | ours | floor |",
        "|---|---:|---:|",
        *(
            f"| {name} | {alone['ours'][name]:,.1f} | {alone['floor'][name]:,.1f} |"
            for name in ("BEGIN", "statements", "COMMIT")
        ),
        "",
        "Rounds (appends/s, uninstrumented):",
        "",
        "* ours: " + ", ".join(f"{one.rate:,.0f}" for one in ours),
        "* floor: " + ", ".join(f"{one.rate:,.0f}" for one in floor),
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--appends", type=int, default=2000, help="appends per side and round")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    args = parser.parse_args(argv)
    instrument()
    results: dict[str, list[Round]] = {"ours": [], "floor": []}
    scratch = Path(tempfile.mkdtemp(prefix="nous-chain-"))
    started = time.perf_counter()
    try:
        for index in range(args.rounds):
            order = ("ours", "floor") if index % 2 == 0 else ("floor", "ours")
            for side in order:
                path = scratch / f"{index}-{side}.db"
                one = asyncio.run(_run(side, path, args.appends))
                results[side].append(one)
                print(f"round {index + 1} {side:5} {one.rate:7,.0f} appends/s", flush=True)
        alone = isolated(scratch, args.appends)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    write_markdown(args.output, report(results, alone, args, time.perf_counter() - started))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
