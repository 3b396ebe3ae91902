"""The SQLite store's change feed: one cheap change check per store, shared by its watches.

SQLite has no LISTEN/NOTIFY. What it has is ``PRAGMA data_version``: a number that changes,
for one connection, whenever *another* connection (of this process or any other) commits to
the file. Reading it touches no table and costs a few microseconds.

So one thread per store, started by the first watch and ended with the last, owns one
connection of its own and asks it for ``data_version`` every ``poll`` seconds. Only when the
number moves does it read anything: the count and horizon of the sessions being watched (one
indexed read of ``nous_sessions``), and each session whose count or horizon changed since the
last look gets its new head pushed to its watches, whose event loops the thread wakes itself
(``loop.call_soon_threadsafe`` on asyncio, ``TrioToken.run_sync_soon`` on trio: the watch
objects of the PostgreSQL listener, shared). A new watch is told its session's head as the
thread first sees it, so a commit that landed between the watcher's own read and its watch is
not missed. If the connection fails, the thread opens a new one and every watch gets ``-1``
(read whatever you may have missed).

The thread only reads, through its own connection: it never holds the write lock and never
blocks the store's writer (WAL readers do not block writers). A store nobody watches starts no
thread and pays nothing. The store's own writer is another connection, so its commits reach
the watches the same way, within a poll.

A read-only store (another process's viewer) whose file has no ``-wal`` file yet has no writer
either; the thread then only checks, every poll, whether a writer has appeared, and opens its
connection once it has: a connection that opened the file as immutable would never see a
change.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import AsyncGenerator, Iterable
from contextlib import suppress
from typing import Final
from urllib.parse import quote

import anyio

from nous_session._logging import get_logger
from nous_session.stores._listener import _Watch

__all__ = ["DEFAULT_POLL", "ChangeMonitor"]

DEFAULT_POLL: Final = 0.005
"""Seconds between two change checks (``PRAGMA data_version``) of a watched SQLite store."""

# How many session names one head query binds (SQLite's default limit is 32,766 variables).
_CHUNK: Final = 500

_logger = get_logger("nous_session.sqlite")


class ChangeMonitor:
    """The change-check thread of one SQLite file, and the watches it serves.

    Args:
        path: the database file.
        poll: seconds between two change checks.
    """

    def __init__(self, path: str, poll: float) -> None:
        self._path = path
        self._poll = poll
        self._lock = threading.Lock()
        self._watches: dict[str, list[_Watch]] = {}
        self._fresh: set[str] = set()  # sessions with a watch that has not had its head yet
        self._heads: dict[str, tuple[int, int]] = {}  # (count, horizon) the thread last saw
        self._thread: threading.Thread | None = None  # None once it has decided to end
        self.checks = 0  # change checks made (for tests)
        self.reads = 0  # head reads made after a change (for tests)

    @property
    def watching(self) -> int:
        """How many watches are open."""
        with self._lock:
            return sum(len(watches) for watches in self._watches.values())

    async def watch(self, session_id: str) -> AsyncGenerator[int, None]:
        """Yield the session's head as the thread first sees it, then each new head (and
        ``-1`` after the thread had to reopen its connection)."""
        watch = _Watch(session_id)
        with self._lock:
            self._watches.setdefault(session_id, []).append(watch)
            self._fresh.add(session_id)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._serve, name="nous_session-sqlite-feed", daemon=True
                )
                self._thread.start()
        try:
            while True:
                event = None
                with self._lock:
                    heads, watch.heads = watch.heads, []
                    if not heads:
                        event = watch.event = anyio.Event()
                if event is not None:
                    await event.wait()
                    continue
                for head in heads:
                    yield head
        finally:
            with self._lock:
                watches = self._watches[session_id]
                watches.remove(watch)
                if not watches:
                    del self._watches[session_id]
                    self._heads.pop(session_id, None)
                    self._fresh.discard(session_id)

    # The thread's side ---------------------------------------------------------------------

    def _serve(self) -> None:
        # A daemon thread: it only reads, so being stopped at interpreter exit loses nothing.
        connection: sqlite3.Connection | None = None
        version: int | None = None
        try:
            while True:
                with self._lock:
                    if not self._watches:
                        self._thread = None  # a new watch starts a new thread
                        return
                    fresh, self._fresh = self._fresh, set()
                try:
                    if connection is None:
                        connection = self._open()
                        if connection is None:
                            # No writer yet (read-only, no -wal): nothing can have changed
                            # since the new watches' owners read the file.
                            time.sleep(self._poll)
                            continue
                        version = None
                    current = connection.execute("PRAGMA data_version").fetchone()[0]
                    self.checks += 1
                    if current != version:
                        reopened = version is None and bool(self._heads)
                        version = current
                        self._read_heads(connection, fresh, everyone=True, reopened=reopened)
                    elif fresh:
                        self._read_heads(connection, fresh, everyone=False, reopened=False)
                except sqlite3.Error as error:
                    _logger.debug("nous_session.sqlite_feed_lost", error=repr(error))
                    if connection is not None:
                        with suppress(sqlite3.Error):
                            connection.close()
                    connection = None
                    with self._lock:
                        self._fresh |= fresh  # they still need their heads
                time.sleep(self._poll)  # this thread's own; no event loop waits on it
        finally:
            if connection is not None:
                with suppress(sqlite3.Error):
                    connection.close()

    def _open(self) -> sqlite3.Connection | None:
        """A read-only connection to the file, or None while no writer has made its WAL."""
        path = self._path
        if not os.path.exists(f"{path}-wal"):
            return None
        connection = sqlite3.connect(
            f"file:{quote(os.path.abspath(path))}?mode=ro",
            uri=True,
            isolation_level=None,
            check_same_thread=False,
        )
        try:
            connection.execute("SELECT 1 FROM nous_sessions LIMIT 1").fetchall()
        except BaseException:
            connection.close()
            raise
        return connection

    def _read_heads(
        self,
        connection: sqlite3.Connection,
        fresh: set[str],
        *,
        everyone: bool,
        reopened: bool,
    ) -> None:
        """Read the watched sessions' heads (all, or the fresh ones) and push what moved."""
        with self._lock:
            names = list(self._watches) if everyone else [n for n in fresh if n in self._watches]
        if not names:
            return
        found = dict.fromkeys(names, (0, 0))
        for chunk in _chunks(names):
            marks = ",".join("?" * len(chunk))
            for name, count, horizon in connection.execute(
                f"SELECT name, count, horizon FROM nous_sessions WHERE name IN ({marks})",
                chunk,
            ):
                found[name] = (count, horizon)
        self.reads += 1
        with self._lock:
            for name, head in found.items():
                watches = self._watches.get(name)
                if watches is None:
                    continue  # left meanwhile
                before = self._heads.get(name)
                self._heads[name] = head
                if reopened:
                    pushed = -1
                elif name in fresh or head != before:
                    pushed = head[0] if before is None or head[1] == before[1] else -1
                else:
                    continue
                for watch in watches:
                    watch.push(pushed)


def _chunks(names: list[str]) -> Iterable[list[str]]:
    for start in range(0, len(names), _CHUNK):
        yield names[start : start + _CHUNK]
