"""Many sessions of one store, opened on first use and closed when idle.

:class:`Sessions` is what a bot with thousands of users or a web server needs: it owns a task
group, opens a :class:`~nous_session.actor.SessionActor` the first time a session is asked for,
and closes actors that sat idle for a while or that fall beyond a count (least recently used
first). All its actors share its store, so a SQLite store's writer group-commits across them.

:class:`SessionsPortal` runs a :class:`Sessions` on an event loop of its own, in a thread, so
that synchronous code and code on other event loops (a framework that builds sessions
synchronously, ``asyncio.run`` in another thread) can use the same sessions::

    async with Sessions("sqlite:///bot.sqlite3", idle_timeout=600) as sessions:
        session = await sessions.get("user-42")
        await session.add_message(Message.user("hi"))

    with SessionsPortal("sqlite:///bot.sqlite3") as portal:      # from plain threads
        portal.call("user-42", lambda s: s.add_message(Message.user("hi")))
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import threading
import weakref
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import Future
from contextlib import asynccontextmanager
from types import TracebackType
from typing import Any, Literal, TypeVar

import anyio
import anyio.abc
import anyio.from_thread
import attrs

from nous_session._logging import get_logger
from nous_session.actor import SessionActor
from nous_session.compaction import CompactionPolicy
from nous_session.errors import SessionClosedError
from nous_session.stores import open_store
from nous_session.stores.base import Store, check_session_id

__all__ = ["Sessions", "SessionsPortal", "SessionsStatistics"]

T = TypeVar("T")

_logger = get_logger("nous_session.registry")


@attrs.frozen
class SessionsStatistics:
    """Counters and gauges of a :class:`Sessions` registry.

    Attributes:
        open: actors open now.
        leased: actors held open by :meth:`Sessions.use` blocks now.
        opened: actors opened since the registry started.
        closed_idle: actors closed because they sat idle for ``idle_timeout``.
        closed_lru: actors closed because more than ``max_open`` were open.
    """

    open: int
    leased: int
    opened: int
    closed_idle: int
    closed_lru: int


@attrs.define(eq=False)
class _Entry:
    """One open actor: who holds it, when it was last used, how to close it."""

    actor: SessionActor
    close: anyio.Event = attrs.field(factory=anyio.Event)  # set: the actor is to close
    gone: anyio.Event = attrs.field(factory=anyio.Event)  # set: it closed and left the registry
    leases: int = 0
    used_at: float = 0.0
    requests: int = 0  # the actor's request counter when last looked at: a change is use


class Sessions:
    """A registry of the sessions of one store: ``await sessions.get(id)`` opens the session's
    actor on first use and returns it; idle actors close by themselves.

    Use it as an async context manager; leaving the block closes every actor (their queued
    requests are committed first) and then the store, if the registry opened it from a URL.

    An actor counts as idle when, for ``idle_timeout`` seconds, nobody called :meth:`get`
    for it, it took no request, it had no subscriber and no :meth:`use` block held it. When
    more than ``max_open`` actors are open, the least recently used ones that no :meth:`use`
    block holds are closed at once. An actor that was closed this way raises
    :class:`~nous_session.errors.SessionClosedError` to a caller that kept it: ``get`` it
    again, or hold it with ``async with sessions.use(id)`` across long waits.
    """

    def __init__(
        self,
        store: Store | str,
        *,
        compaction: CompactionPolicy | None = None,
        idle_timeout: float = 300.0,
        max_open: int = 10_000,
        on_conflict: Literal["raise", "rebase"] = "raise",
        queue_size: int = 1024,
        follow: bool | None = None,
    ) -> None:
        """Describe the registry; nothing is opened before ``async with``.

        Args:
            store: the store every session lives in: a Store (the caller closes it) or a URL
                for :func:`~nous_session.stores.open_store` (the registry closes it).
            compaction: the compaction policy of every actor; None never compacts.
            idle_timeout: seconds after which an unused actor closes (> 0).
            max_open: how many actors may be open before the least recently used close (>= 1).
            on_conflict: as for :meth:`SessionActor.open`; ``"rebase"`` when other processes
                write to the same sessions.
            queue_size: as for :meth:`SessionActor.open`.
            follow: as for :meth:`SessionActor.open`: None follows other processes' commits
                where the store has a change feed; False never does (an adapter that checks
                and commits against the count it read wants that).

        Raises:
            ValueError: a bad argument.
        """
        if isinstance(store, str):
            self._owned = True
            self._store = open_store(store)
        elif all(callable(getattr(store, name, None)) for name in ("load", "commit", "aclose")):
            self._owned = False
            self._store = store
        else:
            raise ValueError(f"store must be a Store or a store URL, got {store!r}")
        if (
            not isinstance(idle_timeout, int | float)
            or isinstance(idle_timeout, bool)
            or not idle_timeout > 0
        ):
            raise ValueError(f"idle_timeout must be a number > 0, got {idle_timeout!r}")
        if not isinstance(max_open, int) or isinstance(max_open, bool) or max_open < 1:
            raise ValueError(f"max_open must be an int >= 1, got {max_open!r}")
        if on_conflict not in ("raise", "rebase"):
            raise ValueError(f'on_conflict must be "raise" or "rebase", got {on_conflict!r}')
        if compaction is not None and not isinstance(compaction, CompactionPolicy):
            raise ValueError(f"compaction must be a CompactionPolicy, got {compaction!r}")
        if not isinstance(queue_size, int) or isinstance(queue_size, bool) or queue_size < 1:
            raise ValueError(f"queue_size must be an int >= 1, got {queue_size!r}")
        self._compaction = compaction
        self._idle_timeout = float(idle_timeout)
        self._max_open = max_open
        self._on_conflict: Literal["raise", "rebase"] = on_conflict
        self._queue_size = queue_size
        if follow not in (None, True, False):
            raise ValueError(f"follow must be None, True or False, got {follow!r}")
        self._follow = follow
        # Least recently used first: get() and use() move an entry to the end.
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._opening: dict[str, anyio.Event] = {}
        self._task_group: anyio.abc.TaskGroup | None = None
        self._wake_reaper: anyio.Event  # made on entering: an Event belongs to an event loop
        self._state: Literal["new", "open", "closed"] = "new"
        self._opened = 0
        self._closed_idle = 0
        self._closed_lru = 0

    # Opening and closing ----------------------------------------------------------------------

    async def __aenter__(self) -> Sessions:
        if self._state != "new":
            raise RuntimeError("a Sessions registry can be entered once")
        self._state = "open"
        self._wake_reaper = anyio.Event()
        self._exit_stack = self._run()
        try:
            await self._exit_stack.__aenter__()
        except BaseException:
            self._state = "closed"
            if self._owned:
                await self._store.aclose()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        return await self._exit_stack.__aexit__(exc_type, exc, tb)

    async def aclose(self) -> None:
        """Close every actor (queued requests are committed first), then the owned store.

        Call it instead of leaving the ``async with`` block only where a block cannot be used.
        """
        await self.__aexit__(None, None, None)

    @asynccontextmanager
    async def _run(self) -> AsyncIterator[None]:
        try:
            async with anyio.create_task_group() as task_group:
                self._task_group = task_group
                task_group.start_soon(self._reap)
                try:
                    yield
                finally:
                    # Every actor leaves its block (committing what is queued); the task group
                    # waits for them and for the reaper, which sees the state and returns.
                    self._state = "closed"
                    for entry in self._entries.values():
                        entry.close.set()
                    self._wake_reaper.set()
        finally:
            self._task_group = None
            if self._owned:
                await self._store.aclose()

    # Getting sessions -------------------------------------------------------------------------

    async def get(self, session_id: str) -> SessionActor:
        """The session's actor, opened now if it is not open.

        Several tasks asking for the same closed session at once open it once.

        Raises:
            ValueError: a bad session id.
            StoreError: the session could not be loaded.
            SessionClosedError: the registry is closed (or not entered yet).
        """
        entry = self._entries.get(session_id)
        if entry is not None and not entry.close.is_set():
            self._entries.move_to_end(session_id)
            entry.used_at = anyio.current_time()
            return entry.actor
        return (await self._open(session_id)).actor

    @asynccontextmanager
    async def use(self, session_id: str) -> AsyncIterator[SessionActor]:
        """Hold the session's actor open for the block: neither idleness nor ``max_open``
        closes it before the block ends.

        Raises:
            ValueError, StoreError, SessionClosedError: as :meth:`get`.
        """
        entry = self._entries.get(session_id)
        if entry is None or entry.close.is_set():
            entry = await self._open(session_id)
        self._entries.move_to_end(session_id)
        entry.leases += 1
        try:
            yield entry.actor
        finally:
            entry.leases -= 1
            entry.used_at = anyio.current_time()
            if len(self._entries) > self._max_open:
                self._evict()

    async def _open(self, session_id: str) -> _Entry:
        try:
            check_session_id(session_id)
        except ValueError as error:
            raise ValueError(f"bad session_id: {error}") from None
        while True:
            if self._state != "open" or self._task_group is None:
                raise SessionClosedError(f"the Sessions registry is {self._state}")
            entry = self._entries.get(session_id)
            if entry is not None and not entry.close.is_set():
                entry.used_at = anyio.current_time()
                return entry
            opening = self._opening.get(session_id)
            if opening is None and entry is None:
                break
            # Another task is opening it, or its old actor is still closing (one actor per
            # session at a time): wait for that, then look again.
            await (opening if opening is not None else entry.gone).wait()  # type: ignore[union-attr]
        done = self._opening[session_id] = anyio.Event()
        try:
            entry = await self._task_group.start(self._host, session_id)
        finally:
            del self._opening[session_id]
            done.set()
        self._opened += 1
        # On return at most max_open actors are open (or held): wait for those closing.
        for closing in self._evict(keep=entry):
            await closing.gone.wait()
        return entry  # type: ignore[no-any-return]

    async def _host(self, session_id: str, *, task_status: anyio.abc.TaskStatus[_Entry]) -> None:
        """Run one actor until its entry is told to close.

        A failure to open reaches the caller of ``start`` (and :meth:`get`); once the actor
        runs, an error on its way out is logged, never raised into the registry's task group,
        where it would close every other session.
        """
        entry: _Entry | None = None
        try:
            async with SessionActor.open(
                session_id=session_id,
                store=self._store,
                compaction=self._compaction,
                queue_size=self._queue_size,
                on_conflict=self._on_conflict,
                follow=self._follow,
            ) as actor:
                entry = _Entry(actor, used_at=anyio.current_time())
                self._entries[session_id] = entry
                task_status.started(entry)
                await entry.close.wait()
        except Exception:
            if entry is None:
                raise
            _logger.exception("nous_session.registry_actor_failed", session_id=session_id)
        finally:
            if entry is not None:
                if self._entries.get(session_id) is entry:
                    del self._entries[session_id]
                entry.gone.set()

    # Closing idle actors ----------------------------------------------------------------------

    def _evict(self, keep: _Entry | None = None) -> list[_Entry]:
        """Close least recently used actors that nothing holds (nor is ``keep``, the one just
        opened for a caller) until ``max_open`` are open; return the entries told to close."""
        entries = [entry for entry in self._entries.values() if not entry.close.is_set()]
        excess = len(entries) - self._max_open  # those already closing do not count
        closing = []
        for entry in entries:
            if excess <= 0:
                break
            if entry.leases or entry is keep:
                continue
            entry.close.set()
            closing.append(entry)
            self._closed_lru += 1
            excess -= 1
        return closing

    def _busy(self, entry: _Entry, now: float) -> bool:
        stats = entry.actor.statistics()
        if stats.requests != entry.requests:
            entry.requests = stats.requests
            entry.used_at = now
        return bool(
            entry.leases
            or stats.subscribers
            or stats.queue_depth
            or stats.compaction_in_flight
            or now - entry.used_at < self._idle_timeout
        )

    async def _reap(self) -> None:
        """Close idle actors, looking again at half the idle timeout at the latest."""
        while self._state == "open":
            now = anyio.current_time()
            for entry in list(self._entries.values()):
                if not entry.close.is_set() and not self._busy(entry, now):
                    entry.close.set()
                    self._closed_idle += 1
            with anyio.move_on_after(self._idle_timeout / 2):
                await self._wake_reaper.wait()

    # Reading ----------------------------------------------------------------------------------

    @property
    def store(self) -> Store:
        """The store every session of this registry lives in."""
        return self._store

    def __contains__(self, session_id: object) -> bool:
        """Whether the session's actor is open now."""
        entry = self._entries.get(session_id) if isinstance(session_id, str) else None
        return entry is not None and not entry.close.is_set()

    def statistics(self) -> SessionsStatistics:
        """Counters and gauges; see :class:`SessionsStatistics`."""
        open_entries = [e for e in self._entries.values() if not e.close.is_set()]
        return SessionsStatistics(
            open=len(open_entries),
            leased=sum(1 for e in open_entries if e.leases),
            opened=self._opened,
            closed_idle=self._closed_idle,
            closed_lru=self._closed_lru,
        )

    def __repr__(self) -> str:
        return f"<Sessions {self._state} open={len(self._entries)} store={self._store!r}>"


class SessionsPortal:
    """A :class:`Sessions` registry running on an event loop of its own, in a daemon thread,
    usable from synchronous code and from any event loop (asyncio or trio) in any thread.

    A framework that builds its sessions synchronously, or runs each turn under a fresh
    ``asyncio.run`` in a worker thread, cannot keep an actor on its own loop: every call goes
    to the portal's loop instead, where the actors live, and its result comes back. Calls
    from the portal's own thread run directly.

    Close it with :meth:`close` or a ``with`` block: its actors close (queued requests are
    committed first), then the owned store. A portal still open when the interpreter exits is
    closed then.
    """

    def __init__(
        self,
        store: Store | str,
        *,
        backend: Literal["asyncio", "trio"] = "asyncio",
        **options: Any,
    ) -> None:
        """Start the portal's thread and its registry.

        Args:
            store: as for :class:`Sessions`.
            backend: the event loop the actors run on.
            options: the other arguments of :class:`Sessions` (``compaction``,
                ``idle_timeout``, ``max_open``, ``on_conflict``, ``queue_size``).

        Raises:
            ValueError: a bad argument.
        """
        if backend not in ("asyncio", "trio"):
            raise ValueError(f'backend must be "asyncio" or "trio", got {backend!r}')
        self._sessions = Sessions(store, **options)
        self._portal: anyio.from_thread.BlockingPortal | None = None
        self._ready = threading.Event()
        self._lock = threading.Lock()
        self._closed = False
        self._failure: BaseException | None = None
        self._thread_id: int | None = None
        self._thread = threading.Thread(
            target=self._main_thread, args=(backend,), name="nous_session-portal", daemon=True
        )
        self._thread.start()
        self._ready.wait()
        if self._failure is not None:
            raise self._failure
        _open_portals.add(self)

    def _main_thread(self, backend: str) -> None:
        try:
            anyio.run(self._main, backend=backend)
        except BaseException as error:  # reported to the constructor or logged: a thread's end
            if not self._ready.is_set():
                self._failure = error
            else:
                _logger.exception("nous_session.portal_failed")
        finally:
            self._ready.set()

    async def _main(self) -> None:
        async with anyio.from_thread.BlockingPortal() as portal, self._sessions:
            self._portal = portal
            self._thread_id = threading.get_ident()
            self._ready.set()
            await portal.sleep_until_stopped()

    async def _invoke(self, session_id: str, fn: Callable[[SessionActor], Awaitable[T]]) -> T:
        # Held for the call: neither idleness nor max_open closes the actor under it.
        async with self._sessions.use(session_id) as actor:
            return await fn(actor)

    def _running(self) -> anyio.from_thread.BlockingPortal:
        portal = self._portal
        if self._closed or portal is None:
            raise SessionClosedError("the SessionsPortal is closed")
        return portal

    def call(self, session_id: str, fn: Callable[[SessionActor], Awaitable[T]]) -> T:
        """Run ``await fn(actor)`` on the portal's loop with the session's actor, and wait.

        For synchronous code (not the portal's own thread). ``fn``'s outcome is the call's: its
        result is returned, its exception raised here.

        Raises:
            SessionClosedError: the portal is closed.
            RuntimeError: called from the portal's own event loop (use :meth:`acall`).
        """
        return self._running().call(self._invoke, session_id, fn)

    def start(self, session_id: str, fn: Callable[[SessionActor], Awaitable[T]]) -> Future[T]:
        """Like :meth:`call`, without waiting: a future of the outcome.

        Raises:
            SessionClosedError: the portal is closed.
        """
        return self._running().start_task_soon(self._invoke, session_id, fn)

    async def acall(self, session_id: str, fn: Callable[[SessionActor], Awaitable[T]]) -> T:
        """Run ``await fn(actor)`` on the portal's loop with the session's actor, from any event
        loop, without blocking it.

        Cancelling the caller does not cancel the call: it completes on the portal's loop,
        with the outcome a :class:`SessionActor` call whose caller was cancelled would have
        (a request already queued commits); use idempotency keys to retry safely.

        Raises:
            SessionClosedError: the portal is closed.
        """
        portal = self._running()
        if threading.get_ident() == self._thread_id:
            return await self._invoke(session_id, fn)
        future = portal.start_task_soon(self._invoke, session_id, fn)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is not None:
            # On asyncio: woken by the future's callback, no thread spent waiting.
            return await asyncio.shield(asyncio.wrap_future(future, loop=loop))
        return await anyio.to_thread.run_sync(future.result, abandon_on_cancel=True)

    def is_own_thread(self) -> bool:
        """Whether the calling thread is the portal's own (where :meth:`call` would wait on
        itself, and :meth:`acall` runs directly)."""
        return threading.get_ident() == self._thread_id

    def close(self) -> None:
        """Close the registry (its actors, then an owned store) and stop the thread.

        Idempotent. Calls that are running complete first; later calls raise
        :class:`SessionClosedError`.

        Raises:
            RuntimeError: called from the portal's own thread.
        """
        if threading.get_ident() == self._thread_id:
            raise RuntimeError("a SessionsPortal cannot be closed from its own thread")
        with self._lock:
            if self._closed:
                return
            self._closed = True
        _open_portals.discard(self)
        portal = self._portal
        if portal is not None and self._thread.is_alive():
            with contextlib.suppress(RuntimeError):  # it stopped already (its loop ended)
                portal.call(portal.stop)
        self._thread.join()

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self._closed

    def __enter__(self) -> SessionsPortal:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<SessionsPortal {state} store={self._sessions.store!r}>"


_open_portals: weakref.WeakSet[SessionsPortal] = weakref.WeakSet()


@atexit.register
def _close_portals() -> None:
    """Close the portals still open when the interpreter exits: their actors commit what is
    queued and their stores close, instead of a daemon thread dying mid-write."""
    for portal in list(_open_portals):
        try:
            portal.close()
        except Exception:  # exiting anyway: say so and close the others
            _logger.exception("nous_session.portal_close_failed")
