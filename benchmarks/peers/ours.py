"""nous_session through :class:`SessionActor`, each append awaited.

Memory: ``MemoryStore``; SQLite: ``SQLiteStore(path)`` with its default durability
(``synchronous="FULL"``: the WAL is fsynced at every commit). The history an agent loop reads
is ``session.messages()`` (a read-only view; the model client iterates it).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from benchmarks.peers import MEMORY, SQLITE
from nous_session import MemoryStore, Message, SessionActor, Store
from nous_session.stores.sqlite import SQLiteStore


class OurSession:
    def __init__(self, actor: SessionActor, stack: AsyncExitStack) -> None:
        self.actor = actor
        self.stack = stack

    async def append(self, unit: Message) -> None:
        await self.actor.add_message(unit)

    async def history(self) -> Sequence[Message]:
        return self.actor.messages()

    async def tail(self, k: int) -> Sequence[Message]:
        return self.actor.messages()[-k:]

    async def fill(self, units: Sequence[Message]) -> None:
        for unit in units:
            await self.actor.add_message(unit)


class OurBackend:
    system = "ours"
    concurrent = True

    def __init__(self, kind: str, store: Store) -> None:
        self.kind = kind
        self.store = store
        self.sessions: dict[str, OurSession] = {}

    def convert(self, message: Message) -> Message:
        return message

    def entries(self, unit: Any) -> int:
        return 1

    def text(self, entry: Message) -> str | None:
        return entry.text

    async def session(self, session_id: str) -> OurSession:
        stack = AsyncExitStack()
        actor = await stack.enter_async_context(
            SessionActor.open(session_id=session_id, store=self.store)
        )
        self.sessions[session_id] = OurSession(actor, stack)
        return self.sessions[session_id]

    async def close_session(self, session_id: str) -> None:
        await self.sessions.pop(session_id).stack.aclose()

    async def aclose(self) -> None:
        for session_id in list(self.sessions)[::-1]:
            await self.close_session(session_id)
        await self.store.aclose()


async def open_memory(path: Path | None = None) -> OurBackend:
    return OurBackend(MEMORY, MemoryStore())


async def open_sqlite(path: Path | None) -> OurBackend:
    assert path is not None
    return OurBackend(SQLITE, SQLiteStore(path))
