"""openai-agents: NousSession against the SDK's own SQLiteSession, side by side in one run.

Usage (the bench virtualenv, which has the SDK)::

    python benchmarks/openai_agents_adapter.py [--rounds 5] [--quick] [--output FILE.md]

The systems are the peers suite's (:mod:`benchmarks.peers`), driven the same way, on a SQLite
file each: ``openai-agents`` (``agents.SQLiteSession``), ``ours-openai-agents`` (``NousSession``
in its default mode: called from this asyncio.run loop, it runs on a registry of that loop)
and ``ours-openai-agents-loop`` (``NousSession(id, sessions=registry)`` on a registry the
benchmark entered). Two workloads, every ``add_items`` awaited, the items converted before the
clock starts:

* ``one session``: 10,000 messages to one session, one ``add_items`` each, the three systems
  open at once in one event loop and taking turns in slices of 500 (slice-interleaved);
* ``200 sessions``: 200 sessions at once, each awaiting its own 20 ``add_items`` in order.

Every round runs every system, alternating the order; each `200 sessions` run is under its own
``asyncio.run`` (a fresh loop, as an application's would be). Reported: the median rate of
the rounds, the median process CPU time per message (every thread: the SDK's and our SQLite
threads included), and the median of the per-round ratios against the SDK. Every run is
checked: the history read back holds every item, the last one last.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import structlog

# The library logs every commit at debug level: filter at info, as a deployment would.
structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.INFO))

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.harness import write_markdown  # noqa: E402
from benchmarks.peers import (  # noqa: E402
    openai_agents_peer,
    ours_agents_loop_peer,
    ours_agents_peer,
)
from benchmarks.workloads import chat_messages  # noqa: E402

SDK = "openai-agents"
SYSTEMS: list[tuple[str, Callable[[Path], Any]]] = [
    (SDK, openai_agents_peer.open_sqlite),
    ("ours-openai-agents", ours_agents_peer.open_sqlite),
    ("ours-openai-agents-loop", ours_agents_loop_peer.open_sqlite),
]
DEFAULT_OUTPUT = ROOT / "benchmarks" / "results" / "issue20" / "openai_agents.md"


SLICE = 500  # appends per turn in the one-session workload


async def _one_session(
    systems: Sequence[tuple[str, Callable[[Path], Any]]], scratch: Path, tag: str, n: int
) -> dict[str, tuple[float, float]]:
    """Each system appends the same ``n`` messages to one session of its own, all open in one
    event loop, taking turns in slices of :data:`SLICE` appends (the order rotating), so that
    every system shares each stretch of the machine's load; rate and CPU per message from the
    time each spent in its own slices."""
    messages = chat_messages(n)
    sides = []
    for name, opener in systems:
        backend = await opener(scratch / f"{tag}-one-session-{name}.db")
        units = [backend.convert(message) for message in messages]
        sides.append((name, backend, units, await backend.session("sequential")))
    wall = dict.fromkeys((name for name, *_ in sides), 0.0)
    cpu = dict.fromkeys(wall, 0.0)
    gc.collect()
    for index, start in enumerate(range(0, n, SLICE)):
        for name, _, units, session in sides if index % 2 == 0 else sides[::-1]:
            began, began_cpu = time.perf_counter(), time.process_time()
            for unit in units[start : start + SLICE]:
                await session.append(unit)
            wall[name] += time.perf_counter() - began
            cpu[name] += time.process_time() - began_cpu
    for name, backend, units, session in sides:
        history = await session.history()
        expected = sum(backend.entries(unit) for unit in units)
        if len(history) != expected:
            raise SystemExit(f"{name}: {len(history)} items read back, not {expected}")
        last = backend.entries(units[-1])
        if not any(backend.text(entry) == messages[-1].text for entry in history[-last:]):
            raise SystemExit(f"{name}: the last item read back is not the last added")
        await backend.aclose()
    return {name: (n / wall[name], cpu[name] / n) for name in wall}


async def _sessions_at_once(
    opener: Callable[[Path], Any], path: Path, sessions: int, each: int
) -> tuple[float, float]:
    backend = await opener(path)
    messages = chat_messages(each)
    units = [backend.convert(message) for message in messages]
    names = [f"session-{i:04d}" for i in range(sessions)]
    opened = [await backend.session(name) for name in names]

    async def produce(session: Any) -> None:
        for unit in units:
            await session.append(unit)

    gc.collect()
    wall, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(produce(session) for session in opened))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    expected = sum(backend.entries(unit) for unit in units)
    for k in sorted({0, sessions // 2, sessions - 1}):
        history = await opened[k].history()
        if len(history) != expected or backend.text(history[-1]) != messages[-1].text:
            raise SystemExit(f"{backend.system}: session {k} does not hold its {each} messages")
    for name in names[::-1]:
        await backend.close_session(name)
    await backend.aclose()
    total = sessions * each
    return total / wall, cpu / total


def _median(values: Sequence[float]) -> float:
    return statistics.median(values)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="1,000 messages, 50 sessions")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    args = parser.parse_args(argv)
    n, sessions, each = (1_000, 50, 20) if args.quick else (10_000, 200, 20)
    workloads = ("one session", "200 sessions")
    rates: dict[tuple[str, str], list[float]] = {}
    cpus: dict[tuple[str, str], list[float]] = {}
    scratch = Path(tempfile.mkdtemp(prefix="nous-oa-bench-"))
    started = time.perf_counter()

    def note(round_index: int, workload: str, name: str, rate: float, cpu: float) -> None:
        rates.setdefault((workload, name), []).append(rate)
        cpus.setdefault((workload, name), []).append(cpu)
        print(
            f"round {round_index + 1} {workload:>12} {name:<24} "
            f"{rate:8.0f} msg/s {cpu * 1e6:7.0f} us CPU/msg",
            flush=True,
        )

    try:
        for round_index in range(args.rounds):
            order = SYSTEMS if round_index % 2 == 0 else SYSTEMS[::-1]
            sliced = asyncio.run(_one_session(order, scratch, str(round_index), n))
            for name, (rate, cpu) in sliced.items():
                note(round_index, "one session", name, rate, cpu)
            for name, opener in order:
                path = scratch / f"{round_index}-200-sessions-{name}.db"
                rate, cpu = asyncio.run(_sessions_at_once(opener, path, sessions, each))
                note(round_index, "200 sessions", name, rate, cpu)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    elapsed = time.perf_counter() - started

    lines = [
        "# openai-agents: NousSession against the SDK's SQLiteSession",
        "",
        f"Measured {datetime.now(UTC):%Y-%m-%d %H:%M} UTC by `python "
        f"benchmarks/openai_agents_adapter.py --rounds {args.rounds}"
        f"{' --quick' if args.quick else ''}` (the bench virtualenv), in {elapsed:.0f} s: "
        f"Python {platform.python_version()}, {platform.machine()}, "
        f"{len(__import__('os').sched_getaffinity(0))} usable cores, **shared with other "
        "jobs during the run** (figures are noisy; the ratios come from the same rounds).",
        "",
        f"Workloads: `one session` = {n:,} messages to one session, each `add_items` awaited, "
        f"the systems taking turns in slices of {SLICE} in one event loop; "
        f"`200 sessions` = {sessions} sessions at once, each awaiting its own {each} "
        "`add_items` in order. One SQLite file per system and run (ours: `SQLiteStore`, "
        "`synchronous=FULL`; the SDK: its own defaults). Medians of "
        f"{args.rounds} interleaved rounds; CPU = process CPU time (all threads) per message; "
        "ratio = median of the per-round ratios of the rate to the SDK's.",
        "",
        "| workload | system | msg/s | CPU µs/msg | ratio to the SDK |",
        "|---|---|---:|---:|---:|",
    ]
    for workload in workloads:
        sdk = rates[(workload, SDK)]
        for name, _ in SYSTEMS:
            mine = rates[(workload, name)]
            ratio = _median([a / b for a, b in zip(mine, sdk, strict=True)])
            lines.append(
                f"| {workload} | {name} | {_median(mine):,.0f} | "
                f"{_median(cpus[(workload, name)]) * 1e6:,.0f} | {ratio:.2f}x |"
            )
    lines += ["", "Every round (msg/s):", ""]
    for (workload, name), values in rates.items():
        lines.append(f"* {workload}, {name}: " + ", ".join(f"{v:,.0f}" for v in values))
    write_markdown(args.output, "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
