"""Gemini ``generateContent``: ``{"system_instruction": ..., "contents": [...]}``.

The payload is the REST API's JSON: ``system_instruction`` (a content, only when the conversation
starts with a system message) and ``contents``, each ``{"role": "user" | "model", "parts":
[...]}`` with camelCase part fields, as the API returns them and as
``Content.model_dump(mode="json", by_alias=True, exclude_none=True)`` gives them. The
snake_case field names the Python SDK prints (``function_call``, ``inline_data``,
``mime_type``, ``thought_signature``...) and ``systemInstruction`` are read too, and written
back as they came: each part, function call and result remembers the snake_case names it had
(a ``"$snake"`` hint in its ``provider_data["gemini"]``), and the system message the key it
came under.

Reading and writing are exact for: text parts; thought parts (``thought: true``, with
``thoughtSignature``) as :class:`~nous_session.parts.ThinkingPart`; ``thoughtSignature`` on any
other part (kept in that part's, or function call's, ``provider_data``); ``functionCall`` with
its ``args`` object and optional ``id`` (``""`` when absent); ``functionResponse`` as a tool
message carrying the function's ``name`` and a ``response`` object; images as ``inlineData``
(base64) and ``fileData`` (URI); every other part verbatim.

A function's result is a JSON object. A tool message's text ``t`` is sent as
``{"output": t}`` (``{"error": t}`` when ``is_error``); a response of another shape is read as its
compact JSON text, marked so that writing sends the object back. Gemini needs the function name
on a response: it comes from the message's ``name``, else from the call it answers.
Consecutive tool results share one ``user`` content, as Gemini wants them.
"""

from __future__ import annotations

import mimetypes
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Final

import attrs

from nous_session._json import JSON, dumps, loads
from nous_session.formats._common import (
    MESSAGE,
    TURN,
    Notes,
    Path,
    Placed,
    arguments_object,
    arrange,
    call_item_fields,
    copy_object,
    diff,
    elements,
    fail,
    merge,
    need,
    need_list,
    need_object,
    own,
    part_kind,
    plain_json,
    unsupported,
    with_extras,
)
from nous_session.message import Message, Role, ToolCall
from nous_session.parts import (
    ImagePart,
    OtherPart,
    Part,
    ProviderPart,
    TextPart,
    ThinkingPart,
    ToolCallPart,
)

__all__ = ["dump", "load"]

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


# Writing --------------------------------------------------------------------------------------


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
        extras = own(message.provider_data, PROVIDER)
        if role is not Role.TOOL:
            notes.foreign(i, None, message.provider_data)
        unsupported(message, notes, i, name=role is Role.TOOL)
        if i == 0 and role in (Role.SYSTEM, Role.DEVELOPER):
            if role is Role.DEVELOPER:
                notes.add("message 0 is a developer message; sent as the system instruction")
            key = extras.get(SYSTEM_KEY)
            key = key if key == "systemInstruction" else "system_instruction"
            payload[key] = merge({"parts": _parts(message, notes, i)}, extras)
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
            contents.append(merge({"role": "model", "parts": _parts(message, notes, i)}, extras))
        else:
            if role is not Role.USER:
                notes.add(
                    f"message {i} is a {role.value} message; sent as user: {PROVIDER} takes "
                    "instructions only before the conversation"
                )
            parts = _parts(message, notes, i)
            if extras.get(TURN) == "join" and contents and _is_user(contents[-1]):
                contents[-1]["parts"].extend(parts)
            else:
                contents.append(merge({"role": "user", "parts": parts}, extras))
        previous = Role.USER if role in (Role.SYSTEM, Role.DEVELOPER) and i else role
    payload["contents"] = contents
    return payload


def _is_user(content: dict[str, Any]) -> bool:
    return content.get("role", "user") in ("user", "function")  # no role: the user's


def _parts(message: Message, notes: Notes, i: int) -> list[Any]:
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
    written = _camel_call(call, notes, i, k)
    return _recase(written, own(call.provider_data, PROVIDER).get(SNAKE))


def _camel_call(call: ToolCall, notes: Notes, i: int, k: int) -> dict[str, Any]:
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
    written = _camel_part(part, notes, i, j, model)
    snake = own(getattr(part, "provider_data", None) or {}, PROVIDER).get(SNAKE)
    return None if written is None else _recase(written, snake)


def _camel_part(part: Part, notes: Notes, i: int, j: int, model: bool) -> dict[str, Any] | None:
    what = f"{part_kind(part)} (part {j})"
    if isinstance(part, OtherPart):
        return copy_object(part.data)
    if isinstance(part, ProviderPart):
        if part.provider == PROVIDER:
            return copy_object(part.data)
        notes.drop(i, f"the {what}")
        return None
    if isinstance(part, ToolCallPart):
        notes.drop(i, f"the reference to a tool call (part {j})", "only the model makes calls")
        return None
    notes.foreign(i, what, part.provider_data)
    extras = own(part.provider_data, PROVIDER)
    if isinstance(part, TextPart):
        return merge({"text": part.text}, extras)
    if isinstance(part, ImagePart):
        media = _media(part, notes, i, what)
        return None if media is None else merge(media, extras)
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
        return merge(thought, extras)
    notes.drop(i, what, f"{PROVIDER} takes it only from the model" if not model else None)
    return None


def _response(message: Message, notes: Notes, i: int, name: str) -> dict[str, Any]:
    written = _camel_response(message, notes, i, name)
    return _recase(written, own(message.provider_data, PROVIDER).get(SNAKE))


def _camel_response(message: Message, notes: Notes, i: int, name: str) -> dict[str, Any]:
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


# Reading --------------------------------------------------------------------------------------


_SNAKE: Final = {camel: snake for snake, camel in _CAMEL.items()}
# The part fields whose value is an object with fields of its own to rename.
_NESTED: Final = ("inlineData", "fileData", "functionResponse", "functionCall")


def _camel(value: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
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


def _extras(camel: dict[str, Any], default: dict[str, Any], snake: list[str]) -> dict[str, Any]:
    """What ``camel`` (a part as given, in camelCase) has beyond ``default``, with the
    snake_case names it came with as a hint: writing merges the difference into the camelCase
    default, then gives those names back their case."""
    extras = diff(camel, default)
    if snake:
        extras[SNAKE] = snake
    return extras


def load(payload: object, created_at: datetime) -> list[Message]:
    """The messages of a Gemini ``{"system_instruction", "contents"}`` payload.

    Args:
        payload: the conversation part of a ``generateContent`` request.
        created_at: the time every message gets (a payload has none).

    Returns:
        The messages: the system instruction first (when present), then one message per model
        content, and per user content one message for each function response and one for the
        other parts between them.

    Raises:
        FormatError: the payload is not of this form; the message says where and why.
    """
    data = plain_json(PROVIDER, payload)
    if type(data) is not dict:
        fail(PROVIDER, (), 'the payload must be an object with "contents"')
    camel_system = "systemInstruction" in data and "system_instruction" not in data
    if camel_system:
        data["system_instruction"] = data.pop("systemInstruction")
    unknown = sorted(set(data) - {"system_instruction", "contents"})
    if unknown:
        fail(
            PROVIDER,
            (),
            f'unexpected key(s) {unknown}: give only "system_instruction" and "contents"',
        )
    if "contents" not in data:
        fail(PROVIDER, (), 'needs "contents"')
    reader = _Reader(created_at)
    out: list[Message] = []
    if "system_instruction" in data:
        system = reader.system(data["system_instruction"], ("system_instruction",))
        if camel_system:  # written back under the key it came with
            mine = {**own(system.provider_data, PROVIDER), SYSTEM_KEY: "systemInstruction"}
            system = attrs.evolve(system, provider_data={PROVIDER: mine})
        out.append(system)
    for n, content in enumerate(need_list(PROVIDER, data["contents"], ("contents",), "contents")):
        reader.content(content, ("contents", n), out)
    return out


@attrs.define
class _Reader:
    created_at: datetime

    def parts(self, content: dict[str, Any], where: Path) -> list[Any]:
        if "parts" not in content:
            return []
        parts = need_list(PROVIDER, content["parts"], (*where, "parts"), "parts")
        return [
            need_object(PROVIDER, part, (*where, "parts", k), "a part")
            for k, part in enumerate(parts)
        ]

    def system(self, value: object, where: Path) -> Message:
        if type(value) is str:  # the Python SDK takes a bare string too
            value = {"parts": [{"text": value}]}
        content = need_object(PROVIDER, value, where, "the system instruction")
        read = self.parts(content, where)
        parts = tuple(
            self.part(part, (*where, "parts", k), model=False) for k, part in enumerate(read)
        )
        plain = Message(Role.SYSTEM, _simple(parts), created_at=self.created_at)
        default = {"parts": _parts(plain, Notes(PROVIDER), 0)}
        extras = diff(content, default)
        return attrs.evolve(plain, provider_data=with_extras(extras, PROVIDER))

    def content(self, value: object, where: Path, out: list[Message]) -> None:
        content = need_object(PROVIDER, value, where, "a content")
        role = content.get("role", "user")
        parts = self.parts(content, where)
        if role == "model":
            items = [self.item(part, (*where, "parts", k)) for k, part in enumerate(parts)]
            content_parts, calls = arrange(items)
            text = None if calls and not content_parts else _simple(content_parts, bool(calls))
            plain = Message(Role.ASSISTANT, text, tool_calls=calls, created_at=self.created_at)
            default = {"role": "model", "parts": _parts(plain, Notes(PROVIDER), 0)}
            extras = diff(content, default)
            out.append(attrs.evolve(plain, provider_data=with_extras(extras, PROVIDER)))
            return
        if role not in ("user", "function"):
            fail(PROVIDER, (*where, "role"), f"unknown role {role!r}; roles are user and model")
        extras = diff({key: v for key, v in content.items() if key != "parts"}, {"role": "user"})
        if "parts" not in content:
            extras.setdefault("$absent", []).append("parts")
        produced: list[Message] = []
        run: list[Part] = []

        def flush() -> None:
            if run:
                produced.append(Message(Role.USER, _simple(tuple(run)), created_at=self.created_at))
                run.clear()

        for k, part in enumerate(parts):
            if "functionResponse" in part or "function_response" in part:
                flush()
                produced.append(self.response(part, (*where, "parts", k)))
            else:
                run.append(self.part(part, (*where, "parts", k), model=False))
        flush()
        if not produced:
            produced.append(Message(Role.USER, (), created_at=self.created_at))
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
                mine = {**own(message.provider_data, PROVIDER), **hints}
                message = attrs.evolve(message, provider_data={PROVIDER: mine})
            out.append(message)

    def response(self, raw: dict[str, Any], where: Path) -> Message:
        part, snake = _camel(raw)
        function = need(PROVIDER, part, "functionResponse", dict, where)
        inner = (*where, "functionResponse")
        name = need(PROVIDER, function, "name", str, inner)
        ident = function.get("id")
        if ident is not None and type(ident) is not str:
            fail(PROVIDER, (*inner, "id"), "must be a string")
        response = function.get("response")
        hints: dict[str, Any] = {}
        is_error = False
        text: str | None = None
        if type(response) is dict and len(response) == 1 and type(response.get("output")) is str:
            text = response["output"]
        elif type(response) is dict and len(response) == 1 and type(response.get("error")) is str:
            text, is_error = response["error"], True
        elif type(response) is dict:
            text = dumps(response, default=None).decode()
            is_error = "error" in response and "output" not in response
            hints[JSON_RESPONSE] = True
        elif response is not None:
            fail(PROVIDER, (*inner, "response"), "must be an object")
        content: str | tuple[Part, ...] | None = text
        if "parts" in function:
            media = need_list(PROVIDER, function["parts"], (*inner, "parts"), "parts")
            content = (
                TextPart(text or ""),
                *(self.part(item, (*inner, "parts", k), False) for k, item in enumerate(media)),
            )
        plain = Message(
            Role.TOOL,
            content,
            tool_call_id=ident or "",
            name=name,
            is_error=is_error,
            created_at=self.created_at,
            provider_data=with_extras(hints, PROVIDER),
        )
        default = _camel_response(plain, Notes(PROVIDER), 0, name)
        extras = {**hints, **_extras(part, default, snake)}
        return attrs.evolve(plain, provider_data=with_extras(extras, PROVIDER))

    def item(self, raw: dict[str, Any], where: Path) -> Part | ToolCall:
        part, snake = _camel(raw)
        if "functionCall" not in part:
            return self.part(raw, where, model=True)
        function = need(PROVIDER, part, "functionCall", dict, where)
        inner = (*where, "functionCall")
        name = need(PROVIDER, function, "name", str, inner)
        ident = function.get("id", "")
        if type(ident) is not str:
            fail(PROVIDER, (*inner, "id"), "must be a string")
        arguments = function.get("args", {})
        if type(arguments) is not dict:
            fail(PROVIDER, (*inner, "args"), "must be an object")
        plain = ToolCall(ident, name, arguments)
        default = _camel_call(plain, Notes(PROVIDER), 0, 0)
        extras = _extras(part, default, snake)
        return attrs.evolve(plain, provider_data=with_extras(extras, PROVIDER))

    def part(self, raw: dict[str, Any], where: Path, model: bool) -> Part:
        part, snake = _camel(need_object(PROVIDER, raw, where, "a part"))
        plain: Part
        if "text" in part:
            text = need(PROVIDER, part, "text", str, where)
            if part.get("thought") is True and model:
                signature = part.get("thoughtSignature")
                plain = ThinkingPart(
                    text,
                    signature=signature if type(signature) is str else None,
                    provider=PROVIDER,
                )
            else:
                plain = TextPart(text)
        elif type(part.get("inlineData")) is dict or type(part.get("fileData")) is dict:
            image = _image(part)
            if image is None:
                return ProviderPart(PROVIDER, raw)  # verbatim, in the case it came
            plain = image
        else:
            return ProviderPart(PROVIDER, raw)
        default = _camel_part(plain, Notes(PROVIDER), 0, 0, model)
        assert default is not None
        extras = _extras(part, default, snake)
        return attrs.evolve(plain, provider_data=with_extras(extras, PROVIDER))


def _image(part: dict[str, Any]) -> ImagePart | None:
    inline, file = part.get("inlineData"), part.get("fileData")
    source: Any = inline if file is None else file
    if (inline is None) == (file is None) or type(source) is not dict:
        return None
    media_type = source.get("mimeType")
    if type(media_type) is not str or not media_type.startswith("image/"):
        return None
    if inline is not None:
        data = source.get("data")
        return ImagePart(data=data, media_type=media_type) if type(data) is str else None
    uri = source.get("fileUri")
    return ImagePart(uri, media_type=media_type) if type(uri) is str else None


def _simple(parts: tuple[Part, ...], calls: bool = False) -> str | tuple[Part, ...]:
    """A single plain text part reads as string content (Gemini has no other string form)."""
    first = parts[0] if len(parts) == 1 else None
    if type(first) is TextPart and not first.provider_data and (first.text or not calls):
        return first.text
    return parts
