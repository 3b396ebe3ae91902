"""Sessions (the registry of a store's sessions) and SessionsPortal (the same from any thread)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import anyio
import pytest
import trio

from nous_session import Message, SessionClosedError
from nous_session.registry import Sessions, SessionsPortal
from nous_session.stores.memory import MemoryStore

pytestmark = pytest.mark.anyio


async def test_get_opens_once_and_returns_the_same_actor() -> None:
    async with Sessions("memory:") as sessions:
        first, second = await sessions.get("a"), await sessions.get("a")
        assert first is second
        await first.add_message(Message.user("hi"))
        assert [m.text for m in (await sessions.get("a")).messages()] == ["hi"]
        assert sessions.statistics().opened == 1
        assert "a" in sessions
        assert "b" not in sessions


async def test_concurrent_gets_of_one_session_open_it_once() -> None:
    actors = []
    async with Sessions("memory:") as sessions:

        async def get() -> None:
            actors.append(await sessions.get("same"))

        async with anyio.create_task_group() as tg:
            for _ in range(20):
                tg.start_soon(get)
        assert len({id(actor) for actor in actors}) == 1
        assert sessions.statistics().opened == 1


async def test_beyond_max_open_the_least_recently_used_close_and_reopen_with_their_history() -> (
    None
):
    async with Sessions("memory:", max_open=2) as sessions:
        a = await sessions.get("a")
        await a.add_message(Message.user("kept"))
        await sessions.get("b")
        await sessions.get("a")  # a is now more recent than b
        await sessions.get("c")  # b is the least recently used
        stats = sessions.statistics()
        assert (stats.open, stats.closed_lru) == (2, 1)
        assert "b" not in sessions
        assert "a" in sessions
        assert "c" in sessions
        await sessions.get("b")  # a is least recent now
        assert "a" not in sessions
        with pytest.raises(SessionClosedError):
            await a.add_message(Message.user("to a closed actor"))
        reopened = await sessions.get("a")
        assert [m.text for m in reopened.messages()] == ["kept"]


async def test_a_use_block_holds_its_actor_past_max_open() -> None:
    async with Sessions("memory:", max_open=1) as sessions:
        async with sessions.use("held") as held:
            await sessions.get("other")
            assert "held" in sessions
            await held.add_message(Message.user("still open"))
            assert sessions.statistics().leased == 1
        # Released: the registry is over its limit and closes the least recently used.
        assert sessions.statistics().open == 1


async def test_idle_actors_close_after_the_timeout_and_busy_ones_stay() -> None:
    async with Sessions("memory:", idle_timeout=0.05) as sessions:
        idle = await sessions.get("idle")
        async with sessions.use("leased"):
            with anyio.fail_after(5):
                # The reaper is a timer: poll its effect, bounded (nothing to wait on).
                while not idle.closed:  # noqa: ASYNC110
                    await anyio.sleep(0.01)
            assert "leased" in sessions
        assert sessions.statistics().closed_idle >= 1
        assert "idle" not in sessions


async def test_a_subscribed_actor_is_not_idle() -> None:
    async with Sessions("memory:", idle_timeout=0.05) as sessions:
        actor = await sessions.get("watched")
        other = await sessions.get("unwatched")
        async with actor.subscribe(0):
            with anyio.fail_after(5):
                while not other.closed:  # noqa: ASYNC110
                    await anyio.sleep(0.01)
            assert not actor.closed


async def test_closing_the_registry_commits_what_is_queued_and_closes_every_actor(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'reg.sqlite3'}"
    async with Sessions(url) as sessions:
        actors = [await sessions.get(f"s{i}") for i in range(5)]
        for index, actor in enumerate(actors):
            await actor.add_message(Message.user(f"m{index}"))
    assert all(actor.closed for actor in actors)
    with pytest.raises(SessionClosedError):
        await sessions.get("s0")
    async with Sessions(url) as sessions:
        texts = [(await sessions.get(f"s{i}")).messages()[0].text for i in range(5)]
    assert texts == [f"m{i}" for i in range(5)]


async def test_a_store_object_stays_open_for_its_owner() -> None:
    store = MemoryStore()
    async with Sessions(store) as sessions:
        await (await sessions.get("a")).add_message(Message.user("x"))
    async with Sessions(store) as sessions:
        assert len((await sessions.get("a")).messages()) == 1
    await store.aclose()


async def test_bad_arguments_are_refused_with_their_name() -> None:
    with pytest.raises(ValueError, match="idle_timeout"):
        Sessions("memory:", idle_timeout=0)
    with pytest.raises(ValueError, match="max_open"):
        Sessions("memory:", max_open=0)
    with pytest.raises(ValueError, match="store"):
        Sessions(42)  # type: ignore[arg-type]
    async with Sessions("memory:") as sessions:
        with pytest.raises(ValueError, match="session_id"):
            await sessions.get("")
        assert sessions.statistics().open == 0


async def test_a_session_that_cannot_be_loaded_fails_its_caller_only(tmp_path: Path) -> None:
    path = tmp_path / "not-a-db.sqlite3"
    path.write_bytes(b"this is not a database" * 100)
    async with Sessions(f"sqlite:///{path}") as sessions:
        with pytest.raises(Exception, match=r"(?i)database|store"):
            await sessions.get("a")
        assert sessions.statistics().open == 0


async def _add(actor, text: str = "hi"):  # type: ignore[no-untyped-def]
    return await actor.add_message(Message.user(text))


def test_portal_from_sync_code_and_from_fresh_event_loops_in_other_threads() -> None:
    with SessionsPortal("memory:") as portal:
        assert portal.call("s", _add).seq == 0
        assert asyncio.run(portal.acall("s", _add)).seq == 1
        assert trio.run(portal.acall, "s", _add).seq == 2
        seqs: list[int] = []

        def in_thread() -> None:
            seqs.append(asyncio.run(portal.acall("s", _add)).seq)

        threads = [threading.Thread(target=in_thread) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert sorted(seqs) == [3, 4, 5, 6]
        assert portal.start("s", _add).result(timeout=10).seq == 7
    assert portal.closed
    with pytest.raises(SessionClosedError):
        portal.call("s", _add)


def test_portal_raises_the_calls_own_exception() -> None:
    async def bad(actor):  # type: ignore[no-untyped-def]
        await actor.append("not a type")

    with SessionsPortal("memory:") as portal, pytest.raises(ValueError, match="not a type"):
        portal.call("s", bad)


def test_closing_a_portal_commits_and_closes_its_store(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'portal.sqlite3'}"
    portal = SessionsPortal(url)
    portal.call("s", _add)
    portal.close()
    portal.close()  # idempotent
    with SessionsPortal(url) as again:
        assert again.call("s", lambda actor: _count(actor)) == 1


async def _count(actor) -> int:  # type: ignore[no-untyped-def]
    return len(actor.messages())


def test_a_portal_on_trio() -> None:
    with SessionsPortal("memory:", backend="trio") as portal:
        assert portal.call("s", _add).seq == 0
        assert asyncio.run(portal.acall("s", _add)).seq == 1


def test_a_portal_with_a_bad_argument_starts_no_thread() -> None:
    before = threading.active_count()
    with pytest.raises(ValueError, match="backend"):
        SessionsPortal("memory:", backend="curio")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_open"):
        SessionsPortal("memory:", max_open=0)
    assert threading.active_count() == before


async def test_a_session_opened_while_every_other_is_held_stays_open() -> None:
    async with Sessions("memory:", max_open=1) as sessions:
        async with sessions.use("held"), sessions.use("new") as new:
            # Over the limit, but nothing may close: one is held, the other was just asked for.
            await new.add_message(Message.user("open"))
            assert sessions.statistics().open == 2
        fresh = await sessions.get("third")
        assert not fresh.closed
        assert sessions.statistics().open == 1
