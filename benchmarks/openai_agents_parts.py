"""Where an openai-agents ``add_items`` / ``get_items`` spends its CPU in the adapter, on a
MemoryStore (no disk in the figures): item conversion, the registry round trip with and
without the adapter, the default mode, and the portal (the old default).

Usage: ``PYTHONPATH=. python benchmarks/openai_agents_parts.py`` (needs the openai-agents
extra). Prints process CPU time per call, two rounds.
"""

from __future__ import annotations

import asyncio
import gc
import time
import timeit
from collections.abc import Awaitable, Callable
from typing import Any

from nous_session.event import message_event
from nous_session.integrations.openai_agents import NousSession, item_event, item_message
from nous_session.registry import Sessions, SessionsPortal

N = 3000
ITEM: Any = {"role": "user", "content": "x" * 200}
CALL: Any = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": '{"a": 1}'}


def conversions() -> None:
    n = 20_000
    for item in (ITEM, CALL):
        old = timeit.timeit(lambda: message_event(item_message(item)), number=n) / n * 1e6  # noqa: B023
        new = timeit.timeit(lambda: item_event(item), number=n) / n * 1e6  # noqa: B023
        kind = item.get("type", item.get("role"))
        print(f"convert {kind}: format round trip {old:.1f} us, item_event {new:.1f} us")


async def cpu_per_call(call: Callable[[], Awaitable[Any]], n: int = N) -> float:
    gc.collect()
    began = time.process_time()
    for _ in range(n):
        await call()
    return (time.process_time() - began) / n * 1e6


async def parts() -> dict[str, float]:
    out = {}
    async with Sessions("memory:") as registry:
        batch = [(*item_event(ITEM), None)]

        async def bare() -> None:
            async with registry.use("bare") as actor:
                await actor.append_many(batch)

        out["registry.use + append_many (no adapter)"] = await cpu_per_call(bare)
        given = NousSession("given", sessions=registry)
        out["NousSession(sessions=registry).add_items"] = await cpu_per_call(
            lambda: given.add_items([ITEM])
        )
        given.close()
    default = NousSession("default")
    out["NousSession default (loop registry).add_items"] = await cpu_per_call(
        lambda: default.add_items([ITEM])
    )
    out["NousSession default get_items(limit=10) at 3000 items"] = await cpu_per_call(
        lambda: default.get_items(limit=10), 200
    )
    default.close()
    with SessionsPortal("memory:") as portal:
        hop = NousSession("portal", sessions=portal)
        wall = time.perf_counter()
        out["NousSession on a portal (the old default).add_items"] = await cpu_per_call(
            lambda: hop.add_items([ITEM])
        )
        out["  the same, wall time"] = (time.perf_counter() - wall) / N * 1e6
        hop.close()
    return out


def main() -> None:
    conversions()
    for round_index in range(2):
        for name, value in asyncio.run(parts()).items():
            print(f"round {round_index + 1}: {name}: {value:.0f} us")


if __name__ == "__main__":
    main()
