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
"""

from __future__ import annotations

import random
from typing import Any, Final

import anyio
import anyio.abc

from nous_session._commits import Batch, commit_plain, commit_rebased
from nous_session._follower import Follower
from nous_session._requests import Append, Applied, Reload, Request
from nous_session._state import SessionState, closed_error
from nous_session.errors import ConflictError, InvalidEventError
from nous_session.event import Event

__all__ = ["Engine"]

# With on_conflict="rebase", how many times a segment is re-applied after a conflict.
REBASE_ATTEMPTS: Final = 32


class Engine:
    """The queue and the loop of one session's actor (see the module docstring).

    Args:
        state: the session's shared state.
        queue_size: how many requests may wait before callers wait too.
    """

    __slots__ = (
        "_admit",
        "_parked",
        "_receive",
        "_send",
        "_space",
        "_space_waiters",
        "_state",
        "follower",
    )

    def __init__(self, state: SessionState, queue_size: int) -> None:
        self._state = state
        self._send, self._receive = anyio.create_memory_object_stream[Request](queue_size)
        self._space: anyio.Event | None = None  # set when queue space may have freed, if waited
        self._space_waiters = 0  # callers waiting for queue space
        self._admit = 0  # while closing: queued requests still to apply
        self._parked = False  # the actor is waiting in receive()
        self.follower = Follower(state, self.enqueue)

    # Calls ------------------------------------------------------------------------------------

    async def call(self, request: Request) -> Any:
        """Queue ``request`` and return its result (raise its error).

        A caller cancelled while waiting for queue space has sent nothing: the request goes
        into the queue only by ``send_nowait``, which either queues it or does not, with no
        await in between. Once queued it is applied and committed whatever happens to the
        caller.

        Raises:
            SessionClosedError: the session is closed.
        """
        if self._state.closing:
            raise closed_error()
        try:
            self._send.send_nowait(request)  # the usual path: no extra coroutine frame
        except anyio.WouldBlock:
            await self._queue(request)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            raise closed_error() from None
        await request.done.wait()  # Request.outcome, inlined: this is every call's path
        if request.error is not None:
            raise request.error
        return request.result

    async def enqueue(self, request: Reload) -> None:
        """Queue one of the follower's catch-ups without waiting for its answer.

        Raises:
            anyio.ClosedResourceError: the session is closing.
        """
        try:
            self._send.send_nowait(request)
        except anyio.WouldBlock:
            await self._send.send(request)

    async def _queue(self, request: Request) -> None:
        while True:
            try:
                self._send.send_nowait(request)
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
                raise closed_error() from None
            else:
                return

    def queue_depth(self) -> int:
        """Requests accepted into the queue and not yet taken."""
        return self._receive.statistics().current_buffer_used

    # The loop ---------------------------------------------------------------------------------

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """The actor task: take a batch, commit it segment by segment, until closed."""
        task_status.started()
        batch: list[Request] = []
        try:
            while True:
                batch = await self._take()
                if not batch:
                    break
                segment: list[Request] = []
                for request in batch:
                    if request.barrier:
                        await self._commit(segment)
                        segment = []
                        if isinstance(request, Reload):
                            await self.follower.reload(request)
                        else:
                            await request.run_barrier(self._state)  # an erasure
                    elif request.starts_commit and segment:
                        await self._commit(segment)
                        segment = [request]
                    else:
                        segment.append(request)
                await self._commit(segment)
                batch = []
        finally:
            # Whatever ends the loop (closing, cancellation, a bug), nobody may hang.
            for request in batch:
                if not request.done.is_set():
                    request.fail(closed_error())
            self._refuse_the_rest()
            state = self._state
            state.closing = True
            state.waker_scope.cancel()
            state.published.close()

    async def _take(self) -> list[Request]:
        """The next batch: every request waiting in the queue. Empty when the actor must stop."""
        receive = self._receive
        if not (self._state.closing and self._admit == 0):
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
            if not self._state.closing:
                return batch
            # Closing: the first `_admit` requests were queued before the close; any later
            # ones came from callers that were still waiting for space.
            admitted, late = batch[: self._admit], batch[self._admit :]
            self._admit -= len(admitted)
            for request in late:
                request.fail(closed_error())
            if admitted:
                return admitted
        return []

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
            if state.rebasing and all(
                isinstance(request, Append) and request.plain for request in requests
            ):
                final = attempt == REBASE_ATTEMPTS
                if await commit_rebased(state, self.follower, requests, final=final):  # type: ignore[arg-type]
                    continue  # a key another writer took: caught up, so now it is known
                return
            may_retry = state.rebase and attempt < REBASE_ATTEMPTS
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
        # Exactly the requests whose send has completed are still applied: those in the buffer,
        # and the one a send may have handed straight to the actor parked in receive() (a
        # memory stream gives an item to a waiting receiver without buffering it).
        self._admit = self._receive.statistics().current_buffer_used + int(self._parked)
        self._send.close()
        self._free_space()  # waiting callers now find the queue closed
        if state.compaction is not None:
            state.compaction.close()
        self.follower.close()

    def close_streams(self) -> None:
        """Close both ends of the queue (every path out of ``open``: none is left open)."""
        self._send.close()
        self._receive.close()

    def _free_space(self) -> None:
        """Wake the callers waiting for queue space (each tries again)."""
        space, self._space = self._space, None
        if space is not None:
            space.set()

    def _refuse_the_rest(self) -> None:
        receive = self._receive
        while True:
            try:
                receive.receive_nowait().fail(closed_error())
            except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
                break
        # Wakes callers still waiting for queue space: their send raises BrokenResourceError.
        receive.close()
        self._free_space()
