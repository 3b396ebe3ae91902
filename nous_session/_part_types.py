"""The content parts as values: their classes, validation, and ``provider_data``; see
:mod:`nous_session.parts`, which is their public home."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from types import MappingProxyType
from typing import Any, ClassVar, TypeAlias

import attrs

from nous_session._json import JSON, NotJSONError, copy_json_object

ProviderData: TypeAlias = Mapping[str, Mapping[str, JSON]]
"""Per provider name, that provider's fields with no neutral equivalent (read-only)."""

EMPTY: Mapping[str, Any] = MappingProxyType({})


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
    if value is None or value is EMPTY:
        return EMPTY
    if not isinstance(value, Mapping):
        raise ValueError(f"{what} must be a mapping, not {type(value).__name__}")
    if not value:
        return EMPTY
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


def stored_provider_data(value: object) -> ProviderData | None:
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


class PartBase(Mapping[str, JSON]):
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


def _with_fields(
    part: ImagePart | ThinkingPart | RedactedThinkingPart,
    view: dict[str, Any],
    optional: tuple[str, ...],
) -> dict[str, Any]:
    """``view`` (the part's JSON form so far) with each of the ``optional`` fields the part has
    set (not None; a tuple as a list), in that order, then its ``provider_data`` if any."""
    for name in optional:
        value = getattr(part, name)
        if value is not None:
            view[name] = list(value) if type(value) is tuple else value
    return _with_provider_data(view, part.provider_data)


@attrs.frozen(eq=False)  # equality is the mapping's: two parts are equal when their JSON is
class TextPart(PartBase):
    """Text. Stored as ``{"type": "text", "text": ...}``.

    Raises:
        ValueError: ``text`` is not a string, or ``provider_data`` is not a mapping of JSON
            objects.
    """

    TYPE: ClassVar[str] = "text"
    text: str = attrs.field(validator=_str("TextPart.text"))
    provider_data: ProviderData = attrs.field(default=EMPTY, converter=provider_data, kw_only=True)

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
class ImagePart(PartBase):
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
    provider_data: ProviderData = attrs.field(default=EMPTY, converter=provider_data, kw_only=True)

    def _view(self) -> dict[str, Any]:
        return _with_fields(
            self, {"type": "image"}, ("url", "data", "media_type", "file_id", "detail")
        )


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
class ThinkingPart(PartBase):
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
    provider_data: ProviderData = attrs.field(default=EMPTY, converter=provider_data, kw_only=True)

    def _view(self) -> dict[str, Any]:
        view = {"type": "thinking", "text": self.text}
        return _with_fields(self, view, ("signature", "summary", "id", "provider"))


@attrs.frozen(eq=False)
class RedactedThinkingPart(PartBase):
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
    provider_data: ProviderData = attrs.field(default=EMPTY, converter=provider_data, kw_only=True)

    def _view(self) -> dict[str, Any]:
        return _with_fields(self, {"type": "redacted_thinking", "data": self.data}, ("provider",))


def _index(_instance: object, _attribute: object, value: int) -> None:
    if type(value) is not int or value < 0:
        raise ValueError(f"ToolCallPart.index must be an int >= 0, not {value!r}")


@attrs.frozen(eq=False)
class ToolCallPart(PartBase):
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
class ProviderPart(PartBase):
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


typed_part_reader: Callable[[dict[str, Any]], object | None] | None = None
"""The typed part whose exact stored form a dict is, or None: ``_parts_stored.typed_part``,
set when that module is imported (always, through the package's ``__init__``)."""


def _other_data(value: object) -> Mapping[str, JSON]:
    data = read_only_json_object(value, "OtherPart.data")
    kind = data.get("type")
    if not isinstance(kind, str):
        raise ValueError('OtherPart.data needs a string "type"')
    if kind == "text" and not isinstance(data.get("text"), str):
        raise ValueError('OtherPart.data is a text part without a string "text"')
    # The readers of the stored form build these classes, so they register themselves here
    # rather than being imported (OtherPart is made directly only by callers; the log's own
    # parts come from the readers, which skip this check).
    if typed_part_reader is not None and typed_part_reader(dict(data)) is not None:
        raise ValueError(
            f"OtherPart.data has the exact form of a {kind!r} part; use that part's class "
            "(or as_part) instead"
        )
    return data


@attrs.frozen(eq=False)
class OtherPart(PartBase):
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
