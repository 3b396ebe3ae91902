"""Loading and committing: the rules every store keeps, and the commits every store refuses."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from nous_session.errors import ConflictError
from nous_session.event import Event
from nous_session.stores.base import RebasingStore, Store, Stored
from nous_session.testing._shared import T0, sample_log, stored_sample, user_event


class CommitConformance:
    """Loads and commits: round trips, conflicts, drops, horizons, keys, and what is refused
    before anything is written."""

    # Loading and committing ------------------------------------------------------------------

    @pytest.mark.anyio
    async def test_unknown_session_is_empty(self, store: Store) -> None:
        assert list(await store.load("nobody")) == []
        assert await store.sessions() == []

    @pytest.mark.anyio
    async def test_commit_then_load_round_trips_every_event(self, store: Store) -> None:
        log = await stored_sample(store, "s")
        assert list(await store.load("s")) == list(log.events())

    @pytest.mark.anyio
    async def test_load_since_returns_the_tail_in_seq_order(self, store: Store) -> None:
        log = sample_log()
        await store.commit("s", expected_count=0, events=log.events()[:5])
        await store.commit("s", expected_count=5, events=log.events()[5:])
        for since in (0, 3, 5, 11, 12, 50):
            assert list(await store.load("s", since=since)) == list(log.since(since))

    @pytest.mark.anyio
    async def test_load_refuses_a_negative_since(self, store: Store) -> None:
        with pytest.raises(ValueError, match="since"):
            await store.load("s", since=-1)

    @pytest.mark.anyio
    async def test_a_clash_raises_conflict_and_writes_nothing(self, store: Store) -> None:
        log = sample_log(6)
        await store.commit("s", expected_count=0, events=log.events()[:3])
        for expected in (0, 1, 2):
            with pytest.raises(ConflictError):
                await store.commit(
                    "s", expected_count=expected, events=[user_event(expected, "late")]
                )
        assert list(await store.load("s")) == list(log.events()[:3])
        await store.commit("s", expected_count=3, events=log.events()[3:])
        assert list(await store.load("s")) == list(log.events())

    @pytest.mark.anyio
    async def test_concurrent_writers_with_one_expected_count_one_wins(self, store: Store) -> None:
        log = sample_log(4)
        outcomes: list[str] = []

        async def write(events: Any) -> None:
            try:
                await store.commit("s", expected_count=0, events=events)
                outcomes.append("won")
            except ConflictError:
                outcomes.append("lost")

        async with anyio.create_task_group() as tg:
            tg.start_soon(write, log.events()[:2])
            tg.start_soon(write, log.events()[:3])
        assert sorted(outcomes) == ["lost", "won"]
        stored = list(await store.load("s"))
        assert stored in (list(log.events()[:2]), list(log.events()[:3]))

    @pytest.mark.anyio
    async def test_malformed_commits_are_refused_before_writing(self, store: Store) -> None:
        log = sample_log(4)
        await store.commit("s", expected_count=0, events=log.events()[:2])
        with pytest.raises(ValueError, match="increasing"):
            await store.commit("s", expected_count=2, events=[log.events()[2], log.events()[1]])
        with pytest.raises(ValueError, match="increasing"):
            await store.commit("s", expected_count=2, events=[log.events()[1]])
        with pytest.raises(ValueError, match="dropped"):
            await store.commit("s", expected_count=2, events=[], dropped=[5])
        with pytest.raises(ValueError, match="session id"):
            await store.commit("", expected_count=0, events=log.events()[:1])
        with pytest.raises(ValueError, match="must be Events"):
            # A string among the events, on purpose: the store must refuse it.
            await store.commit("s", expected_count=2, events=[log.events()[2], "event 3"])  # type: ignore[list-item]
        assert list(await store.load("s")) == list(log.events()[:2])

    @pytest.mark.anyio
    async def test_dropped_seqs_go_in_the_same_step_as_new_events(self, store: Store) -> None:
        log = await stored_sample(store, "s", 12)
        snapshot = log.snapshot()
        dropped = [event.seq for event in log.shadowed()]
        assert dropped, "the sample must shadow something"
        extra = snapshot.append("user_message", {"content": "after"}, time=T0)
        await store.commit(
            "s", expected_count=12, events=extra.since(12), dropped=dropped, horizon=12
        )
        assert list(await store.load("s")) == list(extra.events())
        # A clash on the same step deletes nothing either.
        with pytest.raises(ConflictError):
            await store.commit("s", expected_count=12, events=[], dropped=[extra.events()[0].seq])
        assert list(await store.load("s")) == list(extra.events())

    @pytest.mark.anyio
    async def test_a_drop_only_commit_keeps_the_count(self, store: Store) -> None:
        log = await stored_sample(store, "s", 12)
        dropped = [event.seq for event in log.shadowed()]
        await store.commit("s", expected_count=12, events=[], dropped=dropped, horizon=12)
        assert [info.count for info in await store.sessions()] == [12]
        with pytest.raises(ConflictError):
            await store.commit("s", expected_count=len(log.events()) - len(dropped), events=[])
        await store.commit("s", expected_count=12, events=[])

    # A commit that would leave a session no store could open is refused --------------------

    @staticmethod
    async def _three(store: Store) -> Stored:
        """Session "s" with three events, one keyed: what each refused commit must leave."""
        await store.commit("s", expected_count=0, events=sample_log(3).events(), keys=[("k", 1, 1)])
        return await store.read("s")

    @staticmethod
    async def _unchanged(store: Store, before: Stored) -> None:
        """Nothing of "s" changed: events, count, horizon, keys and kept events."""
        after = await store.read("s")
        assert list(after.events) == list(before.events)
        assert (after.count, after.horizon) == (before.count, before.horizon)
        assert dict(after.keys) == dict(before.keys)
        assert list(after.kept) == list(before.kept)

    @pytest.mark.anyio
    async def test_a_horizon_past_the_new_count_is_refused(self, store: Store) -> None:
        before = await self._three(store)
        # Two snapshot calls in one actor batch once sent exactly this; every store took it,
        # and the session could never be opened again.
        with pytest.raises(ValueError, match="horizon 4 is past the count 3"):
            await store.commit("s", expected_count=3, events=(), horizon=4, expected_horizon=0)
        with pytest.raises(ValueError, match="horizon 5 is past the count 4"):
            await store.commit("s", expected_count=3, events=[user_event(3, "x")], horizon=5)
        await self._unchanged(store, before)
        await store.commit("s", expected_count=3, events=(), horizon=3, expected_horizon=0)
        assert (await store.read("s")).horizon == 3

    @pytest.mark.anyio
    async def test_a_horizon_cannot_move_back(self, store: Store) -> None:
        await self._three(store)
        await store.commit("s", expected_count=3, events=[], dropped=[0], horizon=3)
        before = await store.read("s")
        with pytest.raises(ValueError, match="back from 3"):
            await store.commit("s", expected_count=3, events=(), horizon=2, expected_horizon=3)
        # Without expected_horizon the store checks against the horizon it holds.
        with pytest.raises(ValueError, match="back from 3"):
            await store.commit("s", expected_count=3, events=(), horizon=1)
        await self._unchanged(store, before)

    @pytest.mark.anyio
    async def test_commit_events_must_be_contiguous_from_the_count(self, store: Store) -> None:
        before = await self._three(store)
        bad: list[tuple[list[Event], dict[str, Any], str]] = [
            ([user_event(4, "skips 3")], {}, "contiguous from 3: seqs 3 are missing"),
            ([user_event(3, "a"), user_event(5, "skips 4")], {}, "seqs 4 are missing"),
            ([user_event(3, "a"), user_event(3, "again")], {}, "increasing"),
            ([user_event(2, "old")], {}, "increasing"),
            # A gap is allowed only below a horizon the commit sets.
            ([user_event(3, "a"), user_event(6, "b")], {"horizon": 5}, "4..5 are missing"),
        ]
        for events, extra, message in bad:
            with pytest.raises(ValueError, match=message):
                await store.commit("s", expected_count=3, events=events, **extra)
        for expected in (-1, "3", True):
            with pytest.raises(ValueError, match="expected_count"):
                # "3" is a string, on purpose: a store refuses it, as it refuses -1 and True.
                await store.commit("s", expected_count=expected, events=[])  # type: ignore[arg-type]
        await self._unchanged(store, before)
        # The new count follows from the events: expected_count + len(events).
        await store.commit("s", expected_count=3, events=[user_event(3, "a"), user_event(4, "b")])
        assert (await store.read("s")).count == 5

    @pytest.mark.anyio
    async def test_an_import_may_leave_gaps_below_the_horizon_it_sets(self, store: Store) -> None:
        # What `nous-session import` sends for an exported snapshotted session.
        events = [user_event(0, "a"), user_event(2, "c"), user_event(3, "d")]
        await store.commit("s", expected_count=0, events=events, horizon=2)
        stored = await store.read("s")
        assert (list(stored.events), stored.count, stored.horizon) == (events, 4, 2)
        with pytest.raises(ValueError, match="1 are missing at or above the new horizon 1"):
            await store.commit("t", expected_count=0, events=events, horizon=1)
        assert await store.read("t") == Stored((), 0)

    @pytest.mark.anyio
    async def test_dropped_seqs_must_lie_below_the_count_and_the_new_horizon(
        self, store: Store
    ) -> None:
        before = await self._three(store)
        bad: list[tuple[list[int], dict[str, Any], str]] = [
            ([3], {"horizon": 3}, "dropped seq must be an int below 3"),
            ([-1], {"horizon": 3}, "dropped seq must be an int below 3"),
            ([2], {"horizon": 2}, "dropping seq 2, at or above the horizon 2"),
            ([1], {"expected_horizon": 0}, "dropping seq 1, at or above the horizon 0"),
        ]
        for dropped, extra, message in bad:
            with pytest.raises(ValueError, match=message):
                await store.commit("s", expected_count=3, events=[], dropped=dropped, **extra)
        await self._unchanged(store, before)
        await store.commit("s", expected_count=3, events=[], dropped=[0, 2], horizon=3)
        assert [e.seq for e in (await store.read("s")).events] == [1]
        # Below the stored horizon, a drop needs no new one.
        await store.commit("s", expected_count=3, events=[], dropped=[1])
        assert [e.seq for e in (await store.read("s")).events] == []

    @pytest.mark.anyio
    async def test_a_drop_naming_no_horizon_moves_it_past_the_drop(self, store: Store) -> None:
        # The first Store contract's snapshot: the session stays one that can be opened.
        await self._three(store)
        await store.commit("s", expected_count=3, events=[], dropped=[0, 1])
        stored = await store.read("s")
        assert ([e.seq for e in stored.events], stored.count, stored.horizon) == ([2], 3, 2)
        await store.commit("s", expected_count=3, events=[], dropped=[0])  # below: unchanged
        assert (await store.read("s")).horizon == 2

    @pytest.mark.anyio
    async def test_kept_seqs_must_be_dropped(self, store: Store) -> None:
        before = await self._three(store)
        with pytest.raises(ValueError, match=r"kept seq must also be dropped; \[1\]"):
            await store.commit("s", expected_count=3, events=[], dropped=[0], kept=[1], horizon=3)
        await self._unchanged(store, before)

    @pytest.mark.anyio
    async def test_keys_must_name_this_commits_events(self, store: Store) -> None:
        before = await self._three(store)
        new = [user_event(3, "a"), user_event(4, "b")]
        bad: list[tuple[list[Event], tuple[str, int, int], str]] = [
            (new, ("old", 2, 2), "seqs 2..3 are not all among this commit's events"),
            (new, ("past", 4, 2), "seqs 4..5 are not all among"),
            (new, ("empty", 3, 0), "count >= 1"),
            ([], ("nothing", 3, 1), "seqs 3 are not all among"),
        ]
        for events, key, message in bad:
            with pytest.raises(ValueError, match=message):
                await store.commit("s", expected_count=3, events=events, keys=[key])
        await self._unchanged(store, before)
        if isinstance(store, RebasingStore):
            with pytest.raises(ValueError, match=r"seqs 4\.\.5 are not all among"):
                await store.commit_rebased("s", expected_count=3, events=new, keys=[("past", 4, 2)])
            await self._unchanged(store, before)
