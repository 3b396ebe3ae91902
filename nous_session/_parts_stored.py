"""Reading a part's stored (JSON) form: the typed part it is exactly the form of, else an
:class:`~nous_session.parts.OtherPart` over it, built without validation (the log checked it)."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, TypeVar

from nous_session import _part_types
from nous_session._part_types import EMPTY, Part, PartBase, stored_provider_data

# Reading the stored (JSON) form -----------------------------------------------------------
#
# Each reader takes a dict fresh from JSON (owned by the caller, not to be changed afterwards)
# and returns the typed part only when the dict is exactly that part's stored form, so that
# ``part.to_json() == data`` always holds; anything else is an OtherPart.


_P = TypeVar("_P", bound=PartBase)


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


def _new_with_provider_data(cls: type[_P], stored: dict[str, Any], /, **fields: Any) -> _P | None:
    """:func:`_new` with the provider_data of the stored form (absent: empty) besides fields,
    or None when that provider_data is malformed."""
    if "provider_data" not in stored:
        return _new(cls, **fields, provider_data=EMPTY)
    provider_data = stored_provider_data(stored["provider_data"])
    return None if provider_data is None else _new(cls, **fields, provider_data=provider_data)


def _read_text(data: dict[str, Any]) -> Part | None:
    text = data.get("text")
    if type(text) is not str:
        return None
    if len(data) == 2:
        return _new(_part_types.TextPart, text=text, provider_data=EMPTY)
    if len(data) != 3:
        return None
    pd = stored_provider_data(data.get("provider_data"))
    if pd is None:
        return None
    return _new(_part_types.TextPart, text=text, provider_data=pd)


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
    return _new_with_provider_data(_part_types.ImagePart, data, **values)


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
    return _new_with_provider_data(_part_types.ThinkingPart, data, **fields)


def _read_redacted(data: dict[str, Any]) -> Part | None:
    if not _fields(data, ("data",), ("provider", "provider_data")):
        return None
    provider = data.get("provider", ...)
    if type(data["data"]) is not str or (provider is not ... and type(provider) is not str):
        return None
    return _new_with_provider_data(
        _part_types.RedactedThinkingPart,
        data,
        data=data["data"],
        provider=None if provider is ... else provider,
    )


def _read_tool_call(data: dict[str, Any]) -> Part | None:
    index = data.get("index")
    if len(data) != 2 or type(index) is not int or index < 0:
        return None
    return _new(_part_types.ToolCallPart, index=index)


def _read_provider(data: dict[str, Any]) -> Part | None:
    if len(data) != 3 or type(data.get("provider")) is not str:
        return None
    if type(data.get("data")) is not dict:
        return None
    return _new(
        _part_types.ProviderPart, provider=data["provider"], data=MappingProxyType(data["data"])
    )


_READERS = {
    "text": _read_text,
    "image": _read_image,
    "thinking": _read_thinking,
    "redacted_thinking": _read_redacted,
    "tool_call": _read_tool_call,
    "provider": _read_provider,
}


def typed_part(data: dict[str, Any]) -> Part | None:
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
    return _new(_part_types.OtherPart, data=MappingProxyType(data))


# OtherPart refuses data that is exactly a typed part's stored form; it asks this module,
# which builds the part classes and so cannot be imported by theirs.
_part_types.typed_part_reader = typed_part
