"""The listing contract as tests: metadata, listing by filter, order and cursor, idle deletes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import pytest

from nous_session.actor import SessionActor
from nous_session.listing import metadata_of
from nous_session.message import Message
from nous_session.stores.base import ForkingStore, ListingStore, Store, supports


def _listing(store: Store) -> ListingStore:
    """``store`` as the listing store it must be."""
    assert supports(store, ListingStore), f"{store!r} is not a ListingStore"
    return store


async def _listed(store: Store, **query: Any) -> list[str]:
    """Every session id a listing yields, page after page."""
    found: list[str] = []
    cursor = None
    while True:
        page = await _listing(store).list_sessions(cursor=cursor, **query)
        found += [entry.session_id for entry in page.sessions]
        cursor = page.cursor
        if cursor is None:
            return found


async def _opened(store: Store, session_id: str, metadata: Any, messages: int = 1) -> None:
    async with SessionActor.open(session_id=session_id, store=store, metadata=metadata) as s:
        for index in range(messages):
            await s.add_message(Message.user(f"{session_id} {index}"))


class ListingConformance:
    """The :class:`~nous_session.stores.base.ListingStore` contract as tests: session
    metadata, created and last-active times, listing by filter, order and cursor, and
    conditional deletes. Subclass it with the ``store`` fixture of :class:`StoreConformance`.
    """

    pytestmark = pytest.mark.anyio

    async def test_listing_filters_by_owner_app_title_extra_fields_and_tags(
        self, store: Store
    ) -> None:
        await _opened(store, "a", {"owner": "ann", "app": "chat", "tags": ["x", "y"]})
        await _opened(store, "b", {"owner": "bob", "app": "chat", "title": "B", "tags": ["x"]})
        await _opened(store, "c", {"owner": "ann", "app": "mail", "extra": {"n": 1, "ok": True}})
        await _opened(store, "d", None)
        by = _listed
        assert sorted(await by(store, where={"owner": "ann"})) == ["a", "c"]
        assert sorted(await by(store, where={"app": "chat"})) == ["a", "b"]
        assert await by(store, where={"owner": "ann", "app": "chat"}) == ["a"]
        assert await by(store, where={"title": "B"}) == ["b"]
        assert await by(store, where={"n": 1}) == ["c"]
        assert await by(store, where={"n": 1.0}) == ["c"]  # JSON numbers: 1 equals 1.0
        assert await by(store, where={"n": True}) == []  # a bool is not a number
        assert await by(store, where={"ok": True}) == ["c"]
        assert await by(store, where={"n": "1"}) == []
        assert sorted(await by(store, tags=["x"])) == ["a", "b"]
        assert await by(store, tags=["x", "y"]) == ["a"]
        assert await by(store, where={"owner": "nobody"}) == []
        assert sorted(await by(store)) == ["a", "b", "c", "d"]
        page = await _listing(store).list_sessions(where={"owner": "bob"})
        (entry,) = page.sessions
        assert entry.metadata.to_json() == {
            "owner": "bob",
            "app": "chat",
            "title": "B",
            "tags": ["x"],
        }
        assert (entry.count, entry.parent, page.cursor) == (2, None, None)
        assert entry.created <= entry.active

    async def test_pages_follow_the_order_without_skipping_or_repeating(self, store: Store) -> None:
        names = [f"s{index:02}" for index in range(23)]
        for name in names:
            await _opened(store, name, {"owner": "ann" if name != "s05" else "bob"})
        ann = [name for name in names if name != "s05"]
        # Created and last active in the order they were made (names sort the same way).
        assert await _listed(store, where={"owner": "ann"}, limit=5) == ann[::-1]
        assert await _listed(store, where={"owner": "ann"}, limit=4, descending=False) == ann
        assert await _listed(store, order="created", limit=7) == names[::-1]
        assert await _listed(store, order="created", limit=1000, descending=False) == names
        first = await _listing(store).list_sessions(where={"owner": "ann"}, limit=22)
        assert first.cursor is None
        assert len(first.sessions) == 22

    async def test_a_cursor_continues_only_its_own_query(self, store: Store) -> None:
        for name in ("a", "b", "c"):
            await _opened(store, name, {"owner": "ann"})
        page = await _listing(store).list_sessions(where={"owner": "ann"}, limit=1)
        assert page.cursor is not None
        with pytest.raises(ValueError, match="different query"):
            await _listing(store).list_sessions(where={"owner": "bob"}, cursor=page.cursor)
        with pytest.raises(ValueError, match="not a listing cursor"):
            await _listing(store).list_sessions(cursor="garbage!")
        with pytest.raises(ValueError, match="limit"):
            await _listing(store).list_sessions(limit=0)
        with pytest.raises(ValueError, match="order"):
            await _listing(store).list_sessions(order="name")
        with pytest.raises(ValueError, match="timezone-aware"):
            await _listing(store).list_sessions(active_before=datetime(2026, 1, 1))
        with pytest.raises(ValueError, match="tags="):
            await _listing(store).list_sessions(where={"tags": "x"})
        # The same query with its cursor: the rest, in order.
        rest = await _listing(store).list_sessions(
            where={"owner": "ann"}, limit=5, cursor=page.cursor
        )
        assert [e.session_id for e in page.sessions + rest.sessions] == ["c", "b", "a"]

    async def test_time_ranges_are_half_open(self, store: Store) -> None:
        for name in ("a", "b", "c"):
            await _opened(store, name, {"owner": "ann"})
        entries = {e.session_id: e for e in (await _listing(store).list_sessions()).sessions}
        b = entries["b"]
        assert "b" not in await _listed(store, created_before=b.created)
        assert "b" in await _listed(store, created_since=b.created)
        assert await _listed(store, active_since=b.active, active_before=entries["c"].active) == [
            "b"
        ]
        assert await _listed(store, created_since=entries["c"].created + timedelta(days=1)) == []

    async def test_metadata_changes_with_its_event_in_the_same_commit(self, store: Store) -> None:
        await _opened(store, "a", {"owner": "ann", "title": "first"})
        async with SessionActor.open(
            session_id="a", store=store, metadata={"owner": "ann", "title": "first"}
        ) as s:
            assert s.log.count == 2  # the same record again appends nothing
            event = await s.set_metadata({"owner": "bob", "tags": ["moved"]})
            assert event.type == "session_metadata"
            assert s.metadata is not None
            assert s.metadata.owner == "bob"
        assert await _listed(store, where={"owner": "ann"}) == []
        (entry,) = (await _listing(store).list_sessions(where={"owner": "bob"})).sessions
        assert entry.metadata.tags == frozenset({"moved"})
        assert entry.metadata.title is None
        async with SessionActor.open(session_id="a", store=store) as s:
            assert s.metadata == entry.metadata  # from the log, as the store has it
            # History keeps the old record: the log as of seq 1 has the first title.
            earlier = metadata_of(s.log.upto(1).events())
            assert earlier is not None
            assert earlier.title == "first"

    async def test_active_moves_with_appending_commits_only(self, store: Store) -> None:
        await _opened(store, "a", {"owner": "ann"}, messages=3)
        (before,) = (await _listing(store).list_sessions()).sessions
        assert before.created <= before.active <= datetime.now(UTC)
        # A commit that only drops events (a snapshot's) does not make the session active.
        await store.commit("a", expected_count=before.count, events=[], dropped=[1])
        (after,) = (await _listing(store).list_sessions()).sessions
        assert (after.active, after.created, after.count) == (before.active, before.created, 4)
        # The time is kept to the second: a commit moves it once it is a second behind (the
        # store's clock must pass that second first; nothing here races).
        await _opened(store, "b", {"owner": "ann"})
        behind = before.active + timedelta(seconds=1.01) - datetime.now(UTC)
        await anyio.sleep(max(0.0, behind.total_seconds()))
        await _opened(store, "a", None)
        (again, _) = (await _listing(store).list_sessions()).sessions
        assert again.session_id == "a"  # moved to the front of the "active" order
        assert again.active >= before.active + timedelta(seconds=1)
        assert again.created == before.created
        assert (await _listed(store, order="created")) == ["b", "a"]

    async def test_a_fork_starts_with_the_metadata_of_its_fork_point(self, store: Store) -> None:
        if not supports(store, ForkingStore):
            pytest.skip("the store does not fork")
        forking = store
        async with SessionActor.open(session_id="p", store=store, metadata={"owner": "ann"}) as s:
            await s.add_message(Message.user("hi"))  # seq 1
            await s.set_metadata({"owner": "ann", "title": "later"})  # seq 2
        await forking.fork("p", "early", at=1)
        await forking.fork("p", "late", at=2)
        entries = {
            e.session_id: e
            for e in (await _listing(store).list_sessions(where={"owner": "ann"})).sessions
        }
        assert entries["early"].metadata.title is None
        assert entries["late"].metadata.title == "later"
        assert (entries["early"].parent, entries["early"].count) == ("p", 2)
        async with SessionActor.open(session_id="early", store=store) as s:
            assert s.metadata == entries["early"].metadata  # the log and the store agree

    async def test_delete_idle_keeps_a_session_written_to_since(self, store: Store) -> None:
        await _opened(store, "a", {"owner": "ann"})
        await _opened(store, "b", {"owner": "ann"})
        seen = {e.session_id: e for e in (await _listing(store).list_sessions()).sessions}
        await _opened(store, "b", None)  # written to after the listing
        assert await _listing(store).delete_idle(
            "a", count=seen["a"].count, active=seen["a"].active
        )
        assert not await _listing(store).delete_idle(
            "b", count=seen["b"].count, active=seen["b"].active
        )
        assert not await _listing(store).delete_idle(
            "a", count=seen["a"].count, active=seen["a"].active
        )
        assert await _listed(store) == ["b"]
        assert (await store.read("a")).count == 0
