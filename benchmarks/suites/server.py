"""What a bot server pays beside its appends: open/evict churn, opening one session, memory
and the collector's work per open session, and what following the store costs a process that
is its file's only writer.

* ``churn``: ``sessions`` sessions x 5 appends through a registry with ``max_open`` well
  below them (every open past it closes the least recently used actor), on one SQLite file,
  against the floor: the same appends in raw sqlite3, each reading its session's rows again
  and inserting one (the reload-then-append a stateless server does), with the store's
  durability (WAL, ``synchronous=FULL``). Rounds interleaved; the share of the run that full
  (generation 2) collections took; the same churn with ``follow=False`` beside the default;
  and both sides again at ``synchronous=NORMAL`` (no sync per commit), where the library's
  own cost shows instead of the disk's.
* ``open``: a sequential open and close of a 50-event SQLite session, and of an empty one.
* ``memory``: the bytes and the collector-tracked objects an open session holds (50 events,
  and empty), against the floor of the same events as plain lists in a dict.
* ``writers``: 500 sessions on one SQLite file writing at once, each awaiting its own 20
  appends: each append's latency (p50, p99) and the acknowledged rate.
"""

from __future__ import annotations

import gc
import sqlite3
import statistics
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

import anyio
import orjson

from benchmarks.harness import Context, Measurement, Target, expect, measure, percentile, ratio
from nous_session import Message, SessionActor, Sessions
from nous_session.stores.sqlite import SQLiteStore

ISSUE = "what a bot server pays"


class _Collections:
    """Times full (generation 2) collections while it is installed."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.count = 0
        self._start = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._start
            self.count += 1

    def __enter__(self) -> _Collections:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc_info: object) -> None:
        gc.callbacks.remove(self)


async def _churn(
    path: Path, sessions: int, max_open: int, follow: bool | None, synchronous: str = "FULL"
) -> float:
    async with (
        SQLiteStore(path, synchronous=synchronous) as store,
        Sessions(store, max_open=max_open, follow=follow) as registry,
    ):
        start = time.perf_counter()
        for index in range(sessions):
            actor = await registry.get(f"s{index}")
            for turn in range(5):
                await actor.add_message(Message.user(f"message {turn} of session {index}"))
        return time.perf_counter() - start


def _floor(path: Path, sessions: int, synchronous: str = "FULL") -> float:
    """Reload-then-append in raw sqlite3: each append reads its session's rows, then inserts
    one row in its own transaction (durable at ``synchronous``)."""
    connection = sqlite3.connect(path, isolation_level=None)
    connection.execute("PRAGMA journal_mode=WAL")
    connection.execute(f"PRAGMA synchronous={synchronous}")
    connection.execute(
        "CREATE TABLE IF NOT EXISTS events (session TEXT, seq INTEGER, record BLOB,"
        " PRIMARY KEY (session, seq)) WITHOUT ROWID"
    )
    try:
        start = time.perf_counter()
        for index in range(sessions):
            name = f"s{index}"
            for turn in range(5):
                rows = connection.execute(
                    "SELECT seq, record FROM events WHERE session = ? ORDER BY seq", (name,)
                ).fetchall()
                history = [orjson.loads(record) for _, record in rows]
                record = orjson.dumps(
                    {"role": "user", "content": f"message {turn} of session {index}"}
                )
                connection.execute("BEGIN IMMEDIATE")
                connection.execute(
                    "INSERT INTO events VALUES (?, ?, ?)", (name, len(history), record)
                )
                connection.execute("COMMIT")
        return time.perf_counter() - start
    finally:
        connection.close()


def churn(ctx: Context) -> list[Measurement]:
    sessions = ctx.size(3_000, 300)
    max_open = ctx.size(1_000, 100)
    appends = sessions * 5
    ours: list[float] = []
    unfollowed: list[float] = []
    floor: list[float] = []
    ours_normal: list[float] = []
    floor_normal: list[float] = []
    shares: list[float] = []
    for round_index in range(ctx.rounds):
        with tempfile.TemporaryDirectory() as folder:
            order = ["ours", "unfollowed", "floor", "ours NORMAL", "floor NORMAL"]
            if round_index % 2:
                order.reverse()
            for side in order:
                path = Path(folder) / f"{side}.sqlite3"
                gc.collect()
                if side == "floor NORMAL":
                    floor_normal.append(appends / _floor(path, sessions, "NORMAL"))
                elif side == "ours NORMAL":
                    took = anyio.run(_churn, path, sessions, max_open, None, "NORMAL")
                    ours_normal.append(appends / took)
                elif side == "floor":
                    floor.append(appends / _floor(path, sessions))
                elif side == "unfollowed":
                    took = anyio.run(_churn, path, sessions, max_open, False)
                    unfollowed.append(appends / took)
                else:
                    with _Collections() as collections:
                        took = anyio.run(_churn, path, sessions, max_open, None)
                    ours.append(appends / took)
                    shares.append(collections.seconds / took)
    note = f"{sessions:,} sessions x 5 appends, max_open={max_open:,}, one SQLite file"
    return [
        measure("churn, ours", "appends/s", ours, note=note),
        measure("churn, reload-then-append floor", "appends/s", floor, note=note),
        ratio(
            "churn, ours vs floor",
            ours,
            floor,
            target=Target(">=", 0.1, ISSUE),
            informational=True,
            note="this floor commits every append durably (synchronous=FULL), as the store"
            " does; a floor without a sync per append is many times faster",
        ),
        ratio(
            "churn at synchronous=NORMAL, ours vs floor",
            ours_normal,
            floor_normal,
            target=Target(">=", 0.1, ISSUE),
            note="both sides with no sync per commit (WAL, synchronous=NORMAL): what the library"
            f" costs beside the disk; ours {statistics.median(ours_normal):,.0f}/s, the floor"
            f" {statistics.median(floor_normal):,.0f}/s",
        ),
        measure(
            "churn, full collections' share of the run",
            "%",
            [share * 100 for share in shares],
            target=Target("<=", 5.0, ISSUE),
        ),
        ratio(
            "churn, default (follows) vs follow=False",
            ours,
            unfollowed,
            target=Target(">=", 0.95, ISSUE),
        ),
    ]


async def _opens(store: SQLiteStore, session_id: str, count: int) -> list[float]:
    took = []
    for _ in range(count):
        start = time.perf_counter()
        async with SessionActor.open(session_id=session_id, store=store, follow=False):
            pass
        took.append(time.perf_counter() - start)
    return took


async def _open_rounds(path: Path, rounds: int, count: int) -> tuple[list[float], list[float]]:
    async with SQLiteStore(path) as store:
        async with SessionActor.open(session_id="full", store=store) as session:
            for index in range(50):
                await session.add_message(Message.user(f"message {index}"))
        full: list[float] = []
        empty: list[float] = []
        for round_index in range(rounds):
            pair = [("full", full), ("empty", empty)]
            if round_index % 2:
                pair.reverse()
            for name, samples in pair:
                samples.append(statistics.median(await _opens(store, name, count)) * 1000)
        return full, empty


def open_(ctx: Context) -> list[Measurement]:
    with tempfile.TemporaryDirectory() as folder:
        full, empty = anyio.run(
            _open_rounds, Path(folder) / "open.sqlite3", ctx.rounds, ctx.size(200, 20)
        )
    return [
        measure(
            "open and close a 50-event SQLite session",
            "ms",
            full,
            target=Target("<=", 0.3, ISSUE),
        ),
        measure("open and close an empty SQLite session", "ms", empty),
    ]


open_.__name__ = "open"


async def _held(count: int, events: int) -> tuple[float, float]:
    """Bytes and tracked objects per open session of ``events`` events (memory store)."""
    async with Sessions("memory:", max_open=2 * count + 1) as registry:
        for index in range(count):
            actor = await registry.get(f"warm-{index}")
            for turn in range(events):
                await actor.add_message(Message.user(f"message {turn} of session {index}"))
        gc.collect()
        tracked = len(gc.get_objects())
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        for index in range(count):
            actor = await registry.get(f"s{index}")
            for turn in range(events):
                await actor.add_message(Message.user(f"message {turn} of session {index}"))
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        objects = len(gc.get_objects()) - tracked
        expect(registry.statistics().open == 2 * count, "every session should be open")
        return (after - before) / count, objects / count


def _plain(count: int, events: int) -> float:
    """The floor: each session's events as a list of plain dicts, in a dict by session."""
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    held: dict[str, list[dict[str, Any]]] = {}
    for index in range(count):
        held[f"s{index}"] = [
            {"role": "user", "content": f"message {turn} of session {index}"}
            for turn in range(events)
        ]
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    expect(len(held) == count, "the floor holds every session")
    return (after - before) / count


def memory(ctx: Context) -> list[Measurement]:
    count = ctx.size(500, 50)
    full_bytes: list[float] = []
    full_objects: list[float] = []
    empty_bytes: list[float] = []
    empty_objects: list[float] = []
    floor: list[float] = []
    for _ in range(ctx.rounds):
        size, objects = anyio.run(_held, count, 50)
        full_bytes.append(size)
        full_objects.append(objects)
        size, objects = anyio.run(_held, count, 0)
        empty_bytes.append(size)
        empty_objects.append(objects)
        floor.append(_plain(count, 50))
    return [
        measure("an open 50-event session", "bytes", full_bytes),
        measure("plain lists of 50 events (the floor)", "bytes", floor),
        ratio(
            "an open 50-event session vs the floor",
            full_bytes,
            floor,
            target=Target("<=", 1.3, ISSUE),
        ),
        measure("an open empty session", "bytes", empty_bytes, target=Target("<=", 8192, ISSUE)),
        measure("tracked objects per open 50-event session", "objects", full_objects),
        measure(
            "tracked objects per event",
            "objects",
            [(full - empty) / 50 for full, empty in zip(full_objects, empty_objects, strict=True)],
        ),
        measure("tracked objects per open empty session", "objects", empty_objects),
    ]


async def _writers(path: Path, writers: int, each: int) -> list[float]:
    """``writers`` sessions on one SQLite file, each a task awaiting its own ``each`` appends
    in order, all at once; every append's latency (seconds), sorted."""
    latencies: list[float] = []

    async def write(registry: Sessions, index: int) -> None:
        actor = await registry.get(f"w{index}")
        for turn in range(each):
            began = time.perf_counter()
            await actor.add_message(Message.user(f"message {turn} of writer {index}"))
            latencies.append(time.perf_counter() - began)

    async with Sessions(f"sqlite:///{path}", max_open=writers) as registry:
        for index in range(writers):
            await registry.get(f"w{index}")  # open before the clock, as a server's are
        async with anyio.create_task_group() as group:
            for index in range(writers):
                group.start_soon(write, registry, index)
    expect(len(latencies) == writers * each, "every append should be acknowledged")
    return sorted(latencies)


def writers(ctx: Context) -> list[Measurement]:
    count, each = ctx.size(500, 100), 20
    p50: list[float] = []
    p99: list[float] = []
    rates: list[float] = []
    for _ in range(ctx.rounds):
        with tempfile.TemporaryDirectory() as folder:
            began = time.perf_counter()
            latencies = anyio.run(_writers, Path(folder) / "writers.sqlite3", count, each)
            rates.append(len(latencies) / (time.perf_counter() - began))
        p50.append(percentile(latencies, 0.5) * 1e3)
        p99.append(percentile(latencies, 0.99) * 1e3)
    note = f"{count} sessions on one SQLite file (FULL), each awaiting its own {each} appends"
    return [
        measure("writers at once, append latency p50", "ms", p50, note=note),
        measure("writers at once, append latency p99", "ms", p99, note=note),
        measure("writers at once, acknowledged appends", "appends/s", rates, note=note),
    ]


BENCHMARKS = [churn, open_, memory, writers]
