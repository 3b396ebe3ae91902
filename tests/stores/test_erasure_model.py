"""Erasure against a model: whatever else holds the session, an erased text is gone, and
nothing acknowledged is lost.

A hypothesis ``RuleBasedStateMachine`` runs one session with three holders: ``main`` (the
actor that compacts in the background, with a summarizer that quotes everything it
summarises and waits until a rule releases it: compactions stay in flight across other
rules), ``follower`` (another store object, as another process has, following the store's
change feed: SQLite and PostgreSQL) and ``stale`` (another store object, ``follow=False``).
Rules append through any holder, erase a message (through the main actor, or through the
store, as another process would), release the summarizer, take a snapshot, fork, and have
the stale holder replace the surface with a copy of what it sees (planned on its own log,
which may predate an erasure). The model is the set of erased texts and every acknowledged
event.

After every step: no erased text is in a store row (the store's reads of the session and of
every fork; the raw bytes of the SQLite files or of the PostgreSQL tables' pages whenever every
erasure so far was proven), in the main actor's log, in the follower's once it has caught up
with the store's head, or in anything a subscriber of the main actor received after the
redaction (the ``erasure`` event naming the text's seq); every acknowledged event is still
there (a snapshot may drop one), with its own content unless it was erased.

Runs on memory, SQLite and PostgreSQL (``NOUS_SESSION_TEST_POSTGRES``), on asyncio and trio.
A line of the terminal summary says how many steps ran.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any, ClassVar

import anyio
import anyio.lowlevel
import attrs
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

from nous_session import (
    CompactionPolicy,
    ConflictError,
    Event,
    EventType,
    Message,
    SessionActor,
)
from nous_session.erasure import erased_record
from nous_session.stores import MemoryStore
from tests.support.erasure import Backend, make_backend
from tests.support.tallies import Tallies

PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "dev")
if PROFILE == "ci":
    EXAMPLES, STEPS = 30, 25
elif PROFILE == "quick":
    EXAMPLES, STEPS = 8, 12
else:
    EXAMPLES, STEPS = 15, 20
HANG = 60  # seconds: a safety net only, so that a failing run reports instead of hanging

LINE = (
    f"erasure model ({PROFILE} profile): {{steps}} steps, {{erasures}} erasures"
    " ({stale_compactions} compactions in flight refused as stale, {refused} stale writes"
    " refused), {forks} forks, {snapshots} snapshots on {combinations} store and loop"
    " combinations"
)


class SlowSummarizer:
    """Quotes every message it summarises; each call waits until :meth:`release`."""

    def __init__(self) -> None:
        self.go: anyio.Event | None = None
        self.waiting = False

    async def __call__(self, messages: Sequence[Message]) -> str:
        self.go = anyio.Event()
        self.waiting = True
        try:
            await self.go.wait()
        finally:
            self.waiting = False
        return "summary: " + " | ".join(message.text for message in messages)

    def release(self) -> None:
        if self.go is not None:
            self.go.set()


@attrs.define
class Tally:
    steps: int = 0
    erasures: int = 0
    stale_compactions: int = 0
    refused: int = 0
    forks: int = 0
    snapshots: int = 0


def _texts(events: Sequence[Event]) -> str:
    return repr([dict(event.data) for event in events])


class ErasureModel(RuleBasedStateMachine):
    """One session, three holders, against the model."""

    backend: ClassVar[Backend]
    loop: ClassVar[str]
    tally: ClassVar[Tally]

    def __init__(self) -> None:
        super().__init__()
        self.stack = ExitStack()
        self.portal: BlockingPortal = self.stack.enter_context(start_blocking_portal(self.loop))
        self.session_id = f"e-{uuid.uuid4().hex[:12]}"
        self.summarizer = SlowSummarizer()
        self.holders: dict[str, SessionActor] = {}
        self.stores: list[Any] = []
        self.acked: dict[int, Event] = {}  # seq -> the event as acknowledged
        self.erased: dict[str, int] = {}  # erased text -> its seq
        self.proven = True  # every erasure so far proven
        self.forks: list[str] = []
        self.received: list[Event] = []  # what the main actor's subscriber got
        self.counter = iter(range(1 << 30))

    # Opening and closing

    def _store(self) -> Any:
        made = self.portal.call(self._make)
        self.stores.append(made)
        return made

    async def _make(self) -> Any:
        if self.backend.kind == "memory":
            return MemoryStore()  # one per example (the backend's is one per test)
        return self.backend.make()

    def _open(self, name: str, store: Any, **options: Any) -> None:
        opening = SessionActor.open(session_id=self.session_id, store=store, **options)
        self.holders[name] = self.stack.enter_context(
            self.portal.wrap_async_context_manager(opening)
        )

    @initialize()
    def start(self) -> None:
        memory = self.backend.kind == "memory"
        main_store = self._store()
        # Another process's holders have store objects of their own (memory: one process).
        other = main_store if memory else self._store()
        policy = CompactionPolicy(keep_last=2, every=5, summarizer=self.summarizer)
        self._open("main", main_store, compaction=policy)
        self._open("stale", other, follow=False)
        if not memory:
            self._open("follower", self._store(), follow=True)
        self.stack.callback(self._close_stores)
        self.portal.start_task_soon(self._subscribe)
        for index in range(4):  # something to erase from the first step
            event = self.portal.call(
                self.holders["main"].add_message, Message.user(f"hi-{index}-{uuid.uuid4().hex[:8]}")
            )
            self.acked[event.seq] = event
        # Closing the actors first (the stack unwinds in reverse), then the stores.

    def _close_stores(self) -> None:
        for store in self.stores:
            self.portal.call(store.aclose)

    async def _subscribe(self) -> None:
        async with self.holders["main"].subscribe(0) as events:
            async for event in events:
                self.received.append(event)

    def teardown(self) -> None:
        main = self.holders.get("main")
        if main is not None:
            type(self).tally.stale_compactions += main.statistics().compactions_stale
        self.stack.close()

    # Rules

    @rule(holder=st.sampled_from(["main", "stale", "follower"]), count=st.integers(1, 3))
    def append(self, holder: str, count: int) -> None:
        actor = self.holders.get(holder) or self.holders["main"]
        for _ in range(count):
            text = f"said-{next(self.counter)}-{uuid.uuid4().hex[:8]}"
            event = self.portal.call(actor.add_message, Message.user(text))
            self.acked[event.seq] = event
        type(self).tally.steps += 1

    # What a rule draws never depends on timing (hypothesis replays a run by its draws): the
    # message to erase is picked by an index into those there are when the rule runs.
    @rule(pick=st.integers(0, 1 << 16), through_store=st.booleans())
    def erase(self, pick: int, through_store: bool) -> None:
        erasable = self._erasable()
        if not erasable:
            return
        seq = erasable[pick % len(erasable)]
        text = str(self.acked[seq].data["content"])
        if through_store:
            store = self.stores[-1]  # another holder's store object (memory: the same)
            result = self.portal.call(self._erase_in_store, store, seq)
        else:
            result = self.portal.call(self._erase_in_actor, seq)
        # A snapshot may have dropped it (a fork or a summary may still hold a copy).
        assert seq in (*result.erased, *result.already, *result.absent), result
        self.erased[text] = seq
        self.proven = self.proven and result.proven
        type(self).tally.erasures += 1
        type(self).tally.steps += 1

    async def _erase_in_store(self, store: Any, seq: int) -> Any:
        return await store.erase(self.session_id, [seq], reason="asked")

    async def _erase_in_actor(self, seq: int) -> Any:
        return await self.holders["main"].erase([seq], reason="asked")

    def _erasable(self) -> list[int]:
        return sorted(
            seq
            for seq, event in self.acked.items()
            if event.is_surface and str(event.data.get("content")) not in self.erased
        )

    @rule()
    def release(self) -> None:
        """The compaction in flight, if one waits, gets its summary (planned on what it read
        then)."""
        self.portal.call(self.summarizer.release)
        type(self).tally.steps += 1

    @rule()
    def snapshot(self) -> None:
        try:
            self.portal.call(self.holders["main"].snapshot)
        except ConflictError:  # another holder wrote: the actor caught up, a retry lands
            self.portal.call(self.holders["main"].snapshot)
        type(self).tally.snapshots += 1
        type(self).tally.steps += 1

    @precondition(lambda self: len(self.forks) < 3)
    @rule()
    def fork(self) -> None:
        """A fork of everything the store holds (it shares the history, or copies it when
        the session's own snapshot drops what it shares)."""
        name = f"{self.session_id}-f{len(self.forks)}"
        self.portal.call(self._fork, name)
        self.forks.append(name)
        type(self).tally.forks += 1
        type(self).tally.steps += 1

    async def _fork(self, name: str) -> None:
        store = self.stores[0]
        stored = await store.read(self.session_id)
        await store.fork(self.session_id, name, at=stored.count - 1)

    @rule()
    def stale_copies_what_it_sees(self) -> None:
        """The stale holder replaces its surface with a copy of what its log says (which may
        predate an erasure): refused then, or written when its log is current."""
        actor = self.holders["stale"]
        try:
            self.portal.call(self._copy, actor)
        except ConflictError:
            type(self).tally.refused += 1
        type(self).tally.steps += 1

    async def _copy(self, actor: SessionActor) -> None:
        messages = actor.messages()
        if not messages:
            return
        last = actor.log.surface()[-1].position
        copy = Message.system("copy: " + " | ".join(message.text for message in messages))
        await actor.replace(actor.log.surface()[0].position, last, [copy])

    # Invariants

    @invariant()
    def nothing_erased_remains_and_nothing_acknowledged_is_lost(self) -> None:
        stored = self.portal.call(self._read_all)
        # The holders that follow the store (on SQLite and PostgreSQL: the main actor and the
        # follower) hold no erased text once they have caught up with the store's head; one
        # that does not follow may, but cannot write it back (the store checks below).
        texts = ""
        if self.backend.kind != "memory":
            for name in ("main", "follower"):
                actor = self.holders[name]
                self.portal.call(self._caught_up, actor, stored[self.session_id].count)
                texts += _texts(actor.log.events())
        for text in self.erased:
            for name, read in stored.items():
                assert text not in _texts(read.events), (text, name)
            assert text not in texts, text
        self._check_subscriber()
        self._check_acknowledged(stored[self.session_id])
        if self.proven and self.erased and self.backend.kind != "memory":
            for text in self.erased:
                assert sum(self.backend.hits(text).values()) == 0, text

    async def _read_all(self) -> dict[str, Any]:
        store = self.stores[0]
        return {name: await store.read(name) for name in [self.session_id, *self.forks]}

    async def _caught_up(self, actor: SessionActor, count: int) -> None:
        with anyio.fail_after(HANG):
            while actor.log.count < count:
                await anyio.lowlevel.checkpoint()

    def _check_subscriber(self) -> None:
        redacted: set[int] = set()
        for event in self.received:
            if event.type is EventType.ERASURE:
                redacted.update(event.data["seqs"])  # type: ignore[arg-type]
                continue
            for text, seq in self.erased.items():
                if seq in redacted:
                    assert text not in _texts([event]), (text, event)

    def _check_acknowledged(self, stored: Any) -> None:
        held = {event.seq: event for event in stored.events}
        erased = set(self.erased.values())
        for seq, acked in self.acked.items():
            assert seq < stored.count
            found = held.get(seq)
            if found is None:
                assert seq < stored.horizon, (seq, stored.horizon)  # a snapshot dropped it
                continue
            assert found.type == acked.type
            if seq in erased:
                assert erased_record(found) is not None, found
            elif erased_record(found) is None:
                assert dict(found.data) == dict(acked.data), (found, acked)


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    yield from make_backend(request.param, tmp_path)


@pytest.mark.parametrize("loop", ["asyncio", "trio"])
def test_an_erasure_holds_for_every_holder(backend: Backend, loop: str, tallies: Tallies) -> None:
    tally = Tally()
    machine = type(
        "ErasureModel", (ErasureModel,), {"backend": backend, "loop": loop, "tally": tally}
    )
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=EXAMPLES,
            stateful_step_count=STEPS,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
    tallies.add(LINE, combinations=1, **attrs.asdict(tally))
    assert tally.erasures > 0
