"""What the stores share beyond the contract: the listing signature written once, and the
change-feed reader of the SQL stores (see docs/internals.md, "Stores")."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Iterable, Mapping, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any, Self

from nous_session.event import Event
from nous_session.listing import ListQuery, SessionEntry, SessionPage
from nous_session.stores.base import check_since

__all__ = ["FeedStore", "StoreBase"]


class StoreBase:
    """The base of every store here: a listing is checked into a :class:`ListQuery` in one
    place, then answered by the store's :meth:`_list`; ``async with`` closes the store."""

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
        """A page of the matching sessions (see :class:`~nous_session.stores.base.ListingStore`).

        SQLite and PostgreSQL answer it with one query, its filter and order served by an
        index on (owner, time, name) or (time, name); in memory each call looks at every
        session. Reading never writes (a read-only store lists too).

        Raises:
            ValueError: a bad argument or cursor.
            StoreError: the store cannot be read.
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

    def watch(self, session_id: str) -> AsyncGenerator[int, None]:
        """The session's heads as commits land (see the store's own ``watch``)."""
        raise NotImplementedError

    async def load(self, session_id: str, *, since: int = 0) -> Sequence[Event]:
        """The session's held events with seq >= ``since`` (see the store's own ``load``)."""
        raise NotImplementedError

    async def follow(self, session_id: str, *, since: int = 0) -> AsyncGenerator[Event, None]:
        """Yield the session's events from ``since`` on, then each one committed later by any
        process, in seq order and at most once (through :meth:`watch`, across its
        reconnections: a head of ``-1`` means read everything since the last event)."""
        check_since(since)
        cursor = since
        watcher = self.watch(session_id)
        try:
            for event in await self.load(session_id, since=cursor):
                cursor = event.seq + 1
                yield event
            async for head in watcher:
                if head != -1 and head <= cursor:
                    continue
                for event in await self.load(session_id, since=cursor):
                    cursor = event.seq + 1
                    yield event
        finally:
            await watcher.aclose()
