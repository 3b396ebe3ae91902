"""The SQLite store's class (the package's doc says how it works)."""

from __future__ import annotations

import os
import sqlite3
import threading
import warnings
from collections.abc import AsyncGenerator, Callable, Iterable, Sequence
from contextlib import suppress
from datetime import datetime
from pathlib import Path
from types import MappingProxyType
from typing import Any, ClassVar, Literal, TypeVar
from urllib.parse import quote

import anyio
import anyio.to_thread
import attrs

from nous_session._json import loads
from nous_session.codec import decode_rows, encode
from nous_session.erasure import (
    Erasure,
    check_reason,
    check_seqs,
    erasure_time,
)
from nous_session.errors import StoreError
from nous_session.event import Event
from nous_session.listing import (
    ListQuery,
    SessionEntry,
    from_micros,
    latest_metadata,
    to_micros,
)
from nous_session.metadata import SessionMetadata
from nous_session.stores._common import Commit, FeedStore
from nous_session.stores.base import (
    Rebased,
    SessionInfo,
    Stored,
    check_fork_point,
    check_held,
    check_session_id,
    check_since,
    place,
)
from nous_session.stores.sqlite._commit import _CommitJob, _now, rebase_in
from nous_session.stores.sqlite._erasure import _erase_rows, _scrub
from nous_session.stores.sqlite._errors import _errors
from nous_session.stores.sqlite._feed import DEFAULT_POLL, ChangeMonitor
from nous_session.stores.sqlite._rows import (
    _ROW_COLUMNS,
    _ROW_SEQ,
    _count_rows,
    _inherited,
    _make_row,
    _metadata_at,
    _release_shared,
    _row,
    _rows,
)
from nous_session.stores.sqlite._schema import SCHEMA_VERSION, _File, _Opener
from nous_session.stores.sqlite._sql import _listing
from nous_session.stores.sqlite._writer import SQLiteWriter

__all__ = ["SQLiteStore", "writer_of"]


T = TypeVar("T")
Synchronous = Literal["FULL", "NORMAL", "OFF", "EXTRA"]


@attrs.define
class SQLiteStore(FeedStore):
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
        (:class:`~nous_session.stores.sqlite._writer.SQLiteWriter`): reads run there, outside
        any write transaction. A read-only store reads in a worker thread, one call at a time.
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
        check_since(since)

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
        check_since(since)

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
                    (row.key, since),
                ).fetchall()
                kept = (
                    connection.execute(
                        "SELECT seq, record FROM nous_kept WHERE sid = ? ORDER BY seq",
                        (row.key,),
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

    async def _commit(self, commit: Commit) -> None:
        session_id, expected_count, rows = commit.session_id, commit.expected_count, commit.events
        dropped, keys, kept, commit_id = commit.dropped, commit.keys, commit.kept, commit.commit_id
        expected_horizon, horizon = commit.expected_horizon, commit.horizon

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

    async def _commit_rebased(self, commit: Commit) -> Rebased:
        session_id = commit.session_id

        def rebase(connection: sqlite3.Connection) -> Rebased:
            return rebase_in(connection, commit, self._ids, self.path)

        return await self._write(rebase, f"commit to session {session_id!r} in {self.path}")

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
                connection.execute("DELETE FROM nous_sessions WHERE id = ?", (existing.key,))
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

    async def _list(self, query: ListQuery) -> list[SessionEntry]:
        statement, parameters = _listing(query)

        def listing(connection: sqlite3.Connection) -> list[tuple[Any, ...]]:
            with _errors(f"cannot list sessions in {self.path}"):
                return connection.execute(statement, parameters).fetchall()

        return [
            SessionEntry(
                name,
                SessionMetadata() if meta is None else SessionMetadata.from_json(loads(meta)),
                from_micros(created),
                from_micros(active),
                count,
                parent,
            )
            for name, count, parent, meta, created, active in await self._run(listing)
        ]

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
                connection.execute(f"DELETE FROM {table} WHERE sid = ?", (row.key,))
            connection.execute("DELETE FROM nous_sessions WHERE id = ?", (row.key,))
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
                connection.execute(f"DELETE FROM {table} WHERE sid = ?", (row.key,))
            connection.execute("DELETE FROM nous_sessions WHERE id = ?", (row.key,))
            return True

        return await self._write(delete, f"cannot delete session {session_id!r}")

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


def writer_of(store: SQLiteStore) -> SQLiteWriter:
    """A hook for benchmarks only (benchmarks/suites/many.py): the store's writer (started if
    it was not), to read its :meth:`~SQLiteWriter.statistics`."""
    return store._writer_thread()
