"""What a session publishes, and the subscriptions that read it.

The actor and its subscribers share one :class:`Published` value, the way an anyio memory
stream's two ends share one state object: the actor writes it (a new committed Log, a snapshot,
closing), subscribers only read it, and neither reaches into the other. Publishing costs the
actor the same whatever the number of subscribers: it replaces the Log value and sets one shared
:class:`anyio.Event`; each subscriber reads the immutable Log by its own cursor.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Final

import anyio
import anyio.abc
import anyio.lowlevel

from nous_session.event import Event
from nous_session.log import Log

__all__ = ["Subscription"]  # Published is the actor's, reached by path

# A subscriber that never has to wait still yields to the event loop this often.
_YIELD_EVERY: Final = 128
# From this many subscribers on, wake-ups are coalesced, about this long per subscriber.
_COALESCE_FROM: Final = 32
_WAKE_COST: Final = 2e-6


class Published:
    """The state a session shares with its readers: the committed Log and when it changes.

    Attributes:
        log: the latest committed Log value.
        closed: True once nothing more will be committed.
        snapshots: bumped whenever a published Log dropped events (a subscriber's read-ahead
            may hold some of them).
        subscribers: open subscriptions.
        readers: the open subscriptions themselves, as the keys of a dict (telemetry reads
            their cursors to report subscriber lag; nothing on the actor's path touches it).
            A dict, not a set: an empty set is 216 bytes, an empty dict 64, and every open
            session has one.

    Nothing is allocated for readers until one waits: an idle session (or one nobody
    subscribes to) holds no event objects, and a commit with nobody waiting wakes nobody.
    """

    __slots__ = (
        "_changed",
        "_start_waker",
        "_wake_requested",
        "closed",
        "log",
        "readers",
        "snapshots",
        "subscribers",
    )

    def __init__(self, log: Log, start_waker: Callable[[], None] | None = None) -> None:
        self.log = log
        self.closed = False
        self.snapshots = 0
        self.subscribers = 0
        self.readers: dict[Subscription, None] = {}
        self._changed: anyio.Event | None = None  # made by the first reader that waits
        self._wake_requested: anyio.Event | None = None  # the waker's, once it is started
        # Starts run_waker in the owner's task group, the first time wake-ups are coalesced.
        self._start_waker = start_waker

    def changed(self) -> anyio.Event:
        """The event the next publish sets (for a reader about to wait)."""
        changed = self._changed
        if changed is None:
            changed = self._changed = anyio.Event()
        return changed

    def publish(self, log: Log, *, dropped: bool = False) -> None:
        """Make ``log`` the committed value and tell the subscribers.

        Waking is the event loop's work, once per waiting subscriber. With few subscribers
        they are woken at once; with many, the waker task (:meth:`run_waker`) wakes them once
        per short window (about 2 µs per subscriber: 2 ms for 1,000) instead of at every
        commit; each wake-up reads everything published by then. With 1,000 subscribers this
        keeps the session's append rate at what it is with none, for a few milliseconds of
        delivery latency.
        """
        self.log = log
        if dropped:
            self.snapshots += 1
        if self._changed is None:
            return  # nobody is waiting
        if self.subscribers < _COALESCE_FROM or self.closed or self._start_waker is None:
            self.wake()
            return
        requested = self._wake_requested
        if requested is None:
            requested = self._wake_requested = anyio.Event()
            self._start_waker()
        requested.set()

    def close(self) -> None:
        """Nothing more will be published: wake every subscriber so it can finish."""
        self.closed = True
        self._start_waker = None  # the session's: no reference cycle left to the collector
        self.wake()

    def wake(self) -> None:
        """Wake every waiting subscriber now."""
        # One Event per wake-up, shared by every subscriber: O(1) for the publisher.
        changed, self._changed = self._changed, None
        if changed is not None:
            changed.set()

    async def run_waker(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Coalesce wake-ups while there are many subscribers; runs until cancelled."""
        task_status.started()
        while True:
            requested = self._wake_requested
            assert requested is not None  # made before the waker is started
            await requested.wait()
            # Let the commits of the next window gather behind this one wake-up.
            await anyio.sleep(self.subscribers * _WAKE_COST)
            self._wake_requested = anyio.Event()
            self.wake()


class Subscription:
    """Committed events of one session, from a seq onward: catch up, then follow live appends.

    Use it as ``async with session.subscribe(since) as events: async for event in events``.
    Each committed event with seq >= ``since`` is yielded at most once, in seq order; every
    event the latest Log still holds when the subscriber reaches it is yielded (an event a
    snapshot dropped before the subscriber got to it is skipped). Iteration ends after the
    session closes and everything it committed has been yielded.
    """

    __slots__ = ("_cursor", "_pending", "_published", "_snapshots", "_streak")

    def __init__(self, published: Published, since: int) -> None:
        self._published = published
        self._cursor = since
        self._pending: Iterator[Event] = iter(())
        self._snapshots = published.snapshots
        self._streak = 0

    @property
    def cursor(self) -> int:
        """The seq the next event will have at least."""
        return self._cursor

    async def __aenter__(self) -> Subscription:
        self._published.subscribers += 1
        self._published.readers[self] = None
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self._published.subscribers -= 1
        self._published.readers.pop(self, None)

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> Event:
        published = self._published
        while True:
            if self._snapshots != published.snapshots:
                # A snapshot dropped events: what was read ahead may hold some of them.
                self._snapshots = published.snapshots
                self._pending = iter(())
            event = next(self._pending, None)
            if event is not None:
                self._cursor = event.seq + 1
                self._streak += 1
                if self._streak >= _YIELD_EVERY:
                    # A long catch-up must not starve the actor or the other subscribers.
                    self._streak = 0
                    await anyio.lowlevel.checkpoint()
                return event
            # Take the notification before reading the log: a publish in between sets it.
            changed = published.changed()
            log = published.log
            if self._cursor < log.count:
                fresh = log.since(self._cursor)
                if fresh:
                    self._pending = iter(fresh)
                    continue
            if published.closed:
                raise StopAsyncIteration
            self._streak = 0
            await changed.wait()
