"""A follow of a session ends when the session is deleted, or deleted and made again under its
id by another holder: it never goes on with another session's events (``stores.follow``, by
polling on the memory store and through the change feed on SQLite and PostgreSQL)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import aclosing, asynccontextmanager

import anyio
import pytest

from nous_session import SessionDeletedError
from nous_session.event import Event, make_event
from nous_session.stores import Store, follow

pytestmark = pytest.mark.anyio


def _events(start: int, *texts: str) -> list[Event]:
    return [
        make_event(seq, "user_message", {"content": text})
        for seq, text in enumerate(texts, start=start)
    ]


@asynccontextmanager
async def _followed_past_two(writer: Store, reader: Store) -> AsyncIterator[AsyncIterator[Event]]:
    """A follow through ``reader`` of a session ``writer`` made with two events, both read."""
    await writer.commit("s", expected_count=0, events=_events(0, "a", "b"))
    async with aclosing(follow(reader, "s", interval=0.01)) as feed:
        assert [(await anext(feed)).seq, (await anext(feed)).seq] == [0, 1]
        yield feed


async def test_a_follow_ends_when_its_session_is_deleted(stores: Callable[[], Store]) -> None:
    async with stores() as writer, stores() as reader, _followed_past_two(writer, reader) as feed:
        assert await writer.delete("s")
        with anyio.fail_after(10), pytest.raises(SessionDeletedError, match="was deleted"):
            await anext(feed)


async def test_a_follow_never_reads_on_into_a_session_made_again_under_its_id(
    stores: Callable[[], Store],
) -> None:
    async with stores() as writer, stores() as reader, _followed_past_two(writer, reader) as feed:
        assert await writer.delete("s")
        # Made again, longer: its seq 2 would look like the followed session's next event.
        await writer.commit("s", expected_count=0, events=_events(0, "x", "y", "z"))
        with anyio.fail_after(10), pytest.raises(SessionDeletedError, match="made again"):
            await anext(feed)


async def test_a_follow_that_starts_before_its_session_exists_reads_it_once_made(
    stores: Callable[[], Store],
) -> None:
    async with stores() as writer, stores() as reader:
        seen: list[Event] = []
        async with aclosing(follow(reader, "s", interval=0.01)) as feed:

            async def first_two() -> None:
                seen.extend([await anext(feed), await anext(feed)])

            with anyio.fail_after(10):
                async with anyio.create_task_group() as task_group:
                    task_group.start_soon(first_two)
                    await anyio.wait_all_tasks_blocked()  # it has read an empty session
                    await writer.commit("s", expected_count=0, events=_events(0, "a", "b"))
        assert [event.data["content"] for event in seen] == ["a", "b"]


async def test_a_follow_of_a_fork_goes_on_when_the_parent_it_shares_is_deleted(
    stores: Callable[[], Store],
) -> None:
    """The fork is the session followed: its parent's delete gives it a copy of what it
    shared, and its count and identity stay, so the follow reads on, never ending."""
    async with stores() as writer, stores() as reader:
        await writer.commit("parent", expected_count=0, events=_events(0, "a", "b", "c"))
        await writer.fork("parent", "s", at=1)
        async with aclosing(follow(reader, "s", interval=0.01)) as feed:
            assert [(await anext(feed)).data["content"] for _ in range(2)] == ["a", "b"]
            assert await writer.delete("parent")
            await writer.commit("s", expected_count=2, events=_events(2, "fork's own"))
            with anyio.fail_after(10):
                after = await anext(feed)
        assert (after.seq, after.data["content"]) == (2, "fork's own")
