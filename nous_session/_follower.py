"""The follower: how a session's actor reads its store between commits. It catches up with
commits other writers made (after a conflict, on :meth:`SessionActor.reload`, and on every
head a change feed announces, with ``follow=``) and runs an erasure; both are barriers, run
in the actor task, so the published Log changes only between batches. See docs/internals.md.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from contextlib import suppress
from functools import partial
from typing import Any, Final

import anyio
import anyio.abc

from nous_session._requests import Erase, Reload
from nous_session._state import SessionState, store_error
from nous_session.errors import CorruptRecordError, SessionDeletedError
from nous_session.event import Event, EventType
from nous_session.stores._watch import Watch, Watches
from nous_session.stores.base import ErasingStore, supports

__all__ = ["Follower", "erases"]

# A feed catch-up that could not read is tried again after this many seconds, doubling up
# to the maximum while reads keep failing.
CATCH_UP_RETRY_FIRST: Final = 0.05
CATCH_UP_RETRY_MAX: Final = 5.0


class Follower:
    """Catches one session's Log up with its store, and follows the store's change feed.

    Args:
        state: the session's shared state.
        enqueue: puts a request into the actor's queue, waiting for space (raises
            ``anyio.ClosedResourceError`` once the session is closing).
    """

    __slots__ = (
        "_delay",
        "_deleted",
        "_enqueue",
        "_feed",
        "_queued",
        "_retry",
        "_state",
        "_watch",
        "_watch_scope",
    )

    def __init__(
        self,
        state: SessionState,
        enqueue: Callable[[Reload], Awaitable[None]],
        deleted: Callable[[], None],
    ) -> None:
        self._state = state
        self._enqueue = enqueue
        self._deleted = deleted  # the session is gone from the store: the actor closes
        self._queued: Reload | None = None  # the feed's catch-up, while it waits in the queue
        self._retry: anyio.CancelScope | None = None  # a failed catch-up's retry, waiting
        self._delay = CATCH_UP_RETRY_FIRST
        self._watch_scope: anyio.CancelScope | None = None
        # An attached watch (see follow) and the feed it is attached to.
        self._feed: Watches[Any] | None = None
        self._watch: Watch | None = None

    def close(self) -> None:
        """Stop following: the watcher and any waiting retry end (and the engine, which holds
        this follower, is no longer held by it: no reference cycle is left to the collector)."""
        if self._watch_scope is not None:
            self._watch_scope.cancel()
        if self._retry is not None:
            self._retry.cancel()
        self._enqueue = _closed
        self._deleted = _nothing
        feed, watch = self._feed, self._watch
        self._feed = self._watch = None
        if feed is not None and watch is not None:
            feed.detach(watch)

    def deleted(self, error: SessionDeletedError) -> None:
        """The session was deleted from the store since this actor read it: what is queued is
        refused with ``error``, and the actor closes."""
        self._state.unfollowable = error
        self._deleted()

    async def reload(self, request: Reload | None) -> BaseException | None:
        """Catch up with what other writers committed after our count.

        When the store's horizon moved (another writer took a snapshot, dropping events this
        log may still hold, and whose absence changes what a later operation means), the
        whole session is read again instead, so the surface stays what a fresh fold of the
        stored log gives. So it is when an ``erasure`` event came (a store erased events this
        log holds, in this process or another): the erased form replaces them before the
        actor serves another read or plans another compaction. Returns the error when the
        store could not be read.
        """
        state = self._state
        if request is None or request.from_feed:
            self._queued = None
        log = state.published.log
        if (
            request is not None
            and request.from_feed
            and request.head is not None
            and request.head <= log.count
        ):
            request.resolve(log)  # a catch-up after a conflict already read this far
            return None
        try:
            stored = state.same_session(
                await state.store.read(state.session_id, since=log.count), log.count
            )
            if stored.horizon != log.horizon or erases(stored.events):
                whole = await state.store.read(state.session_id)
                log = state.adopt(state.same_session(whole, log.count))
                dropped = rebuilt = True
            else:
                log = log.extend(stored.events)  # decoded, hence validated, by the store
                if log.count != stored.count:
                    raise CorruptRecordError(
                        f"session {state.session_id!r}: the store says its count is"
                        f" {stored.count}, but its events end at seq {log.count - 1}"
                        " and no snapshot dropped any"
                        + (
                            " (rows are missing)"
                            if log.count < stored.count
                            else " (rows past its count)"
                        )
                    )
                state.keys.update(stored.keys)
                dropped = False
                rebuilt = any(event.op is not None for event in stored.events)
        except Exception as error:
            corrupt = isinstance(error, CorruptRecordError | SessionDeletedError)
            if isinstance(error, SessionDeletedError):
                self.deleted(error)
            if request is not None:
                # Its caller (or the retry below) hears of it: nothing to warn about here.
                state.logger.debug("nous_session.catch_up_failed", error=repr(error))
                request.fail(store_error(error))
                if request.from_feed and not corrupt:
                    self._retry_catch_up()
            # A record that cannot be read blocks every retry: the callers must hear it.
            return error if corrupt else None
        if request is not None and request.from_feed:
            self._delay = CATCH_UP_RETRY_FIRST
        if log is not state.published.log:
            state.republish(log, dropped=dropped, rebuilt=rebuilt)
        if request is not None:
            request.resolve(log)
        return None

    async def erase(self, request: Erase) -> None:
        """Erase in the store, then read the session again and publish it; answer the caller.

        A bad seq (past the store's count) fails the caller with ValueError and changes
        nothing. If the store erased but the session cannot be read again, the caller gets
        the StoreError and the published Log stays as it was until the next catch-up.
        """
        state = self._state
        store = state.store
        if not supports(store, ErasingStore):
            request.fail(
                TypeError(f"{type(store).__name__} cannot erase events (no ErasingStore.erase)")
            )
            return
        try:
            result = await store.erase(
                state.session_id,
                request.seqs,
                reason=request.reason,
                at=request.at,
                summaries=request.summaries,
            )
        except ValueError as error:
            request.fail(error)
            return
        except Exception as error:
            request.fail(store_error(error))
            return
        try:
            log = state.adopt(await state.store.read(state.session_id))
        except Exception as error:
            request.fail(store_error(error))
            return
        # Events changed in place: subscribers' positions stay valid (the seqs are the
        # same), and what a subscriber reads from now on is the erased form.
        state.republish(log, dropped=True, rebuilt=True)
        request.resolve(result)

    async def follow(self) -> None:
        """Follow the store's change feed from now on: through a watch that costs no task
        until the feed pushes it a head (none does while this actor is up to date, as when
        its commits are the only ones), when the store can attach one (SQLite); else in a
        task of its own (:meth:`watch`)."""
        state = self._state
        store: Any = state.store
        attach = getattr(store, "_attach_watch", None)
        if attach is None:
            await state.task_group.start(self.watch)
            return
        attached = await attach(state.session_id, partial(_holds, state), self._woken)
        if attached is not None:
            self._feed, self._watch = attached
            if state.closing:  # closed while it attached: close() found nothing to detach
                self.close()

    def _woken(self) -> None:
        """The feed pushed the attached watch its first head (on the actor's event loop):
        start the task that takes them."""
        if self._watch is None or self._state.closing:
            return
        with suppress(RuntimeError):  # the actor's task group has ended: nothing to follow
            self._state.task_group.start_soon(self._take_heads)

    async def _take_heads(self) -> None:
        """The attached watch's task: as :meth:`watch`, from the feed's heads."""
        feed, watch = self._feed, self._watch
        with anyio.CancelScope() as scope:
            self._watch_scope = scope
            if feed is None or watch is None or self._state.closing:
                return  # closed before this task ran
            try:
                while True:
                    for head in await feed.take(watch):
                        await self._on_head(head)
            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                pass  # the session is closing

    async def watch(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Turn the store's change feed into catch-up requests (at most one queued at a time)."""
        state = self._state
        with anyio.CancelScope() as scope:
            self._watch_scope = scope
            task_status.started()
            store: Any = state.store
            if getattr(store, "watch_takes_known", False):
                heads = store.watch(state.session_id, known=partial(_holds, state))
            else:
                heads = store.watch(state.session_id)
            try:
                async for head in heads:
                    await self._on_head(head)
            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                pass  # the session is closing
            finally:
                with anyio.CancelScope(shield=True):
                    await heads.aclose()

    async def _on_head(self, head: int) -> None:
        """A head the feed announced: catch up with it unless the log holds it already."""
        if head == -1 or head > self._state.published.log.count:
            await self._catch_up(head)

    async def _catch_up(self, head: int) -> None:
        """Queue a feed catch-up to ``head`` (-1: read whatever there is), unless one waits.

        Raises:
            anyio.ClosedResourceError: the session is closing.
        """
        queued = self._queued
        if queued is not None:
            # The catch-up that waits answers for this head too: it must read at least this
            # far. It skips its read when its own head is read already (a catch-up in flight
            # may have read past it), so a head left at an older value would let this commit
            # go unread until the next one (forever, after a writer's last commit). A
            # reconnect (-1) makes it read in any case: the lost listener may have missed
            # commits.
            if queued.head is not None:
                queued.head = None if head == -1 else max(queued.head, head)
            return
        # -1 (reconnected) must always read; a head may be read already.
        request = self._queued = Reload(None if head == -1 else head, from_feed=True)
        try:
            await self._enqueue(request)
        except BaseException:
            self._queued = None
            raise

    def _retry_catch_up(self) -> None:
        """A feed catch-up could not read (the store failed for a moment, say): read again
        after a backoff. Otherwise the commits it stood for would stay unread until the next
        notification, which never comes after a writer's last commit."""
        state = self._state
        if state.closing or self._retry is not None:
            return
        scope = self._retry = anyio.CancelScope()
        delay = self._delay
        self._delay = min(delay * 2, CATCH_UP_RETRY_MAX)
        state.task_group.start_soon(self._catch_up_later, scope, delay)

    async def _catch_up_later(self, scope: anyio.CancelScope, delay: float) -> None:
        with scope:
            try:
                await anyio.sleep(delay)
            finally:
                self._retry = None
            with suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):  # closing
                await self._catch_up(-1)


def _holds(state: SessionState) -> tuple[int, int, bool, str | None]:
    """What the session's log holds, as a feed's ``known`` asks (from the feed's thread): the
    published log is replaced whole on each commit, so its count and horizon are read as
    one; ``committing`` first: a commit that ends meanwhile is published by now, or the head
    is pushed; and the session's identity, once the actor knows it (it changes only from
    None to the session's: another would be a delete, and the actor closes)."""
    committing = state.committing
    log = state.published.log
    return log.count, log.horizon, committing, state.uid


def erases(events: Sequence[Event]) -> bool:
    """Whether ``events`` (another writer's, read from the store) hold an ``erasure`` event:
    the events it names changed in place, and a log holding them must be read again whole."""
    return any(event.type is EventType.ERASURE for event in events)


async def _closed(request: Reload) -> None:
    """What queueing a catch-up does once the session is closing (as the engine would)."""
    raise anyio.ClosedResourceError


def _nothing() -> None:
    """What the session's deletion does once the actor is closing: nothing more."""
