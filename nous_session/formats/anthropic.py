"""Anthropic Messages API: ``{"system": ..., "messages": [...]}``.

Reading and writing are exact for everything the API puts in a conversation: the ``system``
prompt (a string or text blocks), ``system`` messages inside the list, text, images (base64,
URL and file sources), ``thinking`` with its ``signature`` and ``redacted_thinking`` with its
``data`` (both in their place among text and ``tool_use`` blocks), ``tool_use`` with its
``input`` object, ``tool_result`` with string, block or absent content and ``is_error``, any other
block (documents, search results, server tools) verbatim, and every extra field
(``cache_control``, ``citations``...) on the block it came with.

One user message holds all the tool results of a turn, and may hold text besides. Reading gives
one tool message per ``tool_result`` (and a user message for the blocks between them); writing
puts consecutive tool results back into one user message. When the payload grouped them
otherwise, the messages carry a hint (``provider_data["anthropic"]["$turn"]``) that writing
follows, so the round trip is exact either way.

Writing other providers' messages: thinking travels only with Anthropic's own signature;
``developer`` messages become ``system`` ones; tool calls without an id get one.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Final

import attrs

from nous_session._json import JSON
from nous_session.formats._common import (
    MESSAGE,
    TURN,
    CallIds,
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
    url_media_type,
    with_extras,
)
from nous_session.message import Message, Role, ToolCall
from nous_session.parts import (
    ImagePart,
    OtherPart,
    Part,
    ProviderPart,
    RedactedThinkingPart,
    TextPart,
    ThinkingPart,
    ToolCallPart,
)

__all__ = ["dump", "load"]

PROVIDER: Final = "anthropic"
IN_MESSAGES: Final = "$in_messages"
"""Hint on a leading system message that came from the messages list, not ``system``."""


# Writing --------------------------------------------------------------------------------------


def dump(messages: Sequence[Message], notes: Notes) -> dict[str, JSON]:
    """The ``{"system", "messages"}`` payload for ``messages``; what cannot go goes to ``notes``.

    Args:
        messages: the conversation.
        notes: collects what could not be carried.

    Returns:
        The payload; ``system`` only when the first message is a system (or developer) one.
    """
    payload: dict[str, Any] = {}
    out: list[dict[str, Any]] = []
    ids = CallIds(notes)
    previous: Role | None = None
    for i, message in enumerate(messages):
        role = message.role
        extras = own(message.provider_data, PROVIDER)
        if role is not Role.TOOL:
            notes.foreign(i, None, message.provider_data)
        unsupported(message, notes, i)  # a tool_result block has no name either
        if role is Role.SYSTEM or role is Role.DEVELOPER:
            if role is Role.DEVELOPER:
                notes.add(
                    f"message {i} is a developer message; sent as system: {PROVIDER} has none"
                )
            content = _system_content(message, notes, i)
            if i == 0 and not extras.get(IN_MESSAGES):
                payload["system"] = content
            else:
                out.append(merge({"role": "system", "content": content}, extras))
        elif role is Role.USER:
            blocks = _user_content(message, notes, i)
            if extras.get(TURN) == "join" and out and out[-1]["role"] == "user":
                _append(out[-1], blocks)
            else:
                out.append(merge({"role": "user", "content": blocks}, extras))
        elif role is Role.TOOL:
            block = _tool_result(message, notes, i, ids.result_id(i, message))
            turn = extras.get(TURN)
            if (
                out
                and out[-1]["role"] == "user"
                and ((previous is Role.TOOL and turn != "split") or turn == "join")
            ):
                _append(out[-1], [block])
            else:
                out.append(merge({"role": "user", "content": [block]}, extras.get(MESSAGE)))
        else:
            content = _assistant_content(message, notes, i, ids)
            out.append(merge({"role": "assistant", "content": content}, extras))
        previous = role
    payload["messages"] = out
    return payload


def _append(message: dict[str, Any], blocks: str | list[Any]) -> None:
    if isinstance(blocks, str):
        blocks = [{"type": "text", "text": blocks}]
    if isinstance(message["content"], str):
        message["content"] = [{"type": "text", "text": message["content"]}]
    message["content"].extend(blocks)


def _system_content(message: Message, notes: Notes, i: int) -> str | list[Any]:
    content = message.content
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    blocks = []
    for j, part in enumerate(content):
        if type(part) is TextPart or type(part) is OtherPart:
            blocks.append(_block(part, notes, i, j, "system"))
        else:
            notes.drop(
                i, f"{part_kind(part)} (part {j})", f"{PROVIDER} system prompts hold text only"
            )
    return blocks


def _user_content(message: Message, notes: Notes, i: int) -> str | list[Any]:
    content = message.content
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return _blocks(message, notes, i, "user", None)


def _assistant_content(message: Message, notes: Notes, i: int, ids: CallIds) -> str | list[Any]:
    content = message.content
    if not message.tool_calls:
        if content is None:
            return ""
        if isinstance(content, str):
            return content
    blocks: list[Any] = []
    if isinstance(content, str) and content:  # (the API refuses an empty text block)
        blocks.append({"type": "text", "text": content})
    blocks.extend(_blocks(message, notes, i, "assistant", ids))
    return blocks


def _blocks(message: Message, notes: Notes, i: int, context: str, ids: CallIds | None) -> list[Any]:
    blocks = []
    for j, item in elements(message, notes, i):
        if isinstance(item, Placed):
            if ids is not None:  # elsewhere, unsupported() has noted the calls
                ident = ids.call_id(i, item.index, item.call)
                blocks.append(_tool_use(item.call, ident, notes, i, item.index))
            continue
        block = _block(item, notes, i, j, context)
        if block is not None:
            blocks.append(block)
    return blocks


def _tool_use(call: ToolCall, ident: str, notes: Notes, i: int, k: int) -> dict[str, Any]:
    notes.foreign(i, f"tool call {k} ({call.name})", call.provider_data)
    call_item_fields(call, notes, i, k)
    block = {
        "type": "tool_use",
        "id": ident,
        "name": call.name,
        "input": arguments_object(call, notes, i, k),
    }
    return merge(block, own(call.provider_data, PROVIDER))


def _source(part: ImagePart) -> dict[str, Any]:
    if part.data is not None:
        return {"type": "base64", "media_type": part.media_type, "data": part.data}
    if part.url is not None:
        return {"type": "url", "url": part.url}
    return {"type": "file", "file_id": part.file_id}


def _block(part: Part, notes: Notes, i: int, j: int, context: str) -> dict[str, Any] | None:
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
        return merge({"type": "text", "text": part.text}, extras)
    if isinstance(part, ImagePart):
        assert isinstance(part, ImagePart)
        if part.detail not in (None, "auto"):
            notes.drop(i, f"the detail {part.detail!r} of {what}")
        if part.file_id is None:
            url_media_type(part, notes, i, what)
        return merge({"type": "image", "source": _source(part)}, extras)
    if context != "assistant":
        notes.drop(i, what, f"{PROVIDER} takes thinking only from the model")
        return None
    if isinstance(part, ThinkingPart):
        assert isinstance(part, ThinkingPart)
        if part.provider not in (None, PROVIDER):
            notes.drop(
                i, what, f"it is {part.provider}'s; {PROVIDER} takes only thinking it signed"
            )
            return None
        if part.signature is None:
            notes.drop(i, what, f"it has no signature; {PROVIDER} takes only thinking it signed")
            return None
        if part.summary:
            notes.drop(i, f"the summary of {what}")
        block = {"type": "thinking", "thinking": part.text, "signature": part.signature}
        return merge(block, extras)
    assert isinstance(part, RedactedThinkingPart)
    if part.provider not in (None, PROVIDER):
        notes.drop(i, what, f"it is {part.provider}'s; {PROVIDER} takes only its own")
        return None
    return merge({"type": "redacted_thinking", "data": part.data}, extras)


def _tool_result(message: Message, notes: Notes, i: int, ident: str) -> dict[str, Any]:
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": ident}
    content = message.content
    if content is not None:
        if isinstance(content, str):
            block["content"] = content
        else:
            block["content"] = _blocks(message, notes, i, "tool", None)
    if message.is_error:
        block["is_error"] = True
    notes.foreign(i, "the tool result", message.provider_data)
    return merge(block, own(message.provider_data, PROVIDER))


# Reading --------------------------------------------------------------------------------------


def load(payload: object, created_at: datetime) -> list[Message]:
    """The messages of an Anthropic ``{"system", "messages"}`` payload.

    Args:
        payload: the conversation part of a Messages API request.
        created_at: the time every message gets (a payload has none).

    Returns:
        The messages: the ``system`` prompt first (when present), then one message per entry,
        with user entries split at their ``tool_result`` blocks.

    Raises:
        FormatError: the payload is not of this form; the message says where and why.
    """
    data = plain_json(PROVIDER, payload)
    if type(data) is not dict:
        fail(PROVIDER, (), 'the payload must be an object with "messages" (and maybe "system")')
    unknown = sorted(set(data) - {"system", "messages"})
    if unknown:
        fail(PROVIDER, (), f'unexpected key(s) {unknown}: give only "system" and "messages"')
    if "messages" not in data:
        fail(PROVIDER, (), 'needs "messages"')
    reader = _Reader(created_at)
    out: list[Message] = []
    if "system" in data:
        out.append(reader.system(data["system"], ("system",), {}))
    for n, entry in enumerate(need_list(PROVIDER, data["messages"], ("messages",), '"messages"')):
        reader.message(entry, ("messages", n), out)
    return out


@attrs.define
class _Reader:
    created_at: datetime

    def message(self, entry: object, where: Path, out: list[Message]) -> None:
        entry = need_object(PROVIDER, entry, where, "a message")
        role = need(PROVIDER, entry, "role", str, where)
        if "content" not in entry:
            fail(PROVIDER, where, 'needs "content"')
        content = entry["content"]
        extras = {key: value for key, value in entry.items() if key not in ("role", "content")}
        if role == "system":
            if not out:
                extras[IN_MESSAGES] = True
            out.append(self.system(content, (*where, "content"), extras))
        elif role == "assistant":
            out.append(self.assistant(content, (*where, "content"), extras))
        elif role == "user":
            self.user(content, (*where, "content"), extras, out)
        else:
            fail(PROVIDER, (*where, "role"), f"unknown role {role!r}; roles are user and assistant")

    def system(self, content: object, where: Path, extras: dict[str, Any]) -> Message:
        if type(content) is not str:
            blocks = need_list(PROVIDER, content, where, "a system prompt (not a string)")
            content = tuple(
                self.part(block, (*where, k), "system") for k, block in enumerate(blocks)
            )
        return Message(
            Role.SYSTEM,
            content,
            created_at=self.created_at,
            provider_data=with_extras(extras, PROVIDER),
        )

    def assistant(self, content: object, where: Path, extras: dict[str, Any]) -> Message:
        calls: tuple[ToolCall, ...] = ()
        if type(content) is not str:
            blocks = need_list(PROVIDER, content, where, "content (not a string)")
            items = [self.item(block, (*where, k)) for k, block in enumerate(blocks)]
            parts, calls = arrange(items)
            first = parts[0] if len(parts) == 1 else None
            if calls and type(first) is TextPart and first.text and not first.provider_data:
                content = first.text  # the usual text-then-calls turn
            elif calls and not parts:
                content = None
            else:
                content = parts
        return Message(
            Role.ASSISTANT,
            content,
            tool_calls=calls,
            created_at=self.created_at,
            provider_data=with_extras(extras, PROVIDER),
        )

    def user(
        self, content: object, where: Path, extras: dict[str, Any], out: list[Message]
    ) -> None:
        if type(content) is str:
            out.append(
                Message(
                    Role.USER,
                    content,
                    created_at=self.created_at,
                    provider_data=with_extras(extras, PROVIDER),
                )
            )
            return
        blocks = need_list(PROVIDER, content, where, "content (not a string)")
        produced: list[Message] = []
        run: list[Part] = []

        def flush() -> None:
            if run:
                produced.append(Message(Role.USER, tuple(run), created_at=self.created_at))
                run.clear()

        for k, block in enumerate(blocks):
            if type(block) is dict and block.get("type") == "tool_result":
                flush()
                produced.append(self.tool_result(block, (*where, k)))
            else:
                run.append(self.part(block, (*where, k), "user"))
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

    def tool_result(self, block: dict[str, Any], where: Path) -> Message:
        ident = need(PROVIDER, block, "tool_use_id", str, where)
        content: Any = None
        if "content" in block:
            content = block["content"]
            if type(content) is not str:
                items = need_list(PROVIDER, content, (*where, "content"), "content (not a string)")
                content = tuple(
                    self.part(item, (*where, "content", k), "tool") for k, item in enumerate(items)
                )
        plain = Message(
            Role.TOOL,
            content,
            tool_call_id=ident,
            is_error=block.get("is_error") is True,
            created_at=self.created_at,
        )
        default = _tool_result(plain, Notes(PROVIDER), 0, ident)
        return attrs.evolve(plain, provider_data=with_extras(diff(block, default), PROVIDER))

    def item(self, block: object, where: Path) -> Part | ToolCall:
        block = need_object(PROVIDER, block, where, "a content block")
        if block.get("type") != "tool_use":
            return self.part(block, where, "assistant")
        ident = need(PROVIDER, block, "id", str, where)
        name = need(PROVIDER, block, "name", str, where)
        arguments = need(PROVIDER, block, "input", dict, where)
        plain = ToolCall(ident, name, arguments)
        default = _tool_use(plain, ident, Notes(PROVIDER), 0, 0)
        return attrs.evolve(plain, provider_data=with_extras(diff(block, default), PROVIDER))

    def part(self, block: object, where: Path, context: str) -> Part:
        block = need_object(PROVIDER, block, where, "a content block")
        kind = need(PROVIDER, block, "type", str, where)
        plain: Part
        if kind == "text":
            plain = TextPart(need(PROVIDER, block, "text", str, where))
        elif kind == "image":
            source = need_object(
                PROVIDER, block.get("source"), (*where, "source"), "an image source"
            )
            image = _image(source, (*where, "source"))
            if image is None:
                return ProviderPart(PROVIDER, block)
            plain = image
        elif kind == "thinking" and context == "assistant":
            plain = ThinkingPart(
                need(PROVIDER, block, "thinking", str, where),
                signature=need(PROVIDER, block, "signature", str, where),
                provider=PROVIDER,
            )
        elif kind == "redacted_thinking" and context == "assistant":
            plain = RedactedThinkingPart(
                need(PROVIDER, block, "data", str, where), provider=PROVIDER
            )
        else:
            return ProviderPart(PROVIDER, block)
        default = _block(plain, Notes(PROVIDER), 0, 0, context)
        assert default is not None
        return attrs.evolve(plain, provider_data=with_extras(diff(block, default), PROVIDER))


def _image(source: dict[str, Any], where: Path) -> ImagePart | None:
    kind = source.get("type")
    if kind == "base64":
        return ImagePart(
            data=need(PROVIDER, source, "data", str, where),
            media_type=need(PROVIDER, source, "media_type", str, where),
        )
    if kind == "url":
        return ImagePart(need(PROVIDER, source, "url", str, where))
    if kind == "file":
        return ImagePart(file_id=need(PROVIDER, source, "file_id", str, where))
    return None
