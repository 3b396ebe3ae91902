"""Which event loop library runs the calling task: the one check the thread-safe wake-ups
(the SQLite writer, the PostgreSQL listener) and request answers share."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable

__all__ = ["current_clock", "current_library"]


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
