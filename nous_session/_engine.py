"""The engine of a session's actor: one task that takes requests from a bounded queue in
batches and commits them by one rule, **a batch commits exactly as if its requests had run one
after another, each on the log the previous ones left**.

Each batch is cut into segments at barriers (:class:`~nous_session._requests.Reload`,
:class:`~nous_session._requests.Erase`: run between two commits) and before a request that
starts a commit (:class:`~nous_session._requests.Snapshot`); each segment is applied to the
published Log (a request invalid there fails alone), committed in one store call
(:mod:`nous_session._commits`), published, and only then answered. See docs/internals.md for
the rule step by step, backpressure and the round trip's cost.
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final, TypeVar

import anyio
import anyio.abc

from nous_session._commits import Segment, commit_plain, commit_rebased
from nous_session._follower import Follower
from nous_session._loops import Waiter, new_waiter, wake
from nous_session._requests import Append, Applied, Reload, Request
from nous_session._state import SessionState, wrong_loop_error
from nous_session.errors import (
    ConflictError,
    InvalidEventError,
    SessionClosedError,
)
from nous_session.event import Event
from nous_session.stores.base import RebasingStore, supports

if TYPE_CHECKING:
    from nous_session.telemetry import SessionTelemetry

__all__ = ["Engine"]

ResultT = TypeVar("ResultT")

# With on_conflict="rebase", how many times a segment is re-applied after a conflict.
REBASE_ATTEMPTS: Final = 32


class Engine:
    """The queue and the loop of one session's actor (see the module docstring).

    Every awaited call crosses the event loop twice (the caller wakes the actor, the actor
    answers the caller) and nothing else is on that path: the queue is a list with the
    bound kept here, the actor parks on the loop's own primitive only when the queue is empty,
    and there is no cancel scope per commit. The loop runs in a shielded scope entered once;
    :meth:`abort` cancels it, once the store has answered when a commit is in flight
    (``SessionState.committing``), so a commit's callers always hear what became of it.

    Args:
        state: the session's shared state.
        queue_size: how many requests may wait before callers wait too.
        rebase: ``on_conflict="rebase"``: a segment that lost to another writer is applied
            again on the caught-up log.
        telemetry: the session's telemetry, or None when it is off.

    Attributes:
        follower: reads the store between commits (catch-ups, erasures).
        traced: whether telemetry wraps :meth:`commit_segment` (a benchmark checks it).
    """

    __slots__ = (
        "_aborted",
        "_can_rebase",
        "_parked",
        "_queue",
        "_rebase",
        "_rebasing",
        "_size",
        "_space",
        "_space_waiters",
        "_state",
        "_telemetry",
        "_thread",
        "follower",
        "hosted",
        "traced",
    )

    def __init__(
        self,
        state: SessionState,
        queue_size: int,
        *,
        rebase: bool = False,
        telemetry: SessionTelemetry | None = None,
    ) -> None:
        self._state = state
        self._rebase = rebase
        # A store that can append after whatever the session holds serialises the writers
        # itself: plain appends then never conflict and nothing is redone.
        self._can_rebase = supports(state.store, RebasingStore)
        self._rebasing = rebase and self._can_rebase
        # Requests accepted and not taken, in arrival order; at most `queue_size`. Once the
        # session is closing nothing more comes in, so what the queue holds then is exactly
        # what must still be applied.
        # A list, not a deque: a batch takes it whole (a fresh list replaces it), and an
        # empty deque is a 624-byte block where an empty list is 56 bytes.
        self._queue: list[Request[Any]] = []
        self._size = queue_size
        self._parked: Waiter | None = None  # the actor's wake-up while the queue is empty
        # Telemetry hook: with telemetry off the loop calls the plain method (no check, no
        # wrapper on its path); on, a wrapper that traces and times each segment's commit.
        # (The wrapper is made when the loop starts, not kept here: a bound method of the
        # engine kept by the engine would be a reference cycle, left for the collector.)
        self.traced = telemetry is not None
        self._telemetry = telemetry
        self._space: anyio.Event | None = None  # set when queue space may have freed, if waited
        self._space_waiters = 0  # callers waiting for queue space
        self._aborted = False  # the block ended by an exception: stop, refuse the rest
        # The thread of the event loop that opened the session. Its queue, waiters and answers
        # belong to that loop; another running loop is always on another thread, so one
        # comparison of thread ids tells a caller from elsewhere before it queues anything.
        self._thread = threading.get_ident()
        self.follower = Follower(state, self.enqueue, self.begin_close)
        # Run in the task that hosts the session (the registry's), not in one of its own:
        # see `run`.
        self.hosted = False

    # Calls ------------------------------------------------------------------------------------

    async def call(self, request: Request[ResultT]) -> ResultT:
        """Queue ``request`` and return its result (raise its error).

        A caller cancelled while waiting for queue space has sent nothing: the request goes
        into the queue with no await between the check for space and the append. Once queued
        it is applied and committed whatever happens to the caller.

        Raises:
            SessionClosedError: the session is closed.
            WrongEventLoopError: the caller runs on another event loop or thread (nothing is
                queued).
        """
        if threading.get_ident() != self._thread:
            raise wrong_loop_error()
        if self._state.closing:
            raise self._state.closed_error()
        queue = self._queue
        if len(queue) < self._size:
            queue.append(request)  # the usual path, inlined: no extra coroutine frame
            parked = self._parked
            if parked is not None:
                self._parked = None
                wake(parked)
        else:
            await self._queue_when_space(request)
        await request.done.wait()
        if request.error is not None:
            raise request.error
        return request.result

    def _put(self, request: Request[Any]) -> None:
        """Append to the queue (there is room) and wake the actor if it is parked."""
        self._queue.append(request)
        parked = self._parked
        if parked is not None:
            self._parked = None
            wake(parked)

    async def enqueue(self, request: Reload) -> None:
        """Queue one of the follower's catch-ups without waiting for its answer.

        Raises:
            anyio.ClosedResourceError: the session is closing.
        """
        if self._state.closing:
            raise anyio.ClosedResourceError
        if len(self._queue) < self._size:
            self._put(request)
        else:
            try:
                await self._queue_when_space(request)
            except SessionClosedError:
                raise anyio.ClosedResourceError from None

    async def _queue_when_space(self, request: Request[Any]) -> None:
        """Wait until the queue has room, then queue ``request`` (a cancelled wait sends
        nothing; a close while waiting raises SessionClosedError)."""
        while True:
            space = self._space
            if space is None:
                space = self._space = anyio.Event()
            self._space_waiters += 1
            try:
                await space.wait()  # set whenever the actor takes a batch, and at close
            finally:
                self._space_waiters -= 1
            if self._state.closing:
                raise self._state.closed_error()
            if len(self._queue) < self._size:
                self._put(request)
                return

    def queue_depth(self) -> int:
        """Requests accepted into the queue and not yet taken."""
        return len(self._queue)

    # The loop ---------------------------------------------------------------------------------

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """The actor task: take a batch, commit it segment by segment, until closed.

        The loop runs shielded from the scopes around it (see the module docstring); only
        :meth:`abort` cancels it, through ``state.work_scope``.

        A ``hosted`` loop runs in the task that hosts the session (the registry's), with no
        block in another task to take a cancellation and :meth:`abort` it: it takes one
        itself, only while parked with nothing queued (its shield is lowered there), and ends
        by raising it, every request that comes later refused. While it works, a cancellation
        waits for the next park, as :meth:`begin_close` would: what is queued is applied.
        """
        task_status.started()
        state = self._state
        batch: list[Request[Any]] = []
        telemetry = self._telemetry  # telemetry hook: commit_segment itself when telemetry is off
        commit = (
            self.commit_segment
            if telemetry is None
            else telemetry.traced_commit(self.commit_segment, state)
        )
        # One scope: shielded from the scopes around it, and cancelled by an abort.
        with anyio.CancelScope(shield=True) as work:
            state.work_scope = work
            hosted = self.hosted
            if self._aborted:
                work.cancel()
            try:
                while True:
                    # The next batch: every request waiting in the queue; none when the actor
                    # must stop (closing, and everything queued before the close applied).
                    # Taken here, not in a method of its own: an idle session keeps no
                    # suspended frame for it, and a batch costs no coroutine.
                    queue = self._queue
                    if not queue:
                        if state.closing:
                            break
                        waiter = self._parked = new_waiter()
                        if hosted:
                            work.shield = False  # parked: a cancellation may come in (above)
                        try:
                            if isinstance(waiter, asyncio.Future):
                                await waiter
                            else:
                                await waiter.wait()
                        finally:
                            self._parked = None
                            if hosted:
                                work.shield = True
                        queue = self._queue
                        if not queue:
                            break  # woken by the close
                    batch, self._queue = queue, []
                    if self._space_waiters:
                        self._free_space()
                    segment: list[Request[Any]] = []
                    for request in batch:
                        if request.barrier:
                            await commit(segment)
                            segment = []
                            await request.run_barrier(self.follower)
                        elif request.starts_commit and segment:
                            await commit(segment)
                            segment = [request]
                        else:
                            segment.append(request)
                    await commit(segment)
                    batch = []
            finally:
                # Whatever ends the loop (closing, an abort, a bug), nobody may hang.
                for request in batch:
                    if not request.done.is_set():
                        request.fail(self._state.closed_error())
                state.closing = True
                self._refuse_the_rest()
                state.work_scope = None
                if state.waker_scope is not None:
                    state.waker_scope.cancel()
                state.published.close()

    async def commit_segment(self, requests: list[Request[Any]]) -> None:
        """Apply a segment and commit it, answering every request in it.

        On a ConflictError the follower first catches up with the store. With
        ``on_conflict="rebase"`` the same requests are then applied again on top of what the
        other writer committed (a few times, with a short random backoff after the first);
        otherwise their callers get the ConflictError and their retries land on the
        caught-up log.

        The benchmarking hook: ``benchmarks/one_session_chain.py`` wraps this method of the
        class to time the actor's part of a call.
        """
        state = self._state
        for attempt in range(REBASE_ATTEMPTS + 1):
            if not requests:
                return
            final = attempt == REBASE_ATTEMPTS
            # Plain appends have no precondition, so another writer being first is never their
            # caller's error: whatever `on_conflict` says, a segment of them that lost goes
            # again after what the other writer stored (to the store's rebasing commit when it
            # has one, which never conflicts). The first attempt costs what it always did:
            # the segment is looked at only when it may rebase, or once it has lost.
            rebases = self._rebasing or (attempt and self._can_rebase)
            appends = _plain_appends(requests) if rebases else None
            if appends is not None:
                requests = await commit_rebased(state, self.follower, appends, final=final)
            elif attempt and self._can_rebase and (split := _beside_checks(requests)):
                # Plain appends that lost beside a compaction's result need not wait for it to
                # win (on a busy session it may not, in every attempt): they go first, rebased.
                appends, others = split
                requests = await commit_rebased(state, self.follower, appends, final=final)
                requests += await commit_plain(
                    state,
                    self.follower,
                    self._apply(others),
                    may_retry=self._may_retry if not final else _never,
                )
            else:
                segment = self._apply(requests)
                requests = await commit_plain(
                    state,
                    self.follower,
                    segment,
                    may_retry=self._may_retry if not final else _never,
                )
            if requests and attempt and not all(request.checks_itself for request in requests):
                # Writers that keep colliding take turns: a short random backoff, as in any
                # optimistic-concurrency retry loop. Not for a compaction's result alone: the
                # writers it loses to append through the rebasing commit, which never waits,
                # and a pause only gives them more time to be first again.
                await anyio.sleep(random.uniform(0, min(0.01, 0.0005 * attempt)))

    def _may_retry(self, requests: Sequence[Request[Any]]) -> list[Request[Any]]:
        """The requests of a segment that lost to another writer that go again after catching
        up: all under ``on_conflict="rebase"``; else those that assume nothing their callers
        planned (plain appends, and self-checking requests such as a compaction's), whatever
        else shares their segment."""
        if self._rebase:
            return list(requests)
        return [
            request
            for request in requests
            if request.checks_itself or (isinstance(request, Append) and request.plain)
        ]

    def _apply(self, requests: list[Request[Any]]) -> Segment:
        """Apply ``requests`` in order to the published log; fail the invalid ones at once."""
        state = self._state
        base = log = state.published.log
        dropped: list[int] = []
        applied: list[tuple[Request[Any], Any]] = []
        keyed: dict[str, tuple[Event, ...]] = {}  # keys this segment commits
        known: list[tuple[Request[Any], Any]] = []
        rebuilt = False  # did the surface change other than by growing at the end?
        for request in requests:
            key = request.key if isinstance(request, Append) else None
            if key is not None:
                if key in keyed:  # the same key twice in one segment: one append, one answer
                    applied.append((request, keyed[key]))
                    continue
                answer = state.keyed_events(key)
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
                state.logger.exception("nous_session.request_failed", kind=type(request).__name__)
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
        return Segment(base, log, dropped, applied, rebuilt, keys, known)

    # Closing ----------------------------------------------------------------------------------

    def begin_close(self) -> None:
        """Take no new requests; those already queued are still applied and answered."""
        state = self._state
        if state.closing:
            return
        state.closing = True
        # From here nothing enters the queue (every way in checks `closing` with no await
        # before appending): what it holds is exactly what is still applied.
        self._wake_actor()
        self._free_space()  # waiting callers now find the session closing
        if state.compaction is not None:
            state.compaction.close()
        self.follower.close()

    def abort(self) -> None:
        """The block around the actor ended by an exception: stop without applying what is
        queued (its callers get SessionClosedError). A commit in flight completes first and
        its callers hear its outcome (see ``SessionState.end_commit``)."""
        self.begin_close()
        self._aborted = True
        state = self._state
        state.abort_requested = True
        if state.work_scope is not None and not state.committing:
            state.work_scope.cancel()

    def refuse_queued(self) -> None:
        """Close, and refuse whatever is still queued (every path out of ``open``: no caller
        is left waiting, an actor that never ran included)."""
        self._state.closing = True
        self._refuse_the_rest()

    def _wake_actor(self) -> None:
        parked = self._parked
        if parked is not None:
            self._parked = None
            wake(parked)

    def _free_space(self) -> None:
        """Wake the callers waiting for queue space (each tries again)."""
        space, self._space = self._space, None
        if space is not None:
            space.set()

    def _refuse_the_rest(self) -> None:
        queue, self._queue = self._queue, []
        for request in queue:
            request.fail(self._state.closed_error())
        # Wakes callers still waiting for queue space: they find the session closing.
        self._free_space()


def _plain_appends(requests: list[Request[Any]]) -> list[Append] | None:
    """``requests`` when every one is a plain append (a rebasing commit may move them), else
    None."""
    appends = [request for request in requests if isinstance(request, Append) and request.plain]
    return appends if len(appends) == len(requests) else None


def _beside_checks(
    requests: list[Request[Any]],
) -> tuple[list[Append], list[Request[Any]]] | None:
    """The plain appends of ``requests`` and the others, when there are both and the others
    all check themselves (a compaction's result, which applies wherever the appends land);
    else None."""
    appends = [r for r in requests if isinstance(r, Append) and r.plain]
    others = [r for r in requests if not (isinstance(r, Append) and r.plain)]
    if appends and others and all(request.checks_itself for request in others):
        return appends, others
    return None


def _never(_requests: Sequence[Request[Any]]) -> list[Request[Any]]:
    """No more retries (the last attempt)."""
    return []
