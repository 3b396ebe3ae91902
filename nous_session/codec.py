"""Event <-> bytes, with orjson: the record format every persistent store writes.

A record is a versioned JSON envelope::

    [1, seq, "user_message", 1764456701123456, {"content": "hi"}]
     |   |        |                 |                  |
     |   |        |                 |                  data (surface_op as ["replace", s, e])
     |   |        |                 time: microseconds since the Unix epoch, UTC
     |   |        type
     |   seq
     format version

Times are stored as integer microseconds because every event time is UTC with microsecond
precision: the integer is exact, shorter than an ISO string, and faster to decode. Decoding
validates the record as ``Log.append`` validates an event, so a store never hands the log
something it would have refused; any problem raises :class:`CorruptRecordError` naming the
record, never a bare ``KeyError``.

:func:`to_json` / :func:`from_json` give the readable form used for JSON-lines export, with an
ISO 8601 time.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from functools import partial
from types import MappingProxyType
from typing import Any, Final

import orjson

from nous_session._json import JSON, MAX_DEPTH, dumps, exact_loads, may_be_wide
from nous_session.errors import CorruptRecordError, InvalidEventError
from nous_session.event import TYPE_BY_NAME, Event, make_event

__all__ = ["FORMAT_VERSION", "decode", "decode_rows", "encode", "from_json", "to_json"]

FORMAT_VERSION: Final = 1
"""The record format this version writes (and the newest it reads)."""

# The first byte of a record a store sealed (nous_session.stores._sealed); JSON never has it.
_SEALED: Final = b"\x01"
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND: Final = timedelta(microseconds=1)
_INT_MAX: Final = 2**63 - 1
# The highest seq: the session's count after it (seq + 1) must still fit the signed 64-bit
# integer a store keeps it in.
_SEQ_MAX: Final = _INT_MAX - 1
# orjson reads an int wider than 64 bits as a float at least this large.
_WIDE: Final = float(2**63)
# The times a datetime can hold, as microseconds since the epoch (year 1 to 9999).
_MIN_MICROS: Final = (datetime.min.replace(tzinfo=UTC) - _EPOCH) // _MICROSECOND
_MAX_MICROS: Final = (datetime.max.replace(tzinfo=UTC) - _EPOCH) // _MICROSECOND


def _micros(time: datetime) -> int:
    return (time - _EPOCH) // _MICROSECOND


def encode(event: Event) -> bytes:
    """The record for ``event``: compact UTF-8 JSON bytes."""
    # orjson, unless the data holds an int wider than 64 bits (then the standard library).
    return dumps([FORMAT_VERSION, event.seq, event.type, _micros(event.time), event.data])


def decode(
    record: bytes | bytearray | memoryview | str, *, where: str | Callable[[], str] = "record"
) -> Event:
    """The event a record holds.

    Args:
        record: the bytes :func:`encode` made.
        where: how to name the record in an error, e.g. ``'session "a", seq 5'``, or a
            callable that says it (called only when there is an error to report).

    Raises:
        CorruptRecordError: the record is not JSON (garbage or truncated), is not an envelope,
            has a format version this code does not read, or holds an invalid event.
    """
    try:
        value = orjson.loads(record)
    except orjson.JSONDecodeError as error:
        if not isinstance(record, str) and record[:1] == _SEALED:
            raise CorruptRecordError(
                f"{_name(where)}: the record is encrypted: open the store with its"
                " encryption (encryption=Encryption(provider), nous_session.encryption)"
            ) from None
        # An int too wide even for orjson's float reading: the exact reader takes it.
        value = _exact(record) if may_be_wide(record) else None
        if value is None:
            raise CorruptRecordError(
                f"{_name(where)}: not a valid record (garbage or truncated): {error}"
            ) from None
        # The exact reader accepts what orjson would not (an escaped lone surrogate, say):
        # what it read is checked and copied in full.
        return _decode_checked(value, record, where, exact=True)
    event = _chat_record(value)
    if event is not None:
        return event
    return _decode_checked(value, record, _name(where) if not callable(where) else where)


def _chat_record(value: Any) -> Event | None:
    """The event of the common case, checked in one go, or None for every other record.

    A format-1 record whose data is exactly ``{"content": <str>}`` is a valid event of any
    type: no surface op, no message field to check, nothing to copy.
    """
    if type(value) is list and len(value) == 5 and value[0] == FORMAT_VERSION:
        _, seq, kind, micros, data = value
        event_type = TYPE_BY_NAME.get(kind) if type(kind) is str else None
        if (
            event_type is not None
            and type(seq) is int
            and 0 <= seq <= _SEQ_MAX
            and type(micros) is int
            and _MIN_MICROS <= micros <= _MAX_MICROS
            and type(data) is dict
            and len(data) == 1
            and type(data.get("content")) is str
        ):
            return Event(seq, event_type, MappingProxyType(data), _EPOCH + _MICROSECOND * micros)
    return None


def _decode_checked(
    value: Any,
    record: bytes | bytearray | memoryview | str,
    where: str | Callable[[], str],
    *,
    exact: bool = False,
) -> Event:
    """Everything else, checked field by field, each error naming the record.

    ``exact``: ``value`` comes from the standard library's reader, not orjson's.
    """
    if type(value) is not list or not value:
        raise CorruptRecordError(f"{_name(where)}: not a record envelope: {_preview(record)}")
    version = value[0]
    if version != FORMAT_VERSION or type(version) is not int:
        if type(version) is int and version > FORMAT_VERSION:
            raise CorruptRecordError(
                f"{_name(where)}: written in record format {version} by a newer nous_session; "
                f"this one reads format {FORMAT_VERSION}"
            )
        raise CorruptRecordError(f"{_name(where)}: unknown record format {version!r}")
    if len(value) != 5:
        raise CorruptRecordError(
            f"{_name(where)}: a format-1 record has 5 fields, this one has {len(value)}"
        )
    _, seq, kind, micros, data = value
    if type(seq) is not int or not 0 <= seq <= _SEQ_MAX:
        raise CorruptRecordError(f"{_name(where)}: bad seq {seq!r}")
    if type(micros) is not int:
        raise CorruptRecordError(f"{_name(where)}: bad time {micros!r}")
    if type(data) is not dict:
        raise CorruptRecordError(f"{_name(where)}: data is not an object")
    try:
        time = _EPOCH + _MICROSECOND * micros  # exact integer arithmetic, and the fastest form
    except OverflowError:
        raise CorruptRecordError(f"{_name(where)}: time {micros} is out of range") from None
    # orjson yields only JSON types, but reads an int wider than 64 bits as a float: such a
    # record is read again exactly. Either way, data nested too deeply goes the slow way,
    # where the copy refuses it by name.
    plain = not exact and _plain(data)
    if not plain and not exact and may_be_wide(record):
        again = _exact(record)
        if type(again) is list and len(again) == 5 and type(again[4]) is dict:
            data = again[4]
    return _validated(seq, kind, data, time, _name(where), decoded=plain)


def _exact(record: bytes | bytearray | memoryview | str) -> Any:
    """The record read by the exact (standard library) reader, or None if it is not JSON."""
    try:
        return exact_loads(record)
    except ValueError:
        return None


def _name(where: str | Callable[[], str]) -> str:
    return where() if callable(where) else where


def decode_rows(rows: Iterable[tuple[int, bytes]], place: Callable[[int], str]) -> list[Event]:
    """Decode stored ``(seq, record)`` rows, checking each record holds its row's seq.

    The bulk form of :func:`decode` for a store's load: the common chat record is taken in one
    check inside the loop (this runs for every row of every session opened), and an error's
    location, ``place(seq)``, is only formatted when there is an error.

    Raises:
        CorruptRecordError: a record cannot be decoded or holds another seq.
    """
    events: list[Event] = []
    # Building a session's events allocates a few objects per row, all of them kept: pausing
    # the cyclic collector meanwhile saves the repeated full scans that would find nothing to
    # free (a bulk load's usual trick; it is switched back on, and never left off).
    collecting = gc.isenabled()
    gc.disable()
    try:
        _decode_rows_into(events, rows, place)
    finally:
        if collecting:
            gc.enable()
    return events


def _decode_rows_into(
    events: list[Event], rows: Iterable[tuple[int, bytes]], place: Callable[[int], str]
) -> None:
    append = events.append
    loads, types, epoch, micro = orjson.loads, TYPE_BY_NAME, _EPOCH, _MICROSECOND
    for seq, record in rows:
        try:
            value = loads(record)
        except orjson.JSONDecodeError:
            value = None
        # _chat_record's check, inlined on purpose: calling it per row measured 1.93-1.99x
        # raw on stores.open_session against 1.6-1.8x inline (target <= 2x). Keep the two in
        # step; the row's own seq stands in for the range check.
        if type(value) is list and len(value) == 5 and value[0] == FORMAT_VERSION:
            _, held_seq, kind, micros, data = value
            event_type = types.get(kind) if type(kind) is str else None
            if (
                event_type is not None
                and held_seq == seq
                and type(held_seq) is int
                and type(micros) is int
                and _MIN_MICROS <= micros <= _MAX_MICROS
                and type(data) is dict
                and len(data) == 1
                and type(data.get("content")) is str
            ):
                append(Event(seq, event_type, MappingProxyType(data), epoch + micro * micros))
                continue
        # Anything else, or a bad record: decode() checks it and names the problem.
        event = decode(record, where=partial(place, seq))
        if event.seq != seq:
            raise CorruptRecordError(f"{place(seq)}: the record holds seq {event.seq}")
        append(event)


def to_json(event: Event) -> dict[str, JSON]:
    """A readable JSON object for ``event``: ``{"seq", "type", "time" (ISO 8601), "data"}``."""
    return {
        "seq": event.seq,
        "type": str(event.type),
        "time": event.time.isoformat(),
        "data": dict(event.data),
    }


def from_json(value: Any, *, where: str = "record") -> Event:
    """The event a :func:`to_json` object describes.

    Raises:
        CorruptRecordError: the object is malformed or holds an invalid event.
    """
    if not isinstance(value, dict):
        raise CorruptRecordError(f"{where}: expected a JSON object, got {type(value).__name__}")
    missing = [key for key in ("seq", "type", "time", "data") if key not in value]
    if missing:
        raise CorruptRecordError(f"{where}: missing {', '.join(missing)}")
    seq, time = value["seq"], value["time"]
    if type(seq) is not int or not 0 <= seq <= _SEQ_MAX:
        raise CorruptRecordError(f"{where}: bad seq {seq!r}")
    try:
        when = datetime.fromisoformat(time)
    except (TypeError, ValueError):
        raise CorruptRecordError(f"{where}: bad time {time!r}") from None
    return _validated(seq, value["type"], value["data"], when, where)


def _validated(
    seq: int, kind: object, data: object, time: datetime, where: str, *, decoded: bool = False
) -> Event:
    try:
        return make_event(seq, kind, data, time, decoded=decoded)
    except InvalidEventError as error:
        raise CorruptRecordError(f"{where}: {error}") from None


def _plain(value: dict[str, Any] | list[Any], depth: int = 0) -> bool:
    """Whether decoded JSON can be taken as is: nested at most MAX_DEPTH deep, and no float
    in it so large that it may be a wide int orjson read approximately."""
    if depth > MAX_DEPTH:
        return False
    # A plain loop: this runs for every record a store loads, mostly over string values.
    items: Any = value.values() if type(value) is dict else value
    for item in items:
        kind = type(item)
        if kind is float:
            if not -_WIDE < item < _WIDE:
                return False
        elif (kind is dict or kind is list) and not _plain(item, depth + 1):
            return False
    return True


def _preview(record: object, size: int = 60) -> str:
    text = repr(record)
    return text if len(text) <= size else text[:size] + "..."
