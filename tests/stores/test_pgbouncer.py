"""Pooled PostgreSQL (issue 33): the store through PgBouncer in transaction pooling mode, where a
server connection is shared between transactions (no session state, no server-side prepared
statements, no LISTEN). ``.ci/pgbouncer`` starts one and sets ``NOUS_SESSION_TEST_PGBOUNCER``;
the engine's model test runs through it too (``tests/actor/test_engine_model.py``)."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Callable, Iterator

import anyio
import pytest

from nous_session import CompactionPolicy, Message, SessionActor
from nous_session.stores import Store, open_store
from nous_session.testing import StoreConformance

psycopg = pytest.importorskip("psycopg")
from nous_session.stores.postgres import PostgresStore  # noqa: E402

POSTGRES_URL = os.environ.get("NOUS_SESSION_TEST_POSTGRES")
PGBOUNCER_URL = os.environ.get("NOUS_SESSION_TEST_PGBOUNCER")
needs_pgbouncer = pytest.mark.skipif(
    not (POSTGRES_URL and PGBOUNCER_URL),
    reason="no PgBouncer: set NOUS_SESSION_TEST_PGBOUNCER=postgresql://... in front of "
    "NOUS_SESSION_TEST_POSTGRES (`. .ci/pgbouncer` after `. .ci/postgres` starts one)",
)


def pooled(schema: str) -> PostgresStore:
    return PostgresStore(
        PGBOUNCER_URL,  # type: ignore[arg-type]  # needs_pgbouncer: set
        schema=schema,
        pooled=True,
        direct_url=POSTGRES_URL,
    )


@pytest.fixture
def schema() -> Iterator[str]:
    name = f"b_{uuid.uuid4().hex[:16]}"
    yield name
    if POSTGRES_URL:
        with psycopg.connect(POSTGRES_URL, autocommit=True) as connection:
            connection.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")


@needs_pgbouncer
class TestPooledPostgresStore(StoreConformance):
    """The whole conformance suite, every commit and read through PgBouncer."""

    @pytest.fixture
    async def store(self, schema: str) -> AsyncIterator[Store]:
        store = pooled(schema)
        yield store
        await store.aclose()

    @pytest.fixture
    def reopen(self, schema: str) -> Callable[[], Store]:
        return lambda: pooled(schema)


@needs_pgbouncer
@pytest.mark.anyio
async def test_many_concurrent_sessions_with_followers_and_compaction_through_the_pooler(
    schema: str,
) -> None:
    """Forty sessions writing at once (so the pooler hands each transaction whatever server
    connection is free: a prepared statement would not be found there), two actors per session
    following each other, compaction on: everything lands once, in one order both agree on."""
    policy = CompactionPolicy(keep_last=4, every=10)
    async with pooled(schema) as one, pooled(schema) as two:
        async with anyio.create_task_group() as group:
            for index in range(40):
                group.start_soon(_two_writers, one, two, f"s{index}", policy)
        for index in range(40):
            events = await one.load(f"s{index}")
            texts = [str(e.data.get("content")) for e in events if e.type.value == "user_message"]
            assert sorted(texts) == sorted(f"{side} {turn}" for side in "ab" for turn in range(12))


async def _two_writers(one: Store, two: Store, session_id: str, policy: CompactionPolicy) -> None:
    async with (
        SessionActor.open(session_id=session_id, store=one, compaction=policy) as a,
        SessionActor.open(session_id=session_id, store=two, compaction=policy) as b,
    ):
        for turn in range(12):
            await a.add_message(Message.user(f"a {turn}"))
            await b.add_message(Message.user(f"b {turn}"))
        await a.wait_for_compaction()
        await b.wait_for_compaction()
        last = a.log.count - 1
        # b's follower sees a's last commit through LISTEN on the direct URL.
        with anyio.fail_after(10):
            async with b.subscribe(since=last) as events:
                async for event in events:
                    assert event.seq == last
                    break


def test_a_pooled_url_needs_a_direct_one() -> None:
    """A change feed through a transaction pooler would miss notifications without a word:
    pooled=True without direct_url is refused at once, naming what to give."""
    with pytest.raises(ValueError, match="direct_url="):
        PostgresStore("postgresql://app@pooler.invalid/app", pooled=True)
    with pytest.raises(ValueError, match="direct_url="):
        open_store("postgresql://app@pooler.invalid/app?pooled=true")
    store = open_store(
        "postgresql://app@pooler.invalid/app?pooled=true&schema=s"
        "&direct_url=postgresql%3A%2F%2Fapp%40db.invalid%2Fapp"
    )
    assert isinstance(store, PostgresStore)
    assert store.pooled
    assert store.schema == "s"
    assert store.url == "postgresql://app@pooler.invalid/app"
    assert store.direct_url == "postgresql://app@db.invalid/app"
    with pytest.raises(ValueError, match="pooled= in the URL"):
        open_store("postgresql://app@pooler.invalid/app?pooled=maybe")
