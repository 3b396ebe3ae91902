"""Suite "registry": what opening a session through a :class:`Sessions` registry costs, by how
many sessions are open already.

The registry must cost O(1) per open: each open at 10,000 open costs the same as at 100,
within 1.5x (before, every open scanned every entry: 939 µs per open with 1,000 open, 12.2 ms
with 6,000). Both sides run in one event loop, in two registries alive at once, and their
opens are interleaved slice by slice (:func:`ainterleave_slices`), so both see the same
machine.

* ``open_memory``: opening new sessions on a MemoryStore in a registry with 100 open vs one
  with 10,000 open (``max_open`` above both, so nothing closes); the small registry is fresh
  every round, so it stays near 100 (the large one grows by a few percent over the run).
  µs per open, opens/s, and the median of the rounds' paired ratios.
* ``open_full_memory``: the same in full registries (``max_open`` is the number open), where
  every open also closes the least recently used actor (and waits for it to close): the
  registry stays at exactly 100 or 10,000 open.
* ``open_sqlite``: ``open_memory`` on one SQLite file (each open reads the session from it).
* ``per_call_memory``: what the registry adds to every call on an open actor: CPU per awaited
  append called directly, after ``await sessions.get(id)``, and inside ``async with
  sessions.use(id)`` (how the framework adapters call), slices interleaved.
"""

from __future__ import annotations

import itertools
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack
from pathlib import Path
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
    ratio,
)
from nous_session import SessionActor
from nous_session.registry import Sessions
from nous_session.stores import MemoryStore
from nous_session.stores.base import Store
from nous_session.stores.sqlite import SQLiteStore

ISSUE = "registry issue"
FEW, MANY = 100, 10_000
SAME_COST = Target("<=", 1.5, ISSUE)
IDLE_TIMEOUT = 3_600.0  # nothing closes for idleness while measured


async def _filled(stack: AsyncExitStack, store: Store, count: int, max_open: int) -> Sessions:
    """A registry entered on ``stack`` with ``count`` sessions open (untimed)."""
    sessions = await stack.enter_async_context(
        Sessions(store, max_open=max_open, idle_timeout=IDLE_TIMEOUT)
    )
    for index in range(count):
        await sessions.get(f"pre-{index}")
    expect(sessions.statistics().open == count, f"{count} sessions should be open")
    return sessions


def _opens(
    sessions: Sessions, label: str, slices: int, per_slice: int, open_after: int
) -> Callable[[], AsyncIterator[float | None]]:
    """A side that opens ``slices`` x ``per_slice`` new sessions, a slice at a time, and then
    finds ``open_after`` open."""
    runs = itertools.count()

    async def run() -> AsyncIterator[float | None]:
        prefix = f"{label}-{next(runs)}"  # new session ids every round
        before = sessions.statistics().opened
        yield None
        for slice_index in range(slices):
            names = [f"{prefix}-{slice_index}-{i}" for i in range(per_slice)]
            start = time.perf_counter()
            for name in names:
                await sessions.get(name)
            yield time.perf_counter() - start
        stats = sessions.statistics()
        expect(stats.opened == before + slices * per_slice, f"{label}: opens missing")
        expect(stats.open == open_after, f"{label}: {stats.open} open, not {open_after}")

    return run


def _report(name: str, samples: dict[str, list[float]], opens: int, note: str) -> list[Measurement]:
    few, many = samples["few"], samples["many"]
    return [
        measure(f"{name}.us_per_open_at_{FEW}", "µs", [s / opens * 1e6 for s in few]),
        measure(f"{name}.us_per_open_at_{MANY}", "µs", [s / opens * 1e6 for s in many]),
        measure(f"{name}.opens_per_s_at_{FEW}", "opens/s", [opens / s for s in few]),
        measure(f"{name}.opens_per_s_at_{MANY}", "opens/s", [opens / s for s in many]),
        ratio(f"{name}.cost_at_{MANY}_vs_{FEW}", many, few, target=SAME_COST, note=note),
    ]


async def _growing(
    ctx: Context, make_store: Callable[[], Store], rounds: int
) -> tuple[dict[str, list[float]], int]:
    """The 10,000-open registry is filled once (untimed) and grows by a few percent over the
    rounds; the 100-open one is fresh every round, so it stays near 100."""
    slices, per_slice = ctx.size(8, 4), ctx.size(25, 10)
    added = slices * per_slice
    samples: dict[str, list[float]] = {"few": [], "many": []}
    async with AsyncExitStack() as outer:
        store = make_store()
        outer.push_async_callback(store.aclose)
        many = await _filled(outer, store, MANY, max_open=MANY * 2)
        for round_index in range(rounds):
            async with AsyncExitStack() as inner:
                few = await _filled(inner, store, FEW, max_open=MANY * 2)
                got = await ainterleave_slices(
                    1,
                    {
                        "few": AsyncSide(
                            _opens(few, f"few{round_index}", slices, per_slice, FEW + added),
                            slices,
                        ),
                        "many": AsyncSide(
                            _opens(
                                many,
                                f"many{round_index}",
                                slices,
                                per_slice,
                                MANY + added * (round_index + 1),
                            ),
                            slices,
                        ),
                    },
                )
            for side, values in got.items():
                samples[side].extend(values)
    return samples, added


def open_memory(ctx: Context) -> list[Measurement]:
    """New sessions opened on a MemoryStore with 100 open vs with 10,000 open."""
    rounds = max(1, min(ctx.rounds, 3 if ctx.quick else 6))
    samples, opens = anyio.run(_growing, ctx, MemoryStore, rounds, backend="asyncio")
    return _report("open_memory", samples, opens, "MemoryStore, nothing closes")


def open_sqlite(ctx: Context) -> list[Measurement]:
    """New sessions opened on one SQLite file with 100 open vs with 10,000 open."""
    rounds = max(1, min(ctx.rounds, 2 if ctx.quick else 4))
    with tempfile.TemporaryDirectory() as directory:

        def store() -> Store:
            return SQLiteStore(Path(directory) / "registry.sqlite3")

        samples, opens = anyio.run(_growing, ctx, store, rounds, backend="asyncio")
    return _report("open_sqlite", samples, opens, "SQLite file, nothing closes")


async def _full(ctx: Context) -> tuple[dict[str, list[float]], int]:
    slices, per_slice = ctx.size(8, 4), ctx.size(25, 10)
    async with AsyncExitStack() as stack:
        store = MemoryStore()
        stack.push_async_callback(store.aclose)
        few = await _filled(stack, store, FEW, max_open=FEW)
        many = await _filled(stack, store, MANY, max_open=MANY)
        samples = await ainterleave_slices(
            max(1, min(ctx.rounds, 3 if ctx.quick else 10)),
            {
                "few": AsyncSide(_opens(few, "few", slices, per_slice, FEW), slices),
                "many": AsyncSide(_opens(many, "many", slices, per_slice, MANY), slices),
            },
        )
        for sessions in (few, many):
            stats = sessions.statistics()
            expect(stats.closed_lru == stats.opened - stats.open, "each open closed the LRU")
    return samples, slices * per_slice


def open_full_memory(ctx: Context) -> list[Measurement]:
    """New sessions opened in a full registry (each closes the least recently used) of 100
    vs of 10,000 open sessions, on a MemoryStore."""
    samples, opens = anyio.run(_full, ctx, backend="asyncio")
    return _report("open_full_memory", samples, opens, "MemoryStore, each open closes the LRU")


async def _per_call(ctx: Context) -> dict[str, list[float]]:
    slices, per_slice = ctx.size(20, 4), ctx.size(200, 50)
    data = ("user_message", {"content": "x" * 200})
    store = MemoryStore()
    async with (
        Sessions(store) as sessions,
        SessionActor.open(session_id="alone", store=store) as alone,
    ):
        await sessions.get("got")
        await sessions.get("used")

        def side(call: Callable[[], Any]) -> Callable[[], AsyncIterator[float | None]]:
            async def run() -> AsyncIterator[float | None]:
                yield None
                for _ in range(slices):
                    start = time.process_time()
                    for _ in range(per_slice):
                        await call()
                    yield time.process_time() - start

            return run

        async def direct() -> None:
            await alone.append_many([data])

        async def got() -> None:
            await (await sessions.get("got")).append_many([data])

        async def used() -> None:
            async with sessions.use("used") as actor:
                await actor.append_many([data])

        samples = await ainterleave_slices(
            ctx.rounds,
            {
                "direct": AsyncSide(side(direct), slices),
                "get": AsyncSide(side(got), slices),
                "use": AsyncSide(side(used), slices),
            },
        )
    n = slices * per_slice
    return {name: [value / n * 1e6 for value in values] for name, values in samples.items()}


def per_call_memory(ctx: Context) -> list[Measurement]:
    """What the registry adds to each call: CPU per awaited append on an open actor, called
    directly, after ``await sessions.get(id)``, and inside ``async with sessions.use(id)``."""
    rows = anyio.run(_per_call, ctx, backend="asyncio")
    note = "process CPU per awaited append_many of one event on a MemoryStore, the actor open"
    return [
        measure("registry.per_call_memory.direct", "us/call", rows["direct"], note=note),
        measure(
            "registry.per_call_memory.get",
            "us/call",
            rows["get"],
            note=note + "; `await sessions.get(id)` first",
        ),
        measure(
            "registry.per_call_memory.use",
            "us/call",
            rows["use"],
            note=note + "; inside `async with sessions.use(id)` (the adapters' way)",
        ),
        ratio(
            "registry.per_call_memory.use_vs_direct",
            rows["use"],
            rows["direct"],
            informational=True,
            note="inside a use() block / the actor called directly, slice by slice",
        ),
    ]


BENCHMARKS: list[Any] = [open_memory, open_full_memory, open_sqlite, per_call_memory]
