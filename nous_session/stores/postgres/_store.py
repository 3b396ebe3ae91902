"""The PostgreSQL store's class (the package's doc says how it works)."""

from __future__ import annotations

import functools
import re
import threading
from collections.abc import Callable, Sequence
from datetime import UTC
from operator import itemgetter
from types import MappingProxyType
from typing import Any, ClassVar, Final, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import anyio
import anyio.lowlevel
import anyio.to_thread
import psycopg
from psycopg_pool import ConnectionPool

from nous_session._logging import get_logger
from nous_session.codec import decode_rows
from nous_session.encryption import Encryption
from nous_session.errors import (
    CorruptRecordError,
    StoreError,
)
from nous_session.event import Event
from nous_session.listing import ListQuery, SessionEntry, latest_metadata
from nous_session.metadata import SessionMetadata
from nous_session.stores._common import Commit, FeedStore
from nous_session.stores._sealed import Keyring
from nous_session.stores.base import (
    Rebased,
    SessionInfo,
    Stored,
    check_since,
    moved,
    place,
)
from nous_session.stores.postgres._commit import (
    rebase,
    refused,
)
from nous_session.stores.postgres._erasure import ErasingTables
from nous_session.stores.postgres._errors import (
    errors,
    one_line,
    pooled,
)
from nous_session.stores.postgres._feed import Listener, ListenerFeed
from nous_session.stores.postgres._group import GroupCommits
from nous_session.stores.postgres._keyed import KeyedTables
from nous_session.stores.postgres._keys import (
    rebase_sealed,
)
from nous_session.stores.postgres._leases import TableLeases
from nous_session.stores.postgres._rows import (
    fork_row,
    read_stored,
    sessions_info,
)
from nous_session.stores.postgres._schema import (
    check_schema,
    migrate,
)
from nous_session.stores.postgres._sql import APPLICATION, Statements, listing

__all__ = ["PostgresStore"]

T = TypeVar("T")

_logger = get_logger("nous_session.postgres")
_SCHEMA_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
_SEQ_MAX: Final = 2**63 - 1
_ROW_SEQ: Final[Callable[[Any], int]] = itemgetter(0)


class PostgresStore(KeyedTables, ErasingTables, TableLeases, ListenerFeed, FeedStore):
    """Sessions in a PostgreSQL database, shared by any number of processes.

    Args:
        url: a libpq connection URL, ``postgresql://user:password@host:port/database``.
        min_size: the connection pool's lower bound (connections for commits and reads;
            each watch holds one more of its own).
        max_size: the connection pool's upper bound.
        schema: the PostgreSQL schema holding the tables (created if missing); a plain
            identifier. A ``schema=`` query parameter in the URL sets it too (and is not passed
            on to libpq), so a URL alone can name it: ``postgresql://host/db?schema=tenant_a``.
        connect_timeout: seconds to wait for a connection before failing with StoreError
            (one bounded attempt first: an unreachable server is one clear error).
        read_only: inspect only: nothing is created or migrated (a schema without a current
            nous_session store is a StoreError) and the server refuses every write (through a
            pooled URL, the store's own checks refuse them: a pooler takes no session options).
        pooled: ``url`` goes through a transaction-pooling proxy (PgBouncer or a peer): no
            server-side prepared statements and no session state through it. Needs
            ``direct_url``. ``pooled=true`` in the URL's query says the same.
        direct_url: a URL that reaches the server itself, for what needs a session of its
            own: the change feed's ``LISTEN``, the schema's migration and erasure's scrub
            (default: ``url``). ``direct_url=`` in the URL's query (percent-encoded) too.
        encryption: seal every record written from now on under the session's data key
            (:class:`~nous_session.encryption.Encryption`; the ``crypto`` extra), and erase by
            destroying keys (see docs/erasure.md). Plain records already in the tables are
            read as they are. A schema holding encrypted sessions needs it to read them.

    Nothing connects until first use. Close with :meth:`aclose` (or ``async with``).
    """

    outcome_may_be_unknown: ClassVar[bool] = True
    """A connection lost during a commit leaves its outcome unknown: commits carry ids."""

    def __init__(
        self,
        url: str,
        *,
        min_size: int = 1,
        max_size: int = 8,
        schema: str = "public",
        connect_timeout: float = 10.0,
        read_only: bool = False,
        pooled: bool = False,
        direct_url: str | None = None,
        encryption: Encryption | None = None,
    ) -> None:
        if not isinstance(url, str) or not url.startswith(("postgresql://", "postgres://")):
            raise ValueError(f"a PostgreSQL URL starts with postgresql://, got {url!r}")
        url, ours = _pop_ours(url)
        if "schema" in ours and schema == "public":
            schema = ours["schema"]
        if "pooled" in ours:
            if ours["pooled"] not in ("true", "false", "1", "0"):
                raise ValueError(f"pooled= in the URL is true or false, got {ours['pooled']!r}")
            pooled = pooled or ours["pooled"] in ("true", "1")
        direct_url = direct_url if direct_url is not None else ours.get("direct_url")
        if direct_url is not None and (
            not isinstance(direct_url, str)
            or not direct_url.startswith(("postgresql://", "postgres://"))
        ):
            raise ValueError(f"direct_url is a postgresql:// URL, got {direct_url!r}")
        if pooled and direct_url is None:
            raise ValueError(
                "pooled=True needs direct_url=, a URL that reaches the server without the "
                "pooler: a change feed's LISTEN through a transaction pooler misses "
                "notifications without a word, and erasure's scrub needs a session of its own"
            )
        if encryption is not None and not isinstance(encryption, Encryption):
            raise TypeError(f"encryption is an Encryption(provider), got {encryption!r}")
        if not isinstance(schema, str) or not _SCHEMA_NAME.match(schema):
            raise ValueError(f"schema must be a plain identifier, got {schema!r}")
        if (
            not isinstance(min_size, int)
            or not isinstance(max_size, int)
            or not 0 <= min_size <= max_size
            or max_size < 1
        ):
            raise ValueError(
                f"need 0 <= min_size <= max_size and max_size >= 1, got {min_size}, {max_size}"
            )
        self.url = url
        self.direct_url = url if direct_url is None else direct_url
        self.pooled = pooled
        self.schema = schema
        self.read_only = read_only
        self.encryption = encryption
        self._keyring = None if encryption is None else Keyring(encryption)
        self._connect_timeout = connect_timeout
        self._channel = f"nous_session.{schema}"
        self._pool = ConnectionPool(
            url,
            min_size=min_size,
            max_size=max_size,
            open=False,
            timeout=connect_timeout,
            kwargs={
                "autocommit": True,
                "application_name": APPLICATION,
                "connect_timeout": max(1, int(connect_timeout)),
                # Through a transaction pooler a prepared statement lives on a server
                # connection the next transaction may not get; and a pooler takes no options.
                **({"prepare_threshold": None} if pooled else {}),
                **(
                    {"options": "-c default_transaction_read_only=on"}
                    if read_only and not pooled
                    else {}
                ),
            },
            name=f"nous_session[{schema}]",
        )
        self._limiter: anyio.CapacityLimiter | None = None
        self._max_size = max_size
        # The LISTEN connection and thread that every watch of this store shares.
        self._listener: Listener | None = None
        self._listener_lock = threading.Lock()
        self._opened = False
        self._open_lock = threading.Lock()
        self._closed = False
        self._sql = Statements(schema)
        self._where = f"schema {schema}"  # how errors name where a record is
        # The commits an event loop sends in one round, in one transaction.
        self._groups = GroupCommits(self._pool, self._sql, self._channel, self._run, max_size)

    def __repr__(self) -> str:
        return f"<PostgresStore {self._redacted()} schema={self.schema!r}>"

    def _redacted(self) -> str:
        return re.sub(r"(://[^:/@]+):[^@]*@", r"\1:***@", self.url)

    # Plumbing ---------------------------------------------------------------------------------

    async def _run(self, function: Callable[[], T]) -> T:
        if self._closed:
            raise StoreError(f"the store {self._redacted()} is closed")
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(self._max_size)
        if not self._opened:
            await anyio.to_thread.run_sync(self._open)
        return await anyio.to_thread.run_sync(function, limiter=self._limiter)

    async def _read(self, function: Callable[[], T]) -> T:
        """Run a read; once more if the pool's connection turns out to be dead (the server
        restarted, the backend was terminated): a read changes nothing, so trying it again is
        safe, once the pool has dropped every dead connection it holds."""
        try:
            return await self._run(function)
        except StoreError as error:
            if not isinstance(error.__cause__, psycopg.OperationalError):
                raise
            if self._opened:  # else the pool never opened (opening failed): nothing to check
                await anyio.to_thread.run_sync(self._pool.check)
            return await self._run(function)

    def _open(self) -> None:
        with self._open_lock:  # first calls may race from several worker threads
            if not self._opened:
                self._open_pool()

    def _open_pool(self) -> None:
        # One bounded attempt first: an unreachable server is one clear error after at most
        # connect_timeout, instead of the pool retrying (and logging) until its own timeout.
        try:
            probe = psycopg.connect(
                self.direct_url,
                autocommit=True,
                application_name=APPLICATION,
                connect_timeout=max(1, int(self._connect_timeout)),
            )
        except psycopg.Error as error:
            raise StoreError(f"cannot connect to {self._redacted()}: {one_line(error)}") from None
        try:
            if self.read_only:
                check_schema(probe, self.schema, self._redacted())
            else:
                with errors(f"cannot set up the schema in {self._redacted()}"):
                    self._migrate(probe)
        finally:
            probe.close()
        try:
            self._pool.open(wait=True, timeout=self._connect_timeout)
        except Exception as error:  # psycopg's or the pool's own timeout error
            raise StoreError(f"cannot connect to {self._redacted()}: {one_line(error)}") from None
        self._opened = True

    def _before_commit(self) -> None:
        self._check_writable()

    def _check_writable(self) -> None:
        if self.read_only:
            raise StoreError(f"the store {self._redacted()} is open read-only")

    def _migrate(self, connection: psycopg.Connection[Any]) -> None:
        migrate(connection, self.schema)

    # The Store protocol -----------------------------------------------------------------------

    async def load(self, session_id: str, *, since: int = 0) -> Sequence[Event]:
        """The session's held events with seq >= ``since``, in seq order.

        Raises:
            CorruptRecordError: a row cannot be decoded (the error names session and seq).
            StoreError: the database cannot be read.
        """
        check_since(since)

        def load() -> Sequence[Event]:
            with errors(f"cannot read session {session_id!r}"), self._pool.connection() as c:
                return read_stored(
                    c, self._sql, self._where, session_id, since, full=False, keyring=self._keyring
                ).events

        return await self._read(load)

    async def read(self, session_id: str, *, since: int = 0) -> Stored:
        """The session's events from ``since`` with its count, horizon, keys and lineage, in
        one repeatable-read transaction (one round trip unless the session is a fork).

        Raises:
            CorruptRecordError: a row cannot be decoded (the error names session and seq).
            StoreError: the database cannot be read.
        """
        check_since(since)

        def read() -> Stored:
            with errors(f"cannot read session {session_id!r}"), self._pool.connection() as c:
                return read_stored(
                    c, self._sql, self._where, session_id, since, full=True, keyring=self._keyring
                )

        return await self._read(read)

    async def _commit_rebased(self, commit: Commit) -> Rebased:
        session_id, expected_count, rows = commit.session_id, commit.expected_count, commit.events
        keys, commit_id = commit.keys, commit.commit_id
        metadata = latest_metadata(rows)
        parameters: dict[str, Any] = {
            "name": session_id,
            "expected": expected_count,
            "n": len(rows),
            "key_names": [key for key, _, _ in keys],
            "key_seqs": [first for _, first, _ in keys],
            "key_sizes": [size for _, _, size in keys],
            "commit_id": commit_id,
            "expected_uid": commit.expected_uid,
            "channel": self._channel,
            "meta": None if metadata is None else metadata[1].decode(),
            "meta_offset": None if metadata is None else metadata[0] - expected_count,
            "kid": None,
        }
        if self._keyring is None:
            done, others, keyed = await self._run(
                functools.partial(rebase, self._pool, self._sql, parameters, rows)
            )
        else:
            sealed = functools.partial(
                rebase_sealed, self._pool, self._sql, parameters, rows, self._keyring, self._where
            )
            done, others, keyed = await self._run(sealed)
        if done is None:
            raise await self._run(
                functools.partial(refused, self._pool, self._sql, parameters, self._where)
            )
        base, horizon, uid = done[0], done[1], done[2]
        shift = base - expected_count
        try:
            between = decode_rows(others, place(session_id, self._where))
            if len(between) < shift:
                # The statement read the session's own rows only: a sharing fork's events
                # from its parent (up to the fork point) are among the others too. Read
                # through its lineage (after the commit, as the others are decoded).
                stored = await self.read(session_id, since=expected_count)
                between = [event for event in stored.events if event.seq < base]
        except CorruptRecordError as error:
            raise CorruptRecordError(
                f"{error} (read while committing a batch, which was committed at seqs"
                f" {base}..{base + len(rows) - 1})"
            ) from error
        return Rebased(
            shift,
            between,
            moved(rows, shift) if shift else rows,
            MappingProxyType({key: (seq, n) for key, seq, n in keyed}),
            horizon,
            uid,
        )

    async def committed(self, session_id: str, commit_id: str) -> tuple[int, int] | None:
        """Where the commit ``commit_id`` landed (first seq, events), or None.

        A commit whose reply was lost may still be in flight on the server when this runs:
        the SessionActor first sends it again (the commit id makes that safe), and asks this
        only once the second attempt has an answer.

        Raises:
            StoreError: the database cannot be read.
        """

        def committed() -> tuple[int, int] | None:
            with errors(f"cannot read session {session_id!r}"), self._pool.connection() as c:
                found = c.execute(self._sql.committed, (session_id, commit_id)).fetchone()
            return None if found is None else (found[0], found[1])

        return await self._read(committed)

    async def _fork(self, session_id: str, new_session_id: str, at: int) -> None:
        def fork() -> None:
            with pooled(
                self._pool, f"cannot fork session {session_id!r}", transaction=True
            ) as connection:
                fork_row(
                    connection,
                    self._sql,
                    self._where,
                    session_id,
                    new_session_id,
                    at,
                    self._keyring,
                )

        await self._run(fork)

    async def sessions(self) -> list[SessionInfo]:
        """Every session with a nonzero count, by id (held events counted: index scans, as
        fits an administrative listing; a fork's through its parent)."""

        def sessions() -> list[SessionInfo]:
            with pooled(self._pool, "cannot list sessions") as connection:
                return sessions_info(connection, self._sql)

        return await self._read(sessions)

    async def _list(self, query: ListQuery) -> list[SessionEntry]:
        statement, parameters = listing(self._sql, query)

        def found() -> list[Any]:
            with pooled(self._pool, "cannot list sessions") as connection:
                return connection.execute(statement, parameters).fetchall()

        return [
            SessionEntry(
                name,
                SessionMetadata() if meta is None else SessionMetadata.from_json(meta),
                created.astimezone(UTC),
                active.astimezone(UTC),
                count,
                parent,
            )
            for name, count, parent, meta, created, active in await self._read(found)
        ]

    # Lifecycle --------------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Close the pool. Idempotent."""
        if self._closed:
            return
        self._closed = True
        await anyio.to_thread.run_sync(self._pool.close)


_OURS: Final = ("schema", "pooled", "direct_url")


def _pop_ours(url: str) -> tuple[str, dict[str, str]]:
    """Split the query parameters that are ours, not libpq's (``schema=``, ``pooled=``,
    ``direct_url=``), off a URL: the URL libpq gets, and ours (the last of each)."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    ours = {key: value for key, value in query if key in _OURS}
    if not ours:
        return url, {}
    rest = urlencode([(key, value) for key, value in query if key not in _OURS])
    return urlunsplit(parts._replace(query=rest)), ours


def group_counts(store: PostgresStore) -> tuple[int, int]:
    """A hook for benchmarks only (benchmarks/suites/_pg_worker.py): how many group
    transactions of more than one commit the store sent, and the commits they held."""
    return store._groups.transactions, store._groups.commits_sent
