"""Google ADK's session services: ``InMemorySessionService`` and ``SqliteSessionService``.

As its docs show: ``await service.create_session(app_name=..., user_id=..., session_id=...)``,
then ``await service.append_event(session, Event(...))`` for each message (what the Runner does
after each step), and ``(await service.get_session(...)).events`` for the history; the last k
events come from ``get_session(..., config=GetSessionConfig(num_recent_events=k))``.

The SQLite service is ``google.adk.sessions.sqlite_session_service.SqliteSessionService`` (the
aiosqlite one ADK ships; ``DatabaseSessionService`` needs SQLAlchemy, the ``db`` extra).

Messages: a user message is an event authored ``user`` with ``Content(role="user")``; an
assistant message an event authored by the agent with ``Content(role="model")``, with a
``function_call`` part when it calls a tool; a tool result a ``function_response`` part. ADK keeps
the system prompt in the agent, not the session: ours is stored as a user-role event authored
``system`` so every system holds the same number of messages. The ``Content`` objects are built
before timing; the ``Event`` (a fresh id and timestamp) inside ``append``, as a Runner does.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from google.adk.events import Event
from google.adk.sessions import InMemorySessionService
from google.adk.sessions.base_session_service import GetSessionConfig
from google.adk.sessions.sqlite_session_service import SqliteSessionService
from google.genai import types

from benchmarks.peers import MEMORY, SQLITE
from nous_session import Message

APP = "bench"
USER = "bench-user"
AGENT = "assistant"


def _unit(message: Message) -> tuple[str, types.Content]:
    if message.role == "tool":
        part = types.Part(
            function_response=types.FunctionResponse(
                id=message.tool_call_id, name=message.name, response={"result": message.text}
            )
        )
        return AGENT, types.Content(role="user", parts=[part])
    if message.role == "assistant":
        parts = [types.Part(text=message.text)]
        parts += [
            types.Part(
                function_call=types.FunctionCall(id=c.id, name=c.name, args=dict(c.arguments))
            )
            for c in message.tool_calls
        ]
        return AGENT, types.Content(role="model", parts=parts)
    author = "system" if message.role == "system" else "user"
    return author, types.Content(role="user", parts=[types.Part(text=message.text)])


class ADKSession:
    def __init__(self, service: Any, session: Any) -> None:
        self.service = service
        self.session = session

    async def append(self, unit: tuple[str, types.Content]) -> None:
        author, content = unit
        event = Event(author=author, invocation_id="bench", content=content)
        await self.service.append_event(self.session, event)

    async def history(self) -> Sequence[Event]:
        got = await self.service.get_session(app_name=APP, user_id=USER, session_id=self.session.id)
        return got.events  # type: ignore[no-any-return]

    async def tail(self, k: int) -> Sequence[Event]:
        got = await self.service.get_session(
            app_name=APP,
            user_id=USER,
            session_id=self.session.id,
            config=GetSessionConfig(num_recent_events=k),
        )
        return got.events  # type: ignore[no-any-return]

    async def fill(self, units: Sequence[tuple[str, types.Content]]) -> None:
        for unit in units:
            await self.append(unit)


class ADKBackend:
    system = "google-adk"
    concurrent = True

    def __init__(self, kind: str, service: Any) -> None:
        self.kind = kind
        self.service = service

    def convert(self, message: Message) -> tuple[str, types.Content]:
        return _unit(message)

    def entries(self, unit: Any) -> int:
        return 1

    def text(self, entry: Event) -> str | None:
        if entry.content is None or not entry.content.parts:
            return None
        part = entry.content.parts[0]
        if part.function_response is not None:
            return str((part.function_response.response or {}).get("result"))
        return part.text

    async def session(self, session_id: str) -> ADKSession:
        session = await self.service.create_session(
            app_name=APP, user_id=USER, session_id=session_id
        )
        return ADKSession(self.service, session)

    async def close_session(self, session_id: str) -> None:
        pass

    async def aclose(self) -> None:
        close = getattr(self.service, "close", None)
        if close is not None:
            await close()


async def open_memory(path: Path | None = None) -> ADKBackend:
    return ADKBackend(MEMORY, InMemorySessionService())


async def open_sqlite(path: Path | None) -> ADKBackend:
    assert path is not None
    return ADKBackend(SQLITE, SqliteSessionService(str(path)))
