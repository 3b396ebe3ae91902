"""Writing messages as a Gemini ``contents`` payload, and the SDK's snake_case names (the
reader, in :mod:`nous_session.formats.gemini`, writes a message again to know its default form)."""

from __future__ import annotations

import mimetypes
from collections.abc import Sequence
from functools import partial
from typing import Any, Final

import attrs

from nous_session._json import JSON, loads
from nous_session.formats._common import (
    MESSAGE,
    TURN,
    Notes,
    call_item_fields,
    copy_object,
    merge,
    own,
    part_kind,
    unsupported,
    write_part,
)
from nous_session.formats._tool_calls import Placed, arguments_object, elements
from nous_session.message import Message, Role, ToolCall
from nous_session.parts import ImagePart, Part, ProviderPart, TextPart, ThinkingPart

PROVIDER: Final = "gemini"
JSON_RESPONSE: Final = "$json"
"""Hint on a tool message: its text is the compact JSON of the whole ``response`` object."""

SNAKE: Final = "$snake"
"""Hint on a part, a function call or a tool result: the snake_case field names it came with
(``inline_data``, ``mime_type``...), which writing gives back in that case."""
SYSTEM_KEY: Final = "$key"
"""Hint on the system message: the payload key its instruction came under, when it was
``systemInstruction`` (camelCase)."""

_CAMEL: Final = {
    "function_call": "functionCall",
    "function_response": "functionResponse",
    "inline_data": "inlineData",
    "file_data": "fileData",
    "thought_signature": "thoughtSignature",
    "executable_code": "executableCode",
    "code_execution_result": "codeExecutionResult",
    "video_metadata": "videoMetadata",
    "part_metadata": "partMetadata",
    "media_resolution": "mediaResolution",
    "mime_type": "mimeType",
    "file_uri": "fileUri",
    "display_name": "displayName",
    "will_continue": "willContinue",
}


# The SDK's snake_case and the API's camelCase, both read and written.
_SNAKE: Final = {camel: snake for snake, camel in _CAMEL.items()}
# The part fields whose value is an object with fields of its own to rename.
_NESTED: Final = ("inlineData", "fileData", "functionResponse", "functionCall")


def camel_cased(value: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """A part with the SDK's snake_case structural keys renamed to the API's camelCase, and
    the snake_case names it had (sorted), for :func:`_recase` to give back."""
    snake: set[str] = set()

    def rename(fields: dict[str, Any]) -> dict[str, Any]:
        out = {}
        for key, item in fields.items():
            if key in _CAMEL:
                snake.add(key)
                key = _CAMEL[key]
            out[key] = item
        return out

    out = rename(value)
    for key in _NESTED:
        if type(out.get(key)) is dict:
            out[key] = rename(out[key])
    return out, sorted(snake)


def _recase(value: dict[str, Any], snake: object) -> dict[str, Any]:
    """A written part with the camelCase keys named in ``snake`` given back in snake_case."""
    if type(snake) is not list or not snake:
        return value
    names = set(snake)

    def rename(fields: dict[str, Any]) -> dict[str, Any]:
        return {(_SNAKE[k] if _SNAKE.get(k) in names else k): v for k, v in fields.items()}

    out = rename(value)
    for key in _NESTED:
        key = _SNAKE[key] if _SNAKE.get(key) in names else key
        if type(out.get(key)) is dict:
            out[key] = rename(out[key])
    return out


@attrs.define
class _Names:
    """The function names of the calls written so far, for the responses that need them."""

    by_id: dict[str, str] = attrs.Factory(dict)
    waiting: list[str] = attrs.Factory(list)  # calls without an id, not yet answered

    def called(self, call: ToolCall) -> None:
        if call.id:
            self.by_id[call.id] = call.name
        else:
            self.waiting.append(call.name)

    def answer(self, message: Message, notes: Notes, i: int) -> str:
        waiting = None
        if not message.tool_call_id and self.waiting:
            waiting = self.waiting.pop(0)
        if message.name is not None:
            return message.name
        name = self.by_id.get(message.tool_call_id or "", waiting)
        if name is None:
            notes.add(
                f"tool result {i} has no function name and answers no known call; "
                f"{PROVIDER} needs the name, sent as ''"
            )
            return ""
        return name


def dump(messages: Sequence[Message], notes: Notes) -> dict[str, JSON]:
    """The ``{"system_instruction", "contents"}`` payload for ``messages``.

    Args:
        messages: the conversation.
        notes: collects what could not be carried.

    Returns:
        The payload; ``system_instruction`` only when the first message is a system (or
        developer) one.
    """
    payload: dict[str, Any] = {}
    contents: list[dict[str, Any]] = []
    names = _Names()
    previous: Role | None = None
    for i, message in enumerate(messages):
        role = message.role
        extras = notes.message_extras(i, message)
        unsupported(message, notes, i, name=role is Role.TOOL)
        if i == 0 and role in (Role.SYSTEM, Role.DEVELOPER):
            if role is Role.DEVELOPER:
                notes.add("message 0 is a developer message; sent as the system instruction")
            key = extras.get(SYSTEM_KEY)
            key = key if key == "systemInstruction" else "system_instruction"
            payload[key] = merge({"parts": message_parts(message, notes, i)}, extras)
        elif role is Role.TOOL:
            part = _response(message, notes, i, names.answer(message, notes, i))
            turn = extras.get(TURN)
            if (
                contents
                and _is_user(contents[-1])
                and ((previous is Role.TOOL and turn != "split") or turn == "join")
            ):
                contents[-1]["parts"].append(part)
            else:
                contents.append(merge({"role": "user", "parts": [part]}, extras.get(MESSAGE)))
        elif role is Role.ASSISTANT:
            for call in message.tool_calls:
                names.called(call)
            contents.append(
                merge({"role": "model", "parts": message_parts(message, notes, i)}, extras)
            )
        else:
            if role is not Role.USER:
                notes.add(
                    f"message {i} is a {role.value} message; sent as user: {PROVIDER} takes "
                    "instructions only before the conversation"
                )
            parts = message_parts(message, notes, i)
            if extras.get(TURN) == "join" and contents and _is_user(contents[-1]):
                contents[-1]["parts"].extend(parts)
            else:
                contents.append(merge({"role": "user", "parts": parts}, extras))
        previous = Role.USER if role in (Role.SYSTEM, Role.DEVELOPER) and i else role
    payload["contents"] = contents
    return payload


def _is_user(content: dict[str, Any]) -> bool:
    return content.get("role", "user") in ("user", "function")  # no role: the user's


def message_parts(message: Message, notes: Notes, i: int) -> list[Any]:
    model = message.role is Role.ASSISTANT
    content = message.content
    parts: list[Any] = []
    if isinstance(content, str) and (content or not message.tool_calls):
        parts.append({"text": content})  # (not an empty one next to function calls)
    for j, item in elements(message, notes, i):
        if isinstance(item, Placed):
            if model:
                parts.append(_call(item.call, notes, i, item.index))
            continue
        part = _part(item, notes, i, j, model)
        if part is not None:
            parts.append(part)
    return parts


def _call(call: ToolCall, notes: Notes, i: int, k: int) -> dict[str, Any]:
    written = camel_call(call, notes, i, k)
    return _recase(written, own(call.provider_data, PROVIDER).get(SNAKE))


def camel_call(call: ToolCall, notes: Notes, i: int, k: int) -> dict[str, Any]:
    notes.foreign(i, f"tool call {k} ({call.name})", call.provider_data)
    call_item_fields(call, notes, i, k)
    function: dict[str, Any] = {"name": call.name, "args": arguments_object(call, notes, i, k)}
    if call.id:
        function["id"] = call.id
    return merge({"functionCall": function}, own(call.provider_data, PROVIDER))


def _media(part: ImagePart, notes: Notes, i: int, what: str) -> dict[str, Any] | None:
    if part.detail not in (None, "auto"):
        notes.drop(i, f"the detail {part.detail!r} of {what}")
    if part.data is not None:
        return {"inlineData": {"mimeType": part.media_type, "data": part.data}}
    if part.url is not None:
        media_type = part.media_type or mimetypes.guess_type(part.url)[0]
        if media_type is None:
            notes.drop(i, f"the media type of {what}", "it is unknown; gemini needs one")
            return {"fileData": {"fileUri": part.url}}
        if part.media_type is None:
            notes.add(
                f"the media type of {what} of message {i} is not given; sent as {media_type!r},"
                f" guessed from the URL: {PROVIDER} needs one"
            )
        return {"fileData": {"mimeType": media_type, "fileUri": part.url}}
    notes.drop(i, what, f"{PROVIDER} takes images by data or URI, not by another's file id")
    return None


def _part(part: Part, notes: Notes, i: int, j: int, model: bool) -> dict[str, Any] | None:
    written = camel_part(part, notes, i, j, model)
    snake = own(getattr(part, "provider_data", None) or {}, PROVIDER).get(SNAKE)
    return None if written is None else _recase(written, snake)


def _own_camel_part(
    part: Part, what: str, notes: Notes, i: int, model: bool
) -> dict[str, Any] | None:
    if isinstance(part, TextPart):
        return {"text": part.text}
    if isinstance(part, ImagePart):
        return _media(part, notes, i, what)
    if isinstance(part, ThinkingPart) and model:
        assert isinstance(part, ThinkingPart)
        if part.provider not in (None, PROVIDER):
            notes.drop(i, what, f"it is {part.provider}'s; {PROVIDER} takes only its own thoughts")
            return None
        if part.summary:
            notes.drop(i, f"the summary of {what}")
        thought: dict[str, Any] = {"text": part.text, "thought": True}
        if part.signature is not None:
            thought["thoughtSignature"] = part.signature
        return thought
    notes.drop(i, what, f"{PROVIDER} takes it only from the model" if not model else None)
    return None


camel_part: Final = partial(write_part, _own_camel_part)
"""Part ``j`` of message ``i`` written for the provider (see :func:`write_part`)."""


def _response(message: Message, notes: Notes, i: int, name: str) -> dict[str, Any]:
    written = camel_response(message, notes, i, name)
    return _recase(written, own(message.provider_data, PROVIDER).get(SNAKE))


def camel_response(message: Message, notes: Notes, i: int, name: str) -> dict[str, Any]:
    notes.foreign(i, "the tool result", message.provider_data)
    extras = own(message.provider_data, PROVIDER)
    content = message.content
    media: list[Any] = []
    if content is None or isinstance(content, str):
        text = content or ""
    else:
        texts = []
        for j, part in enumerate(content):
            if type(part) is TextPart:
                texts.append(part.text)
                # A response's text is one string: no part keeps fields of its own.
                notes.foreign(i, f"text (part {j})", part.provider_data)
                if any(key[:1] != "$" for key in own(part.provider_data, PROVIDER)):
                    notes.drop(
                        i, f"the {PROVIDER} fields of text (part {j})", "a response is one text"
                    )
            elif type(part) is ImagePart:
                found = _media(part, notes, i, f"image (part {j})")
                if found is not None:
                    mine = own(part.provider_data, PROVIDER)
                    media.append(_recase(merge(found, mine), mine.get(SNAKE)))
            elif type(part) is ProviderPart and part.provider == PROVIDER:
                media.append(copy_object(part.data))
            else:
                notes.drop(
                    i,
                    f"{part_kind(part)} (part {j})",
                    f"{PROVIDER} results hold text and media only",
                )
        text = "".join(texts)
    response: Any = None
    if extras.get(JSON_RESPONSE):
        try:
            response = loads(text)  # exact for ints wider than 64 bits
        except ValueError:
            response = None
    if type(response) is not dict:
        response = {"error" if message.is_error else "output": text}
    function: dict[str, Any] = {"name": name, "response": response}
    if message.tool_call_id:
        function["id"] = message.tool_call_id
    if media:
        function["parts"] = media
    return merge({"functionResponse": function}, extras)
