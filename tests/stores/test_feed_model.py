"""The SQLite change feed against a model: followers see every commit, whoever makes it.

A hypothesis ``RuleBasedStateMachine`` runs three sessions in one SQLite file. Our store has
a following actor for each (the feed's solo mode while our writer is the file's only one)
and a ``store.follow`` subscriber of the first. Rules commit through our actors, through our
store directly (a head no actor of ours holds), and through other store objects (another
writer, as another process is) that open and close; checkpoint the WAL from a connection of
their own (every mode, TRUNCATE included: it rewrites the WAL-index header without a
commit); erase an event through either store (on our writer's thread outside its write
groups); and close and reopen a follower (its watch leaves and joins again; the feed's thread
ends with its last watch).

After every step each follower holds exactly what the store holds (the same events, in
order), and the subscriber has had each seq once, in order.
"""

from __future__ import annotations

import os
import sqlite3
import tempfile
from collections import Counter
from contextlib import ExitStack, aclosing
from pathlib import Path
from typing import Any, ClassVar

import anyio
import anyio.lowlevel
import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from nous_session import Event, EventType, Message, SessionActor, SessionClosedError
from nous_session.event import make_event
from nous_session.stores.sqlite import SQLiteStore
from tests.support.tallies import Tallies

PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "dev")
EXAMPLES, STEPS = {"ci": (25, 40), "quick": (5, 10)}.get(PROFILE, (10, 20))
LINE = (
    f"feed model ({PROFILE} profile): {{steps}} steps, {{foreign}} commits of other writers,"
    " {checkpoints} checkpoints, {erasures} erasures, {deletes} deletes; {left} of {runs} runs"
    " left solo mode"
)
COUNTED = ("steps", "foreign", "checkpoints", "erasures", "deletes", "left", "runs")
HANG = 10  # seconds: a follower that misses a commit fails the step, never hangs it
SESSIONS = ("a", "b", "c")


def _seen(event: Event) -> tuple[int, str, str]:
    return event.seq, str(event.type), repr(dict(event.data))


class FeedModel(RuleBasedStateMachine):
    """Three sessions, our followers, other writers, against the model (counts)."""

    loop: ClassVar[str]
    tally: ClassVar[Counter[str]]

    def __init__(self) -> None:
        super().__init__()
        self.stack = ExitStack()
        self.directory = self.stack.enter_context(tempfile.TemporaryDirectory())
        self.path = Path(self.directory) / "feed.db"
        self.portal: BlockingPortal = self.stack.enter_context(start_blocking_portal(self.loop))
        self.counts = dict.fromkeys(SESSIONS, 0)
        # Per session: the seqs erased and those of erasure events.
        self.erased: dict[str, set[int]] = {name: set() for name in SESSIONS}
        self.deleted: set[str] = set()  # sessions deleted whose followers held events
        self.followers: dict[str, SessionActor] = {}
        self.closers: dict[str, ExitStack] = {}
        self.others: list[SQLiteStore | None] = [None, None]
        self.received: list[int] = []  # the subscriber's seqs, as they came
        self.counter = iter(range(1 << 30))

    # Opening and closing

    @initialize()
    def start(self) -> None:
        self.ours = SQLiteStore(self.path)
        self.stack.callback(self._close_stores)
        for name in SESSIONS:
            self._open_follower(name)
        self.subscriber = self.portal.start_task_soon(self._subscribe)

    def _open_follower(self, name: str) -> None:
        closer = ExitStack()
        opening = SessionActor.open(session_id=name, store=self.ours)
        self.followers[name] = closer.enter_context(self.portal.wrap_async_context_manager(opening))
        self.closers[name] = closer

    def _close_stores(self) -> None:
        self.subscriber.cancel()
        for closer in self.closers.values():
            closer.close()
        for store in [*self.others, self.ours]:
            if store is not None:
                self.portal.call(store.aclose)

    async def _subscribe(self) -> None:
        from nous_session.stores import follow

        async with aclosing(follow(self.ours, SESSIONS[0])) as events:
            async for event in events:
                self.received.append(event.seq)

    def teardown(self) -> None:
        monitor = getattr(self, "ours", None) and self.ours._monitor
        if monitor is not None:
            self.tally.update(runs=1, left=not monitor._solo)
        self.stack.close()

    # Rules

    def _text(self) -> str:
        return f"m{next(self.counter)}"

    @rule(name=st.sampled_from(SESSIONS))
    def commit_through_our_actor(self, name: str) -> None:
        self.portal.call(self.followers[name].add_message, Message.user(self._text()))
        self.counts[name] += 1

    @rule(name=st.sampled_from(SESSIONS), size=st.integers(1, 3))
    def commit_through_our_store(self, name: str, size: int) -> None:
        self._commit(self.ours, name, size)

    @rule(which=st.integers(0, 1), name=st.sampled_from(SESSIONS), size=st.integers(1, 3))
    def commit_through_another_writer(self, which: int, name: str, size: int) -> None:
        store = self.others[which]
        if store is None:
            store = self.others[which] = SQLiteStore(self.path)
        self._commit(store, name, size)

    @rule(which=st.integers(0, 1), theirs=st.sampled_from(SESSIONS), ours=st.sampled_from(SESSIONS))
    def commit_elsewhere_then_here(self, which: int, theirs: str, ours: str) -> None:
        # Back to back: our writer's commit usually comes before the feed's next look at the
        # WAL-index header, so it is our writer that notices the other's (data_version).
        store = self.others[which]
        if store is None:
            store = self.others[which] = SQLiteStore(self.path)
        self._commit(store, theirs, 1)
        self._commit(self.ours, ours, 1)

    def _commit(self, store: SQLiteStore, name: str, size: int) -> None:
        self.tally.update(foreign=store is not self.ours)
        count = self.counts[name]
        events = [
            make_event(count + n, EventType.USER_MESSAGE, {"content": self._text()})
            for n in range(size)
        ]
        self.portal.call(lambda: store.commit(name, expected_count=count, events=events))
        self.counts[name] += size

    @precondition(lambda self: any(store is not None for store in self.others))
    @rule(which=st.integers(0, 1))
    def close_another_writer(self, which: int) -> None:
        store, self.others[which] = self.others[which], None
        if store is not None:
            self.portal.call(store.aclose)

    @rule(mode=st.sampled_from(["PASSIVE", "FULL", "RESTART", "TRUNCATE"]))
    def checkpoint(self, mode: str) -> None:
        self.tally.update(checkpoints=1)
        connection = sqlite3.connect(self.path, timeout=1)
        try:
            connection.execute(f"PRAGMA wal_checkpoint({mode})").fetchall()
        finally:
            connection.close()

    @rule(name=st.sampled_from(SESSIONS), ours=st.booleans(), data=st.data())
    def erase(self, name: str, ours: bool, data: st.DataObject) -> None:
        # An event not erased yet, not an erasure event: the erasure appends one.
        erasable = [seq for seq in range(self.counts[name]) if seq not in self.erased[name]]
        if not erasable:
            return
        seq = data.draw(st.sampled_from(erasable))
        store = self.ours if ours else self.others[0] or self.others[1]
        if store is None:
            store = self.others[0] = SQLiteStore(self.path)
        self.portal.call(lambda: store.erase(name, [seq], reason="model", rewrite=False))
        self.tally.update(erasures=1)
        self.erased[name].update((seq, self.counts[name]))
        self.counts[name] += 1

    @rule(
        name=st.sampled_from(SESSIONS[1:]),  # store.follow's subscriber follows the first
        ours=st.booleans(),
        remake=st.integers(0, 3),
    )
    def delete(self, name: str, ours: bool, remake: int) -> None:
        # Through our store or another writer, the session made again at once through the
        # same one (shorter, as long, or longer): its follower, which held events, must
        # close, having published none of the new session's.
        store = self.ours if ours else self.others[0] or self.others[1]
        if store is None:
            store = self.others[0] = SQLiteStore(self.path)
        self.tally.update(deletes=1)
        if not self.portal.call(store.delete, name):
            return  # never made: nothing to follow
        if self.counts[name]:
            self.deleted.add(name)
        self.counts[name] = 0
        self.erased[name].clear()
        if remake > 0:
            self._commit(store, name, remake)

    @rule(name=st.sampled_from(SESSIONS))
    def reopen_a_follower(self, name: str) -> None:
        self.closers.pop(name).close()
        self._open_follower(name)

    # Invariants

    @invariant()
    def every_follower_holds_what_the_store_holds(self) -> None:
        self.tally.update(steps=1)
        for name in sorted(self.deleted):  # each closes, with no write of its own
            actor = self.followers[name]
            held = [_seen(event) for event in actor.log.events()]
            self.portal.call(self._closes, actor)
            assert [_seen(event) for event in actor.log.events()] == held, name
            self.closers.pop(name).close()
            self._open_follower(name)
        self.deleted.clear()
        for name, actor in self.followers.items():
            self.portal.call(self._caught_up, actor, self.counts[name])
            stored = self.portal.call(self.ours.read, name)
            assert stored.count == self.counts[name]
            assert [_seen(event) for event in actor.log.events()] == [
                _seen(event) for event in stored.events
            ], name
        self.portal.call(self._received, self.counts[SESSIONS[0]])
        assert self.received == list(range(self.counts[SESSIONS[0]])), "each seq once, in order"

    async def _closes(self, actor: SessionActor) -> None:
        """Wait until ``actor`` closes, having published nothing more (its subscription from
        its count ends empty), then check it says why."""
        with anyio.fail_after(HANG):
            async with actor.subscribe(actor.log.count) as events:
                async for event in events:
                    pytest.fail(f"{actor.session_id}: published {event.seq} after its delete")
        with pytest.raises(SessionClosedError, match="was deleted"):
            await actor.add_message(Message.user("after the delete"))

    async def _caught_up(self, actor: SessionActor, count: int) -> None:
        with anyio.fail_after(HANG):
            while actor.log.count < count:  # noqa: ASYNC110
                await anyio.sleep(0.002)

    async def _received(self, count: int) -> None:
        with anyio.fail_after(HANG):
            while len(self.received) < count:  # noqa: ASYNC110
                await anyio.sleep(0.002)


@pytest.fixture(params=["asyncio", "trio"])
def loop(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_followers_see_every_commit_whoever_makes_it(loop: str, tallies: Tallies) -> None:
    tally: Counter[str] = Counter()
    machine: Any = type("FeedModel", (FeedModel,), {"loop": loop, "tally": tally})
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=EXAMPLES,
            stateful_step_count=STEPS,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
    tallies.add(LINE, **{key: tally[key] for key in COUNTED})
    assert 0 < tally["left"] < tally["runs"], "some runs left solo mode, some did not"
