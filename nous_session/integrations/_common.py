"""What the integrations share around their store: the error a missing extra raises, the
store an ``open`` runs on (opened from a URL and closed with the block, or the caller's), and
the ``store`` property of the objects they open."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from nous_session.stores import STORE_ENV, open_store
from nous_session.stores.base import Store

__all__ = ["StoreHost", "missing_extra", "opened_store"]


def missing_extra(module: str, needs: str, extra: str) -> ImportError:
    """The error an integration raises when the framework it adapts is not installed: it
    names the pip extra that brings it."""
    return ImportError(f"{module} needs {needs}: pip install 'nous_session[{extra}]'")


@asynccontextmanager
async def opened_store(store: Store | str | None) -> AsyncIterator[Store]:
    """``store`` as a Store for the block: a URL (or None: the store ``NOUS_SESSION_STORE``
    names, else a private in-memory store) is opened here and closed with the block; a Store
    passed in stays the caller's to close."""
    if store is not None and not isinstance(store, str):
        yield store
        return
    resolved = open_store(store)  # None: the one rule for a store given none
    try:
        yield resolved
    finally:
        await resolved.aclose()


def named_store(store: Store | str | None) -> Store | str | None:
    """``store``, or for None the store URL ``NOUS_SESSION_STORE`` names (None when it is
    unset: the integration's private in-memory store), the rule for a store given none."""
    if store is not None:
        return store
    return os.environ.get(STORE_ENV) or None


class StoreHost:
    """An integration's object that keeps its sessions in one store, each under its id after a
    prefix."""

    _store: Store
    _prefix: str

    @property
    def store(self) -> Store:
        """The nous_session store the sessions are kept in."""
        return self._store
