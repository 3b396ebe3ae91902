"""The ``eventsourcing`` library: the general event-sourcing reference, POPO and SQLite.

As its docs show: a ``Conversation`` aggregate whose ``@event`` methods record domain events,
and an ``Application`` whose command method gets the aggregate from ``self.repository``, calls
the method and ``self.save()``s it, and whose query method gets it again and returns its
messages. Persistence is chosen by the documented environment: POPO by default (in memory),
``PERSISTENCE_MODULE=eventsourcing.sqlite`` with ``SQLITE_DBNAME`` for a file.

Configured in its favour, with documented options: ``AGGREGATE_CACHE_MAXSIZE`` (the repository
keeps the aggregate and only fast-forwards it with newer events, instead of replaying the whole
stream at every call) and ``DEEPCOPY_FROM_AGGREGATE_CACHE=n`` (no deep copy of the cached
aggregate per call: safe here, with one writer). Without them each call replays or copies the
whole conversation, O(n). The library is synchronous, so ``concurrent`` is False: called from
asyncio tasks, its calls run one after another.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any
from uuid import NAMESPACE_URL, UUID, uuid5

from eventsourcing.application import Application
from eventsourcing.domain import Aggregate, event

from benchmarks.peers import MEMORY, SQLITE
from nous_session import Message


class Conversation(Aggregate):
    @staticmethod
    def create_id(name: str) -> UUID:
        return uuid5(NAMESPACE_URL, f"/conversations/{name}")

    @event("Started")
    def __init__(self, name: str) -> None:
        self.name = name
        self.messages: list[dict[str, Any]] = []

    @event("MessageAdded")
    def add_message(self, message: dict[str, Any]) -> None:
        self.messages.append(message)


class Chat(Application[UUID]):
    def start(self, name: str) -> UUID:
        conversation = Conversation(name)
        self.save(conversation)
        return conversation.id

    def add_message(self, conversation_id: UUID, message: dict[str, Any]) -> None:
        conversation: Conversation = self.repository.get(conversation_id)
        conversation.add_message(message)
        self.save(conversation)

    def get_messages(self, conversation_id: UUID) -> list[dict[str, Any]]:
        conversation: Conversation = self.repository.get(conversation_id)
        return list(conversation.messages)

    def get_last_messages(self, conversation_id: UUID, k: int) -> list[dict[str, Any]]:
        conversation: Conversation = self.repository.get(conversation_id)
        return conversation.messages[-k:]


def _dict(message: Message) -> dict[str, Any]:
    out: dict[str, Any] = {"role": str(message.role), "content": message.text}
    if message.tool_calls:
        out["tool_calls"] = [
            {"id": c.id, "name": c.name, "arguments": dict(c.arguments)} for c in message.tool_calls
        ]
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
        out["name"] = message.name
    return out


class ESSession:
    def __init__(self, app: Chat, conversation_id: UUID) -> None:
        self.app = app
        self.id = conversation_id

    async def append(self, unit: dict[str, Any]) -> None:
        self.app.add_message(self.id, unit)

    async def history(self) -> Sequence[dict[str, Any]]:
        return self.app.get_messages(self.id)

    async def tail(self, k: int) -> Sequence[dict[str, Any]]:
        return self.app.get_last_messages(self.id, k)

    async def fill(self, units: Sequence[dict[str, Any]]) -> None:
        for unit in units:
            self.app.add_message(self.id, unit)


class ESBackend:
    system = "eventsourcing"
    concurrent = False

    def __init__(self, kind: str, app: Chat) -> None:
        self.kind = kind
        self.app = app

    def convert(self, message: Message) -> dict[str, Any]:
        return _dict(message)

    def entries(self, unit: Any) -> int:
        return 1

    def text(self, entry: dict[str, Any]) -> str | None:
        return entry.get("content")

    async def session(self, session_id: str) -> ESSession:
        return ESSession(self.app, self.app.start(session_id))

    async def close_session(self, session_id: str) -> None:
        pass

    async def aclose(self) -> None:
        self.app.close()


_CACHED = {"AGGREGATE_CACHE_MAXSIZE": "10000", "DEEPCOPY_FROM_AGGREGATE_CACHE": "n"}


async def open_memory(path: Path | None = None) -> ESBackend:
    return ESBackend(MEMORY, Chat(env=dict(_CACHED)))


async def open_sqlite(path: Path | None) -> ESBackend:
    assert path is not None
    env = {"PERSISTENCE_MODULE": "eventsourcing.sqlite", "SQLITE_DBNAME": str(path), **_CACHED}
    return ESBackend(SQLITE, Chat(env=env))
