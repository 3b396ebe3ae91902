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

from datetime import datetime
from typing import Any

import attrs

from nous_session._json import dumps
from nous_session.formats._common import (
    Notes,
    Path,
    append_user_turn,
    diff,
    fail,
    need,
    need_list,
    need_object,
    own,
    plain_json,
    with_extras,
)
from nous_session.formats._gemini_writing import (
    JSON_RESPONSE,
    PROVIDER,
    SNAKE,
    SYSTEM_KEY,
    camel_call,
    camel_cased,
    camel_part,
    camel_response,
    dump,
    message_parts,
)
from nous_session.formats._tool_calls import arrange
from nous_session.message import Message, Role, ToolCall
from nous_session.parts import ImagePart, Part, ProviderPart, TextPart, ThinkingPart

__all__ = ["dump", "load"]


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
        default = {"parts": message_parts(plain, Notes(PROVIDER), 0)}
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
            default = {"role": "model", "parts": message_parts(plain, Notes(PROVIDER), 0)}
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
        append_user_turn(out, produced, extras, PROVIDER, self.created_at)

    def response(self, raw: dict[str, Any], where: Path) -> Message:
        part, snake = camel_cased(raw)
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
        default = camel_response(plain, Notes(PROVIDER), 0, name)
        extras = {**hints, **_extras(part, default, snake)}
        return attrs.evolve(plain, provider_data=with_extras(extras, PROVIDER))

    def item(self, raw: dict[str, Any], where: Path) -> Part | ToolCall:
        part, snake = camel_cased(raw)
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
        default = camel_call(plain, Notes(PROVIDER), 0, 0)
        extras = _extras(part, default, snake)
        return attrs.evolve(plain, provider_data=with_extras(extras, PROVIDER))

    def part(self, raw: dict[str, Any], where: Path, model: bool) -> Part:
        part, snake = camel_cased(need_object(PROVIDER, raw, where, "a part"))
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
        default = camel_part(plain, Notes(PROVIDER), 0, 0, model)
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
