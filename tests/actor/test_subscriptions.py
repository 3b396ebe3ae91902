"""SessionActor.subscribe: committed events from a seq onward, catch-up then live, end on close.

The contract is the "Subscriptions" paragraph of docs/design.md's "SessionActor" section and
issue 3. Every async test runs on asyncio and on trio (see ``anyio_backend`` in conftest.py).
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from nous_session import (
    Event,
    EventType,
    MemoryStore,
    Message,
    SessionActor,
    SessionClosedError,
    StoreError,
)

pytestmark = pytest.mark.anyio

SID = "subscribed"
T0 = datetime(2024, 7, 2, 10, 0, 0, 5, tzinfo=UTC)
U = EventType.USER_MESSAGE
STEP = EventType.STEP_START


def at(i: int) -> datetime:
    return T0 + timedelta(seconds=i)


async def wait_for(predicate: Callable[[], bool]) -> None:
    """Poll ``predicate`` until it holds (a bounded wait on a condition); fail after 5 s."""
    with anyio.fail_after(5):
        while not predicate():  # noqa: ASYNC110 - the condition lives in the library
            await anyio.sleep(0.001)


def seqs(events: Sequence[Event]) -> list[int]:
    return [event.seq for event in events]


async def take(events: AsyncIterator[Event], n: int) -> list[Event]:
    """The next ``n`` events of a subscription; fail after 5 s."""
    out = []
    with anyio.fail_after(5):
        for _ in range(n):
            out.append(await events.__anext__())
    return out


async def drain(events: AsyncIterator[Event]) -> list[Event]:
    """Everything a subscription yields until it ends; fail after 5 s."""
    with anyio.fail_after(5):
        return [event async for event in events]


async def append_users(session: SessionActor, n: int) -> list[Event]:
    out = []
    for _ in range(n):
        i = session.log.count
        out.append(await session.append(U, {"content": f"m{i}"}, time=at(i)))
    return out


# Catch-up and live ---------------------------------------------------------------------------


async def test_subscribe_from_zero_catches_up_then_follows() -> None:
    async with SessionActor.open(session_id=SID) as session:
        written = await append_users(session, 5)
        async with session.subscribe() as events:
            assert await take(events, 5) == written
            more = await append_users(session, 3)
            assert await take(events, 3) == more
        assert seqs(session.log.events()) == list(range(8))


async def test_subscribe_from_the_middle() -> None:
    async with SessionActor.open(session_id=SID) as session:
        written = await append_users(session, 6)
        async with session.subscribe(since=3) as events:
            assert await take(events, 3) == written[3:]
            live = await session.append(STEP, {"live": True})
            assert await take(events, 1) == [live]


async def test_subscribe_from_beyond_the_head_waits_for_it() -> None:
    received: list[Event] = []
    async with SessionActor.open(session_id=SID) as session:
        await append_users(session, 3)

        async def follow() -> None:
            async with session.subscribe(since=10) as events:
                async for event in events:
                    received.append(event)

        async with anyio.create_task_group() as tg:
            tg.start_soon(follow)
            await wait_for(lambda: session.statistics().subscribers == 1)
            await append_users(session, 7)  # seqs 3..9: all below `since`
            assert received == []
            tail = await append_users(session, 3)  # seqs 10, 11, 12
            await wait_for(lambda: len(received) == 3)
            assert received == tail
            tg.cancel_scope.cancel()
    assert seqs(received) == [10, 11, 12]


async def test_many_subscribers_each_see_every_event_once_in_order() -> None:
    subscribers, producers, per = 50, 10, 30
    received: dict[int, list[Event]] = {i: [] for i in range(subscribers)}

    async def follow(session: SessionActor, i: int, ready: Callable[[], None]) -> None:
        async with session.subscribe() as events:
            ready()
            async for event in events:
                received[i].append(event)

    async def produce(session: SessionActor, p: int) -> None:
        for k in range(per):
            await session.append(STEP, {"p": p, "k": k})

    with anyio.fail_after(5):
        async with (
            anyio.create_task_group() as followers,
            SessionActor.open(session_id=SID) as session,
        ):
            entered = 0

            def ready() -> None:
                nonlocal entered
                entered += 1

            for i in range(subscribers):
                followers.start_soon(follow, session, i, ready)
            await wait_for(lambda: entered == subscribers)
            assert session.statistics().subscribers == subscribers
            async with anyio.create_task_group() as tg:
                for p in range(producers):
                    tg.start_soon(produce, session, p)
            # Leaving the session block ends every subscription.
    log = list(session.log.events())
    assert len(log) == producers * per
    for i in range(subscribers):
        assert received[i] == log, f"subscriber {i}"
    assert session.statistics().subscribers == 0


async def test_a_subscriber_that_never_reads_blocks_nobody() -> None:
    total = 2000
    stall = anyio.Event()
    fast: list[Event] = []
    slow: list[Event] = []

    async def never_reads(session: SessionActor) -> None:
        async with session.subscribe():
            await stall.wait()

    async def reads_one_then_stalls(session: SessionActor) -> None:
        async with session.subscribe() as events:
            slow.append(await events.__anext__())
            await stall.wait()
            # Resumed after the session closed: it catches up on everything, then ends.
            slow.extend([event async for event in events])

    async def follow(session: SessionActor) -> None:
        async with session.subscribe() as events:
            async for event in events:
                fast.append(event)

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            async with SessionActor.open(session_id=SID, queue_size=16) as session:
                tg.start_soon(never_reads, session)
                tg.start_soon(reads_one_then_stalls, session)
                tg.start_soon(follow, session)
                await wait_for(lambda: session.statistics().subscribers == 3)
                await session.append(STEP, {"i": 0})
                await wait_for(lambda: len(slow) == 1)

                async def produce(p: int) -> None:
                    for k in range(total // 10):
                        await session.append(STEP, {"p": p, "k": k})

                async with anyio.create_task_group() as producers:
                    for p in range(10):
                        producers.start_soon(produce, p)
                # The writers finished while two subscribers were stalled.
                assert session.log.count == total + 1
                await wait_for(lambda: len(fast) == total + 1)
                assert session.statistics().subscribers == 3
            # The session closed without waiting for the stalled subscribers.
            assert session.closed
            # The follower ends; the two stalled subscribers are still attached.
            await wait_for(lambda: len(fast) == total + 1 and session.statistics().subscribers == 2)
            assert slow == list(session.log.events())[:1]
            stall.set()
    log = list(session.log.events())
    assert fast == log
    assert slow == log
    assert session.statistics().subscribers == 0


async def test_subscribing_while_producers_run_has_no_gap_and_no_duplicate() -> None:
    producers, per = 10, 100
    total = producers * per
    starts = [0, 0, 5, 50, 120, 250, 333, 400, 610, 800, 999, 1000, 1500]
    received: dict[int, list[int]] = {i: [] for i in range(len(starts))}

    async def produce(session: SessionActor, p: int) -> None:
        for k in range(per):
            await session.append(STEP, {"p": p, "k": k})

    head_at_start: list[int] = []

    async def follow(session: SessionActor, i: int) -> None:
        async with session.subscribe(since=starts[i]) as events:
            head_at_start.append(session.log.count)
            async for event in events:
                received[i].append(event.seq)

    with anyio.fail_after(5):
        async with (
            anyio.create_task_group() as followers,
            SessionActor.open(session_id=SID, queue_size=8) as session,
        ):
            async with anyio.create_task_group() as tg:
                for p in range(producers):
                    tg.start_soon(produce, session, p)
                # Start subscribers at staggered moments while the producers run.
                for i in range(len(starts)):
                    await wait_for(lambda i=i: session.log.count >= i * 60)
                    followers.start_soon(follow, session, i)
                    await anyio.lowlevel.checkpoint()
            assert session.log.count == total
    # The race really happened: most subscribers started while the log was still growing.
    assert sum(head < total for head in head_at_start) >= len(starts) // 2, head_at_start
    for i, since in enumerate(starts):
        got = received[i]
        assert all(a < b for a, b in itertools.pairwise(got)), f"subscriber {i}"
        assert got == list(range(since, total)), f"subscriber {i} from {since}"


# Closing -------------------------------------------------------------------------------------


async def test_subscriptions_end_when_the_session_closes() -> None:
    received: list[Event] = []
    ended = anyio.Event()

    async def follow(session: SessionActor) -> None:
        async with session.subscribe() as events:
            async for event in events:
                received.append(event)
        ended.set()

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            async with SessionActor.open(session_id=SID) as session:
                tg.start_soon(follow, session)
                await wait_for(lambda: session.statistics().subscribers == 1)
                await append_users(session, 4)
                await wait_for(lambda: len(received) == 4)
                assert not ended.is_set()
            await ended.wait()
    assert received == list(session.log.events())


async def test_subscriptions_see_the_requests_drained_at_close() -> None:
    producers, per = 20, 1000
    acked: list[Event] = []
    refused: list[SessionClosedError] = []
    received: dict[int, list[Event]] = {0: [], 1: []}

    async def produce(session: SessionActor, p: int) -> None:
        for k in range(per):
            try:
                acked.append(await session.append(STEP, {"p": p, "k": k}))
            except SessionClosedError as error:
                refused.append(error)
                return

    async def follow(session: SessionActor, i: int) -> None:
        async with session.subscribe() as events:
            async for event in events:
                received[i].append(event)

    with anyio.fail_after(5):
        async with (
            anyio.create_task_group() as tg,
            SessionActor.open(session_id=SID, queue_size=32) as session,
        ):
            for i in received:
                tg.start_soon(follow, session, i)
            for p in range(producers):
                tg.start_soon(produce, session, p)
            await wait_for(lambda: session.log.count >= 300)
            # Left the block with producers still calling: the queued requests are applied.
    log = list(session.log.events())
    assert len(refused) == producers
    assert sorted(acked, key=lambda e: e.seq) == log
    for i in received:
        assert received[i] == log
        assert received[i][-1].seq == session.log.count - 1


async def test_subscribing_to_a_closed_session_yields_what_was_committed_then_ends() -> None:
    async with SessionActor.open(session_id=SID) as session:
        written = await append_users(session, 5)
    assert session.closed
    async with session.subscribe() as events:
        assert await drain(events) == written
    async with session.subscribe(since=3) as events:
        assert await drain(events) == written[3:]
    async with session.subscribe(since=5) as events:
        assert await drain(events) == []
    async with session.subscribe(since=50) as events:
        assert await drain(events) == []


async def test_an_ended_subscription_stays_ended() -> None:
    async with SessionActor.open(session_id=SID) as session:
        await append_users(session, 2)
    async with session.subscribe() as events:
        assert len(await drain(events)) == 2
        with pytest.raises(StopAsyncIteration):
            await events.__anext__()


@pytest.mark.parametrize("since", [-1, -100])
async def test_a_negative_since_is_refused(since: int) -> None:
    async with SessionActor.open(session_id=SID) as session:
        with pytest.raises(ValueError, match="since"):
            async with session.subscribe(since):
                pytest.fail("the block must not run")
        assert session.statistics().subscribers == 0


# Snapshots and failures ----------------------------------------------------------------------


async def test_a_subscriber_that_starts_after_a_snapshot_skips_dropped_events() -> None:
    async with (
        SessionActor.open(session_id=SID) as session,
        session.subscribe() as events,
    ):
        await append_users(session, 6)
        summary = await session.replace(1, 3, Message.system("s", created_at=at(1)))
        await session.snapshot()
        # Nothing read before the snapshot: the dropped events 1..3 are never seen.
        got = await take(events, 4)
        assert seqs(got) == [0, 4, 5, 6]
        assert got[-1] == summary
        assert got == list(session.log.events())
        after = await session.append(STEP)
        assert await take(events, 1) == [after]


async def test_a_subscriber_behind_the_head_skips_events_a_snapshot_dropped() -> None:
    async with SessionActor.open(session_id=SID) as session:
        written = await append_users(session, 6)
        async with session.subscribe() as events:
            assert await take(events, 1) == written[:1]  # it is behind: seqs 1..5 unread
            summary = await session.replace(1, 3, Message.system("s", created_at=at(1)))
            await session.snapshot()
            assert seqs(session.log.events()) == [0, 4, 5, 6]
            got = await take(events, 3)
            # The dropped events 1..3 are skipped; every surviving one is seen, in order.
            assert seqs(got) == [4, 5, 6]
            assert got == [*written[4:], summary]


async def test_a_subscriber_never_sees_an_event_whose_commit_failed() -> None:
    class FailingStore:
        """A MemoryStore whose commits fail while ``failing`` is set."""

        def __init__(self) -> None:
            self.inner = MemoryStore()
            self.failing = False

        async def load(self, session_id: str, *, since: int = 0) -> Sequence[Event]:
            return await self.inner.load(session_id, since=since)

        async def commit(self, session_id: str, **kwargs: Any) -> str | None:
            if self.failing:
                raise StoreError("injected")
            return await self.inner.commit(session_id, **kwargs)

        # Not used by the actor; the persistence work's fuller Store protocol lists them.
        async def sessions(self) -> Any:
            return await self.inner.sessions()

        async def delete(self, session_id: str) -> bool:
            return await self.inner.delete(session_id)

        async def aclose(self) -> None:
            await self.inner.aclose()

    store = FailingStore()
    async with (
        SessionActor.open(session_id=SID, store=store) as session,
        session.subscribe() as events,
    ):
        first = await session.append(U, {"content": "kept"})
        store.failing = True
        with pytest.raises(StoreError):
            await session.append(U, {"content": "never committed"})
        store.failing = False
        second = await session.append(U, {"content": "committed"})
        assert second.seq == 1
        got = await take(events, 2)
        assert got == [first, second]
        assert got == list(await store.load(SID))


async def test_statistics_count_open_subscriptions() -> None:
    async with SessionActor.open(session_id=SID) as session:
        assert session.statistics().subscribers == 0
        async with session.subscribe() as one:
            assert session.statistics().subscribers == 1
            async with session.subscribe(since=4):
                assert session.statistics().subscribers == 2
            assert session.statistics().subscribers == 1
            await session.append(STEP)
            assert len(await take(one, 1)) == 1
            inside: list[int] = []

            async def failing_reader() -> None:
                async with session.subscribe():
                    inside.append(session.statistics().subscribers)
                    raise RuntimeError("the reader failed")

            with pytest.raises(RuntimeError):
                await failing_reader()
            assert inside == [2]
            assert session.statistics().subscribers == 1
        assert session.statistics().subscribers == 0
        # Creating a subscription without entering it does not count.
        session.subscribe()
        assert session.statistics().subscribers == 0
