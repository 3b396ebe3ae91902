"""Messages: what the model sees, one frozen value per turn.

A :class:`Message` is a plain value with no behaviour beyond a few read-only properties. The
builders (:meth:`Message.system`, :meth:`Message.developer`, :meth:`Message.user`,
:meth:`Message.assistant`, :meth:`Message.tool`) are the usual way to make one. Nothing here
checks how fields combine (a user message may carry tool calls): the log must be able to project
any valid event, so the message type does not second-guess it.

Content is a string, None, or an ordered tuple of typed parts (see :mod:`nous_session.parts`):
text, images, thinking (with the provider's signature), references placing a tool call among
them, a provider's own block kept verbatim, and :class:`~nous_session.parts.OtherPart` for any
other JSON object. Every part is also a read-only mapping of its JSON form, so code written for
the plain ``{"type": "text", "text": ...}`` mappings of earlier versions keeps working, and
such mappings are still accepted wherever parts are.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any, Final, TypeAlias, TypeGuard

import attrs

from nous_session._json import JSON, copy_json_object, dumps
from nous_session._trusted import trusted_builder
from nous_session.parts import (
    OtherPart,
    Part,
    ProviderData,
    TextPart,
    as_part,
    optional_str,
    provider_data,
    provider_data_json,
    read_only_json_object,
)

__all__ = ["ContentPart", "Message", "Role", "ToolCall", "utc_datetime"]

ContentPart: TypeAlias = Mapping[str, JSON]
"""One part of a multi-part content, as accepted: a typed part (:mod:`nous_session.parts`,
each also a mapping of its JSON form) or a plain JSON object with a string ``type`` such as
``{"type": "text", "text": ...}``, which is read into the typed part it stands for."""

_EMPTY: Mapping[str, Any] = MappingProxyType({})


class Role(enum.StrEnum):
    """Who a message is from. A ``str`` enum: ``Role.USER == "user"``."""

    SYSTEM = "system"
    DEVELOPER = "developer"
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


def _arguments(value: object) -> Mapping[str, JSON] | str:
    if isinstance(value, str):
        return value
    return read_only_json_object(value, "tool call arguments")


def _call_provider_data(value: object) -> ProviderData:
    return provider_data(value, "ToolCall.provider_data")


@attrs.frozen(unsafe_hash=False)  # holds read-only mappings, which cannot hash
class ToolCall:
    """A function call the model asked for.

    ``arguments`` is kept as given: a mapping (stored as a read-only JSON copy) or a JSON string
    (not parsed). OpenAI sends a string, Anthropic and Gemini an object; the converters of
    :mod:`nous_session.formats` translate between the two.

    Attributes:
        id: the call id the result refers to (OpenAI ``call_id``, Anthropic ``tool_use.id``,
            Gemini ``functionCall.id``; ``""`` when the provider gave none).
        name: the function's name.
        arguments: a read-only JSON object, or a string as the model wrote it.
        item_id: the provider's id of the item carrying the call (OpenAI Responses
            ``function_call.id``, ``fc_...``), or None.
        status: the provider's status of that item (``"completed"``...), or None.
        provider_data: per provider, the call's fields with no neutral equivalent (see
            :mod:`nous_session.parts`).
    """

    id: str = attrs.field(validator=attrs.validators.instance_of(str))
    name: str = attrs.field(validator=attrs.validators.instance_of(str))
    arguments: Mapping[str, JSON] | str = attrs.field(factory=dict, converter=_arguments)
    item_id: str | None = attrs.field(
        default=None, validator=optional_str("ToolCall.item_id"), kw_only=True
    )
    status: str | None = attrs.field(
        default=None, validator=optional_str("ToolCall.status"), kw_only=True
    )
    provider_data: ProviderData = attrs.field(
        default=_EMPTY, converter=_call_provider_data, kw_only=True
    )

    @classmethod
    def coerce(cls, obj: object) -> ToolCall:
        """Make a ToolCall from a ToolCall, a flat mapping, or OpenAI's nested form.

        Accepted: ``ToolCall(...)``; ``{"id", "name", "arguments"}`` (optionally with
        ``item_id``, ``status`` and ``provider_data``, the form the log stores); and
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
        if source is obj and ("item_id" in obj or "status" in obj or "provider_data" in obj):
            return cls(
                ident,
                name,
                obj.get("arguments", {}),
                item_id=obj.get("item_id"),
                status=obj.get("status"),
                provider_data=obj.get("provider_data"),
            )
        return cls(ident, name, source.get("arguments", {}))

    @classmethod
    def trusted(
        cls,
        ident: str,
        name: str,
        arguments: Mapping[str, JSON] | str,
        item_id: str | None = None,
        status: str | None = None,
        provider_data: ProviderData = _EMPTY,
    ) -> ToolCall:
        """Internal, for the log's decoding: build without checks or copies, from fields the
        log has already validated."""
        call = object.__new__(cls)
        _set = object.__setattr__
        _set(call, "id", ident)
        _set(call, "name", name)
        _set(call, "arguments", arguments)
        _set(call, "item_id", item_id)
        _set(call, "status", status)
        _set(call, "provider_data", provider_data)
        return call

    def to_json(self) -> dict[str, JSON]:
        """The flat ``{"id", "name", "arguments"}`` form, as the log stores it.

        ``item_id``, ``status`` and ``provider_data`` are added only when set.
        """
        arguments = self.arguments
        data: dict[str, JSON] = {
            "id": self.id,
            "name": self.name,
            "arguments": arguments if isinstance(arguments, str) else copy_json_object(arguments),
        }
        if self.item_id is not None:
            data["item_id"] = self.item_id
        if self.status is not None:
            data["status"] = self.status
        if self.provider_data:
            data["provider_data"] = provider_data_json(self.provider_data)
        return data


def _content(value: object) -> str | tuple[Part, ...] | None:
    if value is None or type(value) is str:
        return value
    if isinstance(value, str):
        return value
    if not isinstance(value, list | tuple):
        raise ValueError(
            "content must be a string, None, or a list of content parts, "
            f"not {type(value).__name__}"
        )
    return tuple(as_part(part, f"content[{index}]") for index, part in enumerate(value))


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
    return read_only_json_object(value, "metadata")


_ROLE_BY_VALUE: dict[object, Role] = {role.value: role for role in Role}


def _role(value: object) -> Role:
    if type(value) is Role:
        return value
    try:
        return _ROLE_BY_VALUE[value]
    except (KeyError, TypeError):  # TypeError: unhashable, so no role either
        roles = ", ".join(role.value for role in Role)
        raise ValueError(f"unknown role {value!r}; a role is one of {roles}") from None


def _created_at(value: object) -> datetime:
    return utc_datetime(value, "created_at")


def _is_error(_instance: object, _attribute: object, value: object) -> None:
    if type(value) is not bool:
        raise ValueError(f"is_error must be a bool, not {type(value).__name__}")


def _message_provider_data(value: object) -> ProviderData:
    return provider_data(value, "provider_data")


def _is_part_sequence(value: object) -> TypeGuard[Sequence[Part]]:
    return (
        isinstance(value, list | tuple)
        and bool(value)
        and all(isinstance(item, _PART_CLASSES) for item in value)
    )


_PART_CLASSES: tuple[type, ...] = Part.__args__


@attrs.frozen(unsafe_hash=False)  # holds read-only mappings, which cannot hash
class Message:
    """One message of a conversation, as the model sees it.

    Prefer the builders. ``content`` is a string, None, or a tuple of content parts (a list is
    accepted and stored as a tuple; plain mappings are read with
    :func:`~nous_session.parts.as_part`); ``tool_calls`` entries go through
    :meth:`ToolCall.coerce`; ``metadata`` must be JSON and is copied into a read-only mapping;
    ``created_at`` is an aware datetime stored in UTC (default: now).

    ``is_error`` marks a tool result that reports a failure (Anthropic's ``is_error``).
    ``provider_data`` holds, per provider, the message's fields that have no neutral equivalent,
    as :mod:`nous_session.formats` needs them to give back a provider's exact form. Neither
    ``metadata`` nor ``created_at`` is sent to a model.

    Raises:
        ValueError: a field has the wrong type, an unknown role, non-JSON metadata, or a naive
            ``created_at``.
    """

    role: Role = attrs.field(converter=_role)
    content: str | tuple[Part, ...] | None = attrs.field(default=None, converter=_content)
    reasoning_content: str | None = attrs.field(
        default=None, validator=optional_str("reasoning_content")
    )
    tool_calls: tuple[ToolCall, ...] = attrs.field(default=(), converter=_tool_calls)
    tool_call_id: str | None = attrs.field(default=None, validator=optional_str("tool_call_id"))
    name: str | None = attrs.field(default=None, validator=optional_str("name"))
    metadata: Mapping[str, JSON] = attrs.field(default=_EMPTY, converter=_metadata)
    created_at: datetime = attrs.field(factory=_now, converter=_created_at)
    is_error: bool = attrs.field(default=False, validator=_is_error, kw_only=True)
    provider_data: ProviderData = attrs.field(
        default=_EMPTY, converter=_message_provider_data, kw_only=True
    )

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
    def developer(
        cls,
        content: str | Iterable[ContentPart] | None,
        *,
        name: str | None = None,
        metadata: Mapping[str, JSON] | None = None,
        created_at: datetime | None = None,
    ) -> Message:
        """A developer message: instructions from the application (OpenAI's ``developer`` role).

        Providers without the role get it as a system message, and say so.

        Args:
            content: the text, or content parts.
            name: an optional participant name.
            metadata: JSON kept with the message, never sent to a model.
            created_at: an aware datetime (default: now).

        Returns:
            The message, with ``role`` ``Role.DEVELOPER``.

        Raises:
            ValueError: as the constructor.
        """
        return cls._build(
            Role.DEVELOPER, content, name=name, metadata=metadata, created_at=created_at
        )

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
        if (
            type(content) is str
            and name is None
            and metadata is None
            and (created_at is None or (type(created_at) is datetime and created_at.tzinfo is UTC))
        ):
            # The common case, with nothing to check or copy: build the value directly.
            return _trusted_message(
                Role.USER,
                content,
                None,
                (),
                None,
                None,
                _EMPTY,
                _now() if created_at is None else created_at,
            )
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
        is_error: bool = False,
        metadata: Mapping[str, JSON] | None = None,
        created_at: datetime | None = None,
    ) -> Message:
        """The result of the tool call ``tool_call_id``.

        A string result is kept as is; a non-empty list of content parts
        (:mod:`nous_session.parts` instances, such as text and images) becomes the content;
        anything else is encoded as compact UTF-8 JSON. ``name`` is the function's name (Gemini
        needs it); ``is_error`` marks a failed call.

        Raises:
            ValueError: ``result`` cannot be encoded as JSON.
        """
        if _is_part_sequence(result):
            result = list(result)
        elif not isinstance(result, str):
            try:
                result = dumps(result, default=None).decode()
            except TypeError as e:
                raise ValueError(f"tool result is not JSON-serialisable: {e}") from None
        return cls._build(
            Role.TOOL,
            result,
            tool_call_id=tool_call_id,
            name=name,
            is_error=is_error,
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

    # Properties ----------------------------------------------------------------------------

    @property
    def text(self) -> str:
        """The text: string content as is, text parts joined with ``""``, ``""`` for None.

        Text parts are the :class:`~nous_session.parts.TextPart` ones and any
        :class:`~nous_session.parts.OtherPart` of type ``"text"``; thinking is not text.
        """
        content = self.content
        if content is None:
            return ""
        if isinstance(content, str):
            return content
        texts: list[str] = []
        for part in content:
            if type(part) is TextPart:
                texts.append(part.text)
            elif type(part) is OtherPart and part.data.get("type") == "text":
                text = part.data["text"]
                assert isinstance(text, str)  # an OtherPart of type "text" has a string text
                texts.append(text)
        return "".join(texts)

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
                content if isinstance(content, str) else [part.to_json() for part in content]
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
        if self.is_error:
            data["is_error"] = True
        if self.provider_data:
            data["provider_data"] = provider_data_json(self.provider_data)
        return data


_trusted_message: Final = trusted_builder(Message)
"""Build a Message without checks or copies, for the constructors' common case (see
:func:`~nous_session._trusted.trusted_builder`)."""
