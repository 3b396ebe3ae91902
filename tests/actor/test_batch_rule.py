"""The batch rule: a batch commits exactly as if its requests had run one after another.

Each test puts its requests into one batch for certain: a first append holds the actor in a
gated commit while the requests are queued one by one (in a known order), then the gate
opens and the actor takes them all at once. Every store, both event loops.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from nous_session import Message, SessionActor, Store
from nous_session.log import Log
from nous_session.stores import MemoryStore
from nous_session.stores.sqlite import SQLiteStore

pytestmark = pytest.mark.anyio

POSTGRES_URL = os.environ.get("NOUS_SESSION_TEST_POSTGRES")


def _gated(cls: type[Any]) -> type[Any]:
    """A subclass of a store class whose commits wait while ``gate`` is set to an Event."""

    async def commit(self: Any, *args: Any, **kwargs: Any) -> Any:
        gate = self.gate
        if gate is not None:
            self.entered.set()
            await gate.wait()
        return await cls.commit(self, *args, **kwargs)

    return type(f"Gated{cls.__name__}", (cls,), {"commit": commit, "gate": None})


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], Store]]:
    if request.param == "memory":
        shared = _gated(MemoryStore)()
        yield lambda: shared
    elif request.param == "sqlite":
        gated_sqlite = _gated(SQLiteStore)
        yield lambda: gated_sqlite(tmp_path / "batch.sqlite3")
    else:
        if not POSTGRES_URL:
            pytest.skip("no PostgreSQL server: set NOUS_SESSION_TEST_POSTGRES")
        psycopg = pytest.importorskip("psycopg")
        from nous_session.stores.postgres import PostgresStore

        schema = f"b_{uuid.uuid4().hex[:12]}"
        gated_postgres = _gated(PostgresStore)
        yield lambda: gated_postgres(POSTGRES_URL, schema=schema)
        with psycopg.connect(POSTGRES_URL, autocommit=True) as connection:
            connection.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


@pytest.fixture
async def store(make_store: Callable[[], Store]) -> AsyncIterator[Store]:
    store = make_store()
    yield store
    await store.aclose()


async def _one_batch(
    session: SessionActor, store: Any, *calls: Callable[[], Awaitable[Any]]
) -> list[Any]:
    """Run ``calls`` so that the actor takes them as one batch, in this order; each result
    (or the exception it raised) in order."""
    results: list[Any] = [None] * len(calls)

    async def run(index: int, call: Callable[[], Awaitable[Any]]) -> None:
        try:
            results[index] = await call()
        except Exception as error:
            results[index] = error

    store.gate, store.entered = anyio.Event(), anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(session.add_message, Message.user("holds the actor in its commit"))
        await store.entered.wait()
        gate, store.gate = store.gate, None  # only the first commit waits
        for index, call in enumerate(calls):
            tg.start_soon(run, index, call)
            await anyio.wait_all_tasks_blocked()  # queued before the next one starts
        assert session.statistics().queue_depth == len(calls)
        gate.set()
    return results


async def _three(session: SessionActor) -> None:
    for text in ("first", "second", "third"):
        await session.add_message(Message.user(text))


async def _reopens_as(store: Store, log: Log) -> None:
    """The stored row opens to ``log`` and takes another write."""
    async with SessionActor.open(session_id="s", store=store) as again:
        assert (again.log.count, again.log.horizon) == (log.count, log.horizon)
        assert [e.seq for e in again.log.events()] == [e.seq for e in log.events()]
        assert again.messages() == log.derive_messages()
        event = await again.add_message(Message.user("still writable"))
        assert event.seq == log.count


async def test_a_rewind_and_a_snapshot_in_one_batch_commit_as_one_after_the_other(
    store: Store,
) -> None:
    async with SessionActor.open(session_id="s", store=store, follow=False) as session:
        await _three(session)
        rewound, snapped = await _one_batch(
            session, store, lambda: session.rewind(0), session.snapshot
        )
        assert rewound.seq == 4  # after the three and the batch's first append
        assert isinstance(snapped, Log)
        assert (snapped.count, snapped.horizon) == (5, 5)
        assert [m.text for m in session.messages()] == ["first"]
        assert session.log.count == 5
        after = await session.add_message(Message.user("next"))
        assert after.seq == 5
        final = session.log
    await _reopens_as(store, final)


async def test_a_remove_and_a_snapshot_in_one_batch_commit_as_one_after_the_other(
    store: Store,
) -> None:
    async with SessionActor.open(session_id="s", store=store, follow=False) as session:
        await _three(session)
        removed, snapped = await _one_batch(
            session, store, lambda: session.remove(1, 2), session.snapshot
        )
        assert removed.seq == 4
        assert (snapped.count, snapped.horizon) == (5, 5)
        assert [m.text for m in session.messages()] == ["first", "holds the actor in its commit"]
        final = session.log
    await _reopens_as(store, final)


async def test_a_keyed_append_its_remove_and_a_snapshot_in_one_batch_keep_the_key(
    store: Store,
) -> None:
    async with SessionActor.open(session_id="s", store=store, follow=False) as session:
        await _three(session)
        appended, removed, snapped = await _one_batch(
            session,
            store,
            lambda: session.append("user_message", {"content": "keyed"}, key="K"),
            lambda: session.remove(4, 4),
            session.snapshot,
        )
        assert appended.seq == 4
        assert removed.seq == 5
        assert (snapped.count, snapped.horizon) == (6, 6)
        assert "keyed" not in [m.text for m in session.messages()]
        # The key still answers with the first event (kept aside by the snapshot).
        again = await session.append("user_message", {"content": "keyed"}, key="K")
        assert again == appended
        final = session.log
    await _reopens_as(store, final)
    async with SessionActor.open(session_id="s", store=store, follow=False) as reopened:
        retried = await reopened.append("user_message", {"content": "keyed"}, key="K")
        assert retried.seq == appended.seq


async def test_appends_around_a_snapshot_in_one_batch_are_all_stored(store: Store) -> None:
    async with SessionActor.open(session_id="s", store=store, follow=False) as session:
        await _three(session)
        results = await _one_batch(
            session,
            store,
            lambda: session.add_message(Message.user("before")),
            lambda: session.rewind(0),
            session.snapshot,
            lambda: session.add_message(Message.user("after")),
        )
        before, rewound, snapped, after = results
        assert (before.seq, rewound.seq, after.seq) == (4, 5, 6)
        assert (snapped.count, snapped.horizon) == (6, 6)
        assert [m.text for m in session.messages()] == ["first", "after"]
        final = session.log
    await _reopens_as(store, final)


async def test_a_failed_condition_in_a_batch_leaves_the_rest_as_if_it_never_came(
    store: Store,
) -> None:
    async with SessionActor.open(session_id="s", store=store, follow=False) as session:
        await _three(session)
        stale, removed, snapped = await _one_batch(
            session,
            store,
            lambda: session.remove(0, 0, expect=[2]),  # position 0 holds seq 0: refused
            lambda: session.remove(0, 0, expect=[0]),
            session.snapshot,
        )
        assert type(stale).__name__ == "ConflictError"
        assert removed.seq == 4
        assert (snapped.count, snapped.horizon) == (5, 5)
        final = session.log
    await _reopens_as(store, final)
