"""Leases in PostgreSQL (:class:`~nous_session.stores.base.LeasingStore`): one row of
``nous_leases`` per session and name, apart from the sessions' history, expiring on the
server's clock (one clock for every process and machine)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, TypeVar

import psycopg
from psycopg import sql
from psycopg_pool import ConnectionPool

from nous_session.stores.base import check_lease
from nous_session.stores.postgres._errors import pooled

T = TypeVar("T")

# Made by every writer's migration (a table any version may add: no schema version).
LEASES_TABLE: Final = (
    "CREATE TABLE IF NOT EXISTS {schema}.nous_leases (session text NOT NULL, "
    "name text NOT NULL, holder text NOT NULL, expires timestamptz NOT NULL, "
    "PRIMARY KEY (session, name))"
)
# Taken when free or expired, renewed by its holder; another holder's live lease stays (and
# then no row comes back). One statement: no session state, so it works through a pooler.
TAKE_LEASE: Final = (
    "INSERT INTO {schema}.nous_leases AS lease (session, name, holder, expires) "
    "VALUES (%s, %s, %s, clock_timestamp() + make_interval(secs => %s)) "
    "ON CONFLICT (session, name) DO UPDATE SET holder = excluded.holder, "
    "expires = excluded.expires "
    "WHERE lease.holder = excluded.holder OR lease.expires <= clock_timestamp() "
    "RETURNING 1"
)
DROP_LEASE: Final = (
    "DELETE FROM {schema}.nous_leases WHERE session = %s AND name = %s AND holder = %s"
)


class TableLeases:
    """:class:`~nous_session.stores.postgres.PostgresStore`'s leases, each one autocommitted
    statement on a pooled connection."""

    schema: str
    _pool: ConnectionPool[psycopg.Connection[tuple[Any, ...]]]

    async def _run(self, function: Callable[[], T]) -> T:
        raise NotImplementedError

    def _check_writable(self) -> None:
        raise NotImplementedError

    async def lease(self, session_id: str, name: str, *, holder: str, ttl: float) -> bool:
        """See :meth:`LeasingStore.lease <nous_session.stores.base.LeasingStore.lease>`."""
        ttl = check_lease(session_id, name, holder, ttl)
        taken = await self._execute(
            f"cannot take the {name!r} lease of {session_id!r}",
            TAKE_LEASE,
            (session_id, name, holder, ttl),
        )
        return taken > 0

    async def release(self, session_id: str, name: str, *, holder: str) -> None:
        """See :meth:`LeasingStore.release <nous_session.stores.base.LeasingStore.release>`."""
        check_lease(session_id, name, holder)
        await self._execute(
            f"cannot release the {name!r} lease of {session_id!r}",
            DROP_LEASE,
            (session_id, name, holder),
        )

    async def _execute(self, what: str, statement: str, parameters: tuple[object, ...]) -> int:
        """Run one of the statements above, autocommitted on a pooled connection; the count
        of rows it touched (``what`` says what failed in an error)."""
        self._check_writable()
        query = sql.SQL(statement).format(schema=sql.Identifier(self.schema))

        def execute() -> int:
            with pooled(self._pool, what) as connection:
                return connection.execute(query, parameters).rowcount

        return await self._run(execute)
