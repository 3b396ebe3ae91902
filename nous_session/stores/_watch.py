"""The watch registry both change feeds share (the SQLite poller and the PostgreSQL
listener): one :class:`Watch` per watching task, the heads a feed's thread pushes to it, and
whether its owner holds a head already (see docs/internals.md, "Stores")."""

from __future__ import annotations

import threading
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from contextvars import Context, copy_context
from functools import partial
from typing import Final, Generic, TypeVar

import anyio

from nous_session._logging import get_logger
from nous_session._loops import current_library, scheduler

__all__ = [
    "ASK_AGAIN",
    "GONE",
    "HELD",
    "HOLD_AT_MOST",
    "UNSURE",
    "WAKE",
    "Known",
    "Watch",
    "Watches",
    "closing",
]

_logger = get_logger("nous_session.stores")

# How soon a head that came while its watcher's own commit was in flight is looked at again
# (the commit has usually answered by then: the head is its own, and wakes nobody).
ASK_AGAIN: Final = 0.005
# The longest a head is held back for its owner's commits: an owner whose commits keep
# failing without reading the store (a store error each time) would otherwise hold a head
# another writer's commit made for as long as it keeps trying.
HOLD_AT_MOST: Final = 0.25

Known = Callable[[], tuple[int, int, bool] | tuple[int, int, bool, str | None]]
"""What a watcher holds already, read from the feed's thread: its (count, horizon), whether a
commit of its own is in flight (then a head it does not hold yet may be that commit's), and,
optionally, the identity (``uid``) of the session it holds, which a feed that reads identities
(SQLite's) compares with the one it reads."""

HELD, UNSURE, WAKE, GONE = 0, 1, 2, 3
"""A :meth:`Watch.verdict`: the owner holds the head, cannot say yet, must be woken, or must
read the session again whatever it holds (the feed then pushes ``-1``): the store holds no
event of a session the owner holds events of, so it was deleted."""


class Watch:
    """One session's watch: the heads the thread has for it, and how to wake its task."""

    __slots__ = ("event", "first", "heads", "known", "schedule", "session_id", "wake")

    def __init__(
        self,
        session_id: str,
        known: Known | None = None,
        wake: Callable[[], None] | None = None,
    ) -> None:
        self.session_id = session_id
        self.schedule = scheduler()
        self.heads: list[int] = []  # what the thread dispatched, not yet taken; -1 = read all
        self.event: anyio.Event | None = None  # set by the thread when it adds heads
        # What the watcher holds: a head at or below its count is not pushed.
        self.known = known
        # No head offered yet (a feed that reads its first head itself, as SQLite's does,
        # notes it): see verdict.
        self.first = True
        # An attached watch's (see Watches.attach): called on the watcher's event loop when
        # the first head comes, to start the task that takes them.
        self.wake = wake

    def verdict(
        self,
        count: int,
        horizon: int | None = None,
        uid: str | None = None,
        *,
        first: bool = False,
    ) -> int:
        """Whether the owner holds the head ``count`` (with ``horizon`` and the session's
        identity ``uid``, when the feed knows them) already (:data:`HELD`: waking it would
        only make it compare and sleep again; an actor's own commit is the common case),
        cannot say yet (:data:`UNSURE`: its own commit is in flight, and may be this head),
        must be woken (:data:`WAKE`), or must read whatever there is (:data:`GONE`): the
        owner holds events of a session with another identity than ``uid``, or the head is
        0 and the owner holds events, or, ``first`` (the first head a feed read for this
        watch: after the owner read the session), it is below what the owner holds. Either
        way the session was deleted (maybe made again), or the feed read it before a commit
        of the owner's landed, which costs one short read. A ``known`` that raises counts as
        none."""
        known = self.known
        if known is None:
            return WAKE
        try:
            holds = known()
            held, held_horizon, committing = holds[0], holds[1], holds[2]
            held_uid = holds[3] if uid is not None and len(holds) > 3 else None
        except Exception as error:  # the owner's bug: it is woken, as with no known
            _logger.debug("nous_session.watch_known_failed", error=repr(error))
            return WAKE
        if held_uid is not None and held_uid != uid and held > 0:
            return GONE  # another session under the name: the owner's was deleted
        if held > count and (count == 0 or first):
            return GONE  # a count goes down only when its session is deleted
        if held >= count and (horizon is None or held_horizon == horizon):
            return HELD
        return UNSURE if committing else WAKE

    async def take(self, lock: threading.Lock) -> list[int]:
        """The heads the thread has pushed since the last take, waiting while there are none
        (``lock``: the one the thread pushes under)."""
        while True:
            with lock:
                heads, self.heads = self.heads, []
                if heads:
                    return heads
                event = self.event = anyio.Event()
            await event.wait()

    def push(self, head: int) -> None:
        """Add ``head`` and wake the watching task (called with the feed's lock held)."""
        self.heads.append(head)
        event, self.event = self.event, None
        wake = event.set if event is not None else self.wake
        self.wake = None
        if wake is not None:
            with suppress(RuntimeError):  # that event loop is gone, and its watch with it
                self.schedule(wake)


Held = TypeVar("Held")


class Watches(Generic[Held]):
    """A feed's watches by session, under the lock its thread pushes under, and the heads it
    holds back (``Held``: what it keeps for each) while their owners' commits are in flight."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watches: dict[str, list[Watch]] = {}
        self._unsure: dict[Watch, Held] = {}
        self.pushes = 0  # heads pushed to a watch (for tests)

    @property
    def watching(self) -> int:
        """How many watches are open."""
        with self._lock:
            return sum(len(watches) for watches in self._watches.values())

    async def watch(self, session_id: str, known: Known | None = None) -> AsyncGenerator[int, None]:
        """Yield the session's heads as the feed's thread pushes them (what comes first, and
        after a reconnection, is the feed's own: see its ``_joined``); with ``known``, only
        the heads past what it says the watcher holds (its own commits' heads wake nobody)."""
        watch = Watch(session_id, known)
        with self._lock:
            self._add(watch)
            self._joined(watch)
        try:
            while True:
                for head in await watch.take(self._lock):
                    yield head
        finally:
            with self._lock:
                if self._remove(watch):
                    self._left(session_id)

    def attach(self, session_id: str, known: Known, wake: Callable[[], None]) -> Watch:
        """A watch with no task: the feed serves it as :meth:`watch` does, and ``wake`` is
        called on this event loop when the first head is pushed to it (a watcher that is up
        to date costs no task until then); the task it starts takes the heads with
        :meth:`take`. :meth:`detach` ends it."""
        watch = Watch(session_id, known, partial(_library_context().run, wake))
        with self._lock:
            self._add(watch)
            self._joined(watch)
        return watch

    async def take(self, watch: Watch) -> list[int]:
        """The heads pushed to the attached ``watch`` since the last take, waiting while there
        are none."""
        return await watch.take(self._lock)

    def detach(self, watch: Watch) -> None:
        """Forget the attached ``watch`` (again: nothing)."""
        with self._lock:
            watch.wake = None
            if watch in self._watches.get(watch.session_id, ()) and self._remove(watch):
                self._left(watch.session_id)

    def _joined(self, watch: Watch) -> None:
        """``watch`` was just added (the lock held): have the thread serve it."""
        raise NotImplementedError

    def _left(self, session_id: str) -> None:
        """The session's last watch was just removed (the lock held)."""

    def _add(self, watch: Watch) -> None:
        """Register ``watch`` (the lock held)."""
        self._watches.setdefault(watch.session_id, []).append(watch)

    def _remove(self, watch: Watch) -> bool:
        """Unregister ``watch`` (the lock held); True when its session has no watch left."""
        watches = self._watches[watch.session_id]
        watches.remove(watch)
        self._unsure.pop(watch, None)
        if watches:
            return False
        del self._watches[watch.session_id]
        return True


@asynccontextmanager
async def closing(heads: AsyncGenerator[int, None]) -> AsyncIterator[AsyncGenerator[int, None]]:
    """``heads`` (a feed's :meth:`Watches.watch`), closed on the way out even when the
    caller is cancelled, so the feed forgets the watch then and not when it is collected."""
    try:
        yield heads
    finally:
        with anyio.CancelScope(shield=True):
            await heads.aclose()


def _library_context() -> Context:
    """This task's context, naming its event loop library for sniffio: a callback the loop
    runs outside any task has no context of its own, and on asyncio sniffio finds the
    library only through the current task (there is none in a callback), so anyio could not
    start a task from it."""
    context = copy_context()
    try:
        import sniffio
    except ImportError:  # anyio then knows asyncio by its running loop
        return context
    context.run(sniffio.current_async_library_cvar.set, current_library())
    return context
