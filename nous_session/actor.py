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

import enum
import random
import secrets
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager, suppress
from datetime import datetime
from typing import Any, Final, Literal, NamedTuple

import anyio
import anyio.abc
import anyio.to_thread
import attrs

from nous_session._logging import get_logger, wants_debug
from nous_session._requests import (
    Append,
    Applied,
    Edit,
    Recover,
    Reload,
    Request,
    Snapshot,
)
from nous_session.compaction import CompactionPolicy, CompactionRunner
from nous_session.errors import (
    ConflictError,
    CorruptRecordError,
    InvalidEventError,
    OutcomeUnknownError,
    SessionClosedError,
    StoreError,
)
from nous_session.event import (
    Event,
    EventType,
    make_event,
    message_event,
    prepare,
    replace_data,
)
from nous_session.log import Log
from nous_session.message import Message
from nous_session.ops import Remove, Replace, Rewind, Uncompact
from nous_session.stores import open_store
from nous_session.stores.base import (
    ChangeFeedStore,
    ForkingStore,
    OutcomeStore,
    Rebased,
    RebasingStore,
    Store,
    Stored,
    check_key,
    check_session_id,
    supports,
)
from nous_session.stores.memory import MemoryStore
from nous_session.subscription import Published, Subscription

__all__ = ["SessionActor", "SessionStatistics", "Subscription"]

_logger = get_logger()

# With on_conflict="rebase", how many times a batch is re-applied after a conflict.
_REBASE_ATTEMPTS: Final = 32
# A restored log longer than this is folded in a worker thread before the actor starts.
_WARM_ABOVE: Final = 2048
# How long the actor keeps asking a store that lost contact whether a commit landed.
_RESOLVE_FOR: Final = 30.0
# A feed catch-up that could not read is tried again after this many seconds, doubling up
# to the maximum while reads keep failing.
_CATCH_UP_RETRY_FIRST: Final = 0.05
_CATCH_UP_RETRY_MAX: Final = 5.0


class _Batch(NamedTuple):
    """A batch applied to the published log, not yet committed (a tuple: one per commit).

    ``known`` are the requests answered from an idempotency key committed before: their
    answer stands whatever happens to the batch.
    """

    base: Log
    log: Log
    dropped: list[int]
    applied: list[tuple[Request, Any]]
    rebuilt: bool
    keys: list[tuple[str, int, int]]
    known: list[tuple[Request, Any]]


class _Outcome(enum.Enum):
    """How a commit with an unknown outcome turned out (see ``SessionActor._settle``)."""

    LANDED_BEFORE = "the first attempt landed"
    NOT_LANDED = "neither attempt landed"
    UNKNOWN = "still unknown"


_LANDED_BEFORE: Final = _Outcome.LANDED_BEFORE
_NOT_LANDED: Final = _Outcome.NOT_LANDED
_UNKNOWN: Final = _Outcome.UNKNOWN


class _CommitIds:
    """Commit ids for one actor: 96 random bits drawn once, then a counter (unique in a
    session by any measure, and no system call per commit)."""

    __slots__ = ("_next", "_prefix")

    def __init__(self) -> None:
        self._prefix = secrets.token_urlsafe(12)
        self._next = 0

    def __call__(self) -> str:
        self._next += 1
        return f"{self._prefix}.{self._next}"


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
        "_catch_up_delay",
        "_catch_up_queued",
        "_catch_up_retry",
        "_closing",
        "_commit_ids",
        "_compaction",
        "_full_store",
        "_kept",
        "_keys",
        "_landed_at",
        "_log_commits",
        "_logger",
        "_name_commits",
        "_parked",
        "_published",
        "_queued_catch_up",
        "_rebase",
        "_rebasing",
        "_receive",
        "_requests",
        "_send",
        "_session_id",
        "_space",
        "_space_waiters",
        "_store",
        "_task_group",
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
        stored: Stored | None,
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
        # A store with the whole Store contract (read) keeps horizons, keys and commit ids;
        # one with the first contract only (load and commit) gets what it knows.
        self._full_store = stored is not None
        self._keys: dict[str, tuple[int, int]] = {} if stored is None else dict(stored.keys)
        self._kept: dict[int, Event] = {} if stored is None else {e.seq: e for e in stored.kept}
        self._landed_at = (0, 0)  # where a commit with an unknown outcome was found to land
        # Commit ids cost a row per commit: sent only to a store that can lose a reply.
        self._name_commits = supports(store, OutcomeStore) and bool(
            getattr(type(store), "outcome_may_be_unknown", False)
        )
        self._task_group = task_group
        self._published = Published(log, self._start_waker)
        self._send, self._receive = anyio.create_memory_object_stream[Request](queue_size)
        self._space: anyio.Event | None = None  # set when queue space may have freed, if waited
        self._space_waiters = 0  # callers waiting for queue space
        self._commit_ids = _CommitIds()
        self._waker_scope = anyio.CancelScope()
        self._closing = False  # no new requests; set when leaving the `async with` block
        self._admit = 0  # while closing: queued requests still to apply
        self._parked = False  # the actor is waiting in receive()
        self._batches = 0
        self._requests = 0
        self._catch_up_queued = False
        self._queued_catch_up: Reload | None = None  # the feed's catch-up, while it waits
        self._catch_up_retry: anyio.CancelScope | None = None  # a failed one's retry, waiting
        self._catch_up_delay = _CATCH_UP_RETRY_FIRST
        self._watch_scope: anyio.CancelScope | None = None
        # Set when a rebasing commit met a record it cannot decode: this actor can no longer
        # follow the store past it, so it refuses further writes instead of repeating them.
        self._unfollowable: CorruptRecordError | None = None
        # Bind once: a bound logger filters debug lines at almost no cost per commit.
        self._logger = _logger.bind(session_id=session_id)
        # A rendered line per commit costs more than the commit: only when it goes anywhere.
        self._log_commits = wants_debug()
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
        recover: bool = False,
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
            recover: close the tool calls a crashed turn left open (see
                :meth:`recover_open_turn`) before the block starts.

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
        actor: SessionActor | None = None
        try:
            log, stored = await _load(store, session_id, fold=compaction is not None)
            async with _unwrapped(), anyio.create_task_group() as task_group:
                actor = cls(
                    _OPEN_KEY,
                    session_id=session_id,
                    store=store,
                    log=log,
                    stored=stored,
                    compaction=compaction,
                    queue_size=queue_size,
                    task_group=task_group,
                    rebase=on_conflict == "rebase",
                )
                try:
                    await task_group.start(actor._run)
                    if watch:
                        await task_group.start(actor._watch)
                    if recover:
                        await actor.recover_open_turn()
                    yield actor
                finally:
                    actor._begin_close()
        finally:
            if actor is not None:
                # Every path, a cancelled open included: no stream is left unclosed.
                actor._send.close()
                actor._receive.close()
                actor._published.close()
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
        self._free_space()  # waiting callers now find the queue closed
        if self._compaction is not None:
            self._compaction.close()
        if self._watch_scope is not None:
            self._watch_scope.cancel()
        if self._catch_up_retry is not None:
            self._catch_up_retry.cancel()

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

    def _start_waker(self) -> None:
        """Start coalescing subscribers' wake-ups (the first time there are many of them);
        an idle session or one with few subscribers runs no waker task."""
        if not self._closing:
            self._task_group.start_soon(self._run_waker)

    async def _run_waker(self) -> None:
        with self._waker_scope:
            await self._published.run_waker()

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
            if self._space_waiters:
                self._free_space()
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

    def _free_space(self) -> None:
        """Wake the callers waiting for queue space (each tries again)."""
        space, self._space = self._space, None
        if space is not None:
            space.set()

    def _refuse_the_rest(self) -> None:
        receive = self._receive
        while True:
            try:
                receive.receive_nowait().fail(_closed_error())
            except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
                break
        # Wakes callers still waiting for queue space: their send raises BrokenResourceError.
        receive.close()
        self._free_space()

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
        """Apply ``requests`` in order to the published log; fail the invalid ones at once.

        A request with an idempotency key the session has committed (or that an earlier
        request of this batch carries) is answered with those events and not applied.
        """
        base = log = self._published.log
        dropped: list[int] = []
        applied: list[tuple[Request, Any]] = []
        keyed: dict[str, tuple[Event, ...]] = {}  # keys this batch commits
        known: list[tuple[Request, Any]] = []
        rebuilt = False  # did the surface change other than by growing at the end?
        for request in requests:
            key = request.key if isinstance(request, Append) else None
            if key is not None:
                if key in keyed:  # the same key twice in one batch: one append, one answer
                    applied.append((request, keyed[key]))
                    continue
                answer = self._keyed_events(key)
                if answer is not None:
                    known.append((request, answer))
                    continue
            try:
                step: Applied = request.apply(log, base.count)
            except (InvalidEventError, ConflictError) as error:
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
            if key is not None:
                keyed[key] = step.result
        keys = (
            [(key, events[0].seq, len(events)) for key, events in keyed.items() if events]
            if keyed
            else []
        )
        return _Batch(base, log, dropped, applied, rebuilt, keys, known)

    def _keyed_events(self, key: str) -> tuple[Event, ...] | None:
        """The events first committed under ``key`` in this session, or None."""
        found = self._keys.get(key)
        if found is None:
            return None
        first, size = found
        held = {event.seq: event for event in self._published.log.since(first)[:size]}
        return tuple(held.get(seq) or self._kept[seq] for seq in range(first, first + size))

    def _commit_arguments(self, batch: _Batch, events: Sequence[Event]) -> dict[str, Any]:
        """The keyword arguments of the store commit for ``batch`` (a store that implements
        only the first Store contract gets only what it knows)."""
        arguments: dict[str, Any] = {
            "expected_count": batch.base.count,
            "events": events,
            "dropped": batch.dropped,
        }
        if not self._full_store:
            return arguments
        horizon = batch.base._horizon
        arguments["expected_horizon"] = horizon
        if batch.log._horizon != horizon:
            arguments["horizon"] = batch.log._horizon
        if batch.keys:
            arguments["keys"] = batch.keys
        if batch.dropped and self._keys:
            keyed = {
                seq for first, size in self._keys.values() for seq in range(first, first + size)
            }
            arguments["kept"] = [seq for seq in batch.dropped if seq in keyed]
        if self._name_commits:
            arguments["commit_id"] = self._commit_ids()
        return arguments

    async def _commit(self, requests: list[Request]) -> None:
        """Apply, commit in one store call, then publish and acknowledge.

        On a ConflictError the actor first catches up with the store. With
        ``on_conflict="rebase"`` it then applies the same requests again on top of what the
        other writer committed and retries (a few times); otherwise the callers get the
        ConflictError and their retries land on the caught-up log. A commit whose outcome is
        unknown (the store lost contact) is resolved first (see :meth:`_resolve`).
        """
        for attempt in range(_REBASE_ATTEMPTS + 1):
            if not requests:
                return
            if self._rebasing and all(
                isinstance(request, Append) and request.plain for request in requests
            ):
                final = attempt == _REBASE_ATTEMPTS
                if await self._commit_rebased(requests, final=final):  # type: ignore[arg-type]
                    continue  # a key another writer took: caught up, so now it is known
                return
            batch = self._apply(requests)
            if batch.log is not batch.base:
                # A tuple, not a view: a failed batch's events leave the log's storage below,
                # and a store may keep what it was given.
                events = tuple(batch.log.since(batch.base.count))
                arguments = self._commit_arguments(batch, events)
                error: BaseException | None = None
                # Shielded: once the store has the batch, its callers must hear about it.
                with anyio.CancelScope(shield=True):
                    try:
                        await self._store.commit(self._session_id, **arguments)
                    except OutcomeUnknownError as unknown:
                        error = await self._resolve(arguments, unknown)
                    except Exception as failure:
                        error = failure
                if error is not None:
                    # The batch never happened: its events leave the log's shared storage,
                    # so catching up (or the next batch) extends it instead of copying it.
                    batch.base._give_back(batch.log)
                    if isinstance(error, ConflictError):
                        # Another writer is ahead: read what it wrote.
                        unreadable = await self._reload(None)
                        if unreadable is not None:
                            error = unreadable  # the callers must hear what blocks them
                        elif self._rebase and attempt < _REBASE_ATTEMPTS:
                            requests = [request for request, _ in batch.applied]
                            if attempt:
                                # Writers that keep colliding take turns: a short random
                                # backoff, as in any optimistic-concurrency retry loop.
                                await anyio.sleep(random.uniform(0, min(0.01, 0.0005 * attempt)))
                            continue
                    self._answer(batch.known)
                    self._fail(batch.applied, error, expected_count=batch.base.count)
                    return
                for key, first, size in batch.keys:
                    self._keys[key] = (first, size)
                for seq in arguments.get("kept", ()):
                    self._kept[seq] = batch.base.since(seq)[0]
                self._publish(
                    batch.log, events=len(events), dropped=len(batch.dropped), rebuilt=False
                )
            self._acknowledge([*batch.known, *batch.applied], batch.log, rebuilt=batch.rebuilt)
            return

    async def _resolve(
        self, arguments: dict[str, Any], unknown: OutcomeUnknownError
    ) -> BaseException | None:
        """Find out whether a commit whose outcome is unknown landed; None if it did, else
        the error to give its callers.

        The commit is sent again, commit id and all, until an answer is definite. The id is
        unique in the session, so of the two attempts exactly one can land: a second attempt
        that lands means the first never will; one that conflicts means the first landed if
        the store has its commit id, else that another writer got there first. After
        ``_RESOLVE_FOR`` seconds without an answer the callers get the OutcomeUnknownError
        (not a StoreError: they may retry with their idempotency keys).
        """
        landed = await self._settle(arguments, unknown, self._store.commit)
        if landed is _NOT_LANDED:
            return ConflictError(
                f"session {self._session_id!r}: another writer committed first (found out"
                " after the store lost contact)"
            )
        return unknown if landed is _UNKNOWN else None

    async def _settle(
        self, arguments: dict[str, Any], unknown: OutcomeUnknownError, send: Any
    ) -> Any:
        """Send a commit again until its outcome is known: the store's answer if the resend
        landed, ``_LANDED_BEFORE`` (the first attempt did), ``_NOT_LANDED`` or ``_UNKNOWN``."""
        self._logger.warning("nous_session.commit_outcome_unknown", error=str(unknown))
        commit_id = arguments.get("commit_id")
        if commit_id is None or not supports(self._store, OutcomeStore):
            return _UNKNOWN
        delay = 0.01
        with anyio.move_on_after(_RESOLVE_FOR):
            while True:
                try:
                    answer = await send(self._session_id, **arguments)
                except ConflictError:
                    try:
                        found = await self._store.committed(self._session_id, commit_id)  # type: ignore[attr-defined]
                    except StoreError as error:
                        self._logger.debug("nous_session.commit_outcome_retry", error=repr(error))
                    else:
                        self._logger.info(
                            "nous_session.commit_outcome_resolved", landed=found is not None
                        )
                        if found is None:
                            return _NOT_LANDED
                        self._landed_at = found
                        return _LANDED_BEFORE
                except (OutcomeUnknownError, StoreError) as error:
                    self._logger.debug("nous_session.commit_outcome_retry", error=repr(error))
                else:
                    self._logger.info("nous_session.commit_outcome_resolved", landed=True)
                    return answer
                await anyio.sleep(delay)
                delay = min(delay * 2, 1.0)
        return _UNKNOWN

    async def _commit_rebased(self, requests: list[Append], *, final: bool) -> bool:
        """Commit a batch of plain appends after whatever the store holds, then publish.

        Returns True when the batch met a conflict (an idempotency key another writer had
        taken, say) and the actor caught up: the caller tries the batch again, unless it was
        the ``final`` attempt, when its callers get the ConflictError.

        The events are made for the seqs after the published log but not appended to it: if
        other writers got there first they move, and the log then takes the others' events
        and ours in one extend (appending ours first would leave the log's shared storage
        holding events that never happened, and the extend would have to copy it).
        """
        if self._unfollowable is not None:
            for request in requests:
                request.fail(_store_error(self._unfollowable))
            return False
        base = self._published.log
        seq = base.count
        events: list[Event] = []
        known: list[tuple[Request, Any]] = []  # answered from an earlier commit's key
        made_for: list[tuple[Append, int, int]] = []  # (request, offset in events, size)
        repeats: list[tuple[Append, str]] = []  # a key an earlier request of the batch has
        keyed: dict[str, tuple[int, int]] = {}
        for request in requests:
            key = request.key
            if key is not None:
                answer = self._keyed_events(key)
                if answer is not None:
                    known.append((request, answer))
                    continue
                if key in keyed:
                    repeats.append((request, key))
                    continue
            try:
                made = [
                    make_event(seq + offset, event_type, data, time, decoded=True)
                    for offset, (event_type, data, time) in enumerate(request.items)
                ]
            except InvalidEventError as error:
                request.fail(error)
                continue
            if key is not None:
                keyed[key] = (seq, len(made))
            made_for.append((request, len(events), len(made)))
            events.extend(made)
            seq += len(made)
        if not events:
            self._answer(known)
            return False
        arguments: dict[str, Any] = {"expected_count": base.count, "events": events}
        if self._full_store:
            arguments["keys"] = [(key, first, size) for key, (first, size) in keyed.items()]
            if self._name_commits:
                arguments["commit_id"] = self._commit_ids()
        waiting = [(request, None) for request, _, _ in made_for]
        waiting.extend((request, None) for request, _ in repeats)
        try:
            with anyio.CancelScope(shield=True):
                rebased = await self._send_rebased(arguments)
        except Exception as error:
            failure: BaseException = error
            if isinstance(error, ConflictError):
                unreadable = await self._reload(None)
                if unreadable is None and not final:
                    return True
                failure = unreadable or error
            elif isinstance(error, CorruptRecordError):
                # What the others wrote cannot be read (and our batch may have landed after
                # it): another rebasing commit would meet the same record, so stop writing.
                self._unfollowable = error
            self._answer(known)
            self._fail(waiting, failure, expected_count=base.count)
            return False
        if rebased is None:
            # An unknown outcome that turned out to have landed, at the seqs the store
            # recorded for the commit id; the catch-up brought the batch into the log.
            await self._reload(None)
            log = self._published.log
            first = self._landed_at[0]
            stored = list(log.since(first)[: len(events)])
            rebuilt = False
        elif rebased.horizon != base.horizon:
            # Another writer's snapshot dropped events this log still holds: read it all again
            # (the batch with it) rather than extend a history that no longer is.
            self._batches += 1
            await self._reload(None)
            log = self._published.log
            stored = list(rebased.events)
            rebuilt = True
        else:
            # Other writers' events (if any) go before ours; every caller hears the seqs its
            # events were stored at.
            log = base.extend([*rebased.others, *rebased.events])
            self._keys.update(rebased.keys)
            for key, (first, size) in keyed.items():
                self._keys[key] = (first + rebased.shift, size)
            self._publish(log, events=len(events), dropped=0, rebuilt=False, shift=rebased.shift)
            stored = list(rebased.events)
            rebuilt = any(event.op is not None for event in rebased.others)
        answers: dict[int, tuple[Event, ...]] = {}
        results: list[tuple[Request, Any]] = list(known)
        for request, offset, size in made_for:
            answers[id(request)] = tuple(stored[offset : offset + size])
            results.append((request, answers[id(request)]))
        by_key = {request.key: answers[id(request)] for request, _, _ in made_for if request.key}
        results.extend((request, by_key[key]) for request, key in repeats)
        self._acknowledge(results, log, rebuilt=rebuilt)
        return False

    async def _send_rebased(self, arguments: dict[str, Any]) -> Rebased | None:
        """A rebasing commit; None when an unknown outcome turned out to have landed."""
        send = self._store.commit_rebased  # type: ignore[attr-defined]
        try:
            return await send(self._session_id, **arguments)  # type: ignore[no-any-return]
        except OutcomeUnknownError as unknown:
            answer = await self._settle(arguments, unknown, send)
            if answer is _LANDED_BEFORE:
                return None
            if answer is _NOT_LANDED:
                raise ConflictError(
                    f"session {self._session_id!r}: the rebasing commit did not land"
                ) from unknown
            if answer is _UNKNOWN:
                raise
            return answer  # type: ignore[no-any-return]

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

    def _answer(self, answered: Sequence[tuple[Request, Any]]) -> None:
        self._requests += len(answered)
        for request, result in answered:
            request.resolve(result)

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

    async def _reload(self, request: Reload | None) -> BaseException | None:
        """Catch up with what other writers committed after our count.

        When the store's horizon moved (another writer took a snapshot, dropping events this
        log may still hold, and whose absence changes what a later operation means), the
        whole session is read again instead, so the surface stays what a fresh fold of the
        stored log gives. Returns the error when the store could not be read.
        """
        if request is None or request.from_feed:
            self._catch_up_queued = False
            self._queued_catch_up = None
        log = self._published.log
        if (
            request is not None
            and request.from_feed
            and request.head is not None
            and request.head <= log.count
        ):
            request.resolve(log)  # a catch-up after a conflict already read this far
            return None
        dropped = False
        try:
            if self._full_store:
                stored = await self._store.read(self._session_id, since=log.count)
                if stored.horizon != log.horizon:
                    stored = await self._store.read(self._session_id)
                    log = _restored(self._session_id, stored)
                    self._keys = dict(stored.keys)
                    self._kept = {event.seq: event for event in stored.kept}
                    events: Sequence[Event] = log.events()
                    dropped = replaced = True
                else:
                    events = stored.events
                    log = log.extend(events)  # decoded, hence validated, by the store
                    if log.count != stored.count:
                        raise CorruptRecordError(
                            f"session {self._session_id!r}: the store says its count is"
                            f" {stored.count}, but its events end at seq {log.count - 1}"
                            " and no snapshot dropped any"
                            + (
                                " (rows are missing)"
                                if log.count < stored.count
                                else " (rows past its count)"
                            )
                        )
                    self._keys.update(stored.keys)
                    replaced = any(event.op is not None for event in events)
            else:
                events = await self._store.load(self._session_id, since=log.count)
                log = log.extend(events)
                replaced = any(event.op is not None for event in events)
        except Exception as error:
            self._logger.warning("nous_session.catch_up_failed", error=repr(error))
            corrupt = isinstance(error, CorruptRecordError)
            if request is not None:
                request.fail(_store_error(error))
                if request.from_feed and not corrupt:
                    self._retry_catch_up()
            # A record that cannot be read blocks every retry: the callers must hear it.
            return error if corrupt else None
        if request is not None and request.from_feed:
            self._catch_up_delay = _CATCH_UP_RETRY_FIRST
        if log is not self._published.log:
            self._published.publish(log, dropped=dropped)
            if self._log_commits:
                self._logger.debug("nous_session.caught_up", count=log.count, events=len(events))
            if self._compaction is not None:
                self._compaction.committed(log, rebuilt=replaced)
        if request is not None:
            request.resolve(log)
        return None

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
                    if head != -1 and head <= self._published.log.count:
                        continue
                    await self._catch_up(head)
            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                pass  # the session is closing
            finally:
                with anyio.CancelScope(shield=True):
                    await heads.aclose()

    async def _catch_up(self, head: int) -> None:
        """Queue a feed catch-up to ``head`` (-1: read whatever there is), unless one waits.

        Raises:
            anyio.ClosedResourceError: the session is closing.
        """
        if self._catch_up_queued:
            # The catch-up that waits answers for this head too: it must read at least this
            # far. It skips its read when its own head is read already (a catch-up in flight
            # may have read past it), so a head left at an older value would let this commit
            # go unread until the next one (forever, after a writer's last commit). A
            # reconnect (-1) makes it read in any case: the lost listener may have missed
            # commits.
            queued = self._queued_catch_up
            if queued is not None and queued.head is not None:
                queued.head = None if head == -1 else max(queued.head, head)
            return
        self._catch_up_queued = True
        # -1 (reconnected) must always read; a head may be read already.
        request = Reload(None if head == -1 else head, from_feed=True)
        self._queued_catch_up = request
        try:
            self._send.send_nowait(request)
        except anyio.WouldBlock:
            await self._send.send(request)

    def _retry_catch_up(self) -> None:
        """A feed catch-up could not read (the store failed for a moment, say): read again
        after a backoff. Otherwise the commits it stood for would stay unread until the next
        notification, which never comes after a writer's last commit."""
        if self._closing or self._catch_up_retry is not None:
            return
        scope = self._catch_up_retry = anyio.CancelScope()
        delay = self._catch_up_delay
        self._catch_up_delay = min(delay * 2, _CATCH_UP_RETRY_MAX)
        self._task_group.start_soon(self._catch_up_later, scope, delay)

    async def _catch_up_later(self, scope: anyio.CancelScope, delay: float) -> None:
        with scope:
            try:
                await anyio.sleep(delay)
            finally:
                self._catch_up_retry = None
            with suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):  # closing
                await self._catch_up(-1)

    # Calls ------------------------------------------------------------------------------------

    async def _call(self, request: Request) -> Any:
        """Queue ``request`` and return its result (the compaction runner's ``post``).

        A caller cancelled while waiting for queue space has sent nothing: the request goes
        into the queue only by ``send_nowait``, which either queues it or does not, with no
        await in between. Once queued it is applied and committed whatever happens to the
        caller.
        """
        if self._closing:
            raise _closed_error()
        while True:
            try:
                self._send.send_nowait(request)
                break
            except anyio.WouldBlock:
                space = self._space
                if space is None:
                    space = self._space = anyio.Event()
                self._space_waiters += 1
                try:
                    await space.wait()  # set whenever the actor takes a batch, and at close
                finally:
                    self._space_waiters -= 1
            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                raise _closed_error() from None
        await request.done.wait()  # Request.outcome, inlined: this is every call's path
        if request.error is not None:
            raise request.error
        return request.result

    async def append(
        self,
        type: EventType | str,
        data: Mapping[str, Any] | None = None,
        *,
        time: datetime | None = None,
        key: str | None = None,
    ) -> Event:
        """Append one event and return it once it is committed.

        Args:
            type: an :class:`EventType`, its value, or a custom type's namespaced name
                (``"x.myapp.checkpoint"``): custom events are stored, streamed, exported and
                kept by snapshots, and never reach the surface.
            data: the event's JSON data (copied now: changing it afterwards changes nothing).
            time: when it happened; default now.
            key: an idempotency key: if the session already committed a call with this key,
                that call's event is returned and nothing is appended.

        Outcome: returned means committed. :class:`StoreError` means nothing was appended.
        A cancelled caller whose request was already queued does not un-commit it, and a
        caller cancelled while waiting for queue space sent nothing; either way, calling
        again with the same ``key`` is safe and tells which. :class:`OutcomeUnknownError` (the
        store lost contact and could not be asked again in time) is resolved the same way.

        Raises:
            InvalidEventError: the event or the key is invalid (nothing was appended).
            StoreError: the store failed to commit the batch (nothing was appended).
            OutcomeUnknownError: the store could not say whether the batch landed.
            SessionClosedError: the session is closed.
        """
        # Validated and copied here, in the caller: its errors surface on the caller's stack,
        # and changing `data` after the call (even a cancelled one) changes nothing.
        request = Append((prepare(type, data, time),), None if key is None else _key(key))
        return (await self._call(request))[0]  # type: ignore[no-any-return]

    async def append_many(
        self,
        items: Iterable[Sequence[Any]],
        *,
        key: str | None = None,
        expect_count: int | None = None,
    ) -> tuple[Event, ...]:
        """Append several events atomically (all or none) and return them once committed.

        Each item is ``(type, data)`` or ``(type, data, time)``. Outcome and ``key``: as for
        :meth:`append` (a retry with the key returns every event of the first call).

        Args:
            expect_count: a condition: the session must hold exactly this many events when
                the append applies (its first event gets this seq), or the call raises
                :class:`ConflictError` and appends nothing; with other writers, checked
                against the store's latest state (a rebasing commit never moves it). For
                optimistic writers: read ``log.count``, decide, append conditionally.

        Raises:
            InvalidEventError: an item is malformed or an event is invalid (nothing appended).
            ConflictError: ``expect_count`` does not hold (nothing appended).
            StoreError: the store failed to commit (nothing appended).
            OutcomeUnknownError, SessionClosedError: as :meth:`append`.
        """
        if expect_count is not None and (
            not isinstance(expect_count, int) or isinstance(expect_count, bool) or expect_count < 0
        ):
            raise ValueError(f"expect_count must be an int >= 0 or None, got {expect_count!r}")
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
        request = Append(tuple(normalised), _key(key), expect_count)
        return await self._call(request)  # type: ignore[no-any-return]

    async def add_message(self, message: Message, *, key: str | None = None) -> Event:
        """Append the surface event that stands for ``message`` (as ``Log.seed`` maps it).

        The event's time is the message's ``created_at``. Outcome and ``key``: as for
        :meth:`append`.

        Raises:
            InvalidEventError: ``message`` is not a Message (or the key is invalid).
            StoreError, OutcomeUnknownError, SessionClosedError: as :meth:`append`.
        """
        event_type, data = message_event(message)
        # The message's JSON is a fresh copy that only holds valid fields: nothing to re-check.
        item = (event_type, data, message.created_at)
        request = Append((item,), None if key is None else _key(key))
        return (await self._call(request))[0]  # type: ignore[no-any-return]

    async def replace(
        self,
        start: int,
        stop: int,
        message: Message | Sequence[Message],
        *,
        expect: int | Sequence[int] | None = None,
    ) -> Event:
        """Put ``message`` (or several messages, k >= 0) on the surface in place of the
        positions ``start..stop``, in one event.

        Name positions with the surface entries' :attr:`~Event.position` (``log.range``
        shows what a range holds). One message is recorded as its own surface event, timed at
        its ``created_at``; a sequence as one ``replace`` event holding them all (a summary
        plus a kept tail, an edit), timed now. Every replaced event stays in the log.

        Args:
            expect: a condition: the range must still hold this many surface entries, or
                entries of exactly these event seqs (in order; a replace's messages count
                once). If the surface changed, :class:`ConflictError` and nothing is applied;
                with other writers, this is checked against the store's latest state.

        Outcome: as for :meth:`append`; a cancelled caller whose request was queued does not
        undo it (a surface operation has no key: check the surface, or use ``expect``, before
        trying again).

        Raises:
            InvalidEventError: a malformed range, a range not below the new event's seq, or
                a value that is not a Message.
            ConflictError: ``expect`` does not hold.
            StoreError, OutcomeUnknownError, SessionClosedError: as :meth:`append`.
        """
        _range(Replace, start, stop)  # a malformed range fails now, in the caller
        if isinstance(message, Message):
            event_type, data = message_event(message)
            data["surface_op"] = ["replace", start, stop]  # checked when applied (make_event)
            item: tuple[EventType | str, dict[str, Any], datetime] = (
                event_type,
                data,
                message.created_at,
            )
        else:
            if not isinstance(message, list | tuple):
                raise InvalidEventError(
                    f"replace takes a Message or a sequence of Messages, not {message!r}"
                )
            item = prepare(EventType.REPLACE, replace_data(start, stop, list(message)))
        events = await self._call(Edit(item, start, stop, _expectation(expect)))
        return events[0]  # type: ignore[no-any-return]

    async def remove(
        self, start: int, stop: int, *, expect: int | Sequence[int] | None = None
    ) -> Event:
        """Take the positions ``start..stop`` off the surface; nothing takes their place.

        The removed events stay in the log (a ``remove`` event records the operation), so a
        rewind can bring them back. ``expect`` and the outcome: as for :meth:`replace`.

        Raises:
            InvalidEventError: a malformed range, or one not below the new event's seq.
            ConflictError: ``expect`` does not hold.
            StoreError, OutcomeUnknownError, SessionClosedError: as :meth:`append`.
        """
        op = _range(Remove, start, stop)
        item = prepare(EventType.REMOVE, {"surface_op": op.to_json()})
        events = await self._call(Edit(item, start, stop, _expectation(expect)))
        return events[0]  # type: ignore[no-any-return]

    async def rewind(self, to: int) -> Event:
        """Make the surface what it was when seq ``to`` was the newest event (-1: empty).

        An event records it; later history stays in the log, and another rewind (to the seq
        just before this one, say) brings it back. Outcome: as for :meth:`replace`.

        Raises:
            InvalidEventError: ``to`` is not below the new event's seq, or is before the
                horizon (a snapshot dropped that history).
            StoreError, OutcomeUnknownError, SessionClosedError: as :meth:`append`.
        """
        try:
            op = Rewind(to)
        except ValueError as error:
            raise InvalidEventError(f"rewind: {error}") from None
        events = await self._call(
            Append((prepare(EventType.REWIND, {"surface_op": op.to_json()}),))
        )
        return events[0]  # type: ignore[no-any-return]

    async def uncompact(self, summary_seq: int) -> Event:
        """Undo the replace at ``summary_seq`` (a compaction's summary, say): the range it
        replaced is visible again, as it was then. Outcome: as for :meth:`replace`.

        Raises:
            InvalidEventError: that event is not a replace on the surface with its range
                intact, or its history is before the horizon.
            StoreError, OutcomeUnknownError, SessionClosedError: as :meth:`append`.
        """
        try:
            op = Uncompact(summary_seq)
        except ValueError as error:
            raise InvalidEventError(f"uncompact: {error}") from None
        events = await self._call(
            Append((prepare(EventType.UNCOMPACT, {"surface_op": op.to_json()}),))
        )
        return events[0]  # type: ignore[no-any-return]

    async def recover_open_turn(self) -> tuple[Event, ...]:
        """Close every tool call left open (an assistant's call with no result, after a crash
        or a cancelled turn): each gets a tool result saying "Tool call was interrupted and
        not executed. Please retry if needed.", placed right after its call, so the next model
        call is valid for every provider. ``SessionActor.open(..., recover=True)`` does this
        on open.

        Returns:
            The events added (empty when no call was open).

        Raises:
            StoreError, OutcomeUnknownError, SessionClosedError: as :meth:`append`.
        """
        return await self._call(Recover())  # type: ignore[no-any-return]

    async def fork(self, new_session_id: str, *, at: int | None = None) -> None:
        """Make ``new_session_id`` a new, independent session of this store whose history is
        this one's up to seq ``at`` (default: everything committed so far).

        The new session records its parent and fork point. A store that can fork (every
        built-in one) shares the history instead of copying it, so this costs the same at any
        length; another store gets a copy of the events. Open the fork with
        ``SessionActor.open(session_id=new_session_id, store=session.store)``.

        Raises:
            ValueError: ``new_session_id`` is bad or exists, or ``at`` is outside
                ``horizon - 1 .. count - 1``.
            StoreError: the store failed (nothing was made).
        """
        try:
            check_session_id(new_session_id)
        except ValueError as error:
            raise ValueError(f"bad new_session_id: {error}") from None
        log = self._published.log
        point = log.count - 1 if at is None else at
        if supports(self._store, ForkingStore):
            await self._store.fork(self._session_id, new_session_id, at=point)  # type: ignore[attr-defined]
            return
        history = log.upto(point)  # raises ValueError outside the held history
        if await self._store.load(new_session_id):
            raise ValueError(f"session {new_session_id!r} exists already")
        await self._store.commit(new_session_id, expected_count=0, events=tuple(history.events()))

    async def snapshot(self) -> Log:
        """Drop what the surface no longer needs (see :meth:`Log.shadowed`), in memory and in
        the store, in one commit; the horizon moves to the count.

        Returns:
            The log right after the snapshot.

        Raises:
            StoreError, OutcomeUnknownError, SessionClosedError: as :meth:`append`.
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
    def store(self) -> Store:
        """The store the session is persisted in (to open a fork in, say)."""
        return self._store

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


async def _load(store: Store, session_id: str, *, fold: bool) -> tuple[Log, Stored | None]:
    """Rebuild a session's Log from the store: its events with their seqs and gaps verbatim,
    its count and horizon. A store with only the first Store contract (no ``read``) gives
    its events, and the count follows from the last of them."""
    stored: Stored | None = None
    if callable(getattr(type(store), "read", None)):
        stored = await store.read(session_id)
        log = _restored(session_id, stored)
    else:
        events = await store.load(session_id)
        try:
            log = Log.restore(events)
        except InvalidEventError as error:
            raise StoreError(f"session {session_id!r}: the store returned {error}") from error
    if fold and len(log.events()) > _WARM_ABOVE:
        # Compaction checks the surface at every commit: fold it in a worker thread now, not
        # on the event loop at the first commit.
        await anyio.to_thread.run_sync(log.surface)
    return log, stored


def _restored(session_id: str, stored: Stored) -> Log:
    """The Log a store's read of a whole session stands for, or why it cannot be one.

    Raises:
        CorruptRecordError: the stored count or horizon does not fit the rows (a count past
            the newest row with no snapshot to explain the gap, say).
        StoreError: the events themselves are out of order.
    """
    events = stored.events
    newest = events[-1].seq if events else -1
    if stored.horizon == 0 and stored.count != newest + 1 and (events or stored.count):
        raise CorruptRecordError(
            f"session {session_id!r}: the store says its count is {stored.count}, but its"
            f" events end at seq {newest} and no snapshot dropped any"
            + (" (rows are missing)" if stored.count > newest + 1 else "")
        )
    try:
        return Log.restore(events, count=stored.count, horizon=stored.horizon)
    except InvalidEventError as error:
        raise CorruptRecordError(f"session {session_id!r}: the store returned {error}") from error


def _key(key: object) -> str | None:
    """An idempotency key checked in the caller (its error on the caller's stack)."""
    if key is None:
        return None
    try:
        return check_key(key)
    except ValueError as error:
        raise InvalidEventError(str(error)) from None


def _range(kind: type[Replace] | type[Remove], start: object, stop: object) -> Replace | Remove:
    """A range operation checked in the caller: its error is an InvalidEventError."""
    try:
        return kind(start, stop)  # type: ignore[arg-type]
    except ValueError as error:
        raise InvalidEventError(f"{kind.name}: {error}") from None


def _expectation(expect: object) -> int | tuple[int, ...] | None:
    """A conditional write's ``expect``, checked and copied in the caller."""
    if expect is None:
        return None
    if type(expect) is int and expect >= 0:
        return expect
    if isinstance(expect, Sequence) and not isinstance(expect, str | bytes):
        seqs = tuple(expect)
        if all(type(seq) is int and seq >= 0 for seq in seqs):
            return seqs
    raise InvalidEventError(
        f"expect is a count (an int >= 0) or a sequence of seqs, not {expect!r}"
    )
