"""The bookkeeping of a :class:`~nous_session.registry.Sessions` registry: each session's
entry, the open unleased ones in least-recently-used order, and the counts that make every
operation O(1). Plain, synchronous state: the registry's tasks (opening, hosting, reaping)
call it and do all the waiting."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

import anyio
import attrs

from nous_session._loops import Done
from nous_session.actor import SessionActor, close, closing

__all__ = ["Entries", "Entry"]


@attrs.define(eq=False)
class Entry:
    """One session's actor, from the moment someone asks for it until it has closed.

    It is in the registry (and holds its callers' leases) before its actor exists, so nothing
    can close an actor between its opening and the caller that asked for it.
    """

    session_id: str
    actor: SessionActor | None = None  # set once the actor runs
    error: Exception | None = None  # why it could not open
    # The library's one-shot events, not anyio's: an anyio.Event is an asyncio.Event with a
    # deque, some 800 bytes, and every open session has two.
    ready: Done = attrs.field(factory=Done)  # set: opened, or failed to
    gone: Done = attrs.field(factory=Done)  # set: it closed and left the registry
    closing: bool = False  # the actor is told to close (nothing waits for it: a flag)
    leases: int = 0
    used_at: float = 0.0
    requests: int = 0  # the actor's request counter when last looked at: a change is use


class Entries:
    """Every session's current entry (opening, open or closing: one actor per session), and
    the counts the registry's statistics and ``max_open`` read.

    An entry is *idle* while its actor is open, unleased and not told to close: the idle ones
    wait in least-recently-used order, so eviction takes the front.
    """

    def __init__(self, max_open: int) -> None:
        self.max_open = max_open
        self.by_id: dict[str, Entry] = {}
        self.idle: OrderedDict[str, Entry] = OrderedDict()
        self.live = 0  # entries opening or open, not told to close: what max_open counts
        self.open = 0  # of those, the ones whose actor runs
        self.leased = 0  # of those, the ones with a lease
        self.opened = 0
        self.closed_idle = 0
        self.closed_lru = 0
        # The event loop's clock (the registry binds it on entering): read at every use.
        self.now: Callable[[], float] = anyio.current_time

    def add(self, session_id: str) -> Entry:
        """A new entry for ``session_id``, leased for the caller who asked for it."""
        entry = self.by_id[session_id] = Entry(session_id)
        self.live += 1
        self.lease(entry)
        return entry

    def remove(self, entry: Entry) -> None:
        """Forget ``entry`` (closed), unless the session has a newer one already."""
        if self.by_id.get(entry.session_id) is entry:
            del self.by_id[entry.session_id]

    def usable(self, entry: Entry) -> bool:
        """Whether ``entry``'s actor runs and nothing is closing it; an actor that stopped or
        began to close by itself (its task failed, its session was deleted) is told to close,
        so that the next caller gets a new one."""
        actor = entry.actor
        if actor is None or entry.closing:
            return False
        if closing(actor):
            self.close(entry)
            return False
        return True

    def touch(self, entry: Entry) -> None:
        """``entry`` was used now: the most recently used, if it is idle."""
        entry.used_at = self.now()
        if not entry.leases:
            self.idle.move_to_end(entry.session_id)

    def lease(self, entry: Entry) -> None:
        if not entry.leases and entry.actor is not None and not entry.closing:
            del self.idle[entry.session_id]
            self.leased += 1
        entry.leases += 1

    def release(self, entry: Entry) -> None:
        """Drop a lease; an actor no longer leased becomes the most recently used idle one."""
        entry.leases -= 1
        entry.used_at = self.now()
        if not entry.leases and entry.actor is not None and not entry.closing:
            self.leased -= 1
            self.idle[entry.session_id] = entry

    def started(self, entry: Entry, actor: SessionActor) -> None:
        """``entry``'s actor takes requests: count it, and hand it to its callers (or close it
        at once, if the entry was told to close while it opened)."""
        entry.actor = actor
        entry.used_at = self.now()
        self.opened += 1
        if entry.closing:
            close(actor)
        else:
            self.open += 1
            if entry.leases:
                self.leased += 1
            else:  # its callers were cancelled while it opened
                self.idle[entry.session_id] = entry
        entry.ready.set()

    def close(self, entry: Entry) -> bool:
        """Tell ``entry``'s actor to close, keeping the counts; False if it was told already."""
        if entry.closing:
            return False
        entry.closing = True
        self.live -= 1
        if entry.actor is not None:
            close(entry.actor)  # its task commits what is queued, then ends
            self.open -= 1
            if entry.leases:
                self.leased -= 1
            else:
                del self.idle[entry.session_id]
        return True

    def evict(self, keep: Entry | None = None) -> list[Entry]:
        """Close least recently used unleased actors until at most ``max_open`` are open or
        opening, none is left unleased, or the next is ``keep``; return those told to close.

        O(1) per actor closed: they are taken from the front of the LRU order.
        """
        evicted = []
        while self.live > self.max_open and self.idle:
            entry = next(iter(self.idle.values()))
            if entry is keep:
                break
            self.close(entry)
            self.closed_lru += 1
            evicted.append(entry)
        return evicted

    def close_idle(self, idle_timeout: float) -> None:
        """Close the actors that sat idle for ``idle_timeout`` seconds: no call, no request,
        no subscriber, nothing queued and no compaction in that time. O(n) in the idle ones
        (leased ones are busy by definition)."""
        now = self.now()
        for entry in list(self.idle.values()):
            if not entry.closing and not self._busy(entry, now, idle_timeout):
                self.close(entry)
                self.closed_idle += 1

    def _busy(self, entry: Entry, now: float, idle_timeout: float) -> bool:
        actor = entry.actor
        assert actor is not None  # only open entries are idle
        if actor.closed:
            return False
        stats = actor.statistics()
        if stats.requests != entry.requests:
            entry.requests = stats.requests
            entry.used_at = now
            self.idle.move_to_end(entry.session_id)  # taking requests is use
        return bool(
            stats.subscribers
            or stats.queue_depth
            or stats.compaction_in_flight
            or now - entry.used_at < idle_timeout
        )
