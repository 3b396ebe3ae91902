"""Writing messages as an Anthropic Messages payload (the reader, in
:mod:`nous_session.formats.anthropic`, writes a message again to know its default form)."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any, Final

from nous_session._json import JSON
from nous_session.formats._common import (
    MESSAGE,
    TURN,
    Notes,
    call_item_fields,
    merge,
    own,
    part_kind,
    text_or_parts,
    unsupported,
    url_media_type,
    write_part,
)
from nous_session.formats._tool_calls import (
    CallIds,
    Placed,
    arguments_object,
    call_names,
    elements,
    named_by_its_call,
)
from nous_session.message import Message, Role, ToolCall
from nous_session.parts import (
    ImagePart,
    OtherPart,
    Part,
    RedactedThinkingPart,
    TextPart,
    ThinkingPart,
)

PROVIDER: Final = "anthropic"
IN_MESSAGES: Final = "$in_messages"
"""Hint on a leading system message that came from the messages list, not ``system``."""


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
    names = call_names(messages)
    previous: Role | None = None
    for i, message in enumerate(messages):
        role = message.role
        extras = notes.message_extras(i, message)
        # A tool_result block has no name either, and needs none when the name is its call's
        # (the reader takes it from the call).
        unsupported(message, notes, i, name=named_by_its_call(message, names))
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
            block = tool_result_block(message, notes, i, ids.result_id(i, message))
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
    content = text_or_parts(message)
    if isinstance(content, str):
        return content
    blocks = []
    for j, part in enumerate(content):
        if type(part) is TextPart or type(part) is OtherPart:
            blocks.append(part_block(part, notes, i, j, "system"))
        else:
            notes.drop(
                i, f"{part_kind(part)} (part {j})", f"{PROVIDER} system prompts hold text only"
            )
    return blocks


def _user_content(message: Message, notes: Notes, i: int) -> str | list[Any]:
    content = text_or_parts(message)
    return content if isinstance(content, str) else _blocks(message, notes, i, "user", None)


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
                blocks.append(tool_use_block(item.call, ident, notes, i, item.index))
            continue
        block = part_block(item, notes, i, j, context)
        if block is not None:
            blocks.append(block)
    return blocks


def tool_use_block(call: ToolCall, ident: str, notes: Notes, i: int, k: int) -> dict[str, Any]:
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


def _own_block(part: Part, what: str, notes: Notes, i: int, context: str) -> dict[str, Any] | None:
    if isinstance(part, TextPart):
        return {"type": "text", "text": part.text}
    if isinstance(part, ImagePart):
        if part.detail not in (None, "auto"):
            notes.drop(i, f"the detail {part.detail!r} of {what}")
        if part.file_id is None:
            url_media_type(part, notes, i, what)
        return {"type": "image", "source": _source(part)}
    if context != "assistant":
        notes.drop(i, what, f"{PROVIDER} takes thinking only from the model")
        return None
    if isinstance(part, ThinkingPart):
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
        return block
    assert isinstance(part, RedactedThinkingPart)
    if part.provider not in (None, PROVIDER):
        notes.drop(i, what, f"it is {part.provider}'s; {PROVIDER} takes only its own")
        return None
    return {"type": "redacted_thinking", "data": part.data}


part_block: Final = partial(write_part, _own_block)
"""Part ``j`` of message ``i`` written for the provider (see :func:`write_part`)."""


def tool_result_block(message: Message, notes: Notes, i: int, ident: str) -> dict[str, Any]:
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
