"""The store side of one session on SQLite, side by side with a raw loop and eventsourcing.

Usage::

    python benchmarks/store_bench.py [--rounds 5] [--n 2000] [--only appends,tail,many]
                                     [--output results.json]

Run it with the ``bench`` virtualenv's Python to include eventsourcing and the OpenAI Agents
SDK (``make bench-peers`` builds it); a peer that is not installed is left out.

Three comparisons, each measured side by side in one event loop, its sides cut into slices that
alternate within every round (``harness.ainterleave_slices``), so a drift of this shared
machine's speed or of its disk hits every side alike:

* ``appends``: ``--n`` awaited appends to one session, one at a time, each durable
  (``synchronous=FULL``, WAL) before the next starts:

  - ``raw``: a plain ``sqlite3`` loop of BEGIN IMMEDIATE / INSERT / COMMIT on the event loop's
    own thread (the event loop blocks on every fsync);
  - ``raw_thread``: the same transaction run in a worker thread and awaited
    (``anyio.to_thread.run_sync`` behind a limiter of one): the floor for anything that keeps
    the disk off the event loop;
  - ``store``: ``SQLiteStore.commit`` of one event;
  - ``actor``: ``SessionActor.add_message`` (what the peers suite measures as ours);
  - ``eventsourcing``: the peers suite's eventsourcing adapter (an ``Application`` with a
    cached aggregate, ``PERSISTENCE_MODULE=eventsourcing.sqlite``), called synchronously on
    the event loop as the library is (its fsync blocks the event loop);
  - ``openai_agents``: the peers suite's adapter of the OpenAI Agents SDK's ``SQLiteSession``
    (WAL, SQLite's default FULL; each call in ``asyncio.to_thread``).

  Per side: the rate, and the event loop's CPU per append (``time.thread_time``).
* ``tail``: the last 10 events of a closed session of ``--n`` events, read again and again:
  ours through ``SQLiteStore.load(since=count - 10)`` (the store open, the session's actor
  closed); eventsourcing through its repository (``repository.get(id)``, its aggregate cache
  fast-forwarded by one query: the peers suite's figure) and through its recorder
  (``recorder.select_events(id, gt=version - 10)`` mapped to domain events: the store-level
  read, like ours).
* ``many``: 200 sessions x 20 awaited appends, all at once, on one SQLite file, through
  ``SQLiteStore.commit`` directly (the store's share of the many-sessions workload: the shared
  writer's group commit) and through ``SessionActor``; alternate whole runs, not slices.

Every side checks what it stored. The table goes to stdout; ``--output`` writes every sample
as JSON.
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
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import structlog

# The actor logs every commit at debug level; filter at info, as a deployment would.
structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.INFO))

ROOT = Path(__file__).resolve().parent.parent
# Run as a script, sys.path[0] is benchmarks/ itself: import the package from this checkout.
if sys.path and Path(sys.path[0]).resolve() == ROOT / "benchmarks":
    sys.path[0] = str(ROOT)
elif str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.harness import AsyncSide, ainterleave_slices, expect  # noqa: E402
from benchmarks.workloads import chat_messages  # noqa: E402
from nous_session import Event, SessionActor  # noqa: E402
from nous_session.event import make_event  # noqa: E402
from nous_session.stores.sqlite import SQLiteStore  # noqa: E402
from nous_session.stores.sqlite._store import writer_of  # noqa: E402

try:
    from benchmarks.peers import eventsourcing_peer
except ImportError:  # the bench extra is not installed in this interpreter
    eventsourcing_peer = None  # type: ignore[assignment]
try:
    from benchmarks.peers import openai_agents_peer
except ImportError:
    openai_agents_peer = None  # type: ignore[assignment]

SLICE = 100  # appends per slice of a sequential side
TAIL = 10
RECORD = b"x" * 200
SCHEMA = "CREATE TABLE IF NOT EXISTS events (sid INTEGER NOT NULL, seq INTEGER NOT NULL,"
SCHEMA += " record BLOB NOT NULL, PRIMARY KEY (sid, seq)) WITHOUT ROWID"
INSERT = "INSERT INTO events (sid, seq, record) VALUES (1, ?, ?)"


def _connect(path: Path) -> sqlite3.Connection:
    connection = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    connection.execute("PRAGMA journal_mode=WAL")
    connection.execute("PRAGMA synchronous=FULL")
    connection.execute(SCHEMA)
    return connection


def _raw_count(path: Path) -> int:
    connection = sqlite3.connect(path)
    try:
        return int(connection.execute("SELECT count(*) FROM events").fetchone()[0])
    finally:
        connection.close()


def _events(n: int) -> list[Event]:
    messages = chat_messages(n)
    now = datetime(2025, 1, 1, tzinfo=UTC)
    return [make_event(i, "user_message", {"content": messages[i].text}, now) for i in range(n)]


class _Clock:
    """Wall and event-loop CPU time of one side, summed over its slices."""

    def __init__(self) -> None:
        self.cpu = 0.0
        self.started = 0.0
        self.cpu_started = 0.0

    def start(self) -> None:
        self.cpu_started = time.thread_time()
        self.started = time.perf_counter()

    def stop(self) -> float:
        elapsed = time.perf_counter() - self.started
        self.cpu += time.thread_time() - self.cpu_started
        return elapsed


# Appends to one session ---------------------------------------------------------------------------


def _append_sides(
    directory: Path, n: int, clocks: dict[str, _Clock]
) -> dict[str, Callable[[], AsyncIterator[float | None]]]:
    slices = n // SLICE
    messages = chat_messages(n)
    events = _events(n)

    async def raw() -> AsyncIterator[float | None]:
        path = directory / "raw.db"
        connection = _connect(path)
        clock = clocks["raw"]
        yield None
        for index in range(slices):
            clock.start()
            for seq in range(index * SLICE, (index + 1) * SLICE):
                connection.execute("BEGIN IMMEDIATE")
                connection.execute(INSERT, (seq, RECORD))
                connection.execute("COMMIT")
            yield clock.stop()
        connection.close()
        expect(_raw_count(path) == n, "raw: rows missing")
        _remove(path)

    async def raw_thread() -> AsyncIterator[float | None]:
        path = directory / "raw_thread.db"
        connection = _connect(path)
        limiter = anyio.CapacityLimiter(1)
        clock = clocks["raw_thread"]

        def job(seq: int) -> None:
            connection.execute("BEGIN IMMEDIATE")
            connection.execute(INSERT, (seq, RECORD))
            connection.execute("COMMIT")

        await anyio.to_thread.run_sync(connection.execute, "SELECT 1", limiter=limiter)
        yield None
        for index in range(slices):
            clock.start()
            for seq in range(index * SLICE, (index + 1) * SLICE):
                await anyio.to_thread.run_sync(job, seq, limiter=limiter)
            yield clock.stop()
        connection.close()
        expect(_raw_count(path) == n, "raw_thread: rows missing")
        _remove(path)

    async def store() -> AsyncIterator[float | None]:
        path = directory / "store.db"
        clock = clocks["store"]
        async with SQLiteStore(path) as opened:
            await opened.commit("s", expected_count=0, events=[events[0]])
            yield None
            for index in range(slices):
                clock.start()
                for seq in range(max(1, index * SLICE), (index + 1) * SLICE):
                    await opened.commit("s", expected_count=seq, events=[events[seq]])
                yield clock.stop()
            loaded = await opened.load("s")
            expect(len(loaded) == n and loaded[-1] == events[-1], "store: events missing")
        _remove(path)

    async def actor() -> AsyncIterator[float | None]:
        path = directory / "actor.db"
        clock = clocks["actor"]
        async with SQLiteStore(path) as opened:
            async with SessionActor.open(session_id="s", store=opened) as session:
                await session.add_message(messages[0])
                yield None
                for index in range(slices):
                    clock.start()
                    for seq in range(max(1, index * SLICE), (index + 1) * SLICE):
                        await session.add_message(messages[seq])
                    yield clock.stop()
                expect(session.messages()[-1] == messages[-1], "actor: the last message differs")
            expect(len(await opened.load("s")) == n, "actor: events missing")
        _remove(path)

    async def eventsourcing() -> AsyncIterator[float | None]:
        assert eventsourcing_peer is not None
        path = directory / "eventsourcing.db"
        clock = clocks["eventsourcing"]
        backend = await eventsourcing_peer.open_sqlite(path)
        units = [backend.convert(message) for message in messages]
        session = await backend.session("s")
        await session.append(units[0])
        yield None
        for index in range(slices):
            clock.start()
            for seq in range(max(1, index * SLICE), (index + 1) * SLICE):
                await session.append(units[seq])
            yield clock.stop()
        expect(len(await session.history()) == n, "eventsourcing: messages missing")
        await backend.aclose()
        _remove(path)

    async def openai_agents() -> AsyncIterator[float | None]:
        assert openai_agents_peer is not None
        path = directory / "openai_agents.db"
        clock = clocks["openai_agents"]
        backend = await openai_agents_peer.open_sqlite(path)
        units = [backend.convert(message) for message in messages]
        session = await backend.session("s")
        await session.append(units[0])
        yield None
        for index in range(slices):
            clock.start()
            for seq in range(max(1, index * SLICE), (index + 1) * SLICE):
                await session.append(units[seq])
            yield clock.stop()
        expected = sum(backend.entries(unit) for unit in units)
        expect(len(await session.history()) == expected, "openai-agents: items missing")
        await backend.aclose()
        _remove(path)

    sides = {
        "raw": raw,
        "raw_thread": raw_thread,
        "store": store,
        "actor": actor,
    }
    if eventsourcing_peer is not None:
        sides["eventsourcing"] = eventsourcing
    if openai_agents_peer is not None:
        sides["openai_agents"] = openai_agents
    return sides


def _remove(path: Path) -> None:
    for suffix in ("", "-wal", "-shm", "-journal"):
        path.with_name(path.name + suffix).unlink(missing_ok=True)


async def appends(rounds: int, n: int, directory: Path) -> dict[str, Any]:
    """Sliced sequential appends: rate and event-loop CPU per append, per side and round."""
    rates: dict[str, list[float]] = {}
    cpus: dict[str, list[float]] = {}
    for round_index in range(rounds):
        clocks: dict[str, _Clock] = {}
        sides = _append_sides(directory, n, clocks)
        for name in sides:
            clocks[name] = _Clock()
        names = list(sides) if round_index % 2 == 0 else list(sides)[::-1]
        # One round at a time, so each round's CPU is read off its own clocks.
        samples = await ainterleave_slices(
            1, {name: AsyncSide(sides[name], n // SLICE) for name in names}
        )
        for name, seconds in samples.items():
            done = n if name in ("raw", "raw_thread") else n - 1
            rates.setdefault(name, []).append(done / seconds[0])
            cpus.setdefault(name, []).append(clocks[name].cpu / done * 1e6)
    return {"rate": rates, "loop_cpu_us": cpus}


# The tail of a closed session ---------------------------------------------------------------------


def _tail_sides(
    directory: Path, n: int, reads: int
) -> dict[str, Callable[[], AsyncIterator[float | None]]]:
    messages = chat_messages(n)

    async def store_load() -> AsyncIterator[float | None]:
        path = directory / "tail.db"
        async with SQLiteStore(path) as opened:
            async with SessionActor.open(session_id="s", store=opened) as session:
                for message in messages:
                    await session.add_message(message)
                count = session.log.count
            # The session is closed; the store (and its connection) stays open.
            await opened.load("s", since=count - TAIL)
            yield None
            for _ in range(reads):
                started = time.perf_counter()
                events = await opened.load("s", since=count - TAIL)
                yield time.perf_counter() - started
            expect(
                len(events) == TAIL and events[-1].data["content"] == messages[-1].text,
                "store.load: the tail is wrong",
            )
        _remove(path)

    async def es_setup(name: str) -> tuple[Any, Any, list[Any]]:
        assert eventsourcing_peer is not None
        path = directory / f"{name}.db"
        backend = await eventsourcing_peer.open_sqlite(path)
        backend.path = path
        session = await backend.session("s")
        await session.fill([backend.convert(message) for message in messages])
        return backend, session, messages

    async def es_repository() -> AsyncIterator[float | None]:
        backend, session, _ = await es_setup("es_repository")
        await session.tail(TAIL)
        yield None
        for _ in range(reads):
            started = time.perf_counter()
            tail = await session.tail(TAIL)
            yield time.perf_counter() - started
        expect(
            len(tail) == TAIL and tail[-1]["content"] == messages[-1].text,
            "eventsourcing: the tail is wrong",
        )
        await backend.aclose()
        _remove(backend.path)

    async def es_recorder() -> AsyncIterator[float | None]:
        backend, session, _ = await es_setup("es_recorder")
        app = backend.app
        version = len(messages) + 1  # the Started event, then one per message

        def tail() -> list[Any]:
            stored = app.recorder.select_events(session.id, gt=version - TAIL)
            return [app.mapper.to_domain_event(item) for item in stored]

        tail()
        yield None
        for _ in range(reads):
            started = time.perf_counter()
            found = tail()
            yield time.perf_counter() - started
        expect(
            len(found) == TAIL and found[-1].message["content"] == messages[-1].text,
            "eventsourcing recorder: the tail is wrong",
        )
        await backend.aclose()
        _remove(backend.path)

    async def round_trip() -> AsyncIterator[float | None]:
        path = directory / "round_trip.db"
        async with SQLiteStore(path) as opened:
            await opened.commit("s", expected_count=0, events=_events(n))
            await opened.load("s", since=n - TAIL)
            yield None
            for _ in range(reads):
                started = time.perf_counter()
                await writer_of(opened).read(_nothing)
                yield time.perf_counter() - started
        _remove(path)

    sides: dict[str, Callable[[], AsyncIterator[float | None]]] = {
        "store_load": store_load,
        "writer_round_trip": round_trip,
    }
    if eventsourcing_peer is not None:
        sides["eventsourcing_repository"] = es_repository
        sides["eventsourcing_recorder"] = es_recorder
    return sides


def _nothing(connection: sqlite3.Connection) -> None:
    """A read job that reads nothing: what remains is the round trip to the writer's thread."""


def _recorded(
    run: Callable[[], AsyncIterator[float | None]], into: list[float]
) -> Callable[[], AsyncIterator[float | None]]:
    """``run``, keeping every slice's time in ``into`` as well."""

    async def recorded() -> AsyncIterator[float | None]:
        async for elapsed in run():
            if elapsed is not None:
                into.append(elapsed)
            yield elapsed

    return recorded


async def tail(rounds: int, n: int, directory: Path) -> dict[str, Any]:
    """Microseconds per tail read, per side and round: the mean (what the peers suite
    reports) and the median of the single reads (reads alternate one by one)."""
    reads = 500
    sides = _tail_sides(directory, n, reads)
    each: dict[str, list[float]] = {name: [] for name in sides}
    medians: dict[str, list[float]] = {name: [] for name in sides}
    means: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(rounds):
        samples = await ainterleave_slices(
            1, {name: AsyncSide(_recorded(run, each[name]), reads) for name, run in sides.items()}
        )
        for name, seconds in samples.items():
            means[name].append(seconds[0] / reads * 1e6)
            medians[name].append(statistics.median(each[name]) * 1e6)
            each[name].clear()
    return {"us_per_read": means, "median_us_per_read": medians}


# 200 sessions at once -----------------------------------------------------------------------------


async def _many_store(path: Path, sessions: int, writes: int) -> float:
    events = _events(writes)
    async with SQLiteStore(path) as store:
        await store.load("warm-up")

        async def session(name: str) -> None:
            for seq in range(writes):
                await store.commit(name, expected_count=seq, events=[events[seq]])

        started = time.perf_counter()
        async with anyio.create_task_group() as group:
            for index in range(sessions):
                group.start_soon(session, f"s{index}")
        elapsed = time.perf_counter() - started
        infos = await store.sessions()
        expect(
            len(infos) == sessions and all(info.count == writes for info in infos),
            "many store: events missing",
        )
    return sessions * writes / elapsed


async def _many_actor(path: Path, sessions: int, writes: int) -> float:
    messages = chat_messages(writes)
    async with SQLiteStore(path) as store, AsyncExitStack() as stack:
        await store.load("warm-up")
        actors = [
            await stack.enter_async_context(SessionActor.open(session_id=f"s{i}", store=store))
            for i in range(sessions)
        ]

        async def session(actor: SessionActor) -> None:
            for message in messages:
                await actor.add_message(message)

        started = time.perf_counter()
        async with anyio.create_task_group() as group:
            for actor in actors:
                group.start_soon(session, actor)
        elapsed = time.perf_counter() - started
    return sessions * writes / elapsed


async def many(
    rounds: int, directory: Path, sessions: int = 200, writes: int = 20
) -> dict[str, Any]:
    """Acknowledged appends per second, 200 sessions x 20 at once, whole runs alternating."""
    sides = {"store": _many_store, "actor": _many_actor}
    rates: dict[str, list[float]] = {name: [] for name in sides}
    for round_index in range(rounds):
        names = list(sides) if round_index % 2 == 0 else list(sides)[::-1]
        for name in names:
            path = directory / f"many-{name}-{round_index}.db"
            rates[name].append(await sides[name](path, sessions, writes))
            _remove(path)
    return {"rate": rates}


# Report -------------------------------------------------------------------------------------------


def _median(values: list[float]) -> float:
    return statistics.median(values)


def _ratios(top: list[float], bottom: list[float]) -> list[float]:
    return [a / b for a, b in zip(top, bottom, strict=True)]


def _report(results: dict[str, Any]) -> str:
    lines: list[str] = []
    if "appends" in results:
        rate, cpu = results["appends"]["rate"], results["appends"]["loop_cpu_us"]
        lines += ["appends to one session (msg/s; ratios: median of per-round ratios)", ""]
        lines.append(f"{'side':16s} {'msg/s':>8s} {'loop CPU us':>12s} {'/raw':>6s} {'/floor':>7s}")
        for name in rate:
            row = f"{name:16s} {_median(rate[name]):8.0f} {_median(cpu[name]):12.1f}"
            row += f" {_median(_ratios(rate[name], rate['raw'])):6.2f}"
            row += f" {_median(_ratios(rate[name], rate['raw_thread'])):7.2f}"
            lines.append(row)
        for peer in ("eventsourcing", "openai_agents"):
            if peer in rate:
                for name in ("store", "actor"):
                    ratio = _median(_ratios(rate[name], rate[peer]))
                    lines.append(f"{name} / {peer}: {ratio:.2f}x")
        lines.append("")
    if "tail" in results:
        means = results["tail"]["us_per_read"]
        singles = results["tail"]["median_us_per_read"]
        lines += ["tail of a closed session: the last 10 (us per read: mean, median)", ""]
        for name, values in means.items():
            lines.append(f"{name:26s} {_median(values):8.1f} {_median(singles[name]):8.1f}")
        for peer in ("eventsourcing_repository", "eventsourcing_recorder"):
            if peer in means:
                ratio = _median(_ratios(means[peer], means["store_load"]))
                by_median = _median(_ratios(singles[peer], singles["store_load"]))
                lines.append(
                    f"{peer} / store_load (>= 1: ours is faster): mean {ratio:.2f}x,"
                    f" median {by_median:.2f}x"
                )
        lines.append("")
    if "many" in results:
        rate = results["many"]["rate"]
        lines += ["200 sessions x 20 awaited appends, one file (msg/s)", ""]
        for name, values in rate.items():
            lines.append(
                f"{name:16s} {_median(values):8.0f}  ({min(values):.0f}-{max(values):.0f})"
            )
        lines.append("")
    return "\n".join(lines)


async def _main(arguments: argparse.Namespace) -> dict[str, Any]:
    directory = Path(tempfile.mkdtemp(prefix="nous-store-bench-", dir=arguments.directory))
    results: dict[str, Any] = {
        "machine": {
            "python": platform.python_version(),
            "sqlite": sqlite3.sqlite_version,
            "cpus": os.cpu_count(),
            "load": os.getloadavg(),
        },
        "n": arguments.n,
        "rounds": arguments.rounds,
    }
    try:
        only = arguments.only.split(",")
        if "appends" in only:
            results["appends"] = await appends(arguments.rounds, arguments.n, directory)
        if "tail" in only:
            results["tail"] = await tail(arguments.rounds, arguments.n, directory)
        if "many" in only:
            results["many"] = await many(arguments.rounds, directory)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--only", default="appends,tail,many")
    parser.add_argument("--directory", default=None, help="where the files go (default: tmp)")
    parser.add_argument("--output", type=Path, default=None)
    arguments = parser.parse_args()
    results = anyio.run(_main, arguments, backend="asyncio")
    print(_report(results))
    if arguments.output is not None:
        arguments.output.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
