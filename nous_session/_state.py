"""The state one session's actor shares between its parts (engine, commit strategies,
follower), and the few things every part does with it: publish a commit, adopt a read of the
store, answer callers, fail them. Only the actor task changes it. See docs/internals.md.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import Any, Protocol

import anyio
import anyio.abc
import anyio.lowlevel

from nous_session._logging import get_logger, wants_debug
from nous_session._requests import Request
from nous_session.errors import (
    CorruptRecordError,
    InvalidEventError,
    SessionClosedError,
    SessionDeletedError,
    StoreError,
    WrongEventLoopError,
)
from nous_session.event import Event
from nous_session.log import Log
from nous_session.stores.base import OutcomeStore, Store, Stored, supports
from nous_session.subscription import Published


class Compactor(Protocol):
    """What the session's parts use of its compaction runner (``_compaction_runner.py``, which
    reads this state: named here by what it does, not imported)."""

    run: int
    stale: int
    failed: int
    in_flight: bool

    def committed(self, log: Log, *, rebuilt: bool) -> None: ...

    def close(self) -> None: ...

    async def wait(self) -> None: ...


__all__ = ["Compactor", "SessionState", "closed_error", "restored", "store_error"]

_logger = get_logger()


class CommitIds:
    """Commit ids for one actor: 96 random bits drawn once, then a counter (unique in a
    session by any measure, and no system call per commit)."""

    __slots__ = ("_next", "_prefix")

    def __init__(self) -> None:
        self._prefix = secrets.token_urlsafe(12)
        self._next = 0

    def __call__(self) -> str:
        self._next += 1
        return f"{self._prefix}.{self._next}"


def closed_error() -> SessionClosedError:
    """The error every call gets once the session is closed (a fresh one per caller)."""
    return SessionClosedError("the session is closed")


def wrong_loop_error() -> WrongEventLoopError:
    """The error a call from another event loop or thread gets, before it queues anything."""
    return WrongEventLoopError(
        "this session belongs to the event loop (and thread) that opened it; nothing was "
        "queued. From another event loop or a plain thread, use SessionsPortal, or "
        "anyio.from_thread.run from a worker thread the session's event loop started"
    )


def store_error(error: BaseException) -> StoreError:
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


class SessionState:
    """One session's shared state: what is committed, what the store can do, the counters.

    Attributes:
        session_id: the session.
        store: where it is persisted.
        name_commits: commits carry an id (the store can lose a reply and be asked later).
        checks_uid: commits carry the identity this actor holds (``expected_uid``), once it
            knows one and has seen events.
        keys: the session's idempotency keys: key -> (first seq, number of events).
        kept: events a snapshot dropped that a key still answers with, by seq.
        published: the committed Log and its subscribers.
        commit_ids: names the next commit.
        batches: store commits so far; requests: requests answered in them.
        uid: the session's identity as the store last gave it, in a read or as a commit's
            result (None before it has one).
        unfollowable: set when this actor can no longer follow the store, so it refuses
            further writes: a rebasing commit met a record it cannot decode, or the session
            was deleted from the store since this actor read it (the actor then closes).
        compaction: the compaction runner, or None.
        task_group: the actor's task group (its waker, compactions, catch-up retries).
        closing: no new requests are accepted.
        work_scope: the actor loop's cancel scope while it runs (only an abort cancels it).
        committing: a store call of a commit is in flight: an abort waits for its answer.
        abort_requested: the block around the actor ended by an exception.
    """

    __slots__ = (
        "__weakref__",  # the compaction runner's reference (see CompactionRunner)
        "abort_requested",
        "batches",
        "can_rebase",
        "checks_uid",
        "closing",
        "commit_ids",
        "committing",
        "compaction",
        "kept",
        "keys",
        "log_commits",
        "logger",
        "name_commits",
        "published",
        "requests",
        "session_id",
        "store",
        "task_group",
        "uid",
        "unfollowable",
        "waker_scope",
        "work_scope",
    )

    def __init__(
        self,
        *,
        session_id: str,
        store: Store,
        log: Log,
        stored: Stored,
        task_group: anyio.abc.TaskGroup,
    ) -> None:
        self.session_id = session_id
        self.store = store
        self.keys: dict[str, tuple[int, int]] = {}
        self.kept: dict[int, Event] = {}
        self._remember(stored)
        self.uid = stored.uid  # the session's identity, once it has one (see same_session)
        # Commit ids cost a row per commit: sent only to a store that can lose a reply.
        self.name_commits = supports(store, OutcomeStore) and bool(
            getattr(type(store), "outcome_may_be_unknown", False)
        )
        # A store that takes ``expected_uid`` (see Store) is told the identity this actor
        # holds with every commit once it has seen events: it never commits into a session
        # deleted and made again by another holder.
        self.checks_uid = getattr(type(store), "checks_uid", False) is True
        self.published = Published(log, self._start_waker)
        # The waker's scope, made when it starts (most sessions never have enough subscribers).
        self.waker_scope: anyio.CancelScope | None = None
        self.commit_ids = CommitIds()
        self.batches = 0
        self.requests = 0
        self.unfollowable: StoreError | None = None
        self.compaction: Compactor | None = None
        self.task_group = task_group
        self.closing = False
        self.work_scope: anyio.CancelScope | None = None
        self.committing = False
        self.abort_requested = False
        # Bind once: a bound logger filters debug lines at almost no cost per commit.
        self.logger = _logger.bind(session_id=session_id)
        # A rendered line per commit costs more than the commit: only when it goes anywhere.
        self.log_commits = wants_debug()

    def _start_waker(self) -> None:
        """Start coalescing subscribers' wake-ups (the first time there are many of them);
        an idle session or one with few subscribers runs no waker task."""
        if not self.closing:
            scope = self.waker_scope = anyio.CancelScope()
            self.task_group.start_soon(self._run_waker, scope)

    async def _run_waker(self, scope: anyio.CancelScope) -> None:
        with scope:
            await self.published.run_waker()

    def begin_commit(self) -> None:
        """A commit's store call is about to start: an abort now waits for its answer.

        Its caller first takes an abort that came since the actor's last await (while the
        previous commit was in flight, say): that abort has cancelled the actor's work scope,
        but a cancellation reaches a task only at an await, and the next one may be inside
        the store call, after the store has been sent the commit, whose callers would then
        hear SessionClosedError for events that are stored. So before anything is sent:
        ``if state.abort_requested: await anyio.lowlevel.checkpoint()`` (it raises there).
        """
        self.committing = True

    def end_commit(self) -> None:
        """A commit's store call has answered: an abort that came meanwhile stops the actor
        now (at its next await: its callers are answered first).

        This flag, not a shielded cancel scope per commit, is what keeps a commit's callers
        from losing its outcome: the actor loop is shielded once for its life and only an
        abort cancels it (see :mod:`nous_session._engine`).
        """
        self.committing = False
        if self.abort_requested and self.work_scope is not None:
            self.work_scope.cancel()

    def adopt(self, stored: Stored) -> Log:
        """A read of the whole session (``since=0``) replaces what this actor knew of it: its
        keys and kept events now, and the returned Log once published (:meth:`republish`).

        Raises:
            CorruptRecordError: the read is not a Log (see :func:`restored`).
        """
        log = restored(self.session_id, stored)
        self._remember(stored)
        return log

    def closed_error(self) -> SessionClosedError:
        """The error a call gets once the session is closed (a fresh one per caller), saying
        why when the actor closed itself because the session was deleted."""
        gone = self.unfollowable
        if not isinstance(gone, SessionDeletedError):
            return closed_error()
        error = SessionClosedError(f"the session is closed: {gone}")
        error.__cause__ = gone
        return error

    def same_session(self, stored: Stored, count: int) -> Stored:
        """``stored``, a read of the session, when it is of the session this actor has seen
        ``count`` events of committed (whose identity it then notes).

        Raises:
            SessionDeletedError: the session was deleted since this actor read it: its count
                went down (a count goes down by nothing else), or it has another identity
                (it was made again, and is another session).
        """
        if stored.count < count:
            how = f"the store counts {stored.count} events where this actor has seen {count}"
        elif count and self.uid is not None and stored.uid not in (None, self.uid):
            how = "it was made again since (it is another session)"
        else:
            if stored.uid is not None:
                self.uid = stored.uid
            return stored
        raise SessionDeletedError(
            f"session {self.session_id!r} was deleted from the store (by another holder)"
            f" after this actor read it: {how}. Nothing more was stored, and this actor"
            " closes; open the session again to go on"
        )

    def committed_to(self, uid: object, count: int, seqs: range) -> SessionDeletedError | None:
        """Take note of the identity a commit returned (``uid``; called only when it is not
        the one noted): None when the commit went into the session this actor holds, having
        seen ``count`` events of it; the error its callers get when it went into another.

        An identity is noted when this actor has none yet (it created the session: count 0
        when it was read, no identity then), or had seen no events (any session of the id is
        its). None, or anything but a str, is a store that does not tell (the contract's
        earlier version): nothing is learnt. Another identity after events were seen is a
        session deleted and made again by another holder since this actor read it, into which
        the store has now put the commit's events (at ``seqs``; a store that takes
        ``expected_uid`` refuses such a commit instead, so this is one that cannot be told):
        the commit cannot be taken back, so its callers hear where their events went, and the
        actor closes.
        """
        if type(uid) is not str:
            return None
        if self.uid is None or not count:
            self.uid = uid
            return None
        if not seqs:
            what = "applied this commit to the session made again (another session)"
        else:
            at = str(seqs.start) if len(seqs) == 1 else f"{seqs.start}..{seqs.stop - 1}"
            what = (
                "put this commit's events into the session made again (another session), at"
                f" seqs {at}: they are not in the session this actor held"
            )
        return SessionDeletedError(
            f"session {self.session_id!r} was deleted from the store (by another holder)"
            f" and made again after this actor read it; the store {what}, and said so only"
            " once it was done. This actor closes; open the session again to go on"
        )

    def _remember(self, stored: Stored) -> None:
        self.keys = dict(stored.keys)
        self.kept = {event.seq: event for event in stored.kept}

    def republish(self, log: Log, *, dropped: bool, rebuilt: bool) -> None:
        """Publish a Log read from the store (not a commit of this actor: no batch counted)
        and let compaction look."""
        self.published.publish(log, dropped=dropped)
        if self.log_commits:
            self.logger.debug("nous_session.caught_up", count=log.count)
        if self.compaction is not None:
            self.compaction.committed(log, rebuilt=rebuilt)

    def keyed_events(self, key: str) -> tuple[Event, ...] | None:
        """The events first committed under ``key`` in this session, or None."""
        found = self.keys.get(key)
        if found is None:
            return None
        first, size = found
        held = {event.seq: event for event in self.published.log.since(first)[:size]}
        return tuple(held.get(seq) or self.kept[seq] for seq in range(first, first + size))

    def publish(self, log: Log, *, events: int, dropped: int, **extra: Any) -> None:
        """A batch is durable: make ``log`` the committed value and tell the subscribers."""
        self.published.publish(log, dropped=dropped > 0)
        self.batches += 1
        if self.log_commits:
            self.logger.debug(
                "nous_session.commit", events=events, dropped=dropped, count=log.count, **extra
            )

    def acknowledge(
        self, applied: Sequence[tuple[Request[Any], Any]], log: Log, *, rebuilt: bool
    ) -> None:
        """Answer each applied request with its result, then let compaction look."""
        self.answer(applied)
        if self.compaction is not None:
            self.compaction.committed(log, rebuilt=rebuilt)

    def answer(self, answered: Sequence[tuple[Request[Any], Any]]) -> None:
        """Answer requests whose result stands (known keys, or a committed batch)."""
        self.requests += len(answered)
        for request, result in answered:
            request.resolve(result)

    def fail(
        self,
        applied: Sequence[tuple[Request[Any], Any]],
        error: BaseException,
        *,
        expected_count: int,
    ) -> None:
        """The store refused a batch: each of its callers gets its own StoreError.

        Logged at debug only: the error is handed to every caller, whose to report it is.
        """
        self.logger.debug(
            "nous_session.commit_failed",
            error=repr(error),
            requests=len(applied),
            expected_count=expected_count,
        )
        for request, _ in applied:
            request.fail(store_error(error))


def restored(session_id: str, stored: Stored) -> Log:
    """The Log a store's read of a whole session stands for, or why it cannot be one.

    Raises:
        CorruptRecordError: the stored count or horizon does not fit the rows (a count past
            the newest row with no snapshot to explain the gap, say), or the events
            themselves are out of order.
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
