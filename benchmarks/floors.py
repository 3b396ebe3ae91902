"""The floors the suites measure beside ours: the same work with no library, only what any
design that keeps the disk off the event loop must do (see the README's "How numbers are
taken"). One copy of each, shared by the ``engine`` and ``many`` suites and the peers' ``floor``
reference system.

* :func:`raw_connection`: a plain ``sqlite3`` connection (WAL, ``synchronous=FULL``) with one
  ``nous_events (sid, seq, record)`` table.
* :class:`RawThread`: one long-lived thread owns such a connection and runs one job at a time,
  handed over through a ``queue.SimpleQueue`` and answered through an asyncio future woken with
  ``loop.call_soon_threadsafe``; :meth:`RawThread.insert` is a one-row transaction
  (:func:`insert_row_and_count` the same with a session count moved beside it).
* :class:`GroupThread`: the same thread committing every row queued in one transaction (on
  SQLite; :func:`postgres_group` makes one for PostgreSQL: the count check, the rows, one
  round trip).
* :class:`Relay`: an actor's shape and nothing else: a server task per session, a deque, a
  parked future and an answer future; each item appended to a list, optionally after awaiting
  a write of it.
"""

from __future__ import annotations

import asyncio
import queue
import sqlite3
import threading
from collections import deque
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

__all__ = [
    "GroupThread",
    "RawThread",
    "Relay",
    "Row",
    "insert_only",
    "insert_row",
    "insert_row_and_count",
    "postgres_floor_tables",
    "postgres_group",
    "raw_connection",
]

Row = tuple[Any, int, bytes]
"""(session, seq, record): one row of the floors' table."""

_Job = Callable[[sqlite3.Connection, Any], Any]


def raw_connection(path: Path) -> sqlite3.Connection:
    """A plain connection to ``path`` in WAL mode at ``synchronous=FULL``, with the tables
    (``nous_events``, and ``nous_counts`` for :func:`insert_row_and_count`)."""
    connection = sqlite3.connect(path, isolation_level=None)
    if connection.execute("PRAGMA journal_mode=WAL").fetchone()[0] != "wal":
        raise RuntimeError(f"{path}: the floor's file is not in WAL mode")
    connection.execute("PRAGMA synchronous=FULL")
    connection.execute(
        "CREATE TABLE IF NOT EXISTS nous_events (sid NOT NULL, seq INTEGER NOT NULL,"
        " record BLOB NOT NULL, PRIMARY KEY (sid, seq)) WITHOUT ROWID"
    )
    connection.execute(
        "CREATE TABLE IF NOT EXISTS nous_counts (sid PRIMARY KEY, count INTEGER NOT NULL)"
    )
    return connection


def insert_row(connection: sqlite3.Connection, row: Row) -> None:
    """One row in a transaction of its own."""
    connection.execute("BEGIN IMMEDIATE")
    connection.execute("INSERT INTO nous_events VALUES (?, ?, ?)", row)
    connection.execute("COMMIT")


def insert_only(connection: sqlite3.Connection, row: Row) -> None:
    """One row in the caller's transaction: :func:`insert_row` for a thread that owns the
    transaction itself (``nous_session``'s SQLite writer)."""
    connection.execute("INSERT INTO nous_events VALUES (?, ?, ?)", row)


def insert_row_and_count(connection: sqlite3.Connection, row: Row) -> None:
    """One row and its session's count, in a transaction of its own: what a store that keeps
    a session row (its count, for the conflict check) writes per commit at least, a second
    page."""
    connection.execute("BEGIN IMMEDIATE")
    connection.execute("INSERT INTO nous_events VALUES (?, ?, ?)", row)
    connection.execute(
        "INSERT INTO nous_counts VALUES (?, ?)"
        " ON CONFLICT (sid) DO UPDATE SET count = excluded.count WHERE count = ?",
        (row[0], row[1] + 1, row[1]),
    )
    connection.execute("COMMIT")


def _answer(future: asyncio.Future[Any], result: Any) -> None:
    if not future.done():
        future.set_result(result)


def _fail(future: asyncio.Future[Any], error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)


def _answer_all(futures: list[asyncio.Future[None]]) -> None:
    for future in futures:
        _answer(future, None)


class RawThread:
    """One thread, one raw connection, jobs run one at a time: the floor of a store's round trip
    to its disk thread."""

    def __init__(self, path: Path) -> None:
        self._jobs: queue.SimpleQueue[tuple[_Job, Any, asyncio.Future[Any]] | None]
        self._jobs = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, args=(path,), daemon=True)
        self._thread.start()

    def _serve(self, path: Path) -> None:
        connection = raw_connection(path)
        while (item := self._jobs.get()) is not None:
            job, argument, future = item
            try:
                result = job(connection, argument)
            except BaseException as error:  # handed to the awaiting task
                future.get_loop().call_soon_threadsafe(_fail, future, error)
            else:
                future.get_loop().call_soon_threadsafe(_answer, future, result)
        connection.close()

    async def run(self, job: _Job, argument: Any = None) -> Any:
        """``job(connection, argument)`` in the thread; its result (or its error)."""
        future = asyncio.get_running_loop().create_future()
        self._jobs.put((job, argument, future))
        return await future

    async def insert(self, row: Row) -> None:
        """``row`` in a one-row transaction."""
        await self.run(insert_row, row)

    def close(self) -> None:
        self._jobs.put(None)
        self._thread.join()


class GroupThread:
    """The floor of group commit: one thread takes every row queued, writes them in one
    transaction and wakes all their futures with one ``loop.call_soon_threadsafe``.

    Args:
        path: a SQLite file (:func:`raw_connection`; one ``executemany`` per transaction), or
            None with ``connect`` and ``write`` given.
        connect: opens the thread's connection (called in the thread).
        write: ``write(connection, rows)`` commits ``rows`` in one transaction.
    """

    def __init__(
        self,
        path: Path | None = None,
        *,
        connect: Callable[[], Any] | None = None,
        write: Callable[[Any, list[Row]], None] | None = None,
    ) -> None:
        if path is not None:
            connect, write = lambda: raw_connection(path), _insert_rows
        if connect is None or write is None:
            raise ValueError("GroupThread needs a path, or connect and write")
        self._rows: queue.SimpleQueue[tuple[Row, asyncio.Future[None]] | None]
        self._rows = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, args=(connect, write), daemon=True)
        self._thread.start()

    def _serve(self, connect: Callable[[], Any], write: Callable[[Any, list[Row]], None]) -> None:
        connection = connect()
        while (first := self._rows.get()) is not None:
            taken = [first]
            stop = False
            while not self._rows.empty():
                item = self._rows.get_nowait()
                if item is None:
                    stop = True
                    break
                taken.append(item)
            write(connection, [row for row, _ in taken])
            futures = [future for _, future in taken]
            futures[0].get_loop().call_soon_threadsafe(_answer_all, futures)
            if stop:
                break
        connection.close()

    async def insert(self, row: Row) -> None:
        future = asyncio.get_running_loop().create_future()
        self._rows.put((row, future))
        await future

    def close(self) -> None:
        self._rows.put(None)
        self._thread.join()


def _insert_rows(connection: sqlite3.Connection, rows: list[Row]) -> None:
    connection.execute("BEGIN IMMEDIATE")
    connection.executemany("INSERT INTO nous_events VALUES (?, ?, ?)", rows)
    connection.execute("COMMIT")


def postgres_group(url: str, schema: str) -> GroupThread:
    """The floor of a PostgreSQL group commit, in ``schema``: per transaction, one statement
    that moves each row's session count (only from the count the row expects, as a store's
    conflict check does) and one that inserts the rows (two ``unnest`` arrays), pipelined,
    then COMMIT. No log, no store, no notification. Run :func:`postgres_floor_tables` first.
    """
    import psycopg

    def connect() -> Any:
        return psycopg.connect(url, autocommit=True)

    def write(connection: Any, rows: list[Row]) -> None:
        with connection.pipeline(), connection.transaction():
            connection.execute(
                f"UPDATE {schema}.floor_sessions AS s SET count = r.seq + 1"
                " FROM unnest(%s::text[], %s::bigint[]) AS r (name, seq)"
                " WHERE s.name = r.name AND s.count = r.seq",
                ([row[0] for row in rows], [row[1] for row in rows]),
            )
            connection.execute(
                f"INSERT INTO {schema}.floor_events"
                " SELECT * FROM unnest(%s::text[], %s::bigint[], %b::bytea[])",
                ([row[0] for row in rows], [row[1] for row in rows], [row[2] for row in rows]),
            )

    return GroupThread(connect=connect, write=write)


def postgres_floor_tables(url: str, schema: str, sessions: list[str]) -> None:
    """The floor's two tables in ``schema`` (made if missing), with a row per session."""
    import psycopg

    with psycopg.connect(url) as connection:  # one transaction, committed on leaving
        # Processes making the tables at once would collide in the catalog: one at a time.
        connection.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (schema,))
        connection.execute(
            f"CREATE TABLE IF NOT EXISTS {schema}.floor_sessions"
            " (name text PRIMARY KEY, count bigint NOT NULL)"
        )
        connection.execute(
            f"CREATE TABLE IF NOT EXISTS {schema}.floor_events (session text NOT NULL,"
            " seq bigint NOT NULL, record bytea NOT NULL, PRIMARY KEY (session, seq))"
        )
        connection.execute(
            f"INSERT INTO {schema}.floor_sessions SELECT unnest(%s::text[]), 0",
            (sessions,),
        )


class Relay:
    """An actor's shape and nothing else: the caller queues an item in a deque and waits on a
    future; the server task (:meth:`serve`, parked on a future while the deque is empty) takes
    what is queued and, for each item, awaits ``write(item)`` if given, appends it to
    :attr:`log` and answers the caller with the log's length.

    Args:
        write: how an item reaches the disk (None: it stays in memory).
    """

    __slots__ = ("log", "parked", "queue", "write")

    def __init__(self, write: Callable[[Any], Awaitable[None]] | None = None) -> None:
        self.write = write
        self.queue: deque[tuple[Any, asyncio.Future[int]]] = deque()
        self.parked: asyncio.Future[None] | None = None
        self.log: list[Any] = []

    async def serve(self) -> None:
        loop = asyncio.get_running_loop()
        queue, log, write = self.queue, self.log, self.write
        while True:
            if not queue:
                parked = self.parked = loop.create_future()
                await parked
                self.parked = None
            batch = list(queue)
            queue.clear()
            for item, answer in batch:
                if write is not None:
                    await write(item)
                log.append(item)
                answer.set_result(len(log))

    async def call(self, item: Any) -> int:
        answer: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.queue.append((item, answer))
        parked = self.parked
        if parked is not None:
            self.parked = None
            parked.set_result(None)
        return await answer
