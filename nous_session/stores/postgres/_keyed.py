"""The PostgreSQL store's commits, and its parts that hold data keys (encryption at rest):
a commit sent as it is, or sealed under the session's key (sent again when an erasure replaced
it meanwhile); deletes that destroy the keys only the deleted session held, and re-wrapping
every key under a new master key, each ending with the key table scrubbed alone, as an erasure
does (see docs/erasure.md)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, ClassVar, TypeVar

import psycopg
from psycopg_pool import ConnectionPool

from nous_session.encryption import KeyProvider
from nous_session.errors import ConflictError, StoreError
from nous_session.event import Event
from nous_session.stores._common import Commit
from nous_session.stores._sealed import Keyring
from nous_session.stores.postgres._commit import (
    Unmatched,
    commit_alone,
    commit_parameters,
    conflict,
)
from nous_session.stores.postgres._errors import pooled
from nous_session.stores.postgres._group import GroupCommits, Grouped
from nous_session.stores.postgres._keys import key_moved, resolve_key, rewrap_keys, seal_events
from nous_session.stores.postgres._rows import delete_row, row_of
from nous_session.stores.postgres._sql import Statements

__all__ = ["KeyedTables", "xid"]

T = TypeVar("T")


def xid(connection: psycopg.Connection[Any]) -> str:
    """The id of the connection's current transaction (32 bits: as pg_stat_activity has it)."""
    found = connection.execute("SELECT pg_current_xact_id()::text").fetchone()
    return str(int(found[0]) % 2**32) if found else "0"


class KeyedTables:
    """:class:`~nous_session.stores.postgres.PostgresStore`'s commits (plain or sealed), and
    its deletes and rewrap as they involve data keys."""

    _keyring: Keyring | None
    _pool: ConnectionPool[psycopg.Connection[tuple[Any, ...]]]
    _sql: Statements
    _channel: str
    _groups: GroupCommits

    async def _run(self, function: Callable[[], T]) -> T:
        raise NotImplementedError

    def _check_writable(self) -> None:
        raise NotImplementedError

    def _redacted(self) -> str:
        raise NotImplementedError

    # ErasingTables's, after this class in the store's bases (a stub here would hide it).
    _scrub: Callable[..., tuple[bool, str]]

    _group_commits: ClassVar[bool] = True
    """Whether a commit that drops nothing joins a round's group (a switch for benchmarks)."""

    async def _commit(self, commit: Commit) -> str:
        keyring = self._keyring
        if keyring is None:
            return await self._commit_once(commit, commit_parameters(commit, self._channel))
        return await self._commit_sealed(commit, keyring)

    async def _commit_once(
        self,
        commit: Commit,
        parameters: dict[str, Any],
        sealer: Callable[[Sequence[Event]], list[bytes]] | None = None,
    ) -> str:
        """Commit, grouped with the round's other commits when it can be; returns the
        session's identity (uid)."""
        session_id, expected_count, rows = commit.session_id, commit.expected_count, commit.events
        dropped, expected_horizon, horizon = commit.dropped, commit.expected_horizon, commit.horizon
        # One that expects an identity needs the row: it never makes one.
        first = expected_count == 0 and commit.expected_uid is None
        statement = self._sql.first_commit if first else self._sql.commit
        # A snapshot, or a horizon to check against the stored one, is committed under the
        # session's row lock (check_commit_state needs the stored horizon).
        locked = bool(dropped) or (horizon is not None and expected_horizon is None)
        if not locked and self._group_commits:
            return await self._groups.commit(
                Grouped(session_id, statement, parameters, rows, sealer)
            )
        alone = functools.partial(
            commit_alone,
            self._pool,
            self._sql,
            statement,
            parameters,
            rows,
            locked=locked,
            dropped=dropped,
            horizon=horizon,
            expected_horizon=expected_horizon,
            sealer=sealer,
        )
        try:
            return await self._run(alone)
        except Unmatched:
            raise conflict(
                session_id, expected_count, expected_horizon, commit.expected_uid
            ) from None

    async def _commit_sealed(self, commit: Commit, keyring: Keyring) -> str:
        """Commit sealed under the session's current key (made, and stored with the first
        commit, when it has none); an erasure that replaced the key meanwhile makes the
        commit move nothing, and it is sent again under the new one."""
        session_id = commit.session_id
        for _ in range(3):
            known = keyring.current.get(session_id)
            cached = keyring.cached(known)
            new = None
            if known is not None and cached is not None:
                kid, cipher = known, cached
            else:
                kid, cipher, new = await self._run(
                    functools.partial(resolve_key, self._pool, self._sql, keyring, session_id)
                )
            parameters = commit_parameters(commit, self._channel)
            parameters["kid"] = kid
            if new is not None:  # the session has no row: its first commit stores the key
                if commit.expected_count != 0 or commit.expected_uid is not None:
                    raise conflict(
                        session_id,
                        commit.expected_count,
                        commit.expected_horizon,
                        commit.expected_uid,
                    )
                parameters["new_kid"], parameters["new_provider"], parameters["new_wrapped"] = new
            sealer = functools.partial(seal_events, keyring, kid, cipher)
            try:
                uid = await self._commit_once(commit, parameters, sealer)
                if new is not None:
                    keyring.current[session_id] = kid
            except ConflictError:
                # An erasure may have replaced the session's key (the commit then moved
                # nothing): send it again under the new one; any other conflict stands.
                moved = functools.partial(key_moved, self._pool, self._sql, keyring)
                if not await self._run(functools.partial(moved, session_id, kid)):
                    raise
            else:
                return uid
        raise ConflictError(
            f"session {session_id!r}: its data key kept changing while committing (erasures"
            " in progress); nothing was written"
        )

    async def delete_idle(self, session_id: str, *, count: int, active: datetime) -> bool:
        """Delete the session if its count and last-active time are still these, checked under
        its row lock in the deleting transaction (see
        :class:`~nous_session.stores.base.ListingStore`); its data keys go as :meth:`delete`
        says."""
        return await self._delete(session_id, (count, active))

    async def delete(self, session_id: str) -> bool:
        """Delete a session and all its events in one transaction (its forks get their own
        copy first); True when it existed.

        Its data keys (encryption at rest) that no other session holds rows under (the key
        holders table says) are destroyed in the same transaction, as an erasure destroys
        keys; then ``VACUUM FULL`` scrubs the key table alone, as after an erasure.

        Raises:
            StoreError: the database failed (nothing was deleted), or the session was deleted
                and its keys destroyed but the key table could not be scrubbed (the error
                says so).
        """
        return await self._delete(session_id, None)

    async def _delete(self, session_id: str, idle: tuple[int, datetime] | None) -> bool:
        """Delete the session (when ``idle`` is given, only if its count and last-active time
        are still those), then scrub the key table if keys were destroyed."""
        self._check_writable()

        def delete() -> tuple[int, str] | None:
            with pooled(
                self._pool, f"cannot delete session {session_id!r}", transaction=True
            ) as connection:
                if idle is not None:
                    found = connection.execute(self._sql.idle, (session_id,)).fetchone()
                    if found is None or (found[0], found[1]) != idle:
                        return None
                row = row_of(connection, self._sql, session_id, lock="FOR UPDATE")
                if row is None:
                    return None
                return (
                    delete_row(connection, self._sql, self._channel, row, self._keyring),
                    xid(connection),
                )

        done = await self._run(delete)
        if done is not None and done[0]:
            destroyed, transaction = done
            await self._scrub_keys(
                transaction,
                f"deleted session {session_id!r} and destroyed {destroyed} data key(s)",
                "them",
                "a later erase or rewrap scrubs it",
            )
        return done is not None

    async def _scrub_keys(self, transaction: str, done: str, of: str, advice: str) -> None:
        """Scrub the key table alone after ``transaction`` destroyed or re-wrapped keys (as
        after a crypto-erasure: ``VACUUM FULL``, see ``_scrub``).

        Raises:
            StoreError: the scrub could not be done or proven: "``done``, but the key table
                could not be scrubbed of ``of``", why, and ``advice``.
        """
        proven, detail = await self._run(
            lambda: self._scrub(transaction, True, 60.0, False, keys_only=True)
        )
        if not proven:
            raise StoreError(
                f"{done}, but the key table could not be scrubbed of {of}: {detail}; {advice}"
            )

    async def rewrap(self, provider: KeyProvider) -> int:
        """Re-wrap every data key under ``provider``'s master key in one transaction, then
        ``VACUUM FULL`` the key table alone, so that its pages keep no key wrapped the old way;
        new keys are wrapped by ``provider`` from then on. Returns how many keys there are
        (see :func:`nous_session.encryption.rewrap`).

        Raises:
            TypeError: the store was opened without encryption.
            StoreError: a key cannot be unwrapped or wrapped, or the database failed; nothing
                was changed (or, if only the scrub failed, the error says so).
        """
        keyring = self._keyring
        if keyring is None:
            raise TypeError(f"the store {self._redacted()} was opened without encryption")
        self._check_writable()

        def rewrap() -> tuple[int, str]:
            with pooled(self._pool, "cannot re-wrap the data keys", transaction=True) as connection:
                count = rewrap_keys(connection, self._sql, keyring, provider)
                return count, xid(connection)

        count, transaction = await self._run(rewrap)
        keyring.use(provider)
        await self._scrub_keys(
            transaction,
            f"re-wrapped {count} data key(s)",
            "the old wrapped keys",
            "run rewrap again",
        )
        return count
