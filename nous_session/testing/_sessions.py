"""Sessions side by side, and persistence: what a reopened store or a second writer sees."""

from __future__ import annotations

from collections.abc import Callable

import anyio
import anyio.lowlevel
import pytest

from nous_session.actor import SessionActor
from nous_session.errors import ConflictError, StoreError
from nous_session.message import Message
from nous_session.stores.base import RebasingStore, SessionInfo, Store
from nous_session.testing._shared import ODD_SESSION_IDS, reopened, sample_log, user_event


class SessionConformance:
    """Sessions are apart from each other, deletes remove one, a reopened store holds what
    was committed, two writers conflict, and a closed store refuses calls."""

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
        async with (
            reopened(store, reopen) as again,
            SessionActor.open(session_id="chat", store=again) as session,
        ):
            assert session.log.count == expected.count
            assert list(session.log.events()) == list(expected.events())
            assert list(session.log.surface()) == list(expected.surface())
            assert list(session.messages()) == list(expected.derive_messages())
            await session.append("user_message", {"content": "continues"})
            assert session.log.last is not None
            assert session.log.last.seq == expected.count

    @pytest.mark.anyio
    async def test_two_actors_on_one_session_conflict_instead_of_corrupting(
        self, store: Store, reopen: Callable[[], Store]
    ) -> None:
        # follow=False: with a change feed the second actor would catch up before it
        # appends, and there would be no clash to observe.
        async with (
            reopened(store, reopen) as other,
            SessionActor.open(session_id="shared", store=store, follow=False) as first,
            SessionActor.open(session_id="shared", store=other, follow=False) as second,
        ):
            await first.append("user_message", {"content": "first wins"})
            # Conditional: a plain append would land after "first wins" (it has no
            # precondition); one planned on the stale log must conflict.
            with pytest.raises(ConflictError):
                await second.append_many(
                    [("user_message", {"content": "second clashes"})], expect_count=0
                )
            await second.reload()
            await second.append("user_message", {"content": "second after reload"})
            stored = list(await store.load("shared"))
            assert [e.seq for e in stored] == [0, 1]
            assert [e.data["content"] for e in stored] == ["first wins", "second after reload"]

    @pytest.mark.anyio
    async def test_a_load_racing_commits_reads_one_whole_state(
        self, store: Store, reopen: Callable[[], Store]
    ) -> None:
        # A load reads the count and the rows: from one snapshot, or a commit landing
        # between the two makes a whole session look corrupt ("rows past its count").
        commits = 150
        async with reopened(store, reopen) as other:

            async def write() -> None:
                for seq in range(commits):
                    await store.commit("s", expected_count=seq, events=[user_event(seq, f"m{seq}")])

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
