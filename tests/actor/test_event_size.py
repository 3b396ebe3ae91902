"""The limit on one event's size (``max_event_size``): 4 MiB by default, per actor, measured on
the data's compact UTF-8 JSON, refused in the caller with an error naming the size and the
limit, before anything is queued. Every test runs on asyncio and on trio."""

from __future__ import annotations

import orjson
import pytest

from nous_session import (
    InvalidEventError,
    MemoryStore,
    Message,
    SessionActor,
)
from nous_session._json import dumps
from nous_session.event import MAX_EVENT_SIZE, check_size
from nous_session.registry import Sessions

pytestmark = pytest.mark.anyio

SID = "chat"
OVERHEAD = len(b'{"content":""}')  # a user message's data around its text


def sized(size: int, char: str = "a") -> str:
    """A text whose user-message data is ``size`` bytes as JSON (``char`` encodes alone to
    a fixed number of bytes)."""
    width = len(orjson.dumps(char)) - 2
    count, rest = divmod(size - OVERHEAD, width)
    assert rest == 0
    return char * count


async def stored(store: MemoryStore) -> int:
    return len(await store.load(SID))


async def test_the_default_refuses_an_event_over_4_mib() -> None:
    assert MAX_EVENT_SIZE == 4 * 1024 * 1024
    store = MemoryStore()
    async with SessionActor.open(session_id=SID, store=store) as session:
        await session.add_message(Message.user(sized(MAX_EVENT_SIZE)))  # exactly at the limit
        with pytest.raises(InvalidEventError) as info:
            await session.add_message(Message.user(sized(MAX_EVENT_SIZE + 1)))
        assert str(info.value) == (
            "user_message event: its data is 4,194,305 bytes as JSON, over the limit of "
            "4,194,304 bytes (max_event_size, set by SessionActor.open); nothing was appended"
        )
        assert session.log.count == 1
        assert session.statistics().requests == 1  # the refused call never reached the actor
    assert await stored(store) == 1


@pytest.mark.parametrize(("char", "width"), [("a", 1), ("é", 2), ("\x01", 6), ("😀", 4)])
async def test_the_size_is_the_encoded_size(char: str, width: int) -> None:
    # Measured as stored: UTF-8, control characters escaped; not in Python characters.
    async with SessionActor.open(session_id=SID, max_event_size=1000) as session:
        count = (1000 - OVERHEAD) // width
        fits = char * count
        over = char * (count + 1)
        await session.append("user_message", {"content": fits})
        await session.add_message(Message.user(fits))
        for call in (
            session.append("user_message", {"content": over}),
            session.add_message(Message.user(over)),
        ):
            with pytest.raises(InvalidEventError, match="over the limit of 1,000 bytes"):
                await call
        assert session.log.count == 2


async def test_every_way_in_is_checked_and_nothing_is_queued() -> None:
    store = MemoryStore()
    big = "x" * 200
    async with SessionActor.open(session_id=SID, store=store, max_event_size=100) as session:
        await session.add_message(Message.user("one"))
        await session.add_message(Message.user("two"))
        calls = {
            "append": lambda: session.append("x.app.blob", {"blob": [big]}),  # nested
            "append_many": lambda: session.append_many(
                [Message.user("fits"), ("user_message", {"content": big})]
            ),
            "append_many message": lambda: session.append_many(
                [Message.user("fits"), Message.user(big)]
            ),
            "replace one": lambda: session.replace(0, 0, Message.system(big)),
            "replace many": lambda: session.replace(0, 1, [Message.system(big)]),
            "metadata": lambda: session.set_metadata({"title": big}),
        }
        for name, call in calls.items():
            with pytest.raises(InvalidEventError, match="over the limit of 100 bytes") as info:
                await call()
            if name.startswith("append_many"):
                assert str(info.value).startswith("append_many item 1: ")
        assert session.log.count == 2
        assert session.statistics().requests == 2
    assert await stored(store) == 2


async def test_none_means_no_limit() -> None:
    async with SessionActor.open(session_id=SID, max_event_size=None) as session:
        await session.add_message(Message.user(sized(MAX_EVENT_SIZE + 1)))
        assert session.log.count == 1


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "4MiB"])
async def test_a_bad_limit_is_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="max_event_size must be an int >= 1 or None"):
        async with SessionActor.open(session_id=SID, max_event_size=bad):  # type: ignore[arg-type]
            pass
    with pytest.raises(ValueError, match="max_event_size must be an int >= 1 or None"):
        Sessions(MemoryStore(), max_event_size=bad)  # type: ignore[arg-type]


async def test_the_registry_opens_its_actors_with_the_limit() -> None:
    async with Sessions(MemoryStore(), max_event_size=100) as sessions:
        chat = await sessions.get(SID)
        with pytest.raises(InvalidEventError, match="over the limit of 100 bytes"):
            await chat.add_message(Message.user("x" * 100))
        await chat.add_message(Message.user("x" * (100 - OVERHEAD)))


def test_the_cheap_bound_never_lets_an_oversized_event_through() -> None:
    # The bound that spares encoding, checked against the exact encoding (the stores' own
    # JSON writer), for every kind of flat value, at the limit and one byte under it.
    values: list[object] = ["", "a", "é" * 7, "\x00" * 5, "😀", None, True, 1.5e300, -(2**70), 7]
    for value in values:
        data = {"k\x01é": value}
        size = len(dumps(data))
        check_size("x", data, size)
        with pytest.raises(InvalidEventError, match=f"its data is {size:,} bytes"):
            check_size("x", data, size - 1)
