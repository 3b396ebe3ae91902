"""What the integrations share around their store: the error a missing extra raises, the
store an ``open`` runs on (opened from a URL and closed with the block, or the caller's), and
the ``store`` property of the objects they open."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from nous_session.stores import open_store
from nous_session.stores.base import Store

__all__ = ["StoreHost", "missing_extra", "opened_store"]


def missing_extra(module: str, needs: str, extra: str) -> ImportError:
    """The error an integration raises when the framework it adapts is not installed: it
    names the pip extra that brings it."""
    return ImportError(f"{module} needs {needs}: pip install 'nous_session[{extra}]'")


@asynccontextmanager
async def opened_store(store: Store | str | None) -> AsyncIterator[Store]:
    """``store`` as a Store for the block: a URL (or None, a private in-memory store) is
    opened here and closed with the block; a Store passed in stays the caller's to close."""
    if store is not None and not isinstance(store, str):
        yield store
        return
    resolved = open_store("memory:" if store is None else store)
    try:
        yield resolved
    finally:
        await resolved.aclose()


class StoreHost:
    """An integration's object that keeps its sessions in one store, each under its id after a
    prefix."""

    _store: Store
    _prefix: str

    @property
    def store(self) -> Store:
        """The nous_session store the sessions are kept in."""
        return self._store
