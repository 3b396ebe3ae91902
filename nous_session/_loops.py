"""Which event loop library runs the calling task: the one check the thread-safe wake-ups
(the SQLite writer, the PostgreSQL listener) and request answers share."""

from __future__ import annotations

import sys

__all__ = ["current_library"]


def current_library() -> str:
    """``"asyncio"`` or ``"trio"`` (or what sniffio names), cheaply: without trio imported
    no trio run can exist, so sniffio is asked only when it is."""
    if "trio" in sys.modules:  # trio imports sniffio, so a trio run always has it
        import sniffio

        return sniffio.current_async_library()
    return "asyncio"
