"""Events: their types, the Replace op, their properties, and how Log.append validates them.

The contract is the "Events" section of docs/design.md.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import attrs
import pytest

from nous_session import SURFACE_TYPES, Event, EventType, InvalidEventError, Log, Replace
from nous_session.event import OPERATION_TYPES

T0 = datetime(2024, 5, 1, 12, 0, 0, 123456, tzinfo=UTC)

BOOKKEEPING_TYPES = [
    EventType.TOOL_CALL,
    EventType.TURN_START,
    EventType.TURN_END,
    EventType.STEP_START,
    EventType.STEP_END,
    EventType.REQUEST_HEADER,
    EventType.METADATA,
    EventType.ERASURE,
]
ERASURE_DATA = {"seqs": [0], "at": "2026-01-01T00:00:00+00:00", "reason": "asked"}


def _log_of(n: int) -> Log:
    """A log of ``n`` user messages, seqs 0..n-1."""
    log = Log()
    for i in range(n):
        log = log.append(EventType.USER_MESSAGE, {"content": f"m{i}"})
    return log


def _refuse(log: Log, kind: object, data: object, match: str) -> InvalidEventError:
    """Append an invalid event: check the error and that the log is exactly as it was."""
    count = log.count
    before = list(log.events())
    with pytest.raises(InvalidEventError, match=match) as info:
        log.append(kind, data)  # type: ignore[arg-type]
    assert isinstance(info.value, ValueError)
    assert log.count == count
    assert list(log.events()) == before
    # The refused event took no seq: the next valid append gets the old count.
    after = log.append(EventType.USER_MESSAGE, {"content": "next"})
    assert after.last is not None
    assert after.last.seq == count
    return info.value


# EventType ----------------------------------------------------------------------------------


def test_event_type_values() -> None:
    assert {member.name: member.value for member in EventType} == {
        "SYSTEM_MESSAGE": "system_message",
        "USER_MESSAGE": "user_message",
        "ASSISTANT_MESSAGE": "assistant_message",
        "TOOL_RESULT": "tool_result",
        "DEVELOPER_MESSAGE": "developer_message",
        "TOOL_CALL": "tool_call",
        "TURN_START": "turn_start",
        "TURN_END": "turn_end",
        "STEP_START": "step_start",
        "STEP_END": "step_end",
        "REQUEST_HEADER": "request_header",
        "METADATA": "session_metadata",
        "ERASURE": "erasure",
        "REPLACE": "replace",
        "REMOVE": "remove",
        "REWIND": "rewind",
        "UNCOMPACT": "uncompact",
    }


def test_event_type_is_a_str_enum() -> None:
    assert isinstance(EventType.USER_MESSAGE, str)
    assert EventType.USER_MESSAGE == "user_message"
    assert EventType("tool_result") is EventType.TOOL_RESULT


def test_surface_types_in_order() -> None:
    assert list(SURFACE_TYPES) == [
        EventType.SYSTEM_MESSAGE,
        EventType.USER_MESSAGE,
        EventType.ASSISTANT_MESSAGE,
        EventType.TOOL_RESULT,
        EventType.DEVELOPER_MESSAGE,
    ]
    assert set(EventType) - set(SURFACE_TYPES) == set(BOOKKEEPING_TYPES) | set(OPERATION_TYPES)


# Replace ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("start", "stop"), [(0, 0), (0, 5), (3, 3), (7, 2**40)])
def test_replace_accepts_ordered_non_negative_ints(start: int, stop: int) -> None:
    op = Replace(start, stop)
    assert (op.start, op.stop) == (start, stop)
    assert op == Replace(start, stop)


@pytest.mark.parametrize(
    ("start", "stop"),
    [
        (5, 2),
        (1, 0),
        (-1, 2),
        (-3, -1),
        (0, -1),
        (True, 2),
        (0, True),
        (False, False),
        (1.0, 2),
        (0, 2.0),
        ("1", 2),
        (0, "2"),
        (None, 2),
        (0, None),
    ],
)
def test_replace_refuses_bad_bounds(start: Any, stop: Any) -> None:
    with pytest.raises(ValueError, match=r"start|stop"):
        Replace(start, stop)


def test_replace_is_frozen() -> None:
    op = Replace(1, 2)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        op.start = 0  # type: ignore[misc]
    assert op == Replace(1, 2)


# Event properties ---------------------------------------------------------------------------


def test_event_properties_without_op() -> None:
    log = _log_of(3)
    event = log.last
    assert isinstance(event, Event)
    assert event.seq == 2
    assert event.type is EventType.USER_MESSAGE
    assert event.surface_op is None
    assert event.position == 2
    assert event.is_surface is True


def test_event_properties_with_op() -> None:
    log = _log_of(6).append(
        EventType.SYSTEM_MESSAGE, {"content": "[summary]", "surface_op": ["replace", 1, 4]}
    )
    event = log.last
    assert event is not None
    assert event.seq == 6
    assert event.surface_op == Replace(1, 4)
    assert isinstance(event.surface_op, Replace)
    assert event.position == 1
    assert event.is_surface is True


@pytest.mark.parametrize("kind", list(SURFACE_TYPES))
def test_surface_types_are_surface(kind: EventType) -> None:
    event = Log().append(kind, {"content": "x"}).last
    assert event is not None
    assert event.is_surface is True


@pytest.mark.parametrize("kind", BOOKKEEPING_TYPES)
def test_bookkeeping_types_are_not_surface(kind: EventType) -> None:
    data: dict[str, object] = {"content": "x"}
    if kind is EventType.METADATA:
        data = {"metadata": {}}
    elif kind is EventType.ERASURE:
        data = dict(ERASURE_DATA)
    event = Log().append(kind, data).last
    assert event is not None
    assert event.is_surface is False
    assert event.surface_op is None
    assert event.position == 0


# Validation through Log.append: refusals ----------------------------------------------------


@pytest.mark.parametrize("kind", ["bogus_type", "USER_MESSAGE", "", 3, None])
def test_unknown_type_is_refused(kind: object) -> None:
    error = _refuse(_log_of(2), kind, {"content": "x"}, match="unknown")
    assert repr(kind) in str(error)


@pytest.mark.parametrize("kind", BOOKKEEPING_TYPES)
def test_surface_op_on_bookkeeping_type_is_refused(kind: EventType) -> None:
    error = _refuse(_log_of(3), kind, {"surface_op": ["replace", 0, 1]}, match="surface_op")
    assert kind.value in str(error)


@pytest.mark.parametrize(
    "op",
    [
        pytest.param(["replace", 5, 2], id="start-after-stop"),
        pytest.param(("replace", 5, 2), id="start-after-stop-tuple"),
        pytest.param(["replace", -1, 2], id="negative-start"),
        pytest.param(["replace", -3, -1], id="negative-both"),
        pytest.param(["replace", 1.0, 2], id="float-start"),
        pytest.param(["replace", 1, 2.0], id="float-stop"),
        pytest.param(["replace", True, 2], id="bool-start"),
        pytest.param(["replace", 0, True], id="bool-stop"),
        pytest.param(["replace", "1", 2], id="str-start"),
        pytest.param(["replace", 1, "2"], id="str-stop"),
        pytest.param(["replace", None, 2], id="none-start"),
        pytest.param((5, 2), id="bare-pair"),
        pytest.param((0, 1), id="bare-ordered-pair"),
        pytest.param([0, 1], id="bare-list-pair"),
        pytest.param("nonsense", id="nonsense"),
        pytest.param("replace", id="bare-word"),
        pytest.param(["delete", 0, 1], id="other-op"),
        pytest.param(["replace", 0], id="too-short"),
        pytest.param(["replace", 0, 1, 2], id="too-long"),
        pytest.param([], id="empty"),
        pytest.param({"replace": [0, 1]}, id="mapping"),
        pytest.param(7, id="int"),
        pytest.param(True, id="bool"),
    ],
)
def test_malformed_surface_op_is_refused(op: object) -> None:
    _refuse(_log_of(10), EventType.SYSTEM_MESSAGE, {"content": "s", "surface_op": op}, "surface_op")


@pytest.mark.parametrize(
    "op",
    [
        pytest.param(["replace", 4, 4], id="start-equal-seq"),
        pytest.param(["replace", 5, 9], id="start-above-seq"),
        pytest.param(("replace", 4, 10), id="tuple"),
        pytest.param(Replace(4, 4), id="replace-value"),
    ],
)
def test_surface_op_must_start_below_own_seq(op: object) -> None:
    error = _refuse(
        _log_of(4), EventType.SYSTEM_MESSAGE, {"content": "s", "surface_op": op}, "surface_op"
    )
    assert "seq" in str(error)


def test_surface_op_on_first_event_is_refused() -> None:
    # Seq 0 has nothing below it to replace.
    _refuse(Log(), EventType.USER_MESSAGE, {"surface_op": ["replace", 0, 0]}, "surface_op")


def test_surface_op_start_just_below_seq_is_accepted() -> None:
    log = _log_of(4).append(EventType.SYSTEM_MESSAGE, {"surface_op": ["replace", 3, 3]})
    assert log.count == 5
    assert log.last is not None
    assert log.last.position == 3


def test_surface_op_start_checked_against_append_at_seq() -> None:
    log = _log_of(2)
    with pytest.raises(InvalidEventError, match="surface_op"):
        log.append_at(9, EventType.SYSTEM_MESSAGE, {"surface_op": ["replace", 9, 9]}, time=T0)
    assert log.count == 2
    restored = log.append_at(
        9, EventType.SYSTEM_MESSAGE, {"surface_op": ["replace", 8, 9]}, time=T0
    )
    assert restored.last is not None
    assert restored.last.surface_op == Replace(8, 9)


class _Opaque:
    pass


@pytest.mark.parametrize(
    ("data", "path"),
    [
        pytest.param({"a": b"x"}, 'data["a"]', id="bytes"),
        pytest.param({"a": bytearray(b"x")}, 'data["a"]', id="bytearray"),
        pytest.param({"a": {1, 2}}, 'data["a"]', id="set"),
        pytest.param({"a": frozenset()}, 'data["a"]', id="frozenset"),
        pytest.param({"a": _Opaque()}, 'data["a"]', id="object"),
        pytest.param({"a": math.nan}, 'data["a"]', id="nan"),
        pytest.param({"a": math.inf}, 'data["a"]', id="inf"),
        pytest.param({"a": -math.inf}, 'data["a"]', id="minus-inf"),
        pytest.param({"a": 10**4000}, 'data["a"]', id="int-too-long"),
        pytest.param({"a": -(10**4000)}, 'data["a"]', id="negative-int-too-long"),
        pytest.param({"a": T0}, 'data["a"]', id="datetime"),
        pytest.param({"a": {"b": [0, b"x"]}}, 'data["a"]["b"][1]', id="nested-bytes"),
        pytest.param({"a": {"b": [0, {3}]}}, 'data["a"]["b"][1]', id="nested-set"),
        pytest.param({"a": {"b": [0, _Opaque()]}}, 'data["a"]["b"][1]', id="nested-object"),
        pytest.param({"a": {"b": [0, math.nan]}}, 'data["a"]["b"][1]', id="nested-nan"),
        pytest.param({"a": {"b": [0, math.inf]}}, 'data["a"]["b"][1]', id="nested-inf"),
        pytest.param({"a": {"b": [0, 10**4000]}}, 'data["a"]["b"][1]', id="nested-long-int"),
        pytest.param({"a": {"b": (0, b"x")}}, 'data["a"]["b"][1]', id="nested-tuple"),
        pytest.param(
            {"metadata": {"tags": ["ok", b"no"]}}, 'data["metadata"]["tags"][1]', id="metadata"
        ),
        pytest.param({"a": [[[b"x"]]]}, 'data["a"][0][0][0]', id="deep-list"),
    ],
)
def test_non_json_data_is_refused_naming_the_path(data: dict[str, Any], path: str) -> None:
    error = _refuse(_log_of(2), EventType.USER_MESSAGE, data, match=re.escape(path))
    assert path in str(error)


def test_non_json_data_on_bookkeeping_event_is_refused() -> None:
    error = _refuse(_log_of(1), EventType.STEP_START, {"x": {"y": [b"z"]}}, match="bytes")
    assert 'data["x"]["y"][0]' in str(error)


def test_non_json_error_names_the_first_offender() -> None:
    data = {"ok": 1, "a": {"fine": "x", "b": [0, b"first", {1, 2}]}, "z": b"later"}
    error = _refuse(_log_of(1), EventType.USER_MESSAGE, data, match="bytes")
    assert 'data["a"]["b"][1]' in str(error)
    assert "[2]" not in str(error)
    assert '"z"' not in str(error)


@pytest.mark.parametrize("key", [1, 1.5, None, (1, 2), b"k"])
def test_non_str_key_at_top_level_is_refused(key: Any) -> None:
    error = _refuse(_log_of(1), EventType.USER_MESSAGE, {key: "x"}, match="key")
    assert repr(key) in str(error)
    assert "key" in str(error)


def test_non_str_key_nested_is_refused_naming_the_path() -> None:
    error = _refuse(_log_of(1), EventType.USER_MESSAGE, {"a": {"b": [{7: "x"}]}}, match="key")
    assert 'data["a"]["b"][0]' in str(error)
    assert "7" in str(error)


@pytest.mark.parametrize(
    "value",
    [
        *(2**63 - 1, -(2**63), 0, -1, 1.5, -0.0, 1e308),
        # Wider than 64 bits, as the frameworks' own stores keep them, up to 4000 digits.
        *(2**63, -(2**63) - 1, 2**64, 2**70, -(2**70), 10**3999 + 7, -(10**3999)),
    ],
)
def test_int_and_float_range_edges_are_accepted(value: float) -> None:
    log = Log().append(EventType.USER_MESSAGE, {"n": value, "deep": [{"n": value}]})
    assert log.last is not None
    assert log.last.data["n"] == value
    assert log.last.data["deep"] == [{"n": value}]


def test_data_that_is_not_a_mapping_is_refused() -> None:
    _refuse(_log_of(1), EventType.USER_MESSAGE, ["content", "x"], match="mapping")


# Validation through Log.append: accepted forms ----------------------------------------------


# Every type that takes {"content": ...} (a metadata event holds one record instead).
# The types whose data is free (metadata and erasure events hold one record of their own).
_CONTENT_TYPES = [
    t
    for t in EventType
    if t not in OPERATION_TYPES and t not in (EventType.METADATA, EventType.ERASURE)
]


@pytest.mark.parametrize(
    "data",
    [
        {},
        {"seqs": [], "at": "t", "reason": "r"},
        {"seqs": [-1], "at": "t", "reason": "r"},
        {"seqs": ["1"], "at": "t", "reason": "r"},
        {"seqs": [1], "at": 3, "reason": "r"},
        {"seqs": [1], "at": "t", "reason": "r", "content": "a secret"},
    ],
)
def test_an_erasure_event_holds_exactly_its_record(data: dict[str, object]) -> None:
    _refuse(Log(), EventType.ERASURE, data, match="an erasure event holds exactly")
    event = Log().append(EventType.ERASURE, ERASURE_DATA).last
    assert event is not None
    assert dict(event.data) == ERASURE_DATA


@pytest.mark.parametrize("kind", _CONTENT_TYPES)
def test_type_accepted_as_enum_or_string(kind: EventType) -> None:
    by_enum = Log().append(kind, {"content": "x"}).last
    by_str = Log().append(kind.value, {"content": "x"}).last
    assert by_enum is not None
    assert by_str is not None
    assert by_enum.type is kind
    assert by_str.type is kind
    assert type(by_str.type) is EventType


@pytest.mark.parametrize(
    "op",
    [
        pytest.param(["replace", 1, 3], id="list"),
        pytest.param(("replace", 1, 3), id="tuple"),
        pytest.param(Replace(1, 3), id="replace-value"),
    ],
)
def test_surface_op_forms_are_stored_as_the_list(op: object) -> None:
    log = _log_of(5).append(EventType.SYSTEM_MESSAGE, {"content": "s", "surface_op": op})
    event = log.last
    assert event is not None
    stored = event.data["surface_op"]
    assert type(stored) is list
    assert stored == ["replace", 1, 3]
    assert event.surface_op == Replace(1, 3)
    assert event.position == 1
    assert [e.seq for e in log.surface()] == [0, 5, 4]


@pytest.mark.parametrize("kind", _CONTENT_TYPES)
def test_surface_op_none_means_no_op(kind: EventType) -> None:
    log = _log_of(3).append(kind, {"content": "s", "surface_op": None})
    event = log.last
    assert event is not None
    assert event.surface_op is None
    assert event.position == 3
    expected_surface = [0, 1, 2, 3] if kind in SURFACE_TYPES else [0, 1, 2]
    assert [e.seq for e in log.surface()] == expected_surface


def test_data_none_means_empty() -> None:
    event = Log().append(EventType.TURN_START).last
    assert event is not None
    assert dict(event.data) == {}
    assert event.surface_op is None


def test_tuples_in_data_are_stored_as_lists() -> None:
    log = Log().append(EventType.USER_MESSAGE, {"a": (1, (2, 3)), "b": {"c": ((4,), [5, (6,)])}})
    event = log.last
    assert event is not None
    assert event.data["a"] == [1, [2, 3]]
    assert type(event.data["a"]) is list
    assert type(event.data["a"][1]) is list  # type: ignore[index]
    b = event.data["b"]
    assert b == {"c": [[4], [5, [6]]]}
    c = b["c"]  # type: ignore[index,call-overload]
    assert type(c) is list
    assert type(c[0]) is list
    assert type(c[1][1]) is list


def test_log_keeps_a_deep_copy_of_data() -> None:
    nested = {"tags": ["a", "b"], "inner": {"k": [1, {"deep": "v"}]}}
    data: dict[str, Any] = {"content": "hi", "metadata": nested}
    log = Log().append(EventType.USER_MESSAGE, data)
    before = log.derive_messages()[0]
    # Mutate the caller's objects at every depth.
    data["content"] = "changed"
    data["extra"] = 1
    nested["tags"].append("c")  # type: ignore[attr-defined]
    nested["inner"]["k"][1]["deep"] = "changed"  # type: ignore[index]
    nested["inner"]["new"] = True  # type: ignore[index]
    del nested["tags"][0]  # type: ignore[attr-defined]
    event = log.last
    assert event is not None
    assert dict(event.data) == {
        "content": "hi",
        "metadata": {"tags": ["a", "b"], "inner": {"k": [1, {"deep": "v"}]}},
    }
    assert log.derive_messages()[0] == before
    assert log.derive_messages()[0].metadata == {
        "tags": ["a", "b"],
        "inner": {"k": [1, {"deep": "v"}]},
    }


def test_deep_copy_even_for_a_list_given_twice() -> None:
    shared = [1, 2]
    log = Log().append(EventType.USER_MESSAGE, {"a": shared, "b": shared})
    shared.append(3)
    event = log.last
    assert event is not None
    assert event.data["a"] == [1, 2]
    assert event.data["b"] == [1, 2]


def test_event_data_is_read_only_at_the_top_level() -> None:
    log = Log().append(EventType.USER_MESSAGE, {"content": "hi"})
    event = log.last
    assert event is not None
    with pytest.raises(TypeError):
        event.data["content"] = "changed"  # type: ignore[index]
    with pytest.raises(TypeError):
        del event.data["content"]  # type: ignore[attr-defined]
    assert dict(event.data) == {"content": "hi"}
    assert log.derive_messages()[0].content == "hi"


def test_event_is_frozen() -> None:
    event = Log().append(EventType.USER_MESSAGE, {"content": "hi"}).last
    assert event is not None
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        event.seq = 5  # type: ignore[misc]
    assert event.seq == 0


# Time ---------------------------------------------------------------------------------------


def test_time_defaults_to_now_aware_utc() -> None:
    before = datetime.now(UTC)
    event = Log().append(EventType.USER_MESSAGE, {"content": "hi"}).last
    after = datetime.now(UTC)
    assert event is not None
    assert event.time.tzinfo is not None
    assert event.time.utcoffset() == timedelta(0)
    assert event.time.tzinfo == UTC
    assert before <= event.time <= after


def test_explicit_utc_time_is_kept_with_microseconds() -> None:
    event = Log().append(EventType.USER_MESSAGE, {"content": "hi"}, time=T0).last
    assert event is not None
    assert event.time == T0
    assert event.time.microsecond == 123456
    assert event.time.tzinfo == UTC


def test_aware_non_utc_time_is_stored_in_utc() -> None:
    local = datetime(2024, 5, 1, 14, 0, 0, 42, tzinfo=timezone(timedelta(hours=2)))
    event = Log().append(EventType.USER_MESSAGE, {"content": "hi"}, time=local).last
    assert event is not None
    assert event.time == local
    assert event.time.utcoffset() == timedelta(0)
    assert event.time.tzinfo == UTC
    assert (event.time.hour, event.time.microsecond) == (12, 42)


def test_naive_time_is_refused() -> None:
    log = _log_of(2)
    before = list(log.events())
    with pytest.raises(InvalidEventError, match=r"aware|naive"):
        log.append(EventType.USER_MESSAGE, {"content": "hi"}, time=datetime(2024, 5, 1, 12))
    assert log.count == 2
    assert list(log.events()) == before


def test_naive_time_is_refused_by_append_at() -> None:
    log = _log_of(2)
    with pytest.raises(InvalidEventError, match=r"aware|naive"):
        log.append_at(5, EventType.USER_MESSAGE, {"content": "hi"}, time=datetime(2024, 5, 1))
    assert log.count == 2


def test_a_message_event_may_say_when_its_message_was_written() -> None:
    # A compaction's summary is dated to the first message it replaced, by an event dated when
    # it was applied: the projection takes the message's time from the data's created_at.
    written = datetime(2024, 5, 1, 9, 30, tzinfo=UTC)
    log = Log().append(EventType.USER_MESSAGE, {"content": "hi"})
    log = log.append(
        EventType.SYSTEM_MESSAGE,
        {"content": "summary", "surface_op": ["replace", 0, 0], "created_at": written.isoformat()},
    )
    (summary,) = log.derive_messages()
    assert summary.created_at == written
    assert log.events()[1].time > written


@pytest.mark.parametrize("created_at", ["yesterday", "2024-05-01T09:30:00", 12])
def test_a_message_time_without_offset_or_not_a_time_is_refused(created_at: object) -> None:
    log = Log()
    with pytest.raises(InvalidEventError, match=r'data\["created_at"\] must be an ISO 8601'):
        log.append(EventType.USER_MESSAGE, {"content": "hi", "created_at": created_at})
    assert log.count == 0
