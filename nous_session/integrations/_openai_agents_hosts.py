"""Where an OpenAI Agents session's calls run. :class:`CallRouter` picks, for each call of one
session, the registry of its store on the calling asyncio loop (a loop an ``asyncio.Runner``
runs) or a portal shared by the sessions of the store, and runs the call there; the MemoryStore
of a ``"memory:"`` URL is shared likewise. See :mod:`nous_session.integrations.openai_agents`."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
import weakref
from collections.abc import Awaitable, Callable
from types import FrameType
from typing import TYPE_CHECKING, Final, TypeVar

import anyio
import anyio.lowlevel

from nous_session._logging import get_logger
from nous_session.errors import SessionClosedError
from nous_session.integrations._common import named_store
from nous_session.registry import Sessions, SessionsPortal
from nous_session.stores import open_store
from nous_session.stores.base import Store
from nous_session.stores.memory import MemoryStore

if TYPE_CHECKING:
    from nous_session.actor import SessionActor

T = TypeVar("T")

_logger = get_logger("nous_session.openai_agents")


class SharedPortal:
    """A portal shared by every NousSession of one store URL (or Store object), closed with
    the last of them."""

    _lock: Final = threading.Lock()
    _by_key: Final[dict[object, SharedPortal]] = {}

    def __init__(self, key: object, portal: SessionsPortal) -> None:
        self.key = key
        self.portal = portal
        self.users = 0

    @classmethod
    def acquire(cls, key: object, store: Store | str) -> SharedPortal:
        with cls._lock:
            found = cls._by_key.get(key)
            if found is None or found.portal.closed:
                found = cls._by_key[key] = cls(key, SessionsPortal(store, on_conflict="rebase"))
            found.users += 1
            return found

    def release(self) -> None:
        with self._lock:
            self.users -= 1
            if self.users > 0:
                return
            if self._by_key.get(self.key) is self:
                del self._by_key[self.key]
        self.portal.close()


class SharedMemory:
    """The MemoryStore of a ``"memory:"`` URL, shared by every NousSession naming it (on
    every loop and the portal), dropped with the last of them."""

    _lock: Final = threading.Lock()
    _by_url: Final[dict[str, SharedMemory]] = {}

    def __init__(self, url: str) -> None:
        self.url = url
        self.store = MemoryStore()
        self.users = 0

    @classmethod
    def acquire(cls, url: str) -> SharedMemory:
        with cls._lock:
            found = cls._by_url.get(url)
            if found is None:
                found = cls._by_url[url] = cls(url)
            found.users += 1
            return found

    def release(self) -> None:
        with self._lock:
            self.users -= 1
            if self.users <= 0 and self._by_url.get(self.url) is self:
                del self._by_url[self.url]


class LoopSessions:
    """The :class:`Sessions` registry of one store on one asyncio event loop, for the
    NousSessions called from that loop, run by a task of its own on the loop.

    There is no task group of the caller's to put that task in: the SDK calls a session from
    whatever task runs the agent, and the registry must outlive each call (its actors keep
    the session's log between calls). So it is a task of the loop, kept here, that ends when
    the last session using it closes, or when the loop's run ends: only loops run by
    :class:`asyncio.Runner` get one (see :func:`run_by_asyncio_runner`), and when its main
    coroutine returns, ``asyncio.run`` cancels every task left and waits for them, so the
    registry closes its actors and its store on the way out, before the loop closes.
    """

    _lock: Final = threading.Lock()
    _by_loop: Final[
        weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[object, LoopSessions]]
    ] = weakref.WeakKeyDictionary()

    def __init__(self, loop: asyncio.AbstractEventLoop, key: object, store: Store | str) -> None:
        self.loop = loop
        self.key = key
        # Plain commits, cheaper than rebasing ones: only another loop, process or the
        # portal writes the same session, and the adapter tries a losing write again.
        self.sessions = Sessions(store, on_conflict="raise")
        self.users = 0
        self.serving = False  # the registry is open and not told to stop
        self.finished = False  # the task has ended
        self._error: BaseException | None = None  # why the registry could not open
        self._started = loop.create_future()  # done once open (or failed to)
        self._stop = asyncio.Event()
        self._task = loop.create_task(self._serve(), name="nous_session-openai-agents-registry")
        # The loop holds its tasks weakly: once the last session has let go of this object, a
        # registry still closing (its actors, its store's threads) must not be collected
        # half-way, leaving its store unclosed. Held here until the task is done.
        _closing_tasks.add(self._task)
        self._task.add_done_callback(_closing_tasks.discard)

    @classmethod
    def acquire(
        cls, loop: asyncio.AbstractEventLoop, key: object, store: Store | str
    ) -> LoopSessions:
        """The loop's registry of the store (made now if need be), with one user more; from
        the loop's own thread."""
        with cls._lock:
            hosts = cls._by_loop.get(loop)
            if hosts is None:
                hosts = cls._by_loop[loop] = {}
            host = hosts.get(key)
            if host is None:
                host = hosts[key] = cls(loop, key, store)
            host.users += 1
            return host

    async def ready(self) -> Sessions:
        """The registry, once open.

        Raises:
            Exception: why it could not open (the next call makes a new one).
        """
        if not self._started.done():
            await asyncio.shield(self._started)
        if self._error is not None:
            raise self._error
        return self.sessions

    def release(self) -> None:
        """One user fewer; the last stops the registry. From any thread."""
        with self._lock:
            self.users -= 1
            if self.users > 0:
                return
            self._forget()
        if not self.finished:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nothing runs on it
                self.loop.call_soon_threadsafe(self._stop.set)

    def _forget(self) -> None:
        """Leave the map (with the lock held): the next call on the loop makes a new one."""
        hosts = self._by_loop.get(self.loop)
        if hosts is not None and hosts.get(self.key) is self:
            del hosts[self.key]
            if not hosts:
                del self._by_loop[self.loop]

    async def _serve(self) -> None:
        try:
            async with self.sessions:
                self.serving = True
                self._started.set_result(None)
                await self._stop.wait()
                self.serving = False
        except Exception as error:
            if self._started.done():
                _logger.exception("nous_session.openai_agents_registry_failed")
            else:
                self._error = error
        finally:
            # Also when cancelled: asyncio.run cancels every task of its loop when its main
            # coroutine returns, and the registry has closed its actors on the way out.
            self.serving = False
            self.finished = True
            with self._lock:
                self._forget()
            if not self._started.done():
                if self._error is None:
                    self._error = SessionClosedError("the event loop's registry was closed")
                self._started.set_result(None)


_closing_tasks: Final[set[asyncio.Task[None]]] = set()
"""The registries' tasks, held until done (see LoopSessions.__init__)."""


def run_by_asyncio_runner(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether ``loop`` belongs to an :class:`asyncio.Runner` running it now (``asyncio.run``,
    anyio's and uvloop's ``run``, anyio's pytest plugin), looked up on the calling thread's
    stack: an object running the loop there is the Runner, or holds it as ``_runner``.

    Such a loop, when its run ends, cancels its tasks and lets them finish before it shuts
    its async generators down and closes: the registry's task closes cleanly then. Other ways
    of running a loop get the portal: ``run_until_complete`` by hand, as ``Runner.run_sync``
    does, whose ``shutdown_asyncgens()`` after each run would close the async generators
    (the actors' ``async with`` blocks) of a task that outlives the run.
    """
    known = _RUNNER_LOOPS.get(loop)
    if known is not None:
        return known
    found = False
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and not found:
        owner = frame.f_locals.get("self") if "self" in frame.f_code.co_varnames else None
        for runner in (owner, getattr(owner, "_runner", None)):
            if isinstance(runner, asyncio.Runner) and getattr(runner, "_loop", None) is loop:
                found = True
        frame = frame.f_back
    _RUNNER_LOOPS[loop] = found
    return found


# Whether each loop is run by an asyncio.Runner: a loop is run one way for its whole life.
_RUNNER_LOOPS: Final[weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, bool]] = (
    weakref.WeakKeyDictionary()
)


class CallRouter:
    """Where one NousSession's calls run, and running them there.

    The portal or registry given as ``sessions=``; else, for a call from an asyncio loop that
    an :class:`asyncio.Runner` runs, that loop's :class:`LoopSessions` of the store; else the
    store's :class:`SharedPortal`. It holds each it used (and the store of a ``"memory:"`` URL)
    until :meth:`close` lets them go, so that they close with the last session using them.
    """

    def __init__(
        self,
        owner: str,
        session_id: str,
        store: Store | str | None,
        sessions: SessionsPortal | Sessions | None,
    ) -> None:
        """Route the calls of session ``session_id`` to ``sessions`` if given, else to the
        registries and portal of ``store`` (None: the store ``NOUS_SESSION_STORE`` names, else
        a private in-memory store). ``owner``: the class that errors name.

        Raises:
            ValueError: ``store`` is neither a Store nor a known store URL.
        """
        self._owner = owner
        self._session_id = session_id
        self._closed = False
        # The explicit choice, or None: then each call picks (see pick).
        self._given = sessions
        self._memory: SharedMemory | None = None
        if sessions is not None:
            store = None
        elif (store := named_store(store)) is None:
            # Private: like an in-memory SQLite database, this session's own.
            store = MemoryStore()
        elif isinstance(store, str):
            if isinstance(open_store(store), MemoryStore):  # a bad URL raises here
                # "memory:": one store shared by the sessions naming it, on every loop.
                self._memory = SharedMemory.acquire(store)
                store = self._memory.store
        elif not all(callable(getattr(store, name, None)) for name in ("load", "commit", "aclose")):
            raise ValueError(f"store must be a Store or a store URL, got {store!r}")
        self._store: Store | str | None = store
        self._lock = threading.Lock()  # guards the two below: sessions close from any thread
        self._shared: SharedPortal | None = None  # the portal, once a call needed it
        self._hosts: set[LoopSessions] = set()  # the loop registries this session uses
        # The last loop called from and its registry, as one value (read without the lock).
        self._local: tuple[asyncio.AbstractEventLoop, LoopSessions] | None = None

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self._closed

    def check_open(self) -> None:
        """Raise :class:`SessionClosedError` once :meth:`close` was called."""
        if self._closed:
            raise self._closed_error()

    def close(self) -> None:
        """Let go of every registry and portal used, and the shared memory store; later calls
        raise :class:`SessionClosedError`. Idempotent; from any thread."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            hosts, self._hosts = self._hosts, set()
            shared, self._shared = self._shared, None
            self._local = None
        for host in hosts:
            host.release()
        if shared is not None:
            shared.release()
        if self._memory is not None:
            self._memory.release()

    @property
    def sessions(self) -> SessionsPortal | Sessions | None:
        """The portal or registry the calling context's calls run in, once one did (see
        ``NousSession.sessions``)."""
        if self._given is not None:
            return self._given
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        local = self._local
        if loop is not None:
            return local[1].sessions if local is not None and local[0] is loop else None
        shared = self._shared
        return shared.portal if shared is not None else None

    def pick(self) -> SessionsPortal | Sessions | LoopSessions:
        """Where this call runs, with no await: the given portal or registry; else, from a
        loop an asyncio.Runner runs, that loop's registry of the store (made now if need be,
        and then perhaps still opening); else the portal."""
        if self._given is not None:
            return self._given
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # not on an asyncio loop (trio): the portal
            return self._portal()
        local = self._local
        if local is not None and local[0] is loop and local[1].serving:
            return local[1].sessions  # the common case: no lock, no await
        if not run_by_asyncio_runner(loop):
            return self._portal()
        host = LoopSessions.acquire(loop, self._store_key(), self._own_store())
        with self._lock:
            if self._closed:
                host.release()
                raise self._closed_error()
            if host in self._hosts:
                host.release()  # counted once per session
            else:
                self._hosts.add(host)
            # Registries of loops that have ended: let them go.
            for dead in [h for h in self._hosts if h.finished]:
                self._hosts.discard(dead)
                dead.release()
        self._local = (loop, host)
        return host

    async def call(
        self,
        fn: Callable[[SessionActor], Awaitable[T]],
        where: SessionsPortal | Sessions | LoopSessions | None = None,
    ) -> T:
        """``fn(actor)`` with the session's actor, run where :meth:`pick` says (or ``where``)."""
        self.check_open()
        if where is None:
            where = self.pick()
        sessions = await where.ready() if isinstance(where, LoopSessions) else where
        if isinstance(sessions, Sessions):
            async with sessions.use(self._session_id) as actor:
                return await fn(actor)
        return await sessions.acall(self._session_id, fn)

    async def mutate(
        self,
        fn: Callable[[SessionActor], Awaitable[T]],
        where: SessionsPortal | Sessions | LoopSessions | None = None,
    ) -> T:
        """:meth:`call` for a write: wait for its outcome even if the caller is cancelled
        meanwhile; the cancellation is raised once the outcome is known (as the SDK's own
        sessions do), so a cancelled caller never leaves a write half-known."""
        self.check_open()
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is None:  # trio: a shielded scope does the same
            with anyio.CancelScope(shield=True):
                result = await self.call(fn)
            await anyio.lowlevel.checkpoint_if_cancelled()
            return result
        if where is None:
            where = self.pick()
        waiting: asyncio.Future[T]
        if isinstance(where, SessionsPortal) and not where.is_own_thread():
            waiting = asyncio.wrap_future(where.start(self._session_id, fn), loop=loop)
        else:
            # On this loop (the registry perhaps still opening): its own task, so that
            # cancelling the caller does not cancel it; the caller waits for it below
            # whatever happens, so it never outlives the call.
            waiting = loop.create_task(self.call(fn, where))
        try:
            # shield: a cancelled caller leaves the write running (awaiting the task itself
            # would cancel it with the caller).
            return await asyncio.shield(waiting)
        except asyncio.CancelledError:
            if waiting.done():  # the write itself was cancelled (its loop is shutting down)
                raise
            while not waiting.done():
                with contextlib.suppress(asyncio.CancelledError):  # the first is raised
                    await asyncio.wait({waiting})
            raise

    def _portal(self) -> SessionsPortal:
        with self._lock:
            if self._closed:
                raise self._closed_error()
            if self._shared is None or self._shared.portal.closed:
                self._shared = SharedPortal.acquire(self._store_key(), self._own_store())
            return self._shared.portal

    def _own_store(self) -> Store | str:
        """The store (or URL) the session was given: there is one when no sessions were."""
        assert self._store is not None
        return self._store

    def _store_key(self) -> object:
        """What makes two sessions' stores one: the URL, or the Store object."""
        return self._store if isinstance(self._store, str) else id(self._store)

    def _closed_error(self) -> SessionClosedError:
        return SessionClosedError(f"{self._owner} is closed (session {self._session_id!r})")
