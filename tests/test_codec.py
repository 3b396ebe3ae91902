"""The record codec: lossless round trips (property-based) and clear errors for bad records."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from nous_session import CorruptRecordError, EventType, Log
from nous_session.codec import FORMAT_VERSION, decode, encode, from_json, to_json
from nous_session.event import OPERATION_TYPES, SURFACE_TYPES, Event, make_event

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(),
)
json_values = st.recursive(
    json_scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(st.text(), children, max_size=4)
    ),
    max_leaves=20,
)
times = st.datetimes(
    min_value=datetime(1970, 1, 1),
    max_value=datetime(9999, 12, 31),
    timezones=st.sampled_from([UTC, timezone(timedelta(hours=5, minutes=30)), UTC]),
)


@st.composite
def events(draw: st.DrawFn) -> Event:
    """Any valid event: bookkeeping with free JSON, or a surface event with message fields."""
    seq = draw(st.integers(0, 2**40))
    if draw(st.booleans()):
        kind = draw(
            st.sampled_from(
                [t for t in EventType if t not in SURFACE_TYPES and t not in OPERATION_TYPES]
            )
        )
        data = draw(st.dictionaries(st.text(), json_values, max_size=5))
        data.pop("surface_op", None)
    else:
        kind = draw(st.sampled_from(SURFACE_TYPES))
        data = draw(
            st.fixed_dictionaries(
                {},
                optional={
                    "content": st.one_of(
                        st.none(),
                        st.text(),
                        st.lists(st.builds(lambda t: {"type": "text", "text": t}, st.text())),
                    ),
                    "name": st.text(),
                    "metadata": st.dictionaries(st.text(), json_values, max_size=3),
                    "tool_calls": st.lists(
                        st.fixed_dictionaries(
                            {
                                "id": st.text(),
                                "name": st.text(),
                                "arguments": st.one_of(
                                    st.text(), st.dictionaries(st.text(), json_values, max_size=3)
                                ),
                            }
                        ),
                        max_size=2,
                    ),
                    "extra": json_values,
                },
            )
        )
        if seq > 0 and draw(st.booleans()):
            start = draw(st.integers(0, seq - 1))
            data["surface_op"] = ["replace", start, start + draw(st.integers(0, 50))]
    return make_event(seq, kind, data, draw(times))


@given(events())
def test_any_valid_event_round_trips_through_bytes(event: Event) -> None:
    decoded = decode(encode(event))
    assert decoded == event
    assert decoded.time.tzinfo is UTC
    assert decoded.time.microsecond == event.time.microsecond
    assert encode(decoded) == encode(event)  # byte-stable


@given(events())
def test_any_valid_event_round_trips_through_readable_json(event: Event) -> None:
    text = orjson.dumps(to_json(event))
    assert from_json(orjson.loads(text)) == event


def test_the_envelope_is_versioned_and_compact() -> None:
    time = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
    log = Log().append("user_message", {"content": "hi"}, time=time)
    log = log.append("system_message", {"content": "s", "surface_op": ("replace", 0, 0)}, time=time)
    first, second = (encode(event) for event in log.events())
    micros = int((time - datetime(1970, 1, 1, tzinfo=UTC)).total_seconds()) * 10**6 + 678901
    assert first == f'[1,0,"user_message",{micros},{{"content":"hi"}}]'.encode()
    assert orjson.loads(second)[4]["surface_op"] == ["replace", 0, 0]
    assert FORMAT_VERSION == 1


@pytest.mark.parametrize(
    ("record", "message"),
    [
        (b"\x00\xffgarbage", "not a valid record"),
        (b'[1,0,"user_message",0,{"content":"h', "garbage or truncated"),
        (b"", "not a valid record"),
        (b'{"seq": 0}', "not a record envelope"),
        (b"[]", "not a record envelope"),
        (b'[2,0,"user_message",0,{}]', "newer nous_session"),
        (b'["1",0,"user_message",0,{}]', "unknown record format"),
        (b'[1,0,"user_message",0]', "has 5 fields, this one has 4"),
        (b'[1,-3,"user_message",0,{}]', "bad seq"),
        (b'[1,0,"user_message","noon",{}]', "bad time"),
        (b'[1,0,"user_message",0,[1]]', "data is not an object"),
        (b'[1,0,"dance",0,{}]', "unknown event type"),
        (b'[1,0,"user_message",0,{"content":5}]', "content"),
        (b'[1,3,"turn_end",0,{"surface_op":["replace",0,1]}]', "cannot carry a surface_op"),
        (b'[1,3,"user_message",0,{"surface_op":["replace",3,4]}]', "not below"),
        (b'[1,0,"user_message",0,{"n":18446744073709551615}]', "64-bit"),
        (b'[1,0,"user_message",999999999999999999,{}]', "out of range"),
    ],
)
def test_bad_records_raise_a_clear_error_naming_the_record(record: bytes, message: str) -> None:
    with pytest.raises(CorruptRecordError, match=message) as caught:
        decode(record, where='session "s" seq 7')
    assert str(caught.value).startswith('session "s" seq 7: ')


def test_from_json_names_what_is_missing() -> None:
    with pytest.raises(CorruptRecordError, match="missing time, data"):
        from_json({"seq": 1, "type": "user_message"}, where="line 3")
    with pytest.raises(CorruptRecordError, match="expected a JSON object"):
        from_json([1, 2], where="line 3")
    with pytest.raises(CorruptRecordError, match="bad time"):
        from_json({"seq": 1, "type": "user_message", "time": "yesterday", "data": {}})


def test_decoding_keeps_no_reference_to_shared_state() -> None:
    record = encode(Log().append("user_message", {"metadata": {"k": [1]}}).events()[0])
    first, second = decode(record), decode(record)
    assert first == second
    assert first.data["metadata"] is not second.data["metadata"]
