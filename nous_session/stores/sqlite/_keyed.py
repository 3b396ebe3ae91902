"""The SQLite store's parts that hold data keys (encryption at rest) beside its commits:
deletes that destroy the keys only the deleted session held, and re-wrapping every key under a
new master key, each ending with the WAL truncated, as an erasure does (see docs/erasure.md)."""

from __future__ import annotations

import sqlite3
from datetime import datetime

from nous_session.encryption import KeyProvider
from nous_session.errors import StoreError
from nous_session.listing import to_micros
from nous_session.stores.sqlite._errors import translated_errors
from nous_session.stores.sqlite._host import StoreFile
from nous_session.stores.sqlite._keys import rewrap_keys
from nous_session.stores.sqlite._rows import delete_row, row_of

__all__ = ["KeyedFile", "truncated_wal"]


def truncated_wal(connection: sqlite3.Connection, failed: str) -> bool:
    """Checkpoint the WAL into the file and truncate it: False when another connection holds
    an old snapshot (the WAL may still hold old pages).

    Raises:
        StoreError: the checkpoint failed (``failed`` says what, the error why).
    """
    with translated_errors(f"{failed} failed"):
        busy, _, _ = connection.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    return not busy


class KeyedFile(StoreFile):
    """:class:`~nous_session.stores.sqlite.SQLiteStore`'s deletes and rewrap as they involve
    data keys."""

    async def delete_idle(self, session_id: str, *, count: int, active: datetime) -> bool:
        """Delete the session if its count and last-active time are still these, checked in
        the deleting transaction (see :class:`~nous_session.stores.base.ListingStore`); its
        data keys go as :meth:`delete` says."""
        return await self._delete(session_id, (count, to_micros(active)))

    async def delete(self, session_id: str) -> bool:
        """Delete a session and all its events (its forks get their own copy first); True
        when it existed.

        Its data keys (encryption at rest) that no other session holds rows under (the key
        holders table says) are destroyed in the same transaction, as an erasure destroys
        keys: the key rows deleted with ``secure_delete`` on and the key table rebuilt; then
        the WAL is checkpointed and truncated.

        Raises:
            StoreError: SQLite failed (nothing was deleted), or the session was deleted and
                its keys destroyed but the WAL could not be truncated (the error says so).
        """
        return await self._delete(session_id, None)

    async def _delete(self, session_id: str, idle: tuple[int, int] | None) -> bool:
        """Delete the session (when ``idle`` is given, only if its count and last-active time
        in microseconds are still those), then truncate the WAL if keys were destroyed."""

        def delete(connection: sqlite3.Connection) -> int | None:
            if idle is not None:
                found = connection.execute(
                    "SELECT count, active FROM nous_sessions WHERE name = ?", (session_id,)
                ).fetchone()
                if found is None or tuple(found) != idle:
                    return None
            row = row_of(connection, session_id)
            if row is None:
                return None
            return delete_row(connection, row, session_id, self._keyring)

        destroyed = await self._write(delete, f"cannot delete session {session_id!r}")
        if destroyed:
            await self._truncate_after_delete(session_id, destroyed)
        return destroyed is not None

    async def _truncate_after_delete(self, session_id: str, destroyed: int) -> None:
        """After a delete destroyed data keys: checkpoint the WAL into the file and truncate
        it (the key table's old pages were zeroed in the file's pages, not in the WAL)."""

        def truncate(connection: sqlite3.Connection) -> None:
            failed = f"deleted session {session_id!r}, but the WAL checkpoint"
            if not truncated_wal(connection, failed):
                raise StoreError(
                    f"deleted session {session_id!r} and destroyed {destroyed} data key(s),"
                    f" but the WAL of {self.path} could not be truncated (another connection"
                    " holds an old snapshot): it may still hold the destroyed keys' rows until"
                    " a later erase or rewrap truncates it"
                )

        await self._run(truncate)

    async def rewrap(self, provider: KeyProvider) -> int:
        """Re-wrap every data key under ``provider``'s master key, in one transaction with
        ``secure_delete`` on, rebuilding the key table so that no page keeps a key wrapped the
        old way, then checkpoint and truncate the WAL; new keys are wrapped by ``provider``
        from then on. Returns how many keys there are (see
        :func:`nous_session.encryption.rewrap`).

        Raises:
            TypeError: the store was opened without encryption.
            StoreError: a key cannot be unwrapped or wrapped, or SQLite failed; nothing was
                changed (or, if only the checkpoint failed, the error says so).
        """
        keyring = self._keyring
        if keyring is None:
            raise TypeError(f"the store {self.url} was opened without encryption")
        if self.read_only:
            raise StoreError(f"the store {self.url} is open read-only")

        def rewrap(connection: sqlite3.Connection) -> int:
            self._check_file()
            secure = connection.execute("PRAGMA secure_delete").fetchone()[0]
            connection.execute("PRAGMA secure_delete = ON")
            try:
                with translated_errors(f"cannot re-wrap the data keys of {self.path}"):
                    connection.execute("BEGIN IMMEDIATE")
                    try:
                        count = rewrap_keys(connection, keyring, provider)
                    except BaseException:
                        connection.execute("ROLLBACK")
                        raise
                    connection.execute("COMMIT")
            finally:
                connection.execute(f"PRAGMA secure_delete = {int(secure)}")
            keyring.use(provider)
            if not truncated_wal(connection, f"re-wrapped, but the WAL checkpoint of {self.path}"):
                raise StoreError(
                    f"re-wrapped the data keys of {self.path}, but the WAL could not be"
                    " truncated (another connection holds an old snapshot): it may still"
                    " hold keys wrapped the old way; run rewrap again once it is done"
                )
            return count

        # Outside the writer's transactions, as erase does: serialised with every write.
        return await self._run(rewrap)
