"""Suite "actor": the SessionActor in memory, against issue 3's performance targets.

* ``round_trip``: one producer awaiting each append vs a bare anyio round trip.
* ``producers``: 50 concurrent producers: appends/s and the mean batch per commit.
* ``fanout``: 1,000 subscribers following one session at 1,000 offered appends/s.
* ``fanout_unpaced``: the same subscribers with producers going flat out (information).
* ``compaction``: p99 append latency while a compaction runs vs without one (one producer;
  ``compaction_4_producers`` for information).
* ``round_trip_trio``, ``producers_trio``: the first two on trio (information).

Everything runs on asyncio unless the name says trio, with structlog filtering at info (the
actor logs every commit at debug level).
"""

from __future__ import annotations

import gc
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import anyio

from benchmarks.harness import (
    AsyncSide,
    Context,
    Measurement,
    Target,
    ainterleave_slices,
    expect,
    measure,
    percentile,
    ratio,
)
from benchmarks.workloads import chat_data, chat_messages, content
from nous_session import CompactionPolicy, Event, EventType, Log, MemoryStore, SessionActor

ISSUE_3 = "issue 3"
QUEUE_SIZE = 1024  # the actor's default queue size; the bare baseline uses the same
USER = EventType.USER_MESSAGE
US = 1e6
MS = 1e3


# Round trip --------------------------------------------------------------------------------


async def _echo(receive: Any, served: list[int]) -> None:
    """The bare baseline's server: receive an Event, set it."""
    async with receive:
        async for done in receive:
            served[0] += 1
            done.set()


async def _round_trip(ctx: Context) -> dict[str, list[float]]:
    slices, per_slice = ctx.size(20, 10), 100
    n = slices * per_slice
    data = chat_data(5)
    served = [0]
    async with anyio.create_task_group() as task_group:
        send, receive = anyio.create_memory_object_stream[anyio.Event](QUEUE_SIZE)
        task_group.start_soon(_echo, receive, served)
        async with SessionActor.open(session_id="round-trip") as session:

            async def actor_side() -> AsyncIterator[float | None]:
                before = session.log.count
                yield None
                for _ in range(slices):
                    start = time.perf_counter()
                    for _ in range(per_slice):
                        await session.append(USER, data)
                    yield time.perf_counter() - start
                expect(session.log.count == before + n, "round trip: appends went missing")
                last = session.log.last
                expect(last is not None and last.data == data, "round trip: wrong last event")

            async def bare_side() -> AsyncIterator[float | None]:
                before = served[0]
                yield None
                for _ in range(slices):
                    start = time.perf_counter()
                    for _ in range(per_slice):
                        # The actor's own fast path: send_nowait, then wait for the answer.
                        done = anyio.Event()
                        try:
                            send.send_nowait(done)
                        except anyio.WouldBlock:
                            await send.send(done)
                        await done.wait()
                    yield time.perf_counter() - start
                expect(served[0] == before + n, "bare round trip: requests went missing")

            samples = await ainterleave_slices(
                ctx.rounds,
                {"actor": AsyncSide(actor_side, slices), "bare": AsyncSide(bare_side, slices)},
            )
        await send.aclose()
    return {key: [s / n * US for s in values] for key, values in samples.items()}


def _round_trip_measurements(samples: dict[str, list[float]], backend: str) -> list[Measurement]:
    suffix = "" if backend == "asyncio" else f"_{backend}"
    return [
        measure(f"actor.round_trip{suffix}.append", "us/op", samples["actor"]),
        measure(f"actor.round_trip{suffix}.bare_anyio", "us/op", samples["bare"]),
        ratio(
            f"actor.round_trip{suffix}.ratio",
            samples["actor"],
            samples["bare"],
            target=Target("<=", 3, ISSUE_3),
            informational=backend != "asyncio",
            note=f"{backend}: `await session.append(USER_MESSAGE, {{content: 200 B}})` / a bare "
            f"round trip (send_nowait an anyio.Event into a {QUEUE_SIZE}-slot memory stream, a "
            "task receives and sets it, the sender awaits it); sides alternate in 100-op slices",
        ),
    ]


def round_trip(ctx: Context) -> list[Measurement]:
    """One producer awaiting each append vs a bare anyio round trip, on asyncio."""
    return _round_trip_measurements(anyio.run(_round_trip, ctx, backend="asyncio"), "asyncio")


def round_trip_trio(ctx: Context) -> list[Measurement]:
    """:func:`round_trip` on trio, for information."""
    return _round_trip_measurements(anyio.run(_round_trip, ctx, backend="trio"), "trio")


# Concurrent producers ----------------------------------------------------------------------


async def _producers(ctx: Context) -> dict[str, list[float]]:
    producers, each = 50, ctx.size(200, 100)
    payloads = [{"content": content(k)} for k in range(producers)]
    rates: list[float] = []
    batches: list[float] = []
    async with SessionActor.open(session_id="producers") as session:
        for _ in range(ctx.rounds):
            acked: list[list[Event]] = [[] for _ in range(producers)]

            async def produce(k: int, acked: list[list[Event]] = acked) -> None:
                out, data = acked[k], payloads[k]
                for _ in range(each):
                    out.append(await session.append(USER, data))

            before = session.statistics()
            start = time.perf_counter()
            async with anyio.create_task_group() as task_group:
                for k in range(producers):
                    task_group.start_soon(produce, k)
            elapsed = time.perf_counter() - start
            after = session.statistics()

            total = producers * each
            expect(after.count == before.count + total, "producers: appends went missing")
            held = session.log.since(before.count)
            expect(len(held) == total, "producers: the log does not hold every append once")
            for k, events in enumerate(acked):
                seqs = [event.seq for event in events]
                expect(len(seqs) == each, f"producer {k}: {len(seqs)} acks, not {each}")
                expect(seqs == sorted(seqs), f"producer {k}: its order was not kept")
                for event in events:
                    expect(
                        held[event.seq - before.count] is event
                        and event.data["content"] == payloads[k]["content"],
                        f"producer {k}: acknowledged event {event.seq} is not the one in the log",
                    )
            committed = after.batches - before.batches
            expect(committed > 0 and after.requests - before.requests == total, "bad statistics")
            rates.append(total / elapsed)
            batches.append((after.requests - before.requests) / committed)
    return {"rate": rates, "batch": batches}


def _producer_measurements(samples: dict[str, list[float]], backend: str) -> list[Measurement]:
    suffix = "" if backend == "asyncio" else f"_{backend}"
    info = backend != "asyncio"
    return [
        measure(
            f"actor.producers{suffix}.rate",
            "appends/s",
            samples["rate"],
            target=Target(">=", 50_000, ISSUE_3),
            informational=info,
            note=f"{backend}: 50 producers each awaiting 200 appends of a 200 B chat event, "
            "in memory; every ack checked against the log, per-producer order checked",
        ),
        measure(
            f"actor.producers{suffix}.mean_batch",
            "requests/commit",
            samples["batch"],
            target=Target(">=", 10, ISSUE_3),
            informational=info,
            note="statistics().requests / statistics().batches over the round",
        ),
    ]


def producers(ctx: Context) -> list[Measurement]:
    """50 concurrent producers on asyncio: appends/s and requests per commit."""
    return _producer_measurements(anyio.run(_producers, ctx, backend="asyncio"), "asyncio")


def producers_trio(ctx: Context) -> list[Measurement]:
    """:func:`producers` on trio, for information."""
    return _producer_measurements(anyio.run(_producers, ctx, backend="trio"), "trio")


# Subscriber fan-out ------------------------------------------------------------------------


class StampingStore(MemoryStore):
    """A MemoryStore that notes when each event's commit returned: its commit time.

    The actor publishes right after the store's commit returns, so this is the moment a
    subscriber could first see the event; delivery latency is measured from it.
    """

    def __init__(self) -> None:
        super().__init__()
        self.committed_at: dict[int, float] = {}

    async def commit(
        self, session_id: str, *, events: Sequence[Event], **options: Any
    ) -> str | None:
        uid = await super().commit(session_id, events=events, **options)
        now = time.perf_counter()
        for event in events:
            self.committed_at[event.seq] = now
        return uid


async def _fanout_round(
    subscribers: int, total: int, *, producers: int = 10, rate: float | None
) -> dict[str, Any]:
    """One session, ``subscribers`` following it, ``total`` appends from ``producers`` tasks.

    With ``rate`` the producers issue on a fixed schedule (``rate`` appends/s in all, catching
    up when behind); without, they go flat out. Every subscriber must see every event once,
    in order.
    """
    store = StampingStore()
    each = total // producers
    total = each * producers
    data = chat_data(11)
    received: list[list[float]] = []
    broken: list[str] = []
    issued: dict[int, float] = {}
    acked: dict[int, float] = {}
    subscribed = [0]
    all_subscribed = anyio.Event()
    if not subscribers:
        all_subscribed.set()

    async def follow(session: SessionActor) -> None:
        times: list[float] = []
        received.append(times)
        expected = 0
        async with session.subscribe(0) as events:
            subscribed[0] += 1
            if subscribed[0] == subscribers:
                all_subscribed.set()
            async for event in events:
                now = time.perf_counter()
                if event.seq != expected:
                    broken.append(f"expected seq {expected}, got {event.seq}")
                    return
                expected += 1
                times.append(now)

    async def produce(session: SessionActor, k: int, start: float) -> None:
        interval = producers / rate if rate else 0.0
        offset = k * interval / producers
        for j in range(each):
            if rate:
                await anyio.sleep_until(start + offset + j * interval)
            began = time.perf_counter()
            event = await session.append(USER, data)
            acked[event.seq] = time.perf_counter()
            issued[event.seq] = began

    async with (
        anyio.create_task_group() as followers,
        SessionActor.open(session_id="fanout", store=store) as session,
    ):
        # Leaving this block closes the session first: the subscribers then drain what is
        # committed and end, and the task group waits for them.
        for _ in range(subscribers):
            followers.start_soon(follow, session)
        await all_subscribed.wait()
        await anyio.sleep(0.05)  # every subscriber is now waiting for the first event
        lead = 0.005 if rate else 0.0  # the schedule starts a moment after the tasks do
        start = anyio.current_time() + lead
        began = time.perf_counter() + lead
        async with anyio.create_task_group() as task_group:
            for k in range(producers):
                task_group.start_soon(produce, session, k, start)
        elapsed = max(acked.values()) - began
        stats = session.statistics()

    expect(not broken, f"fan-out: a subscriber saw events out of order: {broken[:3]}")
    expect(stats.count == total and len(acked) == total, "fan-out: appends went missing")
    expect(len(received) == subscribers, "fan-out: a subscriber did not run")
    for times in received:
        expect(len(times) == total, f"fan-out: a subscriber saw {len(times)} of {total} events")
    out: dict[str, Any] = {"rate": total / elapsed, "batch": stats.requests / stats.batches}
    if subscribers:
        committed = [store.committed_at[seq] for seq in range(total)]
        latencies = sorted(
            [t - c for times in received for t, c in zip(times, committed, strict=True)]
        )
        expect(latencies[0] >= 0, "fan-out: an event was received before its commit")
        out["p50"] = percentile(latencies, 0.50) * MS
        out["p99"] = percentile(latencies, 0.99) * MS
        out["max"] = latencies[-1] * MS
        # End to end (append called -> received), and against the producer's ack, on every
        # 10th subscriber (a systematic sample: wake order is subscription order).
        sample = received[::10]
        issue = [issued[seq] for seq in range(total)]
        ack = [acked[seq] for seq in range(total)]
        end_to_end = sorted([t - i for times in sample for t, i in zip(times, issue, strict=True)])
        out["e2e_p50"] = percentile(end_to_end, 0.50) * MS
        out["e2e_p99"] = percentile(end_to_end, 0.99) * MS
        before_ack = sum(t < a for times in sample for t, a in zip(times, ack, strict=True))
        out["before_ack"] = 100 * before_ack / (len(sample) * total)
    return out


async def _fanout(ctx: Context, *, paced: bool) -> dict[str, list[dict[str, Any]]]:
    subscribers = 1_000
    if paced:
        seconds = 1.0 if ctx.quick else 2.5
        total, rate = int(1_000 * seconds), 1_000.0
    else:
        total, rate = ctx.size(5_000, 2_000), None
    rounds: dict[str, list[dict[str, Any]]] = {"with": [], "without": []}
    for round_index in range(ctx.rounds):
        order = ["with", "without"] if round_index % 2 == 0 else ["without", "with"]
        for side in order:
            count = subscribers if side == "with" else 0
            rounds[side].append(await _fanout_round(count, total, rate=rate))
    return rounds


def _column(rows: list[dict[str, Any]], key: str) -> list[float]:
    return [row[key] for row in rows]


def fanout(ctx: Context) -> list[Measurement]:
    """1,000 subscribers following one session at 1,000 offered appends/s (10 producers)."""
    rows = anyio.run(lambda: _fanout(ctx, paced=True), backend="asyncio")
    with_, without = rows["with"], rows["without"]
    seconds = 1.0 if ctx.quick else 2.5
    return [
        measure(
            "actor.fanout.latency_p50",
            "ms",
            _column(with_, "p50"),
            note="delivery latency, commit (the store's commit returned) to receipt by a "
            "subscriber, over every event x every one of the 1,000 subscribers; each saw "
            "every event in order (checked)",
        ),
        measure("actor.fanout.latency_p99", "ms", _column(with_, "p99")),
        measure("actor.fanout.latency_max", "ms", _column(with_, "max")),
        measure(
            "actor.fanout.e2e_p50",
            "ms",
            _column(with_, "e2e_p50"),
            note="append called -> received, on every 10th subscriber",
        ),
        measure("actor.fanout.e2e_p99", "ms", _column(with_, "e2e_p99")),
        measure(
            "actor.fanout.received_before_ack",
            "%",
            _column(with_, "before_ack"),
            note="share of receipts that happen before the producer's append returns "
            "(subscribers are woken before the acks, so ack -> receipt is mostly negative)",
        ),
        measure("actor.fanout.rate_1000_subscribers", "appends/s", _column(with_, "rate")),
        measure("actor.fanout.rate_no_subscribers", "appends/s", _column(without, "rate")),
        ratio(
            "actor.fanout.rate_ratio",
            _column(with_, "rate"),
            _column(without, "rate"),
            target=Target(">=", 0.5, ISSUE_3),
            note=f"sustained rate with 1,000 subscribers / with none; 10 producers issuing on "
            f"a 1,000/s schedule for {seconds:g} s (catching up when behind), rate = appends / "
            "(last ack - start); StampingStore (MemoryStore + commit timestamps) on both sides",
        ),
        measure(
            "actor.fanout.mean_batch_1000_subscribers", "requests/commit", _column(with_, "batch")
        ),
    ]


def fanout_unpaced(ctx: Context) -> list[Measurement]:
    """1,000 subscribers vs none with 10 producers going flat out (information)."""
    rows = anyio.run(lambda: _fanout(ctx, paced=False), backend="asyncio")
    with_, without = rows["with"], rows["without"]
    return [
        measure("actor.fanout_unpaced.rate_1000_subscribers", "appends/s", _column(with_, "rate")),
        measure("actor.fanout_unpaced.rate_no_subscribers", "appends/s", _column(without, "rate")),
        ratio(
            "actor.fanout_unpaced.rate_ratio",
            _column(with_, "rate"),
            _column(without, "rate"),
            target=Target(">=", 0.5, ISSUE_3),
            informational=True,
            note="the most the actor sustains: 10 producers flat out, 1,000 subscribers vs none",
        ),
        measure("actor.fanout_unpaced.latency_p99", "ms", _column(with_, "p99")),
        measure(
            "actor.fanout_unpaced.mean_batch_1000_subscribers",
            "requests/commit",
            _column(with_, "batch"),
        ),
    ]


# Appends during a compaction ---------------------------------------------------------------


async def _compaction(ctx: Context, producers: int) -> dict[str, list[float]]:
    surface, keep_last = 20_000, 100
    quiet_each = 2_000 // producers
    policy = CompactionPolicy(every=surface, keep_last=keep_last)
    events = list(Log.seed(chat_messages(surface)).events())
    data = chat_data(13)
    out: dict[str, list[float]] = {
        key: [] for key in ("p99_with", "p99_without", "p50_with", "p50_without", "during", "first")
    }
    out["duration"] = []

    @asynccontextmanager
    async def opened(compaction: CompactionPolicy | None) -> AsyncIterator[SessionActor]:
        store = MemoryStore()
        await store.commit("compaction", expected_count=0, events=events)
        async with SessionActor.open(
            session_id="compaction", store=store, compaction=compaction
        ) as session:
            yield session

    async def produce(session: SessionActor, latencies: list[float], count: int | None) -> None:
        # Issue appends while the compaction runs (count None), or ``count`` of them.
        issued = 0
        while session.statistics().compaction_in_flight if count is None else issued < count:
            start = time.perf_counter()
            await session.append(USER, data)
            latencies.append(time.perf_counter() - start)
            issued += 1

    async def run(session: SessionActor, count: int | None) -> list[float]:
        latencies: list[float] = []
        async with anyio.create_task_group() as task_group:
            for _ in range(producers):
                task_group.start_soon(produce, session, latencies, count)
        return sorted(latencies)

    async def with_compaction() -> None:
        async with opened(policy) as session:
            began = time.perf_counter()
            await session.append(USER, data)  # the commit that triggers the compaction
            out["first"].append((time.perf_counter() - began) * MS)
            expect(session.statistics().compaction_in_flight, "compaction did not start")
            with anyio.fail_after(60):
                latencies = await run(session, None)
            out["duration"].append((time.perf_counter() - began) * MS)
            stats = session.statistics()
            expect(stats.compactions_run == 1, f"compaction not applied: {stats}")
            expect(stats.count == surface + 2 + len(latencies), "appends went missing")
            messages = session.messages()
            expect(
                len(messages) <= 2 + keep_last + len(latencies)
                and messages[1].text.startswith("[Compacted "),
                "the summary did not land",
            )
            expect(len(latencies) >= 20, f"only {len(latencies)} appends during compaction")
            out["during"].append(len(latencies))
            out["p99_with"].append(percentile(latencies, 0.99) * MS)
            out["p50_with"].append(percentile(latencies, 0.50) * MS)

    async def without_compaction() -> None:
        async with opened(None) as session:
            await session.append(USER, data)
            latencies = await run(session, quiet_each)
            total = producers * quiet_each
            expect(session.log.count == surface + 1 + total, "appends went missing")
            out["p99_without"].append(percentile(latencies, 0.99) * MS)
            out["p50_without"].append(percentile(latencies, 0.50) * MS)

    for round_index in range(ctx.rounds):
        sides = [with_compaction, without_compaction]
        for side in sides if round_index % 2 == 0 else sides[::-1]:
            gc.collect()
            await side()
    return out


def _compaction_measurements(rows: dict[str, list[float]], producers: int) -> list[Measurement]:
    name = "actor.compaction" if producers == 1 else f"actor.compaction_{producers}_producers"
    who = (
        "one producer awaiting each append"
        if producers == 1
        else (f"{producers} producers, each awaiting its appends")
    )
    return [
        measure(
            f"{name}.p99_with",
            "ms",
            rows["p99_with"],
            note=f"{who}; the appends issued while CompactionPolicy(every=20000, keep_last=100) "
            "compacts a 20,000-message surface (the structural summary)",
        ),
        measure(
            f"{name}.p99_without",
            "ms",
            rows["p99_without"],
            note=f"{2_000 // producers * producers:,} appends ({who}) to the same "
            "20,000-message session opened with compaction=None",
        ),
        ratio(
            f"{name}.p99_ratio",
            rows["p99_with"],
            rows["p99_without"],
            target=Target("<=", 2, ISSUE_3),
            informational=producers != 1,
            note="p99 append latency during a compaction / without one; sides alternate by round",
        ),
        measure(f"{name}.p50_with", "ms", rows["p50_with"]),
        measure(f"{name}.p50_without", "ms", rows["p50_without"]),
        measure(
            f"{name}.appends_during",
            "appends",
            rows["during"],
            note="how many appends the p99 with a compaction is taken over, per round",
        ),
        measure(
            f"{name}.duration",
            "ms",
            rows["duration"],
            note="from the triggering append to the summary applied",
        ),
        measure(
            f"{name}.first_append",
            "ms",
            rows["first"],
            note="the first append after opening a loaded 20,000-event session with a policy "
            "(its commit folds and projects the whole surface on the event loop)",
        ),
    ]


def compaction(ctx: Context) -> list[Measurement]:
    """p99 append latency (one producer) while a 20k-message surface compacts vs none."""
    rows = anyio.run(_compaction, ctx, 1, backend="asyncio")
    return _compaction_measurements(rows, 1)


def compaction_4_producers(ctx: Context) -> list[Measurement]:
    """:func:`compaction` with 4 concurrent producers (information)."""
    rows = anyio.run(_compaction, ctx, 4, backend="asyncio")
    return _compaction_measurements(rows, 4)


BENCHMARKS = [
    round_trip,
    producers,
    fanout,
    fanout_unpaced,
    compaction,
    compaction_4_producers,
    round_trip_trio,
    producers_trio,
]
