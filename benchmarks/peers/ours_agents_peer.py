"""Ours through the openai-agents adapter: ``NousSession``, driven exactly as the SDK's
``SQLiteSession`` peer is (the same items, ``add_items`` / ``get_items``), so the row shows what
a user of the SDK gets by swapping the session class: the adapter's conversion of each item to
a surface event and back on top of our store. In its default mode, called from the
benchmark's asyncio loop, a ``NousSession`` runs on a ``Sessions`` registry of that loop (one
per loop and store, shared by every session of the file); ``ours-openai-agents-loop`` is the
same on a registry the benchmark entered itself (``NousSession(id, sessions=registry)``).

In memory: a private in-memory store per session (as ``SQLiteSession(":memory:")``); on a
file: ``sqlite:///path`` (our SQLiteStore, default durability FULL).
"""

from __future__ import annotations

from pathlib import Path

from benchmarks.peers import MEMORY, SQLITE
from benchmarks.peers.openai_agents_peer import OpenAIBackend, OpenAISession
from nous_session.integrations.openai_agents import NousSession
from nous_session.registry import Sessions


class OursAgentsBackend(OpenAIBackend):
    system = "ours-openai-agents"
    concurrent = True

    async def session(self, session_id: str) -> OpenAISession:
        store = None if self.path is None else f"sqlite:///{self.path.resolve()}"
        session = NousSession(session_id, store)
        self.sessions[session_id] = session  # type: ignore[assignment]
        return OpenAISession(session)  # type: ignore[arg-type]


class OursAgentsLoopBackend(OursAgentsBackend):
    """The same sessions on a :class:`Sessions` registry entered on the benchmark's own event
    loop (``NousSession(id, sessions=registry)``)."""

    system = "ours-openai-agents-loop"

    def __init__(self, kind: str, path: Path | None) -> None:
        super().__init__(kind, path)
        self.registry = Sessions("memory:" if path is None else f"sqlite:///{path.resolve()}")

    async def session(self, session_id: str) -> OpenAISession:
        session = NousSession(session_id, sessions=self.registry)
        self.sessions[session_id] = session  # type: ignore[assignment]
        return OpenAISession(session)  # type: ignore[arg-type]

    async def aclose(self) -> None:
        await super().aclose()
        await self.registry.aclose()


async def open_memory(path: Path | None = None) -> OursAgentsBackend:
    return OursAgentsBackend(MEMORY, None)


async def open_sqlite(path: Path | None) -> OursAgentsBackend:
    assert path is not None
    return OursAgentsBackend(SQLITE, path)
