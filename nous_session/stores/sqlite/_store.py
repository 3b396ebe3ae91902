"""The SQLite store's class (the package's doc says how it works)."""

from __future__ import annotations

import os
import sqlite3
import threading
import warnings
from collections.abc import AsyncGenerator, Callable, Sequence
from contextlib import suppress
from typing import Any, ClassVar, Literal, TypeVar

import anyio
import anyio.to_thread
import attrs

from nous_session._json import loads
from nous_session.codec import encode
from nous_session.encryption import Encryption
from nous_session.errors import StoreError
from nous_session.event import Event
from nous_session.listing import (
    ListQuery,
    SessionEntry,
    from_micros,
    latest_metadata,
)
from nous_session.metadata import SessionMetadata
from nous_session.stores._common import Commit, FeedStore
from nous_session.stores._sealed import Keyring
from nous_session.stores._watch import Known, Watch, Watches, closing
from nous_session.stores.base import (
    Rebased,
    SessionInfo,
    Stored,
    check_session_id,
    check_since,
)
from nous_session.stores.sqlite._commit import CommitJob, rebase_in
from nous_session.stores.sqlite._erasure import FileErasure
from nous_session.stores.sqlite._errors import translated_errors
from nous_session.stores.sqlite._feed import DEFAULT_POLL, ChangeMonitor, OwnCommits
from nous_session.stores.sqlite._keyed import KeyedFile
from nous_session.stores.sqlite._leases import FileLeases
from nous_session.stores.sqlite._rows import (
    fork_row,
    read_stored,
    sessions_info,
)
from nous_session.stores.sqlite._schema import FileIdentity, Opener, open_read_only
from nous_session.stores.sqlite._sql import listing
from nous_session.stores.sqlite._writer import SQLiteWriter

__all__ = ["SQLiteStore", "writer_of"]


T = TypeVar("T")
Synchronous = Literal["FULL", "NORMAL", "OFF", "EXTRA"]


@attrs.define
class SQLiteStore(KeyedFile, FileErasure, FileLeases, FeedStore):
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
        encryption: seal every record written from now on under the session's data key
            (:class:`~nous_session.encryption.Encryption`; the ``crypto`` extra), and erase by
            destroying keys (see docs/erasure.md). Plain records already in the file are read
            as they are. A file holding encrypted sessions needs it to read them.

    The connection opens on first use. Close the store with :meth:`aclose` (or ``async
    with``); a store garbage-collected while open warns with :class:`ResourceWarning`.
    """

    path: str = attrs.field(converter=os.fspath)
    synchronous: Synchronous = attrs.field(default="FULL", kw_only=True)
    busy_timeout: float = attrs.field(default=5.0, kw_only=True)
    read_only: bool = attrs.field(default=False, kw_only=True)
    adopt: bool = attrs.field(default=False, kw_only=True)
    encryption: Encryption | None = attrs.field(default=None, kw_only=True)
    _keyring: Keyring | None = attrs.field(default=None, init=False)
    _connection: sqlite3.Connection | None = attrs.field(default=None, init=False)
    _file: FileIdentity = attrs.field(init=False)
    _immutable: bool = attrs.field(default=False, init=False)
    _limiter: anyio.CapacityLimiter | None = attrs.field(default=None, init=False)
    _writer: SQLiteWriter | None = attrs.field(default=None, init=False)
    _closed: bool = attrs.field(default=False, init=False)
    # Session ids and identities (uid) by name, for the common commit (see _ADVANCE_KNOWN):
    # the writer's thread's.
    _ids: dict[str, tuple[int, str]] = attrs.field(factory=dict, init=False)
    # The change feed's thread and its watches (see :meth:`watch`), made by the first watch.
    _monitor: ChangeMonitor | None = attrs.field(default=None, init=False)
    _monitor_lock: threading.Lock = attrs.field(factory=threading.Lock, init=False)
    # The writer's account of its commits, for the feed's solo mode (made with the writer).
    _own: OwnCommits | None = attrs.field(default=None, init=False)

    def __attrs_post_init__(self) -> None:
        self._file = FileIdentity(self.path)
        if self.synchronous not in ("FULL", "NORMAL", "OFF", "EXTRA"):
            raise ValueError(
                f"synchronous must be FULL, NORMAL, OFF or EXTRA, got {self.synchronous!r}"
            )
        if isinstance(self.busy_timeout, bool) or not isinstance(self.busy_timeout, int | float):
            raise ValueError(f"busy_timeout must be a number of seconds, got {self.busy_timeout!r}")
        if self.encryption is not None:
            if not isinstance(self.encryption, Encryption):
                raise TypeError(f"encryption is an Encryption(provider), got {self.encryption!r}")
            self._keyring = Keyring(self.encryption)

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
            with translated_errors(what):
                return function(connection)

        return await self._writer_thread().write(job)

    def _writer_thread(self) -> SQLiteWriter:
        if self._writer is None:
            # The writer's thread holds the opener, not the store, so that a store nobody
            # closed can still be garbage-collected (and warn).
            opener = Opener(self.path, self.synchronous, self.busy_timeout, self.adopt, self._file)
            # The file is checked once per write transaction, before any of its writes runs.
            self._own = OwnCommits(self.path)
            self._writer = SQLiteWriter(opener, check=self._file.check, fence=self._own)
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
            connection, self._immutable = open_read_only(self.path, self.busy_timeout)
            return connection
        return Opener(self.path, self.synchronous, self.busy_timeout, self.adopt, self._file)()

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

        def load(connection: sqlite3.Connection) -> Sequence[Event]:
            with translated_errors(f"cannot read session {session_id!r} from {self.path}"):
                return read_stored(
                    connection, session_id, since, self.path, full=False, keyring=self._keyring
                ).events

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
            with translated_errors(f"cannot read session {session_id!r} from {self.path}"):
                return read_stored(
                    connection, session_id, since, self.path, full=True, keyring=self._keyring
                )

        return await self._run(read)

    async def _commit(self, commit: Commit) -> str:
        rows = commit.events
        records = [(event.seq, encode(event)) for event in rows]  # encoded before joining a group
        metadata = latest_metadata(rows)
        if self._closed:
            raise StoreError(f"the store {self.url} is closed")
        if self.read_only:
            raise StoreError(f"the store {self.url} is open read-only")
        return await self._writer_thread().write(
            CommitJob(self.path, commit, records, metadata, self._ids, self._keyring)
        )

    async def _commit_rebased(self, commit: Commit) -> Rebased:
        session_id = commit.session_id

        def rebase(connection: sqlite3.Connection) -> Rebased:
            return rebase_in(connection, commit, self._ids, self.path, self._keyring)

        return await self._write(rebase, f"commit to session {session_id!r} in {self.path}")

    async def committed(self, session_id: str, commit_id: str) -> tuple[int, int] | None:
        """Where the commit ``commit_id`` landed (first seq, events), or None.

        A SQLite commit's outcome is always known to its caller; this is for a caller that
        lost track (a process restarted, say).
        """

        def committed(connection: sqlite3.Connection) -> tuple[int, int] | None:
            with translated_errors(f"cannot read session {session_id!r} from {self.path}"):
                found = connection.execute(
                    "SELECT c.seq, c.n FROM nous_commits c JOIN nous_sessions s ON s.id = c.sid"
                    " WHERE s.name = ? AND c.commit_id = ?",
                    (session_id, commit_id),
                ).fetchone()
            return None if found is None else (found[0], found[1])

        return await self._run(committed)

    async def _fork(self, session_id: str, new_session_id: str, at: int) -> None:
        def fork(connection: sqlite3.Connection) -> None:
            fork_row(connection, session_id, new_session_id, at, self.path, self._keyring)

        await self._write(fork, f"cannot fork session {session_id!r}")

    async def sessions(self) -> list[SessionInfo]:
        """Every session with a nonzero count, by id (a sharing fork's held events counted
        through its parent: a range count, as fits an administrative listing)."""

        def sessions(connection: sqlite3.Connection) -> list[SessionInfo]:
            with translated_errors(f"cannot list sessions in {self.path}"):
                return sessions_info(connection)

        return await self._run(sessions)

    async def _list(self, query: ListQuery) -> list[SessionEntry]:
        statement, parameters = listing(query)

        def page(connection: sqlite3.Connection) -> list[tuple[Any, ...]]:
            with translated_errors(f"cannot list sessions in {self.path}"):
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
            for name, count, parent, meta, created, active in await self._run(page)
        ]

    # The change feed --------------------------------------------------------------------------

    # The follower passes ``known`` (see nous_session._follower): a head it holds, such as
    # its own commit's, does not wake it.
    watch_takes_known: ClassVar[bool] = True

    async def watch(
        self,
        session_id: str,
        *,
        poll: float = DEFAULT_POLL,
        known: Known | None = None,
    ) -> AsyncGenerator[int, None]:
        """Yield the session's head as the feed first sees it, then its new head whenever a
        commit lands, whichever process or connection made it (and ``-1`` when the feed had to
        reopen its connection, another writer took a snapshot, or the session was deleted:
        its count went down, or it was made again; read everything then).

        Every watch of one store shares one thread and one read-only connection, which asks
        SQLite for ``PRAGMA data_version`` every ``poll`` seconds (the first watch's) and reads
        the watched sessions' heads only when it changed. A commit reaches its watches within
        about one poll; while every change the thread reads is one its watchers hold already
        (this process's own commits), it backs off, up to ``BACK_OFF_AT_MOST`` (8) polls
        between two checks, and the first change that wakes a watcher brings it back to one
        poll. With ``known``, a callable that returns what the watcher already holds
        as (count, horizon), whether a commit of its own is in flight, and optionally the
        identity (``uid``) of the session it holds, a head it holds is not yielded: the
        watcher's own commits do not wake it (a head that comes while its commit is in
        flight is asked about again each poll until that commit has answered), and a
        session with another identity than the watcher's yields ``-1``.
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
        monitor = await self._monitor_of(poll)
        async with closing(monitor.watch(session_id, known)) as heads:
            async for head in heads:
                yield head

    async def _attach_watch(
        self, session_id: str, known: Known, wake: Callable[[], None]
    ) -> tuple[Watches[Any], Watch] | None:
        """For an actor's follower: a watch of ``session_id`` served as
        :meth:`watch` serves one, with no task of its own until ``wake`` starts one (on this
        event loop, when the first head comes), and the feed to take its heads from and to
        detach it from; None for a ``":memory:"`` database (nothing else writes it)."""
        check_session_id(session_id)
        if self.path == ":memory:":
            return None
        monitor = await self._monitor_of(DEFAULT_POLL)
        return monitor, monitor.attach(session_id, known, wake)

    async def _monitor_of(self, poll: float) -> ChangeMonitor:
        """The change feed's thread and watches (made once, polling every ``poll``)."""
        if self._monitor is None:
            # Open the file first (once): a writable store makes its WAL and arms its
            # writer's account of its commits (solo mode), a read-only one checks it. A round
            # trip through the writer: not one per watch, as a registry opening 200 sessions
            # would queue 200 of them among their commits.
            await self._run(self._arm)
        with self._monitor_lock:
            if self._monitor is None:
                self._monitor = ChangeMonitor(self.path, poll, self._own)
            return self._monitor

    def _arm(self, connection: sqlite3.Connection) -> None:
        """On the writer's thread: arm its account of its commits (once; see OwnCommits)."""
        if self._own is not None and not self.read_only:
            self._own.arm(connection)

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
        if self._own is not None:
            self._own.close()
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


def feed_running(store: SQLiteStore) -> bool:
    """A hook for benchmarks only (benchmarks/suites/followers.py): whether the store's change
    feed thread has started (it starts with the first watch)."""
    return store._monitor is not None
