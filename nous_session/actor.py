"""SessionActor: one writer per session, committed-event streams, background compaction.

One actor task owns a session's :class:`~nous_session.log.Log`. Callers put requests into a
bounded queue; the actor takes every request waiting as one batch, applies them in arrival
order (each validated against the log the requests before it left), commits the batch to the
store in one call (group commit), and only then publishes the new Log value, wakes subscribers
and acknowledges each request with its result or error. Readers therefore never see an event
that is not committed.

The parts: the requests, one class each with a pure ``apply`` (:mod:`nous_session._requests`);
the state the actor publishes and its subscriptions read (:mod:`nous_session.subscription`);
the compaction runner beside its policy (:mod:`nous_session.compaction`), which talks to the
actor through one ``post()``. The actor's loop is: take a batch, apply it, commit it, publish.

Backpressure: the queue holds ``queue_size`` requests. A caller whose request does not fit
waits for space (a cancelled wait sends nothing). Subscribers never hold up the actor: each
reads the published, immutable Log by cursor and waits on one shared notification, so the actor
does the same work per commit whatever the number of subscribers.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any, Final, Literal

import anyio
import anyio.abc
import anyio.to_thread
import attrs
import structlog

from nous_session._requests import Append, Applied, Reload, Request, Snapshot
from nous_session.compaction import CompactionPolicy, CompactionRunner
from nous_session.errors import (
    ConflictError,
    CorruptRecordError,
    InvalidEventError,
    SessionClosedError,
    StoreError,
)
from nous_session.event import Event, EventType, make_event, message_event, prepare
from nous_session.log import Log
from nous_session.message import Message
from nous_session.stores import open_store
from nous_session.stores.base import (
    ChangeFeedStore,
    RebasingStore,
    Store,
    check_session_id,
    supports,
)
from nous_session.stores.memory import MemoryStore
from nous_session.subscription import Published, Subscription

__all__ = ["SessionActor", "SessionStatistics", "Subscription"]

_logger = structlog.get_logger("nous_session")

# With on_conflict="rebase", how many times a batch is re-applied after a conflict.
_REBASE_ATTEMPTS: Final = 32
# A restored log longer than this is folded in a worker thread before the actor starts.
_WARM_ABOVE: Final = 2048


@attrs.frozen
class _Batch:
    """A batch applied to the published log, not yet committed."""

    base: Log
    log: Log
    dropped: list[int]
    applied: list[tuple[Request, Any]]
    rebuilt: bool


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
        "_closing",
        "_compaction",
        "_log_commits",
        "_logger",
        "_parked",
        "_published",
        "_rebase",
        "_rebasing",
        "_receive",
        "_requests",
        "_send",
        "_session_id",
        "_store",
        "_unfollowable",
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
        self._rebasing = rebase and supports(store, RebasingStore)
        self._store = store
        self._published = Published(log)
        self._send, self._receive = anyio.create_memory_object_stream[Request](queue_size)
        self._waker_scope = anyio.CancelScope()
        self._closing = False  # no new requests; set when leaving the `async with` block
        self._admit = 0  # while closing: queued requests still to apply
        self._parked = False  # the actor is waiting in receive()
        self._batches = 0
        self._requests = 0
        self._catch_up_queued = False
        self._watch_scope: anyio.CancelScope | None = None
        # Set when a rebasing commit met a record it cannot decode: this actor can no longer
        # follow the store past it, so it refuses further writes instead of repeating them.
        self._unfollowable: CorruptRecordError | None = None
        # Bind once: a bound logger filters debug lines at almost no cost per commit.
        self._logger = _logger.bind(session_id=session_id)
        # structlog's unconfigured default prints every level to stdout; a line per commit
        # there would drown the application's output, so commits are only logged once the
        # application has configured structlog (and so chosen its own level filter).
        self._log_commits = structlog.is_configured()
        self._compaction = (
            None
            if compaction is None
            else CompactionRunner(
                compaction,
                post=self._call,
                current=lambda: self._published.log,
                task_group=task_group,
                logger=self._logger,
            )
        )

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
        watch = follow is not False and supports(store, ChangeFeedStore)
        if follow and not watch:
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
                await task_group.start(actor._run_waker)
                if watch:
                    await task_group.start(actor._watch)
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
        if self._compaction is not None:
            self._compaction.close()
        if self._watch_scope is not None:
            self._watch_scope.cancel()

    # The actor task ---------------------------------------------------------------------------

    async def _run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        task_status.started()
        batch: list[Request] = []
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
            self._waker_scope.cancel()
            self._published.close()

    async def _run_waker(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        with self._waker_scope:
            await self._published.run_waker(task_status=task_status)

    async def _take(self) -> list[Request]:
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

    async def _process(self, batch: list[Request]) -> None:
        segment: list[Request] = []
        for request in batch:
            if request.barrier:
                # Barriers: what came before is committed first.
                await self._commit(segment)
                segment = []
                assert isinstance(request, Reload)
                await self._reload(request)
            else:
                segment.append(request)
        await self._commit(segment)

    def _apply(self, requests: list[Request]) -> _Batch:
        """Apply ``requests`` in order to the published log; fail the invalid ones at once."""
        base = log = self._published.log
        dropped: list[int] = []
        applied: list[tuple[Request, Any]] = []
        rebuilt = False  # did the surface change other than by growing at the end?
        for request in requests:
            try:
                step: Applied = request.apply(log, base.count)
            except InvalidEventError as error:
                request.fail(error)
                continue
            except Exception as error:
                # A bug in applying one request must not take the session down with it.
                self._logger.exception("nous_session.request_failed", kind=type(request).__name__)
                request.fail(error)
                continue
            log = step.log
            dropped.extend(step.dropped)
            rebuilt = rebuilt or step.rebuilt
            applied.append((request, step.result))
        return _Batch(base, log, dropped, applied, rebuilt)

    async def _commit(self, requests: list[Request]) -> None:
        """Apply, commit in one store call, then publish and acknowledge.

        On a ConflictError the actor first catches up with the store. With
        ``on_conflict="rebase"`` it then applies the same requests again on top of what the
        other writer committed and retries (a few times); otherwise the callers get the
        ConflictError and their retries land on the caught-up log.
        """
        for attempt in range(_REBASE_ATTEMPTS + 1):
            if not requests:
                return
            if self._rebasing and all(
                isinstance(request, Append) and request.plain for request in requests
            ):
                await self._commit_rebased(requests)  # type: ignore[arg-type]
                return
            batch = self._apply(requests)
            if batch.log is not batch.base:
                # A tuple, not a view: a failed batch's events leave the log's storage below,
                # and a store may keep what it was given.
                events = tuple(batch.log.since(batch.base.count))
                try:
                    # Shielded: once the store has the batch, its callers must hear about it.
                    with anyio.CancelScope(shield=True):
                        await self._store.commit(
                            self._session_id,
                            expected_count=batch.base.count,
                            events=events,
                            dropped=batch.dropped,
                        )
                except Exception as error:
                    # The batch never happened: its events leave the log's shared storage,
                    # so catching up (or the next batch) extends it instead of copying it.
                    batch.base._give_back(batch.log)
                    if isinstance(error, ConflictError):
                        # Another writer is ahead: read what it wrote.
                        await self._reload(None)
                        if self._rebase and attempt < _REBASE_ATTEMPTS:
                            requests = [request for request, _ in batch.applied]
                            if attempt:
                                # Writers that keep colliding take turns: a short random
                                # backoff, as in any optimistic-concurrency retry loop.
                                await anyio.sleep(random.uniform(0, min(0.01, 0.0005 * attempt)))
                            continue
                    self._fail(batch.applied, error, expected_count=batch.base.count)
                    return
                self._publish(
                    batch.log, events=len(events), dropped=len(batch.dropped), rebuilt=False
                )
            self._acknowledge(batch.applied, batch.log, rebuilt=batch.rebuilt)
            return

    async def _commit_rebased(self, requests: list[Append]) -> None:
        """Commit a batch of plain appends after whatever the store holds, then publish.

        The events are made for the seqs after the published log but not appended to it: if
        other writers got there first they move, and the log then takes the others' events
        and ours in one extend (appending ours first would leave the log's shared storage
        holding events that never happened, and the extend would have to copy it).
        """
        if self._unfollowable is not None:
            for request in requests:
                request.fail(_store_error(self._unfollowable))
            return
        base = self._published.log
        seq = base.count
        events: list[Event] = []
        applied: list[tuple[Request, int]] = []
        for request in requests:
            try:
                made = [
                    make_event(seq + offset, event_type, data, time, decoded=True)
                    for offset, (event_type, data, time) in enumerate(request.items)
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
                rebased = await self._store.commit_rebased(  # type: ignore[attr-defined]
                    self._session_id, expected_count=base.count, events=events
                )
        except Exception as error:
            self._fail(applied, error, expected_count=base.count)
            if isinstance(error, ConflictError):
                await self._reload(None)
            elif isinstance(error, CorruptRecordError):
                # What the others wrote cannot be read (and our batch may have landed after
                # it): another rebasing commit would meet the same record, so stop writing.
                self._unfollowable = error
            return
        # Other writers' events (if any) go before ours; every caller hears the seqs its
        # events were stored at.
        log = base.extend([*rebased.others, *rebased.events])
        self._publish(log, events=len(events), dropped=0, rebuilt=False, shift=rebased.shift)
        stored = iter(rebased.events)
        results = [(request, tuple(next(stored) for _ in range(size))) for request, size in applied]
        self._acknowledge(
            results, log, rebuilt=any(event.op is not None for event in rebased.others)
        )

    # Commit, publish, fail: each written once -------------------------------------------------

    def _publish(self, log: Log, *, events: int, dropped: int, rebuilt: bool, **extra: Any) -> None:
        """A batch is durable: make ``log`` the committed value and tell the subscribers."""
        self._published.publish(log, dropped=dropped > 0)
        self._batches += 1
        if self._log_commits:
            self._logger.debug(
                "nous_session.commit", events=events, dropped=dropped, count=log.count, **extra
            )

    def _acknowledge(
        self, applied: Sequence[tuple[Request, Any]], log: Log, *, rebuilt: bool
    ) -> None:
        """Answer each applied request with its result, then let compaction look."""
        self._requests += len(applied)
        for request, result in applied:
            request.resolve(result)
        if self._compaction is not None:
            self._compaction.committed(log, rebuilt=rebuilt)

    def _fail(
        self, applied: Sequence[tuple[Request, Any]], error: BaseException, *, expected_count: int
    ) -> None:
        """The store refused a batch: each of its callers gets its own StoreError."""
        self._logger.warning(
            "nous_session.commit_failed",
            error=repr(error),
            requests=len(applied),
            expected_count=expected_count,
        )
        for request, _ in applied:
            request.fail(_store_error(error))

    async def _reload(self, request: Reload | None) -> None:
        """Catch up with events other writers committed after our count."""
        if request is None or request.from_feed:
            self._catch_up_queued = False
        log = self._published.log
        if (
            request is not None
            and request.from_feed
            and request.head is not None
            and request.head <= log.count
        ):
            request.resolve(log)  # a catch-up after a conflict already read this far
            return
        try:
            events = await self._store.load(self._session_id, since=log.count)
            log = log.extend(events)  # decoded, hence validated, by the store
            replaced = any(event.op is not None for event in events)
        except Exception as error:
            self._logger.warning("nous_session.catch_up_failed", error=repr(error))
            if request is not None:
                request.fail(_store_error(error))
            return
        if log is not self._published.log:
            self._published.publish(log)
            if self._log_commits:
                self._logger.debug("nous_session.caught_up", count=log.count, events=len(events))
            if self._compaction is not None:
                self._compaction.committed(log, rebuilt=replaced)
        if request is not None:
            request.resolve(log)

    async def _watch(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Turn the store's change feed into catch-up requests (at most one queued at a time)."""
        with anyio.CancelScope() as scope:
            self._watch_scope = scope
            task_status.started()
            heads = self._store.watch(self._session_id)  # type: ignore[attr-defined]
            try:
                async for head in heads:
                    if (
                        head == -1 or head > self._published.log.count
                    ) and not self._catch_up_queued:
                        self._catch_up_queued = True
                        # -1 (reconnected) must always read; a head may be read already.
                        request = Reload(None if head == -1 else head, from_feed=True)
                        try:
                            self._send.send_nowait(request)
                        except anyio.WouldBlock:
                            await self._send.send(request)
            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                pass  # the session is closing
            finally:
                with anyio.CancelScope(shield=True):
                    await heads.aclose()

    # Calls ------------------------------------------------------------------------------------

    async def _call(self, request: Request) -> Any:
        """Queue ``request`` and return its result (the compaction runner's ``post``)."""
        if self._closing:
            raise _closed_error()
        try:
            self._send.send_nowait(request)
        except anyio.WouldBlock:
            try:
                await self._send.send(request)
            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                raise _closed_error() from None
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            raise _closed_error() from None
        return await request.outcome()

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
        events = await self._call(Append((prepare(type, data, time),)))
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
        return await self._call(Append(tuple(normalised)))  # type: ignore[no-any-return]

    async def add_message(self, message: Message) -> Event:
        """Append the surface event that stands for ``message`` (as ``Log.seed`` maps it).

        The event's time is the message's ``created_at``.

        Raises:
            InvalidEventError: ``message`` is not a Message.
            StoreError, SessionClosedError: as :meth:`append`.
        """
        event_type, data = message_event(message)
        # The message's JSON is a fresh copy that only holds valid fields: nothing to re-check.
        events = await self._call(Append(((event_type, data, message.created_at),)))
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
        events = await self._call(Append(((event_type, data, message.created_at),)))
        return events[0]  # type: ignore[no-any-return]

    async def snapshot(self) -> Log:
        """Drop every shadowed event, in memory and in the store, in one commit.

        Returns:
            The log right after the snapshot.

        Raises:
            StoreError, SessionClosedError: as :meth:`append`.
        """
        return await self._call(Snapshot())  # type: ignore[no-any-return]

    async def reload(self) -> Log:
        """Catch up with what other writers committed to this session's store since our count.

        The actor does this by itself after a :class:`ConflictError` (and continuously when it
        follows the store); call it to be sure before acting on the log. Requests queued before
        it are committed first; later ones apply to the caught-up log.

        Raises:
            StoreError, SessionClosedError: as :meth:`append`.
        """
        return await self._call(Reload())  # type: ignore[no-any-return]

    async def wait_for_compaction(self) -> None:
        """Wait until no compaction is running (return at once when none is).

        A compaction that starts while the previous one finishes is waited for too, so on
        return the background work that the commits so far triggered has landed.
        """
        if self._compaction is not None:
            await self._compaction.wait()

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
        return Subscription(self._published, since)

    # Reading ----------------------------------------------------------------------------------

    @property
    def session_id(self) -> str:
        """The session's id."""
        return self._session_id

    @property
    def log(self) -> Log:
        """The latest committed Log value (an immutable snapshot)."""
        return self._published.log

    @property
    def closed(self) -> bool:
        """True once the actor has stopped (nothing more will be committed)."""
        return self._published.closed

    def messages(self) -> Sequence[Message]:
        """The messages the model sees now (the committed log's surface)."""
        return self._published.log.derive_messages()

    def statistics(self) -> SessionStatistics:
        """Counters and gauges; see :class:`SessionStatistics`."""
        compaction = self._compaction
        return SessionStatistics(
            queue_depth=self._receive.statistics().current_buffer_used,
            count=self._published.log.count,
            subscribers=self._published.subscribers,
            batches=self._batches,
            requests=self._requests,
            compactions_run=compaction.run if compaction else 0,
            compactions_stale=compaction.stale if compaction else 0,
            compactions_failed=compaction.failed if compaction else 0,
            compaction_in_flight=compaction.in_flight if compaction else False,
        )

    def __repr__(self) -> str:
        state = "closed" if self.closed else "closing" if self._closing else "open"
        return f"<SessionActor {self._session_id!r} {state} count={self.log.count}>"


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
