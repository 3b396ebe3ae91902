"""PostgresStore across processes: one writer per seq, live tails across reconnects, crashes.

Skipped without a server; `.ci/run` starts one. To run them locally:
`. .ci/postgres && make test` (needs PostgreSQL's Debian packages; the script installs them).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, aclosing
from typing import Any

import anyio
import pytest

from nous_session import ConflictError, CorruptRecordError, SessionActor, StoreError
from nous_session.event import make_event
from nous_session.stores import open_store
from tests.support.processes import Lines, check_shared_session, ending, run_writers, spawn_worker

psycopg = pytest.importorskip("psycopg")
from nous_session.stores.postgres import PostgresStore  # noqa: E402
from nous_session.testing import sample_log  # noqa: E402

URL = os.environ.get("NOUS_SESSION_TEST_POSTGRES", "")
pytestmark = pytest.mark.skipif(
    not URL,
    reason="no PostgreSQL server: set NOUS_SESSION_TEST_POSTGRES=postgresql://... "
    "(`. .ci/postgres` starts one on loopback and sets it)",
)


def sql(statement: str, *params: object) -> list[tuple[object, ...]]:
    with psycopg.connect(URL, autocommit=True) as connection:
        cursor = connection.execute(statement, params or None)
        return cursor.fetchall() if cursor.description else []


@pytest.fixture
def schema() -> Iterator[str]:
    name = f"t_{uuid.uuid4().hex[:16]}"
    yield name
    sql(f"DROP SCHEMA IF EXISTS {name} CASCADE")


@pytest.fixture
async def store(schema: str) -> AsyncIterator[PostgresStore]:
    async with PostgresStore(URL, schema=schema) as store:
        yield store


def close(process: subprocess.Popen[str]) -> None:
    if process.stdout is not None:
        process.stdout.close()


def test_open_store_picks_postgres_and_a_schema_from_the_url() -> None:
    assert isinstance(open_store(URL), PostgresStore)
    store = PostgresStore(f"{URL}?schema=tenant_a&connect_timeout=3")
    assert store.schema == "tenant_a"
    assert "schema" not in store.url
    assert "connect_timeout=3" in store.url


@pytest.mark.parametrize("mode", ["raise", "rebase"])
def test_four_processes_share_one_session_without_losing_or_reordering(
    schema: str, mode: str
) -> None:
    acks = run_writers(f"{URL}?schema={schema}", "shared", 4, producers=5, each=40, mode=mode)
    assert len(acks) == 4 * 5 * 40
    stored = [
        (event.seq, str(event.data["content"])) for event in anyio.run(_load, schema, "shared")
    ]
    check_shared_session(acks, stored, producers=5, each=40)


async def _load(schema: str, session_id: str) -> list:  # type: ignore[type-arg]
    async with PostgresStore(URL, schema=schema) as store:
        return list(await store.load(session_id))


def test_a_subscriber_in_another_process_sees_everything_across_a_reconnect(schema: str) -> None:
    total = 2 * 3 * 30
    url = f"{URL}?schema={schema}"
    subscriber = spawn_worker("subscribe", url, "live", str(total))
    assert subscriber.stdout is not None
    assert subscriber.stdout.readline().strip() == "ready"
    writers = [spawn_worker("write", url, "live", f"w{i}", "3", "30") for i in range(2)]
    seen: list[tuple[int, str]] = []
    terminated = False
    lines = Lines(subscriber)  # a subscriber that misses an event fails the test, not hangs
    finished = False
    try:
        while line := lines.next(timeout=60):
            if line.startswith("event "):
                _, seq, content = line.rstrip("\n").split(" ", 2)
                seen.append((int(seq), content))
                if len(seen) == total // 3 and not terminated:
                    # Cut the subscriber's LISTEN connection from the server side.
                    killed = sql(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                        " WHERE application_name = 'nous_session listener'"
                        " AND datname = current_database()"
                    )
                    assert killed, "a listener connection must exist"
                    terminated = True
            elif line.startswith("done"):
                break
        finished = True
    finally:
        if not finished:
            subscriber.kill()  # it is waiting for an event it missed: end it, leak nothing
        subscriber.wait(timeout=60)
        close(subscriber)
        for writer in writers:
            writer.wait(timeout=60)
            close(writer)
    assert terminated
    assert subscriber.returncode == 0
    assert [seq for seq, _ in seen] == list(range(total)), "in seq order, each exactly once"
    stored = anyio.run(_load, schema, "live")
    assert seen == [(event.seq, event.data["content"]) for event in stored]


def test_sigkill_mid_batch_leaves_no_partial_batch_and_loses_nothing(schema: str) -> None:
    acknowledged: set[int] = set()
    for round_ in range(5):
        writer = spawn_worker(
            "write", f"{URL}?schema={schema}", "crashy", f"r{round_}", "8", "100000"
        )
        assert writer.stdout is not None
        assert writer.stdout.readline().strip() == "ready"
        for _ in range(50 + 37 * round_):
            line = writer.stdout.readline()
            acknowledged.add(int(line.split()[1]))
        writer.send_signal(signal.SIGKILL)
        for line in writer.stdout:
            if line.startswith("ack "):
                acknowledged.add(int(line.split()[1]))
        writer.wait()
        writer.stdout.close()
        stored = anyio.run(_load, schema, "crashy")
        seqs = [event.seq for event in stored]
        assert seqs == list(range(len(seqs))), "no gap: batches are all or nothing"
        assert acknowledged <= set(seqs), "nothing acknowledged is lost"
        count = sql(f"SELECT count FROM {schema}.nous_sessions WHERE name = 'crashy'")[0][0]
        assert count == len(seqs), "the stored count matches the rows: no partial batch"


@pytest.mark.anyio
async def test_a_read_whose_store_failed_to_open_opens_it_again(
    schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Opening lost its connection while it set up the schema (as when a fault test or the
    # server cut it): the read tries again, and the pool that never opened is not checked
    # (that raised AttributeError from psycopg_pool, not a StoreError).
    migrate = PostgresStore._migrate
    failures = []

    def flaky(self: PostgresStore, connection: Any) -> None:
        if not failures:
            failures.append(True)
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        migrate(self, connection)

    monkeypatch.setattr(PostgresStore, "_migrate", flaky)
    async with PostgresStore(URL, schema=schema) as store:
        assert list(await store.load("s")) == []
        assert failures == [True]


@pytest.mark.anyio
async def test_a_lost_connection_fails_only_the_batch_in_flight(store: PostgresStore) -> None:
    async with SessionActor.open(session_id="s", store=store, follow=False) as session:
        await session.append("user_message", {"content": "before"})
        sql(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE application_name = 'nous_session' AND pid <> pg_backend_pid()"
            " AND datname = current_database()"
        )
        outcomes = []
        for index in range(3):
            try:
                await session.append("user_message", {"content": f"after {index}"})
                outcomes.append("ok")
            except ConflictError:
                outcomes.append("conflict")
            except StoreError:
                outcomes.append("failed")
        assert "conflict" not in outcomes
        assert outcomes[-1] == "ok"
        assert outcomes.count("failed") <= 1
        stored = await store.load("s")
        assert list(session.log.events()) == list(stored)
        contents = [event.data["content"] for event in stored]
        assert len(contents) == len(set(contents)), "never retried into a duplicate"


@pytest.mark.anyio
async def test_a_corrupted_row_and_a_newer_schema_are_clear_errors(
    store: PostgresStore, schema: str
) -> None:
    async with SessionActor.open(session_id="s", store=store) as session:
        await session.append("user_message", {"content": "fine"})
    sql(f"UPDATE {schema}.nous_events SET record = %s WHERE session = 's'", b"[1,0,")
    with pytest.raises(CorruptRecordError, match="session 's' seq 0"):
        await store.load("s")
    sql(f"UPDATE {schema}.nous_schema SET version = 99")
    async with PostgresStore(URL, schema=schema) as newer:
        with pytest.raises(StoreError, match="newer than this nous_session"):
            await newer.sessions()


@pytest.mark.anyio
async def test_a_rebasing_commit_over_a_corrupt_record_says_its_batch_landed(
    store: PostgresStore, schema: str
) -> None:
    async with SessionActor.open(session_id="s", store=store) as session:
        await session.append("user_message", {"content": "fine"})
        await session.append("user_message", {"content": "to be corrupted"})
    sql(f"UPDATE {schema}.nous_events SET record = %s WHERE session = 's' AND seq = 1", b"[1,1,")
    mine = make_event(1, "user_message", {"content": "mine"})
    with pytest.raises(CorruptRecordError, match=r"seq 1 .*committed at seqs 2\.\.2"):
        await store.commit_rebased("s", expected_count=1, events=[mine])
    held = sql(f"SELECT seq FROM {schema}.nous_events ORDER BY seq")
    assert [row[0] for row in held] == [0, 1, 2]


@pytest.mark.anyio
async def test_a_row_missing_from_the_middle_is_named_on_read(
    store: PostgresStore, schema: str
) -> None:
    await store.commit("s", expected_count=0, events=sample_log(5).events())
    sql(f"DELETE FROM {schema}.nous_events WHERE session = 's' AND seq = 2")
    for read in (store.read, store.load):
        with pytest.raises(
            CorruptRecordError,
            match=r"'s' in schema .*: its count is 5 .*rows are missing: seqs 2 \(",
        ):
            await read("s")
    assert [e.seq for e in await store.load("s", since=3)] == [3, 4]


@pytest.mark.anyio
async def test_a_rebase_never_writes_past_a_hole(store: PostgresStore, schema: str) -> None:
    await store.commit("s", expected_count=0, events=sample_log(3).events())
    # The count moved with no rows written: seqs 3..9 are missing.
    sql(f"UPDATE {schema}.nous_sessions SET count = 10 WHERE name = 's'")
    mine = [make_event(3, "user_message", {"content": "mine"})]
    with pytest.raises(CorruptRecordError, match=r"rows are missing: seqs 3\.\.9 "):
        await store.commit_rebased("s", expected_count=3, events=mine)
    # A middle row gone too, and the caller behind it: every missing seq is named.
    sql(f"DELETE FROM {schema}.nous_events WHERE session = 's' AND seq = 1")
    with pytest.raises(CorruptRecordError, match=r"rows are missing: seqs 1, 3\.\.9 "):
        await store.commit_rebased(
            "s", expected_count=0, events=[make_event(0, "user_message", {})]
        )
    assert sql(f"SELECT seq FROM {schema}.nous_events ORDER BY seq") == [(0,), (2,)]
    assert sql(f"SELECT count FROM {schema}.nous_sessions") == [(10,)]
    with pytest.raises(ConflictError, match="below the expected 11"):
        await store.commit_rebased(
            "s", expected_count=11, events=[make_event(11, "user_message", {})]
        )


@pytest.mark.anyio
async def test_two_writers_on_one_session_leave_nothing_on_psycopgs_logger(
    schema: str, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    # Regression: a statement failing inside a pipeline (a key the other writer took, a
    # deadlock) left the statements queued after it unread, and psycopg logged "error ignored
    # terminating <psycopg.Pipeline ...>: pipeline aborted" on stderr as the block unwound.
    caplog.set_level(logging.WARNING, logger="psycopg")
    conflicts = 0
    async with (
        PostgresStore(URL, schema=schema) as first,
        PostgresStore(URL, schema=schema) as second,
    ):
        async with (
            SessionActor.open(session_id="s", store=first, follow=False) as one,
            SessionActor.open(session_id="s", store=second, follow=False) as two,
        ):
            for round_ in range(3):
                await one.append("user_message", {"content": f"one {round_}"})
                try:  # conditional, planned on a stale log (a plain append would land)
                    await two.append_many(
                        [("user_message", {"content": f"two {round_}"})],
                        expect_count=two.log.count,
                    )
                except ConflictError:
                    conflicts += 1
                    await two.reload()
        # A key the other writer took, in a rebasing commit and in a round of grouped
        # commits (each one pipelined transaction), a few times: where the error surfaces
        # in the pipeline depends on when its results arrive.
        outcomes: dict[str, BaseException | None] = {}

        async def commit(session_id: str, expected: int, key: str) -> None:
            try:
                await second.commit(
                    session_id,
                    expected_count=expected,
                    events=[make_event(expected, "user_message", {})],
                    keys=[(key, expected, 1)],
                )
                outcomes[session_id] = None
            except ConflictError as error:
                outcomes[session_id] = error

        for round_ in range(20):
            key = f"k{round_}"
            count = (await first.read("s")).count
            event = make_event(count, "user_message", {})
            await first.commit("s", expected_count=count, events=[event], keys=[(key, count, 1)])
            with pytest.raises(ConflictError):
                await second.commit_rebased(
                    "s", expected_count=count, events=[event], keys=[(key, count, 1)]
                )
            async with anyio.create_task_group() as tg:
                tg.start_soon(commit, "s", count + 1, key)
                tg.start_soon(commit, f"t{round_}", 0, key)
            assert outcomes[f"t{round_}"] is None
            assert isinstance(outcomes["s"], ConflictError)
            conflicts += 2
    assert conflicts == 43
    assert [r.getMessage() for r in caplog.records if r.name.startswith("psycopg")] == []
    assert "psycopg" not in capfd.readouterr().err


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="plain identifier"):
        PostgresStore(URL, schema="x; DROP TABLE y")
    with pytest.raises(ValueError, match="postgresql://"):
        PostgresStore("mysql://nope")
    with pytest.raises(ValueError, match="min_size"):
        PostgresStore(URL, min_size=5, max_size=2)


@pytest.mark.anyio
async def test_an_unreachable_server_is_a_store_error() -> None:
    async with PostgresStore("postgresql://nobody@127.0.0.1:1/none", connect_timeout=1) as store:
        with pytest.raises(StoreError, match="cannot connect"):
            await store.load("s")


@pytest.mark.anyio
async def test_follow_yields_history_then_live_events(store: PostgresStore) -> None:
    async with SessionActor.open(session_id="f", store=store) as writer:
        await writer.append("user_message", {"content": "old"})
        seen: list[str] = []
        async with anyio.create_task_group() as tg:

            async def read() -> None:
                async with aclosing(store.follow("f", since=0)) as events:
                    async for event in events:
                        seen.append(str(event.data["content"]))
                        if len(seen) == 3:
                            return

            tg.start_soon(read)
            await writer.append("user_message", {"content": "new 1"})
            await writer.append("user_message", {"content": "new 2"})
    assert seen == ["old", "new 1", "new 2"]


@pytest.mark.anyio
async def test_watch_yields_every_head_of_notifications_that_arrive_together(
    store: PostgresStore, schema: str
) -> None:
    # Regression: the watcher left psycopg's notification generator at the session's first
    # notification, and psycopg had taken the whole read off the connection: the heads after
    # it in the same read were lost (a follower that had read that first head already then
    # never read the last commits). One transaction's notifications arrive together.
    channel = f"nous_session.{schema}"
    heads = store.watch("w")
    try:
        with anyio.fail_after(10):
            assert await anext(heads) == -1  # listening
            sql(
                "SELECT pg_notify(%s, %s), pg_notify(%s, %s), pg_notify(%s, %s)",
                *(channel, '{"session": "w", "head": 3}'),
                *(channel, '{"session": "other", "head": 9}'),
                *(channel, '{"session": "w", "head": 5}'),
            )
            assert [await anext(heads), await anext(heads)] == [3, 5]
    finally:
        await heads.aclose()


@pytest.mark.anyio
async def test_watch_with_known_yields_only_the_heads_past_what_the_watcher_holds(
    store: PostgresStore, schema: str
) -> None:
    # The follower's own commits: it holds their heads by the time their notifications are
    # dispatched (mostly), and waking its event loop for each would only make it compare and
    # sleep again. A head past what it holds (another writer's commit) still comes through.
    channel = f"nous_session.{schema}"
    held = [4]
    asked: list[int] = []

    def known() -> tuple[int, int, bool]:
        asked.append(held[0])
        return held[0], 0, False

    heads = store.watch("w", known=known)
    try:
        with anyio.fail_after(10):
            assert await anext(heads) == -1  # listening: always yielded
            sql(
                "SELECT pg_notify(%s, %s), pg_notify(%s, %s), pg_notify(%s, %s),"
                " pg_notify(%s, %s), pg_notify(%s, %s)",
                *(channel, '{"session": "w", "head": 3}'),
                *(channel, '{"session": "w", "head": 4}'),
                *(channel, '{"session": "w", "head": 5}'),
                *(channel, "not a commit's notification"),
                *(channel, '{"session": "w", "head": 9}'),
            )
            assert [await anext(heads), await anext(heads)] == [5, 9]
            held[0] = 9
            sql(
                "SELECT pg_notify(%s, %s), pg_notify(%s, %s)",
                *(channel, '{"session": "w", "head": 9}'),
                *(channel, '{"session": "w", "head": 10}'),
            )
            assert await anext(heads) == 10
        assert len(asked) == 6  # once per head of a watched session, none for the garbage
    finally:
        await heads.aclose()


@pytest.mark.anyio
async def test_a_head_that_comes_while_the_watcher_commits_waits_for_that_commit(
    store: PostgresStore, schema: str
) -> None:
    # A commit's own notification mostly arrives before the commit has answered its actor: it
    # is asked about again until the commit has answered. Held by then, it wakes nobody; not
    # held (another writer's), it comes through, the highest of those held back.
    channel = f"nous_session.{schema}"
    state = {"count": 4, "committing": True}

    def known() -> tuple[int, int, bool]:
        return state["count"], 0, bool(state["committing"])

    heads = store.watch("w", known=known)
    try:
        with anyio.fail_after(10):
            assert await anext(heads) == -1
            listener = store._listener
            assert listener is not None
            sql("SELECT pg_notify(%s, %s)", channel, '{"session": "w", "head": 5}')
            while not listener._unsure:  # noqa: ASYNC110 - the listener's thread takes it
                await anyio.sleep(0.005)
            state.update(count=5, committing=False)  # the commit answered: head 5 was its own
            while listener._unsure:  # noqa: ASYNC110
                await anyio.sleep(0.005)
            assert listener.pushes == 0
            state["committing"] = True  # the next commit, and two of another writer's meanwhile
            sql(
                "SELECT pg_notify(%s, %s), pg_notify(%s, %s)",
                *(channel, '{"session": "w", "head": 7}'),
                *(channel, '{"session": "w", "head": 8}'),
            )
            while [head for head, _ in listener._unsure.values()] != [8]:  # noqa: ASYNC110
                await anyio.sleep(0.005)
            assert listener.pushes == 0
            state.update(count=6, committing=False)  # it conflicted, say: 7 and 8 are not held
            assert await anext(heads) == 8
            assert listener.pushes == 1
    finally:
        await heads.aclose()


@pytest.mark.anyio
async def test_a_head_is_held_back_for_a_quarter_second_at_most_and_a_failing_known_wakes(
    store: PostgresStore, schema: str
) -> None:
    # An owner whose commits keep failing without reading the store is "committing" at every
    # look: another writer's head still reaches it, HOLD_AT_MOST after it came. A known() that
    # raises (the owner's bug) counts as none: the head is pushed.
    channel = f"nous_session.{schema}"

    def always_committing() -> tuple[int, int, bool]:
        return 4, 0, True

    def broken() -> tuple[int, int, bool]:
        raise RuntimeError("a bug in the owner")

    held = store.watch("held", known=always_committing)
    failing = store.watch("failing", known=broken)
    try:
        with anyio.fail_after(10):
            assert await anext(held) == -1
            assert await anext(failing) == -1
            began = anyio.current_time()
            sql(
                "SELECT pg_notify(%s, %s), pg_notify(%s, %s)",
                *(channel, '{"session": "held", "head": 5}'),
                *(channel, '{"session": "failing", "head": 7}'),
            )
            assert await anext(failing) == 7
            assert await anext(held) == 5
            assert anyio.current_time() - began >= 0.2  # held back meanwhile
    finally:
        await held.aclose()
        await failing.aclose()


@pytest.mark.anyio
async def test_a_delete_tells_the_sessions_watches_alone_to_read(
    store: PostgresStore, schema: str
) -> None:
    # A delete sends no commit's head: it notifies -1 (read whatever there is) for its session,
    # in its own transaction, whichever store object (process) makes it; a watcher then finds
    # the session deleted. Another session's delete reaches nobody watching this one.
    async with PostgresStore(URL, schema=schema) as other:
        for name in ("w", "x"):
            await store.commit(name, expected_count=0, events=(make_event(0, "user_message", {}),))
        heads = store.watch("w")
        try:
            with anyio.fail_after(10):
                assert await anext(heads) == -1  # listening
                assert await other.delete("x")
                await store.commit(
                    "w", expected_count=1, events=(make_event(1, "user_message", {}),)
                )
                assert await anext(heads) == 2  # x's delete came first, and reached nobody here
                assert await other.delete("w")
                assert await anext(heads) == -1
                assert not await store.delete("w")  # nothing to delete: nothing notified
                await store.commit(
                    "w", expected_count=0, events=(make_event(0, "user_message", {}),)
                )
                assert await anext(heads) == 1
        finally:
            await heads.aclose()


@pytest.mark.anyio
async def test_a_head_of_nothing_tells_a_watcher_that_holds_events_to_read(
    store: PostgresStore, schema: str
) -> None:
    # Head 0 (a session made again by an empty commit) while the watcher holds events: the
    # session it holds is gone, so the watcher reads (-1), whatever it holds.
    channel = f"nous_session.{schema}"
    heads = store.watch("w", known=lambda: (3, 0, False))
    try:
        with anyio.fail_after(10):
            assert await anext(heads) == -1  # listening
            sql(
                "SELECT pg_notify(%s, %s), pg_notify(%s, %s)",
                *(channel, '{"session": "w", "head": 0}'),
                *(channel, '{"session": "w", "head": 4}'),
            )
            assert [await anext(heads), await anext(heads)] == [-1, 4]
    finally:
        await heads.aclose()


def test_the_listener_waits_on_a_descriptor_numbered_past_1024(schema: str) -> None:
    # select(2) refuses descriptors from 1024 on; a busy process's LISTEN connection may get
    # one. The listener then reconnected in a loop and delivered nothing.
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1100:
        pytest.skip(f"the hard limit on open files is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1100), hard))
    filler: list[int] = []
    try:
        while not filler or filler[-1] < 1030:
            filler.append(os.open(os.devnull, os.O_RDONLY))

        async def main() -> None:
            async with PostgresStore(URL, schema=schema) as store:
                heads = store.watch("w")
                try:
                    with anyio.fail_after(10):
                        assert await anext(heads) == -1
                        listener = store._listener
                        assert listener is not None
                        sql(
                            "SELECT pg_notify(%s, %s)",
                            f"nous_session.{schema}",
                            '{"session": "w", "head": 3}',
                        )
                        assert await anext(heads) == 3
                        assert listener.connections == 1  # no reconnection meanwhile
                finally:
                    await heads.aclose()

        anyio.run(main)
    finally:
        for fd in filler:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_cli_tail_follows_a_postgres_session(schema: str) -> None:
    async def write(contents: list[str]) -> None:
        async with PostgresStore(URL, schema=schema) as store:
            async with SessionActor.open(session_id="tailed", store=store) as session:
                for content in contents:
                    await session.append("user_message", {"content": content})

    anyio.run(write, ["a"])
    url = f"{URL}?schema={schema}"
    with (
        subprocess.Popen(
            [sys.executable, "-m", "nous_session", "--store", url, "tail", "tailed", "--json"],
            stdout=subprocess.PIPE,
            text=True,
        ) as tail,
        ending(tail),
    ):
        lines = Lines(tail)
        assert '"a"' in lines.next()
        anyio.run(write, ["b"])
        assert '"b"' in lines.next()
        tail.send_signal(signal.SIGINT)
        deadline = time.monotonic() + 10
        while tail.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert tail.returncode == 130  # interrupted, as a shell reports it


@pytest.mark.anyio
async def test_many_followed_sessions_share_one_listener_and_no_default_thread(
    store: PostgresStore, schema: str
) -> None:
    # Regression: each followed session held a LISTEN connection and a thread of anyio's
    # default limiter (40 tokens) of its own. At 100 sessions the application's own
    # to_thread calls waited ~0.36 s for a thread; at 320 the server refused connections.
    count = 60  # more than the default limiter's 40 threads
    async with AsyncExitStack() as stack:
        followers = [
            await stack.enter_async_context(SessionActor.open(session_id=f"f{i}", store=store))
            for i in range(count)
        ]
        listener = store._listener
        assert listener is not None
        assert anyio.to_thread.current_default_thread_limiter().borrowed_tokens == 0
        async with (
            PostgresStore(URL, schema=schema) as other,
            SessionActor.open(session_id=f"f{count - 1}", store=other, follow=False) as writer,
            SessionActor.open(session_id="f0", store=other, follow=False) as first,
        ):
            await writer.append("user_message", {"content": "to the last"})
            await first.append("user_message", {"content": "to the first"})
        with anyio.fail_after(10):
            for follower in (followers[-1], followers[0]):
                async with follower.subscribe(0) as events:
                    async for event in events:
                        assert event.data["content"].startswith("to the")
                        break
        assert listener.connections == 1
        assert [f.log.count for f in followers[1:-1]] == [0] * (count - 2)
        thread = listener._thread
        assert thread is not None
    # Every watch has left: the thread ends (within one poll) and a new watch starts another.
    await anyio.to_thread.run_sync(thread.join, 10)
    assert not thread.is_alive()
    assert listener.watching == 0
    async with SessionActor.open(session_id="f0", store=store) as again:
        assert again.log.count == 1
        async with PostgresStore(URL, schema=schema) as other:
            async with SessionActor.open(session_id="f0", store=other, follow=False) as writer:
                await writer.append("user_message", {"content": "after"})
        with anyio.fail_after(10):
            async with again.subscribe(1) as events:
                async for event in events:
                    assert event.data["content"] == "after"
                    break
    assert listener.connections == 2
