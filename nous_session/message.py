"""Messages: what the model sees, one frozen value per turn.

A :class:`Message` is a plain value with no behaviour beyond a few read-only properties. The
builders (:meth:`Message.system`, :meth:`Message.user`, :meth:`Message.assistant`,
:meth:`Message.tool`) are the usual way to make one. Nothing here checks how fields combine (a
user message may carry tool calls): the log must be able to project any valid event, so the
message type does not second-guess it.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any, TypeAlias

import attrs
import orjson

from nous_session._json import JSON, NotJSONError, copy_json, copy_json_object

__all__ = ["ContentPart", "Message", "Role", "ToolCall", "utc_datetime"]

ContentPart: TypeAlias = Mapping[str, JSON]
"""One part of a multi-part content: ``{"type": "text", "text": ...}``,
``{"type": "image_url", "url": ...}``, or any other JSON object with a string ``type``."""

_EMPTY: Mapping[str, JSON] = MappingProxyType({})


class Role(enum.StrEnum):
    """Who a message is from. A ``str`` enum: ``Role.USER == "user"``."""

    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"


def utc_datetime(value: object, what: str = "time") -> datetime:
    """Return ``value`` as a timezone-aware UTC datetime (microseconds kept).

    Raises:
        ValueError: ``value`` is not a datetime, or is naive (has no UTC offset).
    """
    if type(value) is datetime and value.tzinfo is UTC:
        return value
    if not isinstance(value, datetime):
        raise ValueError(f"{what} must be a datetime, not {type(value).__name__}")
    if value.utcoffset() is None:
        raise ValueError(f"{what} must be timezone-aware, got the naive {value.isoformat()}")
    try:
        return value.astimezone(UTC)
    except OverflowError:
        raise ValueError(
            f"{what} {value.isoformat()} is out of range: in UTC it falls outside the years"
            " 1 to 9999"
        ) from None


def _now() -> datetime:
    return datetime.now(UTC)


def _optional_str(what: str) -> Any:
    def check(_instance: object, _attribute: object, value: object) -> None:
        if value is not None and not isinstance(value, str):
            raise ValueError(f"{what} must be a string or None, not {type(value).__name__}")

    return check


def _read_only_json_object(value: object, what: str) -> Mapping[str, JSON]:
    if not isinstance(value, Mapping):
        raise ValueError(f"{what} must be a mapping, not {type(value).__name__}")
    try:
        return MappingProxyType(copy_json_object(value))
    except NotJSONError as e:
        raise ValueError(f"{e.where(what)}: {e.reason}") from None


def _arguments(value: object) -> Mapping[str, JSON] | str:
    if isinstance(value, str):
        return value
    return _read_only_json_object(value, "tool call arguments")


@attrs.frozen(unsafe_hash=False)  # holds read-only mappings, which cannot hash
class ToolCall:
    """A function call the model asked for.

    ``arguments`` is kept as given: a mapping (stored as a read-only JSON copy) or a JSON string
    (not parsed).
    """

    id: str = attrs.field(validator=attrs.validators.instance_of(str))
    name: str = attrs.field(validator=attrs.validators.instance_of(str))
    arguments: Mapping[str, JSON] | str = attrs.field(factory=dict, converter=_arguments)

    @classmethod
    def coerce(cls, obj: object) -> ToolCall:
        """Make a ToolCall from a ToolCall, a flat mapping, or OpenAI's nested form.

        Accepted: ``ToolCall(...)``; ``{"id", "name", "arguments"}``; and
        ``{"id", "type": "function", "function": {"name", "arguments"}}``. A missing
        ``arguments`` means ``{}``.

        Raises:
            ValueError: ``obj`` is none of these; the message names the missing or bad field.
        """
        if isinstance(obj, ToolCall):
            return obj
        if not isinstance(obj, Mapping):
            raise ValueError(
                f"a tool call must be a ToolCall or a mapping, not {type(obj).__name__}"
            )
        source: Mapping[Any, Any] = obj
        if "function" in obj:
            function = obj["function"]
            if not isinstance(function, Mapping):
                raise ValueError('a tool call\'s "function" must be a mapping')
            source = function
        missing = [key for key in ("id",) if key not in obj] + [
            key for key in ("name",) if key not in source
        ]
        if missing:
            raise ValueError(f"a tool call needs {' and '.join(map(repr, missing))}: {dict(obj)!r}")
        ident, name = obj["id"], source["name"]
        if not isinstance(ident, str) or not isinstance(name, str):
            raise ValueError(f"a tool call's id and name must be strings: {dict(obj)!r}")
        return cls(ident, name, source.get("arguments", {}))

    @classmethod
    def _trusted(cls, ident: str, name: str, arguments: Mapping[str, JSON] | str) -> ToolCall:
        """Build without checks or copies, from fields the log has already validated."""
        call = object.__new__(cls)
        _set = object.__setattr__
        _set(call, "id", ident)
        _set(call, "name", name)
        _set(call, "arguments", arguments)
        return call

    def to_json(self) -> dict[str, JSON]:
        """The flat ``{"id", "name", "arguments"}`` form, as the log stores it."""
        arguments = self.arguments
        return {
            "id": self.id,
            "name": self.name,
            "arguments": arguments if isinstance(arguments, str) else copy_json_object(arguments),
        }


def _content(value: object) -> str | tuple[ContentPart, ...] | None:
    if value is None or type(value) is str:
        return value
    if isinstance(value, str):
        return value
    if not isinstance(value, list | tuple):
        raise ValueError(
            "content must be a string, None, or a list of content parts, "
            f"not {type(value).__name__}"
        )
    parts = []
    for index, part in enumerate(value):
        what = f"content[{index}]"
        frozen = _read_only_json_object(part, what)
        kind = frozen.get("type")
        if not isinstance(kind, str):
            raise ValueError(f'{what} needs a string "type"')
        if kind == "text" and not isinstance(frozen.get("text"), str):
            raise ValueError(f'{what} is a text part without a string "text"')
        parts.append(frozen)
    return tuple(parts)


def _tool_calls(value: object) -> tuple[ToolCall, ...]:
    if value == ():
        return ()
    if isinstance(value, tuple) and all(type(call) is ToolCall for call in value):
        return value
    if isinstance(value, str | bytes | Mapping) or not isinstance(value, Iterable):
        raise ValueError(f"tool_calls must be a sequence of tool calls, not {type(value).__name__}")
    return tuple(ToolCall.coerce(call) for call in value)


def _metadata(value: object) -> Mapping[str, JSON]:
    if value is None or value is _EMPTY:
        return _EMPTY
    if type(value) is MappingProxyType and not value:
        return _EMPTY
    return _read_only_json_object(value, "metadata")


def _role(value: object) -> Role:
    if type(value) is Role:
        return value
    try:
        return Role(value)  # type: ignore[arg-type]
    except ValueError:
        roles = ", ".join(role.value for role in Role)
        raise ValueError(f"unknown role {value!r}; a role is one of {roles}") from None


def _created_at(value: object) -> datetime:
    return utc_datetime(value, "created_at")


@attrs.frozen(unsafe_hash=False)  # holds read-only mappings, which cannot hash
class Message:
    """One message of a conversation, as the model sees it.

    Prefer the builders. ``content`` is a string, None, or a tuple of content parts (a list is
    accepted and stored as a tuple); ``tool_calls`` entries go through :meth:`ToolCall.coerce`;
    ``metadata`` must be JSON and is copied into a read-only mapping; ``created_at`` is an
    aware datetime stored in UTC (default: now).

    Raises:
        ValueError: a field has the wrong type, an unknown role, non-JSON metadata, or a naive
            ``created_at``.
    """

    role: Role = attrs.field(converter=_role)
    content: str | tuple[ContentPart, ...] | None = attrs.field(default=None, converter=_content)
    reasoning_content: str | None = attrs.field(
        default=None, validator=_optional_str("reasoning_content")
    )
    tool_calls: tuple[ToolCall, ...] = attrs.field(default=(), converter=_tool_calls)
    tool_call_id: str | None = attrs.field(default=None, validator=_optional_str("tool_call_id"))
    name: str | None = attrs.field(default=None, validator=_optional_str("name"))
    metadata: Mapping[str, JSON] = attrs.field(default=_EMPTY, converter=_metadata)
    created_at: datetime = attrs.field(factory=_now, converter=_created_at)

    # Builders -------------------------------------------------------------------------------

    @classmethod
    def system(
        cls,
        content: str | Iterable[ContentPart] | None,
        *,
        name: str | None = None,
        metadata: Mapping[str, JSON] | None = None,
        created_at: datetime | None = None,
    ) -> Message:
        """A system message."""
        return cls._build(Role.SYSTEM, content, name=name, metadata=metadata, created_at=created_at)

    @classmethod
    def user(
        cls,
        content: str | Iterable[ContentPart] | None,
        *,
        name: str | None = None,
        metadata: Mapping[str, JSON] | None = None,
        created_at: datetime | None = None,
    ) -> Message:
        """A user message."""
        return cls._build(Role.USER, content, name=name, metadata=metadata, created_at=created_at)

    @classmethod
    def assistant(
        cls,
        content: str | Iterable[ContentPart] | None = None,
        *,
        tool_calls: Iterable[ToolCall | Mapping[str, Any]] = (),
        reasoning_content: str | None = None,
        name: str | None = None,
        metadata: Mapping[str, JSON] | None = None,
        created_at: datetime | None = None,
    ) -> Message:
        """An assistant message, optionally calling tools and carrying its reasoning."""
        return cls._build(
            Role.ASSISTANT,
            content,
            tool_calls=tool_calls,
            reasoning_content=reasoning_content,
            name=name,
            metadata=metadata,
            created_at=created_at,
        )

    @classmethod
    def tool(
        cls,
        tool_call_id: str,
        result: object,
        *,
        name: str | None = None,
        metadata: Mapping[str, JSON] | None = None,
        created_at: datetime | None = None,
    ) -> Message:
        """The result of the tool call ``tool_call_id``.

        A string result is kept as is; anything else is encoded as compact UTF-8 JSON.

        Raises:
            ValueError: ``result`` cannot be encoded as JSON.
        """
        if not isinstance(result, str):
            try:
                result = orjson.dumps(result).decode()
            except TypeError as e:
                raise ValueError(f"tool result is not JSON-serialisable: {e}") from None
        return cls._build(
            Role.TOOL,
            result,
            tool_call_id=tool_call_id,
            name=name,
            metadata=metadata,
            created_at=created_at,
        )

    @classmethod
    def _build(
        cls,
        role: Role,
        content: object,
        *,
        created_at: datetime | None,
        **fields: Any,
    ) -> Message:
        if content is not None and not isinstance(content, str | list | tuple | bytes | Mapping):
            # Any other iterable of parts (a generator, say) is materialised here; a single
            # part, bytes and other values go on to the constructor, which names the problem.
            content = list(content) if isinstance(content, Iterable) else content
        if created_at is None:
            created_at = _now()
        return cls(role, content, created_at=created_at, **fields)

    @classmethod
    def _trusted(
        cls,
        role: Role,
        content: str | tuple[ContentPart, ...] | None,
        reasoning_content: str | None,
        tool_calls: tuple[ToolCall, ...],
        tool_call_id: str | None,
        name: str | None,
        metadata: Mapping[str, JSON],
        created_at: datetime,
    ) -> Message:
        """Build without checks or copies, from fields the log has already validated.

        Only for the projection of a logged event (``event.to_message``): every argument
        must already have the type and form the constructor would give it.
        """
        message = object.__new__(cls)
        _set = object.__setattr__
        _set(message, "role", role)
        _set(message, "content", content)
        _set(message, "reasoning_content", reasoning_content)
        _set(message, "tool_calls", tool_calls)
        _set(message, "tool_call_id", tool_call_id)
        _set(message, "name", name)
        _set(message, "metadata", metadata)
        _set(message, "created_at", created_at)
        return message

    # Properties ----------------------------------------------------------------------------

    @property
    def text(self) -> str:
        """The text: string content as is, text parts joined with ``""``, ``""`` for None."""
        content = self.content
        if content is None:
            return ""
        if isinstance(content, str):
            return content
        return "".join(
            part["text"]  # type: ignore[misc]
            for part in content
            if part.get("type") == "text"
        )

    @property
    def is_system(self) -> bool:
        """True for a system message."""
        return self.role is Role.SYSTEM

    @property
    def has_tool_calls(self) -> bool:
        """True when the message carries at least one tool call."""
        return bool(self.tool_calls)

    @property
    def is_tool_related(self) -> bool:
        """True for a tool message, or an assistant message with tool calls."""
        return self.role is Role.TOOL or (self.role is Role.ASSISTANT and bool(self.tool_calls))

    def to_json(self) -> dict[str, JSON]:
        """The message's fields as JSON, defaults left out (the data of its log event)."""
        data: dict[str, JSON] = {}
        content = self.content
        if content is not None:
            data["content"] = (
                content if isinstance(content, str) else [copy_json(part) for part in content]
            )
        if self.reasoning_content is not None:
            data["reasoning_content"] = self.reasoning_content
        if self.tool_calls:
            data["tool_calls"] = [call.to_json() for call in self.tool_calls]
        if self.tool_call_id is not None:
            data["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            data["name"] = self.name
        if self.metadata:
            data["metadata"] = copy_json_object(self.metadata)
        return data
