"""Events: the entries of the append-only log, and how a surface event becomes a Message.

An :class:`Event` is a frozen value: its ``seq``, its :class:`EventType`, its JSON ``data`` and
its ``time``. Events are made by the log (``Log.append`` and friends) through :func:`make_event`,
which validates them and keeps its own deep copy of the data. A surface event may carry a
surface operation (:mod:`nous_session.ops`), stored as ``data["surface_op"]`` and parsed into
``event.op`` when the event is made (see :mod:`nous_session.log` for the fold).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any, Final

import attrs

from nous_session._json import JSON, NotJSONError, check_text, copy_json, dumps
from nous_session._trusted import trusted_builder
from nous_session.errors import InvalidEventError
from nous_session.message import Message, Role, ToolCall, utc_datetime
from nous_session.metadata import SessionMetadata
from nous_session.ops import (
    OP_KEY,
    OpError,
    Remove,
    Replace,
    Rewind,
    SurfaceOp,
    Uncompact,
    parse_op,
)
from nous_session.parts import stored_part

__all__ = [
    "MAX_EVENT_SIZE",
    "OPERATION_TYPES",
    "SURFACE_TYPES",
    "TYPE_BY_NAME",
    "Event",
    "EventType",
    "Replace",
    "check_size",
    "event_type_of",
    "is_custom_type",
    "make_event",
    "message_event",
    "prepare",
    "replace_data",
    "replace_entries",
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
    METADATA = "session_metadata"  # the session's metadata record (nous_session.metadata)
    ERASURE = "erasure"  # a store erased events' content (nous_session.erasure)
    # Operation types: each carries one surface operation (nous_session.ops) and nothing else
    # of its own reaches the surface, except a replace's messages.
    REPLACE = "replace"
    REMOVE = "remove"
    REWIND = "rewind"
    UNCOMPACT = "uncompact"


SURFACE_TYPES: Final = (
    EventType.SYSTEM_MESSAGE,
    EventType.USER_MESSAGE,
    EventType.ASSISTANT_MESSAGE,
    EventType.TOOL_RESULT,
    EventType.DEVELOPER_MESSAGE,
)
"""The event types that project into messages, in this order."""

OPERATION_TYPES: Final = (
    EventType.REPLACE,
    EventType.REMOVE,
    EventType.REWIND,
    EventType.UNCOMPACT,
)
"""The event types that exist to carry a surface operation, in this order."""

_SURFACE: Final = frozenset(SURFACE_TYPES)
# Which operation each operation type carries (and must carry).
_OP_OF_TYPE: Final[dict[str, type[SurfaceOp]]] = {
    EventType.REPLACE: Replace,
    EventType.REMOVE: Remove,
    EventType.REWIND: Rewind,
    EventType.UNCOMPACT: Uncompact,
}
# A custom type is namespaced: two or more dot-separated names, like "x.myapp.checkpoint".
_CUSTOM: Final = re.compile(r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)+")
_CUSTOM_MAX: Final = 128
TYPE_BY_NAME: Final[dict[object, EventType]] = {member.value: member for member in EventType}
"""Each EventType by its value (a member also finds itself: a StrEnum hashes as its value).
Read-only by convention."""
_TYPE_OF: Final[dict[Role, EventType]] = {
    Role.SYSTEM: EventType.SYSTEM_MESSAGE,
    Role.USER: EventType.USER_MESSAGE,
    Role.ASSISTANT: EventType.ASSISTANT_MESSAGE,
    Role.TOOL: EventType.TOOL_RESULT,
    Role.DEVELOPER: EventType.DEVELOPER_MESSAGE,
}
# By str: a custom event type is a plain str, and an EventType hashes as its value.
_ROLE_OF: Final[dict[str, Role]] = {event_type: role for role, event_type in _TYPE_OF.items()}
_TYPE_BY_ROLE_NAME: Final[dict[object, EventType]] = {
    role.value: event_type for role, event_type in _TYPE_OF.items()
}


@attrs.frozen(unsafe_hash=False)  # holds read-only mappings, which cannot hash
class Event:
    """One entry of the log.

    Attributes:
        seq: its place in the log; contiguous as appended, with gaps only after a snapshot.
        type: what it records: an :class:`EventType`, or the name of a custom type (a plain
            ``str`` like ``"x.myapp.checkpoint"``).
        data: its JSON payload, read-only at the top level; nested containers belong to the log
            and must not be mutated.
        time: when it happened, timezone-aware UTC.
        op: the surface operation it carries (parsed from ``data["surface_op"]``), or None.
    """

    seq: int
    type: EventType | str
    data: Mapping[str, JSON]
    time: datetime
    op: SurfaceOp | None = None

    @property
    def surface_op(self) -> SurfaceOp | None:
        """The event's surface operation, or None (the same as :attr:`op`)."""
        return self.op

    @property
    def position(self) -> int:
        """Where the event sits on the surface: ``start`` of its range operation (a replace or
        a remove), else its ``seq``."""
        op = self.op
        if type(op) is Replace or type(op) is Remove:
            return op.start
        return self.seq

    @property
    def is_surface(self) -> bool:
        """True for the types that become messages."""
        return self.type in _SURFACE


# Validation ---------------------------------------------------------------------------------


def _parse_op(value: object, seq: int | None) -> SurfaceOp:
    """The operation a ``surface_op`` value stands for, checked against the event's seq."""
    try:
        op = parse_op(value)
        if seq is not None:
            op.check_seq(seq)
    except OpError as e:
        raise _Refusal(str(e)) from None
    return op


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
    _check_message_time(data.get("created_at"), 'data["created_at"]')
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


def _copy_item(copy: dict[str, Any], key: object, value: object) -> None:
    """Copy one item of event data into copy (JSON but for a surface op, kept as given)."""
    if type(key) is not str:
        if not isinstance(key, str):
            raise _Refusal(f"data key {key!r} ({type(key).__name__}) is not a string")
        key = str.__str__(key)
    try:
        check_text(key)
    except NotJSONError as e:
        raise _Refusal(f"data key {key!r}: {e.reason}") from None
    if key == OP_KEY:
        copy[key] = value  # normalised by the caller
        return
    try:
        copy[key] = copy_json(value)
    except NotJSONError as e:
        e.path.append(key)
        raise _Refusal(f"{e.where('data')}: {e.reason}") from None


def is_custom_type(name: object) -> bool:
    """Whether ``name`` is a valid custom event type: namespaced, like ``"x.myapp.checkpoint"``.

    Two or more dot-separated names of ASCII letters, digits, ``_`` and ``-``, at most 128
    characters. Custom events are stored, streamed, exported and kept by snapshots like every
    event, and never reach the surface.
    """
    return (
        isinstance(name, str)
        and len(name) <= _CUSTOM_MAX
        and name.isascii()
        and _CUSTOM.fullmatch(name) is not None
    )


def event_type_of(kind: object, seq: int | None = None) -> EventType | str:
    """The EventType ``kind`` names (a member or its string value), or ``kind`` itself when it
    is a custom type (see :func:`is_custom_type`).

    Raises:
        InvalidEventError: ``kind`` names no event type and is not a custom one.
    """
    event_type = TYPE_BY_NAME.get(kind) if isinstance(kind, str) else None
    if event_type is not None:
        return event_type
    if is_custom_type(kind):
        return str.__str__(kind)
    known = ", ".join(member.value for member in EventType)
    where = "" if seq is None else f"event {seq}: "
    raise InvalidEventError(
        f"{where}unknown event type {kind!r}; known types: {known}; a custom type is"
        ' namespaced, like "x.myapp.checkpoint"'
    )


def prepare(
    kind: object, data: object = None, time: object = None
) -> tuple[EventType | str, dict[str, JSON], datetime]:
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
        # The common chat event, {"content": str}, has nothing more to check.
        if event_type not in _SURFACE or len(copy) != 1 or type(copy.get("content")) is not str:
            _check_rules(event_type, copy, None)
    except _Refusal as e:
        raise InvalidEventError(f"{event_type} event: {e}") from None
    return event_type, copy, when


MAX_EVENT_SIZE: Final = 4 * 1024 * 1024
"""The default limit on one event's size (its data as compact UTF-8 JSON, as stored): 4 MiB.

A chat message is a few kilobytes, a long tool result or a base64 image a few hundred; an
event of many megabytes is a mistake (a whole file or a screenshot pasted into the log) that
every later load, fold, subscriber, fork and export pays for again. ``SessionActor.open(...,
max_event_size=...)`` changes it for one session (``None``: no limit)."""

# What the JSON of one character can take: 6 bytes ("\u001f"), 4 for one outside the BMP.
_WIDEST_CHAR: Final = 6


def check_size(event_type: object, data: Mapping[str, Any], limit: int | None) -> None:
    """Refuse ``data`` (an event's, checked) when its compact UTF-8 JSON is over ``limit``
    bytes (None: no limit).

    Cheap for the common event: a flat object of strings and small scalars is measured by an
    upper bound of its JSON size, without encoding it; only one near the limit or nested is
    encoded to be measured exactly.

    Raises:
        InvalidEventError: naming the event's type, its size and the limit.
    """
    if limit is None:
        return
    if len(data) == 1:  # the common chat event, {"content": str}, in one step
        content = data.get("content")
        if type(content) is str and _WIDEST_CHAR * len(content) + 14 <= limit:
            return
    bound = 2  # {}
    for key, value in data.items():
        t = type(value)
        if t is str:
            bound += _WIDEST_CHAR * (len(key) + len(value)) + 6  # "":"",
        elif value is None or t is bool or t is float:
            bound += _WIDEST_CHAR * len(key) + 28  # (a float takes at most 24)
        else:
            break  # nested, or an int of any width: measured exactly
    else:
        if bound <= limit:
            return
    size = len(dumps(data))
    if size > limit:
        raise InvalidEventError(
            f"{event_type} event: its data is {size:,} bytes as JSON, over the limit of "
            f"{limit:,} bytes (max_event_size, set by SessionActor.open); nothing was appended"
        )


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
            # The common case first: an ASCII key with an ASCII string or another scalar is
            # copied as is (ASCII cannot hold a lone surrogate; anything else is checked).
            if (
                type(key) is str
                and key.isascii()
                and ((t is str and value.isascii()) or value is None or t is bool)
            ):
                copy[key] = value
            else:
                _copy_item(copy, key, value)
    elif data is not None:
        raise _Refusal(f"data must be a mapping, not {data.__class__.__name__}")
    return copy


def _check_rules(event_type: EventType | str, data: dict[str, JSON], seq: int | None) -> Any:
    """The event's own rules; returns its parsed operation (None without one).

    Which operation a type may carry (a surface event only a replace of itself, an operation
    type exactly its own, any other type none), the message fields a surface event holds, and
    the messages of a replace. With ``seq`` None (before the seq is known) the operation is
    parsed but not checked against it.
    """
    value = data.get(OP_KEY)
    op: SurfaceOp | None = None
    if value is not None:
        if event_type in _SURFACE:
            op = _parse_op(value, seq)
            if type(op) is not Replace:
                raise _Refusal(
                    f"a {event_type} event can carry only a replace surface_op, not {op.name}"
                )
        elif event_type in _OP_OF_TYPE:
            op = _parse_op(value, seq)
            if type(op) is not _OP_OF_TYPE[event_type]:
                raise _Refusal(f"a {event_type} event must carry a {event_type} surface_op")
        else:
            raise _Refusal(
                f"a {event_type} event cannot carry a surface_op; only surface types can replace"
            )
        if seq is not None:
            data[OP_KEY] = op.to_json()
    elif event_type in _OP_OF_TYPE:
        raise _Refusal(f'a {event_type} event needs its surface_op ["{event_type}", ...]')
    if event_type in _SURFACE:
        # Most chat events are exactly {"content": str}; anything else gets the full check.
        if len(data) != 1 or type(data.get("content")) is not str:
            _check_surface_fields(data)
    elif event_type is EventType.REPLACE:
        _check_replace_messages(data)
    elif event_type is EventType.METADATA:
        _check_metadata(data)
    elif event_type is EventType.ERASURE:
        _check_erasure(data)
    return op


def _check_erasure(data: dict[str, JSON]) -> None:
    """An erasure event records which seqs a store erased, when and why (no personal text):
    ``{"seqs": [int, ...], "at": ISO time, "reason": text}``."""
    seqs = data.get("seqs")
    if (
        set(data) != {"seqs", "at", "reason"}
        or type(seqs) is not list
        or not seqs
        or not all(type(seq) is int and seq >= 0 for seq in seqs)
        or type(data["at"]) is not str
        or type(data["reason"]) is not str
    ):
        raise _Refusal(
            'an erasure event holds exactly {"seqs": [int >= 0, ...], "at": str, "reason": str}'
        )


def _check_metadata(data: dict[str, JSON]) -> None:
    """A metadata event holds one valid record under ``metadata`` (stores index it)."""
    # An erased one also holds the record of its erasure ("erased", see nous_session.erasure).
    if set(data) not in ({"metadata"}, {"metadata", "erased"}):
        raise _Refusal('a session_metadata event holds exactly {"metadata": {...}}')
    try:
        SessionMetadata.from_json(data["metadata"])
    except ValueError as error:
        raise _Refusal(f"a session_metadata event needs a valid record: {error}") from None


def _check_replace_messages(data: dict[str, JSON]) -> None:
    """A replace event's ``messages``: a list of message objects, each with a known role."""
    messages = data.get("messages")
    if type(messages) is not list:
        raise _Refusal('a replace event needs data["messages"], a list of messages (may be [])')
    for index, item in enumerate(messages):
        where = f'data["messages"][{index}]'
        if type(item) is not dict:
            raise _Refusal(f"{where} must be a message object")
        role = item.get("role")
        if role not in _TYPE_BY_ROLE_NAME:
            roles = ", ".join(role.value for role in _TYPE_OF)
            raise _Refusal(f"{where} has role {role!r}; a role is one of {roles}")
        _check_message_time(item.get("created_at"), f"{where}: created_at")
        fields = {key: value for key, value in item.items() if key not in ("role", "created_at")}
        try:
            _check_surface_fields(fields)
        except _Refusal as e:
            raise _Refusal(f"{where}: {e}") from None


def _check_message_time(created: object, what: str) -> None:
    """Refuse a message's ``created_at`` (``what`` names it) that is neither None nor a
    message time (see :func:`_message_time`)."""
    if created is not None:
        try:
            _message_time(created)
        except ValueError:
            raise _Refusal(
                f"{what} must be an ISO 8601 time with a UTC offset, got {created!r}"
            ) from None


def _message_time(value: object) -> datetime:
    """A replace message's ``created_at`` (ISO 8601 with an offset) as a UTC datetime."""
    if type(value) is not str:
        raise ValueError("not a string")
    return utc_datetime(datetime.fromisoformat(value))


def make_event(
    seq: int, kind: object, data: object = None, time: object = None, *, decoded: bool = False
) -> Event:
    """Validate and build the event that would take ``seq``.

    The event keeps a deep copy of ``data`` (tuples become lists, a surface op becomes
    ``["replace", start, stop]``); ``time`` defaults to now and is stored in UTC.

    The type may be a custom one (:func:`is_custom_type`).

    ``decoded=True`` is for a dict fresh from orjson's decoder, owned by nobody else and JSON
    by construction (the caller has checked that it nests at most ``MAX_DEPTH`` deep and holds
    no float that may be a wider int orjson read approximately): it is taken as is, and only
    the event's own rules (type, surface op, message fields) are checked.

    Raises:
        InvalidEventError: naming the event and what is wrong with it.
    """
    copy: dict[str, JSON]
    # The hot path of every append is inlined: a known type and a UTC time (or none); anything
    # else takes the general helpers.
    event_type: EventType | str | None = TYPE_BY_NAME.get(kind) if isinstance(kind, str) else None
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
        # The common chat event, {"content": str}, has nothing more to check.
        if event_type in _SURFACE and len(copy) == 1 and type(copy.get("content")) is str:
            op = None
        else:
            op = _check_rules(event_type, copy, seq)
    except _Refusal as e:
        raise InvalidEventError(f"event {seq} ({event_type}): {e}") from None
    return Event(seq, event_type, MappingProxyType(copy), when, op)


# Messages <-> events ------------------------------------------------------------------------


def message_event(message: object) -> tuple[EventType, dict[str, JSON]]:
    """The surface event type and data that stand for ``message`` (what ``Log.seed`` appends).

    Tool calls are stored in the flat ``{"id", "name", "arguments"}`` form, so projecting the
    event gives back an equal message. The event's time should be ``message.created_at``.

    Raises:
        InvalidEventError: ``message`` is not a Message, or its role has no event type.
    """
    if not isinstance(message, Message):
        raise InvalidEventError(f"expected a Message, got {type(message).__name__}")
    event_type = _TYPE_OF.get(message.role)
    if event_type is None:
        roles = ", ".join(role.value for role in _TYPE_OF)
        raise InvalidEventError(f"message has role {message.role!r}; a role is one of {roles}")
    data = message.to_json()
    try:
        _check_texts(data)
    except NotJSONError as error:
        raise InvalidEventError(
            f"{event_type} message: {error.where('data')}: {error.reason}"
        ) from None
    return event_type, data


def _check_texts(value: object) -> None:
    """Refuse a lone surrogate anywhere in JSON a Message made (its constructor takes any
    string): no store could encode it, and it would fail the whole batch it is in."""
    if type(value) is str:
        check_text(value)
    elif type(value) is dict:
        for key, item in value.items():
            try:
                check_text(key)
                _check_texts(item)
            except NotJSONError as error:
                error.path.append(key)
                raise
    elif type(value) is list:
        for index, item in enumerate(value):
            try:
                _check_texts(item)
            except NotJSONError as error:
                error.path.append(index)
                raise


def replace_data(start: int, stop: int, messages: Sequence[object]) -> dict[str, JSON]:
    """The data of a ``replace`` event putting ``messages`` (k >= 0) in place of
    ``start..stop``: each message as its JSON with its ``role`` and ``created_at``.

    Raises:
        InvalidEventError: an item is not a Message (or has a role no event type stands for).
        ValueError: the range is malformed.
    """
    items: list[JSON] = []
    for index, message in enumerate(messages):
        try:
            event_type, data = message_event(message)
        except InvalidEventError as error:
            raise InvalidEventError(f"replacement message {index}: {error}") from None
        item: dict[str, JSON] = {"role": _ROLE_OF[event_type].value}
        item.update(data)
        assert isinstance(message, Message)  # message_event refuses anything else
        item["created_at"] = message.created_at.isoformat()
        items.append(item)
    return {OP_KEY: Replace(start, stop).to_json(), "messages": items}


def replace_entries(event: Event) -> list[Event]:
    """The surface entries of a ``replace`` event: one surface event per message it holds,
    each with the event's seq and operation (so it sits at the operation's ``start``), the
    message's type, fields and time (the event's own time when it has none)."""
    entries = []
    messages = event.data.get("messages")
    assert type(messages) is list  # checked when the event was appended
    for item in messages:
        assert type(item) is dict
        fields = dict(item)
        event_type = _TYPE_BY_ROLE_NAME[fields.pop("role")]
        created = fields.pop("created_at", None)
        time = event.time if created is None else _message_time(created)
        entries.append(Event(event.seq, event_type, MappingProxyType(fields), time, event.op))
    return entries


def to_message(event: Event) -> Message:
    """Project a surface event into its Message, field by field.

    The role comes from the type; ``content``, ``reasoning_content``, ``tool_calls``,
    ``tool_call_id``, ``name``, ``metadata``, ``is_error`` and ``provider_data`` from the data
    keys of the same names (missing keys give the defaults); ``created_at`` is the data's
    ``created_at`` (ISO 8601) when it has one, a message written before its event (a
    compaction's summary), else the event's time. Content parts become the typed parts of
    :mod:`nous_session.parts` whose stored form they are exactly, and
    :class:`~nous_session.parts.OtherPart` otherwise, so the content written by earlier
    versions (plain part objects) projects as it did. Other keys never reach the message.

    Raises:
        ValueError: ``event`` is a bookkeeping event.
    """
    role = _ROLE_OF.get(event.type)
    if role is None:
        raise ValueError(f"event {event.seq} is a {event.type} event, not a surface event")
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
    # A message written at another time than its event (a compaction's summary, dated to the
    # first message it replaced, by an event dated when it was applied) says when.
    created = data.get("created_at")
    time = event.time if created is None else _message_time(created)
    # Any: the log validated these when the event was appended (see above).
    calls: Any = data.get("tool_calls")
    metadata: Any = data.get("metadata")
    provider_data: Any = data.get("provider_data")
    return _trusted_message(
        role,
        content,
        data.get("reasoning_content"),
        tuple(_tool_call(call) for call in calls) if calls else (),
        data.get("tool_call_id"),
        data.get("name"),
        MappingProxyType(metadata) if metadata else _NO_METADATA,
        time,
        data.get("is_error") is True,
        _read_only_provider_data(provider_data) if provider_data else _NO_METADATA,
    )


_NO_METADATA: Final[Mapping[str, Any]] = MappingProxyType({})
_trusted_message: Final = trusted_builder(Message)
"""Build a Message without checks or copies: the projection's (see :func:`to_message`)."""


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
        return ToolCall.trusted(call["id"], call["name"], arguments)
    provider_data = call.get("provider_data")
    return ToolCall.trusted(
        call["id"],
        call["name"],
        arguments,
        call.get("item_id"),
        call.get("status"),
        _read_only_provider_data(provider_data) if provider_data else _NO_METADATA,
    )
