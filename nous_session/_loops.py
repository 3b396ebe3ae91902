"""Event-loop primitives shared by the actor and the stores: which library runs the calling
task, its clock, the waiters a task parks on and how they are woken, from the loop itself or
from another thread (the SQLite writer, the change feeds)."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeAlias

if TYPE_CHECKING:
    import trio

__all__ = [
    "Done",
    "Waiter",
    "current_clock",
    "current_library",
    "new_waiter",
    "scheduler",
    "set_events",
    "set_futures",
    "wake",
]


def current_library() -> str:
    """``"asyncio"`` or ``"trio"`` (or what sniffio names), cheaply: without trio imported
    no trio run can exist, so sniffio is asked only when it is."""
    if "trio" in sys.modules:  # trio imports sniffio, so a trio run always has it
        import sniffio

        return sniffio.current_async_library()
    return "asyncio"


def current_clock() -> Callable[[], float]:
    """The running event loop's clock (what ``anyio.current_time`` reads), as a function to
    keep: ``loop.time`` on asyncio, ``trio.current_time`` on trio. Looking the backend up on
    every reading, as ``anyio.current_time()`` does, costs twenty times the reading itself."""
    if current_library() == "trio":
        import trio

        return trio.current_time
    return asyncio.get_running_loop().time


Waiter: TypeAlias = "asyncio.Future[None] | trio.Event"
"""What one task waits on to be woken: the event loop's own primitive."""


class Done:
    """Set once a request is answered: what its caller awaits.

    Waits on the event loop's own primitive (an asyncio future, or a ``trio.Event`` under
    trio) instead of an ``anyio.Event``, which builds an ``asyncio.Event`` with a deque and a
    future per wait: one is made for every call, and a call's round trip through the actor
    takes about 5% less time this way (7% on trio). Set and awaited in the event loop's
    thread only.
    """

    __slots__ = ("_flag", "_more", "_waiter")

    def __init__(self) -> None:
        self._flag = False
        # One per waiting call: a cancelled caller cancels its asyncio future, which must not
        # cancel another's. The first has a slot of its own (there is almost never a second).
        self._waiter: Waiter | None = None
        self._more: list[Waiter] | None = None

    def is_set(self) -> bool:
        return self._flag

    def set(self) -> None:
        if self._flag:
            return
        self._flag = True
        waiter, self._waiter = self._waiter, None
        if waiter is not None:
            wake(waiter)
        more, self._more = self._more, None
        for other in more or ():
            wake(other)

    async def wait(self) -> None:
        if self._flag:
            return
        waiter = new_waiter()
        current = self._waiter
        if current is None or (isinstance(current, asyncio.Future) and current.done()):
            self._waiter = waiter  # the first, or the first was cancelled and left
        elif self._more is None:
            self._more = [waiter]
        else:
            self._more.append(waiter)
        if isinstance(waiter, asyncio.Future):
            await waiter
        else:
            await waiter.wait()


def wake(waiter: Waiter) -> None:
    """Wake the task waiting on ``waiter`` (unless it left, cancelled)."""
    if isinstance(waiter, asyncio.Future):
        if not waiter.done():  # its caller was cancelled
            waiter.set_result(None)
    else:
        waiter.set()


def new_waiter() -> Waiter:
    """A fresh waiter for the calling task's event loop."""
    if current_library() == "trio":
        import trio

        return trio.Event()
    return asyncio.get_running_loop().create_future()


def scheduler() -> Callable[[Callable[[], object]], object]:
    """How another thread runs a callback on the calling task's event loop (asyncio or trio)."""
    if current_library() == "trio":
        import trio

        return trio.lowlevel.current_trio_token().run_sync_soon
    return asyncio.get_running_loop().call_soon_threadsafe


def set_futures(futures: list[asyncio.Future[None]]) -> None:
    """On the event loop: complete the waiters of one group (cancelled ones are left alone)."""
    for future in futures:
        if not future.done():
            future.set_result(None)


def set_events(events: list[trio.Event]) -> None:
    """In the trio run: complete the waiters of one group."""
    for event in events:
        event.set()
