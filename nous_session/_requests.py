"""The requests a SessionActor serialises: one class per kind, each with a pure ``apply``.

A request is what a call puts into the actor's queue: its arguments, already validated and
copied in the caller, and the slot its answer goes into. ``apply(log, committed)`` computes what
the request does to a Log value, without I/O and without touching the actor: the actor applies
a batch of them in arrival order, commits the result in one store call, and only then resolves
each request with its result (or fails it). Barrier requests (catching up with the store) are
not applied: what came before them is committed first, then the actor reads the store.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, ClassVar, TypeAlias

import anyio
import attrs

from nous_session.errors import InvalidEventError
from nous_session.event import Event, EventType
from nous_session.log import Log

__all__ = ["Append", "Applied", "Reload", "Request", "Snapshot"]

Prepared: TypeAlias = tuple[EventType, dict[str, Any], datetime]
"""What :func:`nous_session.event.prepare` returns: a validated, copied event before its seq."""


@attrs.frozen
class Applied:
    """What applying one request to a Log value gives.

    Attributes:
        log: the Log after the request.
        result: what the caller gets once the batch is committed.
        dropped: seqs (below the committed count) the store must delete.
        rebuilt: whether the surface changed other than by growing at the end.
    """

    log: Log
    result: Any
    dropped: Sequence[int] = ()
    rebuilt: bool = False


class Request:
    """One queued call and the slot its answer goes into."""

    __slots__ = ("done", "error", "result")

    barrier: ClassVar[bool] = False
    """True for requests that are not applied: the batch before them is committed first."""

    def __init__(self) -> None:
        self.done = anyio.Event()
        self.result: Any = None
        self.error: BaseException | None = None

    def apply(self, log: Log, committed: int) -> Applied:
        """What this request does to ``log`` (``committed`` is the store's count before the
        batch). Pure: no I/O, nothing shared is changed.

        Raises:
            InvalidEventError: the request is invalid against ``log``; it alone fails.
        """
        raise NotImplementedError

    def resolve(self, result: Any) -> None:
        """Answer the caller with ``result``."""
        self.result = result
        self.done.set()

    def fail(self, error: BaseException) -> None:
        """Answer the caller with ``error``."""
        self.error = error
        self.done.set()

    async def outcome(self) -> Any:
        """Wait for the answer; raise the error, or return the result."""
        await self.done.wait()
        if self.error is not None:
            raise self.error
        return self.result


class Append(Request):
    """Append events atomically (all or none); the result is the tuple of committed events."""

    __slots__ = ("items",)

    def __init__(self, items: tuple[Prepared, ...]) -> None:
        super().__init__()
        self.items = items

    @property
    def plain(self) -> bool:
        """No item carries a surface op: the events mean the same at any seq, so a rebasing
        commit may move them."""
        return all("surface_op" not in item[1] for item in self.items)

    def apply(self, log: Log, committed: int) -> Applied:
        """Append every item or none; a refused item names its index."""
        items = self.items
        if len(items) == 1:
            log = log.append_prepared(items[0])
            event = log.last
            assert event is not None
            return Applied(log, (event,), rebuilt=event.op is not None)
        events: list[Event] = []
        candidate = log
        for index, item in enumerate(items):
            try:
                candidate = candidate.append_prepared(item)
            except InvalidEventError as error:
                log._give_back(candidate)  # the items before it never happened either
                raise InvalidEventError(f"append_many item {index}: {error}") from None
            event = candidate.last
            assert event is not None
            events.append(event)
        return Applied(
            candidate, tuple(events), rebuilt=any(event.op is not None for event in events)
        )


class Snapshot(Request):
    """Drop every shadowed event; the result is the Log right after the snapshot."""

    __slots__ = ()

    def apply(self, log: Log, committed: int) -> Applied:
        """Shadowed events that are already stored must be deleted there too."""
        dropped = [event.seq for event in log.shadowed() if event.seq < committed]
        log = log.snapshot()
        return Applied(log, log, dropped)


class Reload(Request):
    """Catch up with what other writers committed; the result is the caught-up Log.

    Attributes:
        head: the store's head as a change feed reported it (None: read in any case).
        from_feed: whether the actor's own change-feed watcher queued it.
    """

    __slots__ = ("from_feed", "head")

    barrier = True

    def __init__(self, head: int | None = None, *, from_feed: bool = False) -> None:
        super().__init__()
        self.head = head
        self.from_feed = from_feed
