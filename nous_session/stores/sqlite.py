"""SQLiteStore: the embedded default, on the standard library's sqlite3.

Every database call runs in a worker thread (``anyio.to_thread.run_sync``) behind a capacity
limiter of one, so the store works on asyncio and trio alike and the event loop never blocks on
disk. The file is in WAL mode, holds many sessions, and records its schema version so later
versions can migrate it.

Durability: ``synchronous="FULL"`` (the default) makes SQLite fsync the WAL at every commit, so
an acknowledged event survives power loss; ``"NORMAL"`` survives a crash of the process but may
lose the last commits on power loss, and is much faster on slow disks.

Schema (version 1)::

    nous_schema   (version)
    nous_sessions (id INTEGER PRIMARY KEY, name TEXT UNIQUE, count, held)
    nous_events   (sid, seq, record BLOB, PRIMARY KEY (sid, seq)) WITHOUT ROWID

Session ids are always bound as parameters, never formatted into SQL.
"""

from __future__ import annotations

import os
import sqlite3
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Final, Literal, TypeVar

import anyio
import anyio.to_thread
import attrs

from nous_session.codec import decode_rows, encode
from nous_session.errors import ConflictError, StoreError
from nous_session.event import Event
from nous_session.stores.base import (
    Rebased,
    SessionInfo,
    check_commit_arguments,
    check_rebase_arguments,
    moved,
    place,
)

__all__ = ["SCHEMA_VERSION", "SQLiteStore"]

SCHEMA_VERSION: Final = 1
"""The schema this version writes; older files are migrated on open, newer ones refused."""

T = TypeVar("T")
Synchronous = Literal["FULL", "NORMAL", "OFF", "EXTRA"]

# _MIGRATIONS[v] takes a file from schema version v to v + 1.
_MIGRATIONS: Final[dict[int, tuple[str, ...]]] = {
    0: (
        """CREATE TABLE nous_sessions (
               id    INTEGER PRIMARY KEY,
               name  TEXT NOT NULL UNIQUE,
               count INTEGER NOT NULL,
               held  INTEGER NOT NULL
           )""",
        """CREATE TABLE nous_events (
               sid    INTEGER NOT NULL REFERENCES nous_sessions (id),
               seq    INTEGER NOT NULL,
               record BLOB NOT NULL,
               PRIMARY KEY (sid, seq)
           ) WITHOUT ROWID""",
    ),
}


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


@contextmanager
def _errors(what: str) -> Iterator[None]:
    """Translate sqlite3's errors, in the one place this store does it.

    A clash on a primary key (another writer holds one of these seqs) is a ConflictError;
    any other sqlite3 error a StoreError that says what failed (``what``) and why.
    """
    try:
        yield
    except sqlite3.IntegrityError as error:
        raise ConflictError(
            f"{what}: another writer holds one of these seqs ({_describe(error)})"
        ) from error
    except sqlite3.Error as error:
        raise StoreError(f"{what}: {_describe(error)}") from error


@attrs.define
class SQLiteStore:
    """Sessions in one SQLite file.

    Args:
        path: the database file (created, with its parent directory, if missing), or
            ``":memory:"`` for a private in-memory database.
        synchronous: SQLite's durability setting; ``"FULL"`` by default (see the module doc).
        busy_timeout: seconds to wait for another process's write lock before a commit fails
            with :class:`StoreError`.

    The connection opens on first use. Close the store with :meth:`aclose` (or ``async
    with``); a store garbage-collected while open warns with :class:`ResourceWarning`.
    """

    path: str = attrs.field(converter=os.fspath)
    synchronous: Synchronous = attrs.field(default="FULL", kw_only=True)
    busy_timeout: float = attrs.field(default=5.0, kw_only=True)
    _connection: sqlite3.Connection | None = attrs.field(default=None, init=False)
    _limiter: anyio.CapacityLimiter | None = attrs.field(default=None, init=False)
    _closed: bool = attrs.field(default=False, init=False)

    def __attrs_post_init__(self) -> None:
        if self.synchronous not in ("FULL", "NORMAL", "OFF", "EXTRA"):
            raise ValueError(
                f"synchronous must be FULL, NORMAL, OFF or EXTRA, got {self.synchronous!r}"
            )
        if isinstance(self.busy_timeout, bool) or not isinstance(self.busy_timeout, int | float):
            raise ValueError(f"busy_timeout must be a number of seconds, got {self.busy_timeout!r}")

    @property
    def url(self) -> str:
        """The store's URL, as :func:`~nous_session.stores.open_store` takes it."""
        if self.path == ":memory:":
            return "sqlite:///:memory:"
        return f"sqlite:///{self.path}"

    # Plumbing ---------------------------------------------------------------------------------

    async def _run(self, function: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``function(connection)`` in a worker thread, one at a time."""
        if self._closed:
            raise StoreError(f"the store {self.url} is closed")
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(1)
        return await anyio.to_thread.run_sync(self._call, function, limiter=self._limiter)

    def _call(self, function: Callable[[sqlite3.Connection], T]) -> T:
        if self._closed:  # closed while this call waited for the limiter
            raise StoreError(f"the store {self.url} is closed")
        if self._connection is None:
            self._connection = self._connect()
        return function(self._connection)

    def _connect(self) -> sqlite3.Connection:
        try:
            if self.path != ":memory:":
                Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise StoreError(f"cannot open {self.path}: {_describe(error)}") from error
        with _errors(f"cannot open {self.path}"):
            connection = sqlite3.connect(
                self.path,
                timeout=self.busy_timeout,
                isolation_level=None,  # we issue BEGIN/COMMIT ourselves
                check_same_thread=False,  # worker threads take turns behind the limiter
            )
        try:
            with _errors(f"cannot open {self.path}"):
                connection.execute("PRAGMA journal_mode=WAL")
                connection.execute(f"PRAGMA synchronous={self.synchronous}")
            _migrate(connection, self.path)
        except BaseException:
            connection.close()
            raise
        return connection

    # The Store protocol -----------------------------------------------------------------------

    async def load(self, session_id: str, *, since: int = 0) -> Sequence[Event]:
        """The session's held events with seq >= ``since``, in seq order.

        Raises:
            CorruptRecordError: a row cannot be decoded (the error names session and seq).
            StoreError: the file cannot be read.
        """
        _check_since(since)

        def load(connection: sqlite3.Connection) -> list[Event]:
            with _errors(f"cannot read session {session_id!r} from {self.path}"):
                rows = connection.execute(
                    "SELECT e.seq, e.record FROM nous_events e JOIN nous_sessions s ON s.id = e.sid"
                    " WHERE s.name = ? AND e.seq >= ? ORDER BY e.seq",
                    (session_id, since),
                ).fetchall()
            return decode_rows(rows, place(session_id, self.path))

        return await self._run(load)

    async def commit(
        self,
        session_id: str,
        *,
        expected_count: int,
        events: Sequence[Event],
        dropped: Sequence[int] = (),
    ) -> None:
        """Insert ``events`` and delete ``dropped`` in one transaction, durable on return.

        Raises:
            ConflictError: the stored count is not ``expected_count``; nothing was written.
            StoreError: SQLite failed (disk full, read-only file, locked database, ...);
                nothing was written.
        """
        rows = check_commit_arguments(session_id, expected_count, events, dropped)

        def commit(connection: sqlite3.Connection) -> None:
            records = [(event.seq, encode(event)) for event in rows]
            with (
                _errors(f"commit to session {session_id!r} in {self.path} failed"),
                _transaction(connection),
            ):
                _commit(connection, session_id, expected_count, records, dropped)

        await self._run(commit)

    async def commit_rebased(
        self, session_id: str, *, expected_count: int, events: Sequence[Event]
    ) -> Rebased:
        """Append ``events`` after the session's current count (see :class:`RebasingStore`).

        One transaction under SQLite's write lock: read the count and what other writers
        stored since ``expected_count``, insert the events after it, commit.

        Raises:
            ConflictError: the stored count is below ``expected_count``; nothing was written.
            CorruptRecordError: another writer's record cannot be decoded; nothing was written.
            StoreError: SQLite failed; nothing was written.
        """
        rows = check_rebase_arguments(session_id, expected_count, events)

        def commit(connection: sqlite3.Connection) -> Rebased:
            with (
                _errors(f"commit to session {session_id!r} in {self.path} failed"),
                _transaction(connection),
            ):
                row = connection.execute(
                    "SELECT id, count FROM nous_sessions WHERE name = ?", (session_id,)
                ).fetchone()
                stored = 0 if row is None else row[1]
                if stored < expected_count:
                    raise ConflictError(
                        f"session {session_id!r} has count {stored},"
                        f" below the expected {expected_count}"
                    )
                shift = stored - expected_count
                others: list[Event] = []
                if shift:
                    others = decode_rows(
                        connection.execute(
                            "SELECT seq, record FROM nous_events WHERE sid = ? AND seq >= ?"
                            " ORDER BY seq",
                            (row[0], expected_count),
                        ).fetchall(),
                        place(session_id, self.path),
                    )
                placed = moved(rows, shift) if shift else rows
                records = [(event.seq, encode(event)) for event in placed]
                _commit(connection, session_id, stored, records, ())
            return Rebased(shift, others, placed)

        return await self._run(commit)

    async def sessions(self) -> list[SessionInfo]:
        """Every session with a nonzero count, by id."""

        def sessions(connection: sqlite3.Connection) -> list[SessionInfo]:
            with _errors(f"cannot list sessions in {self.path}"):
                rows = connection.execute(
                    "SELECT name, count, held FROM nous_sessions WHERE count > 0 ORDER BY name"
                ).fetchall()
            return [SessionInfo(name, count, held) for name, count, held in rows]

        return await self._run(sessions)

    async def delete(self, session_id: str) -> bool:
        """Delete a session and all its events; True when it existed."""

        def delete(connection: sqlite3.Connection) -> bool:
            with _errors(f"cannot delete session {session_id!r}"), _transaction(connection):
                row = connection.execute(
                    "SELECT id FROM nous_sessions WHERE name = ?", (session_id,)
                ).fetchone()
                if row is not None:
                    connection.execute("DELETE FROM nous_events WHERE sid = ?", row)
                    connection.execute("DELETE FROM nous_sessions WHERE id = ?", row)
            return row is not None

        return await self._run(delete)

    async def vacuum(self) -> None:
        """Give the space of deleted events back to the file system (after a snapshot)."""

        def vacuum(connection: sqlite3.Connection) -> None:
            with _errors(f"cannot vacuum {self.path}"):
                connection.execute("VACUUM")
                connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")

        await self._run(vacuum)

    async def aclose(self) -> None:
        """Close the connection. Idempotent."""
        if self._closed:
            return
        self._closed = True
        connection, self._connection = self._connection, None
        if connection is not None:
            if self._limiter is None:
                connection.close()
            else:
                # Wait for the call in flight (if any) before closing under it.
                await anyio.to_thread.run_sync(connection.close, limiter=self._limiter)

    async def __aenter__(self) -> SQLiteStore:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __del__(self) -> None:
        connection = getattr(self, "_connection", None)
        if connection is not None:
            warnings.warn(
                f"SQLiteStore({self.path!r}) was not closed; call aclose()",
                ResourceWarning,
                stacklevel=2,
                source=self,
            )
            connection.close()


def _check_since(since: object) -> None:
    if not isinstance(since, int) or isinstance(since, bool) or since < 0:
        raise ValueError(f"since must be an int >= 0, got {since!r}")


@contextmanager
def _transaction(connection: sqlite3.Connection) -> Iterator[None]:
    """BEGIN IMMEDIATE (take the write lock now), then COMMIT, or ROLLBACK on any error."""
    connection.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        if connection.in_transaction:
            connection.execute("ROLLBACK")
        raise
    connection.execute("COMMIT")


def _migrate(connection: sqlite3.Connection, path: str) -> None:
    with _errors(f"cannot open {path} as a nous_session store"), _transaction(connection):
        connection.execute("CREATE TABLE IF NOT EXISTS nous_schema (version INTEGER NOT NULL)")
        rows = connection.execute("SELECT version FROM nous_schema").fetchall()
        if len(rows) > 1:
            raise StoreError(f"{path}: nous_schema holds {len(rows)} rows; expected one")
        version = rows[0][0] if rows else 0
        if not isinstance(version, int) or version < 0:
            raise StoreError(f"{path}: unreadable schema version {version!r}")
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"{path} has schema version {version}, newer than this nous_session "
                f"understands ({SCHEMA_VERSION}); upgrade nous_session to open it"
            )
        for step in range(version, SCHEMA_VERSION):
            for statement in _MIGRATIONS[step]:
                connection.execute(statement)
        if not rows:
            connection.execute("INSERT INTO nous_schema (version) VALUES (?)", (SCHEMA_VERSION,))
        elif version != SCHEMA_VERSION:
            connection.execute("UPDATE nous_schema SET version = ?", (SCHEMA_VERSION,))


def _commit(
    connection: sqlite3.Connection,
    session_id: str,
    expected_count: int,
    records: list[tuple[int, bytes]],
    dropped: Sequence[int],
) -> None:
    row = connection.execute(
        "SELECT id, count FROM nous_sessions WHERE name = ?", (session_id,)
    ).fetchone()
    stored = 0 if row is None else row[1]
    if stored != expected_count:
        raise ConflictError(
            f"session {session_id!r} has count {stored}, expected {expected_count}:"
            " another writer committed first"
        )
    if row is None:
        sid = connection.execute(
            "INSERT INTO nous_sessions (name, count, held) VALUES (?, 0, 0)", (session_id,)
        ).lastrowid
    else:
        sid = row[0]
    deleted = 0
    if dropped:
        before = connection.total_changes
        connection.executemany(
            "DELETE FROM nous_events WHERE sid = ? AND seq = ?", [(sid, seq) for seq in dropped]
        )
        deleted = connection.total_changes - before
    if records:
        connection.executemany(
            "INSERT INTO nous_events (sid, seq, record) VALUES (?, ?, ?)",
            [(sid, seq, record) for seq, record in records],
        )
    count = records[-1][0] + 1 if records else stored
    connection.execute(
        "UPDATE nous_sessions SET count = ?, held = held + ? WHERE id = ?",
        (count, len(records) - deleted, sid),
    )
