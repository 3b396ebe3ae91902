"""The engine of a session's actor: one task that takes requests from a bounded queue in
batches and commits them, by one rule.

The batch rule
--------------
**A batch commits exactly as if its requests had run one after another, each on the log the
previous ones left.** Each caller gets the answer it would get alone, in arrival order.
Concretely, the loop below does this with every batch it takes:

1. **Take** every request waiting in the queue (the batch), in arrival order.
2. **Cut** it into segments, each committed in one store call, in order:

   * a *barrier* (:class:`~nous_session._requests.Reload`: catching up with other writers)
     is not applied: the segment before it is committed, then the follower reads the store
     (an erasure, :class:`~nous_session._erasing.Erase`, is a barrier too: it erases in the
     store, then reads the session again);
   * a request that *starts a commit* (:class:`~nous_session._requests.Snapshot`) applies
     only to a stored log: the segment before it is committed first and it opens the next
     one. A snapshot deletes events from the store, and a store can delete only what it
     holds: applied in the same commit as the events before it, it would drop some of them
     before they were ever stored.

3. **Apply** each request of a segment, in order, to the log the previous ones left
   (:meth:`Engine._apply`). A request that is invalid there (a bad range, an ``expect`` or
   ``expect_count`` that no longer holds) fails alone, at once, and the next one applies as if
   it had never come. A keyed request whose key the session has committed is answered with
   those events and not applied; one whose key an earlier request of the segment carries is
   answered with that request's events.
4. **Commit** the segment in one store call (:mod:`nous_session._commits`): the events it
   made, the seqs a snapshot drops (all stored by step 2), the new horizon and the keys. A
   segment of plain appends under ``on_conflict="rebase"`` goes to a rebasing commit.
5. **Publish** the new Log, then **answer** every request of the segment. Nothing is
   published or acknowledged before the store has it, so readers never see an uncommitted
   event and nothing acknowledged is ever dropped. If the commit fails, every request of the
   segment gets the error (:class:`StoreError`: nothing stored; :class:`OutcomeUnknownError`:
   the store could not tell), and the next segment applies to the log as it was.

Backpressure: the queue holds ``queue_size`` requests. A caller whose request does not fit
waits for space (a cancelled wait sends nothing). A request in the queue is applied whatever
happens to its caller.

The round trip
--------------
Every awaited call crosses the event loop twice: the caller wakes the actor, the actor
answers the caller. Nothing else is on that path, because it is paid once per call and a
server runs thousands of sessions on one loop:

* The queue is a ``deque`` with the bound kept here, and the actor parks on the loop's own
  primitive (:func:`~nous_session._requests.new_waiter`) only when the queue is empty: no
  checkpoint before taking a batch (a pass through the loop of its own), no per-take event
  or exception.
* No cancel scope per commit. The actor's loop runs in a shielded scope entered once, so the
  scopes of whoever opened the session never reach into it (a shielded scope's exit walks
  every enclosing scope up to the next shield: with sessions opened nested in one
  ``AsyncExitStack``, the scopes of every session opened before). Closing the session tells
  the actor through the queue; a block that ends by an exception tells it with
  :meth:`Engine.abort`, which cancels the actor's inner scope, at once when it waits, or
  once the store has answered when a commit is in flight (``SessionState.committing``): a
  commit's callers always hear what became of it.
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections import deque
from typing import TYPE_CHECKING, Any, Final

import anyio
import anyio.abc

from nous_session._commits import Batch, commit_plain, commit_rebased
from nous_session._follower import Follower
from nous_session._requests import Append, Applied, Reload, Request, Waiter, new_waiter, wake
from nous_session._state import SessionState, closed_error, wrong_loop_error
from nous_session.errors import (
    ConflictError,
    InvalidEventError,
    SessionClosedError,
)
from nous_session.event import Event

if TYPE_CHECKING:
    from nous_session.telemetry import SessionTelemetry

__all__ = ["Engine"]

# With on_conflict="rebase", how many times a segment is re-applied after a conflict.
REBASE_ATTEMPTS: Final = 32


class Engine:
    """The queue and the loop of one session's actor (see the module docstring).

    Args:
        state: the session's shared state.
        queue_size: how many requests may wait before callers wait too.
        telemetry: the session's telemetry, or None when it is off.
    """

    __slots__ = (
        "_aborted",
        "_committer",
        "_parked",
        "_queue",
        "_size",
        "_space",
        "_space_waiters",
        "_state",
        "_thread",
        "follower",
    )

    def __init__(
        self, state: SessionState, queue_size: int, telemetry: SessionTelemetry | None = None
    ) -> None:
        self._state = state
        # Requests accepted and not taken, in arrival order; at most `queue_size`. Once the
        # session is closing nothing more comes in, so what the queue holds then is exactly
        # what must still be applied.
        self._queue: deque[Request] = deque()
        self._size = queue_size
        self._parked: Waiter | None = None  # the actor's wake-up while the queue is empty
        # Telemetry hook: with telemetry off the loop calls the plain method (no check, no
        # wrapper on its path); on, a wrapper that traces and times each segment's commit.
        self._committer = (
            self._commit if telemetry is None else telemetry.traced_commit(self._commit, state)
        )
        self._space: anyio.Event | None = None  # set when queue space may have freed, if waited
        self._space_waiters = 0  # callers waiting for queue space
        self._aborted = False  # the block ended by an exception: stop, refuse the rest
        # The thread of the event loop that opened the session. Its queue, waiters and answers
        # belong to that loop; another running loop is always on another thread, so one
        # comparison of thread ids tells a caller from elsewhere before it queues anything.
        self._thread = threading.get_ident()
        self.follower = Follower(state, self.enqueue)

    # Calls ------------------------------------------------------------------------------------

    async def call(self, request: Request) -> Any:
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
            raise closed_error()
        queue = self._queue
        if len(queue) < self._size:
            queue.append(request)  # the usual path, inlined: no extra coroutine frame
            parked = self._parked
            if parked is not None:
                self._parked = None
                wake(parked)
        else:
            await self._queue_when_space(request)
        await request.done.wait()  # Request.outcome, inlined: this is every call's path
        if request.error is not None:
            raise request.error
        return request.result

    def _put(self, request: Request) -> None:
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

    async def _queue_when_space(self, request: Request) -> None:
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
                raise closed_error()
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
        """
        task_status.started()
        state = self._state
        batch: list[Request] = []
        commit = self._committer  # telemetry hook: _commit itself when telemetry is off
        with anyio.CancelScope(shield=True), anyio.CancelScope() as work:
            state.work_scope = work
            if self._aborted:
                work.cancel()
            try:
                while True:
                    batch = await self._take()
                    if not batch:
                        break
                    segment: list[Request] = []
                    for request in batch:
                        if request.barrier:
                            await commit(segment)
                            segment = []
                            if isinstance(request, Reload):
                                await self.follower.reload(request)
                            else:
                                await request.run_barrier(state)  # an erasure
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
                        request.fail(closed_error())
                state.closing = True
                self._refuse_the_rest()
                state.work_scope = None
                state.waker_scope.cancel()
                state.published.close()

    async def _take(self) -> list[Request]:
        """The next batch: every request waiting in the queue. Empty when the actor must stop
        (closing, and everything queued before the close is applied)."""
        queue = self._queue
        if not queue:
            if self._state.closing:
                return []
            waiter = self._parked = new_waiter()
            try:
                if isinstance(waiter, asyncio.Future):
                    await waiter
                else:
                    await waiter.wait()
            finally:
                self._parked = None
            queue = self._queue
            if not queue:
                return []  # woken by the close
        batch = list(queue)
        queue.clear()
        if self._space_waiters:
            self._free_space()
        return batch

    async def _commit(self, requests: list[Request]) -> None:
        """Apply a segment and commit it, answering every request in it.

        On a ConflictError the follower first catches up with the store. With
        ``on_conflict="rebase"`` the same requests are then applied again on top of what the
        other writer committed (a few times, with a short random backoff after the first);
        otherwise their callers get the ConflictError and their retries land on the
        caught-up log.
        """
        state = self._state
        for attempt in range(REBASE_ATTEMPTS + 1):
            if not requests:
                return
            plain = all(isinstance(request, Append) and request.plain for request in requests)
            # A segment of plain appends and self-checking requests (compactions) may go
            # again after another writer's commit: nothing its callers planned is assumed.
            replannable = plain or all(
                request.checks_itself or (isinstance(request, Append) and request.plain)
                for request in requests
            )
            # Plain appends have no precondition, so another writer being first is never their
            # caller's error: whatever `on_conflict` says, a segment of them that lost goes
            # again after what the other writer stored (to the store's rebasing commit when it
            # has one, which never conflicts). The first attempt costs what it always did.
            if plain and (state.rebasing or (attempt and state.can_rebase)):
                final = attempt == REBASE_ATTEMPTS
                if await commit_rebased(state, self.follower, requests, final=final):  # type: ignore[arg-type]
                    continue  # a key another writer took: caught up, so now it is known
                return
            may_retry = (state.rebase or replannable) and attempt < REBASE_ATTEMPTS
            retry = await commit_plain(
                state, self.follower, self._apply(requests), may_retry=may_retry
            )
            if retry is None:
                return
            requests = retry
            if attempt:
                # Writers that keep colliding take turns: a short random backoff, as in any
                # optimistic-concurrency retry loop.
                await anyio.sleep(random.uniform(0, min(0.01, 0.0005 * attempt)))

    def _apply(self, requests: list[Request]) -> Batch:
        """Apply ``requests`` in order to the published log; fail the invalid ones at once."""
        state = self._state
        base = log = state.published.log
        dropped: list[int] = []
        applied: list[tuple[Request, Any]] = []
        keyed: dict[str, tuple[Event, ...]] = {}  # keys this segment commits
        known: list[tuple[Request, Any]] = []
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
        return Batch(base, log, dropped, applied, rebuilt, keys, known)

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

    def close_streams(self) -> None:
        """Refuse whatever is still queued (every path out of ``open``: no caller is left
        waiting, an actor that never ran included)."""
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
        queue = self._queue
        while queue:
            queue.popleft().fail(closed_error())
        # Wakes callers still waiting for queue space: they find the session closing.
        self._free_space()
