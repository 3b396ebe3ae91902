"""Suite "engine": what the actor's round trip costs the event loop, with many sessions.

Every append here is awaited by its caller, one at a time per session, and every session
writes at once; asyncio, structlog filtering at info.

* ``round_trip_memory``: 200 and 10,000 sessions on a MemoryStore (the actor and its callers
  alone: no disk, no thread), each awaiting its own 20 appends: the event loop thread's CPU
  per append (``time.thread_time``), and of it the cyclic garbage collector's share
  (``gc.callbacks``), for sessions opened nested in one ``AsyncExitStack`` (each actor's
  scopes inside those of every session opened before it; the producers' task group is
  entered first, see ``_round_trip``) and flat (each in its own task, as a server's handlers
  would), rounds alternating. Targets: <= 20 us at 200; 10,000 within 1.5x
  of 200; nested within 1.2x of flat. Beside them the floor: as many bare relays (a server
  task per session with a deque and futures, no log, no store), each caller awaiting its own
  20 round trips: what the two task switches of any actor's round trip cost here.
* ``sessions_sqlite``: 200 sessions x 20 awaited appends on one SQLite file (WAL,
  ``synchronous=FULL``), through ``SessionActor.open`` (nested, as ``many``) and through a
  ``Sessions`` registry (``await sessions.get(id)`` before every append, as a bot handling a
  message would), rounds alternating: appends/s.
"""

from __future__ import annotations

import gc
import tempfile
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import orjson

from benchmarks.floors import GroupThread, Relay
from benchmarks.harness import Context, Measurement, Target, expect, measure, ratio
from benchmarks.workloads import content
from nous_session import EventType, Log, SessionActor
from nous_session.event import prepare
from nous_session.registry import Sessions
from nous_session.stores import MemoryStore
from nous_session.stores.base import Store
from nous_session.stores.sqlite import SQLiteStore

ISSUE = "engine issue"
USER = EventType.USER_MESSAGE
EACH = 20
FEW, MANY = 200, 10_000


class _GCTimer:
    """The event loop thread's time inside the cyclic garbage collector (``gc.callbacks``)."""

    def __init__(self) -> None:
        self.spent = 0.0
        self._start = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._start = time.thread_time()
        else:
            self.spent += time.thread_time() - self._start

    def __enter__(self) -> _GCTimer:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self)


async def _produce(actor: SessionActor, payload: dict[str, Any], each: int) -> None:
    for _ in range(each):
        await actor.append(USER, payload)


async def _round_trip(count: int, flat: bool) -> tuple[float, float]:
    """``count`` sessions on a MemoryStore, each awaiting ``EACH`` appends, all at once: the
    loop thread's CPU per append and the GC's part of it, in microseconds."""
    payload = {"content": content(1)}
    store = MemoryStore()
    gc.collect()
    if flat:
        opened: list[SessionActor] = []
        finished: list[SessionActor] = []
        ready, go, done = anyio.Event(), anyio.Event(), anyio.Event()

        async def session(index: int) -> None:
            async with SessionActor.open(session_id=f"s{index}", store=store) as actor:
                opened.append(actor)
                if len(opened) == count:
                    ready.set()
                await go.wait()
                await _produce(actor, payload, EACH)
                finished.append(actor)
                if len(finished) == count:
                    done.set()

        with _GCTimer() as collector:
            async with anyio.create_task_group() as task_group:
                for index in range(count):
                    task_group.start_soon(session, index)
                await ready.wait()
                collector.spent = 0.0
                cpu = time.thread_time()
                go.set()
                await done.wait()  # the last append is in: time the appends, not the closes
                cpu = time.thread_time() - cpu
                spent = collector.spent
        actors = opened
    else:
        # The producers' task group is entered before the sessions: anyio gives every task a
        # cancel scope whose exit walks the scopes around it, so producers spawned inside
        # 10,000 nested sessions would each pay for those once (a cost of spawning a task
        # there, not of an append).
        left = [count]
        done = anyio.Event()

        async def produce(actor: SessionActor) -> None:
            await _produce(actor, payload, EACH)
            left[0] -= 1
            if not left[0]:
                done.set()

        async with anyio.create_task_group() as task_group, AsyncExitStack() as stack:
            actors = [
                await stack.enter_async_context(SessionActor.open(session_id=f"s{i}", store=store))
                for i in range(count)
            ]
            with _GCTimer() as collector:
                cpu = time.thread_time()
                for actor in actors:
                    task_group.start_soon(produce, actor)
                await done.wait()
                cpu = time.thread_time() - cpu
                spent = collector.spent
    expect(all(actor.log.count == EACH for actor in actors), "round trip: an append is lost")
    n = count * EACH
    return cpu / n * 1e6, spent / n * 1e6


async def _relay_round_trip(count: int) -> tuple[float, float]:
    """The floor of :func:`_round_trip`: ``count`` relays, each caller awaiting its own
    ``EACH`` round trips, all at once; the loop thread's CPU per round trip and the GC's
    part, in microseconds."""
    payload = {"content": content(1)}
    relays = [Relay() for _ in range(count)]
    left = [count]
    done = anyio.Event()

    async def produce(relay: Relay) -> None:
        for _ in range(EACH):
            await relay.call(payload)
        left[0] -= 1
        if not left[0]:
            done.set()

    gc.collect()
    async with anyio.create_task_group() as servers:
        for relay in relays:
            servers.start_soon(relay.serve)
        await anyio.lowlevel.checkpoint()  # every server parked before the clock starts
        with _GCTimer() as collector:
            async with anyio.create_task_group() as producers:
                cpu = time.thread_time()
                for relay in relays:
                    producers.start_soon(produce, relay)
                await done.wait()
                cpu = time.thread_time() - cpu
            spent = collector.spent
        servers.cancel_scope.cancel()
    expect(all(len(relay.log) == EACH for relay in relays), "relay: a round trip is lost")
    n = count * EACH
    return cpu / n * 1e6, spent / n * 1e6


def _work_alone(count: int) -> float:
    """What an append must do whatever carries it, with no round trip: validate and copy the
    caller's data, make the event, fold it into a Log, and commit it to a MemoryStore (its
    ``commit`` never suspends, so it is driven without an event loop): ``count`` sessions x
    ``EACH`` appends, round-robin as the actors' batches come; CPU per append, in us."""
    payload = {"content": content(1)}
    store = MemoryStore()
    logs = [Log() for _ in range(count)]
    names = [f"s{index}" for index in range(count)]
    gc.collect()
    cpu = time.thread_time()
    for _ in range(EACH):
        for index, name in enumerate(names):
            base = logs[index]
            log = base.append_prepared(prepare(USER, payload))
            commit = store.commit(
                name, expected_count=base.count, events=tuple(log.since(base.count))
            )
            try:
                commit.send(None)
            except StopIteration:
                pass
            else:
                raise AssertionError("MemoryStore.commit suspended")
            logs[index] = log
    cpu = time.thread_time() - cpu
    expect(all(log.count == EACH for log in logs), "work alone: an append is lost")
    return cpu / (count * EACH) * 1e6


def round_trip_memory(ctx: Context) -> list[Measurement]:
    """Loop CPU per awaited append at 200 and 10,000 sessions, nested and flat."""
    sizes = (FEW, ctx.size(MANY, 2_000))
    cpu: dict[tuple[int, bool], list[float]] = {(n, f): [] for n in sizes for f in (False, True)}
    collected: dict[tuple[int, bool], list[float]] = {key: [] for key in cpu}
    rounds = max(ctx.rounds, 5) if not ctx.quick else ctx.rounds
    floor: dict[int, list[float]] = {n: [] for n in sizes}
    floor_gc: dict[int, list[float]] = {n: [] for n in sizes}
    work: list[float] = []
    for index in range(rounds):
        work.append(_work_alone(FEW))
        for count in sizes:
            for flat in (False, True, None) if index % 2 == 0 else (None, True, False):
                if flat is None:
                    per_trip, in_gc = anyio.run(_relay_round_trip, count, backend="asyncio")
                    floor[count].append(per_trip)
                    floor_gc[count].append(in_gc)
                    continue
                per_append, in_gc = anyio.run(_round_trip, count, flat, backend="asyncio")
                cpu[(count, flat)].append(per_append)
                collected[(count, flat)].append(in_gc)
    few, many = sizes
    out = [
        measure(
            f"engine.round_trip_memory.cpu_{few}",
            "us/append",
            cpu[(few, False)],
            target=Target("<=", 20, ISSUE),
            note=f"{few} sessions on a MemoryStore, opened nested in one AsyncExitStack, each "
            f"awaiting its own {EACH} appends, all at once: the event loop thread's CPU per "
            "append (thread_time), GC included",
        ),
        measure(
            f"engine.round_trip_memory.gc_{few}",
            "us/append",
            collected[(few, False)],
            note="of which the cyclic garbage collector (gc.callbacks)",
        ),
        measure(
            f"engine.round_trip_memory.cpu_{many}",
            "us/append",
            cpu[(many, False)],
            note=f"the same with {many:,} sessions",
        ),
        measure(
            f"engine.round_trip_memory.gc_{many}",
            "us/append",
            collected[(many, False)],
            note="of which the cyclic garbage collector",
        ),
        ratio(
            f"engine.round_trip_memory.scale_{many}_vs_{few}",
            cpu[(many, False)],
            cpu[(few, False)],
            target=Target("<=", 1.5, ISSUE),
            note=f"CPU per append with {many:,} sessions / with {few} (nested), round by round",
        ),
    ]
    for count in sizes:
        out.append(
            measure(
                f"engine.round_trip_memory.floor_{count}",
                "us/call",
                floor[count],
                note=f"the floor: {count:,} bare relays (a server task per session, a deque, "
                "a parked future, an answer future; no log, no store), each caller awaiting "
                f"its own {EACH} round trips, all at once: loop CPU per round trip, GC included",
            )
        )
        out.append(
            measure(
                f"engine.round_trip_memory.floor_gc_{count}",
                "us/call",
                floor_gc[count],
                note="of which the cyclic garbage collector",
            )
        )
        out.append(
            ratio(
                f"engine.round_trip_memory.floor_vs_ours_{count}",
                floor[count],
                cpu[(count, False)],
                informational=True,
                note=f"{count:,} sessions: the floor's CPU per round trip / ours per append "
                "(nested), round by round: the share of our cost that any actor pays",
            )
        )
    out.append(
        measure(
            "engine.round_trip_memory.work_alone",
            "us/append",
            work,
            note=f"what an append must do with no round trip ({FEW} sessions round-robin): "
            "validate and copy the data, make the event, fold it into the log, commit it to "
            "a MemoryStore; with the floor, the least an append through any actor can cost",
        )
    )
    out.append(
        ratio(
            f"engine.round_trip_memory.floor_scale_{many}_vs_{few}",
            floor[many],
            floor[few],
            informational=True,
            note=f"the floor's CPU per round trip with {many:,} relays / with {few}",
        )
    )
    for count in sizes:
        out.append(
            measure(
                f"engine.round_trip_memory.cpu_{count}_flat",
                "us/append",
                cpu[(count, True)],
                note=f"{count:,} sessions each opened in its own task (GC included)",
            )
        )
        out.append(
            ratio(
                f"engine.round_trip_memory.nested_vs_flat_{count}",
                cpu[(count, False)],
                cpu[(count, True)],
                target=Target("<=", 1.2, ISSUE),
                note=f"{count:,} sessions: CPU per append opened nested / opened flat, rounds "
                "alternating",
            )
        )
    return out


async def _through_actors(store: Store, count: int, payload: dict[str, Any]) -> float:
    async with AsyncExitStack() as stack:
        actors = [
            await stack.enter_async_context(SessionActor.open(session_id=f"s{i}", store=store))
            for i in range(count)
        ]
        start = time.perf_counter()
        async with anyio.create_task_group() as task_group:
            for actor in actors:
                task_group.start_soon(_produce, actor, payload, EACH)
        elapsed = time.perf_counter() - start
        expect(all(actor.log.count == EACH for actor in actors), "actors: an append is lost")
    return count * EACH / elapsed


async def _through_registry(store: Store, count: int, payload: dict[str, Any]) -> float:
    async with Sessions(store, max_open=count, idle_timeout=3_600) as sessions:
        names = [f"s{i}" for i in range(count)]
        for name in names:  # opened before the clock, as the actors are
            await sessions.get(name)

        async def produce(name: str) -> None:
            for _ in range(EACH):
                await (await sessions.get(name)).append(USER, payload)

        start = time.perf_counter()
        async with anyio.create_task_group() as task_group:
            for name in names:
                task_group.start_soon(produce, name)
        elapsed = time.perf_counter() - start
        counts = [(await sessions.get(name)).log.count for name in names]
        expect(counts == [EACH] * count, "registry: an append is lost")
    return count * EACH / elapsed


async def _through_floor(path: Path, count: int, payload: dict[str, Any]) -> float:
    """The floor of the 200-session workload: a bare relay per session whose server awaits
    each row's insert through one group-committing thread (:mod:`benchmarks.floors`)."""
    record = orjson.dumps(payload)
    writer = GroupThread(path)
    relays: list[Relay] = []
    for index in range(count):

        async def write(item: object, index: int = index) -> None:
            await writer.insert((index, len(relays[index].log), record))

        relays.append(Relay(write))

    async def produce(relay: Relay) -> None:
        for _ in range(EACH):
            await relay.call(payload)

    try:
        async with anyio.create_task_group() as servers:
            for relay in relays:
                servers.start_soon(relay.serve)
            await anyio.lowlevel.checkpoint()
            start = time.perf_counter()
            async with anyio.create_task_group() as producers:
                for relay in relays:
                    producers.start_soon(produce, relay)
            elapsed = time.perf_counter() - start
            servers.cancel_scope.cancel()
    finally:
        writer.close()
    expect(all(len(relay.log) == EACH for relay in relays), "floor: an append is lost")
    return count * EACH / elapsed


def sessions_sqlite(ctx: Context) -> list[Measurement]:
    """200 sessions x 20 awaited appends on one SQLite file, through SessionActor.open and
    through Sessions."""
    count = ctx.size(FEW, 50)
    payload = {"content": content(1)}
    ways: dict[str, Callable[[Store, int, dict[str, Any]], Awaitable[float]]] = {
        "actors": _through_actors,
        "registry": _through_registry,
    }
    rates: dict[str, list[float]] = {name: [] for name in (*ways, "floor")}
    rounds = max(ctx.rounds, 5) if not ctx.quick else ctx.rounds
    for index in range(rounds):
        for name in list(rates) if index % 2 == 0 else list(rates)[::-1]:

            async def one(path: Path, name: str = name) -> float:
                if name == "floor":
                    return await _through_floor(path, count, payload)
                async with SQLiteStore(path) as store:
                    return await ways[name](store, count, payload)

            with tempfile.TemporaryDirectory(prefix="nous-bench-engine-") as directory:
                gc.collect()
                rates[name].append(anyio.run(one, Path(directory) / "s.sqlite3"))
    note = (
        f"{count} sessions on one SQLite file (WAL, FULL), all at once, each awaiting its own "
        f"{EACH} appends in order"
    )
    return [
        measure(
            "engine.sessions_sqlite.actors",
            "appends/s",
            rates["actors"],
            target=Target(">=", 20_000, ISSUE),
            note=note + "; SessionActor.open, nested in one AsyncExitStack",
        ),
        measure(
            "engine.sessions_sqlite.registry",
            "appends/s",
            rates["registry"],
            target=Target(">=", 20_000, ISSUE),
            note=note + "; a Sessions registry, `await sessions.get(id)` before every append",
        ),
        measure(
            "engine.sessions_sqlite.floor",
            "appends/s",
            rates["floor"],
            note=note + "; the floor: a bare relay per session, one raw sqlite3 thread that "
            "inserts every row queued in one transaction (no log, no validation, no session "
            "row, no count check)",
        ),
        ratio(
            "engine.sessions_sqlite.actors_vs_floor",
            rates["actors"],
            rates["floor"],
            informational=True,
            note="SessionActor.open / the floor, round by round",
        ),
    ]


BENCHMARKS: list[Any] = [round_trip_memory, sessions_sqlite]
