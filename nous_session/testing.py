"""A store conformance suite, written once, run against every backend.

Third-party stores prove themselves with one subclass::

    import pytest
    from nous_session.testing import StoreConformance

    class TestMyStore(StoreConformance):
        @pytest.fixture
        def anyio_backend(self):
            return "asyncio"  # or parametrise over ("asyncio", "trio")

        @pytest.fixture
        async def store(self):
            store = MyStore(...)  # fresh and empty for every test
            yield store
            await store.aclose()

        @pytest.fixture
        def reopen(self, store):
            # A new store object over the same persisted data (or the same object for an
            # in-memory store); the suite closes what it opens.
            return lambda: MyStore(...)

It needs pytest and anyio's pytest plugin (``pip install nous_session[test]``). Each test
asserts one rule of the :class:`~nous_session.stores.Store` contract.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from nous_session.actor import SessionActor
from nous_session.errors import ConflictError, StoreError
from nous_session.event import Event, make_event
from nous_session.listing import metadata_of
from nous_session.log import Log
from nous_session.message import Message, ToolCall
from nous_session.stores.base import (
    ForkingStore,
    ListingStore,
    OutcomeStore,
    RebasingStore,
    SessionInfo,
    Store,
    Stored,
    supports,
)

__all__ = ["ListingConformance", "StoreConformance", "sample_log"]

_T0 = datetime(2026, 1, 1, 12, 0, 0, 123456, tzinfo=UTC)

ODD_SESSION_IDS = (
    "plain",
    'it\'s "quoted"',
    "x'); DROP TABLE nous_events; --",
    "ünïcødé 🚀",
    "a" * 256,  # the longest id every store takes (MAX_SESSION_ID_BYTES)
    "ü" * 128,  # as long, in two-byte characters
    "with\nnewline and\ttab",
)


def sample_log(size: int = 12, *, start: datetime = _T0) -> Log:
    """A log with every kind of event: messages, tool pairs, bookkeeping, a replace."""
    log = Log()
    for index in range(size):
        time = start + timedelta(seconds=index, microseconds=index)
        kind = index % 6
        if kind == 0:
            log = log.append("user_message", {"content": f"question {index} ✓"}, time=time)
        elif kind == 1:
            log = log.append("turn_start", {"turn": index}, time=time)
        elif kind == 2:
            call = ToolCall(f"call_{index}", "lookup", {"q": index, "deep": {"x": [1, 2.5, None]}})
            log = log.append(
                "assistant_message",
                Message.assistant("checking", tool_calls=[call]).to_json(),
                time=time,
            )
        elif kind == 3:
            log = log.append(
                "tool_result",
                Message.tool(f"call_{index - 1}", {"ok": True}, name="lookup").to_json(),
                time=time,
            )
        elif kind == 4:
            log = log.append(
                "assistant_message",
                {
                    "content": [{"type": "text", "text": f"answer {index}"}],
                    "reasoning_content": "r",
                },
                time=time,
            )
        else:
            log = log.append(
                "system_message",
                {"content": f"summary up to {index - 2}", "surface_op": ["replace", 0, index - 2]},
                time=time,
            )
    return log


def _user(seq: int, content: str) -> Event:
    return make_event(seq, "user_message", {"content": content}, _T0 + timedelta(seconds=seq))


class StoreConformance:
    """The Store contract as tests. Subclass and provide ``store`` and ``reopen`` fixtures."""

    @pytest.fixture
    def reopen(self, store: Store) -> Callable[[], Store]:
        """A fresh store object over the same data; the default reuses ``store`` itself."""
        return lambda: store

    # Loading and committing ------------------------------------------------------------------

    @pytest.mark.anyio
    async def test_unknown_session_is_empty(self, store: Store) -> None:
        assert list(await store.load("nobody")) == []
        assert await store.sessions() == []

    @pytest.mark.anyio
    async def test_commit_then_load_round_trips_every_event(self, store: Store) -> None:
        log = sample_log()
        await store.commit("s", expected_count=0, events=log.events())
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
                await store.commit("s", expected_count=expected, events=[_user(expected, "late")])
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
            await store.commit("s", expected_count=2, events=[log.events()[2], "event 3"])  # type: ignore[list-item]
        assert list(await store.load("s")) == list(log.events()[:2])

    @pytest.mark.anyio
    async def test_dropped_seqs_go_in_the_same_step_as_new_events(self, store: Store) -> None:
        log = sample_log(12)
        await store.commit("s", expected_count=0, events=log.events())
        snapshot = log.snapshot()
        dropped = [event.seq for event in log.shadowed()]
        assert dropped, "the sample must shadow something"
        extra = snapshot.append("user_message", {"content": "after"}, time=_T0)
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
        log = sample_log(12)
        await store.commit("s", expected_count=0, events=log.events())
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
            await store.commit("s", expected_count=3, events=[_user(3, "x")], horizon=5)
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
            ([_user(4, "skips 3")], {}, "contiguous from 3: seqs 3 are missing"),
            ([_user(3, "a"), _user(5, "skips 4")], {}, "seqs 4 are missing"),
            ([_user(3, "a"), _user(3, "again")], {}, "increasing"),
            ([_user(2, "old")], {}, "increasing"),
            # A gap is allowed only below a horizon the commit sets.
            ([_user(3, "a"), _user(6, "b")], {"horizon": 5}, "4..5 are missing"),
        ]
        for events, extra, message in bad:
            with pytest.raises(ValueError, match=message):
                await store.commit("s", expected_count=3, events=events, **extra)
        for expected in (-1, "3", True):
            with pytest.raises(ValueError, match="expected_count"):
                await store.commit("s", expected_count=expected, events=[])  # type: ignore[arg-type]
        await self._unchanged(store, before)
        # The new count follows from the events: expected_count + len(events).
        await store.commit("s", expected_count=3, events=[_user(3, "a"), _user(4, "b")])
        assert (await store.read("s")).count == 5

    @pytest.mark.anyio
    async def test_an_import_may_leave_gaps_below_the_horizon_it_sets(self, store: Store) -> None:
        # What `nous-session import` sends for an exported snapshotted session.
        events = [_user(0, "a"), _user(2, "c"), _user(3, "d")]
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
        new = [_user(3, "a"), _user(4, "b")]
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

    # Rebasing commits (for stores that offer them) -----------------------------------------

    @staticmethod
    def _rebasing(store: Store) -> RebasingStore:
        if not isinstance(store, RebasingStore):
            pytest.skip(f"{type(store).__name__} has no commit_rebased")
        return store

    @pytest.mark.anyio
    async def test_a_rebasing_commit_with_no_other_writer_lands_where_asked(
        self, store: Store
    ) -> None:
        rebasing = self._rebasing(store)
        log = sample_log(5)
        first = await rebasing.commit_rebased("s", expected_count=0, events=log.events()[:3])
        assert (first.shift, list(first.others)) == (0, [])
        assert list(first.events) == list(log.events()[:3])
        second = await rebasing.commit_rebased("s", expected_count=3, events=log.events()[3:])
        assert (second.shift, list(second.others)) == (0, [])
        assert list(await store.load("s")) == list(log.events())
        assert await store.sessions() == [SessionInfo("s", 5, 5)]

    @pytest.mark.anyio
    async def test_a_rebasing_commit_goes_after_what_other_writers_stored(
        self, store: Store
    ) -> None:
        rebasing = self._rebasing(store)
        log = sample_log(4)
        await store.commit("s", expected_count=0, events=log.events())
        mine = [_user(2, "mine a"), _user(3, "mine b ✓")]
        done = await rebasing.commit_rebased("s", expected_count=2, events=mine)
        assert done.shift == 2
        assert list(done.others) == list(log.events()[2:])
        assert [(e.seq, e.type, dict(e.data), e.time) for e in done.events] == [
            (e.seq + 2, e.type, dict(e.data), e.time) for e in mine
        ]
        assert list(await store.load("s")) == [*log.events(), *done.events]
        assert await store.sessions() == [SessionInfo("s", 6, 6)]
        # The count moved with it: a plain commit must now expect 6.
        with pytest.raises(ConflictError):
            await store.commit("s", expected_count=4, events=[_user(4, "stale")])
        await store.commit("s", expected_count=6, events=[_user(6, "next")])

    @pytest.mark.anyio
    async def test_a_rebasing_commit_reports_only_what_a_snapshot_left(self, store: Store) -> None:
        rebasing = self._rebasing(store)
        log = sample_log(12)
        dropped = [event.seq for event in log.shadowed()]
        await store.commit("s", expected_count=0, events=log.events())
        await store.commit("s", expected_count=12, events=[], dropped=dropped, horizon=12)
        done = await rebasing.commit_rebased("s", expected_count=0, events=[_user(0, "late")])
        assert done.shift == 12
        assert list(done.others) == list(log.snapshot().events())
        assert [e.seq for e in done.events] == [12]

    @pytest.mark.anyio
    async def test_malformed_rebasing_commits_are_refused_before_writing(
        self, store: Store
    ) -> None:
        rebasing = self._rebasing(store)
        await store.commit("s", expected_count=0, events=[_user(0, "kept")])
        bad: list[tuple[str, int, list[Event], str]] = [
            ("s", 1, [], "at least one event"),
            ("s", 1, [_user(2, "gap")], "contiguous"),
            ("s", 1, [_user(1, "a"), _user(3, "gap")], "contiguous"),
            ("s", -1, [_user(0, "x")], "expected_count"),
            ("", 0, [_user(0, "x")], "session id"),
            ("s", 1, [_user(1, "a"), {"seq": 2}], "must be Events"),  # type: ignore[list-item]
        ]
        for session_id, expected, events, message in bad:
            with pytest.raises(ValueError, match=message):
                await rebasing.commit_rebased(session_id, expected_count=expected, events=events)
        # A count below what the caller expects (the session was deleted, say) is a conflict.
        with pytest.raises(ConflictError):
            await rebasing.commit_rebased("s", expected_count=5, events=[_user(5, "ahead")])
        with pytest.raises(ConflictError):
            await rebasing.commit_rebased("gone", expected_count=1, events=[_user(1, "ahead")])
        assert [e.data["content"] for e in await store.load("s")] == ["kept"]
        assert await store.sessions() == [SessionInfo("s", 1, 1)]

    @pytest.mark.anyio
    async def test_concurrent_rebasing_commits_all_land_once_in_order(self, store: Store) -> None:
        rebasing = self._rebasing(store)
        writers, rounds = 6, 8
        landed: dict[int, list[Event]] = {}

        async def write(writer: int) -> None:
            known = 0  # a stale view on purpose: every commit but the first must move
            for round_ in range(rounds):
                batch = [
                    _user(known + offset, f"w{writer} r{round_} e{offset}")
                    for offset in range(1 + (writer + round_) % 3)
                ]
                done = await rebasing.commit_rebased("s", expected_count=known, events=batch)
                assert [e.data["content"] for e in done.events] == [
                    e.data["content"] for e in batch
                ]
                landed.setdefault(writer, []).extend(done.events)
                known = done.events[-1].seq + 1 if writer % 2 else known

        async with anyio.create_task_group() as tg:
            for writer in range(writers):
                tg.start_soon(write, writer)
        stored = list(await store.load("s"))
        assert [e.seq for e in stored] == list(range(len(stored)))
        assert sorted(stored, key=lambda e: e.seq) == sorted(
            (e for events in landed.values() for e in events), key=lambda e: e.seq
        )
        for writer, events in landed.items():
            mine = [e for e in stored if str(e.data["content"]).startswith(f"w{writer} ")]
            assert mine == events  # each writer's order kept

    # Store contract v2: count, horizon, keys, kept events, commit ids ------------------------

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
    async def test_a_snapshot_sets_the_horizon_and_the_count_outlives_its_events(
        self, store: Store, reopen: Callable[[], Store]
    ) -> None:
        log = sample_log(6)
        await store.commit("s", expected_count=0, events=log.events())
        # Drop the newest events too: the count is the store's to keep, not the rows'.
        await store.commit(
            "s", expected_count=6, events=[], dropped=[3, 4, 5], expected_horizon=0, horizon=6
        )
        again = reopen()
        try:
            stored = await again.read("s")
            assert [e.seq for e in stored.events] == [0, 1, 2]
            assert (stored.count, stored.horizon) == (6, 6)
            assert [e.seq for e in await again.load("s")] == [0, 1, 2]
            assert [info.count for info in await again.sessions()] == [6]
        finally:
            if again is not store:
                await again.aclose()

    @pytest.mark.anyio
    async def test_a_stale_horizon_is_a_conflict(self, store: Store) -> None:
        log = sample_log(6)
        await store.commit("s", expected_count=0, events=log.events())
        await store.commit("s", expected_count=6, events=[], dropped=[1], horizon=6)
        late = log.append("user_message", {"content": "stale"}, time=_T0)
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
        again = reopen()
        try:
            stored = await again.read("s")
            assert stored.count == 2
            assert dict(stored.keys) == {"once": (0, 2)}
        finally:
            if again is not store:
                await again.aclose()
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
            await store.commit("s", expected_count=5, events=[_user(5, "x")], commit_id="c-2")
        assert (await store.read("s")).count == 5
        if isinstance(store, RebasingStore):
            done = await store.commit_rebased(
                "s", expected_count=3, events=[_user(3, "moved")], commit_id="r-1"
            )
            assert await outcome.committed("s", "r-1") == (done.events[0].seq, 1)
            with pytest.raises(ConflictError):
                await store.commit_rebased(
                    "s", expected_count=3, events=[_user(3, "again")], commit_id="r-1"
                )
            assert (await store.read("s")).count == 6

    @pytest.mark.anyio
    async def test_a_rebasing_commit_moves_its_keys_and_reports_the_others(
        self, store: Store
    ) -> None:
        rebasing = self._rebasing(store)
        await store.commit("s", expected_count=0, events=[_user(0, "a")], keys=[("theirs", 0, 1)])
        done = await rebasing.commit_rebased(
            "s", expected_count=0, events=[_user(0, "b")], keys=[("mine", 0, 1)]
        )
        assert done.shift == 1
        assert dict(done.keys) == {"theirs": (0, 1)}
        assert dict((await store.read("s")).keys) == {"theirs": (0, 1), "mine": (1, 1)}
        with pytest.raises(ConflictError):
            await rebasing.commit_rebased(
                "s", expected_count=2, events=[_user(2, "c")], keys=[("mine", 2, 1)]
            )
        assert (await store.read("s")).count == 2

    # Forks (for stores that share history) --------------------------------------------------

    @staticmethod
    def _forking(store: Store) -> ForkingStore:
        if not supports(store, ForkingStore):
            pytest.skip(f"{type(store).__name__} cannot fork")
        return store  # type: ignore[return-value]

    @pytest.mark.anyio
    async def test_a_fork_has_the_parents_history_up_to_its_point_and_then_its_own(
        self, store: Store, reopen: Callable[[], Store]
    ) -> None:
        forking = self._forking(store)
        log = sample_log(10)
        await store.commit("parent", expected_count=0, events=log.events())
        await forking.fork("parent", "child", at=5)
        assert list(await store.load("child")) == list(log.upto(5).events())
        await store.commit("child", expected_count=6, events=[_user(6, "child's own")])
        await store.commit("parent", expected_count=10, events=[_user(10, "parent's own")])
        child = await store.read("child")
        assert [e.seq for e in child.events] == [0, 1, 2, 3, 4, 5, 6]
        assert child.events[-1].data["content"] == "child's own"
        assert (child.count, child.parent, child.fork_point) == (7, "parent", 5)
        assert [e.seq for e in await store.load("child", since=4)] == [4, 5, 6]
        assert len(await store.load("parent")) == 11
        infos = {info.session_id: info for info in await store.sessions()}
        assert infos["child"] == SessionInfo("child", 7, 7, 0, "parent", 5)
        assert infos["parent"] == SessionInfo("parent", 11, 11)
        again = reopen()
        try:
            assert list(await again.load("child")) == list(child.events)
        finally:
            if again is not store:
                await again.aclose()

    @pytest.mark.anyio
    async def test_a_fork_is_refused_outside_the_parents_history(self, store: Store) -> None:
        forking = self._forking(store)
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
        self, store: Store
    ) -> None:
        forking = self._forking(store)
        log = sample_log(12)
        await store.commit("p", expected_count=0, events=log.events())
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
    async def test_a_fork_answers_its_parents_keys_up_to_the_fork_point(self, store: Store) -> None:
        forking = self._forking(store)
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
        self, store: Store
    ) -> None:
        forking = self._forking(store)
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

    # Sessions ----------------------------------------------------------------------------------

    @pytest.mark.anyio
    async def test_sessions_never_see_each_other(self, store: Store) -> None:
        logs = {sid: sample_log(3 + index) for index, sid in enumerate(ODD_SESSION_IDS)}
        for sid, log in logs.items():
            await store.commit(sid, expected_count=0, events=log.events())
        for sid, log in logs.items():
            assert list(await store.load(sid)) == list(log.events())
        assert await store.sessions() == [
            SessionInfo(sid, log.count, len(log.events())) for sid, log in sorted(logs.items())
        ]

    @pytest.mark.anyio
    async def test_delete_removes_one_session_only(self, store: Store) -> None:
        await store.commit("keep", expected_count=0, events=sample_log(3).events())
        await store.commit("drop", expected_count=0, events=sample_log(4).events())
        assert await store.delete("drop") is True
        assert await store.delete("drop") is False
        assert list(await store.load("drop")) == []
        assert [info.session_id for info in await store.sessions()] == ["keep"]
        assert len(await store.load("keep")) == 3
        await store.commit("drop", expected_count=0, events=sample_log(2).events())

    # Persistence ---------------------------------------------------------------------------------

    @pytest.mark.anyio
    async def test_reopen_restores_events_surface_and_count(
        self, store: Store, reopen: Callable[[], Store]
    ) -> None:
        async with SessionActor.open(session_id="chat", store=store) as session:
            for index in range(6):
                await session.add_message(Message.user(f"m{index}"))
            await session.append("step_end", {"step": 1})
            first = session.log.surface()[1].position
            await session.replace(first, first + 2, Message.system("summary"))
            await session.snapshot()
            await session.append("assistant_message", {"content": "after the snapshot"})
            expected = session.log
        again = reopen()
        try:
            async with SessionActor.open(session_id="chat", store=again) as session:
                assert session.log.count == expected.count
                assert list(session.log.events()) == list(expected.events())
                assert list(session.log.surface()) == list(expected.surface())
                assert list(session.messages()) == list(expected.derive_messages())
                await session.append("user_message", {"content": "continues"})
                assert session.log.last is not None
                assert session.log.last.seq == expected.count
        finally:
            if again is not store:
                await again.aclose()

    @pytest.mark.anyio
    async def test_two_actors_on_one_session_conflict_instead_of_corrupting(
        self, store: Store, reopen: Callable[[], Store]
    ) -> None:
        other = reopen()
        try:
            # follow=False: with a change feed the second actor would catch up before it
            # appends, and there would be no clash to observe.
            async with (
                SessionActor.open(session_id="shared", store=store, follow=False) as first,
                SessionActor.open(session_id="shared", store=other, follow=False) as second,
            ):
                await first.append("user_message", {"content": "first wins"})
                with pytest.raises(ConflictError):
                    await second.append("user_message", {"content": "second clashes"})
                await second.reload()
                await second.append("user_message", {"content": "second after reload"})
                stored = list(await store.load("shared"))
                assert [e.seq for e in stored] == [0, 1]
                assert [e.data["content"] for e in stored] == ["first wins", "second after reload"]
        finally:
            if other is not store:
                await other.aclose()

    @pytest.mark.anyio
    async def test_a_load_racing_commits_reads_one_whole_state(
        self, store: Store, reopen: Callable[[], Store]
    ) -> None:
        # A load reads the count and the rows: from one snapshot, or a commit landing
        # between the two makes a whole session look corrupt ("rows past its count").
        other = reopen()
        commits = 150
        try:

            async def write() -> None:
                for seq in range(commits):
                    await store.commit("s", expected_count=seq, events=[_user(seq, f"m{seq}")])

            async def read() -> None:
                count = 0
                while count < commits:
                    since = count // 2  # a tail, and now and then from the start
                    loaded = await other.load("s", since=since)
                    seqs = [event.seq for event in loaded]
                    assert seqs == list(range(since, since + len(seqs)))
                    assert since + len(seqs) >= count  # a reader never sees it shrink
                    count = since + len(seqs)
                    await anyio.lowlevel.checkpoint()

            async with anyio.create_task_group() as group:
                group.start_soon(write)
                group.start_soon(read)
        finally:
            if other is not store:
                await other.aclose()

    @pytest.mark.anyio
    async def test_a_closed_store_refuses_calls(self, reopen: Callable[[], Store]) -> None:
        store = reopen()
        await store.aclose()
        await store.aclose()  # idempotent
        with pytest.raises(StoreError):
            await store.load("s")
        with pytest.raises(StoreError):
            await store.commit("s", expected_count=0, events=sample_log(1).events())
        if isinstance(store, RebasingStore):
            with pytest.raises(StoreError):
                await store.commit_rebased("s", expected_count=0, events=sample_log(1).events())


def _listing(store: Store) -> ListingStore:
    """``store`` as the listing store it must be."""
    assert supports(store, ListingStore), f"{store!r} is not a ListingStore"
    return store  # type: ignore[return-value]


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
        async with SessionActor.open(session_id="p", store=store, metadata={"owner": "ann"}) as s:
            await s.add_message(Message.user("hi"))  # seq 1
            await s.set_metadata({"owner": "ann", "title": "later"})  # seq 2
        await store.fork("p", "early", at=1)  # type: ignore[attr-defined]
        await store.fork("p", "late", at=2)  # type: ignore[attr-defined]
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
