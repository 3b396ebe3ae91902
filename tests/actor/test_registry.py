"""Sessions (the registry of a store's sessions) and SessionsPortal (the same from any thread)."""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import AsyncGenerator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anyio
import pytest
import sniffio
import trio

from nous_session import Message, SessionActor, SessionClosedError, StoreError
from nous_session.log import Log
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


# Concurrency and cost (each of these failed before the registry leased entries from creation) --


async def _stored_texts(store: MemoryStore, session_id: str) -> list[str]:
    return [m.text for m in Log.restore(await store.load(session_id)).derive_messages()]


async def test_use_blocks_of_different_sessions_beyond_max_open_all_keep_their_actor() -> None:
    store = MemoryStore()
    count = 4
    inside = 0
    all_inside = anyio.Event()
    async with Sessions(store, max_open=1) as sessions:

        async def one(index: int) -> None:
            nonlocal inside
            async with sessions.use(f"s{index}") as actor:
                inside += 1
                if inside == count:
                    all_inside.set()
                await all_inside.wait()  # every block holds its actor at once
                await actor.add_message(Message.user(f"m{index}"))

        with anyio.fail_after(10):
            async with anyio.create_task_group() as task_group:
                for index in range(count):
                    task_group.start_soon(one, index)
        assert sessions.statistics().open <= 1  # the last block out closed the excess
    for index in range(count):
        assert await _stored_texts(store, f"s{index}") == [f"m{index}"]
    await store.aclose()


async def test_get_never_returns_a_closed_actor_under_concurrent_opens() -> None:
    async with Sessions("memory:", max_open=1) as sessions:
        returned: list[tuple[str, bool, bool]] = []

        async def get(session_id: str) -> None:
            actor = await sessions.get(session_id)
            # Checked where get() returns, before anything else can run.
            returned.append((session_id, actor.closed, session_id in sessions))

        with anyio.fail_after(10):
            async with anyio.create_task_group() as task_group:
                for index in range(6):
                    task_group.start_soon(get, f"s{index}")
        assert sorted(returned) == [(f"s{index}", False, True) for index in range(6)]


class _GatedStore(MemoryStore):
    """A MemoryStore whose loads wait at a gate, so a test can act while a session opens."""

    def __init__(self) -> None:
        super().__init__()
        self.loading = anyio.Event()
        self.gate = anyio.Event()

    async def read(self, session_id: str):  # type: ignore[no-untyped-def]
        self.loading.set()
        await self.gate.wait()
        return await super().read(session_id)


async def test_closing_the_registry_while_a_get_is_opening_ends_and_fails_that_get() -> None:
    store = _GatedStore()
    outcomes: list[object] = []

    async def get(sessions: Sessions) -> None:
        try:
            outcomes.append(await sessions.get("late"))
        except SessionClosedError as error:
            outcomes.append(error)

    with anyio.fail_after(5):
        async with anyio.create_task_group() as task_group:
            async with Sessions(store) as sessions:
                task_group.start_soon(get, sessions)
                await store.loading.wait()
                # The load completes only after the block has begun to close.
                store.gate.set()
    assert len(outcomes) == 1
    assert isinstance(outcomes[0], SessionClosedError)
    await store.aclose()


def test_a_portal_with_a_small_max_open_serves_every_thread() -> None:
    threads = 8
    barrier = threading.Barrier(threads)
    store = MemoryStore()

    async def add_twice(actor, text: str) -> int:  # type: ignore[no-untyped-def]
        await actor.add_message(Message.user(text))
        await actor.add_message(Message.user(text))
        return len(actor.messages())

    with SessionsPortal(store, max_open=2) as portal:

        def in_thread(index: int) -> object:
            barrier.wait()
            try:
                return portal.call(f"s{index}", lambda actor: add_twice(actor, f"m{index}"))
            except Exception as error:  # reported below with the others
                return error

        with ThreadPoolExecutor(threads) as pool:
            results = list(pool.map(in_thread, range(threads)))
    assert results == [2] * threads
    for index in range(threads):
        assert anyio.run(_stored_texts, store, f"s{index}") == [f"m{index}"] * 2


def test_portal_calls_take_a_sync_or_an_async_function() -> None:
    with SessionsPortal("memory:") as portal:
        assert portal.call("s", lambda actor: actor.add_message(Message.user("a"))).seq == 0
        assert [m.text for m in portal.call("s", lambda actor: actor.messages())] == ["a"]
        assert portal.start("s", lambda actor: actor.log.count).result(timeout=10) == 1
        assert asyncio.run(portal.acall("s", lambda actor: actor.session_id)) == "s"
        assert trio.run(portal.acall, "s", _add).seq == 1
        with pytest.raises(ZeroDivisionError):
            portal.call("s", lambda actor: 1 / 0)


async def test_opening_does_the_same_work_with_many_sessions_open_as_with_few() -> None:
    # Counted in Python function calls rather than timed (timing is the benchmark's): before,
    # every open looked at every open entry, so its calls grew with the number open.
    async with Sessions("memory:", max_open=100_000) as sessions:

        async def calls_to_open(session_id: str) -> int:
            calls = 0

            def profile(frame: object, event: str, arg: object) -> None:
                nonlocal calls
                if event == "call":
                    calls += 1

            sys.setprofile(profile)
            try:
                await sessions.get(session_id)
            finally:
                sys.setprofile(None)
            return calls

        for index in range(10):
            await sessions.get(f"few{index}")
        few = min([await calls_to_open(f"at-10-{index}") for index in range(5)])
        for index in range(1_000):
            await sessions.get(f"many{index}")
        many = min([await calls_to_open(f"at-1000-{index}") for index in range(5)])
        assert many <= few + 20, (few, many)
        stats = sessions.statistics()
        assert (stats.open, stats.opened) == (1_020, 1_020)


@pytest.mark.anyio
class _RefusingStore(MemoryStore):
    """A MemoryStore whose commits fail while ``refuse`` is set."""

    refuse = False

    async def commit(self, session_id: str, **arguments: Any) -> str | None:
        if self.refuse:
            raise StoreError("refused")
        return await super().commit(session_id, **arguments)


async def test_a_use_block_leases_once_and_releases_whatever_happens() -> None:
    store = _RefusingStore()
    async with Sessions(store) as sessions:
        block = sessions.use("s")
        async with block as actor:
            assert sessions.statistics().leased == 1
            with pytest.raises(RuntimeError, match="entered once"):
                await block.__aenter__()
            assert sessions.statistics().leased == 1
        assert sessions.statistics().leased == 0
        # Bad metadata is refused on entering, with nothing leased.
        with pytest.raises(ValueError, match="tags must be a collection"):
            async with sessions.use("s", metadata={"tags": "not a list"}):
                raise AssertionError("entered with bad metadata")
        assert sessions.statistics().leased == 0
        # Metadata that cannot be set (the store fails) releases the lease it took. (An actor
        # closing is no longer handed out: the registry opens a new one.)
        store.refuse = True
        with pytest.raises(StoreError):
            async with sessions.use("s", metadata={"title": "t"}):
                raise AssertionError("entered although the metadata was not set")
        assert sessions.statistics().leased == 0
        store.refuse = False
        actor = await sessions.get("s")
        actor._engine.begin_close()
        async with sessions.use("s", metadata={"title": "t"}) as fresh:
            assert fresh is not actor
            assert fresh.metadata.title == "t"
        assert sessions.statistics().leased == 0
        # A block that raises releases too, and the error is the block's.
        with pytest.raises(KeyError):
            async with sessions.use("t"):
                raise KeyError("mine")
        assert sessions.statistics().leased == 0


def _running_tasks() -> int:
    """The tasks of the event loop running now (asyncio), or of the trio run."""
    if sniffio.current_async_library() == "asyncio":
        return len(asyncio.all_tasks())

    def count(task: trio.lowlevel.Task) -> int:
        return 1 + sum(
            count(child) for nursery in task.child_nurseries for child in nursery.child_tasks
        )

    return count(trio.lowlevel.current_root_task())


async def test_an_open_session_runs_one_task() -> None:
    # The registry's task for a session runs the actor's loop itself: an open session, idle or
    # not, costs one task (the actor's loop used to run in a second, its host task holding
    # SessionActor.open for it). Subscribers and compaction start theirs only when needed.
    async with Sessions("memory:") as sessions:
        before = _running_tasks()
        actors = [await sessions.get(f"s{index}") for index in range(5)]
        assert _running_tasks() == before + 5
        for index, actor in enumerate(actors):
            await actor.add_message(Message.user(f"to {index}"))
        assert _running_tasks() == before + 5
        assert [actor.messages()[0].text for actor in actors] == [f"to {i}" for i in range(5)]
    assert all(actor.closed for actor in actors)


class _FeedFailsOnce(MemoryStore):
    """A memory store with a change feed whose first watch fails once the test says so (as a
    feed that cannot go on would)."""

    def __init__(self) -> None:
        super().__init__()
        self.fail = anyio.Event()
        self.failed = False

    async def watch(self, session_id: str) -> AsyncGenerator[int, None]:
        if not self.failed:
            await self.fail.wait()
            self.failed = True
            raise RuntimeError("the feed is lost")
        await anyio.sleep_forever()
        yield 0  # never: makes this an async generator


async def test_a_hosted_actor_whose_background_task_fails_closes_and_reopens() -> None:
    # A task of the actor's own (here the follower's watch) that fails aborts the actor, as
    # when its loop ran in a task of its own under SessionActor.open: its loop, parked in the
    # registry's task, takes the task group's cancellation. The failure is logged, never
    # raised into the registry, and the next get opens the session anew.
    store = _FeedFailsOnce()
    async with Sessions(store, follow=True) as sessions:
        first = await sessions.get("a")
        await first.add_message(Message.user("kept"))
        async with first.subscribe(0) as events:
            store.fail.set()
            with anyio.fail_after(5):
                seen = [event.seq async for event in events]  # ends when the actor closes
        assert seen == [0]
        assert first.closed
        with pytest.raises(SessionClosedError):
            await first.add_message(Message.user("lost"))
        second = await sessions.get("a")
        assert second is not first
        assert [m.text for m in second.messages()] == ["kept"]
        await second.add_message(Message.user("again"))
    assert [e.seq for e in (await store.read("a")).events] == [0, 1]


async def test_a_cancelled_registry_closes_its_actors_and_answers_every_caller() -> None:
    # The registry's block cancelled while callers wait on an actor: each gets its outcome
    # (committed, or SessionClosedError with nothing stored), the actor closes, nobody hangs.
    store = MemoryStore()
    outcomes: list[str] = []
    actors = []

    async def call(session: SessionActor, index: int) -> None:
        try:
            await session.add_message(Message.user(f"m{index}"))
            outcomes.append("committed")
        except SessionClosedError:
            outcomes.append("refused")

    with anyio.fail_after(5):
        async with anyio.create_task_group() as callers:
            with anyio.CancelScope() as scope:
                async with Sessions(store) as sessions:
                    actors.append(await sessions.get("a"))
                    for index in range(20):
                        callers.start_soon(call, actors[0], index)
                    await anyio.lowlevel.checkpoint()  # the calls are queued
                    scope.cancel()
                    await anyio.lowlevel.checkpoint()
    assert actors[0].closed
    assert len(outcomes) == 20
    stored = (await store.read("a")).events
    assert len(stored) == outcomes.count("committed")
