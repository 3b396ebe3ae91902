"""The store contract: how a SessionActor persists its log.

A store holds many sessions. Each session is its held events, in seq order, and its count
(1 + the highest seq ever committed, never lowered). The actor is the only thing that calls
``commit`` for a session in a process; the ``expected_count`` check is what stops two actors
(in one process or many) from both extending a session.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Iterable, Sequence
from typing import Protocol, runtime_checkable

import attrs

from nous_session.event import Event

__all__ = [
    "ChangeFeedStore",
    "FollowingStore",
    "Rebased",
    "RebasingStore",
    "SessionInfo",
    "Store",
    "VacuumingStore",
    "check_commit_arguments",
    "check_rebase_arguments",
    "check_session_id",
    "moved",
    "place",
    "supports",
]


@attrs.frozen
class SessionInfo:
    """One stored session: its id, its count (the next seq) and how many events it holds."""

    session_id: str
    count: int
    held: int


@runtime_checkable
class Store(Protocol):
    """What a SessionActor needs from persistence.

    Every method may be called from any task; implementations serialise what needs it.
    """

    async def load(self, session_id: str, *, since: int = 0) -> Sequence[Event]:
        """The session's held events with seq >= ``since``, in seq order.

        An unknown session is empty (``[]``), not an error.

        Raises:
            ValueError: ``since`` is not an int >= 0.
            StoreError: the store could not be read.
            CorruptRecordError: a stored record could not be decoded (it names the record).
        """
        ...

    async def commit(
        self,
        session_id: str,
        *,
        expected_count: int,
        events: Sequence[Event],
        dropped: Sequence[int] = (),
    ) -> None:
        """Write ``events`` and delete the ``dropped`` seqs in one atomic, durable step.

        Returns only once the step is durable (as durable as the store promises). ``events``
        have seqs >= ``expected_count``, in increasing order; afterwards the session's count is
        1 + the highest seq written (unchanged when ``events`` is empty).

        Raises:
            ConflictError: the session's stored count is not ``expected_count`` (another
                writer got there first); nothing was written.
            StoreError: any other failure; nothing was written.
        """
        ...

    async def sessions(self) -> list[SessionInfo]:
        """Every session with a nonzero count, sorted by id.

        Raises:
            StoreError: the store could not be read.
        """
        ...

    async def delete(self, session_id: str) -> bool:
        """Delete a session and all its events at once; True when it existed.

        Raises:
            StoreError: the store could not be written.
        """
        ...

    async def aclose(self) -> None:
        """Release the store's resources. Idempotent; later calls raise StoreError."""
        ...


@attrs.frozen
class Rebased:
    """What :meth:`RebasingStore.commit_rebased` did.

    Attributes:
        shift: how far the events moved: each was stored at its seq + ``shift`` (0 when no
            other writer had committed since ``expected_count``).
        others: the events other writers had stored from ``expected_count`` up to where
            these landed, in seq order (fewer than ``shift`` when a snapshot dropped some).
        events: the events as stored, at their new seqs.
    """

    shift: int
    others: Sequence[Event]
    events: Sequence[Event]


@runtime_checkable
class RebasingStore(Store, Protocol):
    """A store that can append a batch after whatever the session holds, in one step.

    Optimistic concurrency (``commit`` with ``expected_count``) makes the loser of a race
    redo its work; when many processes append to one session most of that work is thrown
    away. A rebasing commit lets the store serialise the writers instead: it takes the
    session's current count under its own lock, stores the batch right after it and returns
    what the other writers had stored in between, so nothing is retried. The actor uses it
    with ``on_conflict="rebase"`` for batches whose meaning does not depend on their seqs
    (plain appends: no surface op, no snapshot).
    """

    async def commit_rebased(
        self, session_id: str, *, expected_count: int, events: Sequence[Event]
    ) -> Rebased:
        """Append ``events`` after the session's current count in one atomic, durable step.

        ``events`` are non-empty with contiguous seqs from ``expected_count``. With the
        stored count ``c >= expected_count``, each is stored at its seq + ``c -
        expected_count`` and the count becomes ``c + len(events)``.

        Raises:
            ValueError: the arguments are malformed (as for ``commit``, and the seqs must be
                contiguous); nothing was written.
            ConflictError: the stored count is below ``expected_count`` (the session was
                deleted, or the caller is ahead of this store); nothing was written.
            CorruptRecordError: a record stored in between cannot be decoded. A store may
                read those records after its commit (PostgresStore does, so as not to hold
                the session's lock while decoding); its message then says the batch was
                committed, and where. A SessionActor stops writing after this error.
            StoreError: any other failure; nothing was written.
        """
        ...


@runtime_checkable
class ChangeFeedStore(Store, Protocol):
    """A store that tells when a session's head moves, whichever process committed."""

    def watch(self, session_id: str) -> AsyncGenerator[int, None]:
        """Yield the session's new head whenever a commit lands, and ``-1`` when the feed
        (re)connects (whatever happened meanwhile must be read then). Runs until closed.

        Raises:
            StoreError: the feed cannot be set up at all.
        """
        ...


@runtime_checkable
class FollowingStore(Store, Protocol):
    """A store that streams a session's committed events natively (a change feed)."""

    def follow(self, session_id: str, *, since: int = 0) -> AsyncGenerator[Event, None]:
        """Yield the session's events from ``since`` on, then each one committed later by any
        process, in seq order and at most once. Runs until closed."""
        ...


@runtime_checkable
class VacuumingStore(Store, Protocol):
    """A store that can give the space of deleted events back to the file system."""

    async def vacuum(self) -> None:
        """Reclaim the space deleted events took (after a snapshot).

        Raises:
            StoreError: the store could not do it.
        """
        ...


def supports(store: object, capability: type) -> bool:
    """Whether ``store``'s class has every method the capability Protocol itself declares.

    Looked up on the class, not the instance: a wrapper store that passes unknown attributes
    through to another store (``__getattr__``) must not have its own ``commit`` bypassed by a
    capability the inner store has.
    """
    names = [
        name
        for name, value in vars(capability).items()
        if callable(value) and not name.startswith("_")
    ]
    return bool(names) and all(callable(getattr(type(store), name, None)) for name in names)


def moved(events: Sequence[Event], shift: int) -> list[Event]:
    """``events`` at their seq + ``shift`` (the same data, shared, and times)."""
    return [Event(e.seq + shift, e.type, e.data, e.time, e.op) for e in events]


def place(session_id: str, where: str) -> Callable[[int], str]:
    """How a load names a stored record in an error: session, seq and file or schema."""
    return lambda seq: f"session {session_id!r} seq {seq} in {where}"


def check_session_id(session_id: object) -> str:
    """Refuse what cannot be a session id in every store: not a non-empty string, or holding
    a NUL character (PostgreSQL text cannot store one).

    Raises:
        ValueError: naming what is wrong.
    """
    if not isinstance(session_id, str) or not session_id:
        raise ValueError(f"a session id must be a non-empty string, got {session_id!r}")
    if "\x00" in session_id:
        raise ValueError(f"a session id cannot contain NUL characters: {session_id!r}")
    return session_id


def _event_list(events: Iterable[Event]) -> list[Event]:
    """``events`` as a list (read once, so a generator works), each checked to be an Event."""
    listed = list(events)
    for index, event in enumerate(listed):
        if not isinstance(event, Event):
            raise ValueError(f"commit events must be Events; item {index} is {event!r}")
    return listed


def check_commit_arguments(
    session_id: str, expected_count: int, events: Iterable[Event], dropped: Sequence[int]
) -> list[Event]:
    """Refuse a malformed commit before anything is written (shared by every backend).

    Returns:
        ``events`` as a list, to write (an iterator is read once, here).

    Raises:
        ValueError: the session id is not a non-empty string, an event is not an Event, the
            events' seqs are not increasing from ``expected_count``, or a dropped seq is not
            below it.
    """
    check_session_id(session_id)
    listed = _event_list(events)
    previous = expected_count - 1
    for event in listed:
        if event.seq <= previous:
            raise ValueError(
                f"commit events must have increasing seqs from {expected_count}; got {event.seq}"
            )
        previous = event.seq
    for seq in dropped:
        if not 0 <= seq < expected_count:
            raise ValueError(f"a dropped seq must be below {expected_count}, got {seq}")
    return listed


def check_rebase_arguments(
    session_id: str, expected_count: int, events: Iterable[Event]
) -> list[Event]:
    """Refuse a malformed rebasing commit before anything is written.

    Returns:
        ``events`` as a list, to write (an iterator is read once, here).

    Raises:
        ValueError: the session id is bad, an event is not an Event, ``events`` is empty, or
            their seqs are not ``expected_count, expected_count + 1, ...``.
    """
    check_session_id(session_id)
    if type(expected_count) is not int or expected_count < 0:
        raise ValueError(f"expected_count must be an int >= 0, got {expected_count!r}")
    listed = _event_list(events)
    if not listed:
        raise ValueError("a rebasing commit needs at least one event")
    for offset, event in enumerate(listed):
        if event.seq != expected_count + offset:
            raise ValueError(
                f"rebasing commit events must have contiguous seqs from {expected_count};"
                f" event {offset} has seq {event.seq}"
            )
    return listed
