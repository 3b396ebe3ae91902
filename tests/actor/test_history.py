"""History as a feature, through the actor, on every store: remove, replace with several
messages, conditional writes (with a second writer), rewind, uncompact, fork, open-turn
recovery, custom events, idempotency keys and the horizon."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from nous_session import (
    ConflictError,
    InvalidEventError,
    Log,
    Message,
    SessionActor,
    Store,
    ToolCall,
)
from nous_session.codec import from_json, to_json
from nous_session.stores import MemoryStore
from nous_session.stores.sqlite import SQLiteStore

pytestmark = pytest.mark.anyio

T0 = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)
POSTGRES_URL = os.environ.get("NOUS_SESSION_TEST_POSTGRES")


def at(seconds: int) -> datetime:
    return T0 + timedelta(seconds=seconds)


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], Store]]:
    """Make store objects over one place: each call is another process's view of it (the
    memory store is one object, shared)."""
    if request.param == "memory":
        shared = MemoryStore()
        yield lambda: shared
    elif request.param == "sqlite":
        path = tmp_path / "history.sqlite3"
        yield lambda: SQLiteStore(path)
    else:
        if not POSTGRES_URL:
            pytest.skip("no PostgreSQL server: set NOUS_SESSION_TEST_POSTGRES")
        psycopg = pytest.importorskip("psycopg")
        from nous_session.stores.postgres import PostgresStore

        schema = f"h_{uuid.uuid4().hex[:12]}"
        yield lambda: PostgresStore(POSTGRES_URL, schema=schema)
        with psycopg.connect(POSTGRES_URL, autocommit=True) as connection:
            connection.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


@pytest.fixture
async def store(stores: Callable[[], Store]) -> AsyncIterator[Store]:
    store = stores()
    yield store
    await store.aclose()


def texts(session: SessionActor | Log) -> list[str]:
    log = session.log if isinstance(session, SessionActor) else session
    return [m.text for m in log.derive_messages()]


async def filled(store: Store, n: int, session_id: str = "s") -> None:
    async with SessionActor.open(session_id=session_id, store=store) as session:
        for index in range(n):
            await session.add_message(Message.user(f"m{index}", created_at=at(index)))


async def reopened(store: Store, session_id: str = "s") -> Log:
    async with SessionActor.open(session_id=session_id, store=store) as session:
        return session.log


async def test_remove_takes_a_range_off_the_surface_and_keeps_it_in_the_log(store: Store) -> None:
    await filled(store, 5)
    async with SessionActor.open(session_id="s", store=store) as session:
        event = await session.remove(1, 2)
        assert str(event.type) == "remove"
        assert texts(session) == ["m0", "m3", "m4"]
        assert len(session.log.events()) == 6
    log = await reopened(store)
    assert texts(log) == ["m0", "m3", "m4"]
    assert [m.text for m in log.upto(4).derive_messages()] == ["m0", "m1", "m2", "m3", "m4"]


async def test_replace_with_several_messages_is_one_event(store: Store) -> None:
    await filled(store, 4)
    async with SessionActor.open(session_id="s", store=store) as session:
        summary = Message.system("[summary of m0, m1]", created_at=at(100))
        kept = Message.user("m1, edited", created_at=at(101))
        event = await session.replace(0, 1, [summary, kept])
        assert texts(session) == ["[summary of m0, m1]", "m1, edited", "m2", "m3"]
        assert [m.created_at for m in session.messages()[:2]] == [at(100), at(101)]
        assert [e.seq for e in session.log.surface()[:2]] == [event.seq, event.seq]
        empty = await session.replace(2, 2, [])
        assert texts(session) == ["[summary of m0, m1]", "m1, edited", "m3"]
        assert str(empty.type) == "replace"
    log = await reopened(store)
    assert texts(log) == ["[summary of m0, m1]", "m1, edited", "m3"]
    assert list(log.derive_messages())[1] == kept


async def test_a_conditional_remove_applies_only_while_the_range_is_as_expected(
    store: Store,
) -> None:
    await filled(store, 3)
    async with SessionActor.open(session_id="s", store=store) as session:
        last = session.log.surface()[-1]
        with pytest.raises(ConflictError, match="expected"):
            await session.remove(last.position, last.position, expect=[last.seq + 7])
        with pytest.raises(ConflictError):
            await session.remove(0, 2, expect=2)
        assert texts(session) == ["m0", "m1", "m2"]
        await session.remove(last.position, last.position, expect=[last.seq])
        await session.replace(0, 1, Message.system("s"), expect=2)
        assert texts(session) == ["s"]
        with pytest.raises(InvalidEventError, match="expect"):
            await session.remove(0, 0, expect="one")  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", ["raise", "rebase"])
async def test_two_writers_popping_the_same_item_only_one_succeeds(
    stores: Callable[[], Store], mode: str
) -> None:
    first_store, second_store = stores(), stores()
    try:
        await filled(first_store, 3)
        async with (
            SessionActor.open(
                session_id="s", store=first_store, on_conflict=mode, follow=False
            ) as first,
            SessionActor.open(
                session_id="s", store=second_store, on_conflict=mode, follow=False
            ) as second,
        ):
            # Both saw the same last item; each pops it "if it is still that one".
            seen = second.log.surface()[-1]
            await first.remove(seen.position, seen.position, expect=[seen.seq])
            with pytest.raises(ConflictError):
                await second.remove(seen.position, seen.position, expect=[seen.seq])
            await second.reload()
            assert texts(second) == texts(first) == ["m0", "m1"]
    finally:
        await first_store.aclose()
        if second_store is not first_store:
            await second_store.aclose()


async def test_rewind_then_continue_and_rewind_back(store: Store) -> None:
    await filled(store, 4)
    async with SessionActor.open(session_id="s", store=store) as session:
        rewound = await session.rewind(1)
        assert texts(session) == ["m0", "m1"]
        await session.add_message(Message.user("a new branch"))
        assert texts(session) == ["m0", "m1", "a new branch"]
        await session.rewind(rewound.seq - 1)  # the surface as it was before the rewind
        assert texts(session) == ["m0", "m1", "m2", "m3"]
        await session.rewind(-1)
        assert texts(session) == []
        with pytest.raises(InvalidEventError, match="rewind"):
            await session.rewind(session.log.count)
        expected = session.log
    log = await reopened(store)
    assert list(log.events()) == list(expected.events())
    assert texts(log) == []


async def test_uncompact_shows_a_summarised_range_again(store: Store) -> None:
    await filled(store, 4)
    async with SessionActor.open(session_id="s", store=store) as session:
        summary = await session.replace(0, 2, Message.system("summary"))
        assert texts(session) == ["summary", "m3"]
        with pytest.raises(InvalidEventError, match="not a replace"):
            await session.uncompact(3)
        await session.uncompact(summary.seq)
        assert texts(session) == ["m0", "m1", "m2", "m3"]
        with pytest.raises(InvalidEventError, match="not on the surface"):
            await session.uncompact(summary.seq)
    assert texts(await reopened(store)) == ["m0", "m1", "m2", "m3"]


async def test_a_snapshot_moves_the_horizon_and_history_before_it_is_refused(
    store: Store,
) -> None:
    await filled(store, 4)
    async with SessionActor.open(session_id="s", store=store) as session:
        summary = await session.replace(0, 2, Message.system("summary"))
        await session.snapshot()
        assert session.log.horizon == summary.seq + 1
        with pytest.raises(InvalidEventError, match="horizon"):
            await session.rewind(1)
        with pytest.raises(InvalidEventError, match="horizon"):
            await session.uncompact(summary.seq)
        await session.rewind(summary.seq)  # the edge of what is kept is fine
    log = await reopened(store)
    assert log.horizon == summary.seq + 1
    assert texts(log) == ["summary", "m3"]


async def test_fork_makes_an_independent_session_with_the_history_so_far(store: Store) -> None:
    await filled(store, 5)
    async with SessionActor.open(session_id="s", store=store) as session:
        await session.fork("child", at=2)
        await session.fork("now")  # everything so far
        with pytest.raises(ValueError, match="exists"):
            await session.fork("child", at=1)
        async with SessionActor.open(session_id="child", store=session.store) as child:
            assert texts(child) == ["m0", "m1", "m2"]
            await child.add_message(Message.user("child's own"))
        await session.add_message(Message.user("parent's own"))
        # A snapshot of the parent must not break its children.
        await session.replace(0, 3, Message.system("summary"))
        await session.snapshot()
    child_log = await reopened(store, "child")
    assert texts(child_log) == ["m0", "m1", "m2", "child's own"]
    assert texts(await reopened(store, "now")) == ["m0", "m1", "m2", "m3", "m4"]
    infos = {info.session_id: info for info in await store.sessions()}
    assert (infos["child"].parent, infos["child"].fork_point) == ("s", 2)
    async with SessionActor.open(session_id="child", store=store) as child:
        await child.fork("grandchild", at=3)
    assert texts(await reopened(store, "grandchild")) == ["m0", "m1", "m2", "child's own"]


async def test_recover_open_turn_closes_every_call_left_without_a_result(store: Store) -> None:
    async with SessionActor.open(session_id="s", store=store) as session:
        await session.add_message(Message.user("weather in Paris and Rome?"))
        calls = [ToolCall("c1", "weather", {"city": "Paris"}), ToolCall("c2", "weather", {})]
        await session.add_message(Message.assistant(tool_calls=calls))
        await session.add_message(Message.tool("c1", "18C", name="weather"))
    async with SessionActor.open(session_id="s", store=store, recover=True) as session:
        messages = list(session.messages())
        assert [(m.role.value, m.tool_call_id) for m in messages] == [
            ("user", None),
            ("assistant", None),
            ("tool", "c1"),
            ("tool", "c2"),
        ]
        assert "interrupted" in messages[-1].text
        assert await session.recover_open_turn() == ()  # nothing is open any more


async def test_recovery_puts_results_right_after_a_call_that_something_followed(
    store: Store,
) -> None:
    async with SessionActor.open(session_id="s", store=store) as session:
        await session.add_message(Message.assistant(tool_calls=[ToolCall("c1", "search", {})]))
        await session.add_message(Message.user("hello? (the call never finished)"))
        added = await session.recover_open_turn()
        assert len(added) == 1
        assert [(m.role.value, m.tool_call_id) for m in session.messages()] == [
            ("assistant", None),
            ("tool", "c1"),
            ("user", None),
        ]


async def test_custom_events_are_stored_streamed_exported_and_kept_off_the_surface(
    store: Store,
) -> None:
    async with SessionActor.open(session_id="s", store=store) as session:
        await session.add_message(Message.user("hi"))
        mark = await session.append("x.myapp.checkpoint", {"step": 3, "state": {"a": [1, 2]}})
        assert mark.type == "x.myapp.checkpoint"
        with pytest.raises(InvalidEventError, match="custom type is namespaced"):
            await session.append("checkpoint", {})
        with pytest.raises(InvalidEventError, match="surface_op"):
            await session.append("x.myapp.bad", {"surface_op": ["replace", 0, 0]})
        await session.replace(0, 0, Message.system("summary"))
        await session.snapshot()
        assert texts(session) == ["summary"]
        async with session.subscribe(0) as events:
            seen = []
            async for event in events:
                seen.append(event)
                if event.seq == session.log.count - 1:
                    break
    assert mark in seen
    log = await reopened(store)
    assert mark in log.events()  # the snapshot kept it
    assert from_json(to_json(mark)) == mark


async def test_an_idempotency_key_makes_a_retry_return_the_first_call(
    stores: Callable[[], Store],
) -> None:
    store, restarted = stores(), stores()  # a restart: another store object on the same data
    try:
        async with SessionActor.open(session_id="s", store=store) as session:
            first = await session.add_message(Message.user("once"), key="k-1")
            again = await session.add_message(Message.user("once"), key="k-1")
            assert again == first
            many = await session.append_many(
                [("user_message", {"content": "a"}), ("x.app.mark", {})], key="k-2"
            )
            assert await session.append_many([("user_message", {"content": "a"})], key="k-2") == (
                many
            )
            with pytest.raises(InvalidEventError, match="key"):
                await session.append("user_message", {"content": "x"}, key="")
            # Shadowed and dropped by a snapshot: the retry still gets the first events.
            await session.replace(0, many[0].seq, Message.system("summary"))
            await session.snapshot()
            assert first not in session.log.events()
            assert await session.add_message(Message.user("once"), key="k-1") == first
            count = session.log.count
        async with SessionActor.open(session_id="s", store=restarted) as session:
            assert await session.add_message(Message.user("once"), key="k-1") == first
            assert await session.append("user_message", {"content": "a"}, key="k-2") == many[0]
            assert session.log.count == count
            await session.add_message(Message.user("new"), key="k-3")
            assert session.log.count == count + 1
    finally:
        await store.aclose()
        await restarted.aclose()


async def test_a_key_another_writer_committed_is_not_appended_twice(
    stores: Callable[[], Store],
) -> None:
    first_store, second_store = stores(), stores()
    try:
        async with (
            SessionActor.open(session_id="s", store=first_store, follow=False) as first,
            SessionActor.open(
                session_id="s", store=second_store, follow=False, on_conflict="rebase"
            ) as second,
        ):
            event = await first.add_message(Message.user("from the first"), key="shared")
            retried = await second.add_message(Message.user("from the first"), key="shared")
            assert retried == event
            assert [e.data.get("content") for e in await first_store.load("s")] == [
                "from the first"
            ]
    finally:
        await first_store.aclose()
        if second_store is not first_store:
            await second_store.aclose()


async def test_a_reader_reloads_after_another_writers_snapshot(
    stores: Callable[[], Store],
) -> None:
    """Issue 9 item 9: Q replaces 10..20 (R1), then 5..12 (R2, shadowing R1), then snapshots,
    dropping R1; P must not show 13..20 again."""
    writer_store, reader_store = stores(), stores()
    try:
        await filled(writer_store, 25)
        async with (
            SessionActor.open(session_id="s", store=writer_store, follow=False) as writer,
            SessionActor.open(session_id="s", store=reader_store, follow=False) as reader,
        ):
            await writer.replace(10, 20, Message.system("R1"))
            await reader.reload()
            await writer.replace(5, 12, Message.system("R2"))
            await writer.snapshot()
            await reader.reload()
            fresh = await reopened(stores() if stores() is writer_store else writer_store)
            assert texts(reader) == texts(writer) == texts(fresh)
            assert texts(reader) == [
                *(f"m{i}" for i in range(5)),
                "R2",
                *(f"m{i}" for i in range(21, 25)),
            ]
            # And the reader's next write lands on the caught-up log.
            await reader.add_message(Message.user("after"))
            assert texts(await reopened(writer_store))[-1] == "after"
    finally:
        await writer_store.aclose()
        if reader_store is not writer_store:
            await reader_store.aclose()


class _CopyingStore(MemoryStore):
    """A store with the whole Store contract but no native fork: forks are copies."""

    fork = None  # type: ignore[assignment]


async def test_a_copied_fork_of_a_snapshotted_session_opens_as_its_parent() -> None:
    store = _CopyingStore()
    async with SessionActor.open(session_id="parent", store=store) as parent:
        for text in ("a", "b", "c"):
            await parent.add_message(Message.user(text))
        await parent.remove(1, 1)
        await parent.snapshot()
        await parent.add_message(Message.user("d"))
        await parent.fork("child")
        expected = parent.log
    async with SessionActor.open(session_id="child", store=store) as child:
        assert (child.log.count, child.log.horizon) == (expected.count, expected.horizon)
        assert child.messages() == expected.derive_messages()
