"""Forks, for stores that share history (:class:`~nous_session.stores.base.ForkingStore`)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from nous_session.actor import SessionActor
from nous_session.stores.base import ForkingStore, SessionInfo, Store
from nous_session.testing._shared import (
    Capabilities,
    reopened,
    sample_log,
    stored_sample,
    user_event,
)


class ForkConformance(Capabilities):
    """``fork``: a session that starts as its parent's history up to a point; skipped on
    stores that cannot fork."""

    @pytest.mark.anyio
    async def test_a_fork_has_the_parents_history_up_to_its_point_and_then_its_own(
        self, store: Store, forking: ForkingStore, reopen: Callable[[], Store]
    ) -> None:
        log = await stored_sample(store, "parent", 10)
        await forking.fork("parent", "child", at=5)
        assert list(await store.load("child")) == list(log.upto(5).events())
        await store.commit("child", expected_count=6, events=[user_event(6, "child's own")])
        await store.commit("parent", expected_count=10, events=[user_event(10, "parent's own")])
        child = await store.read("child")
        assert [e.seq for e in child.events] == [0, 1, 2, 3, 4, 5, 6]
        assert child.events[-1].data["content"] == "child's own"
        assert (child.count, child.parent, child.fork_point) == (7, "parent", 5)
        assert [e.seq for e in await store.load("child", since=4)] == [4, 5, 6]
        assert len(await store.load("parent")) == 11
        infos = {info.session_id: info for info in await store.sessions()}
        assert infos["child"] == SessionInfo("child", 7, 7, 0, "parent", 5)
        assert infos["parent"] == SessionInfo("parent", 11, 11)
        async with reopened(store, reopen) as again:
            assert list(await again.load("child")) == list(child.events)

    @pytest.mark.anyio
    async def test_a_fork_is_refused_outside_the_parents_history(
        self, store: Store, forking: ForkingStore
    ) -> None:
        await store.commit("p", expected_count=0, events=sample_log(4).events())
        await store.commit("taken", expected_count=0, events=sample_log(1).events())
        for at in (-1, 4, 10):
            with pytest.raises(ValueError, match="fork"):
                await forking.fork("p", "c", at=at)
        with pytest.raises(ValueError, match="no session"):
            await forking.fork("nobody", "c", at=0)
        with pytest.raises(ValueError, match="exists"):
            await forking.fork("p", "taken", at=1)
        with pytest.raises(ValueError, match="session id"):
            await forking.fork("p", "", at=1)
        assert [info.session_id for info in await store.sessions()] == ["p", "taken"]

    @pytest.mark.anyio
    async def test_a_snapshot_or_delete_of_the_parent_leaves_its_forks_whole(
        self, store: Store, forking: ForkingStore
    ) -> None:
        log = await stored_sample(store, "p", 12)
        await forking.fork("p", "early", at=3)
        await forking.fork("p", "late", at=11)
        await forking.fork("late", "grandchild", at=10)  # a fork of a fork
        dropped = [event.seq for event in log.shadowed()]
        await store.commit("p", expected_count=12, events=[], dropped=dropped, horizon=12)
        assert list(await store.load("early")) == list(log.upto(3).events())
        assert list(await store.load("late")) == list(log.events())
        assert list(await store.load("grandchild")) == list(log.upto(10).events())
        assert list(await store.load("p")) == list(log.snapshot().events())
        assert await store.delete("p") is True
        assert list(await store.load("late")) == list(log.events())
        assert list(await store.load("grandchild")) == list(log.upto(10).events())
        # The child's own snapshot may drop what it shared: its fork keeps it.
        await store.commit("late", expected_count=12, events=[], dropped=dropped, horizon=12)
        assert list(await store.load("grandchild")) == list(log.upto(10).events())
        assert list(await store.load("late")) == list(log.snapshot().events())

    @pytest.mark.anyio
    async def test_a_fork_answers_its_parents_keys_up_to_the_fork_point(
        self, store: Store, forking: ForkingStore
    ) -> None:
        log = sample_log(6)
        await store.commit(
            "p", expected_count=0, events=log.events()[:3], keys=[("a", 0, 2), ("b", 2, 1)]
        )
        await store.commit("p", expected_count=3, events=log.events()[3:5], keys=[("c", 3, 2)])
        await forking.fork("p", "f", at=3)  # "c" (seqs 3..4) is only partly in its history
        await forking.fork("f", "g", at=1)  # a fork of a fork: only "a" (seqs 0..1)
        assert dict((await store.read("f")).keys) == {"a": (0, 2), "b": (2, 1)}
        assert dict((await store.read("f", since=1)).keys) == {"b": (2, 1)}
        assert dict((await store.read("g")).keys) == {"a": (0, 2)}
        # A retry in the fork of a call the parent made before the fork appends nothing.
        async with SessionActor.open(session_id="f", store=store) as fork:
            again = await fork.append("user_message", {"content": "retried"}, key="b")
            assert again == log.events()[2]
            await fork.append("user_message", {"content": "the fork's own"}, key="d")
        assert dict((await store.read("f")).keys) == {"a": (0, 2), "b": (2, 1), "d": (4, 1)}
        # The keys stay with the forks when the parent goes (they get their own copies).
        assert await store.delete("p") is True
        assert dict((await store.read("f")).keys) == {"a": (0, 2), "b": (2, 1), "d": (4, 1)}
        assert dict((await store.read("g")).keys) == {"a": (0, 2)}

    @pytest.mark.anyio
    async def test_a_fork_keeps_the_events_its_parent_kept_aside_for_a_key(
        self, store: Store, forking: ForkingStore
    ) -> None:
        log = sample_log(4)
        await store.commit("p", expected_count=0, events=log.events(), keys=[("k", 1, 2)])
        await store.commit(
            "p", expected_count=4, events=[], dropped=[0, 1, 2], kept=[1, 2], horizon=4
        )
        await forking.fork("p", "f", at=3)
        stored = await store.read("f")
        assert dict(stored.keys) == {"k": (1, 2)}
        assert list(stored.kept) == list(log.events()[1:3])
        async with SessionActor.open(session_id="f", store=store) as fork:
            assert await fork.append("user_message", {"content": "x"}, key="k") == (log.events()[1])
            assert fork.log.count == 4
