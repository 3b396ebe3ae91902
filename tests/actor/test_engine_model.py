"""The batch engine against a sequential model (issue 18, item 3): a batch is as if one by one.

A hypothesis ``RuleBasedStateMachine`` fires random mixes of every request kind at a
SessionActor so that they form one batch: appends with and without idempotency keys,
``append_many`` with ``expect_count``, ``add_message``, replaces and removes (with and without
``expect=``), rewinds, uncompacts, snapshots, ``recover_open_turn``, compaction results,
reloads, and forks beside them; some callers are cancelled once their request is queued. A
plain model (a :class:`Log` value and a dict of keys) applies the same requests one at a time
in arrival order. After every step: each caller's answer is the model's, the actor's log is
the model's (events compared without their times: a call without a time is timed "now"), a
fresh fold of what the store holds is exactly the actor's log and surface, the keys the store
holds are the model's, and (a rule of its own) the session reopens to the same log.

How a batch is made, the same way on asyncio and trio: the store's commits wait at a gate.
The rule closes the gate and fires a "blocker" append, which the actor takes alone and carries
into the gated commit; then it starts the requests one by one, each once the one before is in
the queue (so arrival order is start order); then it opens the gate, and the actor takes
every queued request as one batch. A reload ends every batch, as a fence (see ``batch``).

Runs on memory, SQLite and PostgreSQL (``NOUS_SESSION_TEST_POSTGRES``), on asyncio and trio.
``HYPOTHESIS_PROFILE=ci`` runs thousands of steps over the six combinations; a line of the
terminal summary says how many (``StepSummary``).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from datetime import UTC, datetime, timedelta
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
    ConflictError,
    Event,
    EventType,
    InvalidEventError,
    Log,
    Message,
    NousSessionError,
    SessionActor,
    ToolCall,
)
from nous_session._compaction_runner import Compaction
from nous_session._logging import get_logger
from nous_session._requests import INTERRUPTED, Recover
from nous_session.compaction import COMPACTION, Replacement
from nous_session.event import message_event, replace_data
from nous_session.ops import Remove, Rewind, Uncompact
from nous_session.stores.memory import MemoryStore
from nous_session.stores.sqlite import SQLiteStore
from tests.support.tallies import Tallies

POSTGRES_URL = os.environ.get("NOUS_SESSION_TEST_POSTGRES")
# PgBouncer in transaction pooling mode in front of the same server (.ci/pgbouncer).
PGBOUNCER_URL = os.environ.get("NOUS_SESSION_TEST_PGBOUNCER")
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "dev")

# dev: a quick loop (about 200 steps a combination); ci: about 900 a combination, 5,500 in all;
# quick (CI's other Pythons): about 60.
if PROFILE == "ci":
    EXAMPLES, STEPS = 40, 25
elif PROFILE == "quick":
    EXAMPLES, STEPS = 10, 8
else:
    EXAMPLES, STEPS = 25, 10

T0 = datetime(2024, 6, 1, 8, 30, tzinfo=UTC)
KEYS = ("k0", "k1", "k2", "k3")  # few, so that keys repeat: in one batch and across batches
HANG = 60  # seconds: a safety net only, so that a failing run reports instead of hanging


# The gate ---------------------------------------------------------------------------------


def gated(base: type) -> type:
    """A subclass of the store class ``base`` whose commits wait while ``gate`` is set.

    A subclass, not a wrapper: the actor finds a store's capabilities on its class.
    """

    async def wait(store: Any) -> None:
        gate = store.gate
        if gate is not None:
            store.waiting += 1
            try:
                await gate.wait()
            finally:
                store.waiting -= 1

    async def commit(self: Any, session_id: str, **arguments: Any) -> Any:
        await wait(self)
        return await base.commit(self, session_id, **arguments)

    async def commit_rebased(self: Any, session_id: str, **arguments: Any) -> Any:
        await wait(self)
        return await base.commit_rebased(self, session_id, **arguments)

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        base.__init__(self, *args, **kwargs)
        self.gate = None
        self.waiting = 0

    namespace = {"__init__": __init__, "commit": commit, "commit_rebased": commit_rebased}
    return type(f"Gated{base.__name__}", (base,), namespace)


GatedMemoryStore = gated(MemoryStore)
GatedSQLiteStore = gated(SQLiteStore)


# Answers, as values a model can predict ---------------------------------------------------


def event_sig(event: Event) -> tuple[Any, ...]:
    """An event without its time: a call without one is timed "now", in the caller (and so
    is the result recover puts into a replace; every other message here has its own time)."""
    data = dict(event.data)
    if event.type is EventType.REPLACE:
        data["messages"] = [
            {k: v for k, v in item.items() if k != "created_at"}
            if item.get("content") == INTERRUPTED
            else item
            for item in data["messages"]
        ]
    return (event.seq, str(event.type), data)


def log_sig(log: Log) -> tuple[Any, ...]:
    return (log.count, log.horizon, [event_sig(event) for event in log.events()])


def answer_of(result: Any) -> tuple[Any, ...]:
    """What a caller got, in a form the model's answer is compared with."""
    if isinstance(result, Event):
        return ("events", (event_sig(result),))
    if isinstance(result, Log):
        return ("log", log_sig(result))
    if isinstance(result, tuple):
        return ("events", tuple(event_sig(event) for event in result))
    if isinstance(result, list):
        return ("flags", tuple(result))
    assert result is None, result
    return ("none",)


def error(kind: type[BaseException]) -> tuple[str, str]:
    return ("error", kind.__name__)


CANCELLED = ("cancelled",)


def first(answer: tuple[Any, ...]) -> tuple[Any, ...]:
    """What ``append`` and ``add_message`` return: one event, the first of those a key
    committed (an ``append_many`` may have committed several under it)."""
    return ("events", answer[1][:1]) if answer[0] == "events" else answer


Item = tuple[Any, Any, datetime | None]  # an event's type, data and time (None: now)


class Model:
    """The sequential model: the log the store should hold, and each key's first events."""

    def __init__(self) -> None:
        self.log = Log()
        self.keys: dict[str, tuple[Event, ...]] = {}

    def copy(self) -> Model:
        other = Model()
        other.log = self.log  # an immutable value
        other.keys = dict(self.keys)
        return other

    def append(
        self, items: tuple[Item, ...], key: str | None, expect: int | None
    ) -> tuple[Any, ...]:
        """All or none; a key seen before answers with its first events and appends nothing."""
        if key is not None and key in self.keys:
            return answer_of(self.keys[key])
        if expect is not None and self.log.count != expect:
            return error(ConflictError)
        log = self.log
        events = []
        try:
            for event_type, data, time in items:
                log = log.append(event_type, data, time=time)
                assert log.last is not None
                events.append(log.last)
        except InvalidEventError:
            return error(InvalidEventError)
        self.log = log
        if key is not None:
            self.keys[key] = tuple(events)
        return answer_of(tuple(events))

    def edit(self, item: Item, start: int, stop: int, expect: Any) -> tuple[Any, ...]:
        """A replace or remove: refused when the range does not hold what ``expect`` says."""
        if expect is not None:
            entries = self.log.range(start, stop)
            if isinstance(expect, int):
                found: object = len(entries)
            else:
                seqs: list[int] = []
                for entry in entries:  # the messages of one replace count once
                    if not seqs or seqs[-1] != entry.seq:
                        seqs.append(entry.seq)
                found, expect = seqs, list(expect)
            if found != expect:
                return error(ConflictError)
        return self.append((item,), None, None)


# The calls --------------------------------------------------------------------------------


@attrs.frozen
class Call:
    """One caller: what it sends (``perform``) and what the model says it gets (``expect``)."""

    cancel: bool
    queued: ClassVar[bool] = True  # goes through the actor's queue

    @property
    def kind(self) -> str:
        return type(self).__name__

    async def perform(self, session: SessionActor) -> Any:
        raise NotImplementedError

    def expect(self, model: Model) -> tuple[Any, ...]:
        raise NotImplementedError


@attrs.frozen
class AppendCall(Call):
    event_type: str
    data: dict[str, Any]
    time: datetime
    key: str | None

    async def perform(self, session: SessionActor) -> Any:
        return await session.append(self.event_type, self.data, time=self.time, key=self.key)

    def expect(self, model: Model) -> tuple[Any, ...]:
        return first(model.append(((self.event_type, self.data, self.time),), self.key, None))


@attrs.frozen
class AppendManyCall(Call):
    items: tuple[tuple[str, dict[str, Any], datetime], ...]
    key: str | None
    expect_count: int | None

    async def perform(self, session: SessionActor) -> Any:
        return await session.append_many(self.items, key=self.key, expect_count=self.expect_count)

    def expect(self, model: Model) -> tuple[Any, ...]:
        return model.append(self.items, self.key, self.expect_count)


@attrs.frozen
class AddMessageCall(Call):
    message: Message
    key: str | None

    async def perform(self, session: SessionActor) -> Any:
        return await session.add_message(self.message, key=self.key)

    def expect(self, model: Model) -> tuple[Any, ...]:
        event_type, data = message_event(self.message)
        return first(model.append(((event_type, data, self.message.created_at),), self.key, None))


@attrs.frozen
class ReplaceCall(Call):
    start: int
    stop: int
    messages: tuple[Message, ...]  # one: its own surface event; else a replace event
    expect_: Any

    async def perform(self, session: SessionActor) -> Any:
        message = self.messages[0] if len(self.messages) == 1 else list(self.messages)
        return await session.replace(self.start, self.stop, message, expect=self.expect_)

    def expect(self, model: Model) -> tuple[Any, ...]:
        if len(self.messages) == 1:
            (message,) = self.messages
            event_type, data = message_event(message)
            data["surface_op"] = ["replace", self.start, self.stop]
            item: Item = (event_type, data, message.created_at)
        else:
            item = (EventType.REPLACE, replace_data(self.start, self.stop, self.messages), None)
        return model.edit(item, self.start, self.stop, self.expect_)


@attrs.frozen
class RemoveCall(Call):
    start: int
    stop: int
    expect_: Any

    async def perform(self, session: SessionActor) -> Any:
        return await session.remove(self.start, self.stop, expect=self.expect_)

    def expect(self, model: Model) -> tuple[Any, ...]:
        data = {"surface_op": Remove(self.start, self.stop).to_json()}
        return model.edit((EventType.REMOVE, data, None), self.start, self.stop, self.expect_)


@attrs.frozen
class RewindCall(Call):
    to: int

    async def perform(self, session: SessionActor) -> Any:
        return await session.rewind(self.to)

    def expect(self, model: Model) -> tuple[Any, ...]:
        data = {"surface_op": Rewind(self.to).to_json()}
        return model.append(((EventType.REWIND, data, None),), None, None)


@attrs.frozen
class UncompactCall(Call):
    seq: int

    async def perform(self, session: SessionActor) -> Any:
        return await session.uncompact(self.seq)

    def expect(self, model: Model) -> tuple[Any, ...]:
        data = {"surface_op": Uncompact(self.seq).to_json()}
        return model.append(((EventType.UNCOMPACT, data, None),), None, None)


@attrs.frozen
class SnapshotCall(Call):
    async def perform(self, session: SessionActor) -> Any:
        return await session.snapshot()

    def expect(self, model: Model) -> tuple[Any, ...]:
        model.log = model.log.snapshot()
        return answer_of(model.log)


@attrs.frozen
class RecoverCall(Call):
    async def perform(self, session: SessionActor) -> Any:
        return await session.recover_open_turn()

    def expect(self, model: Model) -> tuple[Any, ...]:
        # Where the results go is recover's own rule (tests/actor/test_actor.py checks it); here
        # the model is that rule applied alone to the log the requests before left.
        applied = Recover().apply(model.log, model.log.count)
        model.log = applied.log
        return answer_of(applied.result)


@attrs.frozen
class CompactionCall(Call):
    """A compaction's result, posted as the compaction runner posts it."""

    replacement: Replacement

    async def perform(self, session: SessionActor) -> Any:
        return await session._call(Compaction([self.replacement], get_logger()))

    def expect(self, model: Model) -> tuple[Any, ...]:
        # Stale when a range operation over its range, or any rewind or uncompact, came
        # after the log it was planned on (the compaction section of docs/design.md), or a
        # snapshot dropped any of what came after it (that can then not be told).
        r = self.replacement
        if len(model.log.since(r.planned_at)) != model.log.count - r.planned_at:
            return ("flags", (False,))
        for event in model.log.since(r.planned_at):
            op = event.op
            if isinstance(op, Rewind | Uncompact) or (
                op is not None and op.start <= r.stop and r.start <= op.stop
            ):
                return ("flags", (False,))
        event_type, _ = message_event(r.message)
        model.log = model.log.append(event_type, r.data(), time=r.message.created_at)
        return ("flags", (True,))


@attrs.frozen
class ReloadCall(Call):
    async def perform(self, session: SessionActor) -> Any:
        return await session.reload()

    def expect(self, model: Model) -> tuple[Any, ...]:
        return answer_of(model.log)


@attrs.frozen
class ForkCall(Call):
    """Not a queued request: it forks what is committed when it is called (in a batch, the
    log before the blocker, whose commit is waiting at the gate)."""

    new_id: str
    at: int | None
    queued: ClassVar[bool] = False

    async def perform(self, session: SessionActor) -> Any:
        return await session.fork(self.new_id, at=self.at)

    def expect(self, model: Model) -> tuple[Any, ...]:
        log = model.log
        at = log.count - 1 if self.at is None else self.at
        if log.count == 0 or not max(0, log.horizon - 1) <= at < log.count:
            return error(ValueError)
        return ("none",)


# Drawing calls from the model's state -----------------------------------------------------

KINDS = (
    "append",
    "append_many",
    "add_message",
    "replace",
    "remove",
    "rewind",
    "uncompact",
    "snapshot",
    "recover",
    "compaction",
    "reload",
    "fork",
)


class Draw:
    """Draws calls whose numbers are near what the model holds, so that many are valid and
    some are not (a range past the new event, an expectation the batch made stale)."""

    def __init__(self, data: st.DataObject, model: Model, counter: Iterator[int], ids: str):
        self.data = data
        self.model = model
        self.counter = counter
        self.ids = ids

    def draw(self, strategy: st.SearchStrategy[Any]) -> Any:
        return self.data.draw(strategy)

    def time(self) -> datetime:
        return T0 + timedelta(seconds=next(self.counter), microseconds=7)

    def message(self) -> Message:
        n = next(self.counter)
        time = T0 + timedelta(seconds=n, microseconds=3)
        role = self.draw(st.sampled_from(["user", "assistant", "calls", "tool", "system"]))
        if role == "user":
            return Message.user(f"u{n}", created_at=time)
        if role == "assistant":
            return Message.assistant(f"a{n}", created_at=time)
        if role == "calls":  # left open, for recover_open_turn
            calls = [ToolCall(f"c{n}", "lookup", {"q": n})]
            return Message.assistant(None, tool_calls=calls, created_at=time)
        if role == "tool":
            return Message.tool(f"c{n - 1}", f"r{n}", name="lookup", created_at=time)
        return Message.system(f"s{n}", created_at=time)

    def item(self) -> tuple[str, dict[str, Any], datetime]:
        """An ``append`` item: a message, a bookkeeping or custom event, or (rarely) a
        remove, which an ``append_many`` must apply all-or-none."""
        kind = self.draw(st.sampled_from(["message", "message", "turn_start", "custom", "op"]))
        if kind == "message":
            event_type, data = message_event(self.message())
            return (str(event_type), data, self.time())
        if kind == "turn_start":
            return ("turn_start", {"n": next(self.counter)}, self.time())
        if kind == "custom":
            return ("x.test.note", {"n": next(self.counter)}, self.time())
        start, stop = self.range()
        return ("remove", {"surface_op": Remove(start, stop).to_json()}, self.time())

    def key(self) -> str | None:
        return self.draw(st.none() | st.sampled_from(KEYS))

    def position(self) -> int:
        positions = [entry.position for entry in self.model.log.surface()]
        anywhere = st.integers(0, self.model.log.count + 1)
        return self.draw(st.sampled_from(positions) | anywhere if positions else anywhere)

    def range(self) -> tuple[int, int]:
        start = self.position()
        return start, start + self.draw(st.integers(0, 3))

    def expectation(self, start: int, stop: int) -> Any:
        entries = self.model.log.range(start, stop)
        seqs: list[int] = []
        for entry in entries:
            if not seqs or seqs[-1] != entry.seq:
                seqs.append(entry.seq)
        how = self.draw(st.sampled_from(["none", "none", "count", "seqs", "other"]))
        if how == "count":
            return len(entries)
        if how == "seqs":
            return seqs
        if how == "other":
            return self.draw(st.integers(0, 3) | st.lists(st.integers(0, 8), max_size=2))
        return None

    def call(self, kind: str) -> Call | None:
        """A call of ``kind``, or None when the log holds nothing it could name."""
        cancel = self.draw(st.integers(0, 4)) == 4  # shrinks towards callers that wait
        log = self.model.log
        if kind == "append":
            event_type, data, time = self.item()
            return AppendCall(cancel, event_type, data, time, self.key())
        if kind == "append_many":
            items = tuple(self.item() for _ in range(self.draw(st.integers(1, 3))))
            expect = self.draw(st.none() | st.integers(max(0, log.count - 1), log.count + 3))
            return AppendManyCall(cancel, items, self.key(), expect)
        if kind == "add_message":
            return AddMessageCall(cancel, self.message(), self.key())
        if kind == "replace":
            start, stop = self.range()
            size = self.draw(st.sampled_from([1, 1, 0, 2]))
            messages = tuple(self.message() for _ in range(size))
            return ReplaceCall(cancel, start, stop, messages, self.expectation(start, stop))
        if kind == "remove":
            start, stop = self.range()
            return RemoveCall(cancel, start, stop, self.expectation(start, stop))
        if kind == "rewind":
            return RewindCall(cancel, self.draw(st.integers(-1, log.count)))
        if kind == "uncompact":
            replaces = [e.seq for e in log.events() if e.op is not None and e.op.name == "replace"]
            if not replaces:
                return None
            return UncompactCall(cancel, self.draw(st.sampled_from(replaces)))
        if kind == "snapshot":
            return SnapshotCall(cancel)
        if kind == "recover":
            return RecoverCall(cancel)
        if kind == "compaction":
            surface = log.surface()
            if not surface:
                return None
            first = self.draw(st.integers(0, len(surface) - 1))
            last = self.draw(st.integers(first, len(surface) - 1))
            n = next(self.counter)
            summary = Message.system(f"summary {n}", created_at=surface[first].time)
            replacement = Replacement(
                surface[first].position, surface[last].position, summary, log.count, COMPACTION
            )
            return CompactionCall(cancel, replacement)
        if kind == "reload":
            return ReloadCall(cancel)
        assert kind == "fork"
        at = self.draw(st.none() | st.integers(-1, log.count))
        # Not cancelled: a fork is not queued, so a cancelled one may or may not have forked.
        return ForkCall(False, f"{self.ids}-fork-{next(self.counter)}", at)


# The machine ------------------------------------------------------------------------------


@attrs.define
class Tally:
    steps: int = 0
    batches: int = 0
    mixed: int = 0  # batches with requests of two kinds or more
    requests: int = 0
    cancelled: int = 0


class EngineModel(RuleBasedStateMachine):
    """One session on one store, on one event loop, against the model."""

    backend: ClassVar[str]
    make_store: ClassVar[Callable[[], Any]]
    tally: ClassVar[Tally]

    def __init__(self) -> None:
        super().__init__()
        self.stack = ExitStack()
        self.portal: BlockingPortal = self.stack.enter_context(start_blocking_portal(self.backend))
        self.store = self.portal.call(type(self).make_store)
        self.stack.callback(self.portal.call, self.store.aclose)
        self.session_id = f"m-{uuid.uuid4().hex[:16]}"
        self.session: SessionActor | None = None
        self.opened: Any = None
        self.model = Model()
        self.counter = iter(range(1, 1 << 30))
        self.batches_since_reopen = 0

    # Opening and closing

    def open_actor(self, rebase: bool) -> None:
        # follow=False: a change feed's catch-ups (PostgreSQL) would join batches at random.
        opening = SessionActor.open(
            session_id=self.session_id,
            store=self.store,
            follow=False,
            on_conflict="rebase" if rebase else "raise",
        )
        self.opened = self.portal.wrap_async_context_manager(opening)
        self.session = self.opened.__enter__()

    def close_actor(self) -> None:
        opened, self.opened, self.session = self.opened, None, None
        if opened is not None:
            opened.__exit__(None, None, None)

    @initialize(rebase=st.booleans())
    def start(self, rebase: bool) -> None:
        self.open_actor(rebase)

    def teardown(self) -> None:
        try:
            self.close_actor()
        finally:
            self.stack.close()

    # Rules

    @rule(data=st.data(), size=st.integers(1, 6))
    def batch(self, data: st.DataObject, size: int) -> None:
        """A blocker, then ``size`` calls queued behind it; the actor takes them as one batch."""
        assert self.session is not None
        draw = Draw(data, self.model, self.counter, self.session_id)
        blocker = AppendCall(False, "user_message", {"content": "blocker"}, draw.time(), None)
        published = self.model.copy()  # what is committed while the blocker waits at the gate
        expected_blocker = blocker.expect(self.model)
        calls: list[Call] = []
        while len(calls) < size:
            call = draw.call(draw.draw(st.sampled_from(KINDS)))
            if call is not None:
                calls.append(call)
        # The fence: a reload at the end (a barrier, answered once everything before it is
        # committed) tells when the batch is done. Without it nothing may wait for the last
        # commit: its callers may be cancelled, or refused at once (an invalid request is
        # answered when it is applied, before the commit of the requests beside it).
        calls.append(ReloadCall(False))

        got_blocker, answers, forked = self.portal.call(self.run_batch, blocker, calls)

        tally = type(self).tally
        self.batches_since_reopen += 1
        tally.steps += 1
        tally.batches += 1
        tally.requests += size
        tally.cancelled += sum(call.cancel for call in calls)
        tally.mixed += len({call.kind for call in calls[:-1] if call.queued}) > 1
        assert got_blocker == expected_blocker, f"blocker: {got_blocker} != {expected_blocker}"
        for index, (call, answer) in enumerate(zip(calls, answers, strict=True)):
            wanted = call.expect(published if isinstance(call, ForkCall) else self.model)
            if call.cancel:
                # A cancelled caller hears nothing. Its request was queued, so it still
                # applies (`expect` just applied it to the model): the invariants check that.
                assert answer == CANCELLED, f"call {index} ({call}) was cancelled: {answer}"
                continue
            assert answer == wanted, (
                f"call {index} of {[c.kind for c in calls]}: {call}\n  got  {answer}\n"
                f"  want {wanted}"
            )
        for call, parent in forked:
            self.check_fork(call, parent)

    @precondition(lambda self: self.batches_since_reopen >= 3)  # mostly batches, reopen too
    @rule(rebase=st.booleans())
    def reopen(self, rebase: bool) -> None:
        """Closing and opening the session again gives the same log, surface and keys."""
        assert self.session is not None
        before = self.session.log
        self.close_actor()
        self.open_actor(rebase)
        self.batches_since_reopen = 0
        assert self.session is not None
        after = self.session.log
        assert after == before
        assert list(after.derive_messages()) == list(before.derive_messages())
        type(self).tally.steps += 1

    @invariant()
    def agrees_with_the_model_and_the_store(self) -> None:
        if self.session is None:
            return
        log = self.session.log
        assert log_sig(log) == log_sig(self.model.log)
        stored = self.portal.call(self.store.read, self.session_id)
        fresh = Log.restore(stored.events, count=stored.count, horizon=stored.horizon)
        assert fresh == log
        assert list(fresh.derive_messages()) == list(self.session.messages())
        keys = {key: (events[0].seq, len(events)) for key, events in self.model.keys.items()}
        assert dict(stored.keys) == keys

    # The async side

    async def run_batch(
        self, blocker: AppendCall, calls: list[Call]
    ) -> tuple[Any, list[Any], list[tuple[ForkCall, Log]]]:
        session, store = self.session, self.store
        assert session is not None
        answers: list[Any] = [None] * len(calls)
        blocker_answer: list[Any] = [None]
        scopes = [anyio.CancelScope() for _ in calls]
        forked: list[tuple[ForkCall, Log]] = []
        gate = store.gate = anyio.Event()
        try:
            with anyio.fail_after(HANG):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(perform, session, blocker, blocker_answer, 0, anyio.CancelScope())
                    while store.waiting == 0:  # the blocker is in the gated commit
                        await anyio.lowlevel.checkpoint()
                    depth = 0
                    for index, call in enumerate(calls):
                        if call.queued:
                            tg.start_soon(perform, session, call, answers, index, scopes[index])
                            depth += 1
                            # Queued before the next one starts: arrival order is this order.
                            while session.statistics().queue_depth < depth:
                                await anyio.lowlevel.checkpoint()
                        else:
                            parent = session.log
                            await perform(session, call, answers, index, scopes[index])
                            if answers[index] == ("none",):
                                assert isinstance(call, ForkCall)
                                forked.append((call, parent))
                    assert store.waiting == 1
                    assert session.statistics().queue_depth == depth
                    for index, call in enumerate(calls):
                        if call.cancel:
                            scopes[index].cancel()
                    gate.set()
        finally:
            store.gate = None
            gate.set()
        return blocker_answer[0], answers, forked

    def check_fork(self, call: ForkCall, parent: Log) -> None:
        """The fork holds the parent's history up to its fork point, and nothing else."""
        stored = self.portal.call(self.store.read, call.new_id)
        fork = Log.restore(stored.events, count=stored.count, horizon=stored.horizon)
        at = parent.count - 1 if call.at is None else call.at
        assert fork == parent.upto(at)
        assert (stored.parent, stored.fork_point) == (self.session_id, at)


async def perform(
    session: SessionActor, call: Call, answers: list[Any], index: int, scope: anyio.CancelScope
) -> None:
    """Make ``call`` and put what its caller heard in ``answers[index]``."""
    answers[index] = CANCELLED
    with scope:
        try:
            result = await call.perform(session)
        except (NousSessionError, ValueError) as failure:
            answers[index] = ("error", type(failure).__name__)
        else:
            answers[index] = answer_of(result)


# The tests --------------------------------------------------------------------------------


ENGINE_LINE = (
    f"engine model ({PROFILE} profile): {{steps}} steps, {{batches}} batches ({{mixed}} of several"
    " kinds), {requests} requests ({cancelled} callers cancelled) on {combinations} store and"
    " loop combinations"
)


@pytest.fixture
def store_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], Any]]:
    kind = request.param
    if kind == "memory":
        yield GatedMemoryStore
    elif kind == "sqlite":
        yield lambda: GatedSQLiteStore(str(tmp_path / f"{uuid.uuid4().hex}.sqlite3"))
    else:
        if not POSTGRES_URL:
            pytest.skip("no PostgreSQL server: set NOUS_SESSION_TEST_POSTGRES")
        psycopg = pytest.importorskip("psycopg")
        from nous_session.stores.postgres import PostgresStore

        schema = f"m_{uuid.uuid4().hex[:12]}"
        gated_postgres = gated(PostgresStore)
        if kind == "pgbouncer":  # commits and reads through a transaction pooler
            if not PGBOUNCER_URL:
                pytest.skip("no PgBouncer: set NOUS_SESSION_TEST_PGBOUNCER")
            url = PGBOUNCER_URL
            yield lambda: gated_postgres(url, schema=schema, pooled=True, direct_url=POSTGRES_URL)
        else:
            yield lambda: gated_postgres(POSTGRES_URL, schema=schema)
        with psycopg.connect(POSTGRES_URL, autocommit=True) as connection:
            connection.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


@pytest.mark.parametrize(
    "store_factory", ["memory", "sqlite", "postgres", "pgbouncer"], indirect=True
)
@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_batch_commits_as_if_one_by_one(
    backend: str,
    store_factory: Callable[[], Any],
    tallies: Tallies,
) -> None:
    tally = Tally()
    machine = type(
        "EngineModel",
        (EngineModel,),
        {"backend": backend, "make_store": staticmethod(store_factory), "tally": tally},
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
    tallies.add(ENGINE_LINE, combinations=1, **attrs.asdict(tally))
    # The run made what it is here to make: batches of several kinds, cancelled callers.
    assert tally.mixed > 0
    assert tally.cancelled > 0
