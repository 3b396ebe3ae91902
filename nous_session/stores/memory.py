"""MemoryStore: the reference store, holding sessions in process memory.

It keeps the Event values themselves (they are immutable), so nothing is encoded. It is the
default store of a SessionActor and the behaviour every other backend must match.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from operator import attrgetter

import attrs

from nous_session.errors import ConflictError, StoreError
from nous_session.event import Event
from nous_session.stores.base import (
    Rebased,
    SessionInfo,
    check_commit_arguments,
    check_rebase_arguments,
    moved,
)

__all__ = ["MemoryStore"]

_SEQ = attrgetter("seq")


@attrs.define
class _Session:
    events: list[Event] = attrs.Factory(list)
    count: int = 0


@attrs.define
class MemoryStore:
    """Sessions in a dict, in this process. Durable only as long as the process lives."""

    _sessions: dict[str, _Session] = attrs.field(factory=dict, init=False)
    _closed: bool = attrs.field(default=False, init=False)

    async def load(self, session_id: str, *, since: int = 0) -> Sequence[Event]:
        """The held events with seq >= ``since``, in seq order."""
        self._check_open()
        if not isinstance(since, int) or isinstance(since, bool) or since < 0:
            raise ValueError(f"since must be an int >= 0, got {since!r}")
        session = self._sessions.get(session_id)
        if session is None:
            return []
        return session.events[bisect_left(session.events, since, key=_SEQ) :]

    async def commit(
        self,
        session_id: str,
        *,
        expected_count: int,
        events: Sequence[Event],
        dropped: Sequence[int] = (),
    ) -> None:
        """Append ``events`` and delete ``dropped`` atomically (nothing here can fail halfway)."""
        self._check_open()
        events = check_commit_arguments(session_id, expected_count, events, dropped)
        session = self._sessions.get(session_id)
        stored = 0 if session is None else session.count
        if stored != expected_count:
            raise ConflictError(
                f"session {session_id!r} has count {stored}, expected {expected_count}"
            )
        if session is None:
            session = self._sessions[session_id] = _Session()
        if dropped:
            gone = set(dropped)
            session.events = [event for event in session.events if event.seq not in gone]
        if events:
            session.events.extend(events)
            session.count = events[-1].seq + 1

    async def commit_rebased(
        self, session_id: str, *, expected_count: int, events: Sequence[Event]
    ) -> Rebased:
        """Append ``events`` after the session's current count (see :class:`RebasingStore`)."""
        self._check_open()
        events = check_rebase_arguments(session_id, expected_count, events)
        session = self._sessions.get(session_id)
        stored = 0 if session is None else session.count
        if stored < expected_count:
            raise ConflictError(
                f"session {session_id!r} has count {stored}, below the expected {expected_count}"
            )
        if session is None:
            session = self._sessions[session_id] = _Session()
        shift = stored - expected_count
        others = session.events[bisect_left(session.events, expected_count, key=_SEQ) :]
        placed = moved(events, shift) if shift else list(events)
        session.events.extend(placed)
        session.count = placed[-1].seq + 1
        return Rebased(shift, others, placed)

    async def sessions(self) -> list[SessionInfo]:
        """Every session with a nonzero count, sorted by id."""
        self._check_open()
        return [
            SessionInfo(sid, session.count, len(session.events))
            for sid, session in sorted(self._sessions.items())
            if session.count
        ]

    async def delete(self, session_id: str) -> bool:
        """Forget a session; True when it existed."""
        self._check_open()
        return self._sessions.pop(session_id, None) is not None

    @property
    def url(self) -> str:
        """``memory:``: each MemoryStore is its own private space."""
        return "memory:"

    async def __aenter__(self) -> MemoryStore:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the store; later calls raise StoreError."""
        self._closed = True

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError("the store is closed")
