"""What the stores share beyond the contract: the checked arguments of a commit and of a
listing handed to each store's own hooks, the change-feed reader of the SQL stores, and their
schema version checks (see docs/internals.md, "Stores")."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from types import TracebackType
from typing import Any, ClassVar, NamedTuple, Self, Unpack

from nous_session.errors import ConflictError, StoreError
from nous_session.event import Event
from nous_session.listing import ListArguments, ListQuery, SessionEntry, SessionPage
from nous_session.stores._followed import Followed
from nous_session.stores._watch import Known
from nous_session.stores.base import (
    Rebased,
    Stored,
    check_commit_arguments,
    check_rebase_arguments,
    check_session_id,
)

__all__ = [
    "Commit",
    "FeedStore",
    "StoreBase",
    "check_schema_version",
    "identity_conflict",
    "migration_start",
]


def check_schema_version(found: Sequence[Any] | None, expected: int, store: str, has: str) -> None:
    """Refuse a database that holds no store (``found``, its version row, is None) or one of
    another schema version: ``store`` names it, ``has`` starts the message that says so.

    Raises:
        StoreError: saying which.
    """
    if found is None:
        raise StoreError(f"{store} is not a nous_session store")
    if found[0] != expected:
        raise StoreError(
            f"{has} {found[0]}; this nous_session reads version {expected}"
            " (open it for writing once to migrate it)"
        )


def migration_start(rows: Sequence[Sequence[Any]], expected: int, table: str, has: str) -> int:
    """The schema version a migration starts from, read from the version table's ``rows``
    (none: a new database, 0), refusing one this code cannot migrate: ``table`` names the
    version table, ``has`` starts the message that says the version is too new.

    Raises:
        StoreError: more than one row, a version that is not an int >= 0, or a newer one.
    """
    if len(rows) > 1:
        raise StoreError(f"{table} holds {len(rows)} rows; expected one")
    version = rows[0][0] if rows else 0
    if not isinstance(version, int) or version < 0:
        raise StoreError(f"{table} holds an unreadable schema version {version!r}")
    if version > expected:
        raise StoreError(
            f"{has} {version}, newer than this nous_session understands ({expected});"
            " upgrade nous_session to open it"
        )
    return version


def identity_conflict(session_id: str, expected_uid: str) -> ConflictError:
    """The error of a commit whose ``expected_uid`` is not the session's identity."""
    return ConflictError(
        f"session {session_id!r} is not the one of identity {expected_uid!r}: it was deleted"
        " since (and made again, if it exists); nothing was written"
    )


class Commit(NamedTuple):
    """A commit's arguments, checked (see :meth:`~nous_session.stores.base.Store.commit`):
    what :meth:`StoreBase.commit` hands the store's own ``_commit``.

    A named tuple, not an attrs class: one is made for every commit, on the path every
    session's round trip takes, and a tuple is made in a fraction of a frozen attrs
    instance's time.
    """

    session_id: str
    expected_count: int
    events: list[Event]
    dropped: Sequence[int] = ()
    expected_horizon: int | None = None
    horizon: int | None = None
    keys: Sequence[tuple[str, int, int]] = ()
    kept: Sequence[int] = ()
    commit_id: str | None = None
    expected_uid: str | None = None


class StoreBase:
    """The base of every store here: a commit's and a listing's arguments are checked in one
    place, then handed to the store's own ``_commit``, ``_commit_rebased`` and ``_list``;
    ``async with`` closes the store."""

    checks_uid: ClassVar[bool] = True
    """Its commits take ``expected_uid`` (see :class:`~nous_session.stores.base.Store`)."""

    def _before_commit(self) -> None:
        """What a store refuses before it looks at a commit's arguments (closed, read-only)."""

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
        expected_uid: str | None = None,
    ) -> str | None:
        """Insert ``events`` and delete ``dropped`` atomically, durable on return (see
        :meth:`~nous_session.stores.base.Store.commit`; each store's class doc says how).

        Args:
            expected_uid: when given, the commit happens only if the session's identity
                (``Stored.uid``) is this one (see :class:`~nous_session.stores.base.Store`).

        Returns:
            The identity of the session committed to (its ``Stored.uid``).

        Raises:
            ConflictError: the stored count (or horizon, or identity) is not the expected
                one, or a key or the commit id is taken; nothing was written.
            OutcomeUnknownError: (PostgreSQL) the connection was lost: the commit may have
                landed. Send it again with the same ``commit_id`` (exactly one of the two
                lands).
            StoreError: the store failed; nothing was written.
        """
        self._before_commit()
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
            expected_uid=expected_uid,
        )
        return await self._commit(
            Commit(
                session_id,
                expected_count,
                rows,
                dropped,
                expected_horizon,
                horizon,
                keys,
                kept,
                commit_id,
                expected_uid,
            )
        )

    async def _commit(self, commit: Commit) -> str | None:
        raise NotImplementedError

    async def commit_rebased(
        self,
        session_id: str,
        *,
        expected_count: int,
        events: Sequence[Event],
        keys: Sequence[tuple[str, int, int]] = (),
        commit_id: str | None = None,
        expected_uid: str | None = None,
    ) -> Rebased:
        """Append ``events`` after the session's current count (see
        :class:`~nous_session.stores.base.RebasingStore`; ``expected_uid`` as for
        :meth:`commit`).

        Raises:
            ConflictError: the stored count is below ``expected_count``, the session's
                identity is not ``expected_uid``, or a key or the commit id is taken;
                nothing was written.
            CorruptRecordError: a record another writer stored in between cannot be decoded
                (PostgreSQL: the batch itself was committed; the message says so and where).
            OutcomeUnknownError, StoreError: as for :meth:`commit`.
        """
        self._before_commit()
        rows = check_rebase_arguments(
            session_id,
            expected_count,
            events,
            keys=keys,
            commit_id=commit_id,
            expected_uid=expected_uid,
        )
        return await self._commit_rebased(
            Commit(
                session_id,
                expected_count,
                rows,
                keys=keys,
                commit_id=commit_id,
                expected_uid=expected_uid,
            )
        )

    async def _commit_rebased(self, commit: Commit) -> Rebased:
        raise NotImplementedError

    async def fork(self, session_id: str, new_session_id: str, *, at: int) -> None:
        """A new session sharing ``session_id``'s history up to seq ``at``, whatever its
        length (see :class:`~nous_session.stores.base.ForkingStore`): its arguments checked
        here, then the store's own ``_fork`` makes one row (or entry) in one step.

        Raises:
            ValueError: ``at`` is not in the parent's history, the parent does not exist, or
                ``new_session_id`` is not a session id or already is a session with events.
            StoreError: the store is closed or read-only, or could not be written.
        """
        self._before_commit()
        check_session_id(new_session_id)
        await self._fork(session_id, new_session_id, at)

    async def _fork(self, session_id: str, new_session_id: str, at: int) -> None:
        raise NotImplementedError

    async def list_sessions(self, **arguments: Unpack[ListArguments]) -> SessionPage:
        """A page of the matching sessions (see :class:`~nous_session.stores.base.ListingStore`).

        SQLite and PostgreSQL answer it with one query, its filter and order served by an
        index on (owner, time, name) or (time, name); in memory each call looks at every
        session. Reading never writes (a read-only store lists too).

        Raises:
            TypeError: an argument it does not take.
            ValueError: a bad argument or cursor.
            StoreError: the store cannot be read.
        """
        query = ListQuery.make(**arguments)
        return query.page(await self._list(query))

    async def _list(self, query: ListQuery) -> Sequence[SessionEntry]:
        """Up to ``query.limit + 1`` matching entries, in the query's order."""
        raise NotImplementedError

    async def aclose(self) -> None:
        """Close the store. Idempotent."""
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


class FeedStore(StoreBase):
    """A store with a change feed (``watch``): :meth:`follow` reads through it."""

    def watch(self, session_id: str, *, known: Known | None = None) -> AsyncGenerator[int, None]:
        """The session's heads as commits land, past what ``known`` says the watcher holds
        (see the store's own ``watch``)."""
        raise NotImplementedError

    async def read(self, session_id: str, *, since: int = 0) -> Stored:
        """The session from ``since`` on, with its count and identity (see the store's own
        ``read``)."""
        raise NotImplementedError

    async def follow(self, session_id: str, *, since: int = 0) -> AsyncGenerator[Event, None]:
        """Yield the session's events from ``since`` on, then each one committed later by any
        process, in seq order and at most once (through the store's ``watch``, across its
        reconnections: a head of ``-1`` means read everything since the last event).

        Raises:
            SessionDeletedError: the session was deleted, or deleted and made again, while it
                was followed: the stream ends (see :func:`nous_session.stores.follow`).
        """
        followed = Followed(self, session_id, since)
        # Told what the follow holds, the feed says -1 for a session deleted before the
        # watch began too (SQLite's first head is what it reads; PostgreSQL's is -1).
        watcher = self.watch(session_id, known=followed.holds)
        try:
            for event in await followed.read():
                yield event
            async for head in watcher:
                if head != -1 and head <= followed.cursor:
                    continue
                for event in await followed.read():
                    yield event
        finally:
            await watcher.aclose()
