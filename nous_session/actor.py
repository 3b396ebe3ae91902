"""SessionActor: one writer per session, committed-event streams, background compaction.

One actor task owns a session's :class:`~nous_session.log.Log`. Callers put requests into a
bounded queue; the actor takes every request waiting as one batch, applies them in arrival
order (each validated against the log the requests before it left), commits the batch to the
store in one call (group commit), and only then publishes the new Log value, wakes subscribers
and acknowledges each request with its result or error. Readers therefore never see an event
that is not committed.

Backpressure: the queue holds ``queue_size`` requests. A caller whose request does not fit
waits for space (a cancelled wait sends nothing). Subscribers never hold up the actor: each
reads the published, immutable Log by cursor and waits on one shared notification, so the actor
does the same work per commit (one ``Event.set``) whatever the number of subscribers; waking
the waiting subscribers is the event loop's scheduling work, once per commit each, not once per
event. A subscriber that stops reading holds nothing but its cursor and the Log value it last
read.

Compaction runs in a child task on a committed Log value and posts its result back through the
queue, where it is applied only if the surface it planned over is still exactly there.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, nullcontext
from datetime import datetime
from types import TracebackType
from typing import Any, Final, Literal, TypeVar

import anyio
import anyio.abc
import anyio.lowlevel
import anyio.to_thread
import attrs
import structlog

from nous_session.compaction import (
    CHUNK,
    CompactionPolicy,
    Replacement,
    TokenMeter,
    plan_pruning,
    plan_summary,
    still_applies,
    summary_replacement,
)
from nous_session.errors import (
    ConflictError,
    CorruptRecordError,
    InvalidEventError,
    SessionClosedError,
    StoreError,
)
from nous_session.event import Event, EventType, make_event, message_event, prepare, to_message
from nous_session.log import Log
from nous_session.message import Message
from nous_session.stores import open_store
from nous_session.stores.base import Store, check_session_id
from nous_session.stores.memory import MemoryStore
from nous_session.transcript import summary_line

__all__ = ["SessionActor", "SessionStatistics", "Subscription"]

_logger = structlog.get_logger("nous_session")

_APPEND: Final = 0
_SNAPSHOT: Final = 1
_COMPACTION: Final = 2
_RELOAD: Final = 3
_CATCH_UP: Final = 4  # internal: the store says another process committed

# A subscriber that never has to wait still yields to the event loop this often.
_YIELD_EVERY: Final = 128
# Compaction's loops over messages yield to the event loop after this many items.
_CHUNK: Final = CHUNK
# With on_conflict="rebase", how many times a batch is re-applied after a conflict.
_REBASE_ATTEMPTS: Final = 32
# From this many subscribers on, wake-ups are coalesced, about this long per subscriber.
_COALESCE_FROM: Final = 32
_WAKE_COST: Final = 2e-6
# A restored log longer than this is folded in a worker thread before the actor starts.
_WARM_ABOVE: Final = 2048

T = TypeVar("T")
U = TypeVar("U")
Prepared = tuple[EventType, dict[str, Any], datetime]


@attrs.frozen
class _Applied:
    """A batch applied to the published log, not yet committed."""

    base: Log
    log: Log
    dropped: list[int]
    applied: list[tuple[_Request, Any]]
    rebuilt: bool


class _Request:
    """One queued call and the slot its answer goes into."""

    __slots__ = ("done", "error", "kind", "payload", "result")

    def __init__(self, kind: int, payload: Any) -> None:
        self.kind = kind
        self.payload = payload
        self.done = anyio.Event()
        self.result: Any = None
        self.error: BaseException | None = None

    def resolve(self, result: Any) -> None:
        self.result = result
        self.done.set()

    def fail(self, error: BaseException) -> None:
        self.error = error
        self.done.set()


def _closed_error() -> SessionClosedError:
    return SessionClosedError("the session is closed")


def _store_error(error: BaseException) -> StoreError:
    """A fresh StoreError (of the same class) for one caller, chained to the store's error."""
    copy: StoreError | None = None
    if isinstance(error, StoreError):
        try:
            copy = type(error)(*error.args)
        except Exception:  # a third-party subclass with another signature
            copy = None
    if copy is None:
        copy = StoreError(f"the store failed: {error!r}")
    copy.__cause__ = error
    return copy


@attrs.frozen
class SessionStatistics:
    """A point-in-time view of a session actor.

    Attributes:
        queue_depth: requests accepted into the queue and not yet taken by the actor.
        count: the published Log's count (the next seq).
        subscribers: open subscriptions.
        batches: batches committed so far (store commits).
        requests: requests applied in committed batches (``requests / batches`` is the mean
            batch size).
        compactions_run: compactions whose result was applied (a summary, or pruning alone).
        compactions_stale: compaction results dropped because the surface changed meanwhile.
        compactions_failed: compactions that failed (summarizer error, empty summary, timeout,
            or a store failure while committing the result).
        compaction_in_flight: whether a compaction is running now.
    """

    queue_depth: int
    count: int
    subscribers: int
    batches: int
    requests: int
    compactions_run: int
    compactions_stale: int
    compactions_failed: int
    compaction_in_flight: bool


class Subscription:
    """Committed events of one session, from a seq onward: catch up, then follow live appends.

    Use it as ``async with session.subscribe(since) as events: async for event in events``.
    Each committed event with seq >= ``since`` is yielded at most once, in seq order; every
    event the latest Log still holds when the subscriber reaches it is yielded (an event a
    snapshot dropped before the subscriber got to it is skipped). Iteration ends after the
    session closes and everything it committed has been yielded.
    """

    __slots__ = ("_actor", "_cursor", "_pending", "_snapshots", "_streak")

    def __init__(self, actor: SessionActor, since: int) -> None:
        self._actor = actor
        self._cursor = since
        self._pending: Iterator[Event] = iter(())
        self._snapshots = actor._snapshots
        self._streak = 0

    @property
    def cursor(self) -> int:
        """The seq the next event will have at least."""
        return self._cursor

    async def __aenter__(self) -> Subscription:
        self._actor._subscribers += 1
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._actor._subscribers -= 1

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> Event:
        actor = self._actor
        while True:
            if self._snapshots != actor._snapshots:
                # A snapshot dropped events: what was read ahead may hold some of them.
                self._snapshots = actor._snapshots
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
            changed = actor._changed
            log = actor._log
            if self._cursor < log.count:
                fresh = log.since(self._cursor)
                if fresh:
                    self._pending = iter(fresh)
                    continue
            if actor._closed:
                raise StopAsyncIteration
            self._streak = 0
            await changed.wait()


_OPEN_KEY: Final = object()


class SessionActor:
    """The runtime of one session: an actor task that owns its Log.

    Open it with :meth:`open`; the constructor is not public. Every call is safe from any task
    of the event loop the actor runs in.
    """

    __slots__ = (
        "_admit",
        "_batches",
        "_catch_up_queued",
        "_changed",
        "_closed",
        "_closing",
        "_compaction_done",
        "_compaction_scope",
        "_compactions_failed",
        "_compactions_run",
        "_compactions_stale",
        "_in_flight",
        "_log",
        "_log_commits",
        "_logger",
        "_meter",
        "_parked",
        "_policy",
        "_rebase",
        "_rebased_commit",
        "_receive",
        "_requests",
        "_retry_at",
        "_send",
        "_session_id",
        "_snapshots",
        "_store",
        "_subscribers",
        "_task_group",
        "_unfollowable",
        "_wake_requested",
        "_waker_scope",
        "_watch_scope",
    )

    def __init__(
        self,
        key: object,
        *,
        session_id: str,
        store: Store,
        log: Log,
        compaction: CompactionPolicy | None,
        queue_size: int,
        task_group: anyio.abc.TaskGroup,
        rebase: bool,
    ) -> None:
        if key is not _OPEN_KEY:
            raise TypeError("use `async with SessionActor.open(session_id=...) as session`")
        self._session_id = session_id
        self._rebase = rebase
        # A store that can append after whatever the session holds serialises the writers
        # itself: plain appends then never conflict and nothing is redone.
        # Looked up on the class: a wrapper store that passes unknown attributes through to
        # another store must not have its own commit bypassed by the inner store's method.
        rebasing = rebase and callable(getattr(type(store), "commit_rebased", None))
        self._rebased_commit = store.commit_rebased if rebasing else None  # type: ignore[attr-defined]
        self._store = store
        self._log = log
        self._policy = compaction
        self._task_group = task_group
        self._send, self._receive = anyio.create_memory_object_stream[_Request](queue_size)
        self._changed = anyio.Event()
        self._wake_requested = anyio.Event()
        self._waker_scope = anyio.CancelScope()
        self._closing = False  # no new requests; set when leaving the `async with` block
        self._closed = False  # the actor task has finished; nothing more will be committed
        self._admit = 0  # while closing: queued requests still to apply
        self._parked = False  # the actor is waiting in receive()
        self._subscribers = 0
        self._batches = 0
        self._requests = 0
        self._compactions_run = 0
        self._compactions_stale = 0
        self._compactions_failed = 0
        self._in_flight = False
        self._compaction_scope: anyio.CancelScope | None = None
        self._compaction_done = anyio.Event()
        self._compaction_done.set()
        self._retry_at = 0  # compaction waits for the surface to reach this size
        self._catch_up_queued = False
        self._snapshots = 0  # bumped when a published Log has dropped events
        self._watch_scope: anyio.CancelScope | None = None
        # Set when a rebasing commit met a record it cannot decode: this actor can no longer
        # follow the store past it, so it refuses further writes instead of repeating them.
        self._unfollowable: CorruptRecordError | None = None
        self._meter = TokenMeter(compaction.token_counter) if compaction is not None else None
        # Bind once: a bound logger filters debug lines at almost no cost per commit.
        self._logger = _logger.bind(session_id=session_id)
        # structlog's unconfigured default prints every level to stdout; a line per commit
        # there would drown the application's output, so commits are only logged once the
        # application has configured structlog (and so chosen its own level filter).
        self._log_commits = structlog.is_configured()

    # Opening and closing ----------------------------------------------------------------------

    @classmethod
    @asynccontextmanager
    async def open(
        cls,
        *,
        session_id: str,
        store: Store | str | None = None,
        compaction: CompactionPolicy | None = None,
        queue_size: int = 1024,
        follow: bool | None = None,
        on_conflict: Literal["raise", "rebase"] = "raise",
    ) -> AsyncIterator[SessionActor]:
        """Load the session and run its actor for the duration of the ``async with`` block.

        Args:
            session_id: the session's id, a non-empty string.
            store: where the log is persisted: a Store, or a URL for :func:`open_store` (the
                actor then owns and closes it); None means a private in-memory store.
            compaction: when and how to compact in the background; None never compacts.
            queue_size: how many requests may wait for the actor before callers wait too.
            follow: whether to follow commits that other processes make to this session, so
                the log and its subscribers see them; None (the default) follows when the
                store has a change feed (PostgreSQL), False never does.
            on_conflict: what a commit that loses to another writer does. ``"raise"`` (the
                default): its callers get :class:`ConflictError` (the actor has caught up, so a
                retry lands). ``"rebase"``: for many writers on one session, where conflicts are
                common. A batch of plain appends (no surface op) goes to a store that can
                rebase it (:class:`~nous_session.stores.base.RebasingStore`: all the built-in
                ones) with a rebasing commit: the store puts it after whatever the session
                holds, under its own lock, and returns what the other writers stored in
                between, so it never conflicts. Any other batch (a replace, a snapshot, a
                compaction), or any batch with another store, is applied again after the
                actor catches up, up to 32 times (with a short random backoff after the first)
                before raising; a replace or compaction is then re-checked against the
                caught-up log. Either way the events may get later seqs than the caller's log
                suggested; the returned events carry the seqs they were stored at.

        On leaving the block, requests already in the queue are applied and acknowledged;
        callers still waiting for queue space, and every later call, get
        :class:`SessionClosedError`; a running compaction is cancelled; subscriptions end once
        they have yielded everything committed. If the block is cancelled or raises, pending
        callers get :class:`SessionClosedError` (a batch already being committed completes).

        Raises:
            ValueError: a bad argument.
            StoreError: the session could not be loaded.
        """
        try:
            check_session_id(session_id)
        except ValueError as error:
            raise ValueError(f"bad session_id: {error}") from None
        if not isinstance(queue_size, int) or isinstance(queue_size, bool) or queue_size < 1:
            raise ValueError(f"queue_size must be an int >= 1, got {queue_size!r}")
        if on_conflict not in ("raise", "rebase"):
            raise ValueError(f'on_conflict must be "raise" or "rebase", got {on_conflict!r}')
        if compaction is not None and not isinstance(compaction, CompactionPolicy):
            raise ValueError(f"compaction must be a CompactionPolicy, got {compaction!r}")
        owned = store is None or isinstance(store, str)
        if store is None:
            store = MemoryStore()
        elif isinstance(store, str):
            store = open_store(store)
        elif not all(callable(getattr(store, name, None)) for name in ("load", "commit", "aclose")):
            raise ValueError(f"store must have async load, commit and aclose; got {store!r}")
        watch = getattr(store, "watch", None) if follow is not False else None
        if follow and watch is None:
            raise ValueError(f"follow=True needs a store with a change feed; {store!r} has none")
        try:
            log = await _load(store, session_id, fold=compaction is not None)
            async with _unwrapped(), anyio.create_task_group() as task_group:
                actor = cls(
                    _OPEN_KEY,
                    session_id=session_id,
                    store=store,
                    log=log,
                    compaction=compaction,
                    queue_size=queue_size,
                    task_group=task_group,
                    rebase=on_conflict == "rebase",
                )
                await task_group.start(actor._run)
                await task_group.start(actor._waker)
                if watch is not None:
                    await task_group.start(actor._watch, watch)
                try:
                    yield actor
                finally:
                    actor._begin_close()
        finally:
            if owned:
                await store.aclose()

    def _begin_close(self) -> None:
        if self._closing:
            return
        self._closing = True
        # Exactly the requests whose send has completed are still applied: those in the buffer,
        # and the one a send may have handed straight to the actor parked in receive() (a
        # memory stream gives an item to a waiting receiver without buffering it).
        self._admit = self._receive.statistics().current_buffer_used + int(self._parked)
        self._send.close()
        if self._compaction_scope is not None:
            self._compaction_scope.cancel()
        if self._watch_scope is not None:
            self._watch_scope.cancel()

    # The actor task ---------------------------------------------------------------------------

    async def _run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        task_status.started()
        batch: list[_Request] = []
        try:
            while True:
                batch = await self._take()
                if not batch:
                    break
                await self._process(batch)
                batch = []
        finally:
            # Whatever ends the loop (closing, cancellation, a bug), nobody may hang.
            for request in batch:
                if not request.done.is_set():
                    request.fail(_closed_error())
            self._refuse_the_rest()
            self._closing = True
            self._closed = True
            self._waker_scope.cancel()
            self._wake()

    async def _take(self) -> list[_Request]:
        """The next batch: every request waiting in the queue. Empty when the actor must stop."""
        receive = self._receive
        if not (self._closing and self._admit == 0):
            self._parked = True
            try:
                first = await receive.receive()
            except (anyio.EndOfStream, anyio.ClosedResourceError):
                return []
            finally:
                self._parked = False
            batch = [first]
            while True:
                try:
                    batch.append(receive.receive_nowait())
                except (anyio.WouldBlock, anyio.EndOfStream):
                    break
            if not self._closing:
                return batch
            # Closing: the first `_admit` requests were queued before the close; any later
            # ones came from callers that were still waiting for space.
            admitted, late = batch[: self._admit], batch[self._admit :]
            self._admit -= len(admitted)
            for request in late:
                request.fail(_closed_error())
            if admitted:
                return admitted
        return []

    def _refuse_the_rest(self) -> None:
        receive = self._receive
        while True:
            try:
                receive.receive_nowait().fail(_closed_error())
            except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
                break
        # Wakes callers still waiting for queue space: their send raises BrokenResourceError.
        receive.close()

    async def _process(self, batch: list[_Request]) -> None:
        segment: list[_Request] = []
        for request in batch:
            if request.kind in (_RELOAD, _CATCH_UP):
                # Barriers: what came before is committed first.
                await self._commit(segment)
                segment = []
                await self._reload(request)
            else:
                segment.append(request)
        await self._commit(segment)

    def _apply(self, requests: list[_Request]) -> _Applied:
        """Apply ``requests`` in order to the published log; fail the invalid ones at once."""
        base = log = self._log
        dropped: list[int] = []
        applied: list[tuple[_Request, Any]] = []
        rebuilt = False  # did the surface change other than by growing at the end?
        for request in requests:
            kind = request.kind
            try:
                if kind == _APPEND:
                    log, events, replaced = _apply_append(log, request.payload)
                    rebuilt = rebuilt or replaced
                    applied.append((request, events))
                elif kind == _SNAPSHOT:
                    dropped.extend(e.seq for e in log.shadowed() if e.seq < base.count)
                    log = log.snapshot()
                    applied.append((request, log))
                else:  # _COMPACTION
                    log, outcome = self._apply_compaction(log, request.payload)
                    rebuilt = rebuilt or any(outcome)
                    applied.append((request, outcome))
            except InvalidEventError as error:
                request.fail(error)
            except Exception as error:
                # A bug in applying one request must not take the session down with it.
                self._logger.exception("nous_session.request_failed", kind=kind)
                request.fail(error)
        return _Applied(base, log, dropped, applied, rebuilt)

    async def _commit(self, requests: list[_Request]) -> None:
        """Apply, commit in one store call, then publish and acknowledge.

        On a ConflictError the actor first catches up with the store. With
        ``on_conflict="rebase"`` it then applies the same requests again on top of what the
        other writer committed and retries (a few times); otherwise the callers get the
        ConflictError and their retries land on the caught-up log.
        """
        for attempt in range(_REBASE_ATTEMPTS + 1):
            if not requests:
                return
            if self._rebased_commit is not None and _plain_appends(requests):
                await self._commit_rebased(requests)
                return
            step = self._apply(requests)
            if step.log is not step.base:
                # A tuple, not a view: a failed batch's events leave the log's storage below,
                # and a store may keep what it was given.
                events = tuple(step.log.since(step.base.count))
                try:
                    # Shielded: once the store has the batch, its callers must hear about it.
                    with anyio.CancelScope(shield=True):
                        await self._store.commit(
                            self._session_id,
                            expected_count=step.base.count,
                            events=events,
                            dropped=step.dropped,
                        )
                except Exception as error:
                    # The batch never happened: its events leave the log's shared storage,
                    # so catching up (or the next batch) extends it instead of copying it.
                    step.base._give_back(step.log)
                    conflict = isinstance(error, ConflictError)
                    if conflict:
                        # Another writer is ahead: read what it wrote.
                        await self._reload(None)
                        if self._rebase and attempt < _REBASE_ATTEMPTS:
                            requests = [request for request, _ in step.applied]
                            if attempt:
                                # Writers that keep colliding take turns: a short random
                                # backoff, as in any optimistic-concurrency retry loop.
                                await anyio.sleep(random.uniform(0, min(0.01, 0.0005 * attempt)))
                            continue
                    self._logger.warning(
                        "nous_session.commit_failed",
                        error=repr(error),
                        requests=len(step.applied),
                        expected_count=step.base.count,
                    )
                    for request, _ in step.applied:
                        request.fail(_store_error(error))
                    return
                self._log = step.log
                self._batches += 1
                if step.dropped:
                    self._snapshots += 1
                self._notify()
                if self._log_commits:
                    self._logger.debug(
                        "nous_session.commit",
                        events=len(events),
                        dropped=len(step.dropped),
                        count=step.log.count,
                    )
            self._requests += len(step.applied)
            for request, result in step.applied:
                request.resolve(result)
            self._maybe_compact(step.rebuilt)
            return

    async def _commit_rebased(self, requests: list[_Request]) -> None:
        """Commit a batch of plain appends after whatever the store holds, then publish.

        The events are made for the seqs after the published log but not appended to it: if
        other writers got there first they move, and the log then takes the others' events
        and ours in one extend (appending ours first would leave the log's shared storage
        holding events that never happened, and the extend would have to copy it).
        """
        assert self._rebased_commit is not None
        if self._unfollowable is not None:
            for request in requests:
                request.fail(_store_error(self._unfollowable))
            return
        base = self._log
        seq = base.count
        events: list[Event] = []
        applied: list[tuple[_Request, int]] = []
        for request in requests:
            try:
                made = [
                    make_event(seq + offset, event_type, data, time, decoded=True)
                    for offset, (event_type, data, time) in enumerate(request.payload)
                ]
            except InvalidEventError as error:
                request.fail(error)
                continue
            events.extend(made)
            applied.append((request, len(made)))
            seq += len(made)
        if not events:
            return
        try:
            with anyio.CancelScope(shield=True):
                rebased = await self._rebased_commit(
                    self._session_id, expected_count=base.count, events=events
                )
        except Exception as error:
            self._logger.warning(
                "nous_session.commit_failed",
                error=repr(error),
                requests=len(applied),
                expected_count=base.count,
            )
            for request, _ in applied:
                request.fail(_store_error(error))
            if isinstance(error, ConflictError):
                await self._reload(None)
            elif isinstance(error, CorruptRecordError):
                # What the others wrote cannot be read (and our batch may have landed after
                # it): another rebasing commit would meet the same record, so stop writing.
                self._unfollowable = error
            return
        # Other writers' events (if any) go before ours; every caller hears the seqs its
        # events were stored at.
        self._log = log = base.extend([*rebased.others, *rebased.events])
        self._batches += 1
        self._notify()
        if self._log_commits:
            self._logger.debug(
                "nous_session.commit", events=len(events), shift=rebased.shift, count=log.count
            )
        self._requests += len(applied)
        stored = iter(rebased.events)
        for request, size in applied:
            request.resolve(tuple(next(stored) for _ in range(size)))
        self._maybe_compact(
            any(event.data.get("surface_op") is not None for event in rebased.others)
        )

    def _notify(self) -> None:
        """Tell subscribers a new Log is published.

        Waking is the event loop's work, once per waiting subscriber. With few subscribers
        they are woken at once; with many, the waker task wakes them once per short window
        (about 2 µs per subscriber: 2 ms for 1,000), instead of waking every subscriber at
        every commit; each wake-up reads everything published by then. With 1,000 subscribers
        this keeps the session's append rate at what it is with none, for a few milliseconds
        of delivery latency.
        """
        if self._subscribers < _COALESCE_FROM or self._closed:
            self._wake()
        else:
            self._wake_requested.set()

    def _wake(self) -> None:
        # One Event per wake-up, shared by every subscriber: O(1) for the actor.
        changed, self._changed = self._changed, anyio.Event()
        changed.set()

    async def _waker(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        with self._waker_scope:
            task_status.started()
            while True:
                await self._wake_requested.wait()
                # Let the commits of the next window gather behind this one wake-up.
                await anyio.sleep(self._subscribers * _WAKE_COST)
                self._wake_requested = anyio.Event()
                self._wake()

    async def _reload(self, request: _Request | None) -> None:
        """Catch up with events other writers committed after our count."""
        if request is None or request.kind == _CATCH_UP:
            self._catch_up_queued = False
        log = self._log
        if (
            request is not None
            and request.kind == _CATCH_UP
            and request.payload is not None
            and request.payload <= log.count
        ):
            request.resolve(log)  # a catch-up after a conflict already read this far
            return
        try:
            events = await self._store.load(self._session_id, since=log.count)
            log = log.extend(events)  # decoded, hence validated, by the store
            replaced = any(event.data.get("surface_op") is not None for event in events)
        except Exception as error:
            self._logger.warning("nous_session.catch_up_failed", error=repr(error))
            if request is not None:
                request.fail(_store_error(error))
            return
        if log is not self._log:
            self._log = log
            self._notify()
            if self._log_commits:
                self._logger.debug("nous_session.caught_up", count=log.count, events=len(events))
            self._maybe_compact(rebuilt=replaced)
        if request is not None:
            request.resolve(log)

    async def _watch(
        self,
        watch: Any,
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Turn the store's change feed into catch-up requests (at most one queued at a time)."""
        with anyio.CancelScope() as scope:
            self._watch_scope = scope
            task_status.started()
            heads = watch(self._session_id)
            try:
                async for head in heads:
                    if (head == -1 or head > self._log.count) and not self._catch_up_queued:
                        self._catch_up_queued = True
                        # -1 (reconnected) must always read; a head may be read already.
                        request = _Request(_CATCH_UP, None if head == -1 else head)
                        try:
                            self._send.send_nowait(request)
                        except anyio.WouldBlock:
                            await self._send.send(request)
            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                pass  # the session is closing
            finally:
                with anyio.CancelScope(shield=True):
                    await heads.aclose()

    # Compaction -------------------------------------------------------------------------------

    def _apply_compaction(
        self, log: Log, replacements: Sequence[Replacement]
    ) -> tuple[Log, list[bool]]:
        outcome = []
        for replacement in replacements:
            if not still_applies(log, replacement):
                self._logger.info(
                    "nous_session.compaction_stale",
                    source=replacement.source,
                    start=replacement.start,
                    stop=replacement.stop,
                )
                outcome.append(False)
                continue
            event_type, _ = message_event(replacement.message)
            log = log.append(event_type, replacement.data(), time=replacement.message.created_at)
            outcome.append(True)
        return log, outcome

    def _maybe_compact(self, rebuilt: bool) -> None:
        policy, meter = self._policy, self._meter
        if policy is None or meter is None:
            return
        surface = self._log.surface()  # the memoised fold; nothing is projected here
        # The meter must see every commit, or an unseen replace would corrupt its running sum.
        tokens = meter.update(surface, rebuilt=rebuilt) if policy.counts_tokens else 0
        if self._in_flight or self._closing or len(surface) < self._retry_at:
            return
        if policy.triggered(len(surface), tokens):
            self._in_flight = True
            self._compaction_done = anyio.Event()
            # The scope exists from now on, so a close before the task first runs cancels it.
            self._compaction_scope = anyio.CancelScope()
            self._task_group.start_soon(
                self._compact, self._compaction_scope, self._log, len(surface), tokens
            )

    async def _compact(self, scope: anyio.CancelScope, log: Log, size: int, tokens: int) -> None:
        policy, meter = self._policy, self._meter
        assert policy is not None
        assert meter is not None
        logger = self._logger.bind(count=log.count, surface=size, tokens=tokens)
        logger.info("nous_session.compaction_started")
        outcome = "failed"
        try:
            with scope:
                outcome = await self._compaction(policy, log)
            if scope.cancelled_caught:
                outcome = "cancelled"
        except SessionClosedError:
            outcome = "cancelled"
        except Exception as error:
            logger.warning("nous_session.compaction_failed", error=repr(error))
        finally:
            self._compaction_scope = None
            self._in_flight = False
            self._compaction_done.set()
        if outcome in ("applied", "pruned, summary stale"):
            self._compactions_run += 1
            logger.info("nous_session.compaction_finished", new_count=self._log.count)
        if outcome in ("stale", "pruned, summary stale"):
            self._compactions_stale += 1
        elif outcome == "failed":
            self._compactions_failed += 1
        size_now = len(self._log.surface())
        if outcome in ("failed", "nothing"):
            # Do not retry on every commit: wait until the surface has grown.
            self._retry_at = size + 1
        elif (
            outcome != "stale"
            and outcome != "cancelled"
            and policy.triggered(size_now, meter.total)
        ):
            # Still over the trigger: what remains is the kept tail, which another compaction
            # cannot shrink. Wait until enough has scrolled out of the tail to be worth it.
            self._retry_at = size_now + max(1, policy.keep_last // 2)
            logger.info("nous_session.compaction_insufficient", retry_at=self._retry_at)
        if outcome != "cancelled":
            self._maybe_compact(rebuilt=False)

    async def _compaction(self, policy: CompactionPolicy, log: Log) -> str:
        """Prune, then summarise; every long loop yields to the event loop as it goes."""
        pruned = False
        if policy.prune_tool_results is not None:
            replacements = await plan_pruning(log, policy.prune_tool_results)
            if replacements:
                outcome: list[bool] = await self._call(_COMPACTION, replacements)
                pruned = any(outcome)
                log = self._log
                assert self._meter is not None  # the commit above brought it up to date
                if pruned and not policy.triggered(len(log.surface()), self._meter.total):
                    return "applied"  # pruning was enough
        events = await plan_summary(log, policy.keep_last)
        if events is None:
            return "applied" if pruned else "nothing"
        old = await _cooperatively(to_message, events)
        if policy.summarizer is None:
            text = await _structural_summary(old)
            summary = Message.system(text, created_at=old[0].created_at)
        else:
            timeout = policy.summarizer_timeout
            with anyio.fail_after(timeout) if timeout is not None else nullcontext():
                text = await policy.summarizer(old)
            if not isinstance(text, str) or not text.strip():
                raise ValueError(f"the summarizer returned an empty summary: {text!r}")
            summary = Message.system(text, created_at=old[0].created_at)
        (applied,) = await self._call(_COMPACTION, [summary_replacement(log, events, summary)])
        if applied:
            return "applied"
        return "pruned, summary stale" if pruned else "stale"

    # Calls ------------------------------------------------------------------------------------

    async def _call(self, kind: int, payload: Any) -> Any:
        if self._closing:
            raise _closed_error()
        request = _Request(kind, payload)
        try:
            self._send.send_nowait(request)
        except anyio.WouldBlock:
            try:
                await self._send.send(request)
            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                raise _closed_error() from None
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            raise _closed_error() from None
        await request.done.wait()
        if request.error is not None:
            raise request.error
        return request.result

    async def append(
        self,
        type: EventType | str,
        data: Mapping[str, Any] | None = None,
        *,
        time: datetime | None = None,
    ) -> Event:
        """Append one event and return it once it is committed.

        Raises:
            InvalidEventError: the event is invalid (nothing was appended).
            StoreError: the store failed to commit the batch (nothing was appended).
            SessionClosedError: the session is closed.
        """
        # Validated and copied here, in the caller: its errors surface on the caller's stack,
        # and changing `data` after the call (even a cancelled one) changes nothing.
        events = await self._call(_APPEND, (prepare(type, data, time),))
        return events[0]  # type: ignore[no-any-return]

    async def append_many(self, items: Iterable[Sequence[Any]]) -> tuple[Event, ...]:
        """Append several events atomically (all or none) and return them once committed.

        Each item is ``(type, data)`` or ``(type, data, time)``.

        Raises:
            InvalidEventError: an item is malformed or an event is invalid (nothing appended).
            StoreError: the store failed to commit (nothing appended).
            SessionClosedError: the session is closed.
        """
        normalised = []
        for index, item in enumerate(items):
            if not isinstance(item, tuple | list) or len(item) not in (2, 3):
                raise InvalidEventError(
                    f"append_many item {index} must be (type, data) or (type, data, time), "
                    f"got {item!r}"
                )
            try:
                normalised.append(prepare(item[0], item[1], item[2] if len(item) == 3 else None))
            except InvalidEventError as error:
                raise InvalidEventError(f"append_many item {index}: {error}") from None
        if not normalised:
            return ()
        return await self._call(_APPEND, tuple(normalised))  # type: ignore[no-any-return]

    async def add_message(self, message: Message) -> Event:
        """Append the surface event that stands for ``message`` (as ``Log.seed`` maps it).

        The event's time is the message's ``created_at``.

        Raises:
            InvalidEventError: ``message`` is not a Message.
            StoreError, SessionClosedError: as :meth:`append`.
        """
        event_type, data = message_event(message)
        # The message's JSON is a fresh copy that only holds valid fields: nothing to re-check.
        events = await self._call(_APPEND, ((event_type, data, message.created_at),))
        return events[0]  # type: ignore[no-any-return]

    async def replace(self, start: int, stop: int, message: Message) -> Event:
        """Put ``message`` on the surface in place of the positions ``start..stop``.

        Name positions with the surface events' :attr:`~Event.position`. The event's time is
        ``message.created_at``; every replaced event stays in the log.

        Raises:
            InvalidEventError: a malformed range, a range not below the new event's seq, or
                ``message`` is not a Message.
            StoreError, SessionClosedError: as :meth:`append`.
        """
        event_type, data = message_event(message)
        data["surface_op"] = ["replace", start, stop]  # checked when applied (see make_event)
        events = await self._call(_APPEND, ((event_type, data, message.created_at),))
        return events[0]  # type: ignore[no-any-return]

    async def snapshot(self) -> Log:
        """Drop every shadowed event, in memory and in the store, in one commit.

        Returns:
            The log right after the snapshot.

        Raises:
            StoreError, SessionClosedError: as :meth:`append`.
        """
        return await self._call(_SNAPSHOT, None)  # type: ignore[no-any-return]

    async def reload(self) -> Log:
        """Catch up with what other writers committed to this session's store since our count.

        The actor does this by itself after a :class:`ConflictError` (and continuously when it
        follows the store); call it to be sure before acting on the log. Requests queued before
        it are committed first; later ones apply to the caught-up log.

        Raises:
            StoreError, SessionClosedError: as :meth:`append`.
        """
        return await self._call(_RELOAD, None)  # type: ignore[no-any-return]

    async def wait_for_compaction(self) -> None:
        """Wait until no compaction is running (return at once when none is).

        A compaction that starts while the previous one finishes is waited for too, so on
        return the background work that the commits so far triggered has landed.
        """
        while self._in_flight:
            await self._compaction_done.wait()

    def subscribe(self, since: int = 0) -> Subscription:
        """Follow the committed events with seq >= ``since``.

        ``async with session.subscribe(since) as events: async for event in events: ...``

        Raises:
            ValueError: ``since`` is negative.
            TypeError: ``since`` is not an int.
        """
        if not isinstance(since, int) or isinstance(since, bool):
            raise TypeError(f"since must be an int, not {type(since).__name__}")
        if since < 0:
            raise ValueError(f"since must be >= 0, got {since}")
        return Subscription(self, since)

    # Reading ----------------------------------------------------------------------------------

    @property
    def session_id(self) -> str:
        """The session's id."""
        return self._session_id

    @property
    def log(self) -> Log:
        """The latest committed Log value (an immutable snapshot)."""
        return self._log

    @property
    def closed(self) -> bool:
        """True once the actor has stopped (nothing more will be committed)."""
        return self._closed

    def messages(self) -> Sequence[Message]:
        """The messages the model sees now (the committed log's surface)."""
        return self._log.derive_messages()

    def statistics(self) -> SessionStatistics:
        """Counters and gauges; see :class:`SessionStatistics`."""
        return SessionStatistics(
            queue_depth=self._receive.statistics().current_buffer_used,
            count=self._log.count,
            subscribers=self._subscribers,
            batches=self._batches,
            requests=self._requests,
            compactions_run=self._compactions_run,
            compactions_stale=self._compactions_stale,
            compactions_failed=self._compactions_failed,
            compaction_in_flight=self._in_flight,
        )

    def __repr__(self) -> str:
        state = "closed" if self._closed else "closing" if self._closing else "open"
        return f"<SessionActor {self._session_id!r} {state} count={self._log.count}>"


def _plain_appends(requests: list[_Request]) -> bool:
    """Whether a batch holds only appends without a surface op: events that mean the same at
    any seq, which a rebasing commit may move."""
    return bool(requests) and all(
        request.kind == _APPEND and all("surface_op" not in item[1] for item in request.payload)
        for request in requests
    )


def _apply_append(log: Log, items: Sequence[Prepared]) -> tuple[Log, tuple[Event, ...], bool]:
    """Append every prepared item or none; report whether any of them replaced a range."""
    if len(items) == 1:
        log = log.append_prepared(items[0])
        event = log.last
        assert event is not None
        return log, (event,), event.data.get("surface_op") is not None
    events = []
    replaced = False
    candidate = log
    for index, item in enumerate(items):
        try:
            candidate = candidate.append_prepared(item)
        except InvalidEventError as error:
            log._give_back(candidate)  # the items before it never happened either
            raise InvalidEventError(f"append_many item {index}: {error}") from None
        event = candidate.last
        assert event is not None
        replaced = replaced or event.data.get("surface_op") is not None
        events.append(event)
    return candidate, tuple(events), replaced


@asynccontextmanager
async def _unwrapped() -> AsyncIterator[None]:
    """Let a single exception out of the actor's task group as itself, not in a group.

    The block's own exception (or the actor's) is what the caller should catch; a group of one
    would make every ``except ValueError`` around ``async with SessionActor.open(...)`` miss.
    """
    try:
        yield
    except BaseExceptionGroup as group:
        if len(group.exceptions) != 1:
            raise
        error = group.exceptions[0]
        raise error from error.__cause__


async def _structural_summary(old: Sequence[Message]) -> str:
    """:func:`~nous_session.transcript.summarize`'s text, built a chunk at a time so that a
    long summary never holds the event loop (each chunk is joined as it is made)."""
    pieces = [f"[Compacted {len(old)} earlier messages]"]
    for start in range(0, len(old), _CHUNK):
        pieces.append("\n".join([summary_line(m) for m in old[start : start + _CHUNK]]))
        await anyio.lowlevel.checkpoint()
    return "\n".join(pieces)


async def _cooperatively(function: Callable[[T], U], items: Sequence[T]) -> list[U]:
    """``[function(item) for item in items]``, yielding to the event loop every few hundred
    items, so a compaction of a long session never holds the loop for more than a moment."""
    out: list[U] = []
    for start in range(0, len(items), _CHUNK):
        out.extend([function(item) for item in items[start : start + _CHUNK]])
        await anyio.lowlevel.checkpoint()
    return out


async def _load(store: Store, session_id: str, *, fold: bool) -> Log:
    """Rebuild a session's Log from its stored events, seqs and gaps verbatim."""
    # No count to restore separately: the newest event is never shadowed, so a snapshot
    # never drops it, and the held events always end at count - 1.
    events = await store.load(session_id)
    try:
        log = Log.restore(events)
    except InvalidEventError as error:
        raise StoreError(f"session {session_id!r}: the store returned {error}") from error
    if fold and len(log.events()) > _WARM_ABOVE:
        # Compaction checks the surface at every commit: fold it in a worker thread now, not
        # on the event loop at the first commit.
        await anyio.to_thread.run_sync(log.surface)
    return log
