"""SQLiteStore: the embedded default, on the standard library's sqlite3.

A store opened for writing has one long-lived writer thread that owns its connection
(:class:`~nous_session.stores._writer.SQLiteWriter`): every write waiting while the previous
transaction is on disk, whichever session sent it, goes into the next transaction, each in its
own savepoint (group commit across sessions: one fsync for all of them); reads run on the same
thread between transactions. A read-only store reads in a worker thread
(``anyio.to_thread.run_sync``) behind a capacity limiter of one. Either way the store works on
asyncio and trio alike and the event loop never blocks on disk. The file is in WAL mode, holds
many sessions, and records its schema version so later versions can migrate it.

Durability: ``synchronous="FULL"`` (the default) makes SQLite fsync the WAL at every commit, so
an acknowledged event survives power loss; ``"NORMAL"`` survives a crash of the process but may
lose the last commits on power loss, and is much faster on slow disks.

Schema (version 3)::

    nous_schema   (version)
    nous_sessions (id INTEGER PRIMARY KEY, name TEXT UNIQUE, count, held, horizon,
                   parent TEXT, fork_point, shares, created, active, meta TEXT, meta_seq,
                   owner, app: generated from meta)
    nous_events   (sid, seq, record BLOB, PRIMARY KEY (sid, seq)) WITHOUT ROWID
    nous_keys     (sid, key, seq, n, PRIMARY KEY (sid, key)) WITHOUT ROWID
    nous_commits  (sid, commit_id, seq, n, PRIMARY KEY (sid, commit_id)) WITHOUT ROWID
    nous_kept     (sid, seq, record BLOB, PRIMARY KEY (sid, seq)) WITHOUT ROWID

``held`` counts a session's own rows. A fork that ``shares`` reads its parent's rows up to its
``fork_point`` instead of holding copies; before its parent drops or deletes any of them, it is
given its own copy. ``nous_kept`` holds the events of idempotency keys that a snapshot dropped.
``meta`` is the session's current metadata record (JSON, from its newest metadata event, at
``meta_seq``), ``created`` and ``active`` its first and last appending commit's times
(microseconds since the epoch; ``active`` to the second, see ``_ADVANCE``); ``owner`` and
``app`` are virtual columns read from ``meta``, indexed with the times so that a listing's
filter and order come from an index.
Session ids are always bound as parameters, never formatted into SQL.

Reading never writes: ``read_only=True`` opens the file with SQLite's read-only mode, creating
nothing and migrating nothing, and refuses a file that is missing or is not a nous_session
store. A store opened for writing refuses a database that holds other tables and no nous_session
schema unless ``adopt=True``; and it refuses to commit once its path no longer names the file it
opened (deleted or replaced under it), since the writes would go to an orphaned file.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
import warnings
from collections.abc import AsyncGenerator, Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from datetime import datetime
from operator import itemgetter
from pathlib import Path
from types import MappingProxyType, TracebackType
from typing import Any, ClassVar, Final, Literal, TypeVar
from urllib.parse import quote

import anyio
import anyio.to_thread
import attrs

from nous_session._json import dumps, loads
from nous_session.codec import decode, decode_rows, encode
from nous_session.erasure import (
    Erasure,
    check_reason,
    check_seqs,
    erase_copies,
    erasure_time,
    family,
    forget_metadata,
)
from nous_session.errors import ConflictError, StoreError
from nous_session.event import Event, EventType
from nous_session.metadata import (
    ListQuery,
    SessionEntry,
    SessionMetadata,
    SessionPage,
    from_micros,
    latest_metadata,
    to_micros,
)
from nous_session.stores._sqlite_feed import DEFAULT_POLL, ChangeMonitor
from nous_session.stores._writer import SQLiteWriter
from nous_session.stores.base import (
    Rebased,
    SessionInfo,
    Stored,
    check_commit_arguments,
    check_commit_state,
    check_fork_point,
    check_held,
    check_lease,
    check_rebase_arguments,
    check_session_id,
    moved,
    moved_keys,
    place,
)

__all__ = ["SCHEMA_VERSION", "SQLiteStore"]

SCHEMA_VERSION: Final = 3
"""The schema this version writes; older files are migrated on open, newer ones refused."""

T = TypeVar("T")
_ROW_SEQ: Final[Callable[[tuple[int, bytes]], int]] = itemgetter(0)
Synchronous = Literal["FULL", "NORMAL", "OFF", "EXTRA"]

_KEYS_TABLE: Final = """CREATE TABLE nous_keys (
    sid INTEGER NOT NULL, key TEXT NOT NULL, seq INTEGER NOT NULL, n INTEGER NOT NULL,
    PRIMARY KEY (sid, key)
) WITHOUT ROWID"""
_COMMITS_TABLE: Final = """CREATE TABLE nous_commits (
    sid INTEGER NOT NULL, commit_id TEXT NOT NULL, seq INTEGER NOT NULL, n INTEGER NOT NULL,
    PRIMARY KEY (sid, commit_id)
) WITHOUT ROWID"""
_KEPT_TABLE: Final = """CREATE TABLE nous_kept (
    sid INTEGER NOT NULL, seq INTEGER NOT NULL, record BLOB NOT NULL,
    PRIMARY KEY (sid, seq)
) WITHOUT ROWID"""

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
    1: (
        "ALTER TABLE nous_sessions ADD COLUMN horizon INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE nous_sessions ADD COLUMN parent TEXT",
        "ALTER TABLE nous_sessions ADD COLUMN fork_point INTEGER",
        "ALTER TABLE nous_sessions ADD COLUMN shares INTEGER NOT NULL DEFAULT 0",
        "CREATE INDEX nous_sessions_parent ON nous_sessions (parent) WHERE shares",
        _KEYS_TABLE,
        _COMMITS_TABLE,
        _KEPT_TABLE,
    ),
    2: (
        "ALTER TABLE nous_sessions ADD COLUMN created INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE nous_sessions ADD COLUMN active INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE nous_sessions ADD COLUMN meta TEXT",
        "ALTER TABLE nous_sessions ADD COLUMN meta_seq INTEGER",
        "ALTER TABLE nous_sessions ADD COLUMN owner TEXT"
        " GENERATED ALWAYS AS (json_extract(meta, '$.owner')) VIRTUAL",
        "ALTER TABLE nous_sessions ADD COLUMN app TEXT"
        " GENERATED ALWAYS AS (json_extract(meta, '$.app')) VIRTUAL",
        # Sessions from before get the times of their oldest and newest held event (the
        # migration's time when they hold none of their own).
        """UPDATE nous_sessions SET
               created = coalesce((SELECT json_extract(CAST(record AS TEXT), '$[3]')
                   FROM nous_events WHERE sid = nous_sessions.id ORDER BY seq LIMIT 1),
                   CAST((julianday('now') - 2440587.5) * 86400000000 AS INTEGER)),
               active = coalesce((SELECT json_extract(CAST(record AS TEXT), '$[3]')
                   FROM nous_events WHERE sid = nous_sessions.id ORDER BY seq DESC LIMIT 1),
                   CAST((julianday('now') - 2440587.5) * 86400000000 AS INTEGER))""",
        "CREATE INDEX nous_sessions_owner_active ON nous_sessions (owner, active, name)",
        "CREATE INDEX nous_sessions_owner_created ON nous_sessions (owner, created, name)",
        "CREATE INDEX nous_sessions_active ON nous_sessions (active, name)",
        "CREATE INDEX nous_sessions_created ON nous_sessions (created, name)",
    ),
}
_OURS: Final = frozenset(
    {"nous_schema", "nous_sessions", "nous_events", "nous_keys", "nous_commits", "nous_kept"}
)


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


@contextmanager
def _errors(what: str) -> Iterator[None]:
    """Translate sqlite3's errors, in the one place this store does it.

    A clash on a primary key (another writer holds one of these seqs, or the key) is a
    ConflictError; any other sqlite3 error a StoreError that says what failed and why.
    """
    try:
        yield
    except sqlite3.Error as error:
        raise _translated(error, what) from error


def _translated(error: sqlite3.Error, what: str) -> StoreError:
    """The error :func:`_errors` raises for ``error``."""
    if isinstance(error, sqlite3.IntegrityError):
        return ConflictError(
            f"{what}: another writer holds one of these seqs or keys ({_describe(error)})"
        )
    return StoreError(f"{what}: {_describe(error)}")


@attrs.frozen
class _Row:
    """A session's row of nous_sessions."""

    id: int
    count: int
    held: int
    horizon: int
    parent: str | None
    fork_point: int | None
    shares: bool


_ROW_COLUMNS: Final = "id, count, held, horizon, parent, fork_point, shares"


def _make_row(found: Sequence[Any]) -> _Row:
    sid, count, held, horizon, parent, fork_point, shares = found
    return _Row(sid, count, held, horizon, parent, fork_point, bool(shares))


def _row(connection: sqlite3.Connection, session_id: str) -> _Row | None:
    found = connection.execute(
        f"SELECT {_ROW_COLUMNS} FROM nous_sessions WHERE name = ?", (session_id,)
    ).fetchone()
    return None if found is None else _make_row(found)


def _ranges(connection: sqlite3.Connection, row: _Row) -> list[tuple[int, int, int | None]]:
    """Where a session's events are: ``(sid, lowest seq, highest seq or None)`` per session
    of its sharing lineage, oldest ancestor first (the ranges are disjoint and ascending)."""
    ranges: list[tuple[int, int, int | None]] = []
    upto: int | None = None
    while row.shares and row.parent is not None and row.fork_point is not None:
        ranges.append((row.id, row.fork_point + 1, upto))
        upto = row.fork_point if upto is None else min(upto, row.fork_point)
        parent = _row(connection, row.parent)
        if parent is None:  # pragma: no cover - a delete gives its forks their copy first
            raise StoreError(f"the parent {row.parent!r} of a fork is missing")
        row = parent
    ranges.append((row.id, 0, upto))
    ranges.reverse()
    return ranges


def _rows(
    connection: sqlite3.Connection, row: _Row, since: int, upto: int | None = None
) -> list[tuple[int, bytes]]:
    """The (seq, record) rows of a session's events with ``since <= seq <= upto``."""
    if not row.shares and upto is None:
        return connection.execute(
            "SELECT seq, record FROM nous_events WHERE sid = ? AND seq >= ? ORDER BY seq",
            (row.id, since),
        ).fetchall()
    rows: list[tuple[int, bytes]] = []
    for sid, low, high in _ranges(connection, row):
        if upto is not None:
            high = upto if high is None else min(high, upto)
        if high is not None and high < max(low, since):
            continue
        rows.extend(
            connection.execute(
                "SELECT seq, record FROM nous_events WHERE sid = ? AND seq >= ? AND seq <= ?"
                " ORDER BY seq",
                (sid, max(low, since), 2**63 - 1 if high is None else high),
            ).fetchall()
        )
    return rows


def _inherited(
    connection: sqlite3.Connection, row: _Row, since: int
) -> tuple[list[tuple[str, int, int]], list[tuple[int, bytes]]]:
    """The idempotency keys (key, first seq, count) with first seq >= ``since``, and the kept
    events, that a sharing fork answers from its lineage: each ancestor's within the range
    of its rows the fork shares (a key only if all its events are). Looked up, not copied."""
    keys: list[tuple[str, int, int]] = []
    kept: list[tuple[int, bytes]] = []
    if not row.shares:
        return keys, kept
    for sid, low, high in _ranges(connection, row)[:-1]:
        bound = 2**63 - 1 if high is None else high
        keys += connection.execute(
            "SELECT key, seq, n FROM nous_keys WHERE sid = ? AND seq >= ? AND seq + n - 1 <= ?",
            (sid, max(low, since), bound),
        ).fetchall()
        kept += connection.execute(
            "SELECT seq, record FROM nous_kept WHERE sid = ? AND seq >= ? AND seq <= ?"
            " ORDER BY seq",
            (sid, low, bound),
        ).fetchall()
    return keys, kept


def _own_copy(connection: sqlite3.Connection, row: _Row) -> None:
    """Give a sharing fork its own copy of the rows it shares, and of the keys and kept
    events it inherits, and stop it sharing."""
    copied = 0
    keys, kept = _inherited(connection, row, 0)
    connection.executemany(
        "INSERT OR IGNORE INTO nous_keys (sid, key, seq, n) VALUES (?, ?, ?, ?)",
        [(row.id, key, seq, n) for key, seq, n in keys],
    )
    connection.executemany(
        "INSERT OR IGNORE INTO nous_kept (sid, seq, record) VALUES (?, ?, ?)",
        [(row.id, seq, record) for seq, record in kept],
    )
    for sid, low, high in _ranges(connection, row)[:-1]:
        before = connection.total_changes
        connection.execute(
            "INSERT INTO nous_events (sid, seq, record) SELECT ?, seq, record FROM nous_events"
            " WHERE sid = ? AND seq >= ? AND seq <= ?",
            (row.id, sid, low, 2**63 - 1 if high is None else high),
        )
        copied += connection.total_changes - before
    connection.execute(
        "UPDATE nous_sessions SET shares = 0, held = held + ? WHERE id = ?", (copied, row.id)
    )


def _release_shared(
    connection: sqlite3.Connection, row: _Row, session_id: str, lowest: int
) -> None:
    """Before rows from seq ``lowest`` on are dropped from a session: its forks that share
    any of them, and the session itself if it shares them from its parent, get copies."""
    for (child_name,) in connection.execute(
        "SELECT name FROM nous_sessions WHERE parent = ? AND shares AND fork_point >= ?",
        (session_id, lowest),
    ).fetchall():
        child = _row(connection, child_name)
        assert child is not None
        _own_copy(connection, child)
    if row.shares and row.fork_point is not None and lowest <= row.fork_point:
        _own_copy(connection, row)


def _check_since(since: object) -> None:
    if not isinstance(since, int) or isinstance(since, bool) or since < 0:
        raise ValueError(f"since must be an int >= 0, got {since!r}")


class _File:
    """The identity (device, inode) of the file a store opened, to notice it being replaced."""

    __slots__ = ("identity", "path")

    def __init__(self, path: str) -> None:
        self.path = path
        self.identity: tuple[int, int] | None = None

    def _stat(self) -> tuple[int, int] | None:
        if self.path == ":memory:":
            return None
        status = os.stat(self.path)
        return (status.st_dev, status.st_ino)

    def opened(self) -> None:
        self.identity = self._stat()

    def check(self) -> None:
        if self.identity is None:
            return
        try:
            now = self._stat()
        except OSError:
            now = None
        if now != self.identity:
            raise StoreError(
                f"the store file {self.path} was deleted or replaced while open; refusing to"
                " write to the orphaned file (reopen the store)"
            )


@attrs.frozen
class _Opener:
    """Opens the store's connection for writing: the file, WAL, durability, the schema."""

    path: str
    synchronous: str
    busy_timeout: float
    adopt: bool
    file: _File

    def __call__(self) -> sqlite3.Connection:
        path = self.path
        try:
            if path != ":memory:":
                Path(path).parent.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise StoreError(f"cannot open {path}: {_describe(error)}") from error
        with _errors(f"cannot open {path}"):
            connection = sqlite3.connect(
                path,
                timeout=self.busy_timeout,
                isolation_level=None,  # we issue BEGIN/COMMIT ourselves
                check_same_thread=False,  # made on the writer's thread, closed by it
            )
        try:
            # Before anything changes the file (even its journal mode): is it ours to use?
            current = _check_ours(connection, path, adopt=self.adopt)
            with _errors(f"cannot open {path}"):
                _wal(connection, self.busy_timeout)
                connection.execute(f"PRAGMA synchronous={self.synchronous}")
            if not current:
                _migrate(connection, path)
            self.file.opened()
        except BaseException:
            connection.close()
            raise
        return connection


@attrs.define
class SQLiteStore:
    """Sessions in one SQLite file.

    Args:
        path: the database file (created, with its parent directory, if missing), or
            ``":memory:"`` for a private in-memory database.
        synchronous: SQLite's durability setting; ``"FULL"`` by default (see the module doc).
        busy_timeout: seconds to wait for another process's write lock before a commit fails
            with :class:`StoreError`.
        read_only: open the file read-only: nothing is created or changed, and a missing file
            or one that is not a nous_session store is a :class:`StoreError`.
        adopt: allow creating the nous_session tables in a database that already holds other
            tables (refused by default, so a mistyped path cannot alter another application's
            database).

    The connection opens on first use. Close the store with :meth:`aclose` (or ``async
    with``); a store garbage-collected while open warns with :class:`ResourceWarning`.
    """

    path: str = attrs.field(converter=os.fspath)
    synchronous: Synchronous = attrs.field(default="FULL", kw_only=True)
    busy_timeout: float = attrs.field(default=5.0, kw_only=True)
    read_only: bool = attrs.field(default=False, kw_only=True)
    adopt: bool = attrs.field(default=False, kw_only=True)
    _connection: sqlite3.Connection | None = attrs.field(default=None, init=False)
    _file: _File = attrs.field(init=False)
    _immutable: bool = attrs.field(default=False, init=False)
    _limiter: anyio.CapacityLimiter | None = attrs.field(default=None, init=False)
    _writer: SQLiteWriter | None = attrs.field(default=None, init=False)
    _closed: bool = attrs.field(default=False, init=False)
    # Session ids by name, for the common commit (see _ADVANCE_KNOWN): the writer's thread's.
    _ids: dict[str, int] = attrs.field(factory=dict, init=False)
    # The change feed's thread and its watches (see :meth:`watch`), made by the first watch.
    _monitor: ChangeMonitor | None = attrs.field(default=None, init=False)
    _monitor_lock: threading.Lock = attrs.field(factory=threading.Lock, init=False)

    def __attrs_post_init__(self) -> None:
        self._file = _File(self.path)
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
        """Run a read ``function(connection)`` off the event loop.

        A store opened for writing has one long-lived writer thread that owns the connection
        (:class:`~nous_session.stores._writer.SQLiteWriter`): reads run there, outside any write
        transaction. A read-only store reads in a worker thread, one call at a time.
        """
        if self._closed:
            raise StoreError(f"the store {self.url} is closed")
        if self.read_only:
            if self._limiter is None:
                self._limiter = anyio.CapacityLimiter(1)
            return await anyio.to_thread.run_sync(self._call, function, limiter=self._limiter)
        return await self._writer_thread().read(function)

    async def _write(self, function: Callable[[sqlite3.Connection], T], what: str) -> T:
        """Run a write ``function(connection)`` in the writer thread's next transaction.

        Every write waiting while the previous transaction is on disk (this store's sessions'
        commits, whoever sent them) goes into the next one, each in a savepoint of its own:
        one fsync for all of them, and a job that raises (a conflict, a bad row) undoes only
        itself. ``function`` runs inside that transaction; it neither begins nor commits.
        """
        if self._closed:
            raise StoreError(f"the store {self.url} is closed")
        if self.read_only:
            raise StoreError(f"the store {self.url} is open read-only")

        def job(connection: sqlite3.Connection) -> T:
            with _errors(what):
                return function(connection)

        return await self._writer_thread().write(job)

    def _writer_thread(self) -> SQLiteWriter:
        if self._writer is None:
            # The writer's thread holds the opener, not the store, so that a store nobody
            # closed can still be garbage-collected (and warn).
            opener = _Opener(self.path, self.synchronous, self.busy_timeout, self.adopt, self._file)
            # The file is checked once per write transaction, before any of its writes runs.
            self._writer = SQLiteWriter(opener, check=self._file.check)
        return self._writer

    def _call(self, function: Callable[[sqlite3.Connection], T]) -> T:
        if self._closed:  # closed while this call waited for the limiter
            raise StoreError(f"the store {self.url} is closed")
        if self._connection is None:
            self._connection = self._connect()
        try:
            return function(self._connection)
        except BaseException:
            if self._connection.in_transaction:  # as the writer thread does for its reads
                with suppress(sqlite3.Error):
                    self._connection.execute("ROLLBACK")
            raise
        finally:
            if self._immutable:
                # Opened while no writer was active: the next call looks again, so that it
                # sees what a writer that started since has committed.
                self._connection.close()
                self._connection = None

    def _connect(self) -> sqlite3.Connection:
        if self.read_only:
            return self._connect_read_only()
        return _Opener(self.path, self.synchronous, self.busy_timeout, self.adopt, self._file)()

    def _connect_read_only(self) -> sqlite3.Connection:
        if self.path == ":memory:" or not Path(self.path).is_file():
            raise StoreError(f"no store file at {self.path}")
        # A WAL database read while no connection has it open would get its -wal and -shm
        # files created (and left behind). With no -wal file there is no writer (the last
        # connection to close removes it), so the file is read as immutable: nothing made.
        self._immutable = not Path(f"{self.path}-wal").exists()
        flags = "mode=ro&immutable=1" if self._immutable else "mode=ro"
        with _errors(f"cannot open {self.path}"):
            connection = sqlite3.connect(
                f"file:{quote(os.path.abspath(self.path))}?{flags}",
                uri=True,
                timeout=self.busy_timeout,
                isolation_level=None,
                check_same_thread=False,
            )
        try:
            with _errors(f"cannot read {self.path}"):
                tables = {
                    name
                    for (name,) in connection.execute(
                        "SELECT name FROM sqlite_master WHERE type = 'table'"
                    )
                }
                version = (
                    connection.execute("SELECT version FROM nous_schema").fetchone()
                    if "nous_schema" in tables
                    else None
                )
            if version is None:
                raise StoreError(f"{self.path} is not a nous_session store")
            if version[0] != SCHEMA_VERSION:
                raise StoreError(
                    f"{self.path} has schema version {version[0]}; this nous_session reads"
                    f" version {SCHEMA_VERSION} (open it for writing once to migrate it)"
                )
        except BaseException:
            connection.close()
            raise
        return connection

    def _check_file(self) -> None:
        """Refuse to write once the path no longer names the file this store opened: the
        writes would land in an orphaned file that nothing reads again."""
        self._file.check()

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
                # One snapshot: the count and the rows agree. A query that fails leaves the
                # transaction to whoever runs reads (the writer thread, or _call): they roll
                # back what a read left open.
                connection.execute("BEGIN")
                row = _row(connection, session_id)
                rows = [] if row is None else _rows(connection, row, since)
                connection.execute("COMMIT")
            if row is not None:
                check_held(
                    session_id,
                    rows,
                    count=row.count,
                    horizon=row.horizon,
                    since=since,
                    where=self.path,
                    seq=_ROW_SEQ,
                )
            return decode_rows(rows, place(session_id, self.path))

        return await self._run(load)

    async def read(self, session_id: str, *, since: int = 0) -> Stored:
        """The session's events from ``since`` with its count, horizon, keys and lineage, in
        one read transaction.

        Raises:
            CorruptRecordError: a row cannot be decoded (the error names session and seq).
            StoreError: the file cannot be read.
        """
        _check_since(since)

        def read(connection: sqlite3.Connection) -> Stored:
            with _errors(f"cannot read session {session_id!r} from {self.path}"):
                connection.execute("BEGIN")  # one snapshot of the file for every query
                row = _row(connection, session_id)
                if row is None:
                    connection.execute("COMMIT")
                    return Stored((), 0)
                rows = _rows(connection, row, since)
                keys = connection.execute(
                    "SELECT key, seq, n FROM nous_keys WHERE sid = ? AND seq >= ?",
                    (row.id, since),
                ).fetchall()
                kept = (
                    connection.execute(
                        "SELECT seq, record FROM nous_kept WHERE sid = ? ORDER BY seq",
                        (row.id,),
                    ).fetchall()
                    if since == 0
                    else []
                )
                if row.shares:
                    inherited, inherited_kept = _inherited(connection, row, since)
                    keys = inherited + keys  # the fork's own keys come after
                    if since == 0:
                        kept = sorted(inherited_kept + kept)
                connection.execute("COMMIT")
            check_held(
                session_id,
                rows,
                count=row.count,
                horizon=row.horizon,
                since=since,
                where=self.path,
                seq=_ROW_SEQ,
            )
            where = place(session_id, self.path)
            return Stored(
                decode_rows(rows, where),
                row.count,
                row.horizon,
                MappingProxyType({key: (seq, n) for key, seq, n in keys}),
                tuple(decode_rows(kept, where)),
                row.parent,
                row.fork_point,
            )

        return await self._run(read)

    async def commit(
        self,
        session_id: str,
        *,
        expected_count: int,
        events: Sequence[Event],
        dropped: Sequence[int] = (),
        expected_horizon: int | None = None,
        horizon: int | None = None,
        keys: Sequence[tuple[str, int, int]] = (),
        kept: Sequence[int] = (),
        commit_id: str | None = None,
    ) -> None:
        """Insert ``events`` and delete ``dropped`` in one transaction, durable on return.

        Raises:
            ConflictError: the stored count (or horizon) is not the expected one, or a key is
                taken; nothing was written.
            StoreError: SQLite failed (disk full, read-only file, locked database, the file
                replaced under the store, ...); nothing was written.
        """
        rows = check_commit_arguments(
            session_id,
            expected_count,
            events,
            dropped,
            keys=keys,
            kept=kept,
            commit_id=commit_id,
            horizon=horizon,
            expected_horizon=expected_horizon,
        )

        records = [(event.seq, encode(event)) for event in rows]  # encoded before joining a group
        metadata = latest_metadata(rows)
        if self._closed:
            raise StoreError(f"the store {self.url} is closed")
        if self.read_only:
            raise StoreError(f"the store {self.url} is open read-only")

        await self._writer_thread().write(
            _CommitJob(
                self.path,
                session_id,
                expected_count,
                records,
                dropped,
                expected_horizon,
                horizon,
                keys,
                kept,
                commit_id,
                metadata,
                self._ids,
            )
        )

    async def commit_rebased(
        self,
        session_id: str,
        *,
        expected_count: int,
        events: Sequence[Event],
        keys: Sequence[tuple[str, int, int]] = (),
        commit_id: str | None = None,
    ) -> Rebased:
        """Append ``events`` after the session's current count (see :class:`RebasingStore`).

        One transaction under SQLite's write lock: read the count and what other writers
        stored since ``expected_count``, insert the events after it, commit.

        Raises:
            ConflictError: the stored count is below ``expected_count``, or a key is taken;
                nothing was written.
            CorruptRecordError: another writer's record cannot be decoded; nothing was written.
            StoreError: SQLite failed; nothing was written.
        """
        listed = check_rebase_arguments(
            session_id, expected_count, events, keys=keys, commit_id=commit_id
        )

        def commit(connection: sqlite3.Connection) -> Rebased:
            row = _row(connection, session_id)
            stored = 0 if row is None else row.count
            if stored < expected_count:
                raise ConflictError(
                    f"session {session_id!r} has count {stored},"
                    f" below the expected {expected_count}"
                )
            shift = stored - expected_count
            others: list[Event] = []
            between: dict[str, tuple[int, int]] = {}
            if shift and row is not None:
                found = _rows(connection, row, expected_count)
                # A rebase never writes past a hole: the batch would land after rows that
                # are missing, and the session could not be opened again.
                check_held(
                    session_id,
                    found,
                    count=stored,
                    horizon=row.horizon,
                    since=expected_count,
                    where=self.path,
                    seq=_ROW_SEQ,
                )
                others = decode_rows(found, place(session_id, self.path))
                between = {
                    key: (seq, n)
                    for key, seq, n in connection.execute(
                        "SELECT key, seq, n FROM nous_keys WHERE sid = ? AND seq >= ?",
                        (row.id, expected_count),
                    )
                }
            placed = moved(listed, shift) if shift else listed
            records = [(event.seq, encode(event)) for event in placed]
            _commit(
                connection,
                session_id,
                stored,
                records,
                (),
                keys=moved_keys(keys, shift),
                commit_id=commit_id,
                metadata=latest_metadata(placed),
                ids=self._ids,
            )
            return Rebased(
                shift, others, placed, MappingProxyType(between), 0 if row is None else row.horizon
            )

        return await self._write(commit, f"commit to session {session_id!r} in {self.path}")

    async def committed(self, session_id: str, commit_id: str) -> tuple[int, int] | None:
        """Where the commit ``commit_id`` landed (first seq, events), or None.

        A SQLite commit's outcome is always known to its caller; this is for a caller that
        lost track (a process restarted, say).
        """

        def committed(connection: sqlite3.Connection) -> tuple[int, int] | None:
            with _errors(f"cannot read session {session_id!r} from {self.path}"):
                found = connection.execute(
                    "SELECT c.seq, c.n FROM nous_commits c JOIN nous_sessions s ON s.id = c.sid"
                    " WHERE s.name = ? AND c.commit_id = ?",
                    (session_id, commit_id),
                ).fetchone()
            return None if found is None else (found[0], found[1])

        return await self._run(committed)

    async def fork(self, session_id: str, new_session_id: str, *, at: int) -> None:
        """A new session sharing ``session_id``'s rows up to seq ``at``: one row inserted,
        whatever the history's length (see :class:`~nous_session.stores.base.ForkingStore`)."""
        check_session_id(new_session_id)

        def fork(connection: sqlite3.Connection) -> None:
            parent = _row(connection, session_id)
            if parent is None or parent.count == 0:
                raise ValueError(f"no session {session_id!r} to fork")
            check_fork_point(session_id, at, parent.count, parent.horizon)
            existing = _row(connection, new_session_id)
            if existing is not None:
                if existing.count:
                    raise ValueError(f"session {new_session_id!r} exists already")
                connection.execute("DELETE FROM nous_sessions WHERE id = ?", (existing.id,))
            meta, meta_seq = _metadata_at(connection, parent, session_id, at, self.path)
            now = _now()
            connection.execute(
                "INSERT INTO nous_sessions (name, count, held, horizon, parent, fork_point,"
                " shares, created, active, meta, meta_seq)"
                " VALUES (?, ?, 0, ?, ?, ?, 1, ?, ?, ?, ?)",
                (new_session_id, at + 1, parent.horizon, session_id, at, now, now, meta, meta_seq),
            )

        await self._write(fork, f"cannot fork session {session_id!r}")

    async def sessions(self) -> list[SessionInfo]:
        """Every session with a nonzero count, by id (a sharing fork's held events counted
        through its parent: a range count, as fits an administrative listing)."""

        def sessions(connection: sqlite3.Connection) -> list[SessionInfo]:
            with _errors(f"cannot list sessions in {self.path}"):
                found = connection.execute(
                    f"SELECT name, {_ROW_COLUMNS} FROM nous_sessions WHERE count > 0 ORDER BY name"
                ).fetchall()
                infos = []
                for name, *fields in found:
                    row = _make_row(fields)
                    held = row.held
                    if row.shares:
                        held = _count_rows(connection, row)
                    infos.append(
                        SessionInfo(name, row.count, held, row.horizon, row.parent, row.fork_point)
                    )
            return infos

        return await self._run(sessions)

    async def list_sessions(
        self,
        *,
        where: Mapping[str, Any] | None = None,
        tags: Iterable[str] = (),
        created_since: datetime | None = None,
        created_before: datetime | None = None,
        active_since: datetime | None = None,
        active_before: datetime | None = None,
        order: str = "active",
        descending: bool = True,
        limit: int = 50,
        cursor: str | None = None,
    ) -> SessionPage:
        """A page of the matching sessions (see :class:`~nous_session.stores.base.ListingStore`):
        one query, its filter and order served by an index on (owner, time, name) or (time,
        name). Reading never writes (a read-only store lists too).

        Raises:
            ValueError: a bad argument or cursor.
            StoreError: the file cannot be read.
        """
        query = ListQuery.make(
            where=where,
            tags=tags,
            created_since=created_since,
            created_before=created_before,
            active_since=active_since,
            active_before=active_before,
            order=order,
            descending=descending,
            limit=limit,
            cursor=cursor,
        )
        statement, parameters = _listing(query)

        def listing(connection: sqlite3.Connection) -> list[tuple[Any, ...]]:
            with _errors(f"cannot list sessions in {self.path}"):
                return connection.execute(statement, parameters).fetchall()

        found = await self._run(listing)
        return query.page(
            [
                SessionEntry(
                    name,
                    SessionMetadata() if meta is None else SessionMetadata.from_json(loads(meta)),
                    from_micros(created),
                    from_micros(active),
                    count,
                    parent,
                )
                for name, count, parent, meta, created, active in found
            ]
        )

    async def delete_idle(self, session_id: str, *, count: int, active: datetime) -> bool:
        """Delete the session if its count and last-active time are still these, checked in
        the deleting transaction (see :class:`~nous_session.stores.base.ListingStore`)."""
        moment = to_micros(active)

        def delete(connection: sqlite3.Connection) -> bool:
            found = connection.execute(
                "SELECT count, active FROM nous_sessions WHERE name = ?", (session_id,)
            ).fetchone()
            if found is None or tuple(found) != (count, moment):
                return False
            row = _row(connection, session_id)
            assert row is not None
            _release_shared(connection, row, session_id, 0)
            for table in ("nous_events", "nous_keys", "nous_commits", "nous_kept"):
                connection.execute(f"DELETE FROM {table} WHERE sid = ?", (row.id,))
            connection.execute("DELETE FROM nous_sessions WHERE id = ?", (row.id,))
            return True

        return await self._write(delete, f"cannot delete session {session_id!r}")

    async def delete(self, session_id: str) -> bool:
        """Delete a session and all its events (its forks get their own copy first); True
        when it existed."""

        def delete(connection: sqlite3.Connection) -> bool:
            row = _row(connection, session_id)
            if row is None:
                return False
            _release_shared(connection, row, session_id, 0)
            for table in ("nous_events", "nous_keys", "nous_commits", "nous_kept"):
                connection.execute(f"DELETE FROM {table} WHERE sid = ?", (row.id,))
            connection.execute("DELETE FROM nous_sessions WHERE id = ?", (row.id,))
            return True

        return await self._write(delete, f"cannot delete session {session_id!r}")

    async def lease(self, session_id: str, name: str, *, holder: str, ttl: float) -> bool:
        """See :meth:`LeasingStore.lease <nous_session.stores.base.LeasingStore.lease>`: a
        row of ``nous_leases`` (made on first use), expiring on the wall clock, which every
        process on this machine shares."""
        ttl = check_lease(session_id, name, holder, ttl)

        def lease(connection: sqlite3.Connection) -> bool:
            now = time.time()
            connection.execute(_LEASES_TABLE)
            connection.execute(_TAKE_LEASE, (session_id, name, holder, now + ttl, now))
            found = connection.execute(_LEASE_HOLDER, (session_id, name)).fetchone()
            return found is not None and found[0] == holder

        return await self._write(lease, f"cannot take the {name!r} lease of {session_id!r}")

    async def release(self, session_id: str, name: str, *, holder: str) -> None:
        """See :meth:`LeasingStore.release <nous_session.stores.base.LeasingStore.release>`."""
        check_lease(session_id, name, holder)

        def release(connection: sqlite3.Connection) -> None:
            connection.execute(_LEASES_TABLE)
            connection.execute(_DROP_LEASE, (session_id, name, holder))

        await self._write(release, f"cannot release the {name!r} lease of {session_id!r}")

    async def vacuum(self) -> None:
        """Give the space of deleted events back to the file system (after a snapshot)."""

        if self.read_only:
            raise StoreError(f"the store {self.url} is open read-only")

        def vacuum(connection: sqlite3.Connection) -> None:
            # Outside any transaction (VACUUM cannot run in one): the writer's read path.
            self._check_file()
            with _errors(f"cannot vacuum {self.path}"):
                connection.execute("VACUUM")
                connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")

        await self._run(vacuum)

    async def erase(
        self,
        session_id: str,
        seqs: Iterable[int],
        *,
        reason: str,
        at: datetime | None = None,
        dry_run: bool = False,
        rewrite: bool = True,
    ) -> Erasure:
        """Replace the events at ``seqs`` by their erased form wherever the file holds them
        (see :class:`~nous_session.stores.base.ErasingStore`), then scrub the file.

        The rows are rewritten in one transaction with ``PRAGMA secure_delete`` on, so
        SQLite zeroes the space the old records took. Then, with ``rewrite`` (the default),
        ``VACUUM`` rebuilds the whole file (temporary data in memory), so no free page and no
        stale copy an earlier page split or snapshot left behind survives; and a ``TRUNCATE``
        checkpoint copies the WAL into the file and empties it. The result is proven only
        when both happened: a reader in another connection holding an old snapshot makes the
        checkpoint give up after ``busy_timeout`` (the WAL may then still hold old pages;
        erase again, with the same seqs, once it is done). Without ``rewrite`` the result is
        not proven. ``VACUUM`` costs time in proportion to the file and holds the write lock
        meanwhile: every other commit to this file waits for it.

        Raises:
            ValueError: a bad seq or reason, or no such session; nothing was changed.
            StoreError: SQLite failed; nothing was changed (or, if only the scrub failed,
                the rows were erased and the error says so).
        """
        reason = check_reason(reason)
        when = erasure_time(at)
        wanted = check_seqs(seqs)
        return await self._erase(session_id, wanted, None, reason, when, dry_run, rewrite)

    async def erase_session(
        self,
        session_id: str,
        *,
        reason: str,
        inherited: bool = False,
        dry_run: bool = False,
        rewrite: bool = True,
    ) -> Erasure:
        """Erase every event the session wrote itself (with ``inherited``, also what it took
        from the session it was forked from), then scrub the file as :meth:`erase` does.

        Raises:
            ValueError: a bad reason, or no such session; nothing was changed.
            StoreError: SQLite failed; nothing was changed.
        """
        reason = check_reason(reason)
        return await self._erase(
            session_id, None, inherited, reason, erasure_time(None), dry_run, rewrite
        )

    async def _erase(
        self,
        session_id: str,
        wanted: Sequence[int] | None,
        inherited: bool | None,
        reason: str,
        at: datetime,
        dry_run: bool,
        rewrite: bool,
    ) -> Erasure:
        if self.read_only and not dry_run:
            raise StoreError(f"the store {self.url} is open read-only")
        what = f"cannot erase from session {session_id!r} in {self.path}"

        def erase(connection: sqlite3.Connection) -> Erasure:
            if not dry_run:
                self._check_file()
            with _errors(what):
                done = _erase_rows(
                    connection, session_id, wanted, inherited, reason, at, dry_run, self.path
                )
            if dry_run:
                return attrs.evolve(done, detail="dry run: nothing was changed")
            proven, detail = _scrub(connection, rewrite, self.path)
            return attrs.evolve(done, proven=proven, detail=detail)

        # On the writer's thread outside its transactions (VACUUM cannot run in one): it runs
        # between two of its commits, so it is serialised with every write to this file.
        return await self._run(erase)

    # The change feed --------------------------------------------------------------------------

    # The follower passes ``known`` (see nous_session._follower): a head it holds, such as
    # its own commit's, does not wake it.
    watch_takes_known: ClassVar[bool] = True

    async def watch(
        self,
        session_id: str,
        *,
        poll: float = DEFAULT_POLL,
        known: Callable[[], tuple[int, int, bool]] | None = None,
    ) -> AsyncGenerator[int, None]:
        """Yield the session's head as the feed first sees it, then its new head whenever a
        commit lands, whichever process or connection made it (and ``-1`` when the feed had to
        reopen its connection, or another writer took a snapshot: read everything then).

        Every watch of one store shares one thread and one read-only connection, which asks
        SQLite for ``PRAGMA data_version`` every ``poll`` seconds (the first watch's) and reads
        the watched sessions' heads only when it changed. A commit reaches its watches within
        about one poll; while every change the thread reads is one its watchers hold already
        (this process's own commits), it backs off, up to ``BACK_OFF_AT_MOST`` (8) polls
        between two checks, and the first change that wakes a watcher brings it back to one
        poll. With ``known``, a callable that returns what the watcher already holds
        as (count, horizon) and whether a commit of its own is in flight, a head it holds is
        not yielded: the watcher's own commits do not wake it (a head that comes while its
        commit is in flight is asked about again each poll until that commit has answered).
        ``known`` is called from the feed's thread, so it must only read. Close the
        generator (``aclosing``) to leave; the thread ends with the last watch. A
        ``":memory:"`` database is private to this store's connection: nothing else can write
        it, and its watch yields nothing.

        Raises:
            StoreError: the file cannot be opened.
        """
        check_session_id(session_id)
        if isinstance(poll, bool) or not isinstance(poll, int | float) or not poll > 0:
            raise ValueError(f"poll must be a positive number of seconds, got {poll!r}")
        if self.path == ":memory:":
            await anyio.sleep_forever()
        if self._monitor is None:
            # Open the file first (once): a writable store makes its WAL, a read-only one
            # checks it. A round trip through the writer: not one per watch, as a registry
            # opening 200 sessions would queue 200 of them among their commits.
            await self._run(lambda connection: None)
        with self._monitor_lock:
            if self._monitor is None:
                self._monitor = ChangeMonitor(self.path, poll)
            monitor = self._monitor
        heads = monitor.watch(session_id, known)
        try:
            async for head in heads:
                yield head
        finally:
            with anyio.CancelScope(shield=True):
                await heads.aclose()

    async def follow(self, session_id: str, *, since: int = 0) -> AsyncGenerator[Event, None]:
        """Yield the session's events from ``since`` on, then each one committed later by any
        process, in seq order and at most once (through :meth:`watch`)."""
        _check_since(since)
        cursor = since
        watcher = self.watch(session_id)
        try:
            for event in await self.load(session_id, since=cursor):
                cursor = event.seq + 1
                yield event
            async for head in watcher:
                if head != -1 and head <= cursor:
                    continue
                for event in await self.load(session_id, since=cursor):
                    cursor = event.seq + 1
                    yield event
        finally:
            await watcher.aclose()

    # Lifecycle --------------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Close the connection (after the writes already sent are committed). Idempotent."""
        if self._closed:
            return
        self._closed = True
        monitor = self._monitor
        if monitor is not None:
            # First: the writer's connection must be the file's last (see ChangeMonitor.stop).
            # On this thread, no await: a close in a cancelled scope, or at the end of its
            # loop's run, still closes the file (the thread, woken, ends within a query).
            monitor.stop()
        writer, self._writer = self._writer, None
        if writer is not None:
            await writer.aclose()
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
        writer = getattr(self, "_writer", None)
        abandoned = writer is not None and writer.abandon()  # one warning, this one
        if connection is not None or abandoned:
            warnings.warn(
                f"SQLiteStore({self.path!r}) was not closed; call aclose()",
                ResourceWarning,
                stacklevel=2,
                source=self,
            )
        if connection is not None:
            connection.close()


class _CommitJob:
    """A commit's write job: one object where a closure would hold a cell per argument.

    Hundreds of sessions' commits wait in the writer at once, and every object alive then is
    one more for the garbage collector to look at. It translates sqlite3's errors itself (what
    :meth:`SQLiteStore._write` wraps around other jobs), naming the commit only on error.
    """

    __slots__ = (
        "commit_id",
        "dropped",
        "expected_count",
        "expected_horizon",
        "horizon",
        "ids",
        "kept",
        "keys",
        "metadata",
        "path",
        "records",
        "session_id",
    )

    def __init__(
        self,
        path: str,
        session_id: str,
        expected_count: int,
        records: list[tuple[int, bytes]],
        dropped: Sequence[int],
        expected_horizon: int | None,
        horizon: int | None,
        keys: Sequence[tuple[str, int, int]],
        kept: Sequence[int],
        commit_id: str | None,
        metadata: tuple[int, bytes] | None = None,
        ids: dict[str, int] | None = None,
    ) -> None:
        self.path = path
        self.ids = ids
        self.session_id = session_id
        self.expected_count = expected_count
        self.records = records
        self.dropped = dropped
        self.expected_horizon = expected_horizon
        self.horizon = horizon
        self.keys = keys
        self.kept = kept
        self.commit_id = commit_id
        self.metadata = metadata

    def __call__(self, connection: sqlite3.Connection) -> None:
        try:
            _commit(
                connection,
                self.session_id,
                self.expected_count,
                self.records,
                self.dropped,
                expected_horizon=self.expected_horizon,
                horizon=self.horizon,
                keys=self.keys,
                kept=self.kept,
                commit_id=self.commit_id,
                metadata=self.metadata,
                ids=self.ids,
            )
        except sqlite3.Error as error:
            what = f"commit to session {self.session_id!r} in {self.path}"
            raise _translated(error, what) from error


# Leases (see LeasingStore): one row per session and name, outside the session's history; a
# table made on first use, so files written before it need no migration.
_LEASES_TABLE: Final = (
    "CREATE TABLE IF NOT EXISTS nous_leases (session TEXT NOT NULL, name TEXT NOT NULL, "
    "holder TEXT NOT NULL, expires REAL NOT NULL, PRIMARY KEY (session, name)) WITHOUT ROWID"
)
# Taken when free or expired, renewed by its holder; another holder's live lease stays.
_TAKE_LEASE: Final = (
    "INSERT INTO nous_leases (session, name, holder, expires) VALUES (?, ?, ?, ?) "
    "ON CONFLICT (session, name) DO UPDATE SET holder = excluded.holder, "
    "expires = excluded.expires "
    "WHERE nous_leases.holder = excluded.holder OR nous_leases.expires <= ?"
)
_LEASE_HOLDER: Final = "SELECT holder FROM nous_leases WHERE session = ? AND name = ?"
_DROP_LEASE: Final = "DELETE FROM nous_leases WHERE session = ? AND name = ? AND holder = ?"


def _metadata_at(
    connection: sqlite3.Connection, parent: _Row, name: str, at: int, path: str
) -> tuple[str | None, int | None]:
    """The metadata record (JSON text) and its seq that the parent had at seq ``at``: its
    current one unless it changed after ``at``; then the newest metadata event up to ``at``
    (read back from ``at``: metadata events are rare, so this is the rare, slow case)."""
    meta, meta_seq = connection.execute(
        "SELECT meta, meta_seq FROM nous_sessions WHERE id = ?", (parent.id,)
    ).fetchone()
    if meta_seq is None or meta_seq <= at:
        return meta, meta_seq
    where = place(name, path)
    for seq, record in reversed(_rows(connection, parent, 0, at)):
        (event,) = decode_rows([(seq, record)], where)
        if event.type is EventType.METADATA:
            return dumps(event.data.get("metadata", {})).decode(), seq
    return None, None


# What a listing's order is on: the column, and the index that serves it with an owner.
_ORDER_COLUMNS: Final = {"active": "active", "created": "created"}


def _listing(query: ListQuery) -> tuple[str, list[Any]]:
    """The SELECT (and its parameters) for a listing: one page and one more row.

    The owner filter and the order are the leading columns of an index (owner, time, name),
    or (time, name) with no owner: the query walks that index from the cursor and stops after
    ``limit + 1`` matches. Other filters are checked on the rows the index yields.
    """
    column = _ORDER_COLUMNS[query.order]
    clauses = ["count > 0"]
    parameters: list[Any] = []
    for key, wanted in query.where:
        if key in ("owner", "app"):
            clauses.append(f"{key} = ?")
            parameters.append(wanted)
        elif key == "title":
            clauses.append("json_extract(meta, '$.title') = ?")
            parameters.append(wanted)
        else:
            clauses.append(
                "EXISTS (SELECT 1 FROM json_each(meta, '$.extra') WHERE key = ? AND "
                + _json_match(wanted)
                + ")"
            )
            parameters.append(key)
            if wanted is not None and not isinstance(wanted, bool):
                parameters.append(wanted)
    for tag in sorted(query.tags):
        clauses.append("EXISTS (SELECT 1 FROM json_each(meta, '$.tags') WHERE value = ?)")
        parameters.append(tag)
    for name, low, high in (
        ("created", query.created_since, query.created_before),
        ("active", query.active_since, query.active_before),
    ):
        if low is not None:
            clauses.append(f"{name} >= ?")
            parameters.append(low)
        if high is not None:
            clauses.append(f"{name} < ?")
            parameters.append(high)
    direction = "DESC" if query.descending else "ASC"
    if query.after is not None:
        clauses.append(f"({column}, name) {'<' if query.descending else '>'} (?, ?)")
        parameters.extend(query.after)
    parameters.append(query.limit + 1)
    statement = (
        "SELECT name, count, parent, meta, created, active FROM nous_sessions"
        f" WHERE {' AND '.join(clauses)} ORDER BY {column} {direction}, name {direction} LIMIT ?"
    )
    return statement, parameters


def _json_match(wanted: object) -> str:
    """The condition on json_each's ``type`` and ``value`` for an extra field to equal
    ``wanted`` (a bool is no number; 1 equals 1.0)."""
    if wanted is None:
        return "type = 'null'"
    if isinstance(wanted, bool):
        return "type = 'true'" if wanted else "type = 'false'"
    if isinstance(wanted, str):
        return "type = 'text' AND value = ?"
    return "type IN ('integer', 'real') AND value = ?"


def _erase_rows(
    connection: sqlite3.Connection,
    session_id: str,
    wanted: Sequence[int] | None,
    inherited: bool | None,
    reason: str,
    at: datetime,
    dry_run: bool,
    path: str,
) -> Erasure:
    """Rewrite every stored copy of the events to erase, in one transaction with
    ``secure_delete`` on (the old records' space is zeroed); ``wanted`` None: the session's
    own events (and, with ``inherited``, those it took from its parent)."""
    secure = connection.execute("PRAGMA secure_delete").fetchone()[0]
    connection.execute("PRAGMA secure_delete = ON")
    try:
        connection.execute("BEGIN" if dry_run else "BEGIN IMMEDIATE")
        try:
            row = _row(connection, session_id)
            if row is None or row.count == 0:
                raise ValueError(f"no session {session_id!r} to erase")
            if wanted is None:
                low = 0 if inherited or row.fork_point is None else row.fork_point + 1
                keys = {seq for seq, _ in _rows(connection, row, low)}
                keys.update(seq for seq, _ in _inherited(connection, row, low)[1] if seq >= low)
                keys.update(
                    seq
                    for (seq,) in connection.execute(
                        "SELECT seq FROM nous_kept WHERE sid = ? AND seq >= ?", (row.id, low)
                    )
                )
                seqs: Sequence[int] = sorted(keys)
            else:
                seqs = check_seqs(wanted, row.count, session_id=session_id)

            def parent_of(name: str) -> tuple[str, int] | None:
                found = _row(connection, name)
                if found is None or found.parent is None or found.fork_point is None:
                    return None
                if _row(connection, found.parent) is None:
                    return None
                return found.parent, found.fork_point

            forks: dict[str, list[tuple[str, int]]] = {}  # read once per session, not per seq

            def children_of(name: str, seq: int) -> list[str]:
                if name not in forks:
                    forks[name] = connection.execute(
                        "SELECT name, fork_point FROM nous_sessions WHERE parent = ?", (name,)
                    ).fetchall()
                return [child for child, point in forks[name] if point is not None and point >= seq]

            def copies_of(members: Sequence[str], seq: int) -> list[tuple[tuple[str, int], Event]]:
                copies: list[tuple[tuple[str, int], Event]] = []
                for member in members:
                    found = _row(connection, member)
                    assert found is not None
                    for table in ("nous_events", "nous_kept"):
                        record = connection.execute(
                            f"SELECT record FROM {table} WHERE sid = ? AND seq = ?",
                            (found.id, seq),
                        ).fetchone()
                        if record is not None:
                            event = decode(record[0], where=place(member, path)(seq))
                            copies.append(((table, found.id), event))
                return copies

            forgotten: dict[int, bytes] = {}  # erased metadata events: seq -> their record

            def write(where: tuple[str, int], event: Event) -> None:
                table, sid = where
                connection.execute(
                    f"UPDATE {table} SET record = ? WHERE sid = ? AND seq = ?",
                    (encode(event), sid, event.seq),
                )
                forget_metadata(event, forgotten)

            erased, already, absent, others = erase_copies(
                session_id,
                seqs,
                reason=reason,
                at=at,
                members_of=lambda seq: family(session_id, seq, parent_of, children_of),
                copies_of=copies_of,
                write=None if dry_run else write,
            )
            # The sessions' copies of an erased metadata record go too (see forget_metadata).
            for seq, record in forgotten.items():
                connection.executemany(
                    "UPDATE nous_sessions SET meta = ? WHERE name = ? AND meta_seq = ?",
                    [
                        (record.decode(), member, seq)
                        for member in family(session_id, seq, parent_of, children_of)
                    ],
                )
        except BaseException:
            if connection.in_transaction:
                connection.execute("ROLLBACK")
            raise
        connection.execute("ROLLBACK" if dry_run else "COMMIT")
    finally:
        connection.execute(f"PRAGMA secure_delete = {int(secure)}")
    return Erasure(
        session_id,
        reason,
        at,
        tuple(erased),
        tuple(already),
        tuple(absent),
        tuple(sorted(others)),
        dry_run=dry_run,
    )


def _scrub(connection: sqlite3.Connection, rewrite: bool, path: str) -> tuple[bool, str]:
    """After an erasing commit: rebuild the file (``rewrite``) and checkpoint the WAL into
    it, truncating it. Returns whether no old page can remain, and what was done."""
    done = ["secure_delete zeroed the old records"]
    if rewrite:
        temp_store = connection.execute("PRAGMA temp_store").fetchone()[0]
        connection.execute("PRAGMA temp_store = MEMORY")  # no temporary copy on disk
        try:
            with _errors(f"erased, but VACUUM of {path} failed"):
                connection.execute("VACUUM")
        finally:
            connection.execute(f"PRAGMA temp_store = {int(temp_store)}")
        done.append("VACUUM rebuilt the file")
    with _errors(f"erased, but the WAL checkpoint of {path} failed"):
        busy, _, _ = connection.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    if busy:
        done.append(
            "the WAL could not be checkpointed and truncated: another connection holds an old"
            " snapshot (the WAL may still hold old pages; erase again once it is done)"
        )
        return False, "; ".join(done)
    done.append("the WAL was checkpointed and truncated")
    if not rewrite:
        done.append(
            "no VACUUM: free pages and stale copies from earlier writes may remain (not proven)"
        )
    return rewrite, "; ".join(done)


def _count_rows(connection: sqlite3.Connection, row: _Row) -> int:
    total = 0
    for sid, low, high in _ranges(connection, row):
        (number,) = connection.execute(
            "SELECT count(*) FROM nous_events WHERE sid = ? AND seq >= ? AND seq <= ?",
            (sid, low, 2**63 - 1 if high is None else high),
        ).fetchone()
        total += number
    return total


@contextmanager
def _write(connection: sqlite3.Connection, what: str) -> Iterator[None]:
    """One write transaction, its errors translated."""
    with _errors(what), _transaction(connection):
        yield


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


def _wal(connection: sqlite3.Connection, busy_timeout: float) -> None:
    """Put the file in WAL mode, waiting up to ``busy_timeout`` for other processes.

    SQLite answers ``PRAGMA journal_mode=WAL`` with SQLITE_BUSY at once, without calling its
    busy handler, while another process is converting the same new file or opening its
    WAL: several processes opening one new file together hit that. Retry until the deadline,
    as the busy handler would have.
    """
    deadline = time.monotonic() + busy_timeout
    pause = 0.001
    while True:
        try:
            connection.execute("PRAGMA journal_mode=WAL")
        except sqlite3.OperationalError as error:
            if error.sqlite_errorcode & 0xFF != sqlite3.SQLITE_BUSY or time.monotonic() >= deadline:
                raise
        else:
            return
        time.sleep(pause)  # on the writer's own thread, never the event loop
        pause = min(pause * 2, 0.05)


def _check_ours(connection: sqlite3.Connection, path: str, *, adopt: bool) -> bool:
    """Refuse a database that holds other tables and no nous_session schema, unless
    ``adopt``: a mistyped path must not alter another application's database.

    Returns:
        True when the file holds a nous_session store of this schema version already: it
        needs no migration (read without taking the write lock, which another process's
        writer may hold: an open that changes nothing need not wait for it).
    """
    with _errors(f"cannot open {path}"):
        tables = {
            name
            for (name,) in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        }
        if "nous_schema" in tables:
            versions = connection.execute("SELECT version FROM nous_schema").fetchall()
            return versions == [(SCHEMA_VERSION,)]
    if tables - _OURS and not adopt:
        raise StoreError(
            f"{path} holds other tables ({', '.join(sorted(tables - _OURS)[:3])}) and no"
            " nous_session store; refusing to add ours (pass adopt=True to share it)"
        )
    return False


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
            if step == 1:
                _set_horizons(connection)
        if not rows:
            connection.execute("INSERT INTO nous_schema (version) VALUES (?)", (SCHEMA_VERSION,))
        elif version != SCHEMA_VERSION:
            connection.execute("UPDATE nous_schema SET version = ?", (SCHEMA_VERSION,))


def _set_horizons(connection: sqlite3.Connection) -> None:
    """Version 1 kept no horizon: a snapshotted session (one with gaps) gets the lowest one
    its history allows, one past its highest missing seq (every event after it is held)."""
    for sid, count in connection.execute(
        "SELECT id, count FROM nous_sessions WHERE held < count"
    ).fetchall():
        expected = count - 1
        for (seq,) in connection.execute(
            "SELECT seq FROM nous_events WHERE sid = ? ORDER BY seq DESC", (sid,)
        ):
            if seq != expected:
                break
            expected -= 1
        connection.execute("UPDATE nous_sessions SET horizon = ? WHERE id = ?", (expected + 1, sid))


# The common commit's conflict check is the count's conditional UPDATE. The last-active time
# is written (a second statement) only when it is a second or more behind: writing it in every
# commit would update two indexes per commit (SQLite maintains an index whenever the UPDATE
# names one of its columns, whether the value changes or not), and the time is kept to the
# second, by a conditional UPDATE. The first commit of a session through a store reads its id
# back (RETURNING); later ones name the row by the id the store keeps (and its name, so that a
# row deleted meanwhile, its id taken by another session, is never the one moved). RETURNING
# costs more than the second UPDATE: one commit's statements alone in their transaction took
# 26-51 µs reading the id and the last-active time back at every commit, against 16-32 by the
# kept id, and 28-32 against 24-29 per commit in a transaction of 200 (medians of rounds in
# three runs).
_ADVANCE: Final = (
    "UPDATE nous_sessions SET count = ?, held = held + ? WHERE name = ? AND count = ? RETURNING id"
)
_ADVANCE_AT_HORIZON: Final = (
    "UPDATE nous_sessions SET count = ?, held = held + ?"
    " WHERE name = ? AND count = ? AND horizon = ? RETURNING id"
)
_ADVANCE_KNOWN: Final = (
    "UPDATE nous_sessions SET count = ?, held = held + ? WHERE id = ? AND name = ? AND count = ?"
)
_ADVANCE_KNOWN_AT_HORIZON: Final = (
    "UPDATE nous_sessions SET count = ?, held = held + ?"
    " WHERE id = ? AND name = ? AND count = ? AND horizon = ?"
)
_TOUCH: Final = "UPDATE nous_sessions SET active = ? WHERE id = ? AND active <= ?"
_ACTIVE_STEP: Final = 1_000_000  # microseconds: how far behind the last-active time may lag
_IDS_AT_MOST: Final = 65_536  # session ids a store keeps for its commits (then it starts over)


def _now() -> int:
    """The store's clock: microseconds since the epoch."""
    return time.time_ns() // 1000


def _keep_id(ids: dict[str, int] | None, session_id: str, sid: int) -> None:
    """Remember ``sid`` as the id of ``session_id`` (a bounded memory: full, it starts over)."""
    if ids is None:
        return
    if len(ids) >= _IDS_AT_MOST and session_id not in ids:
        ids.clear()
    ids[session_id] = sid


def _commit(
    connection: sqlite3.Connection,
    session_id: str,
    expected_count: int,
    records: list[tuple[int, bytes]],
    dropped: Sequence[int],
    *,
    expected_horizon: int | None = None,
    horizon: int | None = None,
    keys: Sequence[tuple[str, int, int]] = (),
    kept: Sequence[int] = (),
    commit_id: str | None = None,
    metadata: tuple[int, bytes] | None = None,
    ids: dict[str, int] | None = None,
) -> None:
    """Write one commit in the caller's transaction.

    Args:
        ids: the ids of sessions this store has written, by name (read and filled here, on
            the writer's thread only); a stale one is harmless, as the row it names must
            still have the session's name.

    Raises:
        ConflictError: the stored count (or horizon) is not the expected one.
        sqlite3.Error: SQLite failed.
    """
    if (
        records
        and expected_count
        and not (dropped or keys or kept)
        and commit_id is None
        and horizon is None
        and metadata is None
    ):
        # The common commit (new events to an existing session): the conditional UPDATE is
        # the conflict check.
        count = records[-1][0] + 1
        sid = None if ids is None else ids.get(session_id)
        moved = False
        if sid is not None:
            moved = (
                connection.execute(
                    _ADVANCE_KNOWN if expected_horizon is None else _ADVANCE_KNOWN_AT_HORIZON,
                    (count, len(records), sid, session_id, expected_count)
                    if expected_horizon is None
                    else (count, len(records), sid, session_id, expected_count, expected_horizon),
                ).rowcount
                == 1
            )
        else:
            found = connection.execute(
                _ADVANCE if expected_horizon is None else _ADVANCE_AT_HORIZON,
                (count, len(records), session_id, expected_count)
                if expected_horizon is None
                else (count, len(records), session_id, expected_count, expected_horizon),
            ).fetchone()
            if found is not None:
                moved = True
                (sid,) = found
                _keep_id(ids, session_id, sid)
        if moved:
            now = _now()
            connection.execute(_TOUCH, (now, sid, now - _ACTIVE_STEP))
            if len(records) == 1:
                connection.execute(
                    "INSERT INTO nous_events (sid, seq, record) VALUES (?, ?, ?)",
                    (sid, *records[0]),
                )
            else:
                connection.executemany(
                    "INSERT INTO nous_events (sid, seq, record) VALUES (?, ?, ?)",
                    [(sid, seq, record) for seq, record in records],
                )
            return
        # No row moved: the full path below says what the conflict is.
    row = _row(connection, session_id)
    stored = 0 if row is None else row.count
    if stored != expected_count:
        raise ConflictError(
            f"session {session_id!r} has count {stored}, expected {expected_count}:"
            " another writer committed first"
        )
    stored_horizon = 0 if row is None else row.horizon
    if expected_horizon is not None and stored_horizon != expected_horizon:
        raise ConflictError(
            f"session {session_id!r} has horizon {stored_horizon}, expected {expected_horizon}:"
            " another writer took a snapshot"
        )
    horizon = check_commit_state(
        session_id,
        stored_horizon,
        dropped=dropped,
        horizon=horizon,
        expected_horizon=expected_horizon,
    )
    now = _now()
    if row is None:
        sid = connection.execute(
            "INSERT INTO nous_sessions (name, count, held, created, active) VALUES (?, 0, 0, ?, ?)",
            (session_id, now, now),
        ).lastrowid
        assert sid is not None
    else:
        sid = row.id
    _keep_id(ids, session_id, sid)
    deleted = 0
    if dropped:
        if row is not None:
            _release_shared(connection, row, session_id, min(dropped))
        if kept:
            connection.executemany(
                "INSERT INTO nous_kept (sid, seq, record) SELECT sid, seq, record"
                " FROM nous_events WHERE sid = ? AND seq = ?",
                [(sid, seq) for seq in kept],
            )
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
    if keys:
        connection.executemany(
            "INSERT INTO nous_keys (sid, key, seq, n) VALUES (?, ?, ?, ?)",
            [(sid, key, first, size) for key, first, size in keys],
        )
    if commit_id is not None:
        connection.execute(
            "INSERT INTO nous_commits (sid, commit_id, seq, n) VALUES (?, ?, ?, ?)",
            (sid, commit_id, records[0][0] if records else expected_count, len(records)),
        )
    count = records[-1][0] + 1 if records else stored
    connection.execute(
        "UPDATE nous_sessions SET count = ?, held = held + ?, horizon = coalesce(?, horizon),"
        " active = max(active, coalesce(?, active)), meta = coalesce(?, meta),"
        " meta_seq = coalesce(?, meta_seq) WHERE id = ?",
        (
            count,
            len(records) - deleted,
            horizon,
            now if records else None,
            None if metadata is None else metadata[1].decode(),
            None if metadata is None else metadata[0],
            sid,
        ),
    )
