"""What the provider converters share: notes, exact-form extras, errors, images.

Exactness. A converter reads a provider object (a message, a block, an item) into the neutral
fields, then builds the object those fields alone would give back (its *default*), and keeps
only the difference (:func:`diff`) in ``provider_data[provider]``: the object's keys the neutral
form has no field for, keys whose value differs, and under ``"$absent"`` the keys the default
has that the object lacked. Writing merges the difference back (:func:`merge`), so every object
round-trips exactly by construction, and a provider's entry is never sent to another provider.
Keys starting with ``"$"`` are the converters' own hints (``"$turn"``...), never sent.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Any, Final, NoReturn, TypeVar

import attrs

from nous_session._json import (
    NotJSONError,
    copy_json,
    copy_json_object,
    format_path,
)
from nous_session.errors import FormatError
from nous_session.message import Message, Role, ToolCall
from nous_session.parts import ImagePart, OtherPart, Part, ProviderData, ProviderPart, ToolCallPart

__all__: list[str] = []

ABSENT: Final = "$absent"
TURN: Final = "$turn"
"""Hint: ``"join"`` this message to the provider message before it, or ``"split"`` it off."""
MESSAGE: Final = "$message"
"""Hint: the provider message's own extra keys, kept on a tool result that opens it."""

Path = tuple[str | int, ...]


# Errors ---------------------------------------------------------------------------------------


def fail(provider: str, where: Path, problem: str) -> NoReturn:
    """Raise the FormatError naming the provider, the place in the payload, and the problem."""
    place = format_path(where) if where else ""
    if place.startswith("[") and where and isinstance(where[0], str):
        # messages[2]["content"] reads better than ["messages"][2]["content"]
        place = f"{where[0]}{format_path(where[1:])}"
    raise FormatError(f"{provider} payload: {place + ': ' if place else ''}{problem}")


def plain_json(provider: str, payload: object) -> Any:
    """A validated deep copy of a payload as plain JSON (dicts, lists, scalars)."""
    try:
        return copy_json(payload)
    except NotJSONError as e:
        raise FormatError(f"{provider} payload: {e.where('payload')}: {e.reason}") from None


def need(provider: str, obj: Mapping[str, Any], key: str, kind: type, where: Path) -> Any:
    """``obj[key]``, which must be a ``kind``; else the FormatError saying so."""
    value = obj.get(key)
    if type(value) is not kind:
        article = "an" if kind.__name__[0] in "aeiou" else "a"
        if key not in obj:
            fail(provider, where, f'needs {article} {kind.__name__} "{key}"')
        fail(provider, (*where, key), f"must be {article} {kind.__name__}, not {_kind(value)}")
    return value


def _kind(value: object) -> str:
    return "null" if value is None else type(value).__name__


def need_object(provider: str, value: object, where: Path, what: str) -> dict[str, Any]:
    """``value``, which must be a JSON object; else the FormatError saying so."""
    if type(value) is not dict:
        fail(provider, where, f"{what} must be an object, not {_kind(value)}")
    return value


def need_list(provider: str, value: object, where: Path, what: str) -> list[Any]:
    """``value``, which must be a JSON array; else the FormatError saying so."""
    if type(value) is not list:
        fail(provider, where, f"{what} must be a list, not {_kind(value)}")
    return value


# Exact forms ----------------------------------------------------------------------------------


def same(a: Any, b: Any) -> bool:
    """JSON equality that tells ``1``, ``1.0`` and ``True`` apart."""
    if type(a) is not type(b):
        return False
    if type(a) is dict:
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if type(a) is list:
        return len(a) == len(b) and all(map(same, a, b))
    return bool(a == b)


def diff(actual: dict[str, Any], default: dict[str, Any]) -> dict[str, Any]:
    """What ``actual`` has that ``default`` lacks or has otherwise (see the module docstring)."""
    out: dict[str, Any] = {}
    for key, value in actual.items():
        if key in default:
            base = default[key]
            if same(value, base):
                continue
            if type(value) is dict and type(base) is dict:
                out[key] = diff(value, base)
                continue
        out[key] = value
    absent = [key for key in default if key not in actual]
    if absent:
        out[ABSENT] = absent
    return out


def merge(default: dict[str, Any], extras: Mapping[str, Any] | None) -> dict[str, Any]:
    """``default`` with ``extras`` (a :func:`diff`) applied, in place; hints are skipped."""
    if not extras:
        return default
    for key, value in extras.items():
        if key[:1] == "$":
            continue
        base = default.get(key)
        if isinstance(value, Mapping) and type(base) is dict:
            merge(base, value)
        else:
            default[key] = copy_json(value)
    absent = extras.get(ABSENT)
    if absent:
        for key in absent:
            default.pop(key, None)
    return default


def copy_object(value: Mapping[str, Any]) -> dict[str, Any]:
    """A plain deep copy of a JSON object (for the payloads, which the caller owns)."""
    return copy_json_object(value)


def own(data: ProviderData, provider: str) -> Mapping[str, Any]:
    """The provider's own entry of ``data`` (empty when there is none)."""
    return data.get(provider) or {}


def with_extras(data: dict[str, Any], provider: str) -> ProviderData:
    """``{provider: data}``, or empty when ``data`` is."""
    return {provider: data} if data else {}


def append_user_turn(
    out: list[Message],
    produced: list[Message],
    extras: Mapping[str, Any],
    provider: str,
    created_at: datetime,
) -> None:
    """Append to ``out`` the messages one provider user turn was read into (an empty user
    message for none), with the hints that write them back as that one turn: the first
    carries the turn's own extra keys (under ``"$message"`` on a tool result), and says
    ``"split"`` when it would otherwise join the tool results before it; the others say
    ``"join"`` where they would not join by themselves."""
    if not produced:
        produced.append(Message(Role.USER, (), created_at=created_at))
    for k, message in enumerate(produced):
        hints: dict[str, Any] = {}
        if k == 0:
            if message.role is Role.TOOL and out and out[-1].role is Role.TOOL:
                hints[TURN] = "split"
            if extras:
                if message.role is Role.TOOL:
                    hints[MESSAGE] = extras
                else:
                    hints.update(extras)
        elif not (message.role is Role.TOOL and produced[k - 1].role is Role.TOOL):
            hints[TURN] = "join"
        if hints:
            mine = {**own(message.provider_data, provider), **hints}
            message = attrs.evolve(message, provider_data={provider: mine})
        out.append(message)


# Notes ----------------------------------------------------------------------------------------

_QUIET: Final = {"openai-responses": {"type", "id", "status"}}
"""Per provider: extra keys that are bookkeeping only, dropped without a note."""


class Notes:
    """Collects what a conversion could not carry (``items``: lost) or changed to fit, losing
    nothing (``changed``: a made-up call id, a developer message sent as system...), one
    human-readable line per item."""

    def __init__(self, provider: str) -> None:
        self.provider = provider
        self.items: list[str] = []
        self.changed: list[str] = []

    def add(self, text: str) -> None:
        """Record, as given, a change made to fit the provider that loses nothing."""
        self.changed.append(text)

    def drop(self, index: int, what: str, why: str | None = None) -> None:
        """Record that ``what`` of message ``index`` was dropped, and why."""
        reason = why if why is not None else f"{self.provider} has no place for it"
        self.items.append(f"{what} of message {index} dropped: {reason}")

    def foreign(self, index: int, what: str | None, data: ProviderData) -> None:
        """Note the other providers' fields of ``data`` (on ``what``, else the message)."""
        for other, extras in data.items():
            if other == self.provider:
                continue
            quiet = _QUIET.get(other, ())
            keys = sorted(
                key
                for key, value in extras.items()
                if key[:1] != "$"
                and key not in quiet
                and value is not False
                and value not in (None, [], {})
            )
            if keys:
                field = "field" if len(keys) == 1 else "fields"
                label = f"the {other} {field} {', '.join(keys)}"
                self.drop(
                    index,
                    label if what is None else f"{label} of {what}",
                    f"only {other} reads {'it' if len(keys) == 1 else 'them'}",
                )

    def message_extras(self, index: int, message: Message) -> Mapping[str, Any]:
        """This provider's entry of the message's provider_data, the others' noted; a tool
        result's are noted where the writer puts the result (a block inside another message)."""
        if message.role is not Role.TOOL:
            self.foreign(index, None, message.provider_data)
        return own(message.provider_data, self.provider)


_Context = TypeVar("_Context")

OwnWriter = Callable[[Part, str, Notes, int, _Context], dict[str, Any] | None]
"""A provider's writer of a part in its own form: ``(part, what, notes, i, context)``, with the
part named ``what`` in notes; None when the part cannot go (noted). The provider's entry of the
part's provider_data is merged into what it returns by :func:`write_part`."""


def write_part(
    own_form: OwnWriter[_Context], part: Part, notes: Notes, i: int, j: int, context: _Context
) -> dict[str, Any] | None:
    """Part ``j`` of message ``i`` as the provider of ``notes`` writes it, or None (noted).

    What every provider writes alike is written here: an OtherPart as it is, a ProviderPart of
    this provider as it is (another's is dropped, with a note), and a reference to a tool call
    where none belongs (dropped likewise). Any other part goes to ``own_form`` with ``context``
    (the place the provider writes it in); the provider's entry of its provider_data is merged
    into what that returns, and the other providers' entries are noted.
    """
    what = f"{part_kind(part)} (part {j})"
    if isinstance(part, OtherPart):
        return copy_object(part.data)
    if isinstance(part, ProviderPart):
        if part.provider == notes.provider:
            return copy_object(part.data)
        notes.drop(i, f"the {what}")
        return None
    if isinstance(part, ToolCallPart):
        notes.drop(i, f"the reference to a tool call (part {j})", "only the model makes calls")
        return None
    notes.foreign(i, what, part.provider_data)
    written = own_form(part, what, notes, i, context)
    return None if written is None else merge(written, own(part.provider_data, notes.provider))


def text_or_parts(message: Message) -> str | tuple[Part, ...]:
    """The message's content as a provider writes it: a string as is (None as ``""``), or
    its parts."""
    content = message.content
    return "" if content is None else content


# Images ---------------------------------------------------------------------------------------

_DATA_URL: Final = re.compile(r"data:([\w!#$&^.+-]+/[\w!#$&^.+-]+);base64,(.*)", re.DOTALL)


def data_url(part: ImagePart) -> str:
    """The ``data:`` URL of a base64 image (or its URL)."""
    if part.data is not None:
        return f"data:{part.media_type};base64,{part.data}"
    return part.url or ""


def image_from_url(url: str, **fields: Any) -> ImagePart:
    """An ImagePart for a URL; a base64 ``data:`` URL becomes ``data`` and ``media_type``."""
    match = _DATA_URL.fullmatch(url)
    if match is not None:
        return ImagePart(data=match[2], media_type=match[1], **fields)
    return ImagePart(url, **fields)


def plain(parts: Iterable[Part]) -> bool:
    """True when no part carries provider data."""
    return not any(getattr(part, "provider_data", None) for part in parts)


def part_kind(part: Part) -> str:
    """A short name for a part's kind, for notes: ``"thinking"``, ``"anthropic document block"``."""
    if isinstance(part, ProviderPart):
        data = part.data
        kind = data.get("type") if "type" in data else next(iter(data), "empty")
        return f"{part.provider} {kind} block"
    if isinstance(part, OtherPart):
        return f"{part.data.get('type')} part"
    return type(part).TYPE.replace("_", " ")


def unsupported(
    message: Message, notes: Notes, index: int, *, name: bool = False, reasoning: bool = False
) -> None:
    """Note the message fields the provider has no place for.

    Args:
        message: the message being written.
        notes: where the notes go.
        index: the message's index.
        name: whether the provider carries ``name`` for this message.
        reasoning: whether it carries ``reasoning_content``.
    """
    if message.name is not None and not name:
        notes.drop(index, f"the name {message.name!r}")
    if message.reasoning_content is not None and not reasoning:
        notes.drop(index, "reasoning_content")
    if message.tool_calls and message.role is not Role.ASSISTANT:
        notes.drop(
            index, "the tool calls", f"{notes.provider} takes tool calls only from the model"
        )
    if message.is_error and message.role is not Role.TOOL:
        notes.drop(index, "the error flag", "only tool results carry one")
    if message.tool_call_id is not None and message.role is not Role.TOOL:
        notes.drop(
            index, f"the tool call id {message.tool_call_id!r}", "only tool results carry one"
        )


def call_item_fields(call: ToolCall, notes: Notes, index: int, k: int) -> None:
    """Note the call's OpenAI Responses item fields (``item_id``, ``status``), which the
    provider has no place for."""
    for what, value in (("item id", call.item_id), ("status", call.status)):
        if value is not None:
            notes.drop(index, f"the {what} {value!r} of tool call {k} ({call.name})")


def url_media_type(part: ImagePart, notes: Notes, index: int, what: str) -> None:
    """Note the media type of an image sent by URL, which the provider has no place for."""
    if part.media_type is not None and part.data is None:
        notes.drop(index, f"the media type {part.media_type!r} of {what}")
