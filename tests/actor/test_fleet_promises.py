"""Promises that hold with more than one holder (issue 33): each test here failed before its fix.

A plain append with default options never fails because another writer was first; the owner's
cancellation tells every queued caller what became of its request; a call from another event
loop fails at once, before anything is queued; a snapshot frees the events it dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import sys
import threading
import uuid
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any, Literal

import anyio
import anyio.lowlevel
import attrs
import pytest

from nous_session import (
    CompactionPolicy,
    ConflictError,
    Message,
    SessionActor,
    SessionClosedError,
    SessionDeletedError,
    Sessions,
    Store,
    WrongEventLoopError,
    open_store,
)
from nous_session.event import Event
from nous_session.stores.base import ChangeFeedStore, supports
from nous_session.stores.memory import MemoryStore

pytestmark = pytest.mark.anyio
POSTGRES_URL = os.environ.get("NOUS_SESSION_TEST_POSTGRES")


@contextlib.asynccontextmanager
async def _two(stores: Callable[[], Store]) -> AsyncIterator[tuple[Store, Store]]:
    """Two stores of ``stores`` that reach the same sessions (two would-be processes), closed
    after the block (the memory store's one, shared, once)."""
    first, second = stores(), stores()
    try:
        yield first, second
    finally:
        await first.aclose()
        if second is not first:
            await second.aclose()


# What a write after another holder's delete raises: SessionDeletedError when it is how the
# actor hears of it, SessionClosedError (saying why) when the change feed closed it first.
_DELETED = (SessionDeletedError, SessionClosedError)


def contents(events: object) -> list[str]:
    return [event.data["content"] for event in events]  # type: ignore[attr-defined]


# A plain append never fails because another writer was first --------------------------------


@pytest.mark.parametrize("follow", [None, False])
async def test_a_second_writers_plain_append_lands(
    stores: Callable[[], Store], follow: bool | None
) -> None:
    """Two actors on one session, default options: the one whose log is behind appends all the
    same (a plain append has no precondition), after what the other stored, in one order."""
    async with _two(stores) as (first_store, second_store):
        async with (
            SessionActor.open(session_id="shared", store=first_store, follow=follow) as first,
            SessionActor.open(session_id="shared", store=second_store, follow=follow) as second,
        ):
            for turn in range(5):
                await first.add_message(Message.user(f"first {turn}"))
                await second.add_message(Message.user(f"second {turn}"))
            async with anyio.create_task_group() as group:
                for turn in range(20):
                    group.start_soon(first.add_message, Message.user(f"first burst {turn}"))
                    group.start_soon(second.add_message, Message.user(f"second burst {turn}"))
            stored = await first_store.load("shared")
    texts = contents(stored)
    assert len(texts) == len(set(texts)) == 50
    assert [event.seq for event in stored] == list(range(50))
    # Each writer's own appends stay in the order it made them.
    assert [text for text in texts if text.startswith("first ")][:5] == [
        f"first {turn}" for turn in range(5)
    ]


class _Turnstile:
    """Stands in for one store object's ``commit`` (on the instance), for the commits whose
    events ``other`` does not claim (another writer's own commits pass): the first waits until
    ``opened`` is set; ``before`` (once set) runs ahead of the next one after it."""

    def __init__(self, store: Store, other: Callable[[Sequence[Event]], bool]) -> None:
        self._commit = store.commit
        self._other = other
        self.closed = anyio.Event()  # set: holding (a commit is waiting)
        self.opened = anyio.Event()
        self.before: Callable[[], Awaitable[object]] | None = None
        store.commit = self.commit  # type: ignore[method-assign]  # a test's stand-in

    async def commit(self, session_id: str, **arguments: Any) -> str | None:
        if not self._other(arguments["events"]):
            if not self.opened.is_set():
                self.closed.set()
                await self.opened.wait()
            elif self.before is not None:
                before, self.before = self.before, None
                await before()
        return await self._commit(session_id, **arguments)


async def _queued(actor: SessionActor, depth: int) -> None:
    """Wait until ``depth`` requests wait in the actor's queue."""
    with anyio.fail_after(10):
        while actor.statistics().queue_depth < depth:
            await anyio.lowlevel.checkpoint()


def _another_writers(events: Sequence[Event]) -> bool:
    return any(event.data.get("content") == "another writer's" for event in events)


@attrs.define
class _Held:
    """Two actors on one session, each through its own store (see :func:`_holding_a_summary`)."""

    actor: SessionActor
    other: SessionActor
    other_store: Store
    turnstile: _Turnstile
    release: anyio.Event
    paid: list[int]  # the number of messages of each summary the summarizer made


@contextlib.asynccontextmanager
async def _holding_a_summary(stores: Callable[[], Store]) -> AsyncIterator[_Held]:
    """``actor`` has four messages and its compaction a summary of the first two planned, which
    the summarizer holds until ``release`` is set; ``other`` has caught up; ``actor``'s commits
    from now on go through ``turnstile``."""
    called, release = anyio.Event(), anyio.Event()
    paid: list[int] = []

    async def summarize(messages: Sequence[Message]) -> str:
        paid.append(len(messages))
        called.set()
        await release.wait()
        return f"SUMMARY of {len(messages)}"

    policy = CompactionPolicy(keep_last=2, every=3, summarizer=summarize)
    async with (
        _two(stores) as (first_store, second_store),
        SessionActor.open(
            session_id="shared", store=first_store, follow=False, compaction=policy
        ) as actor,
        SessionActor.open(session_id="shared", store=second_store, follow=False) as other,
    ):
        for turn in range(4):
            await actor.add_message(Message.user(f"turn {turn}"))
        with anyio.fail_after(10):
            await called.wait()  # planned on the 4 events
        await other.reload()
        turnstile = _Turnstile(first_store, _another_writers)
        yield _Held(actor, other, second_store, turnstile, release, paid)


async def test_a_plain_append_beside_a_conditional_one_that_lost_lands(
    stores: Callable[[], Store],
) -> None:
    """One commit holds a conditional append and, after it, a plain one (two callers of one
    actor), and loses to another writer: the conditional one fails (its precondition is
    stale); the plain one has none, and lands after what the other writer stored (both failed
    with the ConflictError: the batch went again only when every request in it could)."""
    answers: dict[str, object] = {}
    async with _two(stores) as (first_store, second_store):
        async with (
            SessionActor.open(session_id="shared", store=first_store, follow=False) as behind,
            SessionActor.open(session_id="shared", store=second_store, follow=False) as other,
        ):
            await behind.add_message(Message.user("first"))
            await other.reload()
            turnstile = _Turnstile(first_store, _another_writers)

            async def conditional() -> None:
                try:
                    await behind.append_many([Message.user("conditional")], expect_count=2)
                except ConflictError as error:
                    answers["conditional"] = error

            async def plain() -> None:
                answers["plain"] = (await behind.add_message(Message.user("plain"))).seq

            with anyio.fail_after(10):
                async with anyio.create_task_group() as group:
                    group.start_soon(behind.add_message, Message.user("held"))
                    await turnstile.closed.wait()  # the actor is busy: the next two queue
                    group.start_soon(conditional)
                    await _queued(behind, 1)
                    group.start_soon(plain)
                    await _queued(behind, 2)
                    # They commit together, and lose: another writer commits just before.
                    turnstile.before = partial(other.add_message, Message.user("another writer's"))
                    turnstile.opened.set()
            stored = await second_store.load("shared")
    assert isinstance(answers["conditional"], ConflictError)
    assert answers["plain"] == 3
    assert contents(stored) == ["first", "held", "another writer's", "plain"]


async def test_a_compaction_beside_a_conditional_append_that_lost_is_applied(
    stores: Callable[[], Store],
) -> None:
    """A compaction's result and a conditional append share a commit that loses to another
    writer: the conditional append fails, and the compaction is applied after catching up, as
    it is when it loses alone (it failed with the ConflictError, and the summary the
    summarizer was paid for was thrown away, to be paid for again)."""
    answers: dict[str, object] = {}
    async with _holding_a_summary(stores) as held:
        behind, other, turnstile = held.actor, held.other, held.turnstile

        async def conditional() -> None:
            try:
                await behind.append_many([Message.user("conditional")], expect_count=5)
            except ConflictError as error:
                answers["conditional"] = error

        with anyio.fail_after(10):
            async with anyio.create_task_group() as group:
                group.start_soon(behind.add_message, Message.user("held"))
                await turnstile.closed.wait()  # the actor is busy: the next two queue
                group.start_soon(conditional)
                await _queued(behind, 1)
                held.release.set()  # the summary comes back: the compaction is queued
                await _queued(behind, 2)
                turnstile.before = partial(other.add_message, Message.user("another writer's"))
                turnstile.opened.set()
            await behind.wait_for_compaction()
        statistics = behind.statistics()
        stored = await held.other_store.load("shared")
    assert isinstance(answers["conditional"], ConflictError)
    assert statistics.compactions_failed == 0
    assert len(held.paid) == statistics.compactions_run  # each summary paid for once
    assert "SUMMARY of 2" in contents(stored)  # the one planned on the first 4 events


async def test_a_compaction_planned_before_another_writers_edit_and_snapshot_is_stale(
    stores: Callable[[], Store],
) -> None:
    """While one holder summarises, another edits the session (a replace of the system prompt
    and the first three messages, then a replace of the message it put there) and snapshots it,
    which drops the first edit (the second hides it). The summary, planned before the edits, no
    longer applies; it was committed, and the three messages the edit took off the surface came
    back on it inside the summary (the check looked for a replace over its range among the
    events held since the plan, and the snapshot had dropped it)."""
    called, release = anyio.Event(), anyio.Event()

    async def summarize(messages: Sequence[Message]) -> str:
        called.set()
        await release.wait()
        return "SUMMARY of " + " ".join(message.text for message in messages)

    policy = CompactionPolicy(keep_last=2, every=8, summarizer=summarize)
    async with _two(stores) as (first_store, second_store):
        async with (
            SessionActor.open(
                session_id="shared", store=first_store, follow=False, compaction=policy
            ) as compacting,
            SessionActor.open(session_id="shared", store=second_store, follow=False) as editor,
        ):
            await compacting.add_message(Message.system("prompt"))
            for turn in range(1, 9):
                await compacting.add_message(Message.user(f"m{turn}"))
            with anyio.fail_after(10):
                await called.wait()  # planned: "m1" .. "m6"
            await editor.reload()
            await editor.replace(0, 3, [Message.system("prompt v2, m1 to m3 taken out")])
            await editor.replace(0, 0, [Message.system("prompt v3")])
            await editor.snapshot()
            release.set()
            with anyio.fail_after(10):
                await compacting.wait_for_compaction()
            await editor.reload()
            surface = [message.text for message in editor.messages()]
    assert not any(text.startswith("SUMMARY of m1") for text in surface), surface


async def test_an_erased_message_no_longer_counts_toward_the_token_trigger(
    stores: Callable[[], Store],
) -> None:
    """A long message is erased (through another store object, as another process would) and
    the holder reads the session again: what the surface holds now is far under the token
    trigger, so no compaction starts (the meter remembered each event's count by seq and kept
    the long message's, so the next messages started a summary nobody needed)."""
    calls = 0

    async def summarize(messages: Sequence[Message]) -> str:
        nonlocal calls
        calls += 1
        return "SUMMARY"

    # Triggers over 8000 tokens; the long message is 6250 (4 bytes a token), the rest 6000.
    policy = CompactionPolicy(keep_last=2, token_budget=10_000, summarizer=summarize)
    async with _two(stores) as (holding_store, erasing_store):
        async with SessionActor.open(
            session_id="shared", store=holding_store, compaction=policy
        ) as session:
            long = await session.add_message(Message.user("word " * 5000))
            await erasing_store.erase("shared", [long.seq], reason="request")
            await session.reload()
            for turn in range(10):
                await session.add_message(Message.user(f"{turn} " + "small " * 399))
            await session.wait_for_compaction()
            statistics = session.statistics()
    assert calls == 0
    assert statistics.compactions_run == 0


async def test_a_plain_append_beside_a_compaction_that_keeps_losing_lands(
    stores: Callable[[], Store],
) -> None:
    """A plain append shares a commit with a compaction's result on a busy session: another
    writer commits before each of the compaction's attempts, so it loses every time. The plain
    append goes on without it (through the store's rebasing commit, which never loses) and
    lands; it failed with a ConflictError once the compaction had used up its attempts."""
    async with _holding_a_summary(stores) as held:
        busy, other, turnstile = held.actor, held.other, held.turnstile

        async def busier() -> None:
            # Before every commit of the busy actor but the held one, another writer's.
            turnstile.before = busier
            await other.add_message(Message.user("another writer's"))

        with anyio.fail_after(30):
            async with anyio.create_task_group() as group:
                group.start_soon(busy.add_message, Message.user("held"))
                await turnstile.closed.wait()  # the actor is busy: the next two queue
                held.release.set()  # the summary comes back: the compaction is queued
                await _queued(busy, 1)
                group.start_soon(busy.add_message, Message.user("plain"))
                await _queued(busy, 2)
                turnstile.before = busier
                turnstile.opened.set()
            turnstile.before = None
            await busy.wait_for_compaction()
        stored = await held.other_store.load("shared")
    assert contents(stored).count("plain") == 1


# The owner's cancellation tells the truth -----------------------------------------------------


async def test_a_cancelled_owner_answers_queued_callers_truthfully(store: Store) -> None:
    """The owner's block is cancelled while a commit is in flight and more callers wait behind
    it: each caller that was told SessionClosedError has nothing stored, and each that was
    answered has its event stored (on SQLite the queued ones were refused, yet stored)."""
    for trial in range(5):
        session_id = f"owner-{trial}"
        answers = await _cancel_the_owner_mid_commit(store, session_id)
        stored = set(contents(await store.load(session_id)))
        assert len(answers) == 20
        for index, answer in answers.items():
            if answer == "committed":
                assert f"m{index}" in stored, f"trial {trial}: m{index} acknowledged, not stored"
            else:
                assert f"m{index}" not in stored, f"trial {trial}: m{index} refused, yet stored"


async def _cancel_the_owner_mid_commit(store: Store, session_id: str) -> dict[int, str]:
    """Five callers, then (their commit in flight) fifteen more, then the owner's block is
    cancelled; returns what each caller heard."""
    answers: dict[int, str] = {}
    ready = anyio.Event()
    owner_scope = anyio.CancelScope()
    holder: list[SessionActor] = []

    async def owner() -> None:
        with owner_scope:
            async with SessionActor.open(session_id=session_id, store=store) as actor:
                holder.append(actor)
                ready.set()
                await anyio.sleep_forever()

    async def caller(actor: SessionActor, index: int) -> None:
        try:
            await actor.add_message(Message.user(f"m{index}"))
        except SessionClosedError:
            answers[index] = "closed"
        else:
            answers[index] = "committed"

    async with anyio.create_task_group() as group:
        group.start_soon(owner)
        await ready.wait()
        actor = holder[0]
        for index in range(5):
            group.start_soon(caller, actor, index)
        for _ in range(3):  # the actor takes the first callers and starts their commit
            await anyio.lowlevel.checkpoint()
        for index in range(5, 20):
            group.start_soon(caller, actor, index)
        await anyio.lowlevel.checkpoint()
        owner_scope.cancel()
    return answers


# A call from another event loop ---------------------------------------------------------------


def _call_from_thread(call: Callable[[], object]) -> BaseException | object:
    """Run ``call`` in a new thread and return what it returned or raised."""
    outcome: list[BaseException | object] = []

    def run() -> None:
        try:
            outcome.append(call())
        except BaseException as error:
            outcome.append(error)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout=30)
    assert not thread.is_alive(), "the call from another event loop hung"
    return outcome[0]


@pytest.mark.parametrize("runner", ["asyncio.run", "anyio.run"])
async def test_a_call_from_another_event_loop_fails_before_anything_is_queued(
    store: Store, runner: str
) -> None:
    """``asyncio.run(chat.add_message(...))`` in a request thread on an actor the main loop
    owns: it fails at once with an error naming SessionsPortal and anyio.from_thread, and
    nothing is committed (it used to commit and then hang)."""
    async with SessionActor.open(session_id="loops", store=store) as chat:
        await chat.add_message(Message.user("from the owner"))

        async def add() -> object:
            return await chat.add_message(Message.user("from another loop"))

        def call() -> object:
            if runner == "asyncio.run":
                return asyncio.run(add())
            return anyio.run(add)

        outcome = await anyio.to_thread.run_sync(_call_from_thread, call)
        assert isinstance(outcome, WrongEventLoopError), outcome
        assert "SessionsPortal" in str(outcome)
        assert "anyio.from_thread" in str(outcome)
        await chat.add_message(Message.user("the owner again"))
        assert contents(chat.log.events()) == ["from the owner", "the owner again"]

        # The way the error names works: from a worker thread the owner's loop started,
        # anyio.from_thread carries the call to that loop, and it commits and answers.
        def through_the_owners_loop() -> object:
            return anyio.from_thread.run(chat.add_message, Message.user("via from_thread"))

        event = await anyio.to_thread.run_sync(through_the_owners_loop)
        assert event == chat.log.events()[-1]
        assert contents(chat.log.events())[-1] == "via from_thread"
    assert isinstance(outcome, RuntimeError)  # the family a caller may already catch


# A snapshot frees what it dropped ---------------------------------------------------------------


async def test_a_snapshot_frees_the_events_it_dropped(store: Store) -> None:
    """After many appends and a snapshot that keeps a few events, the dropped events are
    unreachable while the session stays open (the log loaded at open shared storage with every
    later log and was kept alive by the open call's frame)."""
    async with SessionActor.open(session_id="freed", store=store) as session:
        for index in range(400):
            await session.add_message(Message.user(f"private {index}"))
        refs = [weakref.ref(event) for event in session.log.events()]
        entries = session.log.surface()
        first, last = entries[0].position, entries[-3].position
        del entries
        await session.replace(first, last, Message.system("summary"))
        await session.snapshot()
        kept = len(session.log.events())
        gc.collect()
        alive = sum(1 for ref in refs if ref() is not None)
        assert kept == 3
        assert alive <= 2, f"{alive} of 400 dropped events still reachable"


# A session deleted under its actor -------------------------------------------------------------


@pytest.mark.parametrize("on_conflict", ["raise", "rebase"])
@pytest.mark.parametrize("follow", [None, False])
async def test_a_session_deleted_by_another_holder_closes_its_actor(
    stores: Callable[[], Store], on_conflict: Literal["raise", "rebase"], follow: bool | None
) -> None:
    """Another holder deletes the session: the actor's next append is refused with
    SessionDeletedError (not a corrupt store), stores nothing, and the actor closes; opening
    the session again starts it anew. (An actor that follows a change feed may hear of it
    before that append, and has closed already: the append says so. See
    test_deleted_under_followers.py.)"""
    async with _two(stores) as (holder, deleter):
        async with SessionActor.open(
            session_id="gone", store=holder, on_conflict=on_conflict, follow=follow
        ) as session:
            await session.add_message(Message.user("one"))
            await session.add_message(Message.user("two"))
            assert await deleter.delete("gone")
            refused: Any = SessionDeletedError if follow is False else _DELETED
            with pytest.raises(refused, match="'gone' was deleted"):
                await session.add_message(Message.user("three"))
            # Closing from then on (its loop ends once the call is answered): later calls are
            # refused, saying why.
            with pytest.raises(SessionClosedError, match="'gone' was deleted"):
                await session.add_message(Message.user("four"))
        assert await deleter.load("gone") == []
        async with SessionActor.open(session_id="gone", store=holder) as again:
            event = await again.add_message(Message.user("anew"))
        assert event.seq == 0
        assert contents(await deleter.load("gone")) == ["anew"]


@pytest.mark.parametrize("follow", [None, False])
async def test_a_session_deleted_and_made_again_is_not_taken_for_the_one_held(
    stores: Callable[[], Store], follow: bool | None
) -> None:
    """Deleted and made again, longer than the actor's log: the actor must not read the new
    session's events as the next ones of the session it holds (nothing tells them apart but
    the session's identity)."""
    async with _two(stores) as (holder, other):
        async with SessionActor.open(session_id="gone", store=other) as first:
            await first.add_message(Message.user("old one"))
        async with SessionActor.open(session_id="gone", store=holder, follow=follow) as session:
            await session.add_message(Message.user("old two"))
            await _remade_under(session, other, 3)
            assert [m.text for m in session.messages()] == ["old one", "old two"]
        assert contents(await other.load("gone")) == ["new 0", "new 1", "new 2"]


async def _remade_under(session: SessionActor, other: Store, made_again: int) -> None:
    """Delete ``session``'s session "gone" through ``other`` and make it again with
    ``made_again`` events there; then the actor's appends are refused, saying why. It hears
    of it at its next write, or before it from the change feed when it follows one (which may
    bring it the delete alone): then it has closed already."""
    assert await other.delete("gone")
    async with SessionActor.open(session_id="gone", store=other) as again:
        for n in range(made_again):
            await again.add_message(Message.user(f"new {n}"))
    with pytest.raises((SessionDeletedError, SessionClosedError), match="'gone' was deleted"):
        await session.add_message(Message.user("refused"))
    with pytest.raises(SessionClosedError, match="'gone' was deleted"):
        await session.add_message(Message.user("refused again"))


@pytest.mark.parametrize("made_again", [1, 3], ids=["as-long", "longer"])
@pytest.mark.parametrize("on_conflict", ["raise", "rebase"])
@pytest.mark.parametrize("follow", [None, False])
async def test_a_session_its_actor_created_then_deleted_and_made_again_is_not_written(
    stores: Callable[[], Store],
    made_again: int,
    on_conflict: Literal["raise", "rebase"],
    follow: bool | None,
) -> None:
    """The actor made the session (no read ever told it the session's identity: its creating
    commit did); another holder deletes it and makes it again, as long as the actor's log
    (a commit at the actor's count would fit) or longer (a rebasing commit would go after
    it): the actor's next append is refused, lands nowhere, and the actor closes."""
    async with _two(stores) as (holder, other):
        async with SessionActor.open(
            session_id="gone", store=holder, on_conflict=on_conflict, follow=follow
        ) as session:
            await session.add_message(Message.user("old one"))  # creates the session
            await _remade_under(session, other, made_again)
            assert [m.text for m in session.messages()] == ["old one"]
        assert contents(await other.load("gone")) == [f"new {n}" for n in range(made_again)]


async def test_an_empty_session_deleted_under_its_actor_is_made_again_by_it(
    stores: Callable[[], Store],
) -> None:
    """An actor that opened a session holding nothing (an empty commit made it) has seen none
    of it: when it is deleted meanwhile, the actor's first append makes it again, and its
    next ones go on in it."""
    async with _two(stores) as (holder, other):
        await other.commit("empty", expected_count=0, events=[])
        async with SessionActor.open(session_id="empty", store=holder, follow=False) as session:
            assert await other.delete("empty")
            await session.add_message(Message.user("one"))
            await session.add_message(Message.user("two"))
        assert contents(await other.load("empty")) == ["one", "two"]


class _Unchecking(MemoryStore):
    """A store that names the session's identity but takes no ``expected_uid`` (as a
    third-party store may): the actor learns only after a commit where it went."""

    checks_uid = False


@pytest.mark.parametrize("on_conflict", ["raise", "rebase"])
async def test_a_commit_a_store_put_into_a_session_made_again_tells_its_callers_where(
    on_conflict: Literal["raise", "rebase"],
) -> None:
    """With a store that cannot be told the identity, a commit may land in the session made
    again (at the actor's count, or after it when rebasing): its callers are not told their
    events were stored in their session; they hear where the events went, and the actor
    closes."""
    store = _Unchecking()
    async with SessionActor.open(
        session_id="gone", store=store, on_conflict=on_conflict
    ) as session:
        await session.add_message(Message.user("old one"))
        assert await store.delete("gone")
        made_again = 1 if on_conflict == "raise" else 3
        async with SessionActor.open(session_id="gone", store=store) as again:
            for n in range(made_again):
                await again.add_message(Message.user(f"new {n}"))
        with pytest.raises(SessionDeletedError, match="made again") as caught:
            await session.add_message(Message.user("old two"))
        assert f"at seqs {made_again}:" in str(caught.value)
        with pytest.raises(SessionClosedError, match="'gone' was deleted"):
            await session.add_message(Message.user("old three"))
        assert [m.text for m in session.messages()] == ["old one"]
    assert contents(await store.load("gone")) == [
        *(f"new {n}" for n in range(made_again)),
        "old two",
    ]


async def test_a_follower_of_a_session_deleted_and_made_again_ends_its_streams(
    tmp_path: Path,
) -> None:
    """A follower that only reads (no write to hear it at): the change feed brings the new
    session's head, and the actor closes instead of streaming another session's events."""
    url = f"sqlite:///{tmp_path / 'remade.sqlite3'}"
    async with SessionActor.open(session_id="gone", store=url) as first:
        await first.add_message(Message.user("old"))
    async with (
        SessionActor.open(session_id="gone", store=url, follow=True) as follower,
        follower.subscribe(since=1) as events,
        open_store(url) as other,
    ):
        assert await other.delete("gone")
        async with SessionActor.open(session_id="gone", store=other) as again:
            for n in range(3):
                await again.add_message(Message.user(f"new {n}"))
        with anyio.fail_after(10):
            async for event in events:
                pytest.fail(f"streamed another session's event {event.seq}")
        assert follower.closed
        with pytest.raises(SessionClosedError, match="'gone' was deleted"):
            await follower.add_message(Message.user("old two"))


async def test_a_registry_opens_a_new_actor_after_its_session_was_deleted(
    stores: Callable[[], Store],
) -> None:
    async with _two(stores) as (holder, deleter):
        async with Sessions(holder) as sessions:
            async with sessions.use("gone") as session:
                await session.add_message(Message.user("one"))
            assert await deleter.delete("gone")
            if supports(holder, ChangeFeedStore):
                # It follows: the change feed brings the delete, and the actor closes.
                async with session.subscribe(session.log.count) as events:
                    with anyio.fail_after(10):
                        async for event in events:
                            pytest.fail(f"streamed {event.seq} after the delete")
            else:  # it hears of it at its next write, which stores nothing
                async with sessions.use("gone") as same:
                    assert same is session
                    with pytest.raises(SessionDeletedError):
                        await same.add_message(Message.user("two"))
            async with sessions.use("gone") as session:
                event = await session.add_message(Message.user("anew"))
            assert event.seq == 0
        assert contents(await deleter.load("gone")) == ["anew"]


async def test_a_session_deleted_by_another_process_closes_its_actor(tmp_path: Path) -> None:
    """The same with the delete made by another process (the CLI), on SQLite and, when it is
    set up, PostgreSQL."""
    urls = [f"sqlite:///{tmp_path / 'deleted.sqlite3'}"]
    if POSTGRES_URL:
        urls.append(POSTGRES_URL)
    for url in urls:
        session_id = f"gone-{uuid.uuid4().hex[:8]}"
        async with SessionActor.open(session_id=session_id, store=url) as session:
            await session.add_message(Message.user("one"))
            command = ["--store", url, "delete", "--yes", session_id]
            deleted = await anyio.run_process([sys.executable, "-m", "nous_session", *command])
            assert deleted.returncode == 0
            with pytest.raises(_DELETED, match="was deleted"):  # or the feed closed it first
                await session.add_message(Message.user("two"))
            with pytest.raises(SessionClosedError, match="was deleted"):
                await session.add_message(Message.user("three"))
        async with SessionActor.open(session_id=session_id, store=url) as again:
            assert (await again.add_message(Message.user("anew"))).seq == 0
            assert again.log.count == 1
        async with open_store(url) as store:
            assert await store.delete(session_id)
