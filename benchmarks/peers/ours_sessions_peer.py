"""Ours through a :class:`~nous_session.registry.Sessions` registry, the way a bot or a server
uses it: ``actor = await sessions.get(id)`` before every append, the registry keeping the actors
open (never counted as a peer; the row shows what the registry's lookup adds to ``ours``).

Memory: a ``MemoryStore``; SQLite: ``SQLiteStore(path)`` with its default durability
(``synchronous="FULL"``), one registry per backend over that one store.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AsyncExitStack
from pathlib import Path

from benchmarks.peers import MEMORY, SQLITE
from benchmarks.peers.ours import OurBackend
from nous_session import MemoryStore, Message, Store
from nous_session.registry import Sessions
from nous_session.stores.sqlite import SQLiteStore


class RegistrySession:
    def __init__(self, registry: Sessions, session_id: str) -> None:
        self.registry = registry
        self.session_id = session_id

    async def append(self, unit: Message) -> None:
        actor = await self.registry.get(self.session_id)
        await actor.add_message(unit)

    async def history(self) -> Sequence[Message]:
        return (await self.registry.get(self.session_id)).messages()

    async def tail(self, k: int) -> Sequence[Message]:
        return (await self.registry.get(self.session_id)).messages()[-k:]

    async def fill(self, units: Sequence[Message]) -> None:
        for unit in units:
            await self.append(unit)


class RegistryBackend(OurBackend):
    system = "ours-sessions"

    def __init__(self, kind: str, store: Store) -> None:
        super().__init__(kind, store)
        self.stack = AsyncExitStack()
        self.registry: Sessions | None = None
        self.opened: set[str] = set()

    async def session(self, session_id: str) -> RegistrySession:  # type: ignore[override]
        if self.registry is None:
            self.registry = await self.stack.enter_async_context(Sessions(self.store))
        await self.registry.get(session_id)  # opened before the clock, as ours' actors are
        self.opened.add(session_id)
        return RegistrySession(self.registry, session_id)

    async def close_session(self, session_id: str) -> None:
        self.opened.discard(session_id)  # the registry closes its actors when it closes

    async def aclose(self) -> None:
        await self.stack.aclose()
        await self.store.aclose()


async def open_memory(path: Path | None = None) -> RegistryBackend:
    return RegistryBackend(MEMORY, MemoryStore())


async def open_sqlite(path: Path | None) -> RegistryBackend:
    assert path is not None
    return RegistryBackend(SQLITE, SQLiteStore(path))
