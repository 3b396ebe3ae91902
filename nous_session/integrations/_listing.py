"""What the integrations share for finding their sessions: the ids under a prefix, listed
through the store's metadata index when it has one."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeGuard

from nous_session.stores.base import ListingStore, Store, supports

__all__ = ["listed_ids", "lists_sessions"]


def lists_sessions(store: Store) -> TypeGuard[ListingStore]:
    """Whether ``store`` lists sessions by metadata: :func:`supports`, as a guard mypy can
    narrow the store by (it cannot narrow to a Protocol from a ``type`` argument)."""
    return supports(store, ListingStore)


async def listed_ids(
    store: Store, where: Mapping[str, Any] | None, prefix: str, *, oldest_first: bool = False
) -> list[str] | None:
    """The ids starting with ``prefix`` of the sessions whose metadata matches ``where``,
    every page of them (newest first, or oldest first); None when there is no ``where`` or
    the store cannot list, for the caller to scan every session id instead."""
    if where is None or not lists_sessions(store):
        return None
    found: list[str] = []
    cursor = None
    while True:
        page = await store.list_sessions(
            where=where,
            order="created" if oldest_first else "active",
            descending=not oldest_first,
            limit=1000,
            cursor=cursor,
        )
        found += [e.session_id for e in page.sessions if e.session_id.startswith(prefix)]
        cursor = page.cursor
        if cursor is None:
            return found
