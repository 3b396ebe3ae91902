"""Where an OpenAI Agents session's calls run: a portal shared by the sessions of one store, the
MemoryStore of a ``"memory:"`` URL shared likewise, and the registry of the store on each
asyncio loop that an ``asyncio.Runner`` runs. See :mod:`nous_session.integrations.openai_agents`."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
import weakref
from types import FrameType
from typing import Final

from nous_session._logging import get_logger
from nous_session.errors import SessionClosedError
from nous_session.registry import Sessions, SessionsPortal
from nous_session.stores.base import Store
from nous_session.stores.memory import MemoryStore

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
