"""Ours through the openai-agents adapter on a ``Sessions`` registry entered on the benchmark's
own event loop (``NousSession(id, sessions=registry)``): what the default mode picks by
itself on an asyncio.run loop, with the registry chosen by hand. See
:mod:`benchmarks.peers.ours_agents_peer`."""

from __future__ import annotations

from pathlib import Path

from benchmarks.peers import MEMORY, SQLITE
from benchmarks.peers.ours_agents_peer import OursAgentsLoopBackend


async def open_memory(path: Path | None = None) -> OursAgentsLoopBackend:
    backend = OursAgentsLoopBackend(MEMORY, None)
    await backend.registry.__aenter__()
    return backend


async def open_sqlite(path: Path | None) -> OursAgentsLoopBackend:
    assert path is not None
    backend = OursAgentsLoopBackend(SQLITE, path)
    await backend.registry.__aenter__()
    return backend
