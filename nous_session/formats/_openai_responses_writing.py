"""Writing messages as OpenAI Responses input items (the reader, in
:mod:`nous_session.formats.openai_responses`, writes a message again to know its default form)."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any, Final

from nous_session import parts
from nous_session._json import JSON
from nous_session.formats._common import (
    Notes,
    copy_object,
    data_url,
    merge,
    own,
    part_kind,
    text_or_parts,
    unsupported,
    url_media_type,
    write_part,
)
from nous_session.formats._tool_calls import CallIds, Placed, arguments_text, elements
from nous_session.message import Message, Role, ToolCall

PROVIDER: Final = "openai-responses"
ROLES: Final = {"system": Role.SYSTEM, "developer": Role.DEVELOPER, "user": Role.USER}
_CONTENT_TYPES: Final = frozenset(
    {"output_text", "input_text", "refusal", "input_image", "input_file", "input_audio"}
)
"""Types of the parts of a message item's content (any other ProviderPart is a whole item)."""


def dump(messages: Sequence[Message], notes: Notes) -> list[dict[str, JSON]]:
    """The ``input`` items for ``messages``; what cannot go goes to ``notes``.

    Args:
        messages: the conversation.
        notes: collects what could not be carried.

    Returns:
        The items: one per user, system, developer and tool message; an assistant message gives
        its reasoning, message and function call items in order.
    """
    ids = CallIds(notes)
    out: list[dict[str, JSON]] = []
    for i, message in enumerate(messages):
        notes.foreign(i, None, message.provider_data)
        out.extend(message_items(message, notes, i, ids))
    return out


def message_items(message: Message, notes: Notes, i: int, ids: CallIds) -> list[dict[str, Any]]:
    role = message.role
    extras = own(message.provider_data, PROVIDER)
    if role is Role.ASSISTANT:
        unsupported(message, notes, i)
        return _assistant(message, notes, i, ids, extras)
    if role is Role.TOOL:
        unsupported(message, notes, i, name=True)
        if message.is_error:
            notes.drop(i, "the error flag", f"{PROVIDER} function outputs have none")
        item: dict[str, Any] = {
            "type": "function_call_output",
            "call_id": ids.result_id(i, message),
            "output": _content(message, notes, i, "output"),
        }
        if message.name is not None:
            item["name"] = message.name
        return [merge(item, extras)]
    unsupported(message, notes, i)
    item = {"role": role.value, "content": _content(message, notes, i, "input")}
    return [merge(item, extras)]


def _content(message: Message, notes: Notes, i: int, context: str) -> str | list[Any]:
    content = text_or_parts(message)
    if isinstance(content, str):
        return content
    written = (content_part(part, notes, i, j, context) for j, part in enumerate(content))
    return [block for block in written if block is not None]


def _own_block(
    part: parts.Part, what: str, notes: Notes, i: int, context: str
) -> dict[str, Any] | None:
    if isinstance(part, parts.TextPart):
        if context == "assistant":
            block = {"type": "output_text", "text": part.text, "annotations": []}
        else:
            block = {"type": "input_text", "text": part.text}
        return block
    if isinstance(part, parts.ImagePart):
        if context == "assistant":
            notes.drop(i, what, f"{PROVIDER} takes images only from the user and from tools")
            return None
        block = {"type": "input_image"}
        if part.detail is not None or context == "input":  # required in messages only
            block["detail"] = part.detail or "auto"
        if part.file_id is not None:
            block["file_id"] = part.file_id
        else:
            url_media_type(part, notes, i, what)
            block["image_url"] = data_url(part)
        return block
    notes.drop(i, what)
    return None


content_part: Final = partial(write_part, _own_block)
"""Part ``j`` of message ``i`` written for the provider (see :func:`write_part`)."""


def _assistant(
    message: Message, notes: Notes, i: int, ids: CallIds, extras: Any
) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    run: list[parts.Part] = []
    first = True

    def flush() -> None:
        nonlocal first
        if not run:
            return
        texts = [part for part in run if isinstance(part, parts.TextPart)]
        if len(texts) == len(run) and not any(PROVIDER in part.provider_data for part in texts):
            for part in texts:  # (the joined string has no place for another's fields)
                notes.foreign(i, "a text part", part.provider_data)
            text: Any = "".join(part.text for part in texts)
        else:
            text = [content_part(part, notes, i, -1, "assistant") for part in run]
        item = {"role": "assistant", "content": text}
        items.append(merge(item, extras) if first else item)
        first = False
        run.clear()

    content = message.content
    if isinstance(content, str) or content == () or (content is None and not message.tool_calls):
        # String content (then the calls), an empty part list, or an empty message.
        text: Any = content if isinstance(content, str) else ([] if content == () else "")
        items.append(merge({"role": "assistant", "content": text}, extras))
        first = False
    for j, element in elements(message, notes, i):
        if isinstance(element, Placed):
            flush()
            ident = ids.call_id(i, element.index, element.call)
            items.append(call_item(element.call, ident, notes, i, element.index))
            continue
        if isinstance(element, parts.TextPart | parts.OtherPart):
            run.append(element)
        elif isinstance(element, parts.ProviderPart) and element.provider == PROVIDER:
            if element.data.get("type") in _CONTENT_TYPES:
                run.append(element)
            else:
                flush()
                items.append(copy_object(element.data))
        elif isinstance(element, parts.ThinkingPart):
            flush()
            reasoning = reasoning_item(element, notes, i, j)
            if reasoning is not None:
                items.append(reasoning)
        elif isinstance(element, parts.ProviderPart):
            notes.drop(i, f"the {part_kind(element)} (part {j})")
        elif isinstance(element, parts.RedactedThinkingPart):
            notes.drop(i, f"redacted thinking (part {j})", f"{PROVIDER} has no place for it")
        else:
            notes.drop(
                i,
                f"{part_kind(element)} (part {j})",
                f"{PROVIDER} takes images only from the user and from tools",
            )
    flush()
    return items


def reasoning_item(part: parts.ThinkingPart, notes: Notes, i: int, j: int) -> dict[str, Any] | None:
    what = f"thinking (part {j})"
    if part.provider not in (None, PROVIDER):
        notes.drop(i, what, f"it is {part.provider}'s; {PROVIDER} takes only its own reasoning")
        return None
    if part.id is None:
        notes.drop(i, what, f"it has no reasoning item id, which {PROVIDER} needs")
        return None
    notes.foreign(i, what, part.provider_data)
    item: dict[str, Any] = {
        "type": "reasoning",
        "id": part.id,
        "summary": [{"type": "summary_text", "text": text} for text in part.summary or ()],
    }
    if part.text:
        item["content"] = [{"type": "reasoning_text", "text": part.text}]
    if part.signature is not None:
        item["encrypted_content"] = part.signature
    return merge(item, own(part.provider_data, PROVIDER))


def call_item(call: ToolCall, ident: str, notes: Notes, i: int, k: int) -> dict[str, Any]:
    notes.foreign(i, f"tool call {k} ({call.name})", call.provider_data)
    item = {
        "type": "function_call",
        "call_id": ident,
        "name": call.name,
        "arguments": arguments_text(call),
    }
    if call.item_id is not None:
        item["id"] = call.item_id
    if call.status is not None:
        item["status"] = call.status
    return merge(item, own(call.provider_data, PROVIDER))
