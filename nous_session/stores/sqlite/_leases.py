"""Leases in a SQLite file (:class:`~nous_session.stores.base.LeasingStore`): one row of
``nous_leases`` per session and name, apart from the sessions' history, expiring on the wall
clock that every process on this machine shares."""

from __future__ import annotations

import sqlite3
import time
from typing import Final

from nous_session.stores.base import check_lease
from nous_session.stores.sqlite._host import StoreFile

# A table made on first use, so files written before it need no migration (and a read-only
# store never makes it: leases are taken by writers only).
LEASES_TABLE: Final = (
    "CREATE TABLE IF NOT EXISTS nous_leases (session TEXT NOT NULL, name TEXT NOT NULL, "
    "holder TEXT NOT NULL, expires REAL NOT NULL, PRIMARY KEY (session, name)) WITHOUT ROWID"
)
# Taken when free or expired, renewed by its holder; another holder's live lease stays.
TAKE_LEASE: Final = (
    "INSERT INTO nous_leases (session, name, holder, expires) VALUES (?, ?, ?, ?) "
    "ON CONFLICT (session, name) DO UPDATE SET holder = excluded.holder, "
    "expires = excluded.expires "
    "WHERE nous_leases.holder = excluded.holder OR nous_leases.expires <= ?"
)
LEASE_HOLDER: Final = "SELECT holder FROM nous_leases WHERE session = ? AND name = ?"
DROP_LEASE: Final = "DELETE FROM nous_leases WHERE session = ? AND name = ? AND holder = ?"


class FileLeases(StoreFile):
    """:class:`~nous_session.stores.sqlite.SQLiteStore`'s leases, written through its writer
    thread like any commit (so a lease waits for no other lock than the file's)."""

    async def lease(self, session_id: str, name: str, *, holder: str, ttl: float) -> bool:
        """See :meth:`LeasingStore.lease <nous_session.stores.base.LeasingStore.lease>`."""
        ttl = check_lease(session_id, name, holder, ttl)

        def lease(connection: sqlite3.Connection) -> bool:
            now = time.time()
            connection.execute(LEASES_TABLE)
            connection.execute(TAKE_LEASE, (session_id, name, holder, now + ttl, now))
            found = connection.execute(LEASE_HOLDER, (session_id, name)).fetchone()
            return found is not None and found[0] == holder

        return await self._write(lease, f"cannot take the {name!r} lease of {session_id!r}")

    async def release(self, session_id: str, name: str, *, holder: str) -> None:
        """See :meth:`LeasingStore.release <nous_session.stores.base.LeasingStore.release>`."""
        check_lease(session_id, name, holder)

        def release(connection: sqlite3.Connection) -> None:
            connection.execute(LEASES_TABLE)
            connection.execute(DROP_LEASE, (session_id, name, holder))

        await self._write(release, f"cannot release the {name!r} lease of {session_id!r}")
