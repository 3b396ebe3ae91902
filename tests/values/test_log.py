"""The Log: the seed document's examples, the fold, and the Log as an immutable value.

The contract is docs/design.md ("The fold", "Log") and seeds/session_log.txt, whose Elixir
examples are translated one by one at the top of this file.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from structlog.testing import capture_logs

from nous_session import (
    SURFACE_TYPES,
    Event,
    EventType,
    InvalidEventError,
    Log,
    Message,
    Replace,
    Role,
    ToolCall,
)
from nous_session.event import OPERATION_TYPES

T0 = datetime(2024, 5, 1, 12, 0, 0, 123456, tzinfo=UTC)
# The types that never reach the surface, carry no operation and take any JSON data (a
# metadata event holds one record).
BOOKKEEPING = [
    t
    for t in EventType
    if t not in SURFACE_TYPES
    and t not in OPERATION_TYPES
    and t not in (EventType.METADATA, EventType.ERASURE)  # each holds one record of its own
]

U = EventType.USER_MESSAGE
A = EventType.ASSISTANT_MESSAGE
S = EventType.SYSTEM_MESSAGE
TR = EventType.TOOL_RESULT


def at(i: int) -> datetime:
    """A distinct, increasing time for event ``i``."""
    return T0 + timedelta(seconds=i, microseconds=i)


def users(n: int, log: Log | None = None) -> Log:
    """Append ``n`` user messages ``m<seq>`` (timed by seq) to ``log`` (default: a new one)."""
    log = Log() if log is None else log
    for _ in range(n):
        seq = log.count
        log = log.append(U, {"content": f"m{seq}"}, time=at(seq))
    return log


def summary(log: Log, start: int, stop: int, text: str | None = None) -> Log:
    """Append a system summary replacing positions ``start..stop``."""
    seq = log.count
    content = text if text is not None else f"[summary of {start}-{stop}]"
    return log.append(S, {"content": content, "surface_op": ["replace", start, stop]}, time=at(seq))


def seqs(events: Sequence[Event]) -> list[int]:
    return [event.seq for event in events]


def contents(log: Log) -> list[Any]:
    return [message.content for message in log.derive_messages()]


# The seed document's examples ---------------------------------------------------------------


def test_seed_example_append_numbers_events_0_1() -> None:
    log = Log()
    log = log.append(EventType.USER_MESSAGE, {"content": "hi"})
    log = log.append(EventType.ASSISTANT_MESSAGE, {"content": "hello"})
    assert [e.seq for e in log.events()] == [0, 1]


def test_seed_example_since() -> None:
    log = Log()
    log = log.append(EventType.USER_MESSAGE, {"content": "a"})
    log = log.append(EventType.USER_MESSAGE, {"content": "b"})
    assert [e.data["content"] for e in log.since(1)] == ["b"]
    assert list(log.since(5)) == []


def test_seed_example_snapshot() -> None:
    log = Log()
    log = log.append(EventType.USER_MESSAGE, {"content": "one"})
    log = log.append(EventType.USER_MESSAGE, {"content": "two"})
    log = log.append(
        EventType.SYSTEM_MESSAGE, {"content": "[summary]", "surface_op": ("replace", 0, 1)}
    )
    log = log.snapshot()
    assert [e.seq for e in log.events()] == [2]
    assert log.count == 3


def test_seed_example_surface_skips_bookkeeping() -> None:
    log = Log()
    log = log.append(EventType.USER_MESSAGE, {"content": "one"})
    log = log.append(EventType.STEP_START, {})
    log = log.append(EventType.ASSISTANT_MESSAGE, {"content": "two"})
    assert [e.type for e in log.surface()] == [
        EventType.USER_MESSAGE,
        EventType.ASSISTANT_MESSAGE,
    ]


def test_seed_example_replace_dont_delete() -> None:
    # Events 0..41, then a summary of 1..40: it shows in place of 1..40, and events() keeps all.
    log = Log()
    for i in range(42):
        log = log.append(U if i % 2 == 0 else A, {"content": f"turn {i}"})
    log = log.append(A, {"content": "..."})
    assert log.count == 43
    log = log.append(
        EventType.SYSTEM_MESSAGE,
        {"content": "[summary of 1-40]", "surface_op": ("replace", 1, 40)},
    )
    messages = log.derive_messages()
    assert [m.content for m in messages] == ["turn 0", "[summary of 1-40]", "turn 41", "..."]
    assert [m.role for m in messages] == [Role.USER, Role.SYSTEM, Role.ASSISTANT, Role.ASSISTANT]
    assert seqs(log.events()) == list(range(44))
    assert [e.data.get("content") for e in log.events()][:42] == [f"turn {i}" for i in range(42)]
    assert [seq for seq, _ in log.derive_indexed()] == [0, 43, 41, 42]


# The fold -----------------------------------------------------------------------------------


def test_summary_takes_its_range_position_not_the_end() -> None:
    log = summary(users(6), 1, 3)
    assert seqs(log.surface()) == [0, 6, 4, 5]
    assert contents(log) == ["m0", "[summary of 1-3]", "m4", "m5"]
    assert [e.position for e in log.surface()] == [0, 1, 4, 5]


def test_summary_of_everything_stands_alone() -> None:
    log = summary(users(4), 0, 3)
    assert seqs(log.surface()) == [4]
    assert contents(log) == ["[summary of 0-3]"]


def test_replaced_events_stay_in_events() -> None:
    base = users(6)
    log = summary(base, 1, 3)
    assert seqs(log.events()) == [0, 1, 2, 3, 4, 5, 6]
    assert list(log.events())[:6] == list(base.events())
    assert [e.data["content"] for e in log.events()][1:4] == ["m1", "m2", "m3"]


def test_replace_cannot_shadow_later_events() -> None:
    log = summary(users(3), 0, 999)
    log = users(2, log)
    assert seqs(log.surface()) == [3, 4, 5]
    assert contents(log) == ["[summary of 0-999]", "m4", "m5"]
    # The later events sit inside 0..999 but were appended after the replace.
    assert all(0 <= e.position <= 999 for e in log.surface())


def test_two_disjoint_replaces_each_land_in_place() -> None:
    log = users(10)
    log = summary(log, 1, 2)
    log = summary(log, 6, 7)
    assert seqs(log.surface()) == [0, 10, 3, 4, 5, 11, 8, 9]
    assert contents(log) == [
        "m0",
        "[summary of 1-2]",
        "m3",
        "m4",
        "m5",
        "[summary of 6-7]",
        "m8",
        "m9",
    ]


def test_two_disjoint_replaces_appended_in_reverse_order() -> None:
    log = users(10)
    log = summary(log, 6, 7)
    log = summary(log, 1, 2)
    assert seqs(log.surface()) == [0, 11, 3, 4, 5, 10, 8, 9]


def test_in_place_replace_of_one_event() -> None:
    log = users(7).append(A, {"content": "edited 5", "surface_op": Replace(5, 5)}, time=at(7))
    assert seqs(log.surface()) == [0, 1, 2, 3, 4, 7, 6]
    assert contents(log)[5] == "edited 5"


def test_later_summary_shadows_earlier_in_place_replace() -> None:
    log = users(10)
    log = log.append(A, {"content": "edited 5", "surface_op": Replace(5, 5)}, time=at(10))
    assert seqs(log.surface()) == [0, 1, 2, 3, 4, 10, 6, 7, 8, 9]
    log = summary(log, 0, 7)
    assert seqs(log.surface()) == [11, 8, 9]
    assert contents(log) == ["[summary of 0-7]", "m8", "m9"]


def test_summary_outside_range_keeps_in_place_replace() -> None:
    log = users(10)
    log = log.append(A, {"content": "edited 5", "surface_op": Replace(5, 5)}, time=at(10))
    log = summary(log, 0, 3)
    assert seqs(log.surface()) == [11, 4, 10, 6, 7, 8, 9]


def test_second_summary_supersedes_the_first() -> None:
    log = users(6)
    log = summary(log, 0, 3, "first")
    assert contents(log) == ["first", "m4", "m5"]
    log = summary(log, 0, 4, "second")
    assert seqs(log.surface()) == [7, 5]
    assert contents(log) == ["second", "m5"]
    assert seqs(log.events()) == list(range(8))


def test_replace_with_empty_range_inserts_at_its_position() -> None:
    # Position 2 holds a bookkeeping event: the replace covers no surface event.
    log = users(2)
    log = log.append(EventType.STEP_START, {}, time=at(2))
    log = users(2, log)
    log = log.append(S, {"content": "note", "surface_op": ["replace", 2, 2]}, time=at(5))
    assert seqs(log.surface()) == [0, 1, 5, 3, 4]


@pytest.mark.parametrize("kind", BOOKKEEPING)
def test_bookkeeping_events_never_reach_the_surface(kind: EventType) -> None:
    log = users(1)
    log = log.append(kind, {"content": "not for the model", "tool_calls": []}, time=at(1))
    log = users(1, log)
    assert seqs(log.surface()) == [0, 2]
    assert contents(log) == ["m0", "m2"]
    assert len(log.derive_indexed()) == 2


def test_all_bookkeeping_types_together_never_reach_the_surface() -> None:
    log = Log()
    for kind in [*SURFACE_TYPES, *BOOKKEEPING]:
        log = log.append(kind, {"content": kind.value}, time=at(log.count))
    assert [e.type for e in log.surface()] == list(SURFACE_TYPES)
    assert [m.role for m in log.derive_messages()] == [
        Role.SYSTEM,
        Role.USER,
        Role.ASSISTANT,
        Role.TOOL,
        Role.DEVELOPER,
    ]


def test_empty_assistant_event_still_projects() -> None:
    log = users(1).append(A, {}, time=at(1))
    messages = log.derive_messages()
    assert len(messages) == 2
    assert messages[1] == Message(Role.ASSISTANT, created_at=at(1))
    assert messages[1].content is None
    assert messages[1].tool_calls == ()
    log = log.append(A, None, time=at(2))
    assert len(log.derive_messages()) == 3


def test_projection_keeps_every_message_field() -> None:
    parts = [{"type": "text", "text": "look: "}, {"type": "image_url", "url": "https://x/y.png"}]
    log = Log().append(
        A,
        {
            "content": parts,
            "reasoning_content": "because",
            "name": "helper",
            "tool_calls": [
                {"id": "c1", "name": "search", "arguments": {"q": "cats", "n": [1, 2]}},
                {"id": "c2", "type": "function", "function": {"name": "f", "arguments": "{}"}},
            ],
            "metadata": {"source_run": 7, "tags": ["x"], "nested": {"k": None}},
        },
        time=at(0),
    )
    log = log.append(TR, {"content": "42", "tool_call_id": "c1", "name": "search"}, time=at(1))
    assistant, tool = log.derive_messages()
    assert assistant == Message(
        Role.ASSISTANT,
        content=tuple(parts),
        reasoning_content="because",
        name="helper",
        tool_calls=(
            ToolCall("c1", "search", {"q": "cats", "n": [1, 2]}),
            ToolCall("c2", "f", "{}"),
        ),
        metadata={"source_run": 7, "tags": ["x"], "nested": {"k": None}},
        created_at=at(0),
    )
    assert isinstance(assistant.content, tuple)
    assert assistant.text == "look: "
    assert tool == Message(
        Role.TOOL, content="42", tool_call_id="c1", name="search", created_at=at(1)
    )
    assert tool.role is Role.TOOL


def test_projection_drops_other_data_keys() -> None:
    log = users(3)
    log = log.append(
        S,
        {
            "content": "[summary]",
            "surface_op": ["replace", 0, 1],
            "source": "compaction",
            "metadata": {"kept": True},
        },
        time=at(3),
    )
    message = log.derive_messages()[0]
    assert message == Message(
        Role.SYSTEM, content="[summary]", metadata={"kept": True}, created_at=at(3)
    )
    assert dict(message.metadata) == {"kept": True}
    assert "surface_op" not in repr(message)
    assert "compaction" not in repr(message)


def test_created_at_is_the_event_time() -> None:
    local = datetime(2024, 5, 1, 15, 30, 0, 999, tzinfo=timezone(timedelta(hours=3)))
    log = Log().append(U, {"content": "a"}, time=local)
    log = log.append(A, {"content": "b"}, time=T0)
    first, second = log.derive_messages()
    assert first.created_at == local
    assert first.created_at.utcoffset() == timedelta(0)
    assert first.created_at == log.events()[0].time
    assert second.created_at == T0


def test_created_at_defaults_to_event_time_now() -> None:
    log = Log().append(U, {"content": "a"})
    assert log.derive_messages()[0].created_at == log.events()[0].time


def test_derive_indexed_pairs_carry_the_events_own_seq() -> None:
    log = users(8)
    log = summary(log, 0, 5)
    assert log.last is not None
    assert log.last.seq == 8
    indexed = log.derive_indexed()
    assert [seq for seq, _ in indexed] == [8, 6, 7]
    assert [m for _, m in indexed] == list(log.derive_messages())
    assert [m.content for _, m in indexed] == ["[summary of 0-5]", "m6", "m7"]
    # The position, not the seq, names the range for a new replace.
    assert [e.position for e in log.surface()] == [0, 6, 7]


def test_derive_messages_matches_derive_indexed_and_surface() -> None:
    log = summary(users(5), 1, 2)
    log = log.append(EventType.TURN_END, {}, time=at(6))
    log = users(1, log)
    assert [seq for seq, _ in log.derive_indexed()] == seqs(log.surface())
    assert [m for _, m in log.derive_indexed()] == list(log.derive_messages())


# try_append ---------------------------------------------------------------------------------


def test_try_append_returns_same_log_and_warns() -> None:
    log = users(2)
    with capture_logs() as logs:
        result = log.try_append("not_a_type", {"content": "x"})
    assert result is log
    assert log.count == 2
    warnings = [entry for entry in logs if entry["log_level"] == "warning"]
    assert len(warnings) == 1
    assert warnings[0]["event"] == "nous_session.event_dropped"


def test_try_append_warns_for_invalid_data() -> None:
    log = users(2)
    with capture_logs() as logs:
        result = log.try_append(S, {"surface_op": ["replace", 5, 2]})
    assert result is log
    assert any(entry["event"] == "nous_session.event_dropped" for entry in logs)


def test_try_append_appends_a_valid_event() -> None:
    log = users(2)
    with capture_logs() as logs:
        result = log.try_append(U, {"content": "ok"}, time=at(2))
    assert result is not log
    assert result.count == 3
    assert result.last is not None
    assert result.last.data["content"] == "ok"
    assert result.last.time == at(2)
    assert logs == []


# append_at ----------------------------------------------------------------------------------


def test_append_at_restores_with_gaps() -> None:
    log = Log()
    log = log.append_at(0, U, {"content": "a"}, time=at(0))
    log = log.append_at(3, A, {"content": "b"}, time=at(3))
    log = log.append_at(10, S, {"content": "s", "surface_op": ["replace", 0, 3]}, time=at(10))
    assert seqs(log.events()) == [0, 3, 10]
    assert log.count == 11
    assert [e.time for e in log.events()] == [at(0), at(3), at(10)]
    assert seqs(log.surface()) == [10]
    # An ordinary append continues from the head.
    log = log.append(U, {"content": "c"})
    assert seqs(log.events()) == [0, 3, 10, 11]
    assert seqs(log.since(4)) == [10, 11]


def test_append_at_the_head_is_allowed() -> None:
    log = users(2).append_at(2, U, {"content": "x"}, time=at(2))
    assert seqs(log.events()) == [0, 1, 2]


@pytest.mark.parametrize("seq", [0, 1, 2])
def test_append_at_behind_the_head_is_refused(seq: int) -> None:
    log = users(3)
    before = list(log.events())
    with pytest.raises(InvalidEventError, match=str(seq)):
        log.append_at(seq, U, {"content": "x"}, time=at(9))
    assert log.count == 3
    assert list(log.events()) == before


def test_append_at_behind_the_head_after_snapshot_is_refused() -> None:
    log = summary(users(3), 0, 1).snapshot()
    assert log.count == 4
    with pytest.raises(InvalidEventError, match="1"):
        log.append_at(1, U, {"content": "x"}, time=at(9))


def test_append_at_requires_time() -> None:
    log = users(1)
    with pytest.raises(TypeError):
        log.append_at(1, U, {"content": "x"})  # type: ignore[call-arg]
    assert log.count == 1


def test_append_at_validates_like_append() -> None:
    log = users(1)
    with pytest.raises(InvalidEventError, match="bogus"):
        log.append_at(4, "bogus", {}, time=at(4))
    with pytest.raises(InvalidEventError, match="bytes"):
        log.append_at(4, U, {"x": b"y"}, time=at(4))
    with pytest.raises(InvalidEventError, match="surface_op"):
        log.append_at(4, EventType.STEP_END, {"surface_op": ["replace", 0, 0]}, time=at(4))
    assert log.count == 1
    assert seqs(log.events()) == [0]


# count --------------------------------------------------------------------------------------


def test_count_of_empty_log_is_zero() -> None:
    log = Log()
    assert log.count == 0
    assert list(log.events()) == []
    assert list(log.surface()) == []
    assert list(log.derive_messages()) == []
    assert list(log.derive_indexed()) == []
    assert log.last is None


def test_count_is_the_next_seq_including_shadowed() -> None:
    log = summary(users(4), 0, 2)
    assert log.count == 5
    log = log.append(EventType.TURN_START, {})
    assert log.count == 6
    assert log.last is not None
    assert log.last.seq == 5


def test_refused_event_takes_no_seq() -> None:
    log = users(2)
    with pytest.raises(InvalidEventError):
        log.append(U, {"x": {1, 2}})
    assert log.try_append("bogus") is log
    assert log.count == 2
    log = log.append(U, {"content": "next"})
    assert seqs(log.events()) == [0, 1, 2]


def test_snapshot_never_lowers_count() -> None:
    log = summary(users(5), 2, 4)
    snap = log.snapshot()
    assert snap.count == log.count == 6
    log2 = summary(users(3), 0, 999)
    assert log2.snapshot().count == 4
    assert log2.snapshot().snapshot().count == 4


# seed ---------------------------------------------------------------------------------------


def _conversation() -> list[Message]:
    return [
        Message.system("You are terse.", created_at=at(0)),
        Message.user(
            [{"type": "text", "text": "what is "}, {"type": "image_url", "url": "https://i/x"}],
            name="alice",
            metadata={"client": "web", "ids": [1, 2]},
            created_at=at(1),
        ),
        Message.assistant(
            "let me look",
            tool_calls=[
                {"id": "c1", "name": "lookup", "arguments": {"q": "x", "deep": {"n": 1}}},
                {
                    "id": "c2",
                    "type": "function",
                    "function": {"name": "fetch", "arguments": '{"url": "u"}'},
                },
                ToolCall("c3", "noargs"),
            ],
            reasoning_content="think first",
            created_at=at(2),
        ),
        Message.tool("c1", {"answer": 42}, name="lookup", created_at=at(3)),
        Message.tool("c2", "raw text", created_at=at(4)),
        Message.assistant(created_at=at(5)),
        Message.assistant("done", metadata={"usage": {"tokens": 7}}, created_at=at(6)),
        Message(
            Role.USER,
            content="odd but valid",
            tool_calls=(ToolCall("u1", "n"),),
            created_at=datetime(2024, 5, 1, 20, 0, 0, 5, tzinfo=timezone(timedelta(hours=-5))),
        ),
    ]


def test_seed_is_lossless() -> None:
    messages = _conversation()
    log = Log.seed(messages)
    derived = log.derive_messages()
    assert derived == messages
    assert list(derived) == messages
    assert [m.created_at for m in derived] == [m.created_at for m in messages]
    assert [m.tool_calls for m in derived] == [m.tool_calls for m in messages]
    assert [m.metadata for m in derived] == [m.metadata for m in messages]
    assert [m.content for m in derived] == [m.content for m in messages]


def test_seed_makes_one_surface_event_per_message() -> None:
    messages = _conversation()
    log = Log.seed(messages)
    assert seqs(log.events()) == list(range(len(messages)))
    assert [e.type for e in log.events()] == [S, U, A, TR, TR, A, A, U]
    assert [e.time for e in log.events()] == [m.created_at for m in messages]
    assert log.count == len(messages)


def test_seed_stores_tool_calls_flat() -> None:
    log = Log.seed(_conversation())
    calls = log.events()[2].data["tool_calls"]
    assert calls == [
        {"id": "c1", "name": "lookup", "arguments": {"q": "x", "deep": {"n": 1}}},
        {"id": "c2", "name": "fetch", "arguments": '{"url": "u"}'},
        {"id": "c3", "name": "noargs", "arguments": {}},
    ]


def test_seed_empty() -> None:
    log = Log.seed([])
    assert log.count == 0
    assert list(log.derive_messages()) == []


def test_seed_drops_non_messages_with_a_warning() -> None:
    first = Message.user("a", created_at=at(0))
    second = Message.assistant("b", created_at=at(1))
    junk: list[object] = ["a string", {"role": "user", "content": "dict"}, None, 3]
    with capture_logs() as logs:
        log = Log.seed([junk[0], first, junk[1], junk[2], second, junk[3]])
    assert log.derive_messages() == [first, second]
    assert seqs(log.events()) == [0, 1]
    assert log.count == 2
    warnings = [entry for entry in logs if entry["log_level"] == "warning"]
    assert len(warnings) == len(junk)


def test_seed_then_append_continues() -> None:
    messages = _conversation()
    log = Log.seed(messages).append(U, {"content": "more"}, time=at(50))
    assert log.count == len(messages) + 1
    assert list(log.derive_messages())[:-1] == messages


# snapshot -----------------------------------------------------------------------------------


def _compacted() -> Log:
    """Seqs 0..9 users, 10 summary of 2..5, 11 turn_end, 12..13 users, 14 summary of 2..7."""
    log = users(10)
    log = summary(log, 2, 5)
    log = log.append(EventType.TURN_END, {}, time=at(11))
    log = users(2, log)
    return summary(log, 2, 7)


def test_snapshot_keeps_surface_and_count() -> None:
    log = _compacted()
    surface = list(log.surface())
    messages = list(log.derive_messages())
    indexed = list(log.derive_indexed())
    snap = log.snapshot()
    assert list(snap.surface()) == surface
    assert list(snap.derive_messages()) == messages
    assert list(snap.derive_indexed()) == indexed
    assert snap.count == log.count == 15
    assert seqs(snap.surface()) == [0, 1, 14, 8, 9, 12, 13]


def test_snapshot_survivors_keep_their_seqs() -> None:
    log = _compacted()
    snap = log.snapshot()
    # 2..5 shadowed by 10, 6..7 and 10 by 14; the bookkeeping event 11 is not shadowed.
    assert seqs(snap.events()) == [0, 1, 8, 9, 11, 12, 13, 14]
    by_seq = {e.seq: e for e in log.events()}
    assert all(e == by_seq[e.seq] for e in snap.events())
    assert snap.last == log.last


def test_snapshot_of_unshadowed_log_keeps_everything() -> None:
    log = users(3).append(EventType.STEP_START, {})
    snap = log.snapshot()
    assert snap == log
    assert list(snap.events()) == list(log.events())


def test_snapshot_computed_without_earlier_reads() -> None:
    # No surface read before the snapshot: the memo is not primed.
    snap = _compacted().snapshot()
    assert seqs(snap.surface()) == [0, 1, 14, 8, 9, 12, 13]
    assert seqs(snap.events()) == [0, 1, 8, 9, 11, 12, 13, 14]


@pytest.mark.parametrize(
    ("seq", "expected"),
    [
        (0, [0, 1, 8, 9, 11, 12, 13, 14]),
        (1, [1, 8, 9, 11, 12, 13, 14]),
        (2, [8, 9, 11, 12, 13, 14]),
        (5, [8, 9, 11, 12, 13, 14]),
        (7, [8, 9, 11, 12, 13, 14]),
        (8, [8, 9, 11, 12, 13, 14]),
        (10, [11, 12, 13, 14]),
        (11, [11, 12, 13, 14]),
        (14, [14]),
        (15, []),
        (100, []),
    ],
)
def test_since_across_snapshot_gaps(seq: int, expected: list[int]) -> None:
    snap = _compacted().snapshot()
    assert seqs(snap.since(seq)) == expected


def test_snapshot_then_append_keeps_working() -> None:
    log = _compacted()
    snap = log.snapshot()
    snap2 = snap.append(A, {"content": "after"}, time=at(15))
    full2 = log.append(A, {"content": "after"}, time=at(15))
    assert snap2.count == 16
    assert snap2.last is not None
    assert snap2.last.seq == 15
    assert seqs(snap2.surface()) == seqs(full2.surface()) == [0, 1, 14, 8, 9, 12, 13, 15]
    assert snap2.derive_messages() == full2.derive_messages()
    # A replace after the snapshot folds the same way as on the unsnapshotted log.
    snap3 = summary(snap2, 0, 9)
    full3 = summary(full2, 0, 9)
    assert seqs(snap3.surface()) == seqs(full3.surface()) == [16, 12, 13, 15]
    assert snap3.derive_messages() == full3.derive_messages()
    assert seqs(snap3.since(10)) == [11, 12, 13, 14, 15, 16]
    assert seqs(snap3.snapshot().events()) == [11, 12, 13, 15, 16]
    assert snap3.snapshot().count == 17


def test_snapshot_leaves_the_original_intact() -> None:
    log = _compacted()
    before = list(log.events())
    log.snapshot()
    assert list(log.events()) == before
    assert seqs(log.events()) == list(range(15))


# upto ---------------------------------------------------------------------------------------


def _history() -> list[Log]:
    """Every value of a log with replaces and bookkeeping, one per appended seq."""
    steps: list[tuple[EventType, dict[str, Any]]] = [
        (S, {"content": "sys"}),
        (EventType.TURN_START, {}),
        (U, {"content": "q1"}),
        (A, {"content": None, "tool_calls": [{"id": "c", "name": "t", "arguments": {}}]}),
        (TR, {"content": "r", "tool_call_id": "c"}),
        (A, {"content": "a1"}),
        (EventType.TURN_END, {}),
        (S, {"content": "[sum 2-5]", "surface_op": ["replace", 2, 5]}),
        (U, {"content": "q2"}),
        (A, {"content": "edit q2", "surface_op": ["replace", 8, 8]}),
        (A, {"content": "a2"}),
        (S, {"content": "[sum 0-10]", "surface_op": ["replace", 0, 10]}),
        (U, {"content": "q3"}),
    ]
    history: list[Log] = []
    log = Log()
    for i, (kind, data) in enumerate(steps):
        log = log.append(kind, data, time=at(i))
        history.append(log)
    return history


@pytest.mark.parametrize("prime", [False, True], ids=["cold", "memo-primed"])
def test_upto_is_the_log_as_it_was(prime: bool) -> None:
    history = _history()
    final = history[-1]
    if prime:
        final.derive_messages()
    for seq, then in enumerate(history):
        past = final.upto(seq)
        assert past == then
        assert past.count == then.count == seq + 1
        assert list(past.events()) == list(then.events())
        assert list(past.surface()) == list(then.surface())
        assert list(past.derive_messages()) == list(then.derive_messages())
        assert list(past.derive_indexed()) == list(then.derive_indexed())
        assert past.last == then.last


def test_upto_with_memo_primed_midway() -> None:
    history = _history()
    history[5].derive_messages()
    final = history[-1]
    for seq in (3, 5, 7, 10):
        assert list(final.upto(seq).derive_messages()) == list(history[seq].derive_messages())


def test_upto_shows_what_the_model_saw_before_a_summary() -> None:
    history = _history()
    final = history[-1]
    assert [m.content for m in final.derive_messages()] == ["[sum 0-10]", "q3"]
    assert [m.content for m in final.upto(6).derive_messages()] == ["sys", "q1", None, "r", "a1"]
    assert [m.content for m in final.upto(7).derive_messages()] == ["sys", "[sum 2-5]"]


def test_upto_then_append_forks() -> None:
    history = _history()
    final = history[-1]
    branch = final.upto(6).append(U, {"content": "other"}, time=at(99))
    assert seqs(branch.events()) == [0, 1, 2, 3, 4, 5, 6, 7]
    assert branch.events()[7].data["content"] == "other"
    assert [m.content for m in branch.derive_messages()][-1] == "other"
    assert final == history[-1]
    assert final.events()[7].data["content"] == "[sum 2-5]"
    assert [m.content for m in final.derive_messages()] == ["[sum 0-10]", "q3"]


def test_upto_after_snapshot_reaches_back_to_the_horizon_only() -> None:
    snap = _compacted().snapshot()
    assert snap.horizon == 15
    past = snap.upto(14)
    assert past.count == 15
    assert past.horizon == 15
    assert seqs(past.events()) == seqs(snap.events())
    assert list(past.derive_messages()) == list(snap.derive_messages())
    # Before the horizon the snapshot dropped what the surface was made of then.
    with pytest.raises(ValueError, match="horizon 15"):
        snap.upto(13)


@pytest.mark.parametrize("seq", [-1, -5, 13, 14, 100, 1.0, "3", None, True])
def test_upto_refuses_out_of_range_seq(seq: Any) -> None:
    final = _history()[-1]
    with pytest.raises(ValueError, match="upto"):
        final.upto(seq)


def test_upto_on_empty_log_is_refused() -> None:
    with pytest.raises(ValueError, match="upto"):
        Log().upto(0)


def test_last() -> None:
    assert Log().last is None
    log = users(2)
    assert log.last == log.events()[-1]
    assert log.last is not None
    assert log.last.seq == 1
    log = log.append(EventType.STEP_START, {})
    assert log.last is not None
    assert log.last.type is EventType.STEP_START


# since --------------------------------------------------------------------------------------


def test_since_returns_the_tail() -> None:
    log = users(5)
    assert list(log.since(0)) == list(log.events())
    assert seqs(log.since(3)) == [3, 4]
    assert seqs(log.since(4)) == [4]
    assert list(log.since(5)) == []


@pytest.mark.parametrize("seq", [-1, -100])
def test_since_negative_is_refused(seq: int) -> None:
    with pytest.raises(ValueError, match=str(seq)):
        users(3).since(seq)


def test_since_on_empty_log() -> None:
    assert list(Log().since(0)) == []


# Immutability -------------------------------------------------------------------------------


def test_old_value_is_unchanged_after_appends() -> None:
    old = users(3)
    old_events = list(old.events())
    old_messages = list(old.derive_messages())
    new = old.append(A, {"content": "x"})
    newer = summary(new, 0, 2).append(U, {"content": "y"})
    newer = newer.snapshot().append(A, {"content": "z"})
    assert old.count == 3
    assert list(old.events()) == old_events
    assert list(old.derive_messages()) == old_messages
    assert seqs(old.surface()) == [0, 1, 2]
    assert old.last is not None
    assert old.last.seq == 2
    assert new.count == 4
    assert seqs(new.events()) == [0, 1, 2, 3]
    assert seqs(new.surface()) == [0, 1, 2, 3]


def test_appending_to_an_old_value_forks_it() -> None:
    base = users(3)
    base.derive_messages()  # prime the memo, so the fork must not share it wrongly
    left = base.append(A, {"content": "left"}, time=at(3))
    right = base.append(U, {"content": "right"}, time=at(3))
    left = left.append(A, {"content": "left again"}, time=at(4))
    right = summary(right, 0, 1)
    assert base.count == 3
    assert contents(base) == ["m0", "m1", "m2"]
    assert [e.data.get("content") for e in left.events()] == [
        "m0",
        "m1",
        "m2",
        "left",
        "left again",
    ]
    assert [e.data.get("content") for e in right.events()] == [
        "m0",
        "m1",
        "m2",
        "right",
        "[summary of 0-1]",
    ]
    assert contents(left) == ["m0", "m1", "m2", "left", "left again"]
    assert contents(right) == ["[summary of 0-1]", "m2", "right"]
    assert left.count == right.count == 5
    assert seqs(left.surface()) == [0, 1, 2, 3, 4]
    assert seqs(right.surface()) == [4, 2, 3]


def test_forks_without_reads_stay_apart() -> None:
    base = users(2)
    left = base.append(U, {"content": "L"})
    right = base.append(U, {"content": "R"})
    left2 = left.append(U, {"content": "L2"})
    right2 = right.append(U, {"content": "R2"})
    assert contents(left2) == ["m0", "m1", "L", "L2"]
    assert contents(right2) == ["m0", "m1", "R", "R2"]
    assert contents(left) == ["m0", "m1", "L"]
    assert contents(right) == ["m0", "m1", "R"]
    assert contents(base) == ["m0", "m1"]


def test_fork_after_successor_read_its_memo() -> None:
    base = users(3)
    successor = base.append(U, {"content": "s"})
    assert contents(successor) == ["m0", "m1", "m2", "s"]
    fork = base.append(A, {"content": "f"})
    assert contents(fork) == ["m0", "m1", "m2", "f"]
    assert contents(successor) == ["m0", "m1", "m2", "s"]
    assert [m.role for m in fork.derive_messages()][-1] is Role.ASSISTANT


def test_returned_sequences_never_change() -> None:
    log = users(4)
    views = {
        "events": log.events(),
        "surface": log.surface(),
        "messages": log.derive_messages(),
        "indexed": log.derive_indexed(),
        "since": log.since(1),
    }
    copies = {name: list(view) for name, view in views.items()}
    # Later appends, replaces, snapshots, time travel and forks of every kind.
    successor = users(2, log)
    successor.derive_messages()
    replaced = summary(successor, 0, 3)
    replaced.derive_indexed()
    snap = replaced.snapshot()
    snap.append(U, {"content": "after snap"}).derive_messages()
    log.append(A, {"content": "fork"}).derive_messages()
    successor.upto(2).append(U, {"content": "travel"}).surface()
    summary(log, 1, 2).derive_messages()
    for name, view in views.items():
        assert list(view) == copies[name], name
        assert len(view) == len(copies[name]), name


def test_returned_sequences_of_a_successor_never_change() -> None:
    log = summary(users(4), 1, 2)
    views = [log.events(), log.surface(), log.derive_messages(), log.derive_indexed()]
    copies = [list(view) for view in views]
    log.append(U, {"content": "x"}).derive_messages()
    log.append(S, {"content": "s", "surface_op": ["replace", 0, 4]}).derive_messages()
    log.snapshot().append(U, {"content": "y"}).derive_messages()
    assert [list(view) for view in views] == copies


@pytest.mark.parametrize(
    "read",
    [
        Log.events,
        Log.surface,
        Log.derive_messages,
        Log.derive_indexed,
        lambda log: log.since(0),
    ],
    ids=["events", "surface", "derive_messages", "derive_indexed", "since"],
)
def test_returned_sequences_are_read_only(read: Any) -> None:
    log = users(2)
    view = read(log)
    assert isinstance(view, Sequence)
    assert not hasattr(view, "append")
    assert not hasattr(view, "extend")
    with pytest.raises(TypeError):
        view[0] = view[1]
    with pytest.raises(TypeError):
        del view[0]
    assert len(read(log)) == 2


# Memo (observable) --------------------------------------------------------------------------


def test_derive_messages_twice_returns_the_same_message_objects() -> None:
    log = summary(users(5), 1, 2)
    first = log.derive_messages()
    second = log.derive_messages()
    assert first == second
    assert all(a is b for a, b in zip(first, second, strict=True))
    indexed = log.derive_indexed()
    assert all(m is a for (_, m), a in zip(indexed, first, strict=True))


def test_append_extends_the_memo() -> None:
    log = users(5)
    before = log.derive_messages()
    log2 = log.append(A, {"content": "new"})
    after = log2.derive_messages()
    assert len(after) == 6
    assert all(a is b for a, b in zip(before, after[:5], strict=True))
    log3 = log2.append(EventType.STEP_END, {}).append(U, {"content": "more"})
    later = log3.derive_messages()
    assert all(a is b for a, b in zip(after, later[:6], strict=True))


def test_append_after_a_replace_extends_the_new_memo() -> None:
    log = summary(users(5), 1, 2)
    before = log.derive_messages()
    after = log.append(A, {"content": "x"}).derive_messages()
    assert [m.content for m in after] == ["m0", "[summary of 1-2]", "m3", "m4", "x"]
    assert all(a is b for a, b in zip(before, after[:4], strict=True))


def test_replace_keeps_projections_outside_its_range() -> None:
    log = users(6)
    before = log.derive_messages()
    after = summary(log, 1, 3).derive_messages()
    assert after[0] is before[0]
    assert after[2] is before[4]
    assert after[3] is before[5]
    assert after[1].content == "[summary of 1-3]"


def test_memo_messages_equal_a_fresh_fold() -> None:
    # The memoised path (read after every append) and a cold read agree.
    warm = Log()
    cold = Log()
    steps: list[tuple[EventType, dict[str, Any]]] = [
        (U, {"content": "a"}),
        (A, {"content": "b"}),
        (S, {"content": "s1", "surface_op": ["replace", 0, 1]}),
        (U, {"content": "c"}),
        (EventType.STEP_START, {}),
        (A, {"content": "d", "surface_op": ["replace", 3, 3]}),
        (S, {"content": "s2", "surface_op": ["replace", 0, 4]}),
        (U, {"content": "e"}),
    ]
    for i, (kind, data) in enumerate(steps):
        warm = warm.append(kind, data, time=at(i))
        warm.derive_messages()
        cold = cold.append(kind, data, time=at(i))
    assert list(warm.derive_messages()) == list(cold.derive_messages())
    assert [m.content for m in cold.derive_messages()] == ["s2", "e"]
    assert list(warm.derive_indexed()) == list(cold.derive_indexed())
    assert [seq for seq, _ in cold.derive_indexed()] == [6, 7]


# Equality -----------------------------------------------------------------------------------


def test_log_equality_is_by_value() -> None:
    a = users(3)
    b = users(3)
    assert a == b
    assert a != users(2)
    assert a != a.append(U, {"content": "x"}, time=at(3))


def test_giving_back_a_discarded_successor_lets_the_next_append_reuse_the_storage() -> None:
    base = users(3)
    base.derive_messages()
    discarded = summary(base.append(U, {"content": "never"}), 0, 1)
    contents(discarded)  # its fold extended the shared surface too
    base.give_back(discarded)
    after = base.append(U, {"content": "instead"}, time=at(3))
    assert after._events is base._events  # no copy
    assert [e.data.get("content") for e in after.events()] == ["m0", "m1", "m2", "instead"]
    assert contents(after) == ["m0", "m1", "m2", "instead"]
    assert contents(base) == ["m0", "m1", "m2"]
    assert seqs(after.surface()) == [0, 1, 2, 3]


def test_give_back_leaves_storage_alone_when_something_came_after() -> None:
    base = users(2)
    discarded = base.append(U, {"content": "x"})
    kept = discarded.append(U, {"content": "y"})  # still alive: must not lose its events
    base.give_back(discarded)
    assert [e.data.get("content") for e in kept.events()] == ["m0", "m1", "x", "y"]
    other = base.append(U, {"content": "z"})
    assert contents(other) == ["m0", "m1", "z"]
    assert contents(kept) == ["m0", "m1", "x", "y"]


# No module-level state holds session data ------------------------------------------------------

# Run in a fresh interpreter: only the first log a process folds from empty could fill a
# shared module-level fold, and in this process earlier tests have folded many.
_FIRST_SESSION = """
import gc, sys, weakref
import anyio
from nous_session import EventType, MemoryStore, SessionActor

async def main():
    async with MemoryStore() as store:
        async with SessionActor.open(session_id="first", store=store) as session:
            for i in range(500):
                await session.append(EventType.USER_MESSAGE, {"content": f"first private {i}"})
            assert len(session.messages()) == 500
            refs = [weakref.ref(event) for event in session.log.events()]
        assert await store.delete("first")
        del session
    gc.collect()
    alive = [event for ref in refs if (event := ref()) is not None]
    print(len(alive), [type(r).__name__ for r in gc.get_referrers(*alive[:1])])

anyio.run(main, backend=sys.argv[1])
"""


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_closed_deleted_session_leaves_no_events_behind(backend: str) -> None:
    """The first session of a process: once it is closed and deleted, none of its events is
    reachable. A shared empty fold, extended in place by the first log folded from it, kept
    them for the life of the process."""
    result = subprocess.run(
        [sys.executable, "-W", "error", "-c", _FIRST_SESSION, backend],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "0 []\n", f"events survive (count, referrers): {result.stdout}"
