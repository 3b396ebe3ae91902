"""The record codec: lossless round trips (property-based) and clear errors for bad records."""

from __future__ import annotations

import os
import uuid
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from nous_session import CorruptRecordError, EventType, Log, Message, SessionActor, ToolCall
from nous_session._json import dumps, loads
from nous_session.codec import FORMAT_VERSION, decode, encode, from_json, to_json
from nous_session.event import OPERATION_TYPES, SURFACE_TYPES, Event, make_event

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.integers(-(10**400), 10**400),  # wider than 64 bits: the standard library's way
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
                [
                    t
                    for t in EventType
                    if t not in SURFACE_TYPES
                    and t not in OPERATION_TYPES
                    # These hold one record each, not free JSON.
                    and t not in (EventType.METADATA, EventType.ERASURE)
                ]
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
    text = dumps(to_json(event))
    assert from_json(loads(text)) == event


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
        (b'[1,0,"user_message",0,{"n":1' + b"0" * 4000 + b"}]", "more than 4000 digits"),
        (b'[1,0,"user_message",0,{"n":NaN,"m":12345678901234567890123}]', "not a valid record"),
        (b'[1,0,"user_message",0,{"n":"\\ud800","m":12345678901234567890123}]', "surrogate"),
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


# Integers wider than 64 bits ------------------------------------------------------------------

WIDE = [2**63, 2**64 - 1, 2**64, -(2**63) - 1, 2**70, -(2**70), 10**400 + 1, -(10**400)]


@pytest.mark.parametrize(
    "value", WIDE, ids=["2^63", "2^64-1", "2^64", "-2^63-1", "2^70", "-2^70", "1e400+1", "-1e400"]
)
def test_an_int_wider_than_64_bits_round_trips_exactly(value: int) -> None:
    """orjson refuses these on encode and reads them as floats (or not at all, past a
    float's range): the record still gives back the very int."""
    log = Log().append("turn_end", {"n": value, "deep": [{"n": value}], "f": 1.5})
    event = log.events()[0]
    record = encode(event)
    decoded = decode(record)
    assert decoded == event
    assert type(decoded.data["n"]) is int
    assert decoded.data["deep"][0]["n"] == value
    assert encode(decoded) == record


@pytest.mark.parametrize("value", [2.0**64, -(2.0**63), 1e300, -1e300])
def test_a_large_float_stays_a_float(value: float) -> None:
    """A float past 2**63 makes the decoder look again; it must come back a float, even
    beside digits that look like a wide int."""
    data = {"f": value, "note": "order 1234567890123456789012345"}
    event = Log().append("turn_end", data).events()[0]
    decoded = decode(encode(event))
    assert decoded == event
    assert type(decoded.data["f"]) is float


def test_a_plain_record_is_still_orjson_bytes() -> None:
    """The fast path is untouched: an event without a wide int encodes exactly as orjson
    writes it."""
    data = {"n": 2**64 - 1, "f": 1e300, "s": "x" * 30, "l": [1, None, True]}
    event = Log().append("turn_end", data).events()[0]
    micros = (event.time - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)
    assert encode(event) == orjson.dumps([1, 0, "turn_end", micros, data])


@pytest.mark.anyio
@pytest.mark.parametrize("store_kind", ["sqlite", "postgresql"])
async def test_a_wide_int_survives_a_real_store(
    anyio_backend: object, store_kind: str, tmp_path: Path
) -> None:
    """Through SQLite and PostgreSQL (both store codec records), a reopened session gives
    back the ints a message, a tool call and a custom event held."""
    if store_kind == "sqlite":
        url = f"sqlite:///{tmp_path / 'wide.sqlite3'}"
    else:
        url = os.environ.get("NOUS_SESSION_TEST_POSTGRES", "")
        if not url:
            pytest.skip("NOUS_SESSION_TEST_POSTGRES is not set")
    session_id = f"wide-{uuid.uuid4().hex}"
    call = ToolCall("c1", "transfer", {"amount": 2**70, "account": -(2**64)})
    async with SessionActor.open(session_id=session_id, store=url) as session:
        await session.add_message(Message.user("pay", metadata={"id": 10**30}))
        await session.add_message(Message.assistant("", tool_calls=[call]))
        await session.append("x.test.ledger", {"balance": [2**100, 0.5]})
        written = list(session.log.events())
    async with SessionActor.open(session_id=session_id, store=url) as session:
        assert list(session.log.events()) == written
        user, assistant = session.messages()
        assert user.metadata["id"] == 10**30
        assert assistant.tool_calls[0].arguments["amount"] == 2**70
        assert session.log.events()[-1].data["balance"][0] == 2**100
        await session.store.delete(session_id)
