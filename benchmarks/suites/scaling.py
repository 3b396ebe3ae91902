"""Suite "scaling": ours only, how the costs move with size (issue 6, workload 6).

* ``fanout``: one session followed by 1, 100 and 1,000 subscribers; 10 producers flat out.
* ``compaction``: a background compaction of a 10,000- and a 100,000-message session.
* ``restore``: opening a 100,000-event session from a SQLite file (load, rebuild, first read).
* ``snapshot``: dropping the ~100,000 events a compaction shadowed, in memory and in SQLite.
* ``curves``: the cost of an append, of the agent loop's "append + derive_messages()", and of a
  cold fold (what a restore pays), against the log's length from 1,000 to 1,000,000 events on
  the pure :class:`Log`; and the actor's agent-loop iteration from 1,000 to 100,000 (1M through
  the actor would mostly time building the fixture). ``benchmarks/plots.py`` draws them.

Runs on asyncio with structlog filtering at info; rounds are capped at :data:`MAX_ROUNDS`.
"""

from __future__ import annotations

import gc
import shutil
import statistics
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio

from benchmarks.harness import Context, Measurement, expect, measure
from benchmarks.suites.actor import _fanout_round
from benchmarks.workloads import chat_data, chat_event_type, chat_messages
from nous_session import CompactionPolicy, Event, Log, MemoryStore, Message, SessionActor
from nous_session.stores.sqlite import SQLiteStore

MAX_ROUNDS = 3
US = 1e6
MS = 1e3


def _rounds(ctx: Context) -> int:
    return max(1, min(ctx.rounds, 2 if ctx.quick else MAX_ROUNDS))


_EVENTS: dict[int, list[Event]] = {}


def _events(count: int) -> list[Event]:
    """The events of a seeded ``count``-message chat (cached: building 100k takes a while)."""
    if count not in _EVENTS:
        _EVENTS[count] = list(Log.seed(chat_messages(count)).events())
    return _EVENTS[count]


# Fan-out -------------------------------------------------------------------------------------


def fanout(ctx: Context) -> list[Measurement]:
    """Append rate and delivery latency with 1, 100 and 1,000 subscribers."""
    total = ctx.size(2_000, 500)
    counts = (1, 100, 1_000)
    rows: dict[int, list[dict[str, Any]]] = {n: [] for n in counts}

    async def run() -> None:
        for round_index in range(_rounds(ctx)):
            for n in counts if round_index % 2 == 0 else counts[::-1]:
                gc.collect()
                rows[n].append(await _fanout_round(n, total, rate=None))

    anyio.run(run, backend="asyncio")
    out = []
    for n in counts:
        note = (
            f"{total:,} appends from 10 producers going flat out, MemoryStore; every subscriber "
            "saw every event once, in order (checked); latency = store commit returned -> "
            "received, over every event x subscriber"
        )
        out.append(
            measure(
                f"scaling.fanout.{n}_subscribers.rate",
                "appends/s",
                [r["rate"] for r in rows[n]],
                note=note,
            )
        )
        out.append(
            measure(
                f"scaling.fanout.{n}_subscribers.latency_p50", "ms", [r["p50"] for r in rows[n]]
            )
        )
        out.append(
            measure(
                f"scaling.fanout.{n}_subscribers.latency_p99", "ms", [r["p99"] for r in rows[n]]
            )
        )
        out.append(
            measure(
                f"scaling.fanout.{n}_subscribers.deliveries",
                "events/s",
                [r["rate"] * n for r in rows[n]],
                note="appends/s x subscribers: events handed to subscribers per second",
            )
        )
    return out


# Compaction ----------------------------------------------------------------------------------


def compaction(ctx: Context) -> list[Measurement]:
    """A background compaction of a 10k- and a 100k-message session (structural summary)."""
    sizes = (10_000, ctx.size(100_000, 20_000))
    keep_last = 100
    rows: dict[int, dict[str, list[float]]] = {n: {"first": [], "total": []} for n in sizes}

    async def one(n: int) -> None:
        store = MemoryStore()
        await store.commit("compaction", expected_count=0, events=_events(n))
        policy = CompactionPolicy(every=n, keep_last=keep_last)
        async with SessionActor.open(
            session_id="compaction", store=store, compaction=policy
        ) as session:
            gc.collect()
            began = time.perf_counter()
            await session.add_message(Message.user(chat_data(1)["content"]))
            first = time.perf_counter() - began
            await session.wait_for_compaction()
            total = time.perf_counter() - began
            stats = session.statistics()
            messages = session.messages()
            expect(stats.compactions_run == 1, f"compaction of {n}: {stats}")
            expect(
                messages[1].text.startswith("[Compacted ") and len(messages) <= keep_last + 3,
                f"compaction of {n}: the summary did not land",
            )
        rows[n]["first"].append(first * MS)
        rows[n]["total"].append(total * MS)

    async def run() -> None:
        for round_index in range(_rounds(ctx)):
            for n in sizes if round_index % 2 == 0 else sizes[::-1]:
                await one(n)

    anyio.run(run, backend="asyncio")
    out = []
    for n in sizes:
        out.append(
            measure(
                f"scaling.compaction.{n // 1000}k.duration",
                "ms",
                rows[n]["total"],
                note=f"a {n:,}-message session opened with CompactionPolicy(every={n}, "
                f"keep_last={keep_last}): the triggering append to the summary applied "
                "(wait_for_compaction); MemoryStore",
            )
        )
        out.append(
            measure(
                f"scaling.compaction.{n // 1000}k.first_append",
                "ms",
                rows[n]["first"],
                note="the triggering append's own latency (its commit folds the loaded "
                "session once)",
            )
        )
    return out


# Restore and snapshot -------------------------------------------------------------------------


async def _sqlite_fixture(path: Path, n: int) -> None:
    async with SQLiteStore(path) as store:
        await store.commit("big", expected_count=0, events=_events(n))


def restore(ctx: Context) -> list[Measurement]:
    """Open a 100k-event session from a SQLite file: load + rebuild, then the first read."""
    n = ctx.size(100_000, 20_000)
    rows: dict[str, list[float]] = {"open": [], "first_read": []}
    directory = Path(tempfile.mkdtemp(prefix="nous-scaling-"))
    path = directory / "restore.db"

    async def run() -> None:
        await _sqlite_fixture(path, n)
        for _ in range(_rounds(ctx)):
            gc.collect()
            began = time.perf_counter()
            async with (
                SQLiteStore(path) as store,
                SessionActor.open(session_id="big", store=store) as session,
            ):
                opened = time.perf_counter()
                messages = session.messages()
                read = time.perf_counter()
                expect(len(messages) == n and session.log.count == n, "restore: wrong session")
                expect(messages[-1].text == chat_messages(n)[-1].text, "restore: wrong last")
            rows["open"].append((opened - began) * MS)
            rows["first_read"].append((read - opened) * MS)

    try:
        anyio.run(run, backend="asyncio")
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return [
        measure(
            f"scaling.restore.{n // 1000}k.open",
            "ms",
            rows["open"],
            note=f"SessionActor.open on a {n:,}-event session in a SQLite file: read and "
            "decode every record, rebuild the Log",
        ),
        measure(
            f"scaling.restore.{n // 1000}k.first_read",
            "ms",
            rows["first_read"],
            note="the first session.messages() after opening: the fold and projection of every "
            "message (later reads are memoised)",
        ),
        measure(
            f"scaling.restore.{n // 1000}k.total",
            "ms",
            [a + b for a, b in zip(rows["open"], rows["first_read"], strict=True)],
        ),
    ]


_STORES = {"memory": "MemoryStore", "sqlite": "SQLiteStore"}


def snapshot(ctx: Context) -> list[Measurement]:
    """Drop the events a compaction shadowed: ~100k, in memory and in a SQLite file."""
    n = ctx.size(100_000, 20_000)
    keep = 100
    rows: dict[str, list[float]] = {"memory": [], "sqlite": []}
    directory = Path(tempfile.mkdtemp(prefix="nous-scaling-"))
    fixture = directory / "fixture.db"

    async def one(kind: str, round_index: int) -> None:
        if kind == "sqlite":
            path = directory / f"snapshot-{round_index}.db"
            shutil.copyfile(fixture, path)
            store: Any = SQLiteStore(path)
        else:
            store = MemoryStore()
            await store.commit("big", expected_count=0, events=_events(n))
        async with store, SessionActor.open(session_id="big", store=store) as session:
            await session.replace(1, n - keep - 1, Message.system("[summary]"))
            before = len(session.log.events())
            gc.collect()
            began = time.perf_counter()
            log = await session.snapshot()
            elapsed = time.perf_counter() - began
            dropped = before - len(log.events())
            expect(dropped == n - keep - 1, f"snapshot dropped {dropped}")
            expect(len(session.messages()) == keep + 2, "snapshot changed the surface")
        if kind == "sqlite":
            async with SQLiteStore(path) as check:
                held = await check.load("big")
            expect(len(held) == keep + 2, f"the store holds {len(held)} events after snapshot")
        rows[kind].append(elapsed * MS)

    async def run() -> None:
        await _sqlite_fixture(fixture, n)
        for round_index in range(_rounds(ctx)):
            for kind in ("memory", "sqlite") if round_index % 2 == 0 else ("sqlite", "memory"):
                await one(kind, round_index)

    try:
        anyio.run(run, backend="asyncio")
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return [
        measure(
            f"scaling.snapshot.{n // 1000}k_{kind}",
            "ms",
            rows[kind],
            note=f"session.snapshot() after a replace shadowed {n - keep - 1:,} of {n:,} "
            f"events: drops them from the Log and the store ({_STORES[kind]}) in one commit",
        )
        for kind in ("memory", "sqlite")
    ]


# Cost curves ---------------------------------------------------------------------------------


def _checkpoints(top: int) -> list[int]:
    points = [1_000, 3_000, 10_000, 30_000, 100_000, 300_000, 1_000_000]
    return [p for p in points if p <= top]


def _log_curves(top: int) -> dict[int, dict[str, float]]:
    """One growth of the pure Log to ``top``; at each checkpoint, three costs."""
    payloads = [(chat_event_type(i), chat_data(i)) for i in range(1_000)]
    when = datetime.now(UTC)
    log = Log()
    out: dict[int, dict[str, float]] = {}
    appends, loop = 2_000, 500
    for point in _checkpoints(top):
        while log.count < point:
            event_type, data = payloads[log.count % 1_000]
            log = log.append(event_type, data, time=when)
        gc.collect()
        began = time.perf_counter()
        for i in range(appends):
            event_type, data = payloads[i % 1_000]
            log = log.append(event_type, data, time=when)
        append_cost = (time.perf_counter() - began) / appends
        # A value whose fold was never computed: its first read folds every event (a restore).
        cold = log.upto(log.count - 1)
        began = time.perf_counter()
        messages = cold.derive_messages()
        fold_cost = time.perf_counter() - began
        expect(len(messages) == log.count, "curves: the fold lost messages")
        fork = cold
        began = time.perf_counter()
        for i in range(loop):
            event_type, data = payloads[i % 1_000]
            fork = fork.append(event_type, data, time=when)
            messages = fork.derive_messages()
        loop_cost = (time.perf_counter() - began) / loop
        expect(len(messages) == fork.count, "curves: the agent loop lost messages")
        out[point] = {"append": append_cost, "fold": fold_cost, "loop": loop_cost}
        del cold, fork, messages
    return out


async def _actor_curve(top: int) -> dict[int, dict[str, float]]:
    out: dict[int, dict[str, float]] = {}
    loop = 500
    extra = [Message.user(chat_data(i)["content"]) for i in range(loop)]
    for point in [p for p in _checkpoints(top) if p <= 100_000]:
        store = MemoryStore()
        await store.commit("curve", expected_count=0, events=_events(point))
        async with SessionActor.open(session_id="curve", store=store) as session:
            began = time.perf_counter()
            messages: Sequence[Message] = session.messages()
            fold = time.perf_counter() - began
            gc.collect()
            began = time.perf_counter()
            for message in extra:
                await session.add_message(message)
                messages = session.messages()
            per_iteration = (time.perf_counter() - began) / loop
            expect(len(messages) == point + loop, "actor curve: lost messages")
        out[point] = {"loop": per_iteration, "fold": fold}
    return out


def curves(ctx: Context) -> list[Measurement]:
    """Append, agent-loop and cold-fold costs against log length, 1k to 1M (plotted)."""
    top = ctx.size(1_000_000, 100_000)
    log_rows: list[dict[int, dict[str, float]]] = []
    actor_rows: list[dict[int, dict[str, float]]] = []
    for _ in range(_rounds(ctx)):
        log_rows.append(_log_curves(top))
        actor_rows.append(anyio.run(_actor_curve, top, backend="asyncio"))
        gc.collect()
    out = []
    for point in _checkpoints(top):
        label = f"{point // 1000}k" if point < 1_000_000 else "1M"
        for key, unit, scale, what in (
            ("append", "us/op", US, "log.append of a chat event"),
            ("loop", "us/iter", US, "log.append + log.derive_messages() (the agent loop)"),
            ("fold", "ms", MS, "the first derive_messages() of a never-folded value"),
        ):
            out.append(
                measure(
                    f"scaling.curves.log_{key}.{label}",
                    unit,
                    [row[point][key] * scale for row in log_rows],
                    note=f"pure Log at {point:,} events: {what}",
                    events=point,
                    curve=f"log_{key}",
                )
            )
        if point in actor_rows[0]:
            out.append(
                measure(
                    f"scaling.curves.actor_loop.{label}",
                    "us/iter",
                    [row[point]["loop"] * US for row in actor_rows],
                    note=f"SessionActor over a MemoryStore holding {point:,} events: await "
                    "session.add_message(m) + session.messages(), 500 iterations",
                    events=point,
                    curve="actor_loop",
                )
            )
    spread = statistics.median([row[top]["loop"] for row in log_rows]) / statistics.median(
        [row[1_000]["loop"] for row in log_rows]
    )
    out.append(
        measure(
            "scaling.curves.log_loop_growth",
            "x",
            [row[top]["loop"] / row[1_000]["loop"] for row in log_rows],
            note=f"agent-loop iteration at {top:,} / at 1,000 events (ratio of medians "
            f"{spread:.2f})",
        )
    )
    return out


BENCHMARKS = [fanout, compaction, restore, snapshot, curves]
