"""Group commit across sessions on PostgreSQL (issue 11): the commits many actors send in one
round share one transaction, and one session's failing commit fails only that session's batch.

As tests/stores/test_group_commit.py does for SQLite, through the whole stack (actors, the store's
commit, the group), with real conflicts made by a second store on the same schema and a real
unique violation made by a stray row. Skipped without a server.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Iterator
from contextlib import AsyncExitStack

import anyio
import pytest

from nous_session import ConflictError, CorruptRecordError, SessionActor
from nous_session.codec import encode
from nous_session.event import make_event
from tests.support.group_commits import append_all

psycopg = pytest.importorskip("psycopg")
from nous_session.stores.postgres import PostgresStore  # noqa: E402

URL = os.environ.get("NOUS_SESSION_TEST_POSTGRES", "")
pytestmark = [
    pytest.mark.skipif(not URL, reason="no PostgreSQL server: set NOUS_SESSION_TEST_POSTGRES"),
    pytest.mark.anyio,
]

SESSIONS = 12
ROUNDS = 4


@pytest.fixture
def schema() -> Iterator[str]:
    name = f"t_{uuid.uuid4().hex[:16]}"
    yield name
    with psycopg.connect(URL, autocommit=True) as connection:
        connection.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")


async def test_a_session_that_lost_to_another_writer_fails_only_its_own_batch(
    schema: str,
) -> None:
    """Each round another store advances one session behind its actor's back, then every actor
    commits at once: that one gets ConflictError, the rest commit in shared transactions."""
    async with (
        PostgresStore(URL, schema=schema) as store,
        PostgresStore(URL, schema=schema) as other,
        AsyncExitStack() as stack,
    ):
        sessions = [
            await stack.enter_async_context(
                SessionActor.open(session_id=f"s{i:02d}", store=store, follow=False)
            )
            for i in range(SESSIONS)
        ]
        for session in sessions:  # every session exists before the rounds
            await session.append("user_message", {"content": "hello"})
        transactions, commits = store._groups.transactions, store._groups.commits_sent
        for round_index in range(ROUNDS):
            victim = sessions[(round_index * 5) % SESSIONS]
            stored = await other.load(victim.session_id)
            sneaked = make_event(len(stored), "user_message", {"content": "from the other store"})
            await other.commit(victim.session_id, expected_count=len(stored), events=[sneaked])
            expected = {s.session_id: s.log.count for s in sessions if s is not victim}

            outcomes = await append_all(sessions, round_index)

            assert isinstance(outcomes[victim.session_id], ConflictError), outcomes
            for session_id, seq in expected.items():
                assert outcomes[session_id] == seq, (session_id, outcomes[session_id])
            assert victim.log.count == len(stored) + 1  # caught up: a retry lands
            await victim.append("user_message", {"content": f"retry {round_index}"})
        grouped = store._groups.commits_sent - commits
        assert store._groups.transactions - transactions < grouped  # rounds shared transactions
        assert grouped >= ROUNDS * (SESSIONS - 1)
        for session in sessions:  # memory equals the database, event for event, byte for byte
            stored_events = await other.load(session.session_id)
            assert [encode(e) for e in stored_events] == [encode(e) for e in session.log.events()]


async def test_a_unique_violation_fails_only_its_session_of_the_group(schema: str) -> None:
    """A stray row at one session's next seq makes its INSERT clash inside the shared
    transaction: the group is rolled back and each commit sent again alone, so only that
    session fails (told its store holds a row past its count) and every other one lands."""
    async with PostgresStore(URL, schema=schema) as store, AsyncExitStack() as stack:
        sessions = [
            await stack.enter_async_context(
                SessionActor.open(session_id=f"s{i:02d}", store=store, follow=False)
            )
            for i in range(SESSIONS)
        ]
        for session in sessions:
            await session.append("user_message", {"content": "hello"})
        victim = sessions[3]
        stray = make_event(1, "user_message", {"content": "stray"})
        with psycopg.connect(URL, autocommit=True) as connection:
            connection.execute(
                f"INSERT INTO {schema}.nous_events (session, seq, record) VALUES (%s, %s, %s)",
                (victim.session_id, 1, encode(stray)),
            )

        outcomes = await append_all(sessions, 0)

        error = outcomes[victim.session_id]
        assert isinstance(error, CorruptRecordError), outcomes
        assert "rows past its count" in str(error)
        assert all(outcomes[s.session_id] == 1 for s in sessions if s is not victim), outcomes
        counts = {info.session_id: info.count for info in await store.sessions()}
        assert counts[victim.session_id] == 1  # its advance was rolled back with the group
        assert all(counts[s.session_id] == 2 for s in sessions if s is not victim)


async def test_one_round_of_commits_is_one_transaction(schema: str) -> None:
    """Commits sent by tasks the loop runs together go out as one group, and land."""
    async with PostgresStore(URL, schema=schema) as store:
        transactions, commits = store._groups.transactions, store._groups.commits_sent

        async def commit(index: int) -> None:
            event = make_event(0, "user_message", {"content": f"first of {index}"})
            await store.commit(f"s{index:02d}", expected_count=0, events=[event])

        async with anyio.create_task_group() as task_group:
            for index in range(SESSIONS):
                task_group.start_soon(commit, index)
        assert store._groups.transactions - transactions == 1
        assert store._groups.commits_sent - commits == SESSIONS
        assert sorted((i.session_id, i.count) for i in await store.sessions()) == [
            (f"s{index:02d}", 1) for index in range(SESSIONS)
        ]


async def test_keys_and_commit_ids_of_a_shared_transaction_are_each_sessions_own(
    schema: str,
) -> None:
    """Keyed appends of many sessions at once (one statement for all of them): each session's
    key and commit id are stored under that session, so a retry through a fresh store gets the
    first answer back and appends nothing."""
    async with PostgresStore(URL, schema=schema) as store, AsyncExitStack() as stack:
        sessions = [
            await stack.enter_async_context(
                SessionActor.open(session_id=f"s{i:02d}", store=store, follow=False)
            )
            for i in range(SESSIONS)
        ]
        for session in sessions:
            await session.append("user_message", {"content": "hello"})
        transactions = store._groups.transactions
        first: dict[str, int] = {}

        async def keyed(session: SessionActor) -> None:
            event = await session.append("user_message", {"content": "once"}, key="k-1")
            first[session.session_id] = event.seq

        async with anyio.create_task_group() as task_group:
            for session in sessions:
                task_group.start_soon(keyed, session)
        assert store._groups.transactions > transactions
        assert first == {s.session_id: 1 for s in sessions}
    with psycopg.connect(URL, autocommit=True) as connection:
        keys = connection.execute(
            f"SELECT session, key, seq, n FROM {schema}.nous_keys ORDER BY session"
        ).fetchall()
        ids = connection.execute(
            f"SELECT session, count(*) FROM {schema}.nous_commits GROUP BY 1 ORDER BY 1"
        ).fetchall()
    assert keys == [(f"s{i:02d}", "k-1", 1, 1) for i in range(SESSIONS)]
    assert ids == [(f"s{i:02d}", 2) for i in range(SESSIONS)]  # "hello", then the keyed one
    async with (
        PostgresStore(URL, schema=schema) as again,
        SessionActor.open(session_id="s05", store=again, follow=False) as session,
    ):
        retried = await session.append("user_message", {"content": "once"}, key="k-1")
        assert retried.seq == 1
        assert session.log.count == 2


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_two_stores_grouping_commits_to_the_same_sessions_lose_and_duplicate_nothing(
    schema: str, backend: str
) -> None:
    """Two stores (two event loops in two threads), each with an actor on every one of the same
    sessions, all committing at once in groups that share rows, retrying their conflicts:
    every acknowledged append is stored exactly once, at the seq it was acknowledged with."""
    acked: dict[str, list[tuple[str, int]]] = {}
    grouped: dict[str, int] = {}
    failures: list[BaseException] = []

    async def writer(name: str) -> None:
        async with PostgresStore(URL, schema=schema) as store, AsyncExitStack() as stack:
            actors = [
                await stack.enter_async_context(
                    SessionActor.open(session_id=f"s{i:02d}", store=store, follow=False)
                )
                for i in range(SESSIONS)
            ]
            got: list[tuple[str, int]] = []

            async def produce(actor: SessionActor) -> None:
                done = 0
                while done < ROUNDS * 3:
                    try:
                        event = await actor.append("user_message", {"content": f"{name} {done}"})
                    except ConflictError:
                        continue  # caught up: the retry lands after the other writer's
                    got.append((actor.session_id, event.seq))
                    done += 1

            async with anyio.create_task_group() as task_group:
                for actor in actors:
                    task_group.start_soon(produce, actor)
            acked[name] = got
            grouped[name] = store._groups.transactions

    def run(name: str) -> None:
        try:
            anyio.run(writer, name, backend=backend)
        except BaseException as error:  # reported below, in the test's thread
            failures.append(error)

    threads = [threading.Thread(target=run, args=(f"w{k}",)) for k in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    every = acked["w0"] + acked["w1"]
    assert len(every) == 2 * SESSIONS * ROUNDS * 3
    assert len(set(every)) == len(every)  # no seq acknowledged twice
    assert sum(grouped.values()) > 0
    with psycopg.connect(URL, autocommit=True) as connection:
        stored = connection.execute(
            f"SELECT session, seq FROM {schema}.nous_events ORDER BY session, seq"
        ).fetchall()
    assert sorted(stored) == sorted(every)
