"""SQLiteWriter against a raw sqlite3 loop and against today's thread-per-call approach.

Usage::

    python benchmarks/writer_bench.py [--rounds 5] [--n 2000] [--large 1000,10000]
                                      [--large-baseline] [--output results.json]

Every side writes one ~200-byte row per transaction into its own fresh file in WAL mode with
``synchronous=FULL`` (every commit fsyncs the WAL), under a temporary directory:

* ``raw``: a plain ``sqlite3`` loop of BEGIN IMMEDIATE / INSERT / COMMIT.
* ``to_thread``: today's SQLiteStore plumbing: ``anyio.to_thread.run_sync(job,
  limiter=CapacityLimiter(1))`` per transaction, the job doing BEGIN IMMEDIATE / INSERT / COMMIT.
* ``writer``: ``await SQLiteWriter.write(job)``, the job doing the INSERT (the writer wraps it in
  its transaction and savepoint).

Sequential sides (one task awaiting each write) are measured side by side in slices of 100 rows
that alternate within one event-loop run (raw / to_thread / writer on asyncio; raw / writer on
trio), so a drift of the disk or the machine hits every side alike; a ratio is the median of the
per-round ratios. The concurrent cases (many tasks, each awaiting 20 sequential writes into its
own session key) alternate their order round by round. Every side checks its row count.

The table goes to stdout; ``--output`` also writes every sample as JSON.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import structlog

# The writer logs its connection and close at debug level; filter at info, as a deployment would.
structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.INFO))

ROOT = Path(__file__).resolve().parent.parent
# Run as a script, sys.path[0] is benchmarks/ itself: import the package from this checkout.
if sys.path and Path(sys.path[0]).resolve() == ROOT / "benchmarks":
    sys.path[0] = str(ROOT)
elif str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from nous_session.stores.sqlite._writer import SQLiteWriter  # noqa: E402

SLICE = 100  # rows per slice of a sequential side
RECORD = b"x" * 200
SCHEMA = "CREATE TABLE IF NOT EXISTS events (session TEXT NOT NULL, seq INTEGER NOT NULL,"
SCHEMA += " record BLOB NOT NULL, PRIMARY KEY (session, seq)) WITHOUT ROWID"
INSERT = "INSERT INTO events (session, seq, record) VALUES (?, ?, ?)"


def connect(path: Path, *, check_same_thread: bool = True) -> sqlite3.Connection:
    connection = sqlite3.connect(path, isolation_level=None, check_same_thread=check_same_thread)
    connection.execute("PRAGMA journal_mode=WAL")
    connection.execute("PRAGMA synchronous=FULL")
    connection.execute(SCHEMA)
    return connection


def count(path: Path) -> int:
    connection = sqlite3.connect(path)
    try:
        return int(connection.execute("SELECT count(*) FROM events").fetchone()[0])
    finally:
        connection.close()


def one_row_transaction(session: str, seq: int) -> Callable[[sqlite3.Connection], None]:
    """What a store call does today: its own transaction, its own fsync."""

    def job(connection: sqlite3.Connection) -> None:
        connection.execute("BEGIN IMMEDIATE")
        connection.execute(INSERT, (session, seq, RECORD))
        connection.execute("COMMIT")

    return job


def one_row(session: str, seq: int) -> Callable[[sqlite3.Connection], None]:
    """The same row as a writer job: the writer owns the transaction."""

    def job(connection: sqlite3.Connection) -> None:
        connection.execute(INSERT, (session, seq, RECORD))

    return job


class Sides:
    """Files and connections of one round, removed at the end."""

    def __init__(self, root: Path, label: str) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix=f"{label}-", dir=root))

    def path(self, name: str) -> Path:
        return self.directory / f"{name}.sqlite3"

    def remove(self) -> None:
        shutil.rmtree(self.directory)


# Sequential sides, sliced ---------------------------------------------------------------------


async def sequential_round(root: Path, n: int, backend: str, rotate: int) -> dict[str, float]:
    """raw / (to_thread on asyncio) / writer, each ``n`` one-row transactions, in slices."""
    sides = Sides(root, f"seq-{backend}")
    raw = connect(sides.path("raw"))
    threaded = connect(sides.path("to_thread"), check_same_thread=False)
    limiter = anyio.CapacityLimiter(1)
    writer = SQLiteWriter(lambda: connect(sides.path("writer")))
    await writer.read(lambda connection: None)  # start the thread and open the file untimed
    done = {"raw": 0, "to_thread": 0, "writer": 0}
    elapsed = {"raw": 0.0, "to_thread": 0.0, "writer": 0.0}

    async def run_raw(start: int) -> None:
        for seq in range(start, start + SLICE):
            raw.execute("BEGIN IMMEDIATE")
            raw.execute(INSERT, ("raw", seq, RECORD))
            raw.execute("COMMIT")

    async def run_to_thread(start: int) -> None:
        for seq in range(start, start + SLICE):
            await anyio.to_thread.run_sync(
                one_row_transaction("to_thread", seq), threaded, limiter=limiter
            )

    async def run_writer(start: int) -> None:
        for seq in range(start, start + SLICE):
            await writer.write(one_row("writer", seq))

    runs: dict[str, Callable[[int], Awaitable[None]]] = {"raw": run_raw, "writer": run_writer}
    if backend == "asyncio":
        runs["to_thread"] = run_to_thread
    order = list(runs)
    try:
        for index in range(n // SLICE):
            shift = (index + rotate) % len(order)
            for name in order[shift:] + order[:shift]:
                started = time.perf_counter()
                await runs[name](done[name])
                elapsed[name] += time.perf_counter() - started
                done[name] += SLICE
        stats = writer.statistics()
    finally:
        await writer.aclose()
        raw.close()
        threaded.close()
    for name in runs:
        stored = count(sides.path(name))
        if stored != n:
            raise AssertionError(f"{backend} {name}: {stored} rows stored, expected {n}")
    if stats.transactions != n:
        raise AssertionError(f"sequential writer: {stats.transactions} transactions for {n} rows")
    sides.remove()
    return {name: n / elapsed[name] for name in runs}


# Concurrent sessions ---------------------------------------------------------------------------


async def concurrent_writer(path: Path, sessions: int, writes: int) -> dict[str, float]:
    async with SQLiteWriter(lambda: connect(path)) as writer:
        await writer.read(lambda connection: None)

        async def session(key: str) -> None:
            for seq in range(writes):
                await writer.write(one_row(key, seq))

        started = time.perf_counter()
        async with anyio.create_task_group() as group:
            for index in range(sessions):
                group.start_soon(session, f"s{index}")
        elapsed = time.perf_counter() - started
        stats = writer.statistics()
    return {
        "rows_per_s": sessions * writes / elapsed,
        "transactions": stats.transactions,
        "mean_group": stats.writes / stats.transactions,
        "max_group": stats.max_group,
    }


async def concurrent_to_thread(path: Path, sessions: int, writes: int) -> dict[str, float]:
    connection = connect(path, check_same_thread=False)
    limiter = anyio.CapacityLimiter(1)

    async def session(key: str) -> None:
        for seq in range(writes):
            await anyio.to_thread.run_sync(
                one_row_transaction(key, seq), connection, limiter=limiter
            )

    try:
        started = time.perf_counter()
        async with anyio.create_task_group() as group:
            for index in range(sessions):
                group.start_soon(session, f"s{index}")
        elapsed = time.perf_counter() - started
    finally:
        connection.close()
    return {"rows_per_s": sessions * writes / elapsed}


def concurrent_round(
    root: Path, sessions: int, writes: int, *, baseline: bool, rotate: int
) -> dict[str, dict[str, float]]:
    sides = Sides(root, f"conc-{sessions}")
    cases: dict[str, Callable[[Path, int, int], Awaitable[dict[str, float]]]] = {
        "writer": concurrent_writer
    }
    if baseline:
        cases["to_thread"] = concurrent_to_thread
    order = list(cases)
    if rotate % 2:
        order.reverse()
    results: dict[str, dict[str, float]] = {}
    for name in order:
        path = sides.path(name)
        results[name] = anyio.run(cases[name], path, sessions, writes, backend="asyncio")
        stored = count(path)
        if stored != sessions * writes:
            raise AssertionError(f"{sessions} sessions, {name}: {stored} rows stored")
    sides.remove()
    return results


# Reporting ------------------------------------------------------------------------------------


def summary(samples: list[float]) -> dict[str, Any]:
    return {
        "median": statistics.median(samples),
        "min": min(samples),
        "max": max(samples),
        "samples": samples,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--n", type=int, default=2000, help="rows per sequential side per round")
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--writes", type=int, default=20, help="sequential writes per session")
    parser.add_argument(
        "--large",
        default="1000,10000",
        help="more session counts for the writer (comma-separated; empty for none)",
    )
    parser.add_argument(
        "--large-baseline",
        action="store_true",
        help="also run to_thread at the large session counts (minutes per round)",
    )
    parser.add_argument("--output", type=Path, help="write every sample as JSON here")
    parser.add_argument("--dir", type=Path, help="where the temporary files go (default: /tmp)")
    args = parser.parse_args()
    if args.n % SLICE:
        parser.error(f"--n must be a multiple of {SLICE}")
    large = [int(item) for item in args.large.split(",") if item.strip()]

    root = Path(tempfile.mkdtemp(prefix="writer-bench-", dir=args.dir))
    sequential: dict[str, list[float]] = {
        key: [] for key in ("raw", "to_thread", "writer_asyncio", "raw_trio", "writer_trio")
    }
    ratios: dict[str, list[float]] = {"writer_asyncio": [], "writer_trio": [], "to_thread": []}
    concurrent: dict[int, dict[str, list[dict[str, float]]]] = {}
    load_before = os.getloadavg()
    started = time.perf_counter()
    try:
        for round_ in range(args.rounds):
            print(f"round {round_ + 1}/{args.rounds}", file=sys.stderr, flush=True)
            backends = ["asyncio", "trio"] if round_ % 2 == 0 else ["trio", "asyncio"]
            for backend in backends:
                result = anyio.run(sequential_round, root, args.n, backend, round_, backend=backend)
                if backend == "asyncio":
                    sequential["raw"].append(result["raw"])
                    sequential["to_thread"].append(result["to_thread"])
                    sequential["writer_asyncio"].append(result["writer"])
                    ratios["writer_asyncio"].append(result["writer"] / result["raw"])
                    ratios["to_thread"].append(result["to_thread"] / result["raw"])
                else:
                    sequential["raw_trio"].append(result["raw"])
                    sequential["writer_trio"].append(result["writer"])
                    ratios["writer_trio"].append(result["writer"] / result["raw"])
            for sessions in [args.sessions, *large]:
                baseline = sessions == args.sessions or args.large_baseline
                outcome = concurrent_round(
                    root, sessions, args.writes, baseline=baseline, rotate=round_
                )
                per = concurrent.setdefault(sessions, {})
                for name, values in outcome.items():
                    per.setdefault(name, []).append(values)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    wall = time.perf_counter() - started

    report: dict[str, Any] = {
        "machine": {
            "python": sys.version.split()[0],
            "sqlite": sqlite3.sqlite_version,
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "loadavg_before": load_before,
            "loadavg_after": os.getloadavg(),
        },
        "config": {
            "rounds": args.rounds,
            "n": args.n,
            "slice": SLICE,
            "sessions": args.sessions,
            "writes_per_session": args.writes,
            "large": large,
            "journal_mode": "WAL",
            "synchronous": "FULL",
            "record_bytes": len(RECORD),
        },
        "wall_s": wall,
        "sequential_rows_per_s": {key: summary(values) for key, values in sequential.items()},
        "sequential_ratio_to_raw": {key: summary(values) for key, values in ratios.items()},
        "concurrent": {
            str(sessions): {
                name: {key: summary([sample[key] for sample in samples]) for key in samples[0]}
                for name, samples in per.items()
            }
            for sessions, per in concurrent.items()
        },
    }

    def median(values: list[float]) -> float:
        return statistics.median(values)

    lines = [
        f"SQLiteWriter benchmark: WAL + synchronous=FULL, {args.rounds} rounds, medians"
        f" (min-max); sqlite {sqlite3.sqlite_version}, Python {sys.version.split()[0]},"
        f" load {load_before[0]:.2f} -> {os.getloadavg()[0]:.2f}",
        "",
        "| case | rows/s | min-max | vs raw (median of per-round ratios) | notes |",
        "|---|---:|---:|---:|---|",
    ]

    def row(case: str, samples: list[float], versus: str = "", notes: str = "") -> None:
        lines.append(
            f"| {case} | {median(samples):,.0f} | {min(samples):,.0f}-{max(samples):,.0f}"
            f" | {versus} | {notes} |"
        )

    row("1. raw sqlite3 loop, 1 row/txn", sequential["raw"], "1.00", f"N={args.n}, in asyncio run")
    row("1'. raw sqlite3 loop (trio run)", sequential["raw_trio"], "1.00", "raw beside trio")
    row(
        "2. to_thread + CapacityLimiter(1), sequential",
        sequential["to_thread"],
        f"{median(ratios['to_thread']):.2f}x",
        "asyncio",
    )
    row(
        "3. SQLiteWriter.write, sequential (asyncio)",
        sequential["writer_asyncio"],
        f"{median(ratios['writer_asyncio']):.2f}x",
        "target >= 0.80x",
    )
    row(
        "3. SQLiteWriter.write, sequential (trio)",
        sequential["writer_trio"],
        f"{median(ratios['writer_trio']):.2f}x",
        "vs raw beside it; target >= 0.80x",
    )
    for sessions, per in concurrent.items():
        for name in ("writer", "to_thread"):
            if name not in per:
                continue
            samples = per[name]
            rates = [sample["rows_per_s"] for sample in samples]
            notes = f"{sessions} tasks x {args.writes} writes, asyncio"
            if name == "writer":
                groups = median([sample["mean_group"] for sample in samples])
                biggest = max(sample["max_group"] for sample in samples)
                notes += f"; mean group {groups:.0f}, max {biggest:.0f}"
                if "to_thread" in per:
                    speedup = median(
                        [
                            mine["rows_per_s"] / theirs["rows_per_s"]
                            for mine, theirs in zip(samples, per["to_thread"], strict=True)
                        ]
                    )
                    notes += f"; {speedup:.1f}x to_thread (median of per-round ratios)"
                if sessions == args.sessions:
                    notes += "; target >= 20,000"
            label = "SQLiteWriter" if name == "writer" else "to_thread (today)"
            row(f"4. {sessions} sessions, {label}", rates, notes=notes)
    lines.append("")
    lines.append(f"wall time {wall:.0f} s")
    table = "\n".join(lines)
    print(table)
    report["markdown"] = table
    if args.output is not None:
        args.output.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
