"""The floor: no session library at all, only what any store that keeps the disk off the event
loop must do. A reference measured beside the peers, never counted as one.

On a SQLite file (WAL, ``synchronous=FULL``, as ours): one long-lived thread owns the
connection; an append is one row in one ``BEGIN IMMEDIATE`` / ``INSERT`` / ``COMMIT``,
handed over through a ``queue.SimpleQueue`` and awaited through an asyncio future woken with
``loop.call_soon_threadsafe``. No actor, no log, no validation, no conflict check, no session
row: one page written per commit where a real store writes two or more. A read of the last k
is the same hop and one ``SELECT ... ORDER BY seq DESC LIMIT k`` with the rows decoded.

So any system that keeps the disk off the event loop (ours; the openai-agents SDK, which
runs each call in a worker thread) can at best match it; a system that blocks its caller on
the disk (eventsourcing's synchronous API) is not bound by it. Messages are converted to
their JSON bytes before the clock starts, as every peer's are.
"""

from __future__ import annotations

import asyncio
import queue
import sqlite3
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import orjson

from benchmarks.peers import SQLITE
from nous_session import Message

_Job = Callable[[sqlite3.Connection], Any]


class _Thread:
    """One thread, one connection, jobs in through a SimpleQueue, answers out through futures."""

    def __init__(self, path: Path) -> None:
        self._jobs: queue.SimpleQueue[tuple[_Job, asyncio.Future[Any]] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, args=(path,), daemon=True)
        self._thread.start()

    def _serve(self, path: Path) -> None:
        connection = sqlite3.connect(path, isolation_level=None)
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute("PRAGMA synchronous=FULL")
        connection.execute(
            "CREATE TABLE IF NOT EXISTS floor_events (sid TEXT NOT NULL, seq INTEGER NOT NULL,"
            " record BLOB NOT NULL, PRIMARY KEY (sid, seq)) WITHOUT ROWID"
        )
        while (item := self._jobs.get()) is not None:
            job, future = item
            try:
                result = job(connection)
            except BaseException as error:  # handed to the awaiting task
                future.get_loop().call_soon_threadsafe(_fail, future, error)
            else:
                future.get_loop().call_soon_threadsafe(_answer, future, result)
        connection.close()

    async def run(self, job: _Job) -> Any:
        future = asyncio.get_running_loop().create_future()
        self._jobs.put((job, future))
        return await future

    def close(self) -> None:
        self._jobs.put(None)
        self._thread.join()


def _answer(future: asyncio.Future[Any], result: Any) -> None:
    if not future.done():
        future.set_result(result)


def _fail(future: asyncio.Future[Any], error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)


class FloorSession:
    def __init__(self, thread: _Thread, session_id: str) -> None:
        self.thread = thread
        self.session_id = session_id
        self.seq = 0

    async def append(self, unit: bytes) -> None:
        row = (self.session_id, self.seq, unit)

        def insert(connection: sqlite3.Connection) -> None:
            connection.execute("BEGIN IMMEDIATE")
            connection.execute("INSERT INTO floor_events VALUES (?, ?, ?)", row)
            connection.execute("COMMIT")

        await self.thread.run(insert)
        self.seq += 1

    async def history(self) -> Sequence[Any]:
        sid = self.session_id

        def read(connection: sqlite3.Connection) -> list[Any]:
            rows = connection.execute(
                "SELECT record FROM floor_events WHERE sid = ? ORDER BY seq", (sid,)
            )
            return [orjson.loads(record) for (record,) in rows]

        result: list[Any] = await self.thread.run(read)
        return result

    async def tail(self, k: int) -> Sequence[Any]:
        sid = self.session_id

        def read(connection: sqlite3.Connection) -> list[Any]:
            rows = connection.execute(
                "SELECT record FROM floor_events WHERE sid = ? ORDER BY seq DESC LIMIT ?",
                (sid, k),
            ).fetchall()
            return [orjson.loads(record) for (record,) in reversed(rows)]

        result: list[Any] = await self.thread.run(read)
        return result

    async def fill(self, units: Sequence[bytes]) -> None:
        for unit in units:
            await self.append(unit)


class FloorBackend:
    system = "floor"
    concurrent = True

    def __init__(self, path: Path) -> None:
        self.kind = SQLITE
        self.thread = _Thread(path)
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
