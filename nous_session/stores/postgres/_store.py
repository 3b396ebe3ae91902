"""The PostgreSQL store's class (the package's doc says how it works)."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import AsyncGenerator, Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from operator import itemgetter
from types import MappingProxyType, TracebackType
from typing import Any, ClassVar, Final, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import anyio
import anyio.lowlevel
import anyio.to_thread
import attrs
import orjson
import psycopg
from psycopg import sql
from psycopg_pool import ConnectionPool

from nous_session._json import dumps
from nous_session._logging import get_logger
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
from nous_session.errors import (
    ConflictError,
    CorruptRecordError,
    StoreError,
)
from nous_session.event import Event, EventType
from nous_session.listing import ListQuery, SessionEntry, SessionPage, from_micros, latest_metadata
from nous_session.metadata import SessionMetadata
from nous_session.stores.base import (
    Rebased,
    SessionInfo,
    Stored,
    check_commit_arguments,
    check_commit_state,
    check_fork_point,
    check_held,
    check_rebase_arguments,
    check_session_id,
    moved,
    place,
)
from nous_session.stores.postgres._erasure import scrub_tables
from nous_session.stores.postgres._errors import (
    commit_errors,
    errors,
    one_line,
    pipelined,
)
from nous_session.stores.postgres._feed import KEEPALIVE, Listener
from nous_session.stores.postgres._group import GroupCommits, Grouped
from nous_session.stores.postgres._schema import _MIGRATION_LOCK, _MIGRATIONS, SCHEMA_VERSION
from nous_session.stores.postgres._sql import Statements

__all__ = ["PostgresStore"]

T = TypeVar("T")

_logger = get_logger("nous_session.postgres")
_SCHEMA_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
_APPLICATION = "nous_session"
_LISTENER_APPLICATION = "nous_session listener"
_SEQ_MAX: Final = 2**63 - 1
_ROW_SEQ: Final[Callable[[Any], int]] = itemgetter(0)


def _tail(event: Event) -> bytes:
    """The event's record without its ``[1,<seq>`` head, for the database to renumber."""
    record = encode(event)
    head = b"[1,%d" % event.seq
    if not record.startswith(head):  # pragma: no cover - the codec's envelope changed
        raise AssertionError(f"unexpected record envelope {record[:16]!r}")
    return record[len(head) :]


def _check_since(since: object) -> None:
    if not isinstance(since, int) or isinstance(since, bool) or since < 0:
        raise ValueError(f"since must be an int >= 0, got {since!r}")


class _Unmatched(Exception):
    """Internal: the commit statement matched no session row (a count or horizon conflict)."""


class PostgresStore:
    """Sessions in a PostgreSQL database, shared by any number of processes.

    Args:
        url: a libpq connection URL, ``postgresql://user:password@host:port/database``.
        min_size: the connection pool's lower bound (connections for commits and reads;
            each :meth:`watch` holds one more of its own).
        max_size: the connection pool's upper bound.
        schema: the PostgreSQL schema holding the tables (created if missing); a plain
            identifier. A ``schema=`` query parameter in the URL sets it too (and is not passed
            on to libpq), so a URL alone can name it: ``postgresql://host/db?schema=tenant_a``.
        connect_timeout: seconds to wait for a connection before failing with StoreError
            (one bounded attempt first: an unreachable server is one clear error).
        read_only: inspect only: nothing is created or migrated (a schema without a current
            nous_session store is a StoreError) and the server refuses every write.

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
    ) -> None:
        if not isinstance(url, str) or not url.startswith(("postgresql://", "postgres://")):
            raise ValueError(f"a PostgreSQL URL starts with postgresql://, got {url!r}")
        url, from_url = _pop_schema(url)
        if from_url is not None and schema == "public":
            schema = from_url
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
        self.schema = schema
        self.read_only = read_only
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
                "application_name": _APPLICATION,
                "connect_timeout": max(1, int(connect_timeout)),
                **({"options": "-c default_transaction_read_only=on"} if read_only else {}),
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
                self.url,
                autocommit=True,
                application_name=_APPLICATION,
                connect_timeout=max(1, int(self._connect_timeout)),
            )
        except psycopg.Error as error:
            raise StoreError(f"cannot connect to {self._redacted()}: {one_line(error)}") from None
        try:
            if self.read_only:
                self._check_schema(probe)
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

    def _check_schema(self, connection: psycopg.Connection[Any]) -> None:
        """For a read-only store: the schema must hold a current nous_session store."""
        with errors(f"cannot read {self._redacted()}"):
            found = connection.execute(
                "SELECT 1 FROM information_schema.tables"
                " WHERE table_schema = %s AND table_name = 'nous_schema'",
                (self.schema,),
            ).fetchone()
            version = (
                connection.execute(
                    sql.SQL("SELECT version FROM {}.nous_schema").format(
                        sql.Identifier(self.schema)
                    )
                ).fetchone()
                if found
                else None
            )
        if version is None:
            raise StoreError(
                f"schema {self.schema!r} of {self._redacted()} is not a nous_session store"
            )
        if version[0] != SCHEMA_VERSION:
            raise StoreError(
                f"schema {self.schema!r} has version {version[0]}; this nous_session reads"
                f" version {SCHEMA_VERSION} (open it for writing once to migrate it)"
            )

    def _check_writable(self) -> None:
        if self.read_only:
            raise StoreError(f"the store {self._redacted()} is open read-only")

    def _migrate(self, connection: psycopg.Connection[Any]) -> None:
        schema = sql.Identifier(self.schema)
        with connection.transaction():
            # Serialise migrations across processes; released at the end of the transaction.
            connection.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
            connection.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(schema))
            connection.execute(
                sql.SQL(
                    "CREATE TABLE IF NOT EXISTS {}.nous_schema (version integer NOT NULL)"
                ).format(schema)
            )
            rows = connection.execute(
                sql.SQL("SELECT version FROM {}.nous_schema").format(schema)
            ).fetchall()
            if len(rows) > 1:
                raise StoreError(f"{self.schema}.nous_schema holds {len(rows)} rows; expected one")
            version = rows[0][0] if rows else 0
            if version > SCHEMA_VERSION:
                raise StoreError(
                    f"schema {self.schema!r} has version {version}, newer than this nous_session "
                    f"understands ({SCHEMA_VERSION}); upgrade nous_session to open it"
                )
            for step in range(version, SCHEMA_VERSION):
                for statement in _MIGRATIONS[step]:
                    connection.execute(sql.SQL(statement).format(schema=schema))
            if not rows:
                connection.execute(
                    sql.SQL("INSERT INTO {}.nous_schema (version) VALUES (%s)").format(schema),
                    (SCHEMA_VERSION,),
                )
            elif version != SCHEMA_VERSION:
                connection.execute(
                    sql.SQL("UPDATE {}.nous_schema SET version = %s").format(schema),
                    (SCHEMA_VERSION,),
                )

    # Reading views ----------------------------------------------------------------------------

    def _row(
        self, connection: psycopg.Connection[Any], session_id: str, *, lock: str = ""
    ) -> tuple[int, int, str | None, int | None, bool] | None:
        query = self._sql.row_query if not lock else self._sql.row_query + sql.SQL(" " + lock)
        found = connection.execute(query, (session_id,)).fetchone()
        return None if found is None else tuple(found)

    def _ranges(
        self, connection: psycopg.Connection[Any], session_id: str, row: tuple[Any, ...]
    ) -> list[tuple[str, int, int]]:
        """Where a session's events are: ``(session, lowest, highest seq)`` per session of its
        sharing lineage, oldest first (disjoint, ascending)."""
        ranges: list[tuple[str, int, int]] = []
        upto = _SEQ_MAX
        name = session_id
        _, _, parent, fork_point, shares = row
        while shares and parent is not None and fork_point is not None:
            ranges.append((name, fork_point + 1, upto))
            upto = min(upto, fork_point)
            name = parent
            found = self._row(connection, name)
            if found is None:  # pragma: no cover - a delete gives its forks copies first
                raise StoreError(f"the parent {name!r} of a fork is missing")
            _, _, parent, fork_point, shares = found
        ranges.append((name, 0, upto))
        ranges.reverse()
        return ranges

    def _view(
        self,
        connection: psycopg.Connection[Any],
        session_id: str,
        row: tuple[Any, ...],
        since: int,
    ) -> list[Any]:
        rows: list[Any] = []
        for name, low, high in self._ranges(connection, session_id, row):
            if high >= max(low, since):
                rows.extend(
                    connection.execute(
                        self._sql.range_query, (name, max(low, since), high)
                    ).fetchall()
                )
        return rows

    def _inherited(
        self,
        connection: psycopg.Connection[Any],
        session_id: str,
        row: tuple[Any, ...],
        since: int,
    ) -> tuple[list[Any], list[Any]]:
        """The idempotency keys (key, first seq, count) with first seq >= ``since``, and the
        kept events, that a sharing fork answers from its lineage: each ancestor's within the
        range of its rows the fork shares (a key only if all its events are). Looked up, not
        copied."""
        keys: list[Any] = []
        kept: list[Any] = []
        if not row[4]:
            return keys, kept
        for name, low, high in self._ranges(connection, session_id, row)[:-1]:
            keys += connection.execute(
                sql.SQL(
                    "SELECT key, seq, n FROM {} WHERE session = %s AND seq >= %s"
                    " AND seq + n - 1 <= %s"
                ).format(self._sql.keys),
                (name, max(low, since), high),
            ).fetchall()
            kept += connection.execute(
                sql.SQL(
                    "SELECT seq, record FROM {} WHERE session = %s AND seq >= %s AND seq <= %s"
                    " ORDER BY seq"
                ).format(self._sql.kept),
                (name, low, high),
            ).fetchall()
        return keys, kept

    def _own_copy(self, connection: psycopg.Connection[Any], session_id: str) -> None:
        """Give a sharing fork its own copy of the rows it shares, and of the keys and kept
        events it inherits, and stop it sharing."""
        row = self._row(connection, session_id, lock="FOR UPDATE")
        if row is None or not row[4]:
            return
        keys, kept = self._inherited(connection, session_id, row, 0)
        if keys:
            connection.execute(
                sql.SQL(
                    "INSERT INTO {} (session, key, seq, n) SELECT %s, k.key, k.seq, k.n"
                    " FROM unnest(%s::text[], %s::bigint[], %s::int[]) AS k (key, seq, n)"
                    " ON CONFLICT DO NOTHING"
                ).format(self._sql.keys),
                (
                    session_id,
                    [key for key, _, _ in keys],
                    [seq for _, seq, _ in keys],
                    [n for _, _, n in keys],
                ),
            )
        if kept:
            connection.execute(
                sql.SQL(
                    "INSERT INTO {} (session, seq, record) SELECT %s, k.seq, k.record"
                    " FROM unnest(%s::bigint[], %s::bytea[]) AS k (seq, record)"
                    " ON CONFLICT DO NOTHING"
                ).format(self._sql.kept),
                (session_id, [seq for seq, _ in kept], [record for _, record in kept]),
            )
        for name, low, high in self._ranges(connection, session_id, row)[:-1]:
            connection.execute(
                sql.SQL(
                    "INSERT INTO {events} (session, seq, record) SELECT %s, seq, record"
                    " FROM {events} WHERE session = %s AND seq >= %s AND seq <= %s"
                ).format(events=self._sql.events),
                (session_id, name, low, high),
            )
        connection.execute(
            sql.SQL("UPDATE {} SET shares = false WHERE name = %s").format(self._sql.sessions),
            (session_id,),
        )

    def _release_shared(
        self,
        connection: psycopg.Connection[Any],
        session_id: str,
        row: tuple[Any, ...],
        lowest: int,
    ) -> None:
        """Before rows from seq ``lowest`` on are dropped: the forks sharing any of them, and
        the session itself if it shares them from its parent, get copies."""
        children = connection.execute(
            sql.SQL(
                "SELECT name FROM {} WHERE parent = %s AND shares AND fork_point >= %s"
                " ORDER BY name FOR UPDATE"
            ).format(self._sql.sessions),
            (session_id, lowest),
        ).fetchall()
        for (child,) in children:
            self._own_copy(connection, child)
        _, _, _, fork_point, shares = row
        if shares and fork_point is not None and lowest <= fork_point:
            self._own_copy(connection, session_id)

    # The Store protocol -----------------------------------------------------------------------

    async def load(self, session_id: str, *, since: int = 0) -> Sequence[Event]:
        """The session's held events with seq >= ``since``, in seq order.

        Raises:
            CorruptRecordError: a row cannot be decoded (the error names session and seq).
            StoreError: the database cannot be read.
        """
        _check_since(since)
        query = sql.SQL(
            "SELECT seq, record FROM {} WHERE session = %s AND seq >= %s ORDER BY seq"
        ).format(self._sql.events)

        def load() -> list[Event]:
            with (
                errors(f"cannot read session {session_id!r}"),
                self._pool.connection() as connection,
                # One snapshot for both statements: read committed would let a commit land
                # between them, and the rows would not fit the count.
                pipelined(connection, begin="BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY"),
            ):
                found = connection.execute(self._sql.row_query, (session_id,))
                own = connection.execute(query, (session_id, since))
                row = found.fetchone()
                if row is not None and row[4]:  # a sharing fork: read through its parent
                    rows = self._view(connection, session_id, row, since)
                else:
                    rows = own.fetchall()
            if row is not None:
                check_held(
                    session_id,
                    rows,
                    count=row[0],
                    horizon=row[1],
                    since=since,
                    where=f"schema {self.schema}",
                    seq=_ROW_SEQ,
                )
            return decode_rows(rows, place(session_id, f"schema {self.schema}"))

        return await self._read(load)

    async def read(self, session_id: str, *, since: int = 0) -> Stored:
        """The session's events from ``since`` with its count, horizon, keys and lineage, in
        one repeatable-read transaction (one round trip unless the session is a fork).

        Raises:
            CorruptRecordError: a row cannot be decoded (the error names session and seq).
            StoreError: the database cannot be read.
        """
        _check_since(since)
        events_query = sql.SQL(
            "SELECT seq, record FROM {} WHERE session = %s AND seq >= %s ORDER BY seq"
        ).format(self._sql.events)
        keys_query = sql.SQL("SELECT key, seq, n FROM {} WHERE session = %s AND seq >= %s").format(
            self._sql.keys
        )
        kept_query = sql.SQL("SELECT seq, record FROM {} WHERE session = %s ORDER BY seq").format(
            self._sql.kept
        )

        def read() -> Stored:
            with (
                errors(f"cannot read session {session_id!r}"),
                self._pool.connection() as connection,
                pipelined(connection, begin="BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY"),
            ):
                found = connection.execute(self._sql.row_query, (session_id,))
                own = connection.execute(events_query, (session_id, since))
                keyed = connection.execute(keys_query, (session_id, since))
                aside = connection.execute(kept_query, (session_id,)) if since == 0 else None
                row = found.fetchone()
                inherited: list[Any] = []
                inherited_kept: list[Any] = []
                if row is not None and row[4]:
                    rows = self._view(connection, session_id, row, since)
                    inherited, inherited_kept = self._inherited(connection, session_id, row, since)
                else:
                    rows = own.fetchall()
                keys = inherited + keyed.fetchall()  # the fork's own keys come after
                kept = [] if aside is None else sorted(inherited_kept + aside.fetchall())
            if row is None:
                return Stored((), 0)
            count, horizon, parent, fork_point, _ = row
            check_held(
                session_id,
                rows,
                count=count,
                horizon=horizon,
                since=since,
                where=f"schema {self.schema}",
                seq=_ROW_SEQ,
            )
            where = place(session_id, f"schema {self.schema}")
            return Stored(
                decode_rows(rows, where),
                count,
                horizon,
                MappingProxyType({key: (seq, n) for key, seq, n in keys}),
                tuple(decode_rows(kept, where)),
                parent,
                fork_point,
            )

        return await self._read(read)

    _group_commits: ClassVar[bool] = True
    """Whether a commit that drops nothing joins a round's group (a switch for benchmarks)."""

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
        """Insert ``events`` and delete ``dropped`` in one statement, then notify watchers.

        A commit that drops nothing shares its transaction with the other commits sent in the
        same round (see the module doc); its outcome is its own.

        Raises:
            ConflictError: the stored count (or horizon) is not the expected one, or a key or
                the commit id is taken; nothing was written.
            OutcomeUnknownError: the connection was lost: the commit may have landed. Send it
                again with the same ``commit_id`` (exactly one of the two lands).
            StoreError: the database failed; nothing was written.
        """
        self._check_writable()
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
        count = rows[-1].seq + 1 if rows else expected_count
        metadata = latest_metadata(rows)
        parameters = {
            "name": session_id,
            "expected": expected_count,
            "expected_horizon": expected_horizon,
            "horizon": horizon,
            "count": count,
            "dropped": list(dropped),
            "kept": list(kept),
            "key_names": [key for key, _, _ in keys],
            "key_seqs": [first for _, first, _ in keys],
            "key_sizes": [size for _, _, size in keys],
            "commit_id": commit_id,
            "first": rows[0].seq if rows else expected_count,
            "size": len(rows),
            "channel": self._channel,
            # orjson: a tenth of json.dumps's time, on every commit's path on the event loop.
            "payload": orjson.dumps({"session": session_id, "head": count}).decode(),
            "meta": None if metadata is None else metadata[1].decode(),
            "meta_seq": None if metadata is None else metadata[0],
        }
        statement = self._sql.first_commit if expected_count == 0 else self._sql.commit
        # A snapshot, or a horizon to check against the stored one, is committed under the
        # session's row lock (check_commit_state needs the stored horizon).
        locked = bool(dropped) or (horizon is not None and expected_horizon is None)
        if not locked and self._group_commits:
            await self._groups.commit(Grouped(session_id, statement, parameters, rows))
            return

        def commit() -> None:
            parameters["seqs"] = [event.seq for event in rows]
            parameters["records"] = [encode(event) for event in rows]
            with commit_errors(session_id), self._pool.connection() as connection:
                if locked:
                    # A snapshot first gives the forks sharing what it drops their copies,
                    # under the session's row lock, in the same transaction.
                    with connection.transaction():
                        row = self._row(connection, session_id, lock="FOR UPDATE")
                        count, stored_horizon = (0, 0) if row is None else row[:2]
                        if count == expected_count and expected_horizon in (None, stored_horizon):
                            # A conflict is the statement's to report; only then this.
                            parameters["horizon"] = check_commit_state(
                                session_id,
                                stored_horizon,
                                dropped=dropped,
                                horizon=horizon,
                                expected_horizon=expected_horizon,
                            )
                        if row is not None and dropped:
                            self._release_shared(connection, session_id, row, min(dropped))
                        done = connection.execute(statement, parameters).fetchone()
                        if done is None:
                            raise _Unmatched
                else:
                    done = connection.execute(statement, parameters).fetchone()
            if done is None:
                raise _Unmatched

        try:
            await self._run(commit)
        except _Unmatched:
            raise ConflictError(
                f"session {session_id!r} does not have count {expected_count}"
                + ("" if expected_horizon is None else f" and horizon {expected_horizon}")
                + ": another writer committed first"
            ) from None

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

        One transaction, pipelined into one round trip: move the count by the batch's length
        (which waits for the session's row lock, so concurrent writers queue up in the
        database instead of failing), insert the batch after the old count, read what other
        writers stored since ``expected_count``, notify watchers, commit.

        Raises:
            ConflictError: the stored count is below ``expected_count``, or a key or the
                commit id is taken; nothing was written.
            CorruptRecordError: a record another writer stored in between cannot be decoded.
                The batch itself was committed (the records are read in the same round trip
                as the commit); the message says so and where. The session cannot be loaded
                either until that record is repaired.
            OutcomeUnknownError, StoreError: as for :meth:`commit`.
        """
        self._check_writable()
        rows = check_rebase_arguments(
            session_id, expected_count, events, keys=keys, commit_id=commit_id
        )
        metadata = latest_metadata(rows)
        parameters: dict[str, Any] = {
            "name": session_id,
            "expected": expected_count,
            "n": len(rows),
            "key_names": [key for key, _, _ in keys],
            "key_seqs": [first for _, first, _ in keys],
            "key_sizes": [size for _, _, size in keys],
            "commit_id": commit_id,
            "channel": self._channel,
            "meta": None if metadata is None else metadata[1].decode(),
            "meta_offset": None if metadata is None else metadata[0] - expected_count,
        }

        def commit() -> tuple[Any, list[Any], list[Any]]:
            parameters["tails"] = [_tail(event) for event in rows]
            with commit_errors(session_id), self._pool.connection() as connection:
                with pipelined(connection, begin="BEGIN"):
                    if expected_count == 0:
                        connection.execute(self._sql.ensure_row, parameters)
                    connection.execute(self._sql.lock_row, parameters)
                    counted = connection.execute(self._sql.rebased, parameters)
                    others = connection.execute(self._sql.others, parameters)
                    keyed = connection.execute(self._sql.others_keys, parameters)
                return counted.fetchone(), others.fetchall(), keyed.fetchall()

        def refused() -> BaseException:
            """Why nothing moved: a count below the caller's, or rows missing."""
            with (
                errors(f"cannot read session {session_id!r}"),
                self._pool.connection() as connection,
            ):
                found = connection.execute(self._sql.held_seqs, parameters).fetchall()
            if found and found[0][0] >= expected_count:
                count, horizon, low = found[0][0], found[0][1], found[0][2]
                check_held(
                    session_id,
                    [seq for _, _, _, seq in found if seq is not None],
                    count=count,
                    horizon=horizon,
                    since=low,
                    where=f"schema {self.schema}",
                    seq=int,
                )
                return ConflictError(
                    f"session {session_id!r} changed while committing; nothing was written"
                )
            return ConflictError(
                f"session {session_id!r} has a count below the expected {expected_count}"
                " (deleted, or written by another store?); nothing was written"
            )

        done, others, keyed = await self._run(commit)
        if done is None:
            raise await self._run(refused)
        base, horizon = done[0], done[1]
        shift = base - expected_count
        try:
            between = decode_rows(others, place(session_id, f"schema {self.schema}"))
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
        )

    async def committed(self, session_id: str, commit_id: str) -> tuple[int, int] | None:
        """Where the commit ``commit_id`` landed (first seq, events), or None.

        A commit whose reply was lost may still be in flight on the server when this runs:
        the SessionActor first sends it again (the commit id makes that safe), and asks this
        only once the second attempt has an answer.

        Raises:
            StoreError: the database cannot be read.
        """
        query = sql.SQL("SELECT seq, n FROM {} WHERE session = %s AND commit_id = %s").format(
            self._sql.commits
        )

        def committed() -> tuple[int, int] | None:
            with (
                errors(f"cannot read session {session_id!r}"),
                self._pool.connection() as connection,
            ):
                found = connection.execute(query, (session_id, commit_id)).fetchone()
            return None if found is None else (found[0], found[1])

        return await self._read(committed)

    async def fork(self, session_id: str, new_session_id: str, *, at: int) -> None:
        """A new session sharing ``session_id``'s rows up to seq ``at``: one row inserted,
        whatever the history's length (see :class:`~nous_session.stores.base.ForkingStore`)."""
        self._check_writable()
        check_session_id(new_session_id)
        insert = sql.SQL(
            "INSERT INTO {} (name, count, horizon, parent, fork_point, shares, meta, meta_seq)"
            " VALUES (%s, %s, %s, %s, %s, true, %s::jsonb, %s)"
            " ON CONFLICT (name) DO UPDATE SET count = excluded.count, horizon = excluded.horizon,"
            " parent = excluded.parent, fork_point = excluded.fork_point, shares = true,"
            " meta = excluded.meta, meta_seq = excluded.meta_seq, created = now(), active = now()"
            " WHERE {}.count = 0 RETURNING 1"
        ).format(self._sql.sessions, self._sql.sessions)

        def fork() -> None:
            with (
                errors(f"cannot fork session {session_id!r}"),
                self._pool.connection() as connection,
                connection.transaction(),
            ):
                # FOR SHARE: a snapshot of the parent (which locks its row to give its forks
                # copies) waits for this fork, and then sees it.
                parent = self._row(connection, session_id, lock="FOR SHARE")
                if parent is None or parent[0] == 0:
                    raise ValueError(f"no session {session_id!r} to fork")
                check_fork_point(session_id, at, parent[0], parent[1])
                meta, meta_seq = self._metadata_at(connection, session_id, parent, at)
                made = connection.execute(
                    insert, (new_session_id, at + 1, parent[1], session_id, at, meta, meta_seq)
                ).fetchone()
                if made is None:
                    raise ValueError(f"session {new_session_id!r} exists already")

        await self._run(fork)

    async def sessions(self) -> list[SessionInfo]:
        """Every session with a nonzero count, by id (held events counted: index scans, as
        fits an administrative listing; a fork's through its parent)."""
        query = sql.SQL(
            "SELECT s.name, s.count, s.horizon, s.parent, s.fork_point, s.shares,"
            " (SELECT count(*) FROM {events} e WHERE e.session = s.name)"
            ' FROM {sessions} s WHERE s.count > 0 ORDER BY s.name COLLATE "C"'
        ).format(sessions=self._sql.sessions, events=self._sql.events)
        count_range = sql.SQL(
            "SELECT count(*) FROM {} WHERE session = %s AND seq >= %s AND seq <= %s"
        ).format(self._sql.events)

        def sessions() -> list[SessionInfo]:
            infos = []
            with errors("cannot list sessions"), self._pool.connection() as connection:
                for name, count, horizon, parent, fork_point, shares, held in connection.execute(
                    query
                ).fetchall():
                    if shares:
                        row = (count, horizon, parent, fork_point, shares)
                        held = sum(
                            connection.execute(count_range, part).fetchone()[0]  # type: ignore[index]
                            for part in self._ranges(connection, name, row)
                        )
                    infos.append(SessionInfo(name, count, held, horizon, parent, fork_point))
            return infos

        return await self._read(sessions)

    def _metadata_at(
        self,
        connection: psycopg.Connection[Any],
        session_id: str,
        row: tuple[Any, ...],
        at: int,
    ) -> tuple[str | None, int | None]:
        """The metadata record (JSON text) and its seq that the session had at seq ``at``: its
        current one unless it changed after ``at``; then the newest metadata event up to
        ``at``, read back from ``at`` (metadata events are rare: the rare, slow case)."""
        found = connection.execute(
            sql.SQL("SELECT meta, meta_seq FROM {} WHERE name = %s").format(self._sql.sessions),
            (session_id,),
        ).fetchone()
        assert found is not None
        meta, meta_seq = found
        if meta_seq is None or meta_seq <= at:
            return (None if meta is None else json.dumps(meta)), meta_seq
        where = place(session_id, f"schema {self.schema}")
        held = [item for item in self._view(connection, session_id, row, 0) if item[0] <= at]
        for seq, record in reversed(held):
            (event,) = decode_rows([(seq, record)], where)
            if event.type is EventType.METADATA:
                return dumps(event.data.get("metadata", {})).decode(), seq
        return None, None

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
        name).

        Raises:
            ValueError: a bad argument or cursor.
            StoreError: the database cannot be read.
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
        statement, parameters = self._listing(query)

        def listing() -> list[Any]:
            with errors("cannot list sessions"), self._pool.connection() as connection:
                return connection.execute(statement, parameters).fetchall()

        found = await self._read(listing)
        return query.page(
            [
                SessionEntry(
                    name,
                    SessionMetadata() if meta is None else SessionMetadata.from_json(meta),
                    created.astimezone(UTC),
                    active.astimezone(UTC),
                    count,
                    parent,
                )
                for name, count, parent, meta, created, active in found
            ]
        )

    def _listing(self, query: ListQuery) -> tuple[sql.Composed, list[Any]]:
        """The SELECT (and its parameters) for a listing: one page and one more row, walking
        the index (owner, time, name), or (time, name) with no owner, from the cursor; the
        other filters are checked on the rows it yields."""
        column = sql.Identifier(query.order)
        clauses: list[sql.Composable] = [sql.SQL("count > 0")]
        parameters: list[Any] = []
        extra: dict[str, Any] = {}
        for key, wanted in query.where:
            if key in ("owner", "app"):
                clauses.append(sql.SQL("{} = %s").format(sql.Identifier(key)))
                parameters.append(wanted)
            elif key == "title":
                clauses.append(sql.SQL("meta ->> 'title' = %s"))
                parameters.append(wanted)
            else:
                extra[key] = wanted
        if extra:
            # Containment is JSON equality for scalars (1 matches 1.0; a bool is no number).
            clauses.append(sql.SQL("meta -> 'extra' @> %s::jsonb"))
            parameters.append(json.dumps(extra))
        if query.tags:
            clauses.append(sql.SQL("meta -> 'tags' @> %s::jsonb"))
            parameters.append(json.dumps(sorted(query.tags)))
        for name, low, high in (
            ("created", query.created_since, query.created_before),
            ("active", query.active_since, query.active_before),
        ):
            if low is not None:
                clauses.append(sql.SQL("{} >= %s").format(sql.Identifier(name)))
                parameters.append(from_micros(low))
            if high is not None:
                clauses.append(sql.SQL("{} < %s").format(sql.Identifier(name)))
                parameters.append(from_micros(high))
        direction = sql.SQL("DESC" if query.descending else "ASC")
        if query.after is not None:
            clauses.append(
                sql.SQL("({}, name) " + ("<" if query.descending else ">") + " (%s, %s)").format(
                    column
                )
            )
            parameters.extend((from_micros(query.after[0]), query.after[1]))
        parameters.append(query.limit + 1)
        statement = sql.SQL(
            "SELECT name, count, parent, meta, created, active FROM {} WHERE {}"
            " ORDER BY {} {}, name {} LIMIT %s"
        ).format(self._sql.sessions, sql.SQL(" AND ").join(clauses), column, direction, direction)
        return statement, parameters

    async def delete_idle(self, session_id: str, *, count: int, active: datetime) -> bool:
        """Delete the session if its count and last-active time are still these, checked under
        its row lock in the deleting transaction (see
        :class:`~nous_session.stores.base.ListingStore`)."""
        self._check_writable()
        check = sql.SQL("SELECT count, active FROM {} WHERE name = %s FOR UPDATE").format(
            self._sql.sessions
        )

        def delete() -> bool:
            with (
                errors(f"cannot delete session {session_id!r}"),
                self._pool.connection() as connection,
                connection.transaction(),
            ):
                found = connection.execute(check, (session_id,)).fetchone()
                if found is None or found[0] != count or found[1] != active:
                    return False
                row = self._row(connection, session_id)
                assert row is not None
                self._release_shared(connection, session_id, row, 0)
                for table in (self._sql.events, self._sql.keys, self._sql.commits, self._sql.kept):
                    connection.execute(
                        sql.SQL("DELETE FROM {} WHERE session = %s").format(table), (session_id,)
                    )
                connection.execute(
                    sql.SQL("DELETE FROM {} WHERE name = %s").format(self._sql.sessions),
                    (session_id,),
                )
                return True

        return await self._run(delete)

    async def delete(self, session_id: str) -> bool:
        """Delete a session and all its events in one transaction (its forks get their own
        copy first); True when it existed."""
        self._check_writable()

        def delete() -> bool:
            with (
                errors(f"cannot delete session {session_id!r}"),
                self._pool.connection() as connection,
                connection.transaction(),
            ):
                row = self._row(connection, session_id, lock="FOR UPDATE")
                if row is None:
                    return False
                self._release_shared(connection, session_id, row, 0)
                for table in (self._sql.events, self._sql.keys, self._sql.commits, self._sql.kept):
                    connection.execute(
                        sql.SQL("DELETE FROM {} WHERE session = %s").format(table), (session_id,)
                    )
                connection.execute(
                    sql.SQL("DELETE FROM {} WHERE name = %s").format(self._sql.sessions),
                    (session_id,),
                )
                return True

        return await self._run(delete)

    # Erasure ----------------------------------------------------------------------------------

    async def erase(
        self,
        session_id: str,
        seqs: Iterable[int],
        *,
        reason: str,
        at: datetime | None = None,
        dry_run: bool = False,
        rewrite: bool = True,
        lock_timeout: float = 60.0,
    ) -> Erasure:
        """Replace the events at ``seqs`` by their erased form wherever the tables hold them
        (see :class:`~nous_session.stores.base.ErasingStore`), then scrub the tables.

        The rows are updated in one transaction (the sessions involved are locked against
        a concurrent snapshot or delete copying them meanwhile; commits to them wait for it).
        An UPDATE leaves the old row version in its page, and a plain ``VACUUM`` only marks
        it free: its bytes stay in the page's free space until something is written over
        them. So, with ``rewrite`` (the default), ``VACUUM FULL`` then rewrites the events
        and kept tables (and their TOAST tables) into new files: it takes an ACCESS
        EXCLUSIVE lock on each, so every read and commit of every session in this schema
        waits for it, and it costs time and disk in proportion to the table. It waits at
        most ``lock_timeout`` seconds for its lock. It copies a dead row version that some
        transaction's snapshot may still see: the result is proven only when no snapshot
        older than the erasure was open (checked for up to ``lock_timeout`` seconds, in
        ``pg_stat_activity``, prepared transactions and replication slots) and the
        ``VACUUM FULL`` ran. Without ``rewrite``, a plain ``VACUUM`` runs and the result is
        not proven.

        Raises:
            ValueError: a bad seq or reason, or no such session; nothing was changed.
            StoreError: the database failed; nothing was changed (or, if only the scrub
                failed, the rows were erased and the result says so).
        """
        reason = check_reason(reason)
        when = erasure_time(at)
        wanted = check_seqs(seqs)
        return await self._erase(
            session_id, wanted, None, reason, when, dry_run, rewrite, lock_timeout
        )

    async def erase_session(
        self,
        session_id: str,
        *,
        reason: str,
        inherited: bool = False,
        dry_run: bool = False,
        rewrite: bool = True,
        lock_timeout: float = 60.0,
    ) -> Erasure:
        """Erase every event the session wrote itself (with ``inherited``, also what it took
        from the session it was forked from), then scrub as :meth:`erase` does.

        Raises:
            ValueError: a bad reason, or no such session; nothing was changed.
            StoreError: the database failed; nothing was changed.
        """
        reason = check_reason(reason)
        return await self._erase(
            session_id, None, inherited, reason, erasure_time(None), dry_run, rewrite, lock_timeout
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
        lock_timeout: float,
    ) -> Erasure:
        if not dry_run:
            self._check_writable()
        if isinstance(lock_timeout, bool) or not isinstance(lock_timeout, int | float):
            raise ValueError(f"lock_timeout is a number of seconds, got {lock_timeout!r}")
        tables = {"events": self._sql.events, "kept": self._sql.kept}  # (an Identifier cannot hash)
        select = {
            name: sql.SQL("SELECT record FROM {} WHERE session = %s AND seq = %s").format(table)
            for name, table in tables.items()
        }
        update = {
            name: sql.SQL("UPDATE {} SET record = %s WHERE session = %s AND seq = %s").format(table)
            for name, table in tables.items()
        }
        children = sql.SQL(
            "SELECT name, fork_point FROM {} WHERE parent = %s AND fork_point IS NOT NULL"
            " ORDER BY name FOR SHARE"
        ).format(self._sql.sessions)
        own_kept = sql.SQL("SELECT seq FROM {} WHERE session = %s AND seq >= %s").format(
            self._sql.kept
        )
        forget_meta = sql.SQL(
            "UPDATE {} SET meta = %s::jsonb WHERE name = %s AND meta_seq = %s"
        ).format(self._sql.sessions)

        def erase() -> tuple[Erasure, str]:
            with (
                errors(f"cannot erase from session {session_id!r}"),
                self._pool.connection() as connection,
                connection.transaction(force_rollback=dry_run),
            ):
                row = self._row(connection, session_id, lock="FOR SHARE")
                if row is None or row[0] == 0:
                    raise ValueError(f"no session {session_id!r} to erase")
                if wanted is None:
                    low = 0 if inherited or row[3] is None else row[3] + 1
                    keys = {seq for seq, _ in self._view(connection, session_id, row, low)}
                    kept = self._inherited(connection, session_id, row, low)[1]
                    keys.update(seq for seq, _ in kept if seq >= low)
                    keys.update(seq for (seq,) in connection.execute(own_kept, (session_id, low)))
                    seqs: Sequence[int] = sorted(keys)
                else:
                    seqs = check_seqs(wanted, row[0], session_id=session_id)

                def parent_of(name: str) -> tuple[str, int] | None:
                    found = self._row(connection, name, lock="FOR SHARE")
                    if found is None or found[2] is None or found[3] is None:
                        return None
                    if self._row(connection, found[2], lock="FOR SHARE") is None:
                        return None
                    return found[2], found[3]

                forks: dict[str, list[Any]] = {}  # read (and locked) once per session

                def children_of(name: str, seq: int) -> list[str]:
                    if name not in forks:
                        forks[name] = connection.execute(children, (name,)).fetchall()
                    return [child for child, point in forks[name] if point >= seq]

                def copies_of(
                    members: Sequence[str], seq: int
                ) -> list[tuple[tuple[str, str], Event]]:
                    copies: list[tuple[tuple[str, str], Event]] = []
                    for member in members:
                        for table, query in select.items():
                            found = connection.execute(query, (member, seq)).fetchone()
                            if found is not None:
                                where = place(member, f"schema {self.schema}")(seq)
                                copies.append(((table, member), decode(found[0], where=where)))
                    return copies

                forgotten: dict[int, bytes] = {}  # erased metadata events: seq -> record

                def write(where: tuple[str, str], event: Event) -> None:
                    table, member = where
                    connection.execute(update[table], (encode(event), member, event.seq))
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
                # The sessions' copies of an erased metadata record go too.
                for seq, record in forgotten.items():
                    for member in family(session_id, seq, parent_of, children_of):
                        connection.execute(forget_meta, (record.decode(), member, seq))
                xid = connection.execute("SELECT pg_current_xact_id()::text").fetchone()
            done = Erasure(
                session_id,
                reason,
                at,
                tuple(erased),
                tuple(already),
                tuple(absent),
                tuple(sorted(others)),
                dry_run=dry_run,
            )
            return done, str(int(xid[0]) % 2**32) if xid else "0"

        done, xid = await self._run(erase)
        if dry_run:
            return attrs.evolve(done, detail="dry run: nothing was changed")
        proven, detail = await self._run(lambda: self._scrub(xid, rewrite, lock_timeout))
        return attrs.evolve(done, proven=proven, detail=detail)

    def _scrub(self, xid: str, rewrite: bool, lock_timeout: float) -> tuple[bool, str]:
        """After an erasing commit (transaction ``xid``), the tables scrubbed (see
        :func:`~nous_session.stores.postgres._erasure.scrub_tables`)."""
        with errors("the events were erased, but scrubbing the tables failed"):
            return scrub_tables(
                self.url,
                (self._sql.events, self._sql.kept),
                xid,
                rewrite=rewrite,
                lock_timeout=lock_timeout,
                connect_timeout=self._connect_timeout,
                application_name=_APPLICATION,
            )

    # The change feed --------------------------------------------------------------------------

    # The follower passes ``known`` (see nous_session._follower): a head it holds, such as
    # its own commit's, does not wake it.
    watch_takes_known: ClassVar[bool] = True

    async def watch(
        self,
        session_id: str,
        *,
        poll: float = 0.25,
        known: Callable[[], tuple[int, int, bool]] | None = None,
    ) -> AsyncGenerator[int, None]:
        """Yield the session's new head whenever a commit (from any process) lands.

        The first value, ``-1``, is yielded as soon as the store is listening, and again
        after every reconnection: the caller should read what it has missed then
        (``load(since=...)``). Each notification's head follows; a lost listener reconnects
        with a backoff. With ``known``, a callable that returns what the watcher holds as
        (count, horizon) and whether a commit of its own is in flight, a head at or below
        that count is not yielded, and one that comes while that commit is in flight is
        asked about again every few milliseconds until it has answered: the watcher's own
        commits do not wake it. ``known`` is called from the listener's thread, so it must
        only read.

        Every watch of one store shares one LISTEN connection and one thread (``poll``, the
        seconds that thread waits for notifications before it checks whether any watch is
        left, is the first watch's). Close the generator (``aclosing``) to leave it; the
        thread ends once no watch is left.
        """
        await self._run(lambda: None)  # connect and migrate first
        with self._listener_lock:
            if self._listener is None:
                self._listener = Listener(self._listen, poll)
            listener = self._listener
        heads = listener.watch(session_id, known)
        try:
            async for head in heads:
                yield head
        finally:
            with anyio.CancelScope(shield=True):
                await heads.aclose()

    def _listen(self) -> psycopg.Connection[Any]:
        connection = psycopg.connect(
            self.url,
            autocommit=True,
            application_name=_LISTENER_APPLICATION,
            connect_timeout=max(1, int(self._connect_timeout)),
            **KEEPALIVE,
        )
        try:
            connection.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self._channel)))
        except BaseException:
            connection.close()
            raise
        return connection

    async def follow(self, session_id: str, *, since: int = 0) -> AsyncGenerator[Event, None]:
        """Yield the session's events from ``since`` on, then each one committed later by any
        process, in seq order and at most once, across listener reconnections."""
        cursor = since
        watcher = self.watch(session_id)
        try:
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
        """Close the pool. Idempotent."""
        if self._closed:
            return
        self._closed = True
        await anyio.to_thread.run_sync(self._pool.close)

    async def __aenter__(self) -> PostgresStore:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


def _pop_schema(url: str) -> tuple[str, str | None]:
    """Split a ``schema=`` query parameter (ours, not libpq's) off a URL."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    schemas = [value for key, value in query if key == "schema"]
    if not schemas:
        return url, None
    rest = urlencode([(key, value) for key, value in query if key != "schema"])
    return urlunsplit(parts._replace(query=rest)), schemas[-1]
