"""SQLite's change feed: followers see commits made by other actors and other processes."""

from __future__ import annotations

import sqlite3
import threading
from contextlib import AsyncExitStack, aclosing
from pathlib import Path

import anyio
import pytest

from nous_session import ConflictError, Event, Message, SessionActor
from nous_session.event import make_event
from nous_session.stores import follow
from nous_session.stores.sqlite import SQLiteStore
from nous_session.stores.sqlite._feed import DEFAULT_POLL
from tests.support.following import until
from tests.support.processes import Lines, ending, spawn_worker

pytestmark = pytest.mark.anyio

USER = "user_message"


def _feed_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "nous_session-sqlite-feed"]


async def test_two_actors_of_one_session_in_one_process_see_each_other(tmp_path: Path) -> None:
    async with SQLiteStore(tmp_path / "s.db") as store:
        async with (
            SessionActor.open(session_id="s", store=store) as a,
            SessionActor.open(session_id="s", store=store) as b,
        ):
            await a.add_message(Message.user("from a"))
            try:
                await b.add_message(Message.user("from b"))
            except ConflictError:  # b had not heard of a's commit yet: it has now
                await b.add_message(Message.user("from b, retried"))
            await until(a, 2)
            assert [m.text for m in a.messages()] == [m.text for m in b.messages()]
            assert a.log.count == b.log.count == 2


async def test_an_actors_own_commits_do_not_wake_it(tmp_path: Path) -> None:
    # Every commit changes the file for the feed's connection; the feed asks the follower what
    # it holds and wakes it only for what it does not (another writer's commit).
    path = tmp_path / "s.db"
    async with SQLiteStore(path) as store:
        async with SessionActor.open(session_id="s", store=store) as actor:
            for n in range(20):
                await actor.add_message(Message.user(str(n)))
            monitor = store._monitor
            assert monitor is not None
            with anyio.fail_after(10):  # until the feed has seen the last commit
                while monitor._heads.get("s", ())[:2] != (20, 0):  # noqa: ASYNC110
                    await anyio.sleep(0.005)
            assert monitor.pushes == 0
            async with (
                SQLiteStore(path) as other,
                SessionActor.open(session_id="s", store=other, follow=False) as writer,
            ):
                await writer.add_message(Message.user("from another writer"))
            await until(actor, 21)
            assert monitor.pushes >= 1
            assert actor.messages()[-1].text == "from another writer"


async def test_the_feed_backs_off_while_every_change_is_its_watchers_own(tmp_path: Path) -> None:
    # A process that writes a file alone: every change the feed reads is its actor's own
    # commit, held already, so it checks less often (up to BACK_OFF_AT_MOST polls apart);
    # another writer's commit still comes through.
    path = tmp_path / "s.db"
    async with SQLiteStore(path) as store:
        async with SessionActor.open(session_id="s", store=store) as actor:
            await actor.add_message(Message.user("first"))
            with anyio.fail_after(10):  # the follower's watch starts in a task of its own
                while store._monitor is None or not store._monitor.watching:  # noqa: ASYNC110
                    await anyio.sleep(0.005)
            monitor = store._monitor
            checks = monitor.checks
            began = anyio.current_time()
            while anyio.current_time() - began < 0.5:
                await actor.add_message(Message.user("more"))
            polls = (anyio.current_time() - began) / DEFAULT_POLL
            made = monitor.checks - checks
            assert made < polls / 3, f"{made} checks in {polls:.0f} polls' time"
            assert monitor.pushes == 0
            count = actor.log.count
            async with (
                SQLiteStore(path) as other,
                SessionActor.open(session_id="s", store=other, follow=False) as writer,
            ):
                await writer.add_message(Message.user("from another writer"))
            await until(actor, count + 1)
            assert actor.messages()[-1].text == "from another writer"


async def test_a_head_is_held_back_for_a_quarter_second_at_most(tmp_path: Path) -> None:
    # An owner whose commits keep failing without reading the store is "committing" at every
    # look: another writer's head still reaches it, HOLD_AT_MOST after the feed saw it. A
    # known() that raises (the owner's bug) counts as none: the head comes at once.
    path = tmp_path / "s.db"

    def always_committing() -> tuple[int, int, bool]:
        return 0, 0, True

    def broken() -> tuple[int, int, bool]:
        raise RuntimeError("a bug in the owner")

    async with SQLiteStore(path) as store, SQLiteStore(path) as other:
        await other.commit("held", expected_count=0, events=[make_event(0, USER, {"content": "a"})])
        await other.commit(
            "broken", expected_count=0, events=[make_event(0, USER, {"content": "a"})]
        )
        async with (
            aclosing(store.watch("held", known=always_committing)) as held,
            aclosing(store.watch("broken", known=broken)) as failing,
        ):
            with anyio.fail_after(10):
                assert await anext(held) == 1  # a new watch is told the head it finds
                assert await anext(failing) == 1
                began = anyio.current_time()
                await other.commit(
                    "held", expected_count=1, events=[make_event(1, USER, {"content": "b"})]
                )
                await other.commit(
                    "broken", expected_count=1, events=[make_event(1, USER, {"content": "b"})]
                )
                assert await anext(failing) == 2
                assert await anext(held) == 2
                assert anyio.current_time() - began >= 0.2  # held back meanwhile


async def test_follow_false_starts_no_feed(tmp_path: Path) -> None:
    async with SQLiteStore(tmp_path / "s.db") as store:
        async with SessionActor.open(session_id="s", store=store, follow=False) as actor:
            for n in range(5):
                await actor.add_message(Message.user(str(n)))
            assert store._monitor is None
            assert not _feed_threads()


async def test_the_feed_thread_ends_with_its_last_watch(tmp_path: Path) -> None:
    async with SQLiteStore(tmp_path / "s.db") as store:
        async with SessionActor.open(session_id="s", store=store) as actor:
            await actor.add_message(Message.user("hello"))
            with anyio.fail_after(10):  # the watch registers once its task has run
                while store._monitor is None or not store._monitor.watching:  # noqa: ASYNC110
                    await anyio.sleep(0.01)
            assert store._monitor.watching == 1
        assert store._monitor.watching == 0
        thread = store._monitor._thread
        if thread is not None:
            await anyio.to_thread.run_sync(thread.join, 5)
        assert store._monitor._thread is None
        assert not _feed_threads()


async def test_a_memory_database_can_be_opened_with_the_default_follow() -> None:
    async with SQLiteStore(":memory:") as store:
        async with SessionActor.open(session_id="s", store=store) as actor:
            await actor.add_message(Message.user("hello"))
            assert actor.log.count == 1


async def test_a_snapshot_by_another_writer_reaches_the_follower(tmp_path: Path) -> None:
    async with SQLiteStore(tmp_path / "s.db") as store:
        async with (
            SessionActor.open(session_id="s", store=store) as writer,
            SessionActor.open(session_id="s", store=store) as follower,
        ):
            for n in range(6):
                await writer.add_message(Message.user(str(n)))
            await until(follower, 6)
            await writer.replace(0, 3, Message.system("summary"))
            await writer.snapshot()
            with anyio.fail_after(10):
                while follower.log.horizon != writer.log.horizon:  # noqa: ASYNC110
                    await anyio.sleep(0.01)  # a condition checked until the deadline
            assert [m.text for m in follower.messages()] == [m.text for m in writer.messages()]


async def test_a_read_only_store_follows_a_writer_that_starts_later(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    async with SQLiteStore(path) as store:  # the file exists, with no writer left on it
        async with SessionActor.open(session_id="s", store=store, follow=False) as actor:
            await actor.add_message(Message.user("before"))
    assert not Path(f"{path}-wal").exists()  # noqa: ASYNC240 - a test's check
    seen: list[str] = []
    async with SQLiteStore(path, read_only=True) as viewer:

        async def watch(task_status: anyio.abc.TaskStatus[None]) -> None:
            async with aclosing(follow(viewer, "s")) as events:
                task_status.started()
                async for event in events:
                    seen.append(event.data["content"])
                    if len(seen) == 3:
                        return

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                await tg.start(watch)
                async with SQLiteStore(path) as store:
                    async with SessionActor.open(session_id="s", store=store) as actor:
                        await actor.add_message(Message.user("after 1"))
                        await actor.add_message(Message.user("after 2"))
    assert seen == ["before", "after 1", "after 2"]


async def _stored_and_closed(path: Path, count: int) -> None:
    """Append to session "s" until it holds ``count`` events, through a store that is closed
    again: its WAL checkpointed into the file and removed, no writer left on it."""
    async with SQLiteStore(path) as store:
        stored = await store.load("s")
        for seq in range(len(stored), count):
            event = make_event(seq, USER, {"content": f"m{seq}"})
            await store.commit("s", expected_count=seq, events=(event,))
    assert not Path(f"{path}-wal").exists()  # noqa: ASYNC240 - a test's check


async def test_a_writer_that_comes_and_goes_between_two_polls_is_seen(tmp_path: Path) -> None:
    # With no -wal there is no writer. One that opens, commits and closes between two of the
    # feed's polls leaves no -wal behind either: the feed must notice the file itself moved.
    path = tmp_path / "s.db"
    await _stored_and_closed(path, 1)
    async with SQLiteStore(path, read_only=True) as viewer:
        async with aclosing(viewer.watch("s", poll=60)) as heads:
            with anyio.fail_after(10):
                assert await anext(heads) == 1  # a new watch gets its head, writer or not
                await _stored_and_closed(path, 3)  # all of it while the feed sleeps
                monitor = viewer._monitor
                assert monitor is not None
                monitor._wake.set()  # the next poll, now
                assert await anext(heads) == 3


async def test_a_head_held_for_an_owner_commit_comes_with_no_writer_too(tmp_path: Path) -> None:
    # A head that comes while its watcher's own commit is in flight is held, and asked about
    # again every poll (pushed after HOLD_AT_MOST in any case): with no writer on the file too.
    path = tmp_path / "s.db"
    await _stored_and_closed(path, 1)
    async with SQLiteStore(path, read_only=True) as viewer:
        watch = viewer.watch("s", poll=0.01, known=lambda: (1, 0, True))  # always committing
        async with aclosing(watch) as heads:
            await _stored_and_closed(path, 3)
            with anyio.fail_after(10):
                assert await anext(heads) == 3


async def test_a_feed_with_no_writer_pushes_only_what_moved(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    await _stored_and_closed(path, 2)
    async with SQLiteStore(path, read_only=True) as viewer:
        async with aclosing(viewer.watch("s", poll=0.002)) as heads:
            with anyio.fail_after(10):
                assert await anext(heads) == 2
            monitor = viewer._monitor
            assert monitor is not None
            reads = monitor.reads
            # It keeps reading the file (every poll for 2 s after its last change, as a stat
            # that recent proves nothing; then every 100 polls), and pushes nothing.
            with anyio.move_on_after(0.5):
                await anext(heads)
                pytest.fail("a head was pushed though nothing moved")
            assert monitor.reads > reads


@pytest.fixture
def writer_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'shared.db'}"


def test_a_subscriber_in_another_process_sees_every_commit(writer_url: str) -> None:
    total = 2 * 3 * 20
    subscriber = spawn_worker("subscribe", writer_url, "live", str(total))
    lines = Lines(subscriber)
    assert lines.next().strip() == "ready"
    writers = [spawn_worker("write", writer_url, "live", f"w{i}", "3", "20") for i in range(2)]
    seen: list[tuple[int, str]] = []
    finished = False
    try:
        while line := lines.next(timeout=60):
            if line.startswith("event "):
                _, seq, content = line.rstrip("\n").split(" ", 2)
                seen.append((int(seq), content))
            elif line.startswith("done"):
                break
        finished = True
    finally:
        if not finished:
            subscriber.kill()
        subscriber.wait(timeout=60)
        for writer in writers:
            writer.wait(timeout=60)
        for process in (subscriber, *writers):
            if process.stdout is not None:
                process.stdout.close()
    assert subscriber.returncode == 0
    assert [seq for seq, _ in seen] == list(range(total)), "in seq order, each exactly once"
    assert all(w.returncode == 0 for w in writers)


# Solo mode: a store whose writer is the file's only one pays nothing for following.


async def _open_actors(stack: AsyncExitStack, store: SQLiteStore, count: int) -> list[SessionActor]:
    return [
        await stack.enter_async_context(SessionActor.open(session_id=f"s{index}", store=store))
        for index in range(count)
    ]


async def _until_seen(store: SQLiteStore, heads: dict[str, tuple[int, int]]) -> None:
    """Wait until the feed has seen these heads (what our writer's commits changed)."""
    monitor = store._monitor
    assert monitor is not None
    with anyio.fail_after(10):
        while any(monitor._heads.get(name, ())[:2] != head for name, head in heads.items()):  # noqa: ASYNC110
            await anyio.sleep(0.005)


async def test_following_costs_nothing_while_the_stores_writer_is_the_files_only_one(
    tmp_path: Path,
) -> None:
    # 40 followed sessions, each committed to three times: the feed never asks SQLite for
    # data_version, never reads the watched heads (only each new watch's head, once), wakes
    # no follower, and no follower has a task. Another store's commit then ends solo mode,
    # and reaches its follower.
    path = tmp_path / "s.db"
    async with SQLiteStore(path) as store, AsyncExitStack() as stack:
        actors = await _open_actors(stack, store, 40)
        for turn in range(3):
            for actor in actors:
                await actor.add_message(Message.user(f"turn {turn}"))
        await _until_seen(store, {f"s{index}": (3, 0) for index in range(40)})
        monitor = store._monitor
        assert monitor is not None
        assert monitor._solo
        assert (monitor.checks, monitor.reads, monitor.pushes) == (0, 0, 0)
        assert 1 <= monitor.lookups <= 40  # the new watches' heads, some read together
        assert all(actor._engine.follower._watch_scope is None for actor in actors)
        async with SQLiteStore(path) as other:
            event = make_event(3, USER, {"content": "from another store"})
            await other.commit("s7", expected_count=3, events=(event,))
        await until(actors[7], 4)
        assert actors[7].messages()[-1].text == "from another store"
        assert not monitor._solo
        assert [actor.log.count for actor in actors] == [4 if i == 7 else 3 for i in range(40)]


async def test_a_writer_already_on_the_file_is_noticed_when_it_commits(tmp_path: Path) -> None:
    # The other store writes first and stays open; ours opens and follows (in solo mode: no
    # commit of the other's since our writer looked). The other's next commit, with our writer
    # idle, shows in the WAL-index header; the commits after ours, in our writer's
    # data_version; nothing is missed either way.
    path = tmp_path / "s.db"
    async with SQLiteStore(path) as other:
        await other.commit("s", expected_count=0, events=(make_event(0, USER, {"content": "0"}),))
        async with (
            SQLiteStore(path) as store,
            SessionActor.open(session_id="s", store=store) as actor,
        ):
            assert actor.log.count == 1
            await other.commit(
                "s", expected_count=1, events=(make_event(1, USER, {"content": "1"}),)
            )
            await until(actor, 2)
            for n in range(2, 12, 2):
                await actor.add_message(Message.user(str(n)))
                await other.commit(
                    "s", expected_count=n + 1, events=(make_event(n + 1, USER, {"content": "x"}),)
                )
            await until(actor, 12)
            assert actor.log.count == 12
            assert store._own is not None
            assert store._own.shared


async def test_our_writer_sees_a_commit_made_while_it_was_idle(tmp_path: Path) -> None:
    # Another store commits while our writer is idle, then ours commits: our writer's
    # data_version has moved, so it says so (right after answering the commit), whatever
    # the feed has looked at.
    path = tmp_path / "s.db"
    async with SQLiteStore(path) as store:
        async with SessionActor.open(session_id="a", store=store) as actor:
            await actor.add_message(Message.user("ours"))
            own = store._own
            assert own is not None
            assert own.armed
            assert not own.shared
            async with SQLiteStore(path) as other:
                event = make_event(0, USER, {"content": "theirs"})
                await other.commit("b", expected_count=0, events=(event,))
            await actor.add_message(Message.user("ours again"))
            await store.sessions()  # a read: the writer has told its account of that commit
            assert own.shared


async def test_a_failed_jobs_changes_are_read_again_not_pushed(tmp_path: Path) -> None:
    # A job that changed a session's count and then failed was rolled back: what the trigger
    # noted for it is not the session's head. A plain watch sees only real heads.
    path = tmp_path / "s.db"
    async with SQLiteStore(path) as store:
        await store.commit("s", expected_count=0, events=(make_event(0, USER, {"content": "0"}),))
        async with aclosing(store.watch("s")) as heads:
            with anyio.fail_after(10):
                assert await anext(heads) == 1

                def failing(connection: sqlite3.Connection) -> None:
                    connection.execute("UPDATE nous_sessions SET count = 7 WHERE name = 's'")
                    raise RuntimeError("after the update")

                with pytest.raises(RuntimeError):
                    await store._write(failing, "a failing job")
                event = make_event(1, USER, {"content": "1"})
                await store.commit("s", expected_count=1, events=(event,))
                assert await anext(heads) == 2
                monitor = store._monitor
                assert monitor is not None
                assert monitor._solo


def test_another_process_is_noticed_and_followed(tmp_path: Path) -> None:
    # Both orders: a writer process that starts before we follow, and one that starts after
    # (we follow in solo mode until its first commit). Every event of each reaches our actor.
    anyio.run(_follow_processes, tmp_path / "shared.db")


async def _follow_processes(path: Path) -> None:
    url = f"sqlite:///{path}"
    async with SQLiteStore(path) as store:
        await store.commit("s", expected_count=0, events=(make_event(0, USER, {"content": "0"}),))
        first = spawn_worker("write", url, "s", "early", "1", "30")
        with first, ending(first):
            lines = Lines(first)
            assert lines.next().strip() == "ready"
            async with SessionActor.open(session_id="s", store=store) as actor:
                await actor.add_message(Message.user("ours"))
                while not lines.next(timeout=60).startswith("done"):
                    pass
                await until(actor, 32)
        async with SessionActor.open(session_id="t", store=store) as actor:
            await actor.add_message(Message.user("ours, first"))
            monitor = store._monitor
            assert monitor is not None
            second = spawn_worker("write", url, "t", "late", "1", "30")
            with second, ending(second):
                lines = Lines(second)
                while not lines.next(timeout=60).startswith("done"):
                    pass
                await until(actor, 31)
            texts = [message.text for message in actor.messages()]
            assert texts[0] == "ours, first"
            assert texts[1:] == [f"late 0 {n}" for n in range(30)]


@pytest.mark.parametrize("runner", ["asyncio.run", "trio.run"])
def test_a_follower_on_a_plain_event_loop_starts_its_task_when_a_head_comes(
    tmp_path: Path, runner: str
) -> None:
    # As under a web server: asyncio.run (or trio.run), with nothing in the context naming the
    # library (the anyio test plugin names it, which hid that the feed's wake-up, a callback
    # outside any task, could not start the follower's task there).

    async def scenario() -> list[str]:
        async with (
            SQLiteStore(tmp_path / "s.db") as ours,
            SQLiteStore(tmp_path / "s.db") as other,
            SessionActor.open(session_id="s", store=ours) as follower,
            SessionActor.open(session_id="s", store=other, follow=False) as writer,
        ):
            await writer.add_message(Message.user("from the other store"))
            await until(follower, 1)
            return [message.text for message in follower.messages()]

    if runner == "trio.run":
        import trio

        assert trio.run(scenario) == ["from the other store"]
    else:
        import asyncio

        assert asyncio.run(scenario()) == ["from the other store"]


def _events(start: int, stop: int) -> tuple[Event, ...]:
    return tuple(make_event(seq, USER, {"content": str(seq)}) for seq in range(start, stop))


@pytest.mark.parametrize("deleter", ["the same store", "another store"])
async def test_a_delete_tells_the_sessions_watches_to_read(tmp_path: Path, deleter: str) -> None:
    # A delete moves the session's count down (its row is gone: it reads as 0): its watches
    # get -1 (read whatever there is), not the head 0 a watcher holding events would take for
    # one it holds. Through the store the watch is on (solo mode: the feed reads only its
    # writer's notes), and through another (the feed reads the file: data_version).
    path = tmp_path / "s.db"
    async with SQLiteStore(path) as store, SQLiteStore(path) as other:
        await store.commit("s", expected_count=0, events=_events(0, 2))
        await store.commit("x", expected_count=0, events=_events(0, 1))
        deleting = store if deleter == "the same store" else other
        async with aclosing(store.watch("s")) as heads:
            with anyio.fail_after(10):
                assert await anext(heads) == 2
                assert await deleting.delete("x")
                await store.commit("s", expected_count=2, events=_events(2, 3))
                assert await anext(heads) == 3  # x's delete reached nobody here
                assert await deleting.delete("s")
                assert await anext(heads) == -1
                await deleting.commit("s", expected_count=0, events=_events(0, 1))
                assert await anext(heads) == 1


async def test_a_delete_and_a_remake_as_long_between_two_polls_still_tell_the_watches(
    tmp_path: Path,
) -> None:
    # Solo mode keeps the last head its writer's notes give each session: deleted and made
    # again as long before the feed took them, the session reads as the feed last saw it.
    # The delete is noted apart, and its watches still get -1.
    path = tmp_path / "s.db"
    async with SQLiteStore(path) as store:
        await store.commit("s", expected_count=0, events=_events(0, 2))
        async with aclosing(store.watch("s", poll=60)) as heads:
            with anyio.fail_after(10):
                assert await anext(heads) == 2  # the thread's first poll, then it sleeps
                monitor = store._monitor
                assert monitor is not None
                assert await store.delete("s")
                await store.commit("s", expected_count=0, events=_events(0, 2))
                await store.sessions()  # a job after it: the writer has noted that commit
                monitor._wake.set()  # the next poll, now: it takes both notes at once
                assert await anext(heads) == -1
                assert monitor._heads["s"][:2] == (2, 0)


@pytest.mark.parametrize("stored", [0, 1, 3])
async def test_a_new_watch_of_a_session_gone_under_its_watcher_gets_minus_one(
    tmp_path: Path, stored: int
) -> None:
    # A watcher that holds 3 events (an actor that read the session) of a session deleted
    # (maybe made again, shorter or as long) before the feed first read it: the feed has no
    # head of its own to compare with, and the head it reads is one the watcher would take
    # for one it holds. Below what the watcher holds, or of another identity than the one it
    # holds, a first head tells it to read.
    async with SQLiteStore(tmp_path / "s.db") as store:
        if stored:
            await store.commit("s", expected_count=0, events=_events(0, stored))
        known = lambda: (3, 0, False, "the deleted session's uid")  # noqa: E731
        async with aclosing(store.watch("s", known=known)) as heads:
            with anyio.fail_after(10):
                assert await anext(heads) == -1


@pytest.mark.parametrize("solo", [True, False])
async def test_a_session_our_writer_made_and_another_deleted_before_a_poll_is_told(
    tmp_path: Path, solo: bool
) -> None:
    # The feed last read the session as not stored; our writer makes it, and another writer
    # deletes it, both before the feed's next read: the file reads as the feed last saw it.
    # Our writer's note of its commit, offered before the read, is what tells the feed the
    # session was there: its watches get that head, then -1. Whether the feed was solo until
    # the other writer's delete, or had left solo mode before.
    path = tmp_path / "s.db"
    async with SQLiteStore(path) as store, SQLiteStore(path) as other:
        async with aclosing(store.watch("s", poll=60)) as heads:
            with anyio.fail_after(10):
                assert await anext(heads) == 0  # the first poll, then the thread sleeps
                monitor = store._monitor
                assert monitor is not None
                if not solo:
                    reads = monitor.reads
                    await other.commit("x", expected_count=0, events=_events(0, 1))
                    monitor._wake.set()
                    while monitor._solo or monitor.reads == reads:  # noqa: ASYNC110
                        await anyio.sleep(0.005)
                await store.commit("s", expected_count=0, events=_events(0, 2))
                assert await other.delete("s")
                await store.sessions()  # a job after it: the writer has noted its commit
                await _poll_now(store)
                assert [await anext(heads), await anext(heads)] == [2, -1]
                assert not monitor._solo


async def test_a_session_another_writer_deleted_and_made_again_as_long_is_told(
    tmp_path: Path,
) -> None:
    # Made again with as many events (and the same horizon) between two of the feed's reads:
    # only its identity tells the new session from the one watched.
    path = tmp_path / "s.db"
    async with SQLiteStore(path) as store, SQLiteStore(path) as other:
        await store.commit("s", expected_count=0, events=_events(0, 2))
        async with aclosing(store.watch("s", poll=60)) as heads:
            with anyio.fail_after(10):
                assert await anext(heads) == 2  # the first poll, then the thread sleeps
                assert await other.delete("s")
                await other.commit("s", expected_count=0, events=_events(0, 2))
                await _poll_now(store)
                assert await anext(heads) == -1


async def _poll_now(store: SQLiteStore) -> None:
    """Have the feed's thread poll now (it sleeps for its long ``poll`` otherwise), once our
    writer is between batches: in solo mode, a poll that finds a batch of ours running
    cannot tell another writer's commit from ours, and leaves that to the next."""
    own, monitor = store._own, store._monitor
    assert own is not None
    assert monitor is not None
    while own.epoch & 1:  # noqa: ASYNC110 - the writer's thread ends its batch
        await anyio.sleep(0.001)
    monitor._wake.set()
