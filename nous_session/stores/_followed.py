"""A follow's reads of one session (:func:`nous_session.stores.follow`, and a change feed
store's own ``follow``): the events past its cursor, and the end of the stream when the session
it follows is deleted, or deleted and made again."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from nous_session.errors import SessionDeletedError
from nous_session.event import Event
from nous_session.stores.base import Stored, check_since

__all__ = ["Followed", "Reading"]


class Reading(Protocol):
    """What a follow reads a session through: the store's ``read``."""

    async def read(self, session_id: str, *, since: int = 0) -> Stored: ...


class Followed:
    """One session as a follow reads it: where it is (the cursor), and which session it is.

    The session is the one the first read finds with events (or the one made later, when the
    follow starts before it exists): its identity (``Stored.uid``) and its count, which never
    goes down. A read that finds a lower count, or another identity, finds that session gone:
    a delete, or a delete and a session made again under the id, whose events are not the
    followed session's.
    """

    __slots__ = ("_count", "_horizon", "_session_id", "_store", "_uid", "cursor")

    def __init__(self, store: Reading, session_id: str, since: int) -> None:
        check_since(since)
        self._store = store
        self._session_id = session_id
        self.cursor = since
        self._count = 0
        self._horizon = 0
        self._uid: str | None = None

    def holds(self) -> tuple[int, int, bool, str | None]:
        """What the follow holds, as a change feed's ``known`` asks (from the feed's thread:
        it only reads): the count and horizon it read last, no commit of its own, and the
        session's identity once read."""
        return self._count, self._horizon, False, self._uid

    async def read(self) -> Sequence[Event]:
        """The session's events from the cursor on, which then moves past them.

        Raises:
            SessionDeletedError: the followed session was deleted (and maybe made again).
            StoreError: the store could not be read.
        """
        stored = await self._store.read(self._session_id, since=self.cursor)
        if stored.count < self._count or (self._uid is not None and stored.uid != self._uid):
            again = " and made again" if stored.count else ""
            raise SessionDeletedError(
                f"session {self._session_id!r} was deleted{again} while it was followed"
                f" (it had {self._count} events)"
            )
        self._count, self._horizon = stored.count, stored.horizon
        if stored.uid is not None:
            self._uid = stored.uid
        events = stored.events
        if events:
            self.cursor = events[-1].seq + 1
        return events
