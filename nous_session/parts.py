"""Content parts: the typed, ordered pieces of a message's content.

A :class:`~nous_session.message.Message` whose content is not a plain string holds a tuple of
parts, in the order the model saw or wrote them:

* :class:`TextPart`: text.
* :class:`ImagePart`: an image by URL, by base64 data with its media type, or by a provider's
  file id; OpenAI's ``detail`` rides along.
* :class:`ThinkingPart`: the model's reasoning, with the opaque signature (Anthropic's
  ``signature``, Gemini's ``thoughtSignature``, OpenAI's ``encrypted_content``) of the provider
  that issued it, and OpenAI's reasoning summary and item id.
* :class:`RedactedThinkingPart`: reasoning the provider handed over only as opaque data.
* :class:`ToolCallPart`: where the message's ``tool_calls[index]`` sits among the other parts
  (Anthropic and Gemini interleave text, thinking and tool calls).
* :class:`ProviderPart`: a block of one provider's own format that has no neutral equivalent
  (an Anthropic document, an OpenAI file input, a Gemini code execution result...), verbatim.
* :class:`OtherPart`: any other JSON object with a string ``type``, kept exactly as given. This
  is what content parts of earlier versions that are none of the above become.

Every part is a frozen value and also a read-only ``Mapping`` of its JSON form (the form the
log stores, ``part.to_json()``), so ``part["type"]``, ``part.get("text")`` and ``dict(part)``
work as they did for plain mappings, and a part equals a mapping with the same JSON.

``provider_data`` on a part (and on messages and tool calls) holds, per provider name, the
fields of that provider's form which have no neutral field (Anthropic's ``cache_control``, an
OpenAI annotation list, a Gemini ``thoughtSignature`` on a text part...). A provider's entry is
sent back only to that provider; see :mod:`nous_session.formats`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Any, ClassVar, TypeAlias, TypeVar

import attrs

from nous_session._json import JSON, NotJSONError, copy_json, copy_json_object

__all__ = [
    "ImagePart",
    "OtherPart",
    "Part",
    "ProviderData",
    "ProviderPart",
    "RedactedThinkingPart",
    "TextPart",
    "ThinkingPart",
    "ToolCallPart",
    "as_part",
]

ProviderData: TypeAlias = Mapping[str, Mapping[str, JSON]]
"""Per provider name, that provider's fields with no neutral equivalent (read-only)."""

_EMPTY: Mapping[str, Any] = MappingProxyType({})


def read_only_json_object(value: object, what: str) -> Mapping[str, JSON]:
    """A read-only copy of a JSON object (parts, messages and tool calls keep theirs so).

    Raises:
        ValueError: ``value`` is not a mapping of JSON, named by ``what``.
    """
    if not isinstance(value, Mapping):
        raise ValueError(f"{what} must be a mapping, not {type(value).__name__}")
    try:
        return MappingProxyType(copy_json_object(value))
    except NotJSONError as e:
        raise ValueError(f"{e.where(what)}: {e.reason}") from None


def provider_data(value: object, what: str = "provider_data") -> ProviderData:
    """Validate and copy a ``provider_data`` value into read-only mappings.

    Args:
        value: None, or a mapping of provider name to a JSON object.
        what: how error messages name the value.

    Returns:
        A read-only mapping of read-only JSON objects (a shared empty one for None or empty).

    Raises:
        ValueError: ``value`` is not such a mapping, or holds non-JSON values.
    """
    if value is None or value is _EMPTY:
        return _EMPTY
    if not isinstance(value, Mapping):
        raise ValueError(f"{what} must be a mapping, not {type(value).__name__}")
    if not value:
        return _EMPTY
    out: dict[str, Mapping[str, JSON]] = {}
    for key, entry in value.items():
        if not isinstance(key, str):
            raise ValueError(f"{what} keys must be provider names (strings), not {key!r}")
        out[str.__str__(key)] = read_only_json_object(entry, f"{what}[{key!r}]")
    return MappingProxyType(out)


def provider_data_json(value: ProviderData) -> dict[str, JSON]:
    """The JSON form of a ``provider_data`` value (a deep copy).

    Args:
        value: a validated ``provider_data`` mapping.

    Returns:
        Plain dicts the caller owns.
    """
    return {key: copy_json_object(entry) for key, entry in value.items()}


def _stored_provider_data(value: object) -> ProviderData | None:
    """The read-only form of stored (JSON) provider data, or None when it is not one."""
    if type(value) is not dict or not value:
        return None
    for entry in value.values():
        if type(entry) is not dict:
            return None
    return MappingProxyType({key: MappingProxyType(entry) for key, entry in value.items()})


def optional_str(what: str) -> Any:
    """An attrs validator: a string or None, else a ValueError naming ``what``."""

    def check(_instance: object, _attribute: object, value: object) -> None:
        if value is not None and not isinstance(value, str):
            raise ValueError(f"{what} must be a string or None, not {type(value).__name__}")

    return check


def _str(what: str) -> Any:
    def check(_instance: object, _attribute: object, value: object) -> None:
        if not isinstance(value, str):
            raise ValueError(f"{what} must be a string, not {type(value).__name__}")

    return check


class _PartBase(Mapping[str, JSON]):
    """What every part shares: it is a read-only mapping of its JSON form."""

    __slots__ = ()
    TYPE: ClassVar[str] = ""

    def to_json(self) -> dict[str, JSON]:
        """The part's JSON form, as the log stores it (a fresh deep copy)."""
        return copy_json_object(self._view())

    def _view(self) -> dict[str, Any]:  # pragma: no cover - every subclass overrides it
        raise NotImplementedError

    def __getitem__(self, key: str) -> JSON:
        value: JSON = self._view()[key]
        return value

    def __iter__(self) -> Iterator[str]:
        return iter(self._view())

    def __len__(self) -> int:
        return len(self._view())


def _with_provider_data(view: dict[str, Any], data: ProviderData) -> dict[str, Any]:
    if data:
        view["provider_data"] = data
    return view


@attrs.frozen(eq=False)  # equality is the mapping's: two parts are equal when their JSON is
class TextPart(_PartBase):
    """Text. Stored as ``{"type": "text", "text": ...}``.

    Raises:
        ValueError: ``text`` is not a string, or ``provider_data`` is not a mapping of JSON
            objects.
    """

    TYPE: ClassVar[str] = "text"
    text: str = attrs.field(validator=_str("TextPart.text"))
    provider_data: ProviderData = attrs.field(default=_EMPTY, converter=provider_data, kw_only=True)

    def _view(self) -> dict[str, Any]:
        return _with_provider_data({"type": "text", "text": self.text}, self.provider_data)


def _image_check(instance: ImagePart, _attribute: object, _value: object) -> None:
    sources = [name for name in ("url", "data", "file_id") if getattr(instance, name) is not None]
    if len(sources) != 1:
        raise ValueError(
            "an ImagePart needs exactly one of url, data and file_id, "
            f"got {', '.join(sources) or 'none'}"
        )
    if instance.data is not None and instance.media_type is None:
        raise ValueError("an ImagePart with base64 data needs its media_type")


@attrs.frozen(eq=False)
class ImagePart(_PartBase):
    """An image: by ``url``, by base64 ``data`` (with ``media_type``), or by a ``file_id``.

    ``media_type`` (``"image/png"``...) is required with ``data`` and optional otherwise;
    ``detail`` is OpenAI's ``"auto"``/``"low"``/``"high"``/``"original"``. Stored as
    ``{"type": "image", ...}`` with the fields that are set.

    Raises:
        ValueError: not exactly one of ``url``, ``data`` and ``file_id`` is given, ``data``
            comes without ``media_type``, or a field has the wrong type.
    """

    TYPE: ClassVar[str] = "image"
    url: str | None = attrs.field(default=None, validator=optional_str("ImagePart.url"))
    data: str | None = attrs.field(
        default=None, validator=optional_str("ImagePart.data"), kw_only=True
    )
    media_type: str | None = attrs.field(
        default=None, validator=optional_str("ImagePart.media_type"), kw_only=True
    )
    file_id: str | None = attrs.field(
        default=None, validator=optional_str("ImagePart.file_id"), kw_only=True
    )
    detail: str | None = attrs.field(
        default=None, validator=[optional_str("ImagePart.detail"), _image_check], kw_only=True
    )
    provider_data: ProviderData = attrs.field(default=_EMPTY, converter=provider_data, kw_only=True)

    def _view(self) -> dict[str, Any]:
        view: dict[str, Any] = {"type": "image"}
        for name in ("url", "data", "media_type", "file_id", "detail"):
            value = getattr(self, name)
            if value is not None:
                view[name] = value
        return _with_provider_data(view, self.provider_data)


def _summary(value: object) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str) or not isinstance(value, list | tuple):
        raise ValueError(
            f"ThinkingPart.summary must be a sequence of strings, not {type(value).__name__}"
        )
    if not all(isinstance(item, str) for item in value):
        raise ValueError("ThinkingPart.summary must hold only strings")
    return tuple(str.__str__(item) for item in value)


@attrs.frozen(eq=False)
class ThinkingPart(_PartBase):
    """The model's reasoning.

    Attributes:
        text: the reasoning text (Anthropic ``thinking``, a Gemini thought, the
            ``reasoning_text`` of an OpenAI reasoning item); may be empty.
        signature: the opaque token that lets the issuing provider verify or restore the
            reasoning (Anthropic ``signature``, Gemini ``thoughtSignature``, OpenAI
            ``encrypted_content``), or None.
        summary: OpenAI's reasoning summary paragraphs, or None.
        id: OpenAI's reasoning item id, or None.
        provider: the provider that produced it, whose signature it is (None: unknown, for
            example written by hand). Providers accept signed reasoning only from themselves.

    Stored as ``{"type": "thinking", "text": ...}`` plus the fields that are set.

    Raises:
        ValueError: a field has the wrong type.
    """

    TYPE: ClassVar[str] = "thinking"
    text: str = attrs.field(default="", validator=_str("ThinkingPart.text"))
    signature: str | None = attrs.field(
        default=None, validator=optional_str("ThinkingPart.signature"), kw_only=True
    )
    summary: tuple[str, ...] | None = attrs.field(default=None, converter=_summary, kw_only=True)
    id: str | None = attrs.field(
        default=None, validator=optional_str("ThinkingPart.id"), kw_only=True
    )
    provider: str | None = attrs.field(
        default=None, validator=optional_str("ThinkingPart.provider"), kw_only=True
    )
    provider_data: ProviderData = attrs.field(default=_EMPTY, converter=provider_data, kw_only=True)

    def _view(self) -> dict[str, Any]:
        view: dict[str, Any] = {"type": "thinking", "text": self.text}
        if self.signature is not None:
            view["signature"] = self.signature
        if self.summary is not None:
            view["summary"] = list(self.summary)
        if self.id is not None:
            view["id"] = self.id
        if self.provider is not None:
            view["provider"] = self.provider
        return _with_provider_data(view, self.provider_data)


@attrs.frozen(eq=False)
class RedactedThinkingPart(_PartBase):
    """Reasoning the provider returned only as opaque ``data`` (Anthropic ``redacted_thinking``).

    Stored as ``{"type": "redacted_thinking", "data": ...}`` (plus ``provider`` when set).

    Raises:
        ValueError: a field has the wrong type.
    """

    TYPE: ClassVar[str] = "redacted_thinking"
    data: str = attrs.field(validator=_str("RedactedThinkingPart.data"))
    provider: str | None = attrs.field(
        default=None, validator=optional_str("RedactedThinkingPart.provider"), kw_only=True
    )
    provider_data: ProviderData = attrs.field(default=_EMPTY, converter=provider_data, kw_only=True)

    def _view(self) -> dict[str, Any]:
        view: dict[str, Any] = {"type": "redacted_thinking", "data": self.data}
        if self.provider is not None:
            view["provider"] = self.provider
        return _with_provider_data(view, self.provider_data)


def _index(_instance: object, _attribute: object, value: int) -> None:
    if type(value) is not int or value < 0:
        raise ValueError(f"ToolCallPart.index must be an int >= 0, not {value!r}")


@attrs.frozen(eq=False)
class ToolCallPart(_PartBase):
    """Places the message's ``tool_calls[index]`` at this point among its other parts.

    The tool calls themselves stay in ``Message.tool_calls``; a message needs these references
    only when its calls are interleaved with text or thinking. Calls no part refers to come after
    all the parts. Stored as ``{"type": "tool_call", "index": n}``.

    Raises:
        ValueError: ``index`` is not an int >= 0.
    """

    TYPE: ClassVar[str] = "tool_call"
    index: int = attrs.field(validator=_index)

    def _view(self) -> dict[str, Any]:
        return {"type": "tool_call", "index": self.index}


def _data_object(value: object) -> Mapping[str, JSON]:
    return read_only_json_object(value, "ProviderPart.data")


@attrs.frozen(eq=False)
class ProviderPart(_PartBase):
    """A block (or, for OpenAI Responses, a whole input item) of one provider's own format.

    Kept verbatim and sent only to ``provider``; converting to another provider drops it and
    says so. Stored as ``{"type": "provider", "provider": ..., "data": {...}}``.

    Raises:
        ValueError: ``provider`` is not a string or ``data`` is not a JSON object.
    """

    TYPE: ClassVar[str] = "provider"
    provider: str = attrs.field(validator=_str("ProviderPart.provider"))
    data: Mapping[str, JSON] = attrs.field(converter=_data_object)

    def _view(self) -> dict[str, Any]:
        return {"type": "provider", "provider": self.provider, "data": self.data}


def _other_data(value: object) -> Mapping[str, JSON]:
    data = read_only_json_object(value, "OtherPart.data")
    kind = data.get("type")
    if not isinstance(kind, str):
        raise ValueError('OtherPart.data needs a string "type"')
    if kind == "text" and not isinstance(data.get("text"), str):
        raise ValueError('OtherPart.data is a text part without a string "text"')
    if _typed(dict(data)) is not None:
        raise ValueError(
            f"OtherPart.data has the exact form of a {kind!r} part; use that part's class "
            "(or as_part) instead"
        )
    return data


@attrs.frozen(eq=False)
class OtherPart(_PartBase):
    """Any other JSON object with a string ``type``, kept exactly as given.

    Plain mappings given as content become this when they are not the exact JSON form of one of
    the typed parts (for example ``{"type": "image_url", "url": ...}``, or a text part with
    extra keys); converters send it to every provider as it is.

    Raises:
        ValueError: ``data`` is not a JSON object with a string ``type``, is a text part without
            a string ``text``, or is exactly the form of a typed part.
    """

    data: Mapping[str, JSON] = attrs.field(converter=_other_data)

    def _view(self) -> dict[str, Any]:
        return dict(self.data)

    def __getitem__(self, key: str) -> JSON:
        return self.data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.data)

    def __len__(self) -> int:
        return len(self.data)


Part: TypeAlias = (
    TextPart
    | ImagePart
    | ThinkingPart
    | RedactedThinkingPart
    | ToolCallPart
    | ProviderPart
    | OtherPart
)
"""Any content part."""

PART_TYPES = (
    TextPart,
    ImagePart,
    ThinkingPart,
    RedactedThinkingPart,
    ToolCallPart,
    ProviderPart,
    OtherPart,
)


# Reading the stored (JSON) form -----------------------------------------------------------
#
# Each reader takes a dict fresh from JSON (owned by the caller, not to be changed afterwards)
# and returns the typed part only when the dict is exactly that part's stored form, so that
# ``part.to_json() == data`` always holds; anything else is an OtherPart.


_P = TypeVar("_P", bound=_PartBase)


def _new(cls: type[_P], **fields: Any) -> _P:
    """An instance of cls with fields set as given, without running its validators.

    Only for values already checked (the readers below); the typed signature keeps the part's
    class, at no cost over the plain ``object.__new__``.
    """
    part = object.__new__(cls)
    for name, value in fields.items():
        object.__setattr__(part, name, value)
    return part


def _fields(data: dict[str, Any], required: tuple[str, ...], optional: tuple[str, ...]) -> bool:
    """True when data has every required key, and only those, the optional ones and "type"."""
    size = len(data) - 1
    for key in required:
        if key not in data:
            return False
        size -= 1
    for key in optional:
        if key in data:
            size -= 1
    return size == 0


def _pd(data: dict[str, Any]) -> ProviderData | None:
    """The stored provider_data of data (absent: empty), or None when it is malformed."""
    if "provider_data" not in data:
        return _EMPTY
    return _stored_provider_data(data["provider_data"])


def _read_text(data: dict[str, Any]) -> Part | None:
    text = data.get("text")
    if type(text) is not str:
        return None
    if len(data) == 2:
        return _new(TextPart, text=text, provider_data=_EMPTY)
    if len(data) != 3:
        return None
    pd = _stored_provider_data(data.get("provider_data"))
    if pd is None:
        return None
    return _new(TextPart, text=text, provider_data=pd)


_IMAGE_FIELDS = ("url", "data", "media_type", "file_id", "detail")


def _read_image(data: dict[str, Any]) -> Part | None:
    if not _fields(data, (), (*_IMAGE_FIELDS, "provider_data")):
        return None
    values = {name: data.get(name) for name in _IMAGE_FIELDS}
    if any(value is not None and type(value) is not str for value in values.values()):
        return None
    if any(name in data and data[name] is None for name in _IMAGE_FIELDS):
        return None
    if sum(values[name] is not None for name in ("url", "data", "file_id")) != 1:
        return None
    if values["data"] is not None and values["media_type"] is None:
        return None
    pd = _pd(data)
    if pd is None:
        return None
    return _new(ImagePart, **values, provider_data=pd)


def _read_thinking(data: dict[str, Any]) -> Part | None:
    if not _fields(data, ("text",), ("signature", "summary", "id", "provider", "provider_data")):
        return None
    if type(data["text"]) is not str:
        return None
    fields: dict[str, Any] = {"text": data["text"]}
    for name in ("signature", "id", "provider"):
        value = data.get(name, ...)
        if value is ...:
            fields[name] = None
        elif type(value) is str:
            fields[name] = value
        else:
            return None
    summary = data.get("summary", ...)
    if summary is ...:
        fields["summary"] = None
    elif type(summary) is list and all(type(item) is str for item in summary):
        fields["summary"] = tuple(summary)
    else:
        return None
    pd = _pd(data)
    if pd is None:
        return None
    return _new(ThinkingPart, **fields, provider_data=pd)


def _read_redacted(data: dict[str, Any]) -> Part | None:
    if not _fields(data, ("data",), ("provider", "provider_data")):
        return None
    provider = data.get("provider", ...)
    if type(data["data"]) is not str or (provider is not ... and type(provider) is not str):
        return None
    pd = _pd(data)
    if pd is None:
        return None
    return _new(
        RedactedThinkingPart,
        data=data["data"],
        provider=None if provider is ... else provider,
        provider_data=pd,
    )


def _read_tool_call(data: dict[str, Any]) -> Part | None:
    index = data.get("index")
    if len(data) != 2 or type(index) is not int or index < 0:
        return None
    return _new(ToolCallPart, index=index)


def _read_provider(data: dict[str, Any]) -> Part | None:
    if len(data) != 3 or type(data.get("provider")) is not str:
        return None
    if type(data.get("data")) is not dict:
        return None
    return _new(ProviderPart, provider=data["provider"], data=MappingProxyType(data["data"]))


_READERS = {
    "text": _read_text,
    "image": _read_image,
    "thinking": _read_thinking,
    "redacted_thinking": _read_redacted,
    "tool_call": _read_tool_call,
    "provider": _read_provider,
}


def _typed(data: dict[str, Any]) -> Part | None:
    kind = data.get("type")
    reader = _READERS.get(kind) if type(kind) is str else None
    return None if reader is None else reader(data)


def stored_part(data: dict[str, Any]) -> Part:
    """The part a stored JSON object stands for (trusted: ``data`` is checked JSON, kept).

    Only for dicts the log validated (an object with a string ``type``; a text part has a
    string ``text``), which nothing changes afterwards: the part may share them.

    Args:
        data: the stored object.

    Returns:
        The typed part when ``data`` is exactly a typed part's stored form, else an
        :class:`OtherPart` over ``data`` itself; either way ``part.to_json() == data``.
    """
    reader = _READERS.get(data["type"])
    if reader is not None:
        part = reader(data)
        if part is not None:
            return part
    return _new(OtherPart, data=MappingProxyType(data))


def as_part(value: object, what: str = "content part") -> Part:
    """Return ``value`` as a content part.

    A part is returned as is. A mapping is copied as JSON and read like the log reads stored
    parts: the typed part when it is exactly one's JSON form (``{"type": "text", "text": "hi"}``
    is a :class:`TextPart`), else an :class:`OtherPart` holding it.

    Args:
        value: a part, or a JSON object with a string ``type``.
        what: how error messages name the value.

    Returns:
        The part.

    Raises:
        ValueError: ``value`` is not a mapping of JSON, has no string ``type``, or is a text part
            without a string ``text``.
    """
    if isinstance(value, PART_TYPES):
        return value
    if not isinstance(value, Mapping):
        raise ValueError(f"{what} must be a part or a mapping, not {type(value).__name__}")
    try:
        data = copy_json(value)
    except NotJSONError as e:
        raise ValueError(f"{e.where(what)}: {e.reason}") from None
    assert type(data) is dict
    kind = data.get("type")
    if not isinstance(kind, str):
        raise ValueError(f'{what} needs a string "type"')
    if kind == "text" and not isinstance(data.get("text"), str):
        raise ValueError(f'{what} is a text part without a string "text"')
    return stored_part(data)
