"""Attacks on the registry's one-task sessions (``actor.host``): closing or cancelling the
registry while requests are queued, a commit is in flight or the actor is parked; a session
deleted by another holder while callers are queued; eviction during a compaction."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from nous_session import Message, SessionActor, SessionClosedError, StoreError
from nous_session.compaction import CompactionPolicy
from nous_session.errors import SessionDeletedError
from nous_session.registry import Sessions
from nous_session.stores.memory import MemoryStore

pytestmark = pytest.mark.anyio


class _HeldStore(MemoryStore):
    """A MemoryStore whose commits wait at a gate while ``hold`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.hold = False
        self.committing = anyio.Event()
        self.gate = anyio.Event()

    async def commit(self, session_id: str, **arguments: Any) -> str | None:
        if self.hold:
            self.committing.set()
            await self.gate.wait()
        return await super().commit(session_id, **arguments)


async def _texts(store: MemoryStore, session_id: str) -> list[str]:
    return [event.data["content"] for event in (await store.read(session_id)).events]


async def _queued(session: SessionActor, depth: int) -> None:
    """Wait until ``depth`` requests are queued (trio runs ready tasks in any order)."""
    while session.statistics().queue_depth < depth:
        await anyio.lowlevel.checkpoint()


def _call(
    session: SessionActor, text: str, outcomes: dict[str, object], sent: set[str] | None = None
) -> Any:
    """A caller appending ``text``; its outcome goes to ``outcomes``, and its text to ``sent``
    as it calls (a call queues before it first waits)."""

    async def call() -> None:
        if sent is not None:
            sent.add(text)
        try:
            await session.add_message(Message.user(text))
            outcomes[text] = "committed"
        except (SessionClosedError, StoreError) as error:
            outcomes[text] = error

    return call


@pytest.mark.parametrize("queue_size", [8, 2])
@pytest.mark.parametrize("how", ["exit", "cancel"])
async def test_closing_the_registry_while_a_commit_is_in_flight_answers_every_caller(
    how: str, queue_size: int
) -> None:
    # With a queue of 2, three callers wait for space when the registry closes.
    store = _HeldStore()
    outcomes: dict[str, object] = {}
    with anyio.fail_after(5):
        async with anyio.create_task_group() as callers:
            with anyio.CancelScope() as scope:
                async with Sessions(store, queue_size=queue_size) as sessions:
                    session = await sessions.get("a")
                    store.hold = True
                    callers.start_soon(_call(session, "first", outcomes))
                    await store.committing.wait()
                    for index in range(5):
                        callers.start_soon(_call(session, f"q{index}", outcomes))
                    await _queued(session, min(5, queue_size))
                    for _ in range(10):  # the others wait for space
                        await anyio.lowlevel.checkpoint()

                    async def release() -> None:
                        await anyio.sleep(0.05)
                        store.gate.set()

                    callers.start_soon(release)
                    if how == "cancel":
                        scope.cancel()
    assert session.closed
    assert len(outcomes) == 6
    stored = await _texts(store, "a")
    committed = [text for text, outcome in outcomes.items() if outcome == "committed"]
    assert sorted(stored) == sorted(committed)
    assert outcomes["first"] == "committed"
    if how == "exit":  # queued ones commit; those waiting for space are refused
        assert len(committed) == 1 + min(5, queue_size)
    for outcome in outcomes.values():
        assert outcome == "committed" or isinstance(outcome, SessionClosedError)


async def test_a_session_deleted_while_callers_are_queued_answers_them_all_and_reopens() -> None:
    store = _HeldStore()
    outcomes: dict[str, object] = {}
    with anyio.fail_after(5):
        async with Sessions(store, queue_size=3) as sessions:
            async with sessions.use("gone") as session:
                await session.add_message(Message.user("one"))
            async with anyio.create_task_group() as callers:
                async with sessions.use("gone") as session:
                    store.hold = True
                    callers.start_soon(_call(session, "first", outcomes))
                    await store.committing.wait()
                    assert await store.delete("gone")
                    for index in range(6):  # three queued, three waiting for space
                        callers.start_soon(_call(session, f"q{index}", outcomes))
                    await _queued(session, 3)
                    for _ in range(10):
                        await anyio.lowlevel.checkpoint()
                    store.hold = False
                    store.gate.set()
                    while "first" not in outcomes:  # the actor has heard of the deletion
                        await anyio.lowlevel.checkpoint()
                    # Entered while the old actor closes itself: a fresh one.
                    async with sessions.use("gone") as fresh:
                        assert fresh is not session
                        event = await fresh.add_message(Message.user("anew"))
                        assert event.seq == 0
            assert len(outcomes) == 7
            for text, outcome in outcomes.items():
                assert isinstance(outcome, SessionDeletedError | SessionClosedError), (
                    text,
                    outcome,
                )
            stats = sessions.statistics()
            assert stats.leased == 0
            assert stats.open == 1
        assert await _texts(store, "gone") == ["anew"]


async def test_a_use_block_entered_while_the_actor_closes_itself_gets_a_fresh_actor() -> None:
    store = _HeldStore()
    with anyio.fail_after(5):
        async with Sessions(store) as sessions:
            old = await sessions.get("gone")
            await old.add_message(Message.user("one"))
            assert await store.delete("gone")
            with pytest.raises(SessionDeletedError):
                await old.add_message(Message.user("two"))
            # closing by itself, maybe not closed yet
            async with sessions.use("gone") as fresh:
                assert fresh is not old
                assert (await fresh.add_message(Message.user("anew"))).seq == 0
            again = await sessions.get("gone")
            assert again is fresh
            assert sessions.statistics().open == 1
            assert "gone" in sessions


@pytest.mark.parametrize("how", ["exit", "cancel"])
async def test_closing_the_registry_while_actors_are_parked_or_just_woken(how: str) -> None:
    store = MemoryStore()
    outcomes: dict[str, object] = {}
    sent: set[str] = set()
    with anyio.fail_after(5):
        async with anyio.create_task_group() as callers:
            with anyio.CancelScope() as scope:
                async with Sessions(store) as sessions:
                    sessions_ = [await sessions.get(f"s{index}") for index in range(4)]
                    await anyio.lowlevel.checkpoint()
                    for index, session in enumerate(sessions_):
                        callers.start_soon(_call(session, f"m{index}", outcomes, sent))
                    # Every call queued (waking its parked actor), and at once the registry is
                    # closed or cancelled, before the actors have all run.
                    while len(sent) < 4:
                        await anyio.lowlevel.cancel_shielded_checkpoint()
                    if how == "cancel":
                        scope.cancel()
    assert len(outcomes) == 4
    for index in range(4):
        outcome = outcomes[f"m{index}"]
        stored = await _texts(store, f"s{index}")
        assert stored == ([f"m{index}"] if outcome == "committed" else []), (outcome, stored)
        if how == "exit":
            assert outcome == "committed"


async def test_evicting_an_actor_whose_compaction_is_in_flight() -> None:
    started = anyio.Event()
    release = anyio.Event()

    async def summarizer(messages: object) -> str:
        started.set()
        await release.wait()
        return "summary"

    policy = CompactionPolicy(keep_last=1, every=2, summarizer=summarizer)
    store = MemoryStore()
    with anyio.fail_after(5):
        async with Sessions(store, max_open=1, compaction=policy) as sessions:
            async with sessions.use("a") as a:
                for n in range(4):
                    await a.add_message(Message.user(f"m{n}"))
                await started.wait()
                assert a.statistics().compaction_in_flight
            b = await sessions.get("b")  # evicts a
            assert a.closed or "a" not in sessions
            release.set()
            await b.add_message(Message.user("b"))
            again = await sessions.get("a")
            assert [m.text for m in again.messages()][-1] == "m3"


async def test_a_session_this_actor_created_then_deleted_and_made_again_is_not_written() -> None:
    # The actor learns the session's identity from its creating commit (the store returns it).
    store = MemoryStore()
    async with Sessions(store) as sessions:
        async with sessions.use("gone") as session:
            await session.add_message(Message.user("old one"))  # creates the session
            assert await store.delete("gone")
            async with SessionActor.open(session_id="gone", store=store) as again:
                for n in range(3):
                    await again.add_message(Message.user(f"new {n}"))
            with pytest.raises((SessionDeletedError, SessionClosedError)):
                await session.add_message(Message.user("old two"))
    assert await _texts(store, "gone") == ["new 0", "new 1", "new 2"]
