"""What a read returns at once: count, horizon, idempotency keys, kept events, commit ids."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from nous_session.errors import ConflictError
from nous_session.stores.base import OutcomeStore, RebasingStore, Store, Stored, supports
from nous_session.testing._shared import T0, reopened, sample_log, stored_sample, user_event


class StoredConformance:
    """``read`` and what a commit leaves: the count that outlives a snapshot, the horizon,
    the keys and the events kept aside for them, and commit ids (on stores that keep them)."""

    @pytest.mark.anyio
    async def test_read_gives_events_count_horizon_and_keys_at_once(self, store: Store) -> None:
        assert await store.read("nobody") == Stored((), 0)
        log = sample_log(6)
        await store.commit(
            "s", expected_count=0, events=log.events()[:4], keys=[("k1", 0, 2), ("k2", 2, 1)]
        )
        await store.commit("s", expected_count=4, events=log.events()[4:], keys=[("k3", 5, 1)])
        stored = await store.read("s")
        assert list(stored.events) == list(log.events())
        assert (stored.count, stored.horizon, stored.parent, stored.fork_point) == (
            6,
            0,
            None,
            None,
        )
        assert dict(stored.keys) == {"k1": (0, 2), "k2": (2, 1), "k3": (5, 1)}
        assert list(stored.kept) == []
        tail = await store.read("s", since=2)
        assert list(tail.events) == list(log.since(2))
        assert dict(tail.keys) == {"k2": (2, 1), "k3": (5, 1)}
        with pytest.raises(ValueError, match="since"):
            await store.read("s", since=-1)

    @pytest.mark.anyio
    async def test_a_session_made_again_has_another_identity(self, store: Store) -> None:
        """A store that gives ``Stored.uid`` gives one that stays while the session lives and
        changes when it is deleted and made again (an actor holding it then knows)."""
        await stored_sample(store, "s", 2)
        first = await store.read("s")
        if first.uid is None:
            pytest.skip(f"{type(store).__name__} gives sessions no identity (Stored.uid)")
        await store.commit("s", expected_count=2, events=sample_log(3).events()[2:])
        assert (await store.read("s", since=3)).uid == first.uid
        assert await store.delete("s")
        assert (await store.read("s")).uid is None
        await stored_sample(store, "s", 4)
        assert (await store.read("s", since=2)).uid not in (None, first.uid)

    @pytest.mark.anyio
    async def test_a_commit_names_the_identity_a_read_gives(self, store: Store) -> None:
        """A store whose commit returns the session's identity (the contract since it does)
        returns the one a read then gives: the new one when the commit made the session, the
        same while it lives, another once it was deleted and made again; and so does a
        rebasing commit's ``Rebased.uid``. (A store that returns None does not tell.)"""
        log = sample_log(4)
        made = await store.commit("s", expected_count=0, events=log.events()[:1])
        if made is None:
            pytest.skip(f"{type(store).__name__}.commit does not name the session's identity")
        assert isinstance(made, str), f"an identity is a str, not {made!r}"
        assert made, "an identity is a non-empty str"
        assert made == (await store.read("s")).uid
        assert await store.commit("s", expected_count=1, events=log.events()[1:2]) == made
        assert await store.commit("s", expected_count=2, events=[], dropped=[0], horizon=2) == made
        if supports(store, RebasingStore):
            rebased = await store.commit_rebased("s", expected_count=1, events=[user_event(1, "r")])
            assert rebased.uid == made
        assert await store.delete("s")
        again = await store.commit("s", expected_count=0, events=log.events()[:1])
        assert again == (await store.read("s")).uid
        assert again not in (None, made)
        if supports(store, RebasingStore):
            fresh = await store.commit_rebased("t", expected_count=0, events=log.events()[:1])
            assert fresh.uid is not None
            assert fresh.uid == (await store.read("t")).uid
            assert fresh.uid != again

    @pytest.mark.anyio
    async def test_a_commit_expecting_another_identity_writes_nothing(self, store: Store) -> None:
        """A store whose class sets ``checks_uid`` commits with ``expected_uid`` only into the
        session of that identity: not into one made again under the id since, nor where there
        is none."""
        if getattr(type(store), "checks_uid", False) is not True:
            pytest.skip(f"{type(store).__name__} takes no expected_uid (no checks_uid)")
        anything: Any = store  # the argument is beyond the Store protocol
        log = sample_log(3)
        await store.commit("s", expected_count=0, events=log.events()[:1])
        old = (await store.read("s")).uid
        assert old is not None
        await anything.commit("s", expected_count=1, events=log.events()[1:2], expected_uid=old)
        with pytest.raises(ConflictError):
            await anything.commit(
                "s", expected_count=2, events=log.events()[2:], expected_uid="another"
            )
        assert await store.delete("s")
        await store.commit("s", expected_count=0, events=[user_event(0, "a"), user_event(1, "b")])
        with pytest.raises(ConflictError):
            await anything.commit("s", expected_count=2, events=log.events()[2:], expected_uid=old)
        if supports(store, RebasingStore):
            with pytest.raises(ConflictError):
                await anything.commit_rebased(
                    "s", expected_count=1, events=[user_event(1, "late")], expected_uid=old
                )
        assert [event.data["content"] for event in await store.load("s")] == ["a", "b"]
        new = (await store.read("s")).uid
        done = await anything.commit(
            "s", expected_count=2, events=[user_event(2, "c")], expected_uid=new
        )
        assert done in (None, new)
        with pytest.raises(ConflictError):
            await anything.commit(
                "nobody", expected_count=0, events=log.events()[:1], expected_uid=old
            )
        if supports(store, RebasingStore):
            with pytest.raises(ConflictError):
                await anything.commit_rebased(
                    "nobody", expected_count=0, events=log.events()[:1], expected_uid=old
                )
        assert (await store.read("nobody")).count == 0
        assert [info.session_id for info in await store.sessions()] == ["s"]
        for bad in ("", 7):
            with pytest.raises(ValueError, match="expected_uid"):
                await anything.commit(
                    "s", expected_count=3, events=[user_event(3, "d")], expected_uid=bad
                )
        assert (await store.read("s")).count == 3

    @pytest.mark.anyio
    async def test_a_snapshot_sets_the_horizon_and_the_count_outlives_its_events(
        self, store: Store, reopen: Callable[[], Store]
    ) -> None:
        await stored_sample(store, "s", 6)
        # Drop the newest events too: the count is the store's to keep, not the rows'.
        await store.commit(
            "s", expected_count=6, events=[], dropped=[3, 4, 5], expected_horizon=0, horizon=6
        )
        async with reopened(store, reopen) as again:
            stored = await again.read("s")
            assert [e.seq for e in stored.events] == [0, 1, 2]
            assert (stored.count, stored.horizon) == (6, 6)
            assert [e.seq for e in await again.load("s")] == [0, 1, 2]
            assert [info.count for info in await again.sessions()] == [6]

    @pytest.mark.anyio
    async def test_a_stale_horizon_is_a_conflict(self, store: Store) -> None:
        log = await stored_sample(store, "s", 6)
        await store.commit("s", expected_count=6, events=[], dropped=[1], horizon=6)
        late = log.append("user_message", {"content": "stale"}, time=T0)
        with pytest.raises(ConflictError):
            await store.commit("s", expected_count=6, events=late.since(6), expected_horizon=0)
        assert (await store.read("s")).count == 6
        await store.commit("s", expected_count=6, events=late.since(6), expected_horizon=6)
        assert (await store.read("s")).count == 7

    @pytest.mark.anyio
    async def test_a_taken_key_is_a_conflict_and_writes_nothing(
        self, store: Store, reopen: Callable[[], Store]
    ) -> None:
        log = sample_log(4)
        await store.commit("s", expected_count=0, events=log.events()[:2], keys=[("once", 0, 2)])
        with pytest.raises(ConflictError):
            await store.commit(
                "s", expected_count=2, events=log.events()[2:], keys=[("once", 2, 2)]
            )
        with pytest.raises(ValueError, match="key"):
            await store.commit("s", expected_count=2, events=log.events()[2:], keys=[("x", 9, 1)])
        with pytest.raises(ValueError, match="key"):
            await store.commit("s", expected_count=2, events=log.events()[2:], keys=[("", 2, 1)])
        async with reopened(store, reopen) as again:
            stored = await again.read("s")
            assert stored.count == 2
            assert dict(stored.keys) == {"once": (0, 2)}
        # Another session may use the same key.
        await store.commit("t", expected_count=0, events=log.events()[:1], keys=[("once", 0, 1)])

    @pytest.mark.anyio
    async def test_dropped_events_of_a_key_are_kept_aside(self, store: Store) -> None:
        log = sample_log(4)
        await store.commit("s", expected_count=0, events=log.events(), keys=[("k", 1, 2)])
        await store.commit(
            "s", expected_count=4, events=[], dropped=[0, 1, 2], kept=[1, 2], horizon=4
        )
        stored = await store.read("s")
        assert [e.seq for e in stored.events] == [3]
        assert list(stored.kept) == list(log.events()[1:3])
        assert dict(stored.keys) == {"k": (1, 2)}
        assert list((await store.read("s", since=1)).kept) == []
        with pytest.raises(ValueError, match="kept"):
            await store.commit("s", expected_count=4, events=[], dropped=[3], kept=[2])

    @pytest.mark.anyio
    async def test_a_commit_id_says_where_a_commit_landed(self, store: Store) -> None:
        if not supports(store, OutcomeStore):
            pytest.skip(f"{type(store).__name__} cannot look up commit ids")
        outcome: Any = store
        log = sample_log(5)
        await store.commit("s", expected_count=0, events=log.events()[:2], commit_id="c-1")
        await store.commit("s", expected_count=2, events=[], commit_id="c-empty")
        await store.commit("s", expected_count=2, events=log.events()[2:], commit_id="c-2")
        assert await outcome.committed("s", "c-1") == (0, 2)
        assert await outcome.committed("s", "c-empty") == (2, 0)
        assert await outcome.committed("s", "c-2") == (2, 3)
        assert await outcome.committed("s", "never") is None
        assert await outcome.committed("other", "c-1") is None
        # The same commit sent again (after a lost reply, say) can never land twice.
        with pytest.raises(ConflictError):
            await store.commit("s", expected_count=5, events=[user_event(5, "x")], commit_id="c-2")
        assert (await store.read("s")).count == 5
        if isinstance(store, RebasingStore):
            done = await store.commit_rebased(
                "s", expected_count=3, events=[user_event(3, "moved")], commit_id="r-1"
            )
            assert await outcome.committed("s", "r-1") == (done.events[0].seq, 1)
            with pytest.raises(ConflictError):
                await store.commit_rebased(
                    "s", expected_count=3, events=[user_event(3, "again")], commit_id="r-1"
                )
            assert (await store.read("s")).count == 6
