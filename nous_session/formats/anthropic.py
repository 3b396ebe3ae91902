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

from datetime import datetime
from typing import Any

import attrs

from nous_session.formats._anthropic_writing import (
    IN_MESSAGES,
    PROVIDER,
    dump,
    part_block,
    tool_result_block,
    tool_use_block,
)
from nous_session.formats._common import (
    Notes,
    Path,
    append_user_turn,
    diff,
    fail,
    need,
    need_list,
    need_object,
    plain_json,
    with_extras,
)
from nous_session.formats._tool_calls import arrange, named_from_calls
from nous_session.message import Message, Role, ToolCall
from nous_session.parts import (
    ImagePart,
    Part,
    ProviderPart,
    RedactedThinkingPart,
    TextPart,
    ThinkingPart,
)

__all__ = ["dump", "load"]


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
    return named_from_calls(out)  # a tool_result has no name of its own: it is its call's


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
        append_user_turn(out, produced, extras, PROVIDER, self.created_at)

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
        default = tool_result_block(plain, Notes(PROVIDER), 0, ident)
        return attrs.evolve(plain, provider_data=with_extras(diff(block, default), PROVIDER))

    def item(self, block: object, where: Path) -> Part | ToolCall:
        block = need_object(PROVIDER, block, where, "a content block")
        if block.get("type") != "tool_use":
            return self.part(block, where, "assistant")
        ident = need(PROVIDER, block, "id", str, where)
        name = need(PROVIDER, block, "name", str, where)
        arguments = need(PROVIDER, block, "input", dict, where)
        plain = ToolCall(ident, name, arguments)
        default = tool_use_block(plain, ident, Notes(PROVIDER), 0, 0)
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
        default = part_block(plain, Notes(PROVIDER), 0, 0, context)
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
