"""OpenAI Responses API: the ``input`` items list.

Reading and writing are exact for every item of a conversation: ``user``, ``system`` and
``developer`` messages (string or ``input_text``/``input_image``/``input_file`` content),
assistant messages in either form (``{"role": "assistant", "content": "..."}``, or the output
form with ``id``, ``status``, ``output_text`` parts and their annotations), ``reasoning`` items
(``id``, ``summary``, ``content``, ``encrypted_content``, ``status``), ``function_call`` items
(``call_id``, ``id``, ``status``, JSON-string ``arguments``), ``function_call_output`` items (a
string or a list of parts), and any other item (web search, MCP, item references...) verbatim.

The model's turn is a run of items: reasoning, a message, function calls. Reading makes one
assistant message of a run holding at most one message item: reasoning becomes
:class:`~nous_session.parts.ThinkingPart` (with ``id``, ``summary`` and the
``encrypted_content`` as its signature), calls become ``tool_calls`` (with ``item_id`` and
``status``), other items :class:`~nous_session.parts.ProviderPart` values, all in their order.
Output-form text parts keep their fields in ``provider_data`` (an empty entry marks a part that
came as a list); plain text parts are written as string content.

Converting other providers' messages: thinking travels only as OpenAI's own reasoning items;
error flags and images outside user messages have no place; tool calls without an id get one.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Final

import attrs

from nous_session._json import JSON
from nous_session.formats._common import (
    CallIds,
    Notes,
    Path,
    Placed,
    arguments_text,
    arrange,
    copy_object,
    data_url,
    diff,
    elements,
    fail,
    image_from_url,
    merge,
    need,
    need_list,
    need_object,
    own,
    part_kind,
    plain_json,
    same,
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

PROVIDER: Final = "openai-responses"
_ROLES: Final = {"system": Role.SYSTEM, "developer": Role.DEVELOPER, "user": Role.USER}
_CONTENT_TYPES: Final = frozenset(
    {"output_text", "input_text", "refusal", "input_image", "input_file", "input_audio"}
)
"""Types of the parts of a message item's content (any other ProviderPart is a whole item)."""


# Writing --------------------------------------------------------------------------------------


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
        out.extend(_items(message, notes, i, ids))
    return out


def _items(message: Message, notes: Notes, i: int, ids: CallIds) -> list[dict[str, Any]]:
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
    content = message.content
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    blocks = []
    for j, part in enumerate(content):
        block = _block(part, notes, i, j, context)
        if block is not None:
            blocks.append(block)
    return blocks


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
        if context == "assistant":
            block = {"type": "output_text", "text": part.text, "annotations": []}
        else:
            block = {"type": "input_text", "text": part.text}
        return merge(block, extras)
    if isinstance(part, ImagePart) and context != "assistant":
        assert isinstance(part, ImagePart)
        block = {"type": "input_image"}
        if part.detail is not None or context == "input":  # required in messages only
            block["detail"] = part.detail or "auto"
        if part.file_id is not None:
            block["file_id"] = part.file_id
        else:
            url_media_type(part, notes, i, what)
            block["image_url"] = data_url(part)
        return merge(block, extras)
    if isinstance(part, ImagePart):
        notes.drop(i, what, f"{PROVIDER} takes images only from the user and from tools")
        return None
    notes.drop(i, what)
    return None


def _assistant(
    message: Message, notes: Notes, i: int, ids: CallIds, extras: Any
) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    run: list[Part] = []
    first = True

    def flush() -> None:
        nonlocal first
        if not run:
            return
        texts = [part for part in run if isinstance(part, TextPart)]
        if len(texts) == len(run) and not any(PROVIDER in part.provider_data for part in texts):
            for part in texts:  # (the joined string has no place for another's fields)
                notes.foreign(i, "a text part", part.provider_data)
            text: Any = "".join(part.text for part in texts)
        else:
            text = [_block(part, notes, i, -1, "assistant") for part in run]
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
            items.append(_call(element.call, ident, notes, i, element.index))
            continue
        if isinstance(element, TextPart | OtherPart):
            run.append(element)
        elif isinstance(element, ProviderPart) and element.provider == PROVIDER:
            if element.data.get("type") in _CONTENT_TYPES:
                run.append(element)
            else:
                flush()
                items.append(copy_object(element.data))
        elif isinstance(element, ThinkingPart):
            flush()
            reasoning = _reasoning(element, notes, i, j)
            if reasoning is not None:
                items.append(reasoning)
        elif isinstance(element, ProviderPart):
            notes.drop(i, f"the {part_kind(element)} (part {j})")
        elif isinstance(element, RedactedThinkingPart):
            notes.drop(i, f"redacted thinking (part {j})", f"{PROVIDER} has no place for it")
        else:
            notes.drop(
                i,
                f"{part_kind(element)} (part {j})",
                f"{PROVIDER} takes images only from the user and from tools",
            )
    flush()
    return items


def _reasoning(part: ThinkingPart, notes: Notes, i: int, j: int) -> dict[str, Any] | None:
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


def _call(call: ToolCall, ident: str, notes: Notes, i: int, k: int) -> dict[str, Any]:
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


# Reading --------------------------------------------------------------------------------------


def load(payload: object, created_at: datetime) -> list[Message]:
    """The messages of a Responses ``input`` items list.

    Args:
        payload: the ``input`` of a request: a list of items (a plain string reads as one user
            message).
        created_at: the time every message gets (a payload has none).

    Returns:
        The messages, in order (see the module docstring for how items group).

    Raises:
        FormatError: the payload is not of this form; the message says where and why.
    """
    data = plain_json(PROVIDER, payload)
    if type(data) is str:
        return [Message(Role.USER, data, created_at=created_at)]
    items = need_list(PROVIDER, data, (), "the payload (the input items list)")
    reader = _Reader(created_at)
    out: list[Message] = []
    group: list[tuple[Path, dict[str, Any]]] = []
    for n, item in enumerate(items):
        where: Path = (n,)
        item = need_object(PROVIDER, item, where, "an input item")
        kind, role = item.get("type"), item.get("role")
        if role is not None and kind in (None, "message"):
            if role == "assistant":
                if any(_is_message(entry) for _, entry in group):
                    out.extend(reader.group(group))
                    group = []
                group.append((where, item))
            elif role in _ROLES:
                out.extend(reader.group(group))
                group = []
                out.append(reader.input_message(item, where))
            else:
                fail(PROVIDER, (*where, "role"), f"unknown role {role!r}")
        elif kind == "function_call_output":
            out.extend(reader.group(group))
            group = []
            out.append(reader.output(item, where))
        elif type(kind) is str:
            group.append((where, item))
        else:
            fail(PROVIDER, where, 'an input item needs a string "type" or a "role"')
    out.extend(reader.group(group))
    return out


def _is_message(item: dict[str, Any]) -> bool:
    return item.get("role") is not None and item.get("type") in (None, "message")


@attrs.define
class _Reader:
    created_at: datetime

    def input_message(self, item: dict[str, Any], where: Path) -> Message:
        content = self.content(item, where, "input")
        plain = Message(_ROLES[item["role"]], content, created_at=self.created_at)
        default = _items(plain, Notes(PROVIDER), 0, CallIds(Notes(PROVIDER)))[0]
        return attrs.evolve(plain, provider_data=with_extras(diff(item, default), PROVIDER))

    def output(self, item: dict[str, Any], where: Path) -> Message:
        ident = item.get("call_id")
        if ident is not None and type(ident) is not str:
            fail(PROVIDER, (*where, "call_id"), "must be a string")
        if "output" not in item:
            fail(PROVIDER, where, 'a function_call_output needs "output"')
        name = item.get("name")
        plain = Message(
            Role.TOOL,
            self.content(item, where, "output", key="output"),
            tool_call_id=ident,
            name=name if type(name) is str else None,
            created_at=self.created_at,
        )
        default = _items(plain, Notes(PROVIDER), 0, CallIds(Notes(PROVIDER)))[0]
        return attrs.evolve(plain, provider_data=with_extras(diff(item, default), PROVIDER))

    def content(
        self, item: dict[str, Any], where: Path, context: str, key: str = "content"
    ) -> str | tuple[Part, ...]:
        content = item.get(key)
        if type(content) is str:
            return content
        blocks = need_list(PROVIDER, content, (*where, key), f"{key} (not a string)")
        return tuple(self.part(block, (*where, key, k), context) for k, block in enumerate(blocks))

    def part(self, block: object, where: Path, context: str) -> Part:
        block = need_object(PROVIDER, block, where, "a content part")
        kind = need(PROVIDER, block, "type", str, where)
        plain: Part
        if kind in ("input_text", "output_text"):
            plain = TextPart(need(PROVIDER, block, "text", str, where))
        elif kind == "input_image" and context != "assistant":
            url, file_id, detail = block.get("image_url"), block.get("file_id"), block.get("detail")
            fields: dict[str, Any] = {"detail": detail if type(detail) is str else None}
            if type(url) is str and file_id is None:
                plain = image_from_url(url, **fields)
            elif type(file_id) is str and url is None:
                plain = ImagePart(file_id=file_id, **fields)
            else:
                return ProviderPart(PROVIDER, block)
        else:
            return ProviderPart(PROVIDER, block)
        default = _block(plain, Notes(PROVIDER), 0, 0, context)
        assert default is not None
        extras = diff(block, default)
        if context == "assistant":  # the entry, even empty, marks a part that came in a list
            return attrs.evolve(plain, provider_data={PROVIDER: extras})
        return attrs.evolve(plain, provider_data=with_extras(extras, PROVIDER))

    def group(self, group: list[tuple[Path, dict[str, Any]]]) -> list[Message]:
        if not group:
            return []
        items = [item for _, item in group]
        message = self.assistant(group)
        if same(_items(message, Notes(PROVIDER), 0, CallIds(Notes(PROVIDER))), items):
            return [message]
        # A run this reading cannot give back as one message (a message item with an empty
        # content list among other items, say): one message per item, each exact.
        return [self.assistant([entry]) for entry in group]

    def assistant(self, group: list[tuple[Path, dict[str, Any]]]) -> Message:
        items: list[Part | ToolCall] = []
        message_item: dict[str, Any] | None = None
        for where, item in group:
            kind = item.get("type")
            if _is_message(item):
                message_item = item
                read = self.content(item, where, "assistant")
                items.extend((TextPart(read),) if isinstance(read, str) else read)
            elif kind == "reasoning":
                items.append(self.reasoning(item, where))
            elif kind == "function_call":
                items.append(self.call(item, where))
            else:
                items.append(ProviderPart(PROVIDER, item))
        parts, calls = arrange(items)
        content: str | tuple[Part, ...] | None = parts or None
        head = group[0][1]
        if message_item is head and all(
            item.get("type") == "function_call" for _, item in group[1:]
        ):
            # The usual turn: the message, then its calls. Its content is the message's.
            content = head["content"] if type(head["content"]) is str else parts
        plain = Message(Role.ASSISTANT, content, tool_calls=calls, created_at=self.created_at)
        if message_item is None:
            return plain
        emitted = _items(plain, Notes(PROVIDER), 0, CallIds(Notes(PROVIDER)))
        default = next((item for item in emitted if _is_message(item)), {})
        extras = diff(message_item, default)
        return attrs.evolve(plain, provider_data=with_extras(extras, PROVIDER))

    def reasoning(self, item: dict[str, Any], where: Path) -> ThinkingPart:
        ident = need(PROVIDER, item, "id", str, where)
        summary = need(PROVIDER, item, "summary", list, where)
        texts = []
        for k, entry in enumerate(summary):
            entry = need_object(PROVIDER, entry, (*where, "summary", k), "a summary entry")
            texts.append(need(PROVIDER, entry, "text", str, (*where, "summary", k)))
        text = ""
        content = item.get("content")
        if type(content) is list:
            for k, entry in enumerate(content):
                entry = need_object(PROVIDER, entry, (*where, "content", k), "a reasoning text")
                text += need(PROVIDER, entry, "text", str, (*where, "content", k))
        signature = item.get("encrypted_content")
        plain = ThinkingPart(
            text,
            signature=signature if type(signature) is str else None,
            summary=texts,
            id=ident,
            provider=PROVIDER,
        )
        default = _reasoning(plain, Notes(PROVIDER), 0, 0)
        assert default is not None
        return attrs.evolve(plain, provider_data=with_extras(diff(item, default), PROVIDER))

    def call(self, item: dict[str, Any], where: Path) -> ToolCall:
        ident = need(PROVIDER, item, "call_id", str, where)
        name = need(PROVIDER, item, "name", str, where)
        arguments = need(PROVIDER, item, "arguments", str, where)
        item_id, status = item.get("id"), item.get("status")
        plain = ToolCall(
            ident,
            name,
            arguments,
            item_id=item_id if type(item_id) is str else None,
            status=status if type(status) is str else None,
        )
        default = _call(plain, ident, Notes(PROVIDER), 0, 0)
        return attrs.evolve(plain, provider_data=with_extras(diff(item, default), PROVIDER))
