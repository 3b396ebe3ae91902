"""Ours through the openai-agents adapter: ``NousSession``, driven exactly as the SDK's
``SQLiteSession`` peer is (the same items, ``add_items`` / ``get_items``), so the row shows what
a user of the SDK gets by swapping the session class: the adapter's conversion of each item to
a surface message and back, and the hop to the portal's event loop, on top of our store; and
(``ours-openai-agents-loop``) the same on a ``Sessions`` registry on the benchmark's own loop.

In memory: a private ``memory:`` store per session (as ``SQLiteSession(":memory:")``); on a
file: ``sqlite:///path`` (our SQLiteStore, default durability FULL), one portal shared by every
session of the file.
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
    loop (``NousSession(id, sessions=registry)``): no thread hop per call."""

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
