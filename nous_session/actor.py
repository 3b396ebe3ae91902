"""SessionActor: one writer per session, committed-event streams, background compaction.

One actor task owns a session's :class:`~nous_session.log.Log`. Callers put requests into a
bounded queue; the actor takes every request waiting as one batch and commits it by one rule:
**a batch commits exactly as if its requests had run one after another, each on the log the
previous ones left**. Only once the store has a commit does the actor publish the new Log
value, wake subscribers and answer each request with its result or error: readers never see
an event that is not committed, and nothing acknowledged is ever dropped.

Backpressure: the queue holds ``queue_size`` requests. A caller whose request does not fit
waits for space (a cancelled wait sends nothing). Subscribers never hold up the actor: each
reads the published, immutable Log by cursor.

How the actor is built (its engine, commit strategies and follower): docs/internals.md.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any, Final, Literal

import anyio
import anyio.abc
import anyio.lowlevel
import anyio.to_thread
import attrs

from nous_session import telemetry as _telemetry
from nous_session._compaction_runner import CompactionRunner, CompactionTurn
from nous_session._engine import Engine
from nous_session._history import HistoryOperations
from nous_session._load_only import LoadOnlyStore, with_read
from nous_session._requests import Append, Reload
from nous_session._state import SessionState, restored
from nous_session.compaction import CompactionPolicy
from nous_session.errors import InvalidEventError, SessionDeletedError
from nous_session.event import (
    MAX_EVENT_SIZE,
    Event,
    EventType,
    check_size,
    message_event,
    prepare,
)
from nous_session.listing import metadata_of
from nous_session.log import Log
from nous_session.message import Message
from nous_session.metadata import SessionMetadata
from nous_session.stores import open_store
from nous_session.stores.base import (
    ChangeFeedStore,
    LeasingStore,
    Store,
    Stored,
    check_key,
    check_session_id,
    supports,
)
from nous_session.subscription import Subscription

__all__ = ["SessionActor", "SessionStatistics", "Subscription"]

# A restored log longer than this is folded in a worker thread before the actor starts.
_WARM_ABOVE: Final = 2048


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

    @classmethod
    def of(cls, state: SessionState, queue_depth: int) -> SessionStatistics:
        """The statistics of the session whose state is ``state``."""
        compaction = state.compaction
        return cls(
            queue_depth=queue_depth,
            count=state.published.log.count,
            subscribers=state.published.subscribers,
            batches=state.batches,
            requests=state.requests,
            compactions_run=compaction.run if compaction else 0,
            compactions_stale=compaction.stale if compaction else 0,
            compactions_failed=compaction.failed if compaction else 0,
            compaction_in_flight=compaction.in_flight if compaction else False,
        )


_OPEN_KEY: Final = object()


class SessionActor(HistoryOperations):
    """The runtime of one session: an actor task that owns its Log.

    Open it with :meth:`open` (``async with SessionActor.open(session_id=...) as session``),
    which loads the session and runs its actor for the block. Every call is safe from any task
    of the event loop the actor runs in.
    """

    # __weakref__: adapters keep per-actor helpers (a lock, say) that must not keep it open.
    __slots__ = ("__weakref__", "_call", "_engine", "_max_event_size", "_metadata", "_state")

    def __init__(
        self,
        key: object,
        *,
        session_id: str,
        store: Store,
        log: Log,
        stored: Stored,
        compaction: CompactionPolicy | None,
        queue_size: int,
        task_group: anyio.abc.TaskGroup,
        rebase: bool,
        telemetry: _telemetry.SessionTelemetry | None = None,
        max_event_size: int | None = MAX_EVENT_SIZE,
    ) -> None:
        if key is not _OPEN_KEY:
            raise TypeError("use `async with SessionActor.open(session_id=...) as session`")
        state = self._state = SessionState(
            session_id=session_id,
            store=store,
            log=log,
            stored=stored,
            task_group=task_group,
        )
        engine = self._engine = Engine(state, queue_size, rebase=rebase, telemetry=telemetry)
        # (count looked through, metadata found): metadata events are never dropped and seqs
        # only grow, so each look reads only the events committed since the last one.
        self._metadata: tuple[int, SessionMetadata | None] = (0, None)
        self._call = engine.call  # bound once: every call goes through it
        self._max_event_size = max_event_size
        if compaction is not None:
            state.compaction = CompactionRunner(
                compaction,
                state,
                post=engine.call,
                telemetry=telemetry,
                turn=(
                    CompactionTurn(store, session_id, compaction.turn_ttl, state.logger)
                    if supports(store, LeasingStore)
                    else None
                ),
            )
        if telemetry is not None:  # telemetry hook: the gauges read the queue and readers
            telemetry.opened(engine.queue_depth, state.published)

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
        metadata: SessionMetadata | Mapping[str, Any] | None = None,
        max_event_size: int | None = MAX_EVENT_SIZE,
    ) -> AsyncIterator[SessionActor]:
        """Load the session and run its actor for the duration of the ``async with`` block.

        Args:
            session_id: the session's id, a non-empty string.
            store: where the log is persisted: a Store, or a URL for :func:`open_store` (the
                actor then owns and closes it); None means the store ``$NOUS_SESSION_STORE``
                names (owned as a URL is), else a private in-memory store.
            compaction: when and how to compact in the background; None never compacts.
            queue_size: how many requests may wait for the actor before callers wait too.
            follow: whether to follow commits that other processes make to this session, so
                the log and its subscribers see them; None (the default) follows when the
                store has a change feed (SQLite, PostgreSQL), False never does.
            on_conflict: what a commit that loses to another writer does. A batch of plain
                appends (no precondition, no surface op) never fails for that, whatever this
                says: it is committed again after what the other writer stored (through the
                store's rebasing commit when it has one). ``"raise"`` (the default): the
                callers of any other batch (``expect=``, ``expect_count=``, a replace, a
                snapshot) get :class:`ConflictError` (the actor has caught up, so a retry
                lands). ``"rebase"``: for many writers on one session, where conflicts are
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
                :meth:`~nous_session.actor.SessionActor.recover_open_turn`) before the block
                starts.
            metadata: the session's metadata (a
                :class:`~nous_session.metadata.SessionMetadata` or its JSON form): when it
                differs from what the session has (a new session has none), a metadata event
                sets it before the block starts; reopening with the same record appends
                nothing.
            max_event_size: the largest event this actor appends, in bytes of its data as
                compact UTF-8 JSON (as stored): 4 MiB by default
                (:data:`~nous_session.event.MAX_EVENT_SIZE`); None for no limit. A larger
                event is refused with :class:`InvalidEventError`, in the caller, before
                anything is queued. Events other writers commit are not checked.

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
        options = check_options(queue_size, on_conflict, compaction, max_event_size)
        record = None if metadata is None else SessionMetadata.coerce(metadata)
        owned = store is None or isinstance(store, str)
        store, watch = _store_to_open(store, follow)
        telemetry, traced = _traced(session_id, store)
        actor: SessionActor | None = None
        try:
            log, stored = await _load(traced, session_id, fold=compaction is not None)
            async with _unwrapped(), anyio.create_task_group() as task_group:
                actor = _made(cls, session_id, traced, log, stored, task_group, telemetry, options)
                # The actor holds the log now; this frame lives as long as the block, and a
                # Log shares its storage with the logs built on it, so keeping it here would
                # keep every event the session ever held reachable, snapshots or not.
                del log, stored
                engine = actor._engine
                try:
                    # Not `start`: a start cancelled after the actor has begun waits for the
                    # actor to end, and its loop is shielded. One pass through the loop lets
                    # the actor park before the block starts, as `start` did.
                    # Telemetry hook: the actor's task runs with no current span.
                    task_group.start_soon(
                        engine.run if telemetry is None else telemetry.detached(engine.run)
                    )
                    await anyio.lowlevel.checkpoint()
                    if watch:
                        await engine.follower.follow()
                    if recover:
                        await actor.recover_open_turn()
                    if record is not None and actor.metadata != record:
                        await actor.set_metadata(record)
                    yield actor
                except BaseException:
                    # The block raised or was cancelled: queued requests are refused (a
                    # commit in flight completes); the actor's loop is shielded from the
                    # scopes around it, so it is told here, not by the task group's cancel.
                    engine.abort()
                    raise
                finally:
                    engine.begin_close()
        finally:
            _closed(actor, telemetry)
            if owned:
                await store.aclose()

    # Calls ------------------------------------------------------------------------------------

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
            InvalidEventError: the event or the key is invalid, or the event is larger than
                ``max_event_size`` (nothing was appended).
            StoreError: the store failed to commit the batch (nothing was appended).
            OutcomeUnknownError: the store could not say whether the batch landed.
            SessionClosedError: the session is closed.
        """
        # Validated and copied here, in the caller: its errors surface on the caller's stack,
        # and changing `data` after the call (even a cancelled one) changes nothing.
        item = prepare(type, data, time)
        check_size(item[0], item[1], self._max_event_size)
        request = Append((item,), None if key is None else _key(key))
        return (await self._call(request))[0]

    async def append_many(
        self,
        items: Iterable[Sequence[Any] | Message],
        *,
        key: str | None = None,
        expect_count: int | None = None,
    ) -> tuple[Event, ...]:
        """Append several events atomically (all or none) and return them once committed.

        Each item is ``(type, data)``, ``(type, data, time)``, or a
        :class:`~nous_session.message.Message` (appended as :meth:`add_message` appends it:
        its surface event, at its ``created_at``). Outcome and ``key``: as for :meth:`append`
        (a retry with the key returns every event of the first call).

        Args:
            expect_count: a condition: the session must hold exactly this many events when
                the append applies (its first event gets this seq), or the call raises
                :class:`ConflictError` and appends nothing; with other writers, checked
                against the store's latest state (a rebasing commit never moves it). For
                optimistic writers: read ``log.count``, decide, append conditionally.

        Raises:
            InvalidEventError: an item is malformed, or an event is invalid or larger than
                ``max_event_size`` (nothing appended).
            ConflictError: ``expect_count`` does not hold (nothing appended).
            StoreError: the store failed to commit (nothing appended).
            OutcomeUnknownError, SessionClosedError: as :meth:`append`.
        """
        if expect_count is not None and (
            not isinstance(expect_count, int) or isinstance(expect_count, bool) or expect_count < 0
        ):
            raise ValueError(f"expect_count must be an int >= 0 or None, got {expect_count!r}")
        normalised = _prepared_items(items, self._max_event_size)
        if not normalised:
            return ()
        request = Append(tuple(normalised), _key(key), expect_count)
        return await self._call(request)

    async def add_message(self, message: Message, *, key: str | None = None) -> Event:
        """Append the surface event that stands for ``message`` (as ``Log.seed`` maps it).

        The event's time is the message's ``created_at``. Outcome and ``key``: as for
        :meth:`append`.

        Raises:
            InvalidEventError: ``message`` is not a Message, is larger than ``max_event_size``,
                or the key is invalid.
            StoreError, OutcomeUnknownError, SessionClosedError: as :meth:`append`.
        """
        event_type, data = message_event(message)
        # The message's JSON is a fresh copy that only holds valid fields: nothing to re-check
        # but its size.
        check_size(event_type, data, self._max_event_size)
        item = (event_type, data, message.created_at)
        request = Append((item,), None if key is None else _key(key))
        return (await self._call(request))[0]

    async def reload(self) -> Log:
        """Catch up with what other writers committed to this session's store since our count.

        The actor does this by itself after a :class:`ConflictError` (and continuously when it
        follows the store); call it to be sure before acting on the log. Requests queued before
        it are committed first; later ones apply to the caught-up log.

        Raises:
            StoreError, SessionClosedError: as :meth:`append`.
        """
        return await self._call(Reload())

    async def wait_for_compaction(self) -> None:
        """Wait until no compaction is running or due (return at once when none is).

        A compaction that lands while the surface is still over the policy's trigger (messages
        were appended while it ran) starts the next one at once, and that is waited for too.
        So on return the work that the commits so far called for has landed, and the surface
        is within the trigger, unless no compaction can bring it there yet: what is over is
        the kept tail (``keep_last`` messages, and fewer than ``keep_last // 2`` newer ones),
        tool calls still waiting for their results, or the last attempt failed or found
        nothing to do (the next is tried when the surface grows). A compaction that another
        commit starts after the return is not waited for.
        """
        compaction = self._state.compaction
        if compaction is not None:
            await compaction.wait()

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
        return Subscription(self._state.published, since)

    # Reading ----------------------------------------------------------------------------------

    @property
    def session_id(self) -> str:
        """The session's id."""
        return self._state.session_id

    @property
    def store(self) -> Store:
        """The store the session is persisted in (to open a fork in, say)."""
        # The store itself, not the traced proxy (telemetry hook) or the LoadOnlyStore the actor
        # calls it through.
        store: Store = _telemetry.unwrap_store(self._state.store)
        return store.inner if isinstance(store, LoadOnlyStore) else store

    @property
    def max_event_size(self) -> int | None:
        """The largest event this actor appends, in bytes of its data as compact JSON (None:
        no limit): a caller can check a batch against it before appending any of it."""
        return self._max_event_size

    @property
    def log(self) -> Log:
        """The latest committed Log value (an immutable snapshot)."""
        return self._state.published.log

    @property
    def metadata(self) -> SessionMetadata | None:
        """The session's metadata as the committed log has it (the newest metadata event's
        record), or None when it never had any. Reads only the events committed since it was
        last asked."""
        log = self._state.published.log
        seen, found = self._metadata
        if log.count != seen:
            newer = metadata_of(log.since(seen)) if log.count > seen else metadata_of(log.events())
            self._metadata = (log.count, found if newer is None and log.count > seen else newer)
        return self._metadata[1]

    async def set_metadata(self, metadata: SessionMetadata | Mapping[str, Any]) -> Event:
        """Replace the session's metadata: append a metadata event holding the whole record
        (the store's copy, which listings search, changes in the same commit).

        Raises:
            ValueError: the record is invalid (nothing was appended).
            StoreError, SessionClosedError: as for :meth:`append`.
        """
        record = SessionMetadata.coerce(metadata)
        return await self.append(EventType.METADATA, {"metadata": record.to_json()})

    @property
    def closed(self) -> bool:
        """True once the actor has stopped (nothing more will be committed)."""
        return self._state.published.closed

    def messages(self) -> Sequence[Message]:
        """The messages the model sees now (the committed log's surface)."""
        return self._state.published.log.derive_messages()

    def statistics(self) -> SessionStatistics:
        """Counters and gauges; see :class:`SessionStatistics`."""
        return SessionStatistics.of(self._state, self._engine.queue_depth())

    def __repr__(self) -> str:
        state = "closed" if self.closed else "closing" if self._state.closing else "open"
        return f"<SessionActor {self._state.session_id!r} {state} count={self.log.count}>"


def _made(
    cls: type[SessionActor],
    session_id: str,
    store: Store,
    log: Log,
    stored: Stored,
    task_group: anyio.abc.TaskGroup,
    telemetry: _telemetry.SessionTelemetry | None,
    options: Options,
) -> SessionActor:
    """The actor of a session loaded from ``store`` (``log``, read as ``stored``), its tasks in
    ``task_group``. For :meth:`SessionActor.open` and :func:`host`."""
    return cls(
        _OPEN_KEY,
        session_id=session_id,
        store=store,
        log=log,
        stored=stored,
        compaction=options.compaction,
        queue_size=options.queue_size,
        task_group=task_group,
        rebase=options.on_conflict == "rebase",
        telemetry=telemetry,
        max_event_size=options.max_event_size,
    )


async def host(
    opened: Callable[[SessionActor], object],
    *,
    session_id: str,
    store: Store,
    follow: bool | None,
    options: Options,
) -> None:
    """The registry's way to run a session (:class:`~nous_session.registry.Sessions`):
    load it and run its actor loop in the calling task, not in a task of its own, until
    :func:`close` is called and what was queued before is applied.

    ``opened(actor)`` is called once the actor takes requests (before its loop starts);
    calls made from then on are served as soon as this task runs the loop. ``follow`` and
    ``options`` are :meth:`SessionActor.open`'s (checked by the caller, ``session_id`` too);
    ``store`` is the caller's to close. A registry's sessions are open for as long as it
    holds them, not for a block: the task that asked for one goes on with it, and this task,
    which the registry started for it, would otherwise do nothing but wait, a second task per
    open session, most of an idle session's memory.

    A cancellation that reaches this task does not stop the loop (it runs shielded, as in
    :meth:`open`); only :func:`close` does, and the registry closes every session it
    hosts before its task group ends. An exception of the actor's background tasks (a
    compaction, the follower) aborts it as in :meth:`SessionActor.open`, and is raised here.

    Raises:
        StoreError: the session could not be loaded.
    """
    store, watch = _store_to_open(store, follow)
    telemetry, traced = _traced(session_id, store)
    actor: SessionActor | None = None
    try:
        log, stored = await _load(traced, session_id, fold=options.compaction is not None)
        try:
            async with anyio.create_task_group() as task_group:
                actor = _made(
                    SessionActor, session_id, traced, log, stored, task_group, telemetry, options
                )
                del log, stored  # as in open: the actor holds the log now
                engine = actor._engine
                try:
                    if watch:
                        await engine.follower.follow()
                    opened(actor)
                    del opened  # the registry's: not kept by this frame for the session's life
                    engine.hosted = True
                    # Telemetry hook: the actor's loop runs with no current span.
                    await (engine.run if telemetry is None else telemetry.detached(engine.run))()
                except BaseException:
                    engine.abort()
                    raise
                finally:
                    engine.begin_close()
        except BaseExceptionGroup as group:
            _raise_single(group)
    finally:
        _closed(actor, telemetry)


def closing(actor: SessionActor) -> bool:
    """Whether ``actor`` takes no new requests: it is closed, or closing (told to, or by itself,
    when its session was deleted). For the registry, which opens a new actor instead."""
    return actor._state.closing or actor.closed


def deleted(actor: SessionActor) -> SessionDeletedError | None:
    """Why ``actor`` closed (or is closing) by itself, when it was because its session was
    deleted from the store; else None. For the web streams, which end saying so."""
    gone = actor._state.unfollowable
    return gone if isinstance(gone, SessionDeletedError) else None


def close(actor: SessionActor) -> None:
    """Take no new requests; those already queued are still applied and answered, then a
    hosted actor's loop ends (:func:`host`). For the registry: a session opened with
    :meth:`SessionActor.open` closes with its block."""
    actor._engine.begin_close()


@asynccontextmanager
async def _unwrapped() -> AsyncIterator[None]:
    """Let a single exception out of the actor's task group as itself, not in a group.

    The block's own exception (or the actor's) is what the caller should catch; a group of one
    would make every ``except ValueError`` around ``async with SessionActor.open(...)`` miss.
    """
    try:
        yield
    except BaseExceptionGroup as group:
        _raise_single(group)


def _raise_single(group: BaseExceptionGroup[BaseException]) -> None:
    """Raise the one exception of ``group`` as itself; a group of several as the group."""
    if len(group.exceptions) != 1:
        raise group
    error = group.exceptions[0]
    raise error from error.__cause__


def _traced(session_id: str, store: Store) -> tuple[_telemetry.SessionTelemetry | None, Store]:
    """The session's telemetry and the store its actor calls.

    Telemetry hook: None when off (the actor then runs as if telemetry did not exist); on, the
    actor talks to the store through a traced proxy. A store with no ``read`` (the contract's
    first version) is wrapped once, here.
    """
    readable = with_read(store)
    telemetry = _telemetry.session(session_id, readable)
    return telemetry, readable if telemetry is None else telemetry.store


def _closed(actor: SessionActor | None, telemetry: _telemetry.SessionTelemetry | None) -> None:
    """Every path out of a session, a cancelled open included: no caller is left waiting and
    no stream is left unclosed."""
    if actor is not None:
        actor._engine.refuse_queued()
        actor._state.published.close()
    if telemetry is not None:  # telemetry hook
        telemetry.closed()


async def _load(store: Store, session_id: str, *, fold: bool) -> tuple[Log, Stored]:
    """Rebuild a session's Log from the store: its events with their seqs and gaps verbatim,
    its count and horizon."""
    stored = await store.read(session_id)
    log = restored(session_id, stored)
    if fold and len(log.events()) > _WARM_ABOVE:
        # Compaction checks the surface at every commit: fold it in a worker thread now, not
        # on the event loop at the first commit.
        await anyio.to_thread.run_sync(log.surface)
    return log, stored


@attrs.frozen
class Options:
    """The options an actor runs with, as ``check_options`` returns them checked:
    :meth:`SessionActor.open`'s ``compaction``, ``queue_size``, ``on_conflict`` and
    ``max_event_size``."""

    compaction: CompactionPolicy | None
    queue_size: int
    on_conflict: Literal["raise", "rebase"]
    max_event_size: int | None


def check_options(
    queue_size: object,
    on_conflict: object,
    compaction: object,
    max_event_size: object = MAX_EVENT_SIZE,
) -> Options:
    """The options an actor runs with, checked in the caller (the registry checks them once for
    every actor it opens).

    Raises:
        ValueError: a bad option.
    """
    if not isinstance(queue_size, int) or isinstance(queue_size, bool) or queue_size < 1:
        raise ValueError(f"queue_size must be an int >= 1, got {queue_size!r}")
    if on_conflict not in ("raise", "rebase"):
        raise ValueError(f'on_conflict must be "raise" or "rebase", got {on_conflict!r}')
    if compaction is not None and not isinstance(compaction, CompactionPolicy):
        raise ValueError(f"compaction must be a CompactionPolicy, got {compaction!r}")
    if max_event_size is not None and (
        not isinstance(max_event_size, int)
        or isinstance(max_event_size, bool)
        or max_event_size < 1
    ):
        raise ValueError(f"max_event_size must be an int >= 1 or None, got {max_event_size!r}")
    return Options(compaction, queue_size, on_conflict, max_event_size)


def _prepared_items(
    items: Iterable[Sequence[Any] | Message], limit: int | None
) -> list[tuple[EventType | str, Any, datetime]]:
    """``append_many``'s items checked and copied in the caller, each within ``limit`` bytes.

    Raises:
        InvalidEventError: naming the first bad item's index.
    """
    normalised: list[tuple[EventType | str, Any, datetime]] = []
    for index, item in enumerate(items):
        if not isinstance(item, Message | tuple | list) or (
            not isinstance(item, Message) and len(item) not in (2, 3)
        ):
            raise InvalidEventError(
                f"append_many item {index} must be (type, data), (type, data, time) or a "
                f"Message (nous_session.event.message_event(message) gives a message's "
                f"(type, data)), got {item!r}"
            )
        prepared: tuple[EventType | str, Any, datetime]
        try:
            if isinstance(item, Message):
                surface_type, surface_data = message_event(item)
                prepared = (surface_type, surface_data, item.created_at)
            else:
                prepared = prepare(item[0], item[1], item[2] if len(item) == 3 else None)
            check_size(prepared[0], prepared[1], limit)
        except InvalidEventError as error:
            raise InvalidEventError(f"append_many item {index}: {error}") from None
        normalised.append(prepared)
    return normalised


def _store_to_open(store: Store | str | None, follow: bool | None) -> tuple[Store, bool]:
    """The store ``open`` was given (None: the store ``$NOUS_SESSION_STORE`` names, else a
    private MemoryStore; a URL: the store it names) and whether the actor follows its change
    feed.

    Raises:
        ValueError: not a store, or ``follow=True`` with a store that has no change feed.
    """
    if store is None or isinstance(store, str):
        store = open_store(store)
    elif not all(callable(getattr(store, name, None)) for name in ("load", "commit", "aclose")):
        raise ValueError(f"store must have async load, commit and aclose; got {store!r}")
    watch = follow is not False and supports(store, ChangeFeedStore)
    if follow and not watch:
        raise ValueError(f"follow=True needs a store with a change feed; {store!r} has none")
    return store, watch


def _key(key: object) -> str | None:
    """An idempotency key checked in the caller (its error on the caller's stack)."""
    if key is None:
        return None
    try:
        return check_key(key)
    except ValueError as error:
        raise InvalidEventError(str(error)) from None


def engine_traced(actor: SessionActor) -> bool:
    """A hook for benchmarks only (benchmarks/suites/telemetry.py): whether telemetry wraps
    the actor's commit of a segment (``Engine.traced``)."""
    return actor._engine.traced
