"""The LangGraph saver's calls from elsewhere than its event loop: its async methods awaited
from another loop, and its synchronous methods called from another thread, are carried to the
loop the saver runs on (its actors, events and locks belong to that one)."""

from __future__ import annotations

import functools
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from typing import Any, Concatenate, ParamSpec, TypeVar

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
)

from nous_session.integrations._langgraph_threads import Threads

_T = TypeVar("_T")
_P = ParamSpec("_P")
_F = TypeVar("_F", bound=Callable[..., Any])

_AWAITED_ON_LOOP_THREAD = (
    "NousSessionSaver was awaited from another event loop on the thread of the loop it was "
    "opened in, which is therefore not running: use the saver from its own loop, or from a "
    "loop in another thread while its own runs"
)
_SYNC_ON_LOOP_THREAD = (
    "NousSessionSaver's synchronous methods run on its event loop from another thread; on the "
    "loop's own thread they would deadlock: use the async ones (graph.ainvoke, graph.astream, "
    "saver.aget_tuple, ...)"
)


def _blocking(
    method: Callable[Concatenate[Any, _P], Coroutine[Any, Any, _T]],
) -> Callable[Concatenate[SyncSaver, _P], _T]:
    """The synchronous method of the saver's async ``method`` (LangGraph's pairs have the same
    parameters): the saver's own override of ``method``, run on its loop from another
    thread."""
    name = method.__name__

    def blocking(self: SyncSaver, /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
        function: Callable[_P, Coroutine[Any, Any, _T]] = getattr(self, name)
        return self._sync(function, *args, **kwargs)

    return _named(blocking, method, "")


def _blocking_listing(
    method: Callable[Concatenate[Any, _P], AsyncIterator[_T]],
) -> Callable[Concatenate[SyncSaver, _P], Iterator[_T]]:
    """:func:`_blocking` for an async iterator ``method``: the listing is read whole on the
    saver's loop, then handed out."""
    name = method.__name__

    def blocking(self: SyncSaver, /, *args: _P.args, **kwargs: _P.kwargs) -> Iterator[_T]:
        function: Callable[_P, AsyncIterator[_T]] = getattr(self, name)
        return iter(self._sync(self._collected, functools.partial(function, *args, **kwargs)))

    return _named(blocking, method, " (read at once)")


def _named(blocking: _F, method: Callable[..., Any], note: str) -> _F:
    """``blocking``, named and documented as the synchronous pair of the async ``method``,
    whose signature it reports (``inspect.signature``)."""
    name = method.__name__
    blocking.__name__ = blocking.__qualname__ = name.removeprefix("a")
    blocking.__doc__ = f":meth:`{name}`, from a thread other than the saver's event loop{note}."
    functools.update_wrapper(blocking, method, assigned=(), updated=())  # __wrapped__ only
    return blocking


class SyncSaver(BaseCheckpointSaver[str]):
    """The part of :class:`~nous_session.integrations.langgraph.NousSessionSaver` that
    carries calls to its loop: the synchronous interface, over the async one."""

    _threads: Threads
    _token: anyio.lowlevel.EventLoopToken
    _loop_thread: int  # the id of the thread the saver's loop runs on

    async def _from_other_loop(
        self, function: Callable[..., Coroutine[Any, Any, _T]], *args: Any, **kwargs: Any
    ) -> _T:
        """Run ``function`` on the saver's event loop for a task of another loop: a worker
        thread of the caller's loop waits for it (a cancelled caller waits too, so a write
        never ends half-known).

        Raises:
            RuntimeError: the saver is closed, or its loop is not running (the caller's loop
                runs on the saver's thread).
        """
        if self._threads.closed:
            raise RuntimeError("the NousSessionSaver is closed")
        self._refuse_on_loop_thread(_AWAITED_ON_LOOP_THREAD)
        call = functools.partial(function, *args, **kwargs)
        return await anyio.to_thread.run_sync(
            functools.partial(anyio.from_thread.run, call, token=self._token)
        )

    def _refuse_on_loop_thread(self, why: str) -> None:
        """Raise RuntimeError(``why``) on the thread of the saver's loop, where a call
        waiting for that loop would never be answered."""
        if threading.get_ident() == self._loop_thread:
            raise RuntimeError(why)

    async def _collected(self, items: Callable[[], AsyncIterator[_T]]) -> list[_T]:
        """Every item of ``items()``, read whole (for a caller on another loop or thread)."""
        return [item async for item in items()]

    # The sync interface -----------------------------------------------------------------------

    def _sync(
        self, function: Callable[..., Coroutine[Any, Any, _T]], *args: Any, **kwargs: Any
    ) -> _T:
        self._refuse_on_loop_thread(_SYNC_ON_LOOP_THREAD)
        return anyio.from_thread.run(
            functools.partial(function, *args, **kwargs), token=self._token
        )

    list = _blocking_listing(BaseCheckpointSaver.alist)
    get_tuple = _blocking(BaseCheckpointSaver.aget_tuple)
    put = _blocking(BaseCheckpointSaver.aput)
    put_writes = _blocking(BaseCheckpointSaver.aput_writes)
    delete_thread = _blocking(BaseCheckpointSaver.adelete_thread)
    delete_for_runs = _blocking(BaseCheckpointSaver.adelete_for_runs)
    copy_thread = _blocking(BaseCheckpointSaver.acopy_thread)
    prune = _blocking(BaseCheckpointSaver.aprune)
