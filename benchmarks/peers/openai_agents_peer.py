"""The OpenAI Agents SDK's ``agents.SQLiteSession``, in memory and on a file.

As its docs show: ``SQLiteSession(session_id)`` (in memory) or ``SQLiteSession(session_id,
db_path)``; ``await session.add_items(items)`` appends, ``await session.get_items()`` is the
history the runner prepends to the next model call, ``get_items(limit=k)`` the last k.

Messages are Responses-API input items: ``{"role", "content"}`` for system/user/assistant text;
an assistant message that calls a tool is its text item plus a ``function_call`` item, added in
one ``add_items`` call; a tool result is a ``function_call_output`` item.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agents import SQLiteSession

from benchmarks.peers import MEMORY, SQLITE
from nous_session import Message


def _item(message: Message) -> list[dict[str, Any]]:
    if message.role == "tool":
        return [
            {
                "type": "function_call_output",
                "call_id": message.tool_call_id,
                "output": message.text,
            }
        ]
    items: list[dict[str, Any]] = [{"role": message.role, "content": message.text}]
    for call in message.tool_calls:
        arguments = call.arguments
        items.append(
            {
                "type": "function_call",
                "call_id": call.id,
                "name": call.name,
                "arguments": (
                    arguments if isinstance(arguments, str) else json.dumps(dict(arguments))
                ),
            }
        )
    return items


class OpenAISession:
    def __init__(self, session: SQLiteSession) -> None:
        self.session = session

    async def append(self, unit: list[dict[str, Any]]) -> None:
        await self.session.add_items(unit)

    async def history(self) -> Sequence[Any]:
        return await self.session.get_items()

    async def tail(self, k: int) -> Sequence[Any]:
        return await self.session.get_items(limit=k)

    async def fill(self, units: Sequence[list[dict[str, Any]]]) -> None:
        await self.session.add_items([item for unit in units for item in unit])


class OpenAIBackend:
    system = "openai-agents"
    concurrent = True

    def __init__(self, kind: str, path: Path | None) -> None:
        self.kind = kind
        self.path = path
        self.sessions: dict[str, SQLiteSession] = {}

    def convert(self, message: Message) -> list[dict[str, Any]]:
        return _item(message)

    def entries(self, unit: list[dict[str, Any]]) -> int:
        return len(unit)

    def text(self, entry: dict[str, Any]) -> str | None:
        if "content" in entry:
            return str(entry["content"])
        if "output" in entry:
            return str(entry["output"])
        return None

    async def session(self, session_id: str) -> OpenAISession:
        if self.path is None:
            session = SQLiteSession(session_id)
        else:
            session = SQLiteSession(session_id, str(self.path))
        self.sessions[session_id] = session
        return OpenAISession(session)

    async def close_session(self, session_id: str) -> None:
        self.sessions.pop(session_id).close()

    async def aclose(self) -> None:
        for session_id in list(self.sessions):
            await self.close_session(session_id)


async def open_memory(path: Path | None = None) -> OpenAIBackend:
    return OpenAIBackend(MEMORY, None)


async def open_sqlite(path: Path | None) -> OpenAIBackend:
    assert path is not None
    return OpenAIBackend(SQLITE, path)
