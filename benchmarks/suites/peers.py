"""Suite "peers": nous_session side by side with the libraries people use today (issue 6).

Peers (installed only by the ``bench`` extra; adapters in :mod:`benchmarks.peers`, each called
through its public API as its docs show): the OpenAI Agents SDK (``SQLiteSession``), LangGraph
(``StateGraph(MessagesState)`` with ``InMemorySaver`` / ``AsyncSqliteSaver``), Google ADK
(``InMemorySessionService`` / ``SqliteSessionService``) and ``eventsourcing`` (POPO / SQLite).
Ours is ``SessionActor`` over ``MemoryStore`` / ``SQLiteStore`` (default durability, FULL),
every append awaited.

Workloads (the same ~200-byte chat messages for everyone, from :mod:`benchmarks.workloads`:
every 10th assistant message calls a tool and is followed by its result):

1. ``sequential_memory`` / ``sequential_sqlite``: 10,000 appends to one session, one at a time;
   then (workload 5) the last 10 messages of that session, read repeatedly. On SQLite the
   ``floor`` runs beside them (:mod:`benchmarks.peers.floor_peer`: raw ``sqlite3`` in one
   thread, each append awaited, no library): the best any system that keeps the disk off the
   event loop can do, reported as a bound, never as a peer.
2. ``agent_loop``: append one message, read the model-visible history, 2,000 times (in memory);
   per-iteration time of the first 200 and of the last 200.
3. ``concurrent``: 50 producers x 200 messages on one SQLite-backed session; the acknowledged
   rate, and whether anything acknowledged was lost, duplicated or reordered per producer.
4. ``many_sessions``: 1,000 sessions x 20 messages on one SQLite file: rate and bytes on disk.
6. ``sessions_at_once`` (issue 11): 200 sessions on one SQLite file, all at once, each awaiting
   its own 20 appends in order; the acknowledged rate (each peer with its own defaults and
   durability).

Rules that keep the run honest and inside 15 minutes on 2 cores:

* Every round runs every system, alternating the order; ratios are the median of per-round
  ratios against the best peer *of that workload* (the best median), from the same rounds.
  The one-session workloads go further: inside a round the systems take turns in slices of
  :data:`SLICE` appends (each on its own open session), so they share every stretch of load.
* Rounds are capped at :data:`MAX_ROUNDS` (the peers are slow; see each note).
* Peers are time-boxed (:data:`PEER_SECONDS` per system per round and phase): a peer whose
  costs grow with the history (LangGraph rewrites the whole message list into every checkpoint;
  ADK's ``get_session`` deep-copies or re-reads the whole session) stops early, and its figure
  is taken over the part it did. Its costs only grow with n, so the box flatters the peer; each
  note says how far it got. Ours is never time-boxed.
* Conversion of our messages into each peer's objects happens before the clock starts.
* Every result is checked (history length, last message, per-producer order) and a benchmark
  fails rather than report a number from a broken run; a peer that *loses* messages is reported,
  not failed: losing them is its result.
"""

from __future__ import annotations

import gc
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio

from benchmarks.harness import Context, Measurement, Target, expect, measure, ratio
from benchmarks.peers import (
    MEMORY,
    OURS,
    REFERENCES,
    SQLITE,
    Backend,
    Deadline,
    System,
    available,
    disk_bytes,
    missing,
)
from benchmarks.workloads import chat_messages, content
from nous_session import Message

ISSUE_6 = "issue 6"
ISSUE_11 = "issue 11"
ISSUE_20 = "issue 20"
MAX_ROUNDS = 3
SEQUENTIAL_ROUNDS = 5  # the one-session figures: medians of >= 5 interleaved rounds
SLICE = 500  # appends per turn when the one-session workloads take turns (see _sequential)
US = 1e6
MS = 1e3


def _rounds(ctx: Context, cap: int = MAX_ROUNDS) -> int:
    return max(1, min(ctx.rounds, 2 if ctx.quick else cap))


def _peer_seconds(ctx: Context) -> float:
    """The time box of one peer, per round and phase."""
    return 1.5 if ctx.quick else 6.0


def _systems(kind: str, *, references: bool = False) -> list[tuple[System, Callable[..., Any]]]:
    """Ours first, then every installed peer that has a ``kind`` backend (and, with
    ``references``, the bounds such as the floor)."""
    out = []
    for system in (OURS, *available()):
        if system.name in REFERENCES and not references:
            continue
        opener = system.opener(kind)
        if opener is not None:
            out.append((system, opener))
    return out


def _order(items: list[Any], round_index: int) -> list[Any]:
    return items if round_index % 2 == 0 else items[::-1]


def _missing_note() -> str:
    gone = missing()
    if not gone:
        return ""
    return " Not measured (did not import): " + "; ".join(f"{k}: {v}" for k, v in gone.items())


class _Scratch:
    """A private directory for the SQLite files of one benchmark, removed afterwards."""

    def __enter__(self) -> _Scratch:
        self.path = Path(tempfile.mkdtemp(prefix="nous-peers-"))
        self.counter = 0
        return self

    def file(self, name: str) -> Path:
        self.counter += 1
        return self.path / f"{self.counter:03d}-{name}.db"

    def remove(self, path: Path) -> None:
        for suffix in ("", "-wal", "-shm", "-journal"):
            path.with_name(path.name + suffix).unlink(missing_ok=True)

    def __exit__(self, *exc: object) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


async def _open(opener: Callable[..., Any], kind: str, scratch: _Scratch, name: str) -> Any:
    path = scratch.file(name) if kind == SQLITE else None
    backend = await opener(path)
    backend.path_on_disk = path
    return backend


def _best(
    samples: dict[str, list[float]], *, higher_is_better: bool
) -> tuple[str, list[float]] | None:
    """The peer with the best median (``ours``, ours through an adapter and the references
    excluded)."""
    peers = {
        name: values
        for name, values in samples.items()
        if not name.startswith("ours") and name not in REFERENCES and values
    }
    if not peers:
        return None
    pick = max if higher_is_better else min
    name = pick(peers, key=lambda n: statistics.median(peers[n]))
    return name, peers[name]


def _versions_note() -> dict[str, dict[str, str]]:
    return {system.name: system.versions() for system in (OURS, *available())}


# Workloads 1 and 5: sequential appends, then the last 10 -------------------------------------


async def _sequential(ctx: Context, kind: str) -> dict[str, dict[str, list[float]]]:
    """Every system appends the same ``n`` messages to one session of its own, in slices of
    :data:`SLICE` appends taken in turn (the order rotating from slice to slice): the systems
    share every stretch of the machine's load, so a busy moment slows them all, not the one
    whose turn it was. Then each is checked and its tail reads timed, one after another."""
    n = ctx.size(10_000, 1_000)
    messages = chat_messages(n)
    tail_k = 10
    systems = _systems(kind, references=True)
    out: dict[str, dict[str, list[float]]] = {
        system.name: {key: [] for key in ("rate", "count", "tail", "first_tail", "store_tail")}
        for system, _ in systems
    }
    out["ours"]["bytes"] = []
    with _Scratch() as scratch:
        for round_index in range(_rounds(ctx, SEQUENTIAL_ROUNDS)):
            running = []
            for system, opener in _order(systems, round_index):
                backend: Backend = await _open(opener, kind, scratch, system.name)
                units = [backend.convert(message) for message in messages]
                session = await backend.session("sequential")
                running.append(_Slices(system, backend, units, session, system is OURS))
            gc.collect()
            for index, start in enumerate(range(0, n, SLICE)):
                for side in _order(running, index):
                    await side.run(start, min(n, start + SLICE), _peer_seconds(ctx))
            for side in running:
                system, backend, units = side.system, side.backend, side.units
                session, ours, done = side.session, side.ours, side.done
                row = out[system.name]
                row["rate"].append(done / side.elapsed)
                row["count"].append(done)

                history = await session.history()
                expected = sum(backend.entries(unit) for unit in units[:done])
                expect(
                    len(history) == expected,
                    f"{system.name} {kind}: history holds {len(history)}, not {expected}",
                )
                last_text = messages[done - 1].text
                # A peer may store one message as several entries (an assistant message with
                # a tool call is a message item and a function-call item for openai-agents):
                # the last message's text is in the last few entries, not always the last.
                last_entries = backend.entries(units[done - 1])
                expect(
                    any(backend.text(e) == last_text for e in history[-last_entries:]),
                    f"{system.name} {kind}: the last message read back is not the last appended",
                )

                # Workload 5: the last 10 of the session (the first read, then warm reads).
                began = time.perf_counter()
                tail = await session.tail(tail_k)
                row["first_tail"].append((time.perf_counter() - began) * US)
                expect(
                    len(tail) == tail_k
                    and any(backend.text(e) == last_text for e in tail[-last_entries:]),
                    f"{system.name} {kind}: the tail read is wrong",
                )
                reps, spent = 0, 0.0
                while reps < 20 or (spent < 0.2 and reps < 2_000):
                    began = time.perf_counter()
                    tail = await session.tail(tail_k)
                    spent += time.perf_counter() - began
                    reps += 1
                row["tail"].append(spent / reps * US)
                if ours:
                    store = backend.store  # type: ignore[attr-defined]
                    count = backend.sessions["sequential"].actor.log.count  # type: ignore[attr-defined]
                    reps, spent = 0, 0.0
                    while reps < 20 or (spent < 0.2 and reps < 2_000):
                        began = time.perf_counter()
                        events = await store.load("sequential", since=count - tail_k)
                        spent += time.perf_counter() - began
                        reps += 1
                    expect(
                        len(events) == tail_k and events[-1].data["content"] == last_text,
                        "ours: store.load(since=count - 10) is wrong",
                    )
                    row["store_tail"].append(spent / reps * US)
            # Closed last opened first: an actor's task group is entered in this task, and
            # task groups nest.
            for side in running[::-1]:
                await side.backend.aclose()
                path = side.backend.path_on_disk  # type: ignore[attr-defined]
                if path is not None:
                    if side.ours:
                        out["ours"]["bytes"].append(disk_bytes(path) / side.done)
                    scratch.remove(path)
    return out


class _Slices:
    """One system's side of the sliced sequential run: its session, what it has done, and
    its time on the clock (a peer stops at its time box; ours never does)."""

    def __init__(
        self, system: System, backend: Backend, units: list[Any], session: Any, ours: bool
    ) -> None:
        self.system, self.backend, self.units, self.session = system, backend, units, session
        self.ours = ours
        self.done = 0
        self.elapsed = 0.0
        self.stopped = False

    async def run(self, start: int, stop: int, box: float) -> None:
        """Append ``units[start:stop]``, each awaited, unless the time box has run out."""
        if self.stopped:
            return
        append = self.session.append
        began = time.perf_counter()
        end = None if self.ours else began + box - self.elapsed
        for unit in self.units[start:stop]:
            await append(unit)
            self.done += 1
            if end is not None and time.perf_counter() >= end:
                self.stopped = True
                break
        self.elapsed += time.perf_counter() - began


def _sequential_measurements(
    rows: dict[str, dict[str, list[float]]], kind: str, ctx: Context
) -> list[Measurement]:
    n = ctx.size(10_000, 1_000)
    where = "a SQLite file" if kind == SQLITE else "memory"
    prefix = f"peers.sequential_{kind}"
    out: list[Measurement] = []
    versions = _versions_note()
    for name, row in rows.items():
        reached = int(min(row["count"]))
        note = f"{n:,} messages to one session in {where}, each append awaited"
        if reached < n:
            note = (
                f"time-boxed at {_peer_seconds(ctx):g} s: reached {reached:,}-"
                f"{int(max(row['count'])):,} of {n:,} messages; the rate over that prefix "
                "(where a peer's per-append cost grows with n, this flatters it)"
            )
        out.append(
            measure(
                f"{prefix}.{name}",
                "msg/s",
                row["rate"],
                note=note,
                messages=row["count"],
                versions=versions.get(name, {}),
            )
        )
    best = _best({k: v["rate"] for k, v in rows.items()}, higher_is_better=True)
    if best is not None:
        peer, samples = best
        out.append(
            ratio(
                f"{prefix}.ratio_vs_best",
                rows["ours"]["rate"],
                samples,
                target=Target(">=", 2, ISSUE_6),
                note=f"ours / the best peer ({peer}), msg/s, per round." + _missing_note(),
            )
        )
    out.extend(_our_ways(prefix, {k: v["rate"] for k, v in rows.items()}))
    floor = rows.get("floor", {}).get("rate")
    if floor:
        if best is not None:
            out.append(
                ratio(
                    f"{prefix}.floor_vs_best",
                    floor,
                    best[1],
                    informational=True,
                    note=f"the floor (raw sqlite3 in a thread, awaited; no library) / the best "
                    f"peer ({best[0]}), msg/s, per round: what keeping the disk off the event "
                    "loop allows at most",
                )
            )
        out.append(
            ratio(
                f"{prefix}.ratio_vs_floor",
                rows["ours"]["rate"],
                floor,
                informational=True,
                note="ours / the floor, msg/s, per round: what the actor, the log and the "
                "store add",
            )
        )
    if "bytes" in rows["ours"] and rows["ours"]["bytes"]:
        out.append(measure(f"{prefix}.ours_bytes_per_message", "B/msg", rows["ours"]["bytes"]))

    # Workload 5.
    prefix5 = f"peers.tail_{kind}"
    for name, row in rows.items():
        reached = int(min(row["count"]))
        at = f"at {reached:,} messages" + (" (time-boxed, see above)" if reached < n else "")
        how = {
            "ours": "session.messages()[-10:] on the open session",
            "openai-agents": "get_items(limit=10)",
            "langgraph": 'aget_state(config).values["messages"][-10:]',
            "google-adk": "get_session(config=GetSessionConfig(num_recent_events=10)).events",
            "eventsourcing": "repository.get(id).messages[-10:] (cached aggregate)",
            "floor": "one SELECT of the last 10 and their decoding, in the floor's thread",
        }.get(name, "")
        out.append(
            measure(
                f"{prefix5}.{name}",
                "us/read",
                row["tail"],
                note=f"{how}, {at}; mean of repeated reads",
            )
        )
        out.append(
            measure(
                f"{prefix5}.{name}_first_read",
                "us/read",
                row["first_tail"],
                note="the first read after the appends"
                + (
                    " (ours: projects the 10,000 messages into the memoised surface once)"
                    if name == "ours"
                    else ""
                ),
            )
        )
    out.append(
        measure(
            f"{prefix5}.ours_store_load",
            "us/read",
            rows["ours"]["store_tail"],
            note=f"{'SQLiteStore' if kind == SQLITE else 'MemoryStore'}.load(session, "
            "since=count - 10): reading the tail from the store, not the open session",
        )
    )
    best = _best({k: v["tail"] for k, v in rows.items()}, higher_is_better=False)
    if best is not None:
        peer, samples = best
        out.append(
            ratio(
                f"{prefix5}.ratio_vs_best",
                samples,
                rows["ours"]["tail"],
                target=Target(">=", 30, ISSUE_6),
                note=f"the best peer's ({peer}) time to read the last 10 / ours "
                "(session.messages()[-10:] on the open session)",
            )
        )
        floor_tail = rows.get("floor", {}).get("tail")
        if floor_tail:
            out.append(
                ratio(
                    f"{prefix5}.floor_vs_best",
                    samples,
                    floor_tail,
                    informational=True,
                    note=f"the best peer's ({peer}) time / the floor's cold read (a thread hop, "
                    "one SELECT, ten rows decoded): what a read from the disk, off the event "
                    "loop, allows at most",
                )
            )
            out.append(
                ratio(
                    f"{prefix5}.store_vs_floor",
                    floor_tail,
                    rows["ours"]["store_tail"],
                    informational=True,
                    note="the floor's cold read / ours through the store "
                    "(store.load(since=count - 10))",
                )
            )
        out.append(
            ratio(
                f"{prefix5}.store_ratio_vs_best",
                samples,
                rows["ours"]["store_tail"],
                target=Target(">=", 30, ISSUE_6),
                note=f"the best peer's ({peer}) time / ours read through the store "
                "(store.load(since=count - 10))",
            )
        )
    return out


def _our_ways(
    prefix: str, rates: dict[str, list[float]], *, best_target: float | None = None
) -> list[Measurement]:
    """Ours the other ways (through ``Sessions``, through the openai-agents adapter) against
    the best peer of the same rounds, and the adapter against the SDK session it replaces."""
    out: list[Measurement] = []
    best = _best(rates, higher_is_better=True)
    for name, samples in rates.items():
        if not name.startswith("ours-") or not samples:
            continue
        if best is not None:
            peer, peer_samples = best
            out.append(
                ratio(
                    f"{prefix}.{name}_vs_best",
                    samples,
                    peer_samples,
                    target=None
                    if best_target is None or name != "ours-sessions"
                    else Target(">=", best_target, ISSUE_20),
                    informational=best_target is None or name != "ours-sessions",
                    note=f"{name} / the best peer ({peer}), msg/s, per round",
                )
            )
        sdk = rates.get("openai-agents")
        if name.startswith("ours-openai-agents") and sdk:
            out.append(
                ratio(
                    f"{prefix}.{name}_vs_openai_agents",
                    samples,
                    sdk,
                    target=Target(">=", 1.5, ISSUE_20) if name == "ours-openai-agents" else None,
                    informational=name != "ours-openai-agents",
                    note=f"{name} (NousSession) / the SDK's SQLiteSession, msg/s, per round",
                )
            )
    return out


def sequential_memory(ctx: Context) -> list[Measurement]:
    """Workloads 1 and 5 in memory."""
    rows = anyio.run(_sequential, ctx, MEMORY, backend="asyncio")
    return _sequential_measurements(rows, MEMORY, ctx)


def sequential_sqlite(ctx: Context) -> list[Measurement]:
    """Workloads 1 and 5 on a SQLite file."""
    rows = anyio.run(_sequential, ctx, SQLITE, backend="asyncio")
    return _sequential_measurements(rows, SQLITE, ctx)


# Workload 2: the agent loop --------------------------------------------------------------------

BIN = 50  # iterations per point of the per-iteration curve


async def _agent_loop(ctx: Context) -> dict[str, dict[str, Any]]:
    n = ctx.size(2_000, 600)
    edge = n // 10  # 200: the first and the last block
    messages = chat_messages(n)
    systems = _systems(MEMORY)
    out: dict[str, dict[str, Any]] = {
        system.name: {"first": [], "last": [], "last_count": [], "filled": [], "curves": []}
        for system, _ in systems
    }
    with _Scratch() as scratch:
        for round_index in range(_rounds(ctx)):
            for system, opener in _order(systems, round_index):
                backend: Backend = await _open(opener, MEMORY, scratch, system.name)
                ours = system is OURS
                units = [backend.convert(message) for message in messages]
                session = await backend.session("agent-loop")
                times: list[float | None] = [None] * n
                size = 0

                async def iterate(i: int) -> None:
                    nonlocal size
                    began = time.perf_counter()
                    await session.append(units[i])  # noqa: B023
                    history = await session.history()  # noqa: B023
                    size = len(history)
                    times[i] = time.perf_counter() - began  # noqa: B023

                gc.collect()
                for i in range(edge):
                    await iterate(i)
                middle = Deadline(None if ours else _peer_seconds(ctx) / 2)
                i = edge
                while i < n - edge and not middle.expired():
                    await iterate(i)
                    i += 1
                filled = n - edge - i
                if filled:
                    await session.fill(units[i : n - edge])
                last = Deadline(None if ours else _peer_seconds(ctx) / 1.5)
                done = n - edge
                while done < n and (done < n - edge + 20 or not last.expired()):
                    await iterate(done)
                    done += 1
                expected = sum(backend.entries(unit) for unit in units[:done])
                expect(size == expected, f"{system.name}: history {size}, not {expected}")
                history = await session.history()
                expect(
                    backend.text(history[-1]) == messages[done - 1].text,
                    f"{system.name}: the last message read back is not the last appended",
                )
                row = out[system.name]
                first_block = [t for t in times[:edge] if t is not None]
                last_block = [t for t in times[n - edge :] if t is not None]
                row["first"].append(statistics.fmean(first_block) * US)
                row["last"].append(statistics.fmean(last_block) * US)
                row["last_count"].append(len(last_block))
                row["filled"].append(filled)
                curve = []
                for start in range(0, n, BIN):
                    block = [t for t in times[start : start + BIN] if t is not None]
                    curve.append(statistics.fmean(block) * US if block else None)
                row["curves"].append(curve)
                await backend.aclose()
    return out


def agent_loop(ctx: Context) -> list[Measurement]:
    """Workload 2: append one message + read the history, 2,000 times, in memory."""
    rows = anyio.run(_agent_loop, ctx, backend="asyncio")
    n = ctx.size(2_000, 600)
    edge = n // 10
    out: list[Measurement] = []
    how = {
        "ours": "await session.add_message(m); session.messages()",
        "openai-agents": "await session.add_items([...]); await session.get_items()",
        "langgraph": "await graph.ainvoke({'messages': [m]}, config); "
        "(await graph.aget_state(config)).values['messages']",
        "google-adk": "await service.append_event(session, event); "
        "(await service.get_session(...)).events",
        "eventsourcing": "app.add_message(id, m); app.get_messages(id) (cached aggregate)",
    }
    for name, row in rows.items():
        curve = [
            statistics.median(values) if (values := [c[b] for c in row["curves"] if c[b]]) else None
            for b in range(len(row["curves"][0]))
        ]
        skipped = max(row["filled"])
        box = ""
        if skipped:
            box = (
                f"; time-boxed: iterations {edge + 1}-{n - edge} partly skipped (up to "
                f"{skipped:,} filled untimed by the fastest bulk append), and the last block "
                f"timed over {int(min(row['last_count']))}-{int(max(row['last_count']))} "
                f"of its {edge} iterations"
            )
        out.append(
            measure(
                f"peers.agent_loop.{name}.first_{edge}",
                "us/iter",
                row["first"],
                note=f"{how.get(name, '')}; mean over iterations 1-{edge}{box}",
                curve_bin=BIN,
                curve_us=curve,
            )
        )
        out.append(
            measure(
                f"peers.agent_loop.{name}.last_{edge}",
                "us/iter",
                row["last"],
                note=f"mean over iterations {n - edge + 1}-{n}",
            )
        )
        out.append(
            ratio(
                f"peers.agent_loop.{name}.growth",
                row["last"],
                row["first"],
                target=Target("<=", 1.5, ISSUE_6) if name == "ours" else None,
                note="per-iteration time, last block / first block",
            )
        )
    best = _best({k: v["last"] for k, v in rows.items()}, higher_is_better=False)
    if best is not None:
        peer, samples = best
        out.append(
            ratio(
                "peers.agent_loop.ratio_vs_best",
                samples,
                rows["ours"]["last"],
                target=Target(">=", 100, ISSUE_6),
                note=f"the best peer's ({peer}) per-iteration time at {n - edge}-{n} messages / "
                "ours; in memory for every system." + _missing_note(),
            )
        )
    return out


# Workload 3: concurrent producers ------------------------------------------------------------

PRODUCER_RE = re.compile(r"^producer (\d+) message (\d+) ")


def _producer_message(k: int, j: int) -> Message:
    head = f"producer {k:02d} message {j:03d} "
    return Message.user(head + content(k * 1_000 + j)[len(head) :])


async def _concurrent(ctx: Context) -> dict[str, dict[str, Any]]:
    producers, each = 50, ctx.size(200, 40)
    messages = [[_producer_message(k, j) for j in range(each)] for k in range(producers)]
    systems = _systems(SQLITE)
    keys = ("rate", "acked", "lost", "duplicated", "reordered", "rejected", "unacked_stored")
    out: dict[str, dict[str, Any]] = {
        system.name: {key: [] for key in keys} | {"errors": set()} for system, _ in systems
    }
    with _Scratch() as scratch:
        for round_index in range(_rounds(ctx)):
            for system, opener in _order(systems, round_index):
                backend: Backend = await _open(opener, SQLITE, scratch, system.name)
                ours = system is OURS
                units = [[backend.convert(m) for m in row] for row in messages]
                session = await backend.session("concurrent")
                acked: list[list[int]] = [[] for _ in range(producers)]
                errors: list[str] = []
                deadline = Deadline(None if ours else _peer_seconds(ctx))

                async def produce(
                    k: int,
                    acked: list[list[int]] = acked,
                    errors: list[str] = errors,
                    session: Any = session,
                    units: list[list[Any]] = units,
                    deadline: Deadline = deadline,
                ) -> None:
                    for j, unit in enumerate(units[k]):
                        if deadline.expired():
                            return
                        try:
                            await session.append(unit)
                        except Exception as error:  # a rejected append is a result, not a bug
                            errors.append(f"{type(error).__name__}: {str(error)[:80]}")
                            continue
                        acked[k].append(j)

                gc.collect()
                start = time.perf_counter()
                async with anyio.create_task_group() as task_group:
                    for k in range(producers):
                        task_group.start_soon(produce, k)
                elapsed = time.perf_counter() - start

                history = await session.history()
                seen: list[list[int]] = [[] for _ in range(producers)]
                for entry in history:
                    match = PRODUCER_RE.match(backend.text(entry) or "")
                    expect(match is not None, f"{system.name}: a foreign entry in the history")
                    assert match is not None
                    seen[int(match.group(1))].append(int(match.group(2)))
                lost = duplicated = reordered = stored_unacked = 0
                for k in range(producers):
                    got, want = seen[k], set(acked[k])
                    lost += len(want - set(got))
                    duplicated += len(got) - len(set(got))
                    reordered += int(got != sorted(got))
                    stored_unacked += len(set(got) - want)
                total = sum(len(a) for a in acked)
                row = out[system.name]
                row["rate"].append(total / elapsed)
                row["acked"].append(total)
                row["lost"].append(lost)
                row["duplicated"].append(duplicated)
                row["reordered"].append(reordered)
                row["rejected"].append(len(errors))
                row["unacked_stored"].append(stored_unacked)
                row["errors"].update(sorted(set(errors))[:3])
                if ours:
                    expect(total == producers * each, "ours: an append was not acknowledged")
                await backend.aclose()
                scratch.remove(backend.path_on_disk)  # type: ignore[attr-defined]
    return out


def concurrent(ctx: Context) -> list[Measurement]:
    """Workload 3: 50 concurrent producers x 200 messages on one SQLite-backed session."""
    rows = anyio.run(_concurrent, ctx, backend="asyncio")
    producers, each = 50, ctx.size(200, 40)
    out: list[Measurement] = []
    for name, row in rows.items():
        problems = []
        for key, label in (
            ("lost", "acknowledged but lost"),
            ("duplicated", "duplicated"),
            ("reordered", "producers reordered"),
            ("rejected", "appends rejected with an error"),
            ("unacked_stored", "stored despite an error"),
        ):
            if max(row[key]):
                problems.append(f"{label}: {int(min(row[key]))}-{int(max(row[key]))} per round")
        acked = f"{int(min(row['acked'])):,}-{int(max(row['acked'])):,}"
        note = (
            f"{producers} producers, acknowledged {acked} of {producers * each:,} per round"
            + (f" (time-boxed at {_peer_seconds(ctx):g} s)" if name != "ours" else "")
            + (
                "; " + "; ".join(problems)
                if problems
                else "; nothing lost, duplicated or reordered (checked per producer)"
            )
            + (f"; errors seen: {', '.join(sorted(row['errors']))}" if row["errors"] else "")
        )
        out.append(
            measure(
                f"peers.concurrent.{name}",
                "acked msg/s",
                row["rate"],
                note=note,
                acked=row["acked"],
                lost=row["lost"],
                rejected=row["rejected"],
                duplicated=row["duplicated"],
                reordered=row["reordered"],
            )
        )
        kept = [
            100 * (a - lost) / a if a else 0.0
            for a, lost in zip(row["acked"], row["lost"], strict=True)
        ]
        out.append(
            measure(
                f"peers.concurrent.{name}.kept",
                "%",
                kept,
                target=Target(">=", 100, ISSUE_6) if name == "ours" else None,
                note="share of the acknowledged appends found in the history read back "
                "afterwards (100 = none lost)",
            )
        )
    best = _best({k: v["rate"] for k, v in rows.items()}, higher_is_better=True)
    if best is not None:
        peer, samples = best
        lossy = [name for name, row in rows.items() if name != "ours" and max(row["lost"])]
        out.append(
            ratio(
                "peers.concurrent.ratio_vs_best",
                rows["ours"]["rate"],
                samples,
                target=Target(">=", 10, ISSUE_6),
                note=f"ours / the best peer's ({peer}) acknowledged rate"
                + (f"; peers that lost acknowledged messages: {', '.join(lossy)}" if lossy else "")
                + _missing_note(),
            )
        )
    return out


# Workload 4: many sessions on one file ---------------------------------------------------------

BLOCK = 50  # sessions open at once; their messages are appended round-robin


async def _many_sessions(ctx: Context) -> dict[str, dict[str, list[float]]]:
    sessions, per_session = ctx.size(1_000, 200), 20
    messages = chat_messages(per_session)
    systems = _systems(SQLITE)
    out: dict[str, dict[str, list[float]]] = {
        system.name: {"rate": [], "bytes": [], "messages": []} for system, _ in systems
    }
    with _Scratch() as scratch:
        for round_index in range(_rounds(ctx)):
            for system, opener in _order(systems, round_index):
                backend: Backend = await _open(opener, SQLITE, scratch, system.name)
                ours = system is OURS
                units = [backend.convert(message) for message in messages]
                expected = sum(backend.entries(unit) for unit in units)
                deadline = Deadline(None if ours else _peer_seconds(ctx))
                written = 0
                gc.collect()
                start = time.perf_counter()
                for first in range(0, sessions, BLOCK):
                    names = [f"session-{i:04d}" for i in range(first, first + BLOCK)]
                    opened = [await backend.session(name) for name in names]
                    for unit in units:
                        for session in opened:
                            await session.append(unit)
                    written += BLOCK * per_session
                    for check in (opened[0], opened[-1]):
                        history = await check.history()
                        expect(
                            len(history) == expected
                            and backend.text(history[-1]) == messages[-1].text,
                            f"{system.name}: a session does not hold its {per_session} messages",
                        )
                    for name in names[::-1]:  # last opened, first closed (nested scopes)
                        await backend.close_session(name)
                    if deadline.expired():
                        break
                elapsed = time.perf_counter() - start
                await backend.aclose()
                path = backend.path_on_disk  # type: ignore[attr-defined]
                row = out[system.name]
                row["rate"].append(written / elapsed)
                row["bytes"].append(disk_bytes(path) / written)
                row["messages"].append(written)
                scratch.remove(path)
    return out


def many_sessions(ctx: Context) -> list[Measurement]:
    """Workload 4: 1,000 sessions x 20 messages on one SQLite file: rate and bytes."""
    rows = anyio.run(_many_sessions, ctx, backend="asyncio")
    sessions = ctx.size(1_000, 200)
    out: list[Measurement] = []
    for name, row in rows.items():
        reached = int(min(row["messages"]))
        note = (
            f"{sessions:,} sessions x 20 messages, {BLOCK} sessions open at a time with their "
            "messages appended round-robin, each append awaited; bytes = the file (and its "
            "-wal/-journal) after closing / messages"
        )
        if reached < sessions * 20:
            note += (
                f"; time-boxed at {_peer_seconds(ctx):g} s: {reached // 20:,}-"
                f"{int(max(row['messages'])) // 20:,} sessions written"
            )
        out.append(measure(f"peers.many_sessions.{name}", "msg/s", row["rate"], note=note))
        out.append(measure(f"peers.many_sessions.{name}.bytes", "B/msg", row["bytes"]))
    best = _best({k: v["rate"] for k, v in rows.items()}, higher_is_better=True)
    if best is not None:
        peer, samples = best
        out.append(
            ratio(
                "peers.many_sessions.ratio_vs_best",
                rows["ours"]["rate"],
                samples,
                target=Target(">=", 2, ISSUE_6),
                note=f"ours / the best peer's ({peer}) rate" + _missing_note(),
            )
        )
    smallest = _best({k: v["bytes"] for k, v in rows.items()}, higher_is_better=False)
    if smallest is not None:
        peer, samples = smallest
        out.append(
            ratio(
                "peers.many_sessions.bytes_vs_smallest",
                rows["ours"]["bytes"],
                samples,
                target=Target("<=", 1, ISSUE_6),
                note=f"ours / the smallest peer's ({peer}) bytes per message on disk",
            )
        )
    return out


# Workload 6: many sessions at once (issue 11) ---------------------------------------------------

AT_ONCE = 200  # sessions, all writing at the same time
AT_ONCE_EACH = 20  # appends per session, each awaited, in order
AT_ONCE_ROUNDS = 5  # the issue asks for medians of >= 5 rounds; each peer is time-boxed


async def _sessions_at_once(ctx: Context) -> dict[str, dict[str, Any]]:
    sessions, each = ctx.size(AT_ONCE, 50), AT_ONCE_EACH
    messages = chat_messages(each)
    systems = _systems(SQLITE)
    keys = ("rate", "acked", "rejected")
    out: dict[str, dict[str, Any]] = {
        system.name: {key: [] for key in keys} | {"errors": set()} for system, _ in systems
    }
    with _Scratch() as scratch:
        for round_index in range(_rounds(ctx, AT_ONCE_ROUNDS)):
            for system, opener in _order(systems, round_index):
                backend: Backend = await _open(opener, SQLITE, scratch, system.name)
                ours = system is OURS
                units = [backend.convert(message) for message in messages]
                names = [f"session-{i:04d}" for i in range(sessions)]
                opened = [await backend.session(name) for name in names]  # before the clock
                acked = [0] * sessions
                errors: list[str] = []
                deadline = Deadline(None if ours else _peer_seconds(ctx))

                async def produce(
                    k: int,
                    acked: list[int] = acked,
                    errors: list[str] = errors,
                    opened: list[Any] = opened,
                    units: list[Any] = units,
                    deadline: Deadline = deadline,
                ) -> None:
                    for unit in units:
                        if deadline.expired():
                            return
                        try:
                            await opened[k].append(unit)
                        except Exception as error:  # a rejected append is a result, not a bug
                            errors.append(f"{type(error).__name__}: {str(error)[:80]}")
                            return  # its later appends would not be "in order" any more
                        acked[k] += 1

                gc.collect()
                start = time.perf_counter()
                async with anyio.create_task_group() as task_group:
                    for k in range(sessions):
                        task_group.start_soon(produce, k)
                elapsed = time.perf_counter() - start
                for k in sorted({0, sessions // 2, sessions - 1}):
                    history = await opened[k].history()
                    want = sum(backend.entries(unit) for unit in units[: acked[k]])
                    expect(
                        len(history) == want,
                        f"{system.name}: session {k} holds {len(history)} entries, its "
                        f"{acked[k]} acknowledged appends make {want}",
                    )
                    if acked[k]:
                        expect(
                            backend.text(history[-1]) == messages[acked[k] - 1].text,
                            f"{system.name}: session {k} does not end with its last append",
                        )
                for name in names[::-1]:  # last opened, first closed (nested scopes)
                    await backend.close_session(name)
                await backend.aclose()
                total = sum(acked)
                row = out[system.name]
                row["rate"].append(total / elapsed)
                row["acked"].append(total)
                row["rejected"].append(len(errors))
                row["errors"].update(sorted(set(errors))[:3])
                if ours:
                    expect(total == sessions * each, "ours: an append was not acknowledged")
                scratch.remove(backend.path_on_disk)  # type: ignore[attr-defined]
    return out


def sessions_at_once(ctx: Context) -> list[Measurement]:
    """Workload 6 (issue 11): 200 sessions on one SQLite file, all at once, each awaiting its
    own 20 appends in order; every system with its own defaults and durability."""
    rows = anyio.run(_sessions_at_once, ctx, backend="asyncio")
    sessions, each = ctx.size(AT_ONCE, 50), AT_ONCE_EACH
    out: list[Measurement] = []
    for name, row in rows.items():
        acked = f"{int(min(row['acked'])):,}-{int(max(row['acked'])):,}"
        note = (
            f"{sessions} sessions on one SQLite file, all at once, each awaiting its own "
            f"{each} appends in order; acknowledged {acked} of {sessions * each:,} per round"
            + (f" (time-boxed at {_peer_seconds(ctx):g} s)" if name != "ours" else "")
            + (
                f"; appends rejected: {int(min(row['rejected']))}-{int(max(row['rejected']))}"
                f" per round ({', '.join(sorted(row['errors']))})"
                if max(row["rejected"])
                else ""
            )
        )
        out.append(
            measure(
                f"peers.sessions_at_once.{name}",
                "acked msg/s",
                row["rate"],
                note=note,
                acked=row["acked"],
                rejected=row["rejected"],
            )
        )
    best = _best({k: v["rate"] for k, v in rows.items()}, higher_is_better=True)
    if best is not None:
        peer, samples = best
        out.append(
            ratio(
                "peers.sessions_at_once.ratio_vs_best",
                rows["ours"]["rate"],
                samples,
                target=Target(">=", 10, ISSUE_11),
                note=f"ours / the best peer's ({peer}) acknowledged rate" + _missing_note(),
            )
        )
    out.extend(
        _our_ways("peers.sessions_at_once", {k: v["rate"] for k, v in rows.items()}, best_target=5)
    )
    return out


BENCHMARKS = [
    sequential_memory,
    sequential_sqlite,
    agent_loop,
    concurrent,
    many_sessions,
    sessions_at_once,
]
if not available():
    # `make bench` runs every suite in the project's own virtualenv, where the peers are not
    # installed: nothing to compare against, so nothing to run (`make bench-peers` has them).
    print(
        "peers: no peer library imports here (pip install -e '.[bench]'); suite skipped",
        file=sys.stderr,
    )
    BENCHMARKS = []
