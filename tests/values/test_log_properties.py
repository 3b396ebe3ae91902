"""Property tests: the Log agrees with a naive fold written straight from the design's rules.

The reference keeps a plain list of held events and recomputes everything from scratch on every
read, quadratically, with no memo and no sharing: position, shadowing by any later replace,
order by position, projection field by field. The machine drives the real Log through appends,
replaces (nested, overlapping, covering nothing, reaching past the head), refused appends,
snapshots, ``upto``, ``append_at`` restores with gaps, and forks from older values, and compares
after every step.
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

from nous_session import Event, EventType, InvalidEventError, Log, Message, Role

SURFACE = [
    "system_message",
    "user_message",
    "assistant_message",
    "tool_result",
    "developer_message",
]
BOOKKEEPING = ["tool_call", "turn_start", "turn_end", "step_start", "step_end", "request_header"]
ROLE = {
    "system_message": Role.SYSTEM,
    "user_message": Role.USER,
    "assistant_message": Role.ASSISTANT,
    "tool_result": Role.TOOL,
    "developer_message": Role.DEVELOPER,
}
EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


@attrs.frozen
class Ref:
    """The naive model: held events as plain tuples, and the count."""

    held: tuple[tuple[int, str, dict[str, Any], datetime], ...] = ()
    count: int = 0

    def append(self, seq: int, kind: str, data: dict[str, Any], time: datetime) -> Ref:
        return Ref((*self.held, (seq, kind, data, time)), seq + 1)


def op_of(data: dict[str, Any]) -> tuple[int, int] | None:
    op = data.get("surface_op")
    return None if op is None else (op[1], op[2])


def position(event: tuple[int, str, dict[str, Any], datetime]) -> int:
    op = op_of(event[2])
    return event[0] if op is None else op[0]


def shadowed(ref: Ref, event: tuple[int, str, dict[str, Any], datetime]) -> bool:
    for later in ref.held:
        op = op_of(later[2])
        if op is not None and event[0] < later[0] and op[0] <= position(event) <= op[1]:
            return True
    return False


def naive_surface(ref: Ref) -> list[tuple[int, str, dict[str, Any], datetime]]:
    live = [e for e in ref.held if e[1] in SURFACE and not shadowed(ref, e)]
    positions = [position(e) for e in live]
    assert len(set(positions)) == len(positions), "two live events share a position"
    return sorted(live, key=position)


def naive_message(event: tuple[int, str, dict[str, Any], datetime]) -> Message:
    _, kind, data, time = event
    return Message(
        role=ROLE[kind],
        content=data.get("content"),
        reasoning_content=data.get("reasoning_content"),
        tool_calls=data.get("tool_calls") or (),
        tool_call_id=data.get("tool_call_id"),
        name=data.get("name"),
        metadata=data.get("metadata") or {},
        created_at=time,
        is_error=data.get("is_error") is True,
        provider_data=data.get("provider_data"),
    )


def as_tuple(event: Event) -> tuple[int, str, dict[str, Any], datetime]:
    return (event.seq, event.type.value, dict(event.data), event.time)


contents = st.one_of(
    st.none(),
    st.text(max_size=12),
    st.lists(
        st.one_of(
            st.builds(lambda t: {"type": "text", "text": t}, st.text(max_size=5)),
            st.builds(lambda u: {"type": "image_url", "url": u}, st.text(max_size=5)),
            # The typed parts' stored forms, and near misses of them.
            st.builds(
                lambda t: {"type": "thinking", "text": t, "signature": "s"}, st.text(max_size=3)
            ),
            st.builds(lambda n: {"type": "tool_call", "index": n}, st.integers(-1, 2)),
            st.builds(lambda u: {"type": "image", "url": u, "detail": "low"}, st.text(max_size=3)),
            st.just({"type": "provider", "provider": "anthropic", "data": {"type": "document"}}),
            st.just({"type": "text", "text": "t", "provider_data": {"gemini": {"x": 1}}}),
        ),
        max_size=3,
    ),
)
payloads = st.fixed_dictionaries(
    {"content": contents},
    optional={
        "reasoning_content": st.text(max_size=5),
        "name": st.text(max_size=5),
        "tool_call_id": st.text(max_size=5),
        "metadata": st.dictionaries(st.text(max_size=3), st.integers(-5, 5), max_size=2),
        "tool_calls": st.lists(
            st.fixed_dictionaries(
                {"id": st.text(max_size=3), "name": st.text(max_size=3)},
                optional={
                    "arguments": st.one_of(
                        st.text(max_size=4),
                        st.dictionaries(st.text(max_size=2), st.booleans(), max_size=2),
                    ),
                    "item_id": st.text(max_size=3),
                    "status": st.sampled_from(["completed", "in_progress"]),
                },
            ),
            max_size=2,
        ),
        "source": st.sampled_from(["model", "user", "compaction"]),
        "is_error": st.booleans(),
        "provider_data": st.dictionaries(
            st.sampled_from(["anthropic", "gemini"]),
            st.dictionaries(st.text(max_size=3), st.integers(-5, 5), max_size=2),
            max_size=2,
        ),
    },
)


class LogMachine(RuleBasedStateMachine):
    values = Bundle("values")

    def __init__(self) -> None:
        super().__init__()
        self.log = Log()
        self.ref = Ref()
        self.tick = 0
        # Earlier values and what they held when made: none of them may ever change.
        self.history: list[tuple[Log, Ref, list[Message]]] = []

    def _time(self) -> datetime:
        self.tick += 1
        return EPOCH + timedelta(microseconds=self.tick * 1_000_003)

    def _keep(self) -> None:
        self.history.append((self.log, self.ref, list(self.log.derive_messages())))

    @initialize(target=values)
    def start(self) -> tuple[Log, Ref]:
        return (self.log, self.ref)

    @rule(target=values, kind=st.sampled_from(SURFACE + BOOKKEEPING), data=payloads)
    def append(self, kind: str, data: dict[str, Any]) -> tuple[Log, Ref]:
        if kind not in SURFACE:
            data = {"note": data.get("content") if isinstance(data.get("content"), str) else ""}
        time = self._time()
        seq = self.log.count
        self.log = self.log.append(kind, data, time=time)
        self.ref = self.ref.append(seq, kind, data, time)
        self._keep()
        return (self.log, self.ref)

    @precondition(lambda self: self.log.count > 0)
    @rule(
        target=values,
        kind=st.sampled_from(SURFACE),
        start=st.integers(0, 60),
        width=st.integers(0, 12),
        text=st.text(max_size=8),
        as_tuple=st.booleans(),
    )
    def replace(
        self, kind: str, start: int, width: int, text: str, as_tuple: bool
    ) -> tuple[Log, Ref]:
        start = start % self.log.count  # below the event's own seq, by construction
        stop = start + width  # may reach past the head: it still only shadows what exists
        op: Any = ("replace", start, stop) if as_tuple else ["replace", start, stop]
        time = self._time()
        seq = self.log.count
        self.log = self.log.append(kind, {"content": text, "surface_op": op}, time=time)
        self.ref = self.ref.append(
            seq, kind, {"content": text, "surface_op": ["replace", start, stop]}, time
        )
        self._keep()
        return (self.log, self.ref)

    @rule(extra=st.integers(0, 3), width=st.integers(0, 3), bookkeeping=st.booleans())
    def refused(self, extra: int, width: int, bookkeeping: bool) -> None:
        before, count = self.log, self.log.count
        events = list(before.events())
        if bookkeeping and count > 0:
            kind, op = "step_end", ["replace", 0, width]
        else:
            kind, op = "user_message", ["replace", count + extra, count + extra + width]
        with pytest.raises(InvalidEventError):
            self.log.append(kind, {"surface_op": op})
        assert self.log.count == count
        assert list(self.log.events()) == events

    @rule(target=values)
    def snapshot(self) -> tuple[Log, Ref]:
        messages = list(self.log.derive_messages())
        self.log = self.log.snapshot()
        self.ref = Ref(tuple(e for e in self.ref.held if not shadowed(self.ref, e)), self.ref.count)
        assert list(self.log.derive_messages()) == messages
        self._keep()
        return (self.log, self.ref)

    @precondition(lambda self: self.log.count > 0)
    @rule(target=values, back=st.integers(0, 40))
    def upto(self, back: int) -> tuple[Log, Ref]:
        # A snapshot keeps history from its horizon on only.
        seq = max(0, self.log.horizon - 1, self.log.count - 1 - back)
        self.log = self.log.upto(seq)
        self.ref = Ref(tuple(e for e in self.ref.held if e[0] <= seq), seq + 1)
        self._keep()
        return (self.log, self.ref)

    @rule(
        target=values,
        gap=st.integers(0, 5),
        kind=st.sampled_from(SURFACE),
        text=st.text(max_size=4),
    )
    def restore(self, gap: int, kind: str, text: str) -> tuple[Log, Ref]:
        seq = self.log.count + gap
        time = self._time()
        self.log = self.log.append_at(seq, kind, {"content": text}, time=time)
        self.ref = self.ref.append(seq, kind, {"content": text}, time)
        self._keep()
        return (self.log, self.ref)

    @rule(value=values)
    def fork(self, value: tuple[Log, Ref]) -> None:
        # Continue from an older value: appends to it must not touch its successors.
        self.log, self.ref = value

    @rule(value=consumes(values))
    def forget(self, value: tuple[Log, Ref]) -> None:
        """Drop a value from the bundle (keeps forks spread over recent history)."""

    @invariant()
    def agrees_with_the_naive_fold(self) -> None:
        log, ref = self.log, self.ref
        assert log.count == ref.count
        assert [as_tuple(e) for e in log.events()] == list(ref.held)
        assert log.last == (log.events()[-1] if ref.held else None)
        surface = naive_surface(ref)
        assert [e.seq for e in log.surface()] == [e[0] for e in surface]
        expected = [naive_message(e) for e in surface]
        assert list(log.derive_messages()) == expected
        assert list(log.derive_indexed()) == [
            (e[0], m) for e, m in zip(surface, expected, strict=True)
        ]
        for seq in {0, ref.count // 2, max(ref.count - 3, 0), ref.count, ref.count + 2}:
            assert [e.seq for e in log.since(seq)] == [e[0] for e in ref.held if e[0] >= seq]
        assert [e.seq for e in log.shadowed()] == [e[0] for e in ref.held if shadowed(ref, e)]

    @invariant()
    def earlier_values_never_change(self) -> None:
        for log, ref, messages in self.history[-6:]:
            assert [as_tuple(e) for e in log.events()] == list(ref.held)
            assert log.count == ref.count
            assert list(log.derive_messages()) == messages


LogMachine.TestCase.settings = LogMachine.TestCase.settings  # the profile in conftest applies
TestLogAgreesWithNaiveFold = LogMachine.TestCase


def test_reference_fold_detects_a_wrong_surface() -> None:
    """The reference is not vacuous: it tells a replaced range from an unreplaced one."""
    ref = Ref()
    ref = ref.append(0, "user_message", {"content": "a"}, EPOCH)
    ref = ref.append(1, "user_message", {"content": "b"}, EPOCH)
    ref = ref.append(2, "system_message", {"content": "s", "surface_op": ["replace", 0, 0]}, EPOCH)
    assert [e[0] for e in naive_surface(ref)] == [2, 1]
    log = Log().append("user_message", {"content": "a"}).append("user_message", {"content": "b"})
    log = log.append(EventType.SYSTEM_MESSAGE, {"content": "s", "surface_op": ["replace", 0, 0]})
    assert [e.seq for e in log.surface()] == [2, 1]
