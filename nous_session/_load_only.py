"""Stores written for the Store contract's first version (``load`` and ``commit``, no
``read``): wrapped once when a session opens, so that the actor speaks one contract."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from nous_session.stores.base import RebasingStore, Store, Stored, supports

if TYPE_CHECKING:
    from nous_session.event import Event
    from nous_session.stores.base import Rebased, SessionInfo

__all__ = ["LoadOnlyRebasingStore", "LoadOnlyStore", "with_read"]


class LoadOnlyStore:
    """A store of the Store contract's first version (``load`` and ``commit``, no ``read``),
    wrapped once when a session opens so that the actor speaks one contract.

    ``read`` is a ``load``: the count follows from the last event (``since`` when there is
    none), the horizon is 0 and there are no keys. ``commit`` passes on only what the first
    version knows (no horizons, keys or commit ids). Other attributes pass through, but
    capabilities do not (:func:`~nous_session.stores.base.supports` looks at the class).
    """

    __slots__ = ("inner",)

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        if name == "inner":
            raise AttributeError(name)  # not set yet: no endless recursion
        return getattr(self.inner, name)

    async def load(self, session_id: str, *, since: int = 0) -> Sequence[Event]:
        events: Sequence[Event] = await self.inner.load(session_id, since=since)
        return events

    async def read(self, session_id: str, *, since: int = 0) -> Stored:
        events = await self.load(session_id, since=since)
        return Stored(events, events[-1].seq + 1 if events else since)

    async def commit(self, session_id: str, **arguments: Any) -> str | None:
        # Horizons, keys and commit ids are what a store with ``read`` is told besides. What
        # it returns goes back as it is (a store of that version returns None).
        uid: str | None = await self.inner.commit(
            session_id,
            expected_count=arguments["expected_count"],
            events=arguments["events"],
            dropped=arguments.get("dropped", ()),
        )
        return uid

    async def sessions(self) -> list[SessionInfo]:
        found: list[SessionInfo] = await self.inner.sessions()
        return found

    async def delete(self, session_id: str) -> bool:
        return bool(await self.inner.delete(session_id))

    async def aclose(self) -> None:
        await self.inner.aclose()

    def __repr__(self) -> str:
        return repr(self.inner)


class LoadOnlyRebasingStore(LoadOnlyStore):
    """A :class:`LoadOnlyStore` whose store has a rebasing commit (told no keys or ids)."""

    __slots__ = ()

    async def commit_rebased(self, session_id: str, **arguments: Any) -> Rebased:
        rebased: Rebased = await self.inner.commit_rebased(
            session_id, expected_count=arguments["expected_count"], events=arguments["events"]
        )
        return rebased


def with_read(store: Store) -> Store:
    """``store`` itself, or wrapped in a :class:`LoadOnlyStore` when its class has no
    ``read`` (a store written for the first version of the contract)."""
    if callable(getattr(type(store), "read", None)):
        return store
    if supports(store, RebasingStore):
        return LoadOnlyRebasingStore(store)
    return LoadOnlyStore(store)
