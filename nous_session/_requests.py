"""The requests a SessionActor serialises: one class per kind, each with a pure ``apply``.

A request is what a call puts into the actor's queue: its arguments, already validated and
copied in the caller, and the slot its answer goes into. ``apply(log, committed)`` computes what
the request does to a Log value, without I/O; a barrier (:class:`Reload`, :class:`Erase`) is
not applied but run between two commits (``run_barrier``). See docs/internals.md.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from datetime import datetime
from typing import Any, ClassVar, Generic, NamedTuple, Protocol, TypeAlias, TypeVar

import attrs

from nous_session._loops import Done
from nous_session.erasure import Erasure
from nous_session.errors import ConflictError, InvalidEventError
from nous_session.event import Event, EventType, replace_data, to_message
from nous_session.log import Log
from nous_session.message import Message

__all__ = [
    "INTERRUPTED",
    "Append",
    "Applied",
    "Call",
    "Edit",
    "Erase",
    "Follower",
    "Recover",
    "Reload",
    "Request",
    "Snapshot",
    "check_expectation",
]


class Follower(Protocol):
    """What a barrier needs of the actor's part that reads the store (the follower, in
    ``_follower.py``, which imports this module: named here by what it does, not imported)."""

    async def reload(self, request: Reload | None) -> BaseException | None: ...

    async def erase(self, request: Erase) -> None: ...


INTERRUPTED = "Tool call was interrupted and not executed. Please retry if needed."
"""The result :class:`Recover` gives every tool call left without one."""

Prepared: TypeAlias = tuple[EventType | str, dict[str, Any], datetime]
"""What :func:`nous_session.event.prepare` returns: a validated, copied event before its seq."""

ResultT = TypeVar("ResultT")
"""What a request's caller gets back."""


class Applied(NamedTuple):
    """What applying one request to a Log value gives (a tuple: it is made for every request
    of every batch).

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


class Request(Generic[ResultT]):
    """One queued call and the slot its answer goes into; ``ResultT`` is what its caller gets
    (what :meth:`nous_session._engine.Engine.call` returns)."""

    __slots__ = ("done", "error", "result")

    result: ResultT
    """The answer, set by :meth:`resolve` (unset until then: read only once ``done`` is set
    with no ``error``)."""

    barrier: ClassVar[bool] = False
    """True for requests that are not applied but run between two commits
    (:meth:`run_barrier`): the batch before them is committed first."""

    starts_commit: ClassVar[bool] = False
    """True for requests that must apply to a stored log: what came before them in the batch
    is committed first, and they start the next store commit."""

    checks_itself: ClassVar[bool] = False
    """True for requests whose ``apply`` checks, on whatever log it is given, that they still
    make sense there (a compaction's replacements): one that lost to another writer is applied
    again after catching up, whatever ``on_conflict`` says."""

    def __init__(self) -> None:
        self.done = Done()
        self.error: BaseException | None = None

    # A request declared with attrs (its arguments its fields; compared by identity, as a
    # request is one call) starts as any other, once its fields are set.
    __attrs_post_init__ = __init__

    def copies_content(self) -> bool:
        """Whether what the request writes was made by its caller from the session's content
        (a replace's messages): one that lost to an erasure's commit is not applied again on
        the erased log, since it may copy what was erased."""
        return False

    def apply(self, log: Log, committed: int) -> Applied:
        """What this request does to ``log`` (``committed`` is the store's count before the
        batch). Pure: no I/O, nothing shared is changed.

        Raises:
            InvalidEventError: the request is invalid against ``log``; it alone fails.
        """
        raise NotImplementedError

    async def run_barrier(self, follower: Follower) -> None:
        """Run a barrier in the actor task, between two commits, through the part of the
        actor that reads the store; it answers its caller."""
        raise NotImplementedError

    def resolve(self, result: ResultT) -> None:
        """Answer the caller with ``result``."""
        self.result = result
        self.done.set()

    def fail(self, error: BaseException) -> None:
        """Answer the caller with ``error``."""
        self.error = error
        self.done.set()


class Call(Protocol):
    """Sends a request to the actor and returns its answer (raises its error): the engine's
    :meth:`~nous_session._engine.Engine.call`, as the handle and compaction hold it."""

    def __call__(self, request: Request[ResultT], /) -> Awaitable[ResultT]: ...


class Append(Request[tuple[Event, ...]]):
    """Append events atomically (all or none); the result is the tuple of committed events.

    Attributes:
        items: the prepared events.
        key: the caller's idempotency key, or None. The actor answers a key it has seen with
            the events first committed under it, without applying the request.
        expect_count: the session's count the append is conditional on, or None: applied
            to a log of another count, it fails with ConflictError.
    """

    __slots__ = ("expect_count", "items", "key")

    def __init__(
        self, items: tuple[Prepared, ...], key: str | None = None, expect_count: int | None = None
    ) -> None:
        # Request.__init__, inlined: one of these is made for every append.
        self.done = Done()
        self.error = None
        self.items = items
        self.key = key
        self.expect_count = expect_count

    def copies_content(self) -> bool:
        """An item with a surface op (a replace) holds messages its caller made."""
        return any("surface_op" in item[1] for item in self.items)

    @property
    def plain(self) -> bool:
        """Unconditional, and no item carries a surface op: the events mean the same at any
        seq, so a rebasing commit may move them."""
        return self.expect_count is None and all("surface_op" not in item[1] for item in self.items)

    def apply(self, log: Log, committed: int) -> Applied:
        """Append every item or none; a refused item names its index.

        Raises:
            InvalidEventError: an item is refused.
            ConflictError: the log's count is not ``expect_count``.
        """
        if self.expect_count is not None and log.count != self.expect_count:
            raise ConflictError(
                f"the session holds {log.count} events, not the expected {self.expect_count}:"
                " another write came first; nothing was appended"
            )
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
                log.give_back(candidate)  # the items before it never happened either
                raise InvalidEventError(f"append_many item {index}: {error}") from None
            event = candidate.last
            assert event is not None
            events.append(event)
        return Applied(
            candidate, tuple(events), rebuilt=any(event.op is not None for event in events)
        )


def check_expectation(log: Log, start: int, stop: int, expect: int | Sequence[int]) -> None:
    """Refuse a conditional write whose range no longer holds what the caller saw.

    ``expect`` is how many surface entries positions ``start..stop`` hold, or the seqs of
    their events in order (the messages of one replace count once).

    Raises:
        ConflictError: the range holds something else.
    """
    entries = log.range(start, stop)
    if isinstance(expect, int):
        found: object = len(entries)
        wanted: object = expect
    else:
        seqs: list[int] = []
        for entry in entries:
            if not seqs or seqs[-1] != entry.seq:
                seqs.append(entry.seq)
        found, wanted = seqs, list(expect)
    if found != wanted:
        raise ConflictError(
            f"positions {start}..{stop} hold {found}, not the expected {wanted}:"
            " the surface changed; nothing was applied"
        )


@attrs.define(eq=False, weakref_slot=False)
class Edit(Request[tuple[Event, ...]]):
    """Append one range operation (a replace or a remove), if the range still holds what the
    caller expected; the result is the 1-tuple of the committed event."""

    item: Prepared
    start: int
    stop: int
    expect: int | Sequence[int] | None

    def copies_content(self) -> bool:
        """A replace holds messages its caller made; a remove, rewind or uncompact copies
        nothing."""
        return self.item[0] is EventType.REPLACE

    def apply(self, log: Log, committed: int) -> Applied:
        """Check the expectation against ``log``, then append."""
        if self.expect is not None:
            check_expectation(log, self.start, self.stop, self.expect)
        log = log.append_prepared(self.item)
        event = log.last
        assert event is not None
        return Applied(log, (event,), rebuilt=True)


class Recover(Request[tuple[Event, ...]]):
    """Give every assistant tool call on the surface that has no result one saying it was
    interrupted, so the next model call is valid for every provider. The result is the tuple
    of events added (empty when nothing was open).

    A call whose assistant message is followed only by tool results gets its result appended.
    One followed by anything else gets it right after the message: the message (with the rest
    of its replace, if it is part of one) is replaced by itself followed by the results.
    """

    __slots__ = ()

    def apply(self, log: Log, committed: int) -> Applied:
        """Find the open calls on ``log``'s surface and close them."""
        surface = log.surface()
        answered: set[object] = set()
        tail_is_results = True  # everything after the entry in hand is a tool result
        plan: list[tuple[int, list[Message]]] = []  # (surface index, results), newest first
        for index in range(len(surface) - 1, -1, -1):
            entry = surface[index]
            if entry.type is EventType.TOOL_RESULT:
                answered.add(entry.data.get("tool_call_id"))
                continue
            if entry.type is EventType.ASSISTANT_MESSAGE:
                message = to_message(entry)
                missing = [
                    Message.tool(call.id, INTERRUPTED, name=call.name)
                    for call in message.tool_calls
                    if call.id not in answered
                ]
                if missing:
                    plan.append((index if not tail_is_results else -1, missing))
            tail_is_results = False
        events: list[Event] = []
        candidate = log
        for index, results in plan:
            if index == -1:
                for result in results:
                    candidate = candidate.append(
                        EventType.TOOL_RESULT, result.to_json(), time=result.created_at
                    )
                    assert candidate.last is not None
                    events.append(candidate.last)
                continue
            position = surface[index].position
            group = log.range(position, position)
            messages: list[Message] = []
            for entry in group:
                messages.append(to_message(entry))
                if entry is surface[index]:
                    messages.extend(results)
            candidate = candidate.append(
                EventType.REPLACE, replace_data(position, position, messages)
            )
            assert candidate.last is not None
            events.append(candidate.last)
        return Applied(candidate, tuple(events), rebuilt=bool(events))


class Snapshot(Request[Log]):
    """Drop every shadowed event; the result is the Log right after the snapshot.

    It starts a store commit of its own (``starts_commit``): a store deletes only events it
    holds, so events that requests before it in the batch made must be stored first, or the
    snapshot would drop them before they ever were (and the commit would set a horizon past
    the stored count).
    """

    __slots__ = ()

    starts_commit = True

    def apply(self, log: Log, committed: int) -> Applied:
        """Shadowed events that are already stored must be deleted there too."""
        dropped = [event.seq for event in log.shadowed() if event.seq < committed]
        log = log.snapshot()
        return Applied(log, log, dropped)


@attrs.define(eq=False, weakref_slot=False)
class Reload(Request[Log]):
    """Catch up with what other writers committed; the result is the caught-up Log.

    Attributes:
        head: the store's head as a change feed reported it (None: read in any case).
        from_feed: whether the actor's own change-feed watcher queued it.
    """

    head: int | None = None
    from_feed: bool = attrs.field(default=False, kw_only=True)

    barrier = True

    async def run_barrier(self, follower: Follower) -> None:
        """Catch up (the follower answers)."""
        await follower.reload(self)


@attrs.define(eq=False, weakref_slot=False)
class Erase(Request[Erasure]):
    """Erase the events at ``seqs`` (checked in the caller); the result is the store's
    :class:`~nous_session.erasure.Erasure`.

    A barrier like :class:`Reload`: the requests before it are committed first, the ones
    after it apply to the erased log, and no commit of this actor runs while the store
    rewrites the rows.
    """

    seqs: tuple[int, ...]
    reason: str
    at: datetime
    summaries: bool = True

    barrier = True

    async def run_barrier(self, follower: Follower) -> None:
        """Erase in the store, then read the session again (the follower answers)."""
        await follower.erase(self)
