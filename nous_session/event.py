"""Events: the entries of the append-only log, and how a surface event becomes a Message.

An :class:`Event` is a frozen value: its ``seq``, its :class:`EventType`, its JSON ``data`` and
its ``time``. Events are made by the log (``Log.append`` and friends) through :func:`make_event`,
which validates them and keeps its own deep copy of the data. A surface event may carry a
``surface_op``: ``["replace", start, stop]``, which puts it on the surface in place of the range
of positions ``start..stop`` (see :mod:`nous_session.log` for the fold).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any, Final

import attrs

from nous_session._json import JSON, NotJSONError, copy_json
from nous_session.errors import InvalidEventError
from nous_session.message import Message, Role, ToolCall, _trusted_message, utc_datetime
from nous_session.parts import stored_part

__all__ = [
    "SURFACE_TYPES",
    "TYPE_BY_NAME",
    "Event",
    "EventType",
    "Replace",
    "event_type_of",
    "make_event",
    "message_event",
    "prepare",
    "to_message",
]


class EventType(enum.StrEnum):
    """What an event records. A ``str`` enum: ``EventType.USER_MESSAGE == "user_message"``."""

    # Surface types: these become messages.
    SYSTEM_MESSAGE = "system_message"
    USER_MESSAGE = "user_message"
    ASSISTANT_MESSAGE = "assistant_message"
    TOOL_RESULT = "tool_result"
    DEVELOPER_MESSAGE = "developer_message"
    # Bookkeeping types: recorded, never shown to the model.
    TOOL_CALL = "tool_call"
    TURN_START = "turn_start"
    TURN_END = "turn_end"
    STEP_START = "step_start"
    STEP_END = "step_end"
    REQUEST_HEADER = "request_header"


SURFACE_TYPES: Final = (
    EventType.SYSTEM_MESSAGE,
    EventType.USER_MESSAGE,
    EventType.ASSISTANT_MESSAGE,
    EventType.TOOL_RESULT,
    EventType.DEVELOPER_MESSAGE,
)
"""The event types that project into messages, in this order."""

_SURFACE: Final = frozenset(SURFACE_TYPES)
_INT_MAX: Final = 2**63 - 1
TYPE_BY_NAME: Final[dict[object, EventType]] = {member.value: member for member in EventType}
"""Each EventType by its value (a member also finds itself: a StrEnum hashes as its value).
Read-only by convention."""
_ROLE_OF: Final = {
    EventType.SYSTEM_MESSAGE: Role.SYSTEM,
    EventType.USER_MESSAGE: Role.USER,
    EventType.ASSISTANT_MESSAGE: Role.ASSISTANT,
    EventType.TOOL_RESULT: Role.TOOL,
    EventType.DEVELOPER_MESSAGE: Role.DEVELOPER,
}
_TYPE_OF: Final = {role: event_type for event_type, role in _ROLE_OF.items()}


def _non_negative_int(_instance: object, attribute: attrs.Attribute[int], value: object) -> None:
    if type(value) is not int:
        raise ValueError(f"Replace.{attribute.name} must be an int, not {type(value).__name__}")
    if value < 0:
        raise ValueError(f"Replace.{attribute.name} must be >= 0, got {value}")


@attrs.frozen
class Replace:
    """The one surface op: put the event in place of the positions ``start..stop`` (inclusive).

    Raises:
        ValueError: ``start`` or ``stop`` is not an int, is negative, or ``start > stop``.
    """

    start: int = attrs.field(validator=_non_negative_int)
    stop: int = attrs.field(validator=_non_negative_int)

    def __attrs_post_init__(self) -> None:
        if self.start > self.stop:
            raise ValueError(f"Replace start {self.start} is after stop {self.stop}")

    def to_json(self) -> list[JSON]:
        """The form stored in event data: ``["replace", start, stop]``."""
        return ["replace", self.start, self.stop]


@attrs.frozen(unsafe_hash=False)  # holds read-only mappings, which cannot hash
class Event:
    """One entry of the log.

    Attributes:
        seq: its place in the log; contiguous as appended, with gaps only after a snapshot.
        type: what it records.
        data: its JSON payload, read-only at the top level; nested containers belong to the log
            and must not be mutated.
        time: when it happened, timezone-aware UTC.
    """

    seq: int
    type: EventType
    data: Mapping[str, JSON]
    time: datetime

    @property
    def surface_op(self) -> Replace | None:
        """The event's :class:`Replace`, or None."""
        op = self.data.get("surface_op")
        return None if op is None else Replace(op[1], op[2])  # type: ignore[index,arg-type]

    @property
    def position(self) -> int:
        """Where the event sits on the surface: ``start`` of its replace, else its ``seq``."""
        op = self.data.get("surface_op")
        return self.seq if op is None else op[1]  # type: ignore[index,return-value]

    @property
    def is_surface(self) -> bool:
        """True for the types that become messages."""
        return self.type in _SURFACE


# Validation ---------------------------------------------------------------------------------


def _op_list(value: object, seq: int) -> list[JSON] | None:
    """Normalise a ``surface_op`` to ``["replace", start, stop]`` (or None), or say why not."""
    if value is None:
        return None
    if isinstance(value, Replace):
        start, stop = value.start, value.stop
    else:
        if (
            type(value) not in (list, tuple)
            or len(value) != 3  # type: ignore[arg-type]
            or value[0] != "replace"  # type: ignore[index]
        ):
            raise _Refusal(
                f'malformed surface_op {value!r}: the only op is ["replace", start, stop]'
            )
        _, start, stop = value  # type: ignore[misc]
        if type(start) is not int or type(stop) is not int:
            raise _Refusal(f"malformed surface_op {value!r}: start and stop must be ints")
        if stop > _INT_MAX:
            raise _Refusal(f"malformed surface_op {value!r}: stop is beyond 64 bits")
        if start < 0 or start > stop:
            raise _Refusal(f"malformed surface_op {value!r}: needs 0 <= start <= stop")
    if start >= seq:
        raise _Refusal(
            f"surface_op replaces from position {start}, which is not below the event's own seq"
        )
    return ["replace", start, stop]


class _Refusal(Exception):
    """Internal: why an event is invalid, before the event's identity is prefixed."""


def _check_surface_fields(data: dict[str, JSON]) -> None:
    """Refuse message fields the projection could not turn into a Message."""
    for key in ("reasoning_content", "tool_call_id", "name"):
        value = data.get(key)
        if value is not None and type(value) is not str:
            raise _Refusal(f'data["{key}"] must be a string or null')
    content = data.get("content")
    if content is not None and type(content) is not str:
        if type(content) is not list:
            raise _Refusal('data["content"] must be a string, null, or a list of content parts')
        for index, part in enumerate(content):
            if type(part) is not dict or type(part.get("type")) is not str:
                raise _Refusal(f'data["content"][{index}] must be an object with a string "type"')
            if part["type"] == "text" and type(part.get("text")) is not str:
                raise _Refusal(f'data["content"][{index}] is a text part without a string "text"')
    calls = data.get("tool_calls")
    if calls is not None:
        if type(calls) is not list:
            raise _Refusal('data["tool_calls"] must be a list of tool calls')
        for index, call in enumerate(calls):
            try:
                ToolCall.coerce(call)
            except ValueError as e:
                raise _Refusal(f'data["tool_calls"][{index}]: {e}') from None
    metadata = data.get("metadata")
    if metadata is not None and type(metadata) is not dict:
        raise _Refusal('data["metadata"] must be an object or null')
    is_error = data.get("is_error")
    if is_error is not None and type(is_error) is not bool:
        raise _Refusal('data["is_error"] must be a bool or null')
    provider_data = data.get("provider_data")
    if provider_data is not None:
        if type(provider_data) is not dict:
            raise _Refusal('data["provider_data"] must be an object or null')
        for key, entry in provider_data.items():
            if type(entry) is not dict:
                raise _Refusal(f'data["provider_data"]["{key}"] must be an object')


def _copy_item(copy: dict[str, JSON], key: object, value: object) -> None:
    if type(key) is not str:
        if not isinstance(key, str):
            raise _Refusal(f"data key {key!r} ({type(key).__name__}) is not a string")
        key = str.__str__(key)
    if key == "surface_op":
        copy[key] = value  # type: ignore[assignment]  # normalised by the caller
        return
    try:
        copy[key] = copy_json(value)
    except NotJSONError as e:
        e.path.append(key)
        raise _Refusal(f"{e.where('data')}: {e.reason}") from None


def event_type_of(kind: object, seq: int | None = None) -> EventType:
    """The EventType ``kind`` names (a member or its string value).

    Raises:
        InvalidEventError: ``kind`` names no event type.
    """
    event_type = TYPE_BY_NAME.get(kind) if isinstance(kind, str) else None
    if event_type is None:
        known = ", ".join(member.value for member in EventType)
        where = "" if seq is None else f"event {seq}: "
        raise InvalidEventError(f"{where}unknown event type {kind!r}; known types: {known}")
    return event_type


def prepare(
    kind: object, data: object = None, time: object = None
) -> tuple[EventType, dict[str, JSON], datetime]:
    """Validate and copy what :func:`make_event` needs, before the event's seq is known.

    For a caller that hands the event to someone else (the SessionActor): the copy is taken
    now, so changing ``data`` afterwards changes nothing, and errors surface in the caller.
    Give the result to ``make_event(seq, *prepared, decoded=True)``, which checks what depends
    on the seq (a surface op must start below it).

    Raises:
        InvalidEventError: the type, data or time is invalid.
    """
    event_type = event_type_of(kind)
    try:
        when = _time(time)
        copy = _copy_data(data)
        if "surface_op" in copy:
            _check_op_allowed(event_type, copy)
        if event_type in _SURFACE and (len(copy) != 1 or type(copy.get("content")) is not str):
            _check_surface_fields(copy)
    except _Refusal as e:
        raise InvalidEventError(f"{event_type.value} event: {e}") from None
    return event_type, copy, when


def _time(time: object) -> datetime:
    if time is None:
        return datetime.now(UTC)
    if type(time) is datetime and time.tzinfo is UTC:
        return time
    try:
        return utc_datetime(time)
    except (TypeError, ValueError) as e:
        raise _Refusal(str(e)) from None


def _copy_data(data: object) -> dict[str, JSON]:
    """A validated deep copy of event data; a surface op is kept as given, for _op_list."""
    copy: dict[str, JSON] = {}
    if type(data) is dict or (data is not None and isinstance(data, Mapping)):
        for key, value in data.items():
            t = type(value)
            # The common case first: a string key with a scalar value is copied as is.
            if type(key) is str and (t is str or value is None or t is bool):
                copy[key] = value
            else:
                _copy_item(copy, key, value)
    elif data is not None:
        raise _Refusal(f"data must be a mapping, not {data.__class__.__name__}")
    return copy


def _check_op_allowed(event_type: EventType, data: dict[str, JSON]) -> None:
    if event_type not in _SURFACE and data.get("surface_op") is not None:
        raise _Refusal(
            f"a {event_type.value} event cannot carry a surface_op; only surface types can replace"
        )


def make_event(
    seq: int, kind: object, data: object = None, time: object = None, *, decoded: bool = False
) -> Event:
    """Validate and build the event that would take ``seq``.

    The event keeps a deep copy of ``data`` (tuples become lists, a surface op becomes
    ``["replace", start, stop]``); ``time`` defaults to now and is stored in UTC.

    ``decoded=True`` is for a dict fresh from a JSON decoder, owned by nobody else and JSON by
    construction (the caller has checked that no integer can exceed 64 bits): it is taken as
    is, and only the event's own rules (type, surface op, message fields) are checked.

    Raises:
        InvalidEventError: naming the event and what is wrong with it.
    """
    copy: dict[str, JSON]
    # The hot path of every append is inlined: a known type and a UTC time (or none); anything
    # else takes the general helpers.
    event_type = TYPE_BY_NAME.get(kind) if isinstance(kind, str) else None
    if event_type is None:
        event_type = event_type_of(kind, seq)  # raises, naming the type
    try:
        if time is None:
            when = datetime.now(UTC)
        elif type(time) is datetime and time.tzinfo is UTC:
            when = time
        else:
            when = _time(time)
        copy = data if decoded and type(data) is dict else _copy_data(data)
        if "surface_op" in copy:
            _check_op_allowed(event_type, copy)
            copy["surface_op"] = _op_list(copy["surface_op"], seq)
        # Most chat events are exactly {"content": str}; anything else gets the full check.
        if event_type in _SURFACE and (len(copy) != 1 or type(copy.get("content")) is not str):
            _check_surface_fields(copy)
    except _Refusal as e:
        raise InvalidEventError(f"event {seq} ({event_type.value}): {e}") from None
    return Event(seq, event_type, MappingProxyType(copy), when)


# Messages <-> events ------------------------------------------------------------------------


def message_event(message: object) -> tuple[EventType, dict[str, JSON]]:
    """The surface event type and data that stand for ``message`` (what ``Log.seed`` appends).

    Tool calls are stored in the flat ``{"id", "name", "arguments"}`` form, so projecting the
    event gives back an equal message. The event's time should be ``message.created_at``.

    Raises:
        InvalidEventError: ``message`` is not a Message.
    """
    if not isinstance(message, Message):
        raise InvalidEventError(f"expected a Message, got {type(message).__name__}")
    return _TYPE_OF[message.role], message.to_json()


def to_message(event: Event) -> Message:
    """Project a surface event into its Message, field by field.

    The role comes from the type; ``content``, ``reasoning_content``, ``tool_calls``,
    ``tool_call_id``, ``name``, ``metadata``, ``is_error`` and ``provider_data`` from the data
    keys of the same names (missing keys give the defaults); ``created_at`` is the event's time.
    Content parts become the typed parts of :mod:`nous_session.parts` whose stored form they
    are exactly, and :class:`~nous_session.parts.OtherPart` otherwise, so the content written by
    earlier versions (plain part objects) projects as it did. Other keys never reach the
    message.

    Raises:
        ValueError: ``event`` is a bookkeeping event.
    """
    role = _ROLE_OF.get(event.type)
    if role is None:
        raise ValueError(f"event {event.seq} is a {event.type.value} event, not a surface event")
    # The log validated these fields when the event was appended (make_event), so the message
    # is assembled without running the constructor's checks and copies again. Its containers
    # are read-only views of the log's own data, which nothing mutates.
    data = event.data
    content: Any = data.get("content")
    if len(data) == 1 and type(content) is str:  # the common {"content": str}
        return _trusted_message(
            role, content, None, (), None, None, _NO_METADATA, event.time, False, _NO_METADATA
        )
    if type(content) is list:
        content = tuple(stored_part(part) for part in content)
    calls = data.get("tool_calls")
    metadata = data.get("metadata")
    provider_data: Any = data.get("provider_data")
    return _trusted_message(
        role,
        content,
        data.get("reasoning_content"),
        tuple(_tool_call(call) for call in calls) if calls else (),  # type: ignore[union-attr]
        data.get("tool_call_id"),
        data.get("name"),
        MappingProxyType(metadata) if metadata else _NO_METADATA,  # type: ignore[arg-type]
        event.time,
        data.get("is_error") is True,
        _read_only_provider_data(provider_data) if provider_data else _NO_METADATA,
    )


_NO_METADATA: Final[Mapping[str, Any]] = MappingProxyType({})


def _read_only_provider_data(value: dict[str, dict[str, JSON]]) -> Mapping[str, Any]:
    return MappingProxyType({key: MappingProxyType(entry) for key, entry in value.items()})


def _tool_call(call: Any) -> ToolCall:
    if "function" in call:  # OpenAI's nested form, as appended
        return ToolCall.coerce(call)
    arguments = call.get("arguments", {})
    if type(arguments) is dict:
        arguments = MappingProxyType(arguments)
    size = len(call)
    if size == 2 or (size == 3 and "arguments" in call):  # {"id", "name"[, "arguments"]}
        return ToolCall._trusted(call["id"], call["name"], arguments)
    provider_data = call.get("provider_data")
    return ToolCall._trusted(
        call["id"],
        call["name"],
        arguments,
        call.get("item_id"),
        call.get("status"),
        _read_only_provider_data(provider_data) if provider_data else _NO_METADATA,
    )
