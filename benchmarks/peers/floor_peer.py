"""The floor: no session library at all, only what any store that keeps the disk off the event
loop must do. A reference measured beside the peers, never counted as one.

On a SQLite file (WAL, ``synchronous=FULL``, as ours), through
:class:`benchmarks.floors.RawThread`: one long-lived thread owns the connection; an append is
one row in one ``BEGIN IMMEDIATE`` / ``INSERT`` / ``COMMIT``, handed over through a
``queue.SimpleQueue`` and awaited through an asyncio future woken with
``loop.call_soon_threadsafe``. No actor, no log, no validation, no conflict check, no session
row: one page written per commit where a real store writes two or more. A read of the last k
is the same hop and one ``SELECT ... ORDER BY seq DESC LIMIT k`` with the rows decoded.

So any system that keeps the disk off the event loop (ours; the openai-agents SDK, which
runs each call in a worker thread) can at best match it; a system that blocks its caller on
the disk (eventsourcing's synchronous API) is not bound by it. Messages are converted to
their JSON bytes before the clock starts, as every peer's are.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from benchmarks.floors import RawThread
from benchmarks.peers import SQLITE
from nous_session import Message


def _history(connection: sqlite3.Connection, sid: str) -> list[Any]:
    rows = connection.execute("SELECT record FROM nous_events WHERE sid = ? ORDER BY seq", (sid,))
    return [orjson.loads(record) for (record,) in rows]


def _tail(connection: sqlite3.Connection, where: tuple[str, int]) -> list[Any]:
    rows = connection.execute(
        "SELECT record FROM nous_events WHERE sid = ? ORDER BY seq DESC LIMIT ?", where
    ).fetchall()
    return [orjson.loads(record) for (record,) in reversed(rows)]


class FloorSession:
    def __init__(self, thread: RawThread, session_id: str) -> None:
        self.thread = thread
        self.session_id = session_id
        self.seq = 0

    async def append(self, unit: bytes) -> None:
        await self.thread.insert((self.session_id, self.seq, unit))
        self.seq += 1

    async def history(self) -> Sequence[Any]:
        result: list[Any] = await self.thread.run(_history, self.session_id)
        return result

    async def tail(self, k: int) -> Sequence[Any]:
        result: list[Any] = await self.thread.run(_tail, (self.session_id, k))
        return result

    async def fill(self, units: Sequence[bytes]) -> None:
        for unit in units:
            await self.append(unit)


class FloorBackend:
    system = "floor"
    concurrent = True

    def __init__(self, path: Path) -> None:
        self.kind = SQLITE
        self.thread = RawThread(path)
        self.sessions: dict[str, FloorSession] = {}

    def convert(self, message: Message) -> bytes:
        return orjson.dumps({"role": str(message.role), **message.to_json()})

    def entries(self, unit: Any) -> int:
        return 1

    def text(self, entry: dict[str, Any]) -> str | None:
        parts = entry.get("content")
        if isinstance(parts, str):
            return parts
        if isinstance(parts, list):
            return "".join(str(part.get("text", "")) for part in parts if isinstance(part, dict))
        return None

    async def session(self, session_id: str) -> FloorSession:
        self.sessions[session_id] = FloorSession(self.thread, session_id)
        return self.sessions[session_id]

    async def close_session(self, session_id: str) -> None:
        self.sessions.pop(session_id, None)

    async def aclose(self) -> None:
        self.sessions.clear()
        self.thread.close()


async def open_sqlite(path: Path | None) -> FloorBackend:
    assert path is not None
    return FloorBackend(path)
