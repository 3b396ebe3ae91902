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

from datetime import datetime
from typing import Any

import attrs

from nous_session.formats._common import (
    Notes,
    Path,
    diff,
    fail,
    image_from_url,
    need,
    need_list,
    need_object,
    plain_json,
    same,
    with_extras,
)
from nous_session.formats._openai_responses_writing import (
    PROVIDER,
    ROLES,
    call_item,
    content_part,
    dump,
    message_items,
    reasoning_item,
)
from nous_session.formats._tool_calls import CallIds, arrange
from nous_session.message import Message, Role, ToolCall
from nous_session.parts import ImagePart, Part, ProviderPart, TextPart, ThinkingPart

__all__ = ["dump", "load"]


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
            elif role in ROLES:
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
        plain = Message(ROLES[item["role"]], content, created_at=self.created_at)
        default = message_items(plain, Notes(PROVIDER), 0, CallIds(Notes(PROVIDER)))[0]
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
        default = message_items(plain, Notes(PROVIDER), 0, CallIds(Notes(PROVIDER)))[0]
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
        default = content_part(plain, Notes(PROVIDER), 0, 0, context)
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
        if same(message_items(message, Notes(PROVIDER), 0, CallIds(Notes(PROVIDER))), items):
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
        emitted = message_items(plain, Notes(PROVIDER), 0, CallIds(Notes(PROVIDER)))
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
        default = reasoning_item(plain, Notes(PROVIDER), 0, 0)
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
        default = call_item(plain, ident, Notes(PROVIDER), 0, 0)
        return attrs.evolve(plain, provider_data=with_extras(diff(item, default), PROVIDER))
