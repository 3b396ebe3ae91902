"""Rebasing commits (:class:`~nous_session.stores.base.RebasingStore`)."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from nous_session.errors import ConflictError
from nous_session.event import Event
from nous_session.stores.base import RebasingStore, SessionInfo, Store
from nous_session.testing._shared import Capabilities, sample_log, stored_sample, user_event


class RebasingConformance(Capabilities):
    """``commit_rebased``: a commit that lands after whatever other writers stored; skipped on
    stores that have none."""

    @pytest.mark.anyio
    async def test_a_rebasing_commit_with_no_other_writer_lands_where_asked(
        self, store: Store, rebasing: RebasingStore
    ) -> None:
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
        self, store: Store, rebasing: RebasingStore
    ) -> None:
        log = await stored_sample(store, "s", 4)
        mine = [user_event(2, "mine a"), user_event(3, "mine b ✓")]
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
            await store.commit("s", expected_count=4, events=[user_event(4, "stale")])
        await store.commit("s", expected_count=6, events=[user_event(6, "next")])

    @pytest.mark.anyio
    async def test_a_rebasing_commit_reports_only_what_a_snapshot_left(
        self, store: Store, rebasing: RebasingStore
    ) -> None:
        log = sample_log(12)
        dropped = [event.seq for event in log.shadowed()]
        await store.commit("s", expected_count=0, events=log.events())
        await store.commit("s", expected_count=12, events=[], dropped=dropped, horizon=12)
        done = await rebasing.commit_rebased("s", expected_count=0, events=[user_event(0, "late")])
        assert done.shift == 12
        assert list(done.others) == list(log.snapshot().events())
        assert [e.seq for e in done.events] == [12]

    @pytest.mark.anyio
    async def test_malformed_rebasing_commits_are_refused_before_writing(
        self, store: Store, rebasing: RebasingStore
    ) -> None:
        await store.commit("s", expected_count=0, events=[user_event(0, "kept")])
        # Any: the last row's events are not all Events, on purpose.
        bad: list[tuple[str, int, list[Any], str]] = [
            ("s", 1, [], "at least one event"),
            ("s", 1, [user_event(2, "gap")], "contiguous"),
            ("s", 1, [user_event(1, "a"), user_event(3, "gap")], "contiguous"),
            ("s", -1, [user_event(0, "x")], "expected_count"),
            ("", 0, [user_event(0, "x")], "session id"),
            ("s", 1, [user_event(1, "a"), {"seq": 2}], "must be Events"),
        ]
        for session_id, expected, events, message in bad:
            with pytest.raises(ValueError, match=message):
                await rebasing.commit_rebased(session_id, expected_count=expected, events=events)
        # A count below what the caller expects (the session was deleted, say) is a conflict.
        with pytest.raises(ConflictError):
            await rebasing.commit_rebased("s", expected_count=5, events=[user_event(5, "ahead")])
        with pytest.raises(ConflictError):
            await rebasing.commit_rebased("gone", expected_count=1, events=[user_event(1, "ahead")])
        assert [e.data["content"] for e in await store.load("s")] == ["kept"]
        assert await store.sessions() == [SessionInfo("s", 1, 1)]

    @pytest.mark.anyio
    async def test_concurrent_rebasing_commits_all_land_once_in_order(
        self, store: Store, rebasing: RebasingStore
    ) -> None:
        writers, rounds = 6, 8
        landed: dict[int, list[Event]] = {}

        async def write(writer: int) -> None:
            known = 0  # a stale view on purpose: every commit but the first must move
            for round_ in range(rounds):
                batch = [
                    user_event(known + offset, f"w{writer} r{round_} e{offset}")
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

    @pytest.mark.anyio
    async def test_a_rebasing_commit_moves_its_keys_and_reports_the_others(
        self, store: Store, rebasing: RebasingStore
    ) -> None:
        await store.commit(
            "s", expected_count=0, events=[user_event(0, "a")], keys=[("theirs", 0, 1)]
        )
        done = await rebasing.commit_rebased(
            "s", expected_count=0, events=[user_event(0, "b")], keys=[("mine", 0, 1)]
        )
        assert done.shift == 1
        assert dict(done.keys) == {"theirs": (0, 1)}
        assert dict((await store.read("s")).keys) == {"theirs": (0, 1), "mine": (1, 1)}
        with pytest.raises(ConflictError):
            await rebasing.commit_rebased(
                "s", expected_count=2, events=[user_event(2, "c")], keys=[("mine", 2, 1)]
            )
        assert (await store.read("s")).count == 2
