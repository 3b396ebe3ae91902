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

The registry's guarantees (``tests/actor/test_registry_model.py`` checks them against a model):

* **No actor is closed under its caller.** A session's entry, with a lease for the caller,
  exists from the moment the session is asked for, before its actor has opened; ``get()``
  returns an open actor and ``use()`` holds it for its block. Neither idleness nor
  ``max_open`` closes a held actor: when every open actor is held, the registry stays above
  ``max_open`` by those (and by at most the one a ``get()`` just returned).
* **Closing ends, in bounded time.** Every actor is told to close, those still opening too
  (each commits what is queued first); callers that have no actor yet get
  :class:`~nous_session.errors.SessionClosedError`.
* **An open costs O(1)** whatever the number open: idle, unleased actors wait in
  least-recently-used order and eviction takes the front; statistics are counters.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import inspect
import threading
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from concurrent.futures import Future
from contextlib import asynccontextmanager
from typing import Any, Literal, TypeAlias, TypeVar, overload

import anyio
import anyio.abc
import anyio.from_thread
import attrs

from nous_session._logging import get_logger
from nous_session._loops import current_clock
from nous_session._registry_entries import Entries, Entry
from nous_session.actor import SessionActor, check_options, host
from nous_session.compaction import CompactionPolicy
from nous_session.errors import SessionClosedError
from nous_session.event import MAX_EVENT_SIZE
from nous_session.metadata import SessionMetadata
from nous_session.stores import open_store
from nous_session.stores.base import Store, check_session_id

__all__ = ["Sessions", "SessionsPortal", "SessionsStatistics"]

T = TypeVar("T")

# What a portal call runs with the actor: a plain function, or one returning an awaitable.
_Function: TypeAlias = Callable[[SessionActor], Awaitable[T] | T]

_logger = get_logger("nous_session.registry")


@attrs.frozen
class SessionsStatistics:
    """Counters and gauges of a :class:`Sessions` registry.

    Attributes:
        open: actors open now (not told to close).
        leased: of those, the ones held now: by a :meth:`Sessions.use` block (or a portal call)
            or by a :meth:`Sessions.get` that has not returned yet.
        opened: actors opened since the registry started.
        closed_idle: actors closed because they sat idle for ``idle_timeout``.
        closed_lru: actors closed because more than ``max_open`` were open.
    """

    open: int
    leased: int
    opened: int
    closed_idle: int
    closed_lru: int


class _Use:
    """What :meth:`Sessions.use` returns: the session's actor, leased for an ``async with``
    block. A plain async context manager rather than a generator-based one: it is on the path
    of every call an adapter makes, and a generator's enter and exit cost four times as much.
    """

    __slots__ = ("_entry", "_metadata", "_registry", "_session_id")

    def __init__(
        self,
        registry: Sessions,
        session_id: str,
        metadata: SessionMetadata | Mapping[str, Any] | None,
    ) -> None:
        self._registry = registry
        self._session_id = session_id
        self._metadata = metadata
        self._entry: Entry | None = None

    async def __aenter__(self) -> SessionActor:
        if self._entry is not None:
            raise RuntimeError("a Sessions.use() block can be entered once")
        registry = self._registry
        metadata = self._metadata
        record = None if metadata is None else SessionMetadata.coerce(metadata)
        table = registry._table
        entry = table.by_id.get(self._session_id)
        if entry is not None and table.usable(entry):
            table.lease(entry)
        else:
            entry = await registry._acquire(self._session_id)
        actor = entry.actor
        assert actor is not None
        if record is not None and actor.metadata != record:
            try:
                await actor.set_metadata(record)
            except BaseException:
                registry._release(entry)
                raise
        self._entry = entry
        return actor

    async def __aexit__(self, *exc_info: object) -> None:
        entry, self._entry = self._entry, None
        if entry is not None:
            self._registry._release(entry)


class Sessions:
    """A registry of the sessions of one store: ``await sessions.get(id)`` opens the session's
    actor on first use and returns it; idle actors close by themselves.

    Use it as an async context manager; leaving the block closes every actor (their queued
    requests are committed first) and then the store, if the registry opened it from a URL.

    An actor is *leased* while a :meth:`use` block holds it and while a :meth:`get` is opening
    or returning it: a leased actor is never closed by the registry, except when the registry
    itself closes. An unleased actor closes when, for ``idle_timeout`` seconds, nobody called
    :meth:`get` for it, it took no request and it had no subscriber; and when more than
    ``max_open`` actors are open, the least recently used unleased ones close at once. When
    every open actor is leased, the registry goes above ``max_open`` for as long as that lasts
    (a lease is never broken to honour the count) and comes back down as leases end.

    :meth:`get` holds no lease after it returns: a kept actor may be closed later by idleness
    or by ``max_open``, and then raises :class:`~nous_session.errors.SessionClosedError`.
    ``get`` it again, or hold it with ``async with sessions.use(id)`` across long waits.

    Closing the registry ends, in bounded time, every caller inside :meth:`get` or
    :meth:`use`: a caller that has not got its actor yet gets ``SessionClosedError``, an actor
    still opening is closed as soon as it has opened, and a caller holding an actor gets each
    call's outcome (requests already queued are committed; later ones raise
    ``SessionClosedError``).

    Every operation on one session costs O(1) whatever the number open: the unleased open
    actors are kept in least-recently-used order, so eviction takes the first, and the
    statistics are counters. Only the idle reaper looks at every unleased actor, once per
    half ``idle_timeout``.
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
        max_event_size: int | None = MAX_EVENT_SIZE,
    ) -> None:
        """Describe the registry; nothing is opened before ``async with``.

        Args:
            store: the store every session lives in: a Store (the caller closes it) or a URL
                for :func:`~nous_session.stores.open_store` (the registry closes it).
            compaction: the compaction policy of every actor; None never compacts.
            idle_timeout: seconds after which an unused actor closes (> 0).
            max_open: how many actors may be open before the least recently used unleased
                ones close (>= 1); leased actors may take the registry above it.
            on_conflict: as for :meth:`SessionActor.open`; ``"rebase"`` when other processes
                write to the same sessions.
            queue_size: as for :meth:`SessionActor.open`.
            follow: as for :meth:`SessionActor.open`: None follows other processes' commits
                where the store has a change feed; False never does (an adapter that checks
                and commits against the count it read wants that).
            max_event_size: as for :meth:`SessionActor.open`: the largest event an actor
                appends (4 MiB by default; None: no limit).

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
        options = check_options(queue_size, on_conflict, compaction, max_event_size)
        if follow not in (None, True, False):
            raise ValueError(f"follow must be None, True or False, got {follow!r}")
        self._idle_timeout = float(idle_timeout)
        # How every session's actor opens, but for its session id.
        self._host_actor = functools.partial(
            host, store=self._store, follow=follow, options=options
        )
        self._table = Entries(max_open)
        self._task_group: anyio.abc.TaskGroup | None = None
        self._wake_reaper: anyio.Event  # made on entering: an Event belongs to an event loop
        self._state: Literal["new", "open", "closed"] = "new"

    # Opening and closing ----------------------------------------------------------------------

    async def __aenter__(self) -> Sessions:
        if self._state != "new":
            raise RuntimeError("a Sessions registry can be entered once")
        self._state = "open"
        self._wake_reaper = anyio.Event()
        self._table.now = current_clock()
        self._exit_stack = self._run()
        try:
            await self._exit_stack.__aenter__()
        except BaseException:
            self._state = "closed"
            if self._owned:
                await self._store.aclose()
            raise
        return self

    async def __aexit__(self, *exc_info: Any) -> bool | None:
        return await self._exit_stack.__aexit__(*exc_info)

    async def aclose(self) -> None:
        """Close every actor (queued requests are committed first), then the owned store.

        Call it instead of leaving the ``async with`` block only where a block cannot be used
        (from the task that entered it).
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
                    # From here no entry is made (get and use check the state with no await
                    # before making one), and every entry is told to close, those still
                    # opening included: their actors close as soon as they have opened. The
                    # task group waits for them and for the reaper, which sees the state.
                    self._state = "closed"
                    for entry in list(self._table.by_id.values()):
                        self._table.close(entry)
                    self._wake_reaper.set()
        finally:
            self._task_group = None
            if self._owned:
                await self._store.aclose()

    # Getting sessions -------------------------------------------------------------------------

    async def get(
        self,
        session_id: str,
        *,
        metadata: SessionMetadata | Mapping[str, Any] | None = None,
    ) -> SessionActor:
        """The session's actor, opened now if it is not open; open when this returns.

        Several tasks asking for the same closed session at once open it once. The actor is
        leased while it opens; after the return nothing holds it (see the class docstring).

        Args:
            session_id: the session.
            metadata: when given and different from the session's (a new session has none),
                set by a metadata event before this returns (as
                :meth:`SessionActor.open`'s ``metadata=``).

        Raises:
            ValueError: a bad session id or metadata.
            StoreError: the session could not be loaded.
            SessionClosedError: the registry is closed (or not entered yet).
        """
        if metadata is not None:
            async with self.use(session_id, metadata=metadata):
                pass  # set while leased; the get below finds the actor open
            return await self.get(session_id)
        table = self._table
        entry = table.by_id.get(session_id)
        if entry is not None and entry.actor is not None and table.usable(entry):
            # The common case, with no await: nothing can close it before the caller has it.
            table.touch(entry)
            return entry.actor
        entry = await self._acquire(session_id)
        # Released keeping this one: it becomes the most recently used, and the eviction
        # stops before it, so the actor returned here is open on return.
        self._release(entry, keep=True)
        actor = entry.actor
        assert actor is not None  # an acquired entry's actor runs
        return actor

    def use(
        self,
        session_id: str,
        *,
        metadata: SessionMetadata | Mapping[str, Any] | None = None,
    ) -> contextlib.AbstractAsyncContextManager[SessionActor]:
        """Hold the session's actor open for the block: neither idleness nor ``max_open``
        closes it before the block ends (closing the registry does)::

            async with sessions.use("user-42") as session:
                await session.add_message(message)

        ``metadata``: as for :meth:`get`, set before the block starts.

        Raises:
            ValueError, StoreError, SessionClosedError: as :meth:`get`, on entering.
        """
        return _Use(self, session_id, metadata)

    async def _acquire(self, session_id: str) -> Entry:
        """The session's entry with a lease taken for the caller and its actor open; opened
        now if need be. The lease is taken with no await after finding or making the entry."""
        try:
            check_session_id(session_id)
        except ValueError as error:
            raise ValueError(f"bad session_id: {error}") from None
        while True:
            if self._state != "open" or self._task_group is None:
                raise SessionClosedError(f"the Sessions registry is {self._state}")
            table = self._table
            entry = table.by_id.get(session_id)
            if entry is not None and entry.closing:
                # Its old actor is still closing (one actor per session at a time).
                await entry.gone.wait()
                continue
            evicted: list[Entry] = []
            mine = entry is None
            if entry is None:
                entry = table.add(session_id)
                self._task_group.start_soon(self._host, entry)
                evicted = table.evict()
            else:
                table.lease(entry)  # opening for another caller, or open
            try:
                await entry.ready.wait()
                # On return at most max_open actors are open (or leased): wait for those
                # this open pushed out.
                for closing in evicted:
                    await closing.gone.wait()
            except BaseException:
                self._release(entry)
                raise
            if table.usable(entry):
                table.touch(entry)
                return entry
            self._release(entry)
            if mine and entry.error is not None:
                raise entry.error
            # It closed (the registry is closing) or failed for the caller who opened it:
            # look again; a failure is tried anew for each caller.
            await entry.gone.wait()

    def _release(self, entry: Entry, *, keep: bool = False) -> None:
        """Drop a lease, and bring the registry back down towards ``max_open`` (not closing
        ``entry`` if ``keep``)."""
        self._table.release(entry)
        if self._state == "open":
            self._table.evict(keep=entry if keep else None)

    async def _host(self, entry: Entry) -> None:
        """Run one actor, in this task (:func:`~nous_session.actor.host`: an open session
        runs no task but this one), until its entry is told to close.

        Started with ``start_soon``, not ``start``: the open belongs to the registry, not to
        the caller who asked first, whose cancellation must not cancel it for the others. A
        failure to open is handed to that caller through the entry; once the actor runs, an
        error on its way out is logged, never raised into the registry's task group, where
        it would close every other session.
        """
        try:
            await self._host_actor(
                functools.partial(self._table.started, entry), session_id=entry.session_id
            )
        except Exception as error:
            if entry.actor is None:
                entry.error = error
            else:
                _logger.exception("nous_session.registry_actor_failed", session_id=entry.session_id)
        finally:
            self._table.close(entry)
            self._table.remove(entry)
            entry.ready.set()
            entry.gone.set()

    # Closing idle actors ----------------------------------------------------------------------

    async def _reap(self) -> None:
        """Close idle actors, looking again at half the idle timeout at the latest.

        It looks at every unleased open actor (leased ones are busy by definition): O(n)
        once per half ``idle_timeout``, never per open.
        """
        while self._state == "open":
            self._table.close_idle(self._idle_timeout)
            with anyio.move_on_after(self._idle_timeout / 2):
                await self._wake_reaper.wait()

    # Reading ----------------------------------------------------------------------------------

    @property
    def store(self) -> Store:
        """The store every session of this registry lives in."""
        return self._store

    def __contains__(self, session_id: object) -> bool:
        """Whether the session's actor is open now (opened, and not told to close)."""
        entry = self._table.by_id.get(session_id) if isinstance(session_id, str) else None
        return entry is not None and entry.actor is not None and not entry.closing

    def statistics(self) -> SessionsStatistics:
        """Counters and gauges; see :class:`SessionsStatistics`. O(1): kept as counts."""
        table = self._table
        return SessionsStatistics(
            open=table.open,
            leased=table.leased,
            opened=table.opened,
            closed_idle=table.closed_idle,
            closed_lru=table.closed_lru,
        )

    def __repr__(self) -> str:
        return f"<Sessions {self._state} open={self._table.open} store={self._store!r}>"


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
        # Calls being handed to the portal's loop now; close() waits for them (see _submit).
        self._submitting = 0
        self._submitted = threading.Condition(self._lock)
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
        # The registry outside the portal: on close the portal first waits for the calls it
        # runs (they complete with the registry still open), then the registry closes.
        async with self._sessions, anyio.from_thread.BlockingPortal() as portal:
            self._portal = portal
            self._thread_id = threading.get_ident()
            self._ready.set()
            await portal.sleep_until_stopped()

    async def _invoke(self, session_id: str, fn: _Function[T]) -> T:
        # Held for the call: neither idleness nor max_open closes the actor under it.
        async with self._sessions.use(session_id) as actor:
            result = fn(actor)
            if inspect.isawaitable(result):
                return await result
            return result

    def _running(self) -> anyio.from_thread.BlockingPortal:
        portal = self._portal
        if self._closed or portal is None:
            raise SessionClosedError("the SessionsPortal is closed")
        return portal

    def _submit(self, session_id: str, fn: _Function[T]) -> Future[T]:
        # Counted, so that close() does not stop the loop between the BlockingPortal's own
        # "is it running" check and its scheduling the task there: on asyncio a task handed
        # to a loop that has stopped is never run, and its caller would wait for ever.
        with self._lock:
            portal = self._running()
            self._submitting += 1
        try:
            return portal.start_task_soon(self._invoke, session_id, fn)
        finally:
            with self._lock:
                self._submitting -= 1
                if not self._submitting:
                    self._submitted.notify_all()

    @overload
    def call(self, session_id: str, fn: Callable[[SessionActor], Awaitable[T]]) -> T: ...
    @overload
    def call(self, session_id: str, fn: Callable[[SessionActor], T]) -> T: ...
    def call(self, session_id: str, fn: _Function[T]) -> T:
        """Run ``fn(actor)`` on the portal's loop with the session's actor, and wait.

        ``fn`` may be a plain function or an async one: it is called on the portal's loop
        thread, and what it returns is awaited if it is awaitable (so ``lambda s:
        s.add_message(m)`` commits before the call returns). The actor is held open for the
        call. For synchronous code (not the portal's own thread). ``fn``'s outcome is the
        call's: its result is returned, its exception raised here.

        Raises:
            SessionClosedError: the portal is closed.
            RuntimeError: called from the portal's own event loop (use :meth:`acall`).
        """
        if threading.get_ident() == self._thread_id:
            raise RuntimeError("SessionsPortal.call would wait on its own thread; use acall")
        return self._submit(session_id, fn).result()

    @overload
    def start(self, session_id: str, fn: Callable[[SessionActor], Awaitable[T]]) -> Future[T]: ...
    @overload
    def start(self, session_id: str, fn: Callable[[SessionActor], T]) -> Future[T]: ...
    def start(self, session_id: str, fn: _Function[T]) -> Future[T]:
        """Like :meth:`call`, without waiting: a future of the outcome.

        Raises:
            SessionClosedError: the portal is closed.
        """
        return self._submit(session_id, fn)

    @overload
    async def acall(self, session_id: str, fn: Callable[[SessionActor], Awaitable[T]]) -> T: ...
    @overload
    async def acall(self, session_id: str, fn: Callable[[SessionActor], T]) -> T: ...
    async def acall(self, session_id: str, fn: _Function[T]) -> T:
        """Run ``fn(actor)`` (a plain or an async function, as for :meth:`call`) on the
        portal's loop with the session's actor, from any event loop, without blocking it.

        Cancelling the caller does not cancel the call: it completes on the portal's loop,
        with the outcome a :class:`SessionActor` call whose caller was cancelled would have
        (a request already queued commits); use idempotency keys to retry safely.

        Raises:
            SessionClosedError: the portal is closed.
        """
        self._running()
        if threading.get_ident() == self._thread_id:
            return await self._invoke(session_id, fn)
        future = self._submit(session_id, fn)
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
            # Calls already being handed over become tasks that the portal waits for; a
            # handover takes one trip through the running loop, so this wait is short.
            self._submitted.wait_for(lambda: not self._submitting)
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

    def __exit__(self, *exc_info: object) -> None:
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
