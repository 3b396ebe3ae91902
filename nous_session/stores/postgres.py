"""PostgresStore: many processes and machines on one session store, with a live change feed.

Needs the ``postgres`` extra (``pip install nous_session[postgres]``: psycopg 3 and its pool).
psycopg's async API runs only on asyncio, so this store drives the synchronous driver in worker
threads, as the SQLite store does; it therefore works on asyncio and trio alike.

Schema (version 1), in the schema given to the store (``public`` by default)::

    nous_schema   (version)
    nous_sessions (name text PRIMARY KEY, count bigint)
    nous_events   (session text, seq bigint, record bytea, PRIMARY KEY (session, seq))

The primary key on (session, seq) is what makes the database itself enforce one writer per seq.
A commit is one statement: it moves the session's count from the expected value and, only if
that matched, deletes and inserts rows and sends ``NOTIFY`` with the session and its new head
(never the payload); other processes :meth:`~PostgresStore.watch` that channel and read the
rows.

A connection lost during a commit fails that commit with :class:`StoreError`; it is never
retried behind the caller's back (a retry could duplicate a batch whose COMMIT did land).
The pool replaces broken connections, so the next commit works once the server is back.
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
from collections.abc import AsyncGenerator, Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from types import TracebackType
from typing import Any, Final, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import anyio
import anyio.to_thread
import structlog

from nous_session.codec import decode_rows, encode
from nous_session.errors import ConflictError, CorruptRecordError, StoreError
from nous_session.event import Event
from nous_session.stores.base import (
    Rebased,
    SessionInfo,
    check_commit_arguments,
    check_rebase_arguments,
    moved,
    place,
)

try:
    import psycopg
    from psycopg import sql
    from psycopg_pool import ConnectionPool
except ImportError as error:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "the PostgreSQL store needs psycopg 3 and psycopg-pool: "
        "pip install 'nous_session[postgres]'"
    ) from error

__all__ = ["SCHEMA_VERSION", "PostgresStore"]

SCHEMA_VERSION: Final = 1
T = TypeVar("T")

_logger = structlog.get_logger("nous_session")
_SCHEMA_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
_APPLICATION = "nous_session"
_LISTENER_APPLICATION = "nous_session listener"
# Any 64-bit key works; it only has to be the same for every process migrating this schema.
_MIGRATION_LOCK: Final = 0x6E6F7573  # "nous"

_MIGRATIONS: Final[dict[int, tuple[str, ...]]] = {
    0: (
        """CREATE TABLE {schema}.nous_sessions (
               name  text PRIMARY KEY,
               count bigint NOT NULL
           )""",
        """CREATE TABLE {schema}.nous_events (
               session text NOT NULL,
               seq     bigint NOT NULL,
               record  bytea NOT NULL,
               PRIMARY KEY (session, seq)
           )""",
    ),
}


def _tail(event: Event) -> bytes:
    """The event's record without its ``[1,<seq>`` head, for the database to renumber."""
    record = encode(event)
    head = b"[1,%d" % event.seq
    if not record.startswith(head):  # pragma: no cover - the codec's envelope changed
        raise AssertionError(f"unexpected record envelope {record[:16]!r}")
    return record[len(head) :]


@contextmanager
def _errors(what: str) -> Iterator[None]:
    """Translate psycopg's errors, in the one place this store does it.

    A clash on a primary key (another writer holds one of these seqs) is a ConflictError; any
    other database error a StoreError that says what failed (``what``) and why.
    """
    try:
        yield
    except psycopg.errors.UniqueViolation as error:
        raise ConflictError(
            f"{what}: another writer holds one of these seqs ({_describe(error)})"
        ) from error
    except psycopg.Error as error:
        raise StoreError(f"{what}: {_describe(error)}") from error


def _commit_errors(session_id: str) -> contextlib.AbstractContextManager[None]:
    return _errors(f"commit to session {session_id!r} failed")


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {str(error).strip()}"


class PostgresStore:
    """Sessions in a PostgreSQL database, shared by any number of processes.

    Args:
        url: a libpq connection URL, ``postgresql://user:password@host:port/database``.
        min_size, max_size: the connection pool's bounds (connections for commits and reads;
            each :meth:`watch` holds one more of its own).
        schema: the PostgreSQL schema holding the tables (created if missing); a plain
            identifier. A ``schema=`` query parameter in the URL sets it too (and is not passed
            on to libpq), so a URL alone can name it: ``postgresql://host/db?schema=tenant_a``.
        connect_timeout: seconds to wait for a connection before failing with StoreError.

    Nothing connects until first use. Close with :meth:`aclose` (or ``async with``).
    """

    def __init__(
        self,
        url: str,
        *,
        min_size: int = 1,
        max_size: int = 8,
        schema: str = "public",
        connect_timeout: float = 10.0,
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
            },
            name=f"nous_session[{schema}]",
        )
        self._limiter: anyio.CapacityLimiter | None = None
        self._max_size = max_size
        self._opened = False
        self._open_lock = threading.Lock()
        self._closed = False
        self._events = sql.Identifier(schema, "nous_events")
        self._sessions = sql.Identifier(schema, "nous_sessions")
        # A commit is one statement, atomic by itself (the pool's connections autocommit):
        # move the session's count from the expected value, and only if that matched, delete
        # the dropped rows, insert the new ones and notify. A concurrent writer's UPDATE waits
        # for the row and then finds the count moved, so it changes nothing: a conflict. The
        # row lock is held for this one statement, never across round trips.
        writes = """
            , dropped AS (
                DELETE FROM {events} WHERE session = %(name)s AND seq = ANY(%(dropped)s)
                AND EXISTS (SELECT 1 FROM moved) RETURNING 1
            ), inserted AS (
                INSERT INTO {events} (session, seq, record)
                SELECT %(name)s, seq, record
                FROM unnest(%(seqs)s::bigint[], %(records)b::bytea[]) AS rows (seq, record)
                WHERE EXISTS (SELECT 1 FROM moved) RETURNING 1
            )
            SELECT pg_notify(%(channel)s, %(payload)s) FROM moved
        """
        self._commit = sql.SQL(
            """WITH moved AS (
                UPDATE {sessions} SET count = %(count)s
                WHERE name = %(name)s AND count = %(expected)s RETURNING name
            )"""
            + writes
        ).format(sessions=self._sessions, events=self._events)
        # The first commit of a session creates its row, unless another writer just did.
        self._first_commit = sql.SQL(
            """WITH moved AS (
                INSERT INTO {sessions} AS s (name, count) VALUES (%(name)s, %(count)s)
                ON CONFLICT (name) DO UPDATE SET count = excluded.count WHERE s.count = 0
                RETURNING name
            )"""
            + writes
        ).format(sessions=self._sessions, events=self._events)

        # A rebasing commit moves the count by the batch's length from wherever it is (taking
        # the row lock), and inserts the batch after the old count; the record is rebuilt
        # around its new seq (the client sends what follows the seq). Its first commit of a
        # session may create the row.
        rebased = """
            ), inserted AS (
                INSERT INTO {events} (session, seq, record)
                SELECT %(name)s, moved.base + rows.pos - 1,
                       convert_to('[1,' || (moved.base + rows.pos - 1)::text, 'UTF8') || rows.tail
                FROM moved, unnest(%(tails)b::bytea[]) WITH ORDINALITY AS rows (tail, pos)
                RETURNING 1
            )
            SELECT base, pg_notify(%(channel)s, json_build_object(
                'session', %(name)s::text, 'head', base + %(n)s)::text) FROM moved
        """
        self._rebased = sql.SQL(
            """WITH moved AS (
                UPDATE {sessions} SET count = count + %(n)s
                WHERE name = %(name)s AND count >= %(expected)s RETURNING count - %(n)s AS base"""
            + rebased
        ).format(sessions=self._sessions, events=self._events)
        self._first_rebased = sql.SQL(
            """WITH moved AS (
                INSERT INTO {sessions} AS s (name, count) VALUES (%(name)s, %(n)s)
                ON CONFLICT (name) DO UPDATE SET count = s.count + excluded.count
                RETURNING s.count - %(n)s AS base"""
            + rebased
        ).format(sessions=self._sessions, events=self._events)
        # Run in the same transaction, after the row lock is taken: a new statement sees what
        # the writers it waited for committed, and (as the transaction's own) the new rows,
        # which the bound excludes.
        self._others = sql.SQL(
            """SELECT seq, record FROM {events}
               WHERE session = %(name)s AND seq >= %(expected)s
               AND seq < (SELECT count FROM {sessions} WHERE name = %(name)s) - %(n)s
               ORDER BY seq"""
        ).format(sessions=self._sessions, events=self._events)

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

    def _open(self) -> None:
        with self._open_lock:  # first calls may race from several worker threads
            if not self._opened:
                self._open_pool()

    def _open_pool(self) -> None:
        try:
            self._pool.open(wait=True, timeout=self._connect_timeout)
        except psycopg.Error as error:
            raise StoreError(f"cannot connect to {self._redacted()}: {_describe(error)}") from error
        except Exception as error:  # the pool's own timeout error
            raise StoreError(f"cannot connect to {self._redacted()}: {_describe(error)}") from error
        with (
            _errors(f"cannot set up the schema in {self._redacted()}"),
            self._pool.connection() as connection,
        ):
            self._migrate(connection)
        self._opened = True

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

    # The Store protocol -----------------------------------------------------------------------

    async def load(self, session_id: str, *, since: int = 0) -> Sequence[Event]:
        """The session's held events with seq >= ``since``, in seq order.

        Raises:
            CorruptRecordError: a row cannot be decoded (the error names session and seq).
            StoreError: the database cannot be read.
        """
        if not isinstance(since, int) or isinstance(since, bool) or since < 0:
            raise ValueError(f"since must be an int >= 0, got {since!r}")
        query = sql.SQL(
            "SELECT seq, record FROM {} WHERE session = %s AND seq >= %s ORDER BY seq"
        ).format(self._events)

        def load() -> list[Event]:
            with (
                _errors(f"cannot read session {session_id!r}"),
                self._pool.connection() as connection,
            ):
                rows = connection.execute(query, (session_id, since)).fetchall()
            return decode_rows(rows, place(session_id, f"schema {self.schema}"))

        return await self._run(load)

    async def commit(
        self,
        session_id: str,
        *,
        expected_count: int,
        events: Sequence[Event],
        dropped: Sequence[int] = (),
    ) -> None:
        """Insert ``events`` and delete ``dropped`` in one transaction, then notify watchers.

        Raises:
            ConflictError: the stored count is not ``expected_count``; nothing was written.
            StoreError: the database failed or the connection was lost; nothing was written,
                unless the connection was lost during COMMIT itself, when the outcome is
                unknown (:meth:`load` tells).
        """
        rows = check_commit_arguments(session_id, expected_count, events, dropped)
        count = rows[-1].seq + 1 if rows else expected_count
        parameters = {
            "name": session_id,
            "expected": expected_count,
            "count": count,
            "dropped": list(dropped),
            "channel": self._channel,
            "payload": json.dumps({"session": session_id, "head": count}),
        }
        statement = self._first_commit if expected_count == 0 else self._commit

        def commit() -> None:
            parameters["seqs"] = [event.seq for event in rows]
            parameters["records"] = [encode(event) for event in rows]
            with _commit_errors(session_id), self._pool.connection() as connection:
                done = connection.execute(statement, parameters).fetchone()
            if done is None:
                raise ConflictError(
                    f"session {session_id!r} does not have count {expected_count}:"
                    " another writer committed first"
                )

        await self._run(commit)

    async def commit_rebased(
        self, session_id: str, *, expected_count: int, events: Sequence[Event]
    ) -> Rebased:
        """Append ``events`` after the session's current count (see :class:`RebasingStore`).

        One transaction, pipelined into one round trip: move the count by the batch's length
        (which waits for the session's row lock, so concurrent writers queue up in the
        database instead of failing), insert the batch after the old count, read what other
        writers stored since ``expected_count``, notify watchers, commit.

        Raises:
            ConflictError: the stored count is below ``expected_count``; nothing was written.
            CorruptRecordError: a record another writer stored in between cannot be decoded.
                The batch itself was committed (the records are read in the same round trip
                as the commit); the message says so and where. The session cannot be loaded
                either until that record is repaired.
            StoreError: as for :meth:`commit`.
        """
        rows = check_rebase_arguments(session_id, expected_count, events)
        parameters: dict[str, Any] = {
            "name": session_id,
            "expected": expected_count,
            "n": len(rows),
            "channel": self._channel,
        }
        statement = self._first_rebased if expected_count == 0 else self._rebased

        def commit() -> tuple[int | None, list[Any]]:
            parameters["tails"] = [_tail(event) for event in rows]
            with _commit_errors(session_id), self._pool.connection() as connection:
                with connection.pipeline(), connection.transaction():
                    counted = connection.execute(statement, parameters)
                    others = connection.execute(self._others, parameters)
                done = counted.fetchone()
                return (None if done is None else done[0]), others.fetchall()

        base, others = await self._run(commit)
        if base is None:
            raise ConflictError(
                f"session {session_id!r} has a count below the expected {expected_count}"
                " (deleted, or written by another store?); nothing was written"
            )
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
        )

    async def sessions(self) -> list[SessionInfo]:
        """Every session with a nonzero count, by id (held events counted: a full index scan,
        as fits an administrative listing)."""
        query = sql.SQL(
            "SELECT s.name, s.count, (SELECT count(*) FROM {events} e WHERE e.session = s.name)"
            ' FROM {sessions} s WHERE s.count > 0 ORDER BY s.name COLLATE "C"'
        ).format(sessions=self._sessions, events=self._events)

        def sessions() -> list[SessionInfo]:
            with _errors("cannot list sessions"), self._pool.connection() as connection:
                rows = connection.execute(query).fetchall()
            return [SessionInfo(name, count, held) for name, count, held in rows]

        return await self._run(sessions)

    async def delete(self, session_id: str) -> bool:
        """Delete a session and all its events in one transaction; True when it existed."""
        events = sql.SQL("DELETE FROM {} WHERE session = %s").format(self._events)
        session = sql.SQL("DELETE FROM {} WHERE name = %s").format(self._sessions)

        def delete() -> bool:
            with (
                _errors(f"cannot delete session {session_id!r}"),
                self._pool.connection() as connection,
                connection.transaction(),
            ):
                connection.execute(events, (session_id,))
                return connection.execute(session, (session_id,)).rowcount > 0

        return await self._run(delete)

    # The change feed --------------------------------------------------------------------------

    async def watch(self, session_id: str, *, poll: float = 0.25) -> AsyncGenerator[int, None]:
        """Yield the session's new head whenever a commit (from any process) lands.

        The first value is yielded as soon as the listener is connected, and again after every
        reconnection: the caller should read what it has missed then (``load(since=...)``).
        Each notification's head follows; a lost listener reconnects with a backoff.

        Holds one connection of its own. Close the generator (``aclosing``) to release it.
        """
        await self._run(lambda: None)  # connect and migrate first
        backoff = 0.05
        while True:
            try:
                connection = await anyio.to_thread.run_sync(self._listen)
            except psycopg.Error as error:
                _logger.warning("nous_session.listener_connect_failed", error=_describe(error))
                await anyio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            backoff = 0.05
            try:
                yield -1  # (re)connected: whatever happened meanwhile must be read now
                while True:
                    heads = await anyio.to_thread.run_sync(self._wait, connection, session_id, poll)
                    for head in heads:
                        yield head
            except psycopg.Error as error:
                _logger.warning(
                    "nous_session.listener_lost", session_id=session_id, error=_describe(error)
                )
            finally:
                with anyio.CancelScope(shield=True):
                    await anyio.to_thread.run_sync(_close_quietly, connection)

    def _listen(self) -> psycopg.Connection[Any]:
        connection = psycopg.connect(
            self.url,
            autocommit=True,
            application_name=_LISTENER_APPLICATION,
            connect_timeout=max(1, int(self._connect_timeout)),
        )
        connection.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self._channel)))
        return connection

    @staticmethod
    def _wait(connection: psycopg.Connection[Any], session_id: str, timeout: float) -> list[int]:
        heads = []
        for notification in connection.notifies(timeout=timeout):
            with suppress(ValueError, KeyError, TypeError):
                payload = json.loads(notification.payload)
                if payload["session"] == session_id:
                    heads.append(int(payload["head"]))
                    break
        return heads

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


def _close_quietly(connection: psycopg.Connection[Any]) -> None:
    with suppress(Exception):
        connection.close()
