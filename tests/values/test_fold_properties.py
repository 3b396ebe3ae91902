"""Property tests: every surface operation against a naive fold written from the fold's rules
(docs/concepts.md).

The reference keeps the whole history as plain tuples and replays it from scratch for every
read: the live set of events, changed event by event (a surface event joins; a replace takes out
every live event whose position is in its range, then joins; a remove takes them out; a rewind
makes the live set what it was after seq ``to``; an uncompact takes its replace out and brings
back what was live in its range just before it), shown in position order, a replace's messages in
their order. A snapshot keeps the live events, the custom events and the bookkeeping events no
later range operation covers, and moves the horizon to the count; the reference never forgets
anything, so it checks that the real Log folds what a snapshot left exactly as the full history
would. The machine drives the real Log through all of it (rewinds over rewinds, removes inside
replaced ranges, uncompacts of summaries and of the wrong events, forks of forks from older
values, ``upto``, restores with gaps) and compares after every step.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import attrs
import pytest
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    precondition,
    rule,
)

from nous_session import InvalidEventError, Log, Message

SURFACE = ("system_message", "user_message", "assistant_message", "tool_result")
BOOKKEEPING = ("turn_start", "step_end", "tool_call")
CUSTOM = ("x.app.checkpoint", "x.app.note")
ROLE_TYPE = {
    "system": "system_message",
    "user": "user_message",
    "assistant": "assistant_message",
    "tool": "tool_result",
}
EPOCH = datetime(2026, 1, 1, tzinfo=UTC)

Entry = tuple[int, int, str, dict[str, Any], datetime]  # seq, position, type, fields, time
Held = tuple[int, str, dict[str, Any], datetime]  # seq, type, data, time


def op_of(event: Held) -> list[Any] | None:
    return event[2].get("surface_op")  # type: ignore[no-any-return]


def position(event: Held) -> int:
    op = op_of(event)
    return op[1] if op is not None and op[0] in ("replace", "remove") else event[0]


def entries(event: Held) -> list[Entry]:
    """What an event shows on the surface when it is live."""
    seq, kind, data, time = event
    if kind in SURFACE:
        fields = {k: v for k, v in data.items() if k != "surface_op"}
        return [(seq, position(event), kind, fields, time)]
    if kind == "replace":
        out = []
        for message in data["messages"]:
            fields = {k: v for k, v in message.items() if k not in ("role", "created_at")}
            when = datetime.fromisoformat(message["created_at"]).astimezone(UTC)
            out.append((seq, position(event), ROLE_TYPE[message["role"]], fields, when))
        return out
    return []


def contributes(event: Held) -> bool:
    """Whether the event joins the live set (when its operation lets it)."""
    return event[1] in SURFACE or (event[1] == "replace" and bool(event[2]["messages"]))


@attrs.frozen
class Ref:
    """The naive model: the whole history (never forgotten), what is held, count, horizon."""

    history: tuple[Held, ...] = ()
    held: tuple[Held, ...] = ()
    count: int = 0
    horizon: int = 0

    def append(self, event: Held) -> Ref:
        return Ref((*self.history, event), (*self.held, event), event[0] + 1, self.horizon)

    def live_after(self, seq: int) -> list[Held]:
        """The live events once every event with seq <= ``seq`` is folded, by replay."""
        live: list[Held] = []
        after: dict[int, list[Held]] = {}  # the live set after each seq

        def state(at: int) -> list[Held]:
            found = [s for s in after if s <= at]
            return list(after[max(found)]) if found else []

        for event in self.history:
            if event[0] > seq:
                break
            op = op_of(event)
            if op is None:
                if event[1] in SURFACE:
                    live = [*live, event]
            elif op[0] in ("replace", "remove"):
                live = [e for e in live if not op[1] <= position(e) <= op[2]]
                if op[0] == "replace" and contributes(event):
                    live.append(event)
            elif op[0] == "rewind":
                live = state(op[1])
            else:  # uncompact: it was checked when appended; replaying it, it applies
                target = self.uncompact_target(live, op[1], horizon=0)
                if target is not None:
                    start, stop = op_of(target)[1:]  # type: ignore[index]
                    before = [e for e in state(op[1] - 1) if start <= position(e) <= stop]
                    live = [e for e in live if e is not target] + before
            after[event[0]] = live
        return live

    def uncompact_target(self, live: list[Held], seq: int, horizon: int) -> Held | None:
        """The rule: a live replace, with nothing else live in its range, at or past the
        horizon."""
        if seq < horizon:
            return None
        found = [e for e in live if e[0] == seq]
        if not found:
            return None
        target = found[0]
        op = op_of(target)
        if op is None or op[0] != "replace":
            return None
        inside = [e for e in live if op[1] <= position(e) <= op[2]]
        return target if inside == [target] else None

    def surface(self, seq: int | None = None) -> list[Entry]:
        live = self.live_after(self.count - 1 if seq is None else seq)
        return [entry for event in sorted(live, key=position) for entry in entries(event)]

    def snapshot(self) -> Ref:
        live = {e[0] for e in self.live_after(self.count - 1)}
        kept = []
        held = self.held
        for index, event in enumerate(held):
            if event[1] in SURFACE or event[1] in ("replace", "remove", "rewind", "uncompact"):
                keep = event[0] in live
            elif event[1] in CUSTOM:
                keep = True
            else:
                keep = not any(
                    op_of(later) is not None
                    and op_of(later)[0] in ("replace", "remove")  # type: ignore[index]
                    and op_of(later)[1] <= event[0] <= op_of(later)[2]  # type: ignore[index]
                    for later in held[index + 1 :]
                )
            if keep:
                kept.append(event)
        if len(kept) == len(held):
            return self
        return Ref(self.history, tuple(kept), self.count, self.count)

    def upto(self, seq: int) -> Ref:
        return Ref(
            tuple(e for e in self.history if e[0] <= seq),
            tuple(e for e in self.held if e[0] <= seq),
            seq + 1,
            self.horizon,
        )


def as_held(event: Any) -> Held:
    return (event.seq, str(event.type), dict(event.data), event.time)


def as_entry(event: Any) -> Entry:
    fields = {k: v for k, v in event.data.items() if k != "surface_op"}
    return (event.seq, event.position, str(event.type), fields, event.time)


texts = st.text(alphabet="abc ✓", max_size=3)


class FoldMachine(RuleBasedStateMachine):
    values = Bundle("values")

    def __init__(self) -> None:
        super().__init__()
        self.log = Log()
        self.ref = Ref()
        self.tick = 0

    def _time(self) -> datetime:
        self.tick += 1
        return EPOCH + timedelta(microseconds=self.tick * 1_000_003)

    def _append(self, kind: str, data: dict[str, Any]) -> tuple[Log, Ref]:
        time = self._time()
        seq = self.log.count
        self.log = self.log.append(kind, data, time=time)
        stored = self.log.last
        assert stored is not None
        assert stored.seq == seq
        self.ref = self.ref.append((seq, kind, dict(stored.data), time))
        return (self.log, self.ref)

    def _refused(self, kind: str, data: dict[str, Any]) -> None:
        before = list(self.log.events())
        with pytest.raises(InvalidEventError):
            self.log.append(kind, data, time=self._time())
        assert list(self.log.events()) == before

    def _range(self, start: int, width: int) -> tuple[int, int]:
        start = start % self.log.count  # below the new event's seq, by construction
        return start, start + width  # may reach past the head: it only takes what exists

    @initialize(target=values)
    def start(self) -> tuple[Log, Ref]:
        return (self.log, self.ref)

    @rule(target=values, kind=st.sampled_from(SURFACE), text=texts)
    def message(self, kind: str, text: str) -> tuple[Log, Ref]:
        return self._append(kind, {"content": text})

    @rule(target=values, kind=st.sampled_from(BOOKKEEPING + CUSTOM), text=texts)
    def bookkeeping(self, kind: str, text: str) -> tuple[Log, Ref]:
        return self._append(kind, {"note": text})

    @precondition(lambda self: self.log.count > 0)
    @rule(
        target=values,
        kind=st.sampled_from(SURFACE),
        start=st.integers(0, 40),
        width=st.integers(0, 8),
        text=texts,
    )
    def replace(self, kind: str, start: int, width: int, text: str) -> tuple[Log, Ref]:
        a, b = self._range(start, width)
        return self._append(kind, {"content": text, "surface_op": ["replace", a, b]})

    @precondition(lambda self: self.log.count > 0)
    @rule(
        target=values,
        start=st.integers(0, 40),
        width=st.integers(0, 8),
        roles=st.lists(st.sampled_from(sorted(ROLE_TYPE)), max_size=3),
        text=texts,
    )
    def replace_many(self, start: int, width: int, roles: list[str], text: str) -> tuple[Log, Ref]:
        a, b = self._range(start, width)
        messages = []
        for index, role in enumerate(roles):
            when = (self._time() + timedelta(hours=index)).isoformat()
            messages.append({"role": role, "content": f"{text}{index}", "created_at": when})
        return self._append("replace", {"surface_op": ["replace", a, b], "messages": messages})

    @precondition(lambda self: self.log.count > 0)
    @rule(target=values, start=st.integers(0, 40), width=st.integers(0, 8))
    def remove(self, start: int, width: int) -> tuple[Log, Ref]:
        a, b = self._range(start, width)
        return self._append("remove", {"surface_op": ["remove", a, b]})

    @precondition(lambda self: self.log.count > 0)
    @rule(target=values, back=st.integers(0, 30))
    def rewind(self, back: int) -> tuple[Log, Ref]:
        lowest = max(-1, self.log.horizon - 1)
        to = max(lowest, self.log.count - 1 - back)
        return self._append("rewind", {"surface_op": ["rewind", to]})

    @precondition(lambda self: self.log.horizon > 1)
    @rule(back=st.integers(2, 10))
    def rewind_before_the_horizon(self, back: int) -> None:
        to = max(0, self.log.horizon - back)
        self._refused("rewind", {"surface_op": ["rewind", to]})

    @precondition(lambda self: self.log.count > 0)
    @rule(target=values, pick=st.integers(0, 1000))
    def uncompact(self, pick: int) -> tuple[Log, Ref]:
        # Mostly a replace (the likely targets), sometimes any event: the rule decides.
        candidates = [e for e in self.ref.held if op_of(e) is not None and op_of(e)[0] == "replace"]  # type: ignore[index]
        pool = candidates if candidates and pick % 4 else list(self.ref.held) or [None]
        chosen = pool[pick % len(pool)]
        seq = pick % self.log.count if chosen is None else chosen[0]
        data = {"surface_op": ["uncompact", seq]}
        live = self.ref.live_after(self.ref.count - 1)
        if self.ref.uncompact_target(live, seq, horizon=self.ref.horizon) is None:
            self._refused("uncompact", data)
            return (self.log, self.ref)
        return self._append("uncompact", data)

    @rule(target=values)
    def snapshot(self) -> tuple[Log, Ref]:
        surface = list(self.log.surface())
        self.log = self.log.snapshot()
        self.ref = self.ref.snapshot()
        assert list(self.log.surface()) == surface
        return (self.log, self.ref)

    @precondition(lambda self: self.log.count > 0)
    @rule(target=values, back=st.integers(0, 30))
    def upto(self, back: int) -> tuple[Log, Ref]:
        seq = max(0, self.log.horizon - 1, self.log.count - 1 - back)
        self.log = self.log.upto(seq)
        self.ref = self.ref.upto(seq)
        return (self.log, self.ref)

    @precondition(lambda self: self.log.horizon > 1)
    @rule(back=st.integers(2, 10))
    def upto_before_the_horizon(self, back: int) -> None:
        with pytest.raises(ValueError, match="horizon"):
            self.log.upto(max(0, self.log.horizon - back))

    @rule(target=values, gap=st.integers(1, 4), kind=st.sampled_from(SURFACE), text=texts)
    def restore_with_a_gap(self, gap: int, kind: str, text: str) -> tuple[Log, Ref]:
        seq = self.log.count + gap
        time = self._time()
        self.log = self.log.append_at(seq, kind, {"content": text}, time=time)
        self.ref = self.ref.append((seq, kind, {"content": text}, time))
        return (self.log, self.ref)

    @rule(value=values)
    def fork(self, value: tuple[Log, Ref]) -> None:
        """Continue from an older value (a fork; a fork of a fork when it happens twice)."""
        self.log, self.ref = value

    @rule(value=consumes(values))
    def forget(self, value: tuple[Log, Ref]) -> None:
        """Drop a value from the bundle (keeps forks spread over recent history)."""

    @invariant()
    def agrees_with_the_naive_fold(self) -> None:
        log, ref = self.log, self.ref
        assert (log.count, log.horizon) == (ref.count, ref.horizon)
        assert [as_held(e) for e in log.events()] == list(ref.held)
        surface = ref.surface()
        assert [as_entry(e) for e in log.surface()] == surface
        messages = list(log.derive_messages())
        assert [(m.role.value, m.text, m.created_at) for m in messages] == [
            (kind.removesuffix("_message").replace("tool_result", "tool"), f["content"], t)
            for _, _, kind, f, t in surface
        ]
        assert [seq for seq, _ in log.derive_indexed()] == [e[0] for e in surface]
        if ref.count:
            middle = max(ref.horizon - 1, 0, ref.count // 2)
            assert [as_entry(e) for e in log.upto(middle).surface()] == ref.surface(middle)
            start = surface[0][1] if surface else 0
            assert [as_entry(e) for e in log.range(start, start + 3)] == [
                e for e in surface if start <= e[1] <= start + 3
            ]


FoldMachine.TestCase.settings = FoldMachine.TestCase.settings  # the profile in conftest applies
TestFoldAgreesWithNaiveReplay = FoldMachine.TestCase


def test_the_reference_is_not_vacuous() -> None:
    """The reference tells a rewound surface, a removed range and an uncompacted one apart."""
    ref = Ref()
    for seq, text in enumerate("abc"):
        ref = ref.append((seq, "user_message", {"content": text}, EPOCH))
    ref = ref.append(
        (3, "system_message", {"content": "s", "surface_op": ["replace", 0, 1]}, EPOCH)
    )
    assert [e[0] for e in ref.surface()] == [3, 2]
    ref = ref.append((4, "remove", {"surface_op": ["remove", 2, 2]}, EPOCH))
    assert [e[0] for e in ref.surface()] == [3]
    ref = ref.append((5, "rewind", {"surface_op": ["rewind", 3]}, EPOCH))
    assert [e[0] for e in ref.surface()] == [3, 2]
    ref = ref.append((6, "uncompact", {"surface_op": ["uncompact", 3]}, EPOCH))
    assert [e[0] for e in ref.surface()] == [0, 1, 2]
    log = Log()
    for kind, data in [(e[1], e[2]) for e in ref.history]:
        log = log.append(kind, data, time=EPOCH)
    assert [e.seq for e in log.surface()] == [0, 1, 2]
    assert [m.text for m in log.derive_messages()] == ["a", "b", "c"]
    assert list(log.upto(4).derive_messages()) == [Message.system("s", created_at=EPOCH)]
