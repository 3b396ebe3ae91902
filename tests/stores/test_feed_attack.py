"""Attacks on the SQLite change feed's solo mode and the follower's lazily started task:
orderings and writers that the solo-mode argument (stores/sqlite/_feed.py) must survive."""

from __future__ import annotations

from contextlib import AsyncExitStack, aclosing
from functools import partial
from pathlib import Path

import anyio
import pytest

from nous_session import Encryption, LocalKeyFile, Message, SessionActor, StoreError
from nous_session.event import Event, make_event
from nous_session.stores.sqlite import SQLiteStore
from tests.support.following import until
from tests.support.processes import ending, spawn_worker

pytestmark = pytest.mark.anyio

USER = "user_message"


def _event(seq: int, text: str = "x") -> Event:
    return make_event(seq, USER, {"content": text})


class _Outage:
    """A key provider whose wrap fails while ``down`` (a KMS outage)."""

    def __init__(self, provider: LocalKeyFile) -> None:
        self._provider = provider
        self.name = provider.name
        self.down = False

    def wrap(self, key: bytes) -> bytes:
        if self.down:
            raise ConnectionError("the KMS is down")
        return self._provider.wrap(key)

    def unwrap(self, wrapped: bytes) -> bytes:
        return self._provider.unwrap(wrapped)


async def test_a_failed_erasure_leaves_no_head_of_its_own_for_the_feed(tmp_path: Path) -> None:
    # An erasure runs on the writer's thread outside its write groups; one that fails after
    # appending its erasure event (the provider could not wrap the new data key) is rolled
    # back, but what the triggers noted must not reach the feed as a head: it would be pushed
    # (a count the session does not have), and the commit that really makes that count would
    # then look like one the feed had seen already, and reach no watch.
    provider = _Outage(LocalKeyFile.create(tmp_path / "master.key"))
    async with (
        SQLiteStore(tmp_path / "s.db", encryption=Encryption(provider)) as store,
        aclosing(store.watch("s")) as heads,
        aclosing(store.watch("m")) as marks,
    ):
        with anyio.fail_after(10):
            await store.commit("s", expected_count=0, events=(_event(0), _event(1)))
            assert await anext(marks) == 0
            while await anext(heads) != 2:
                pass
            provider.down = True
            with pytest.raises(StoreError, match="could not wrap"):
                await store.erase("s", [0], reason="test")
            provider.down = False
            await store.commit("t", expected_count=0, events=(_event(0),))  # a write group
            # A mark: once its head is pushed, whatever the feed took before it is pushed too.
            await store.commit("m", expected_count=0, events=(_event(0),))
            assert await anext(marks) == 1
            monitor = store._monitor
            assert monitor is not None
            assert monitor._solo
            assert [watch.heads for watch in monitor._watches["s"]] == [[]], "no head moved"
            await store.commit("s", expected_count=2, events=(_event(2),))
            assert await anext(heads) == 3


# A store opened through a symbolic link to its file: SQLite resolves the link, and makes its
# -wal and -shm files next to the file the link names, not next to the link.


async def _follow_through(link: Path, real: Path, read_only: bool) -> None:
    async with SQLiteStore(real) as other:
        await other.commit("s", expected_count=0, events=(_event(0),))
        async with (
            SQLiteStore(link, read_only=read_only) as store,
            SessionActor.open(session_id="s", store=store) as follower,
            SessionActor.open(session_id="s", store=other, follow=False) as writer,
        ):
            assert follower.log.count == 1
            await writer.add_message(Message.user("1"))
            await until(follower, 2)
            assert [m.text for m in follower.messages()] == ["x", "1"]


async def test_a_store_opened_through_a_symlink_follows_another_writer(tmp_path: Path) -> None:
    (tmp_path / "link.db").symlink_to(tmp_path / "s.db")
    await _follow_through(tmp_path / "link.db", tmp_path / "s.db", read_only=False)


async def test_a_read_only_store_opened_through_a_symlink_follows_a_writer(
    tmp_path: Path,
) -> None:
    (tmp_path / "link.db").symlink_to(tmp_path / "s.db")
    await _follow_through(tmp_path / "link.db", tmp_path / "s.db", read_only=True)


async def test_solo_mode_holds_through_a_symlink(tmp_path: Path) -> None:
    # The writer's account peeks at the -shm file SQLite uses: through the link, that is the
    # one next to the file, so a store that is its file's only writer stays in solo mode.
    (tmp_path / "link.db").symlink_to(tmp_path / "s.db")
    async with (
        SQLiteStore(tmp_path / "link.db") as store,
        SessionActor.open(session_id="s", store=store) as actor,
    ):
        await actor.add_message(Message.user("0"))
        await store.sessions()  # a read: the writer has told its account of that commit
        assert store._own is not None
        assert store._own.armed
        assert not store._own.shared


# Other processes, and many sessions.


async def test_a_process_that_commits_once_and_exits_is_followed(tmp_path: Path) -> None:
    # We follow in solo mode; another process opens the file, commits once and closes (its
    # connection is not the file's last: the WAL stays). Its commit reaches our follower,
    # and our own commits after it still reach our other watches.
    path = tmp_path / "s.db"
    async with (
        SQLiteStore(path) as store,
        SessionActor.open(session_id="s", store=store) as actor,
        aclosing(store.watch("s")) as heads,
    ):
        for n in range(3):
            await actor.add_message(Message.user(f"ours {n}"))
        with anyio.fail_after(10):
            while await anext(heads) != 3:
                pass
        monitor = store._monitor
        assert monitor is not None
        assert monitor._solo
        child = spawn_worker("write", f"sqlite:///{path}", "s", "once", "1", "1")
        with child, ending(child):
            await anyio.to_thread.run_sync(child.wait, 60)
        assert child.returncode == 0
        await until(actor, 4)
        assert [m.text for m in actor.messages()] == ["ours 0", "ours 1", "ours 2", "once 0 0"]
        await actor.add_message(Message.user("ours 3"))
        with anyio.fail_after(10):
            while await anext(heads) != 5:
                pass
        assert not monitor._solo


async def test_a_read_only_store_follows_a_process_that_writes_once(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    async with SQLiteStore(path) as store:
        await store.commit("s", expected_count=0, events=(_event(0),))
    async with (
        SQLiteStore(path, read_only=True) as store,
        SessionActor.open(session_id="s", store=store) as actor,
    ):
        for n in range(2):  # each finds no writer on the file, and leaves it so
            child = spawn_worker("write", f"sqlite:///{path}", "s", f"w{n}", "1", "1")
            with child, ending(child):
                await anyio.to_thread.run_sync(child.wait, 60)
            assert child.returncode == 0
            await until(actor, 2 + n)
        assert [m.text for m in actor.messages()] == ["x", "w0 0 0", "w1 0 0"]


async def test_hundreds_of_sessions_followed_when_another_writer_comes(tmp_path: Path) -> None:
    # 300 followed sessions, each committed to by our writer (solo mode); another writer then
    # commits to every other one. Each of those reaches its follower; the rest wake nobody
    # (their followers start no task).
    path = tmp_path / "s.db"
    sessions = 300
    async with SQLiteStore(path) as store, AsyncExitStack() as stack:
        actors = [
            await stack.enter_async_context(SessionActor.open(session_id=f"s{n}", store=store))
            for n in range(sessions)
        ]
        async with anyio.create_task_group() as group:
            for actor in actors:
                group.start_soon(actor.add_message, Message.user("ours"))
        async with SQLiteStore(path) as other, anyio.create_task_group() as group:
            for n in range(0, sessions, 2):
                group.start_soon(
                    partial(other.commit, f"s{n}", expected_count=1, events=(_event(1, "theirs"),))
                )
        for actor in actors[::2]:
            await until(actor, 2)
            assert [m.text for m in actor.messages()] == ["ours", "theirs"]
        assert all(actor.log.count == 1 for actor in actors[1::2])
        assert all(actor._engine.follower._watch_scope is None for actor in actors[1::2])
        monitor = store._monitor
        assert monitor is not None
        assert not monitor._solo


# The follower's lazily started task.


async def test_followers_that_close_or_are_cancelled_while_heads_come_leave_no_watch(
    tmp_path: Path,
) -> None:
    # A follower closed right after another writer's commit (its head on its way, its task
    # maybe starting), and one whose opening is cancelled at each point in turn: none is left
    # watching, and a follower opened afterwards holds every commit.
    path = tmp_path / "s.db"
    async with SQLiteStore(path) as store, SQLiteStore(path) as other:
        count = 0
        for n in range(24):
            async with SessionActor.open(session_id="s", store=store):
                await other.commit("s", expected_count=count, events=(_event(count),))
                count += 1
                for _ in range(n % 6):
                    await anyio.lowlevel.checkpoint()

            async def opening() -> None:
                async with SessionActor.open(session_id="s", store=store):
                    await anyio.sleep_forever()

            async with anyio.create_task_group() as group:
                group.start_soon(opening)
                for _ in range(n):
                    await anyio.lowlevel.checkpoint()
                group.cancel_scope.cancel()
        monitor = store._monitor
        assert monitor is not None
        assert monitor.watching == 0
        async with SessionActor.open(session_id="s", store=store) as actor:
            assert actor.log.count == count
            await other.commit("s", expected_count=count, events=(_event(count),))
            await until(actor, count + 1)
