"""OpenAI Chat Completions: the ``messages`` list.

Reading and writing are exact for every message of a conversation: ``system``, ``developer``,
``user``, ``assistant``, ``tool`` and the deprecated ``function`` role; string or part-list
content (``text``, ``image_url`` with URL or base64 ``data:`` URL and ``detail``, and any other
part verbatim); ``name``; assistant ``tool_calls`` with their ids and JSON-string arguments;
``reasoning_content`` (the field DeepSeek, vLLM and other compatible servers use for the model's
reasoning; not part of OpenAI's own API); and any other field (``refusal``, ``audio``,
``prompt_cache_breakpoint``...) on the object it came with.

A ``function`` message reads as a tool message without a ``tool_call_id``, and writes back the
same way. Chat Completions has no place for thinking blocks, signatures, error flags on tool
results, images in tool results, or tool calls interleaved with text: converting such messages
drops them and says so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import partial
from typing import Any, Final

import attrs

from nous_session._json import JSON
from nous_session.formats._common import (
    Notes,
    Path,
    call_item_fields,
    data_url,
    diff,
    fail,
    image_from_url,
    merge,
    need,
    need_list,
    need_object,
    own,
    plain_json,
    unsupported,
    url_media_type,
    with_extras,
    write_part,
)
from nous_session.formats._tool_calls import (
    CallIds,
    Placed,
    arguments_text,
    call_names,
    elements,
    named_by_its_call,
    named_from_calls,
)
from nous_session.message import Message, Role, ToolCall
from nous_session.parts import ImagePart, Part, ProviderPart, TextPart

__all__ = ["dump", "load"]

PROVIDER: Final = "openai-chat"
_ROLES: Final = {"system": Role.SYSTEM, "developer": Role.DEVELOPER, "user": Role.USER}


# Writing --------------------------------------------------------------------------------------


def dump(messages: Sequence[Message], notes: Notes) -> list[dict[str, JSON]]:
    """The ``messages`` list for ``messages``; what cannot go goes to ``notes``.

    Args:
        messages: the conversation.
        notes: collects what could not be carried.

    Returns:
        One Chat Completions message per message.
    """
    ids = CallIds(notes)
    names = call_names(messages)
    out: list[dict[str, JSON]] = []
    for i, message in enumerate(messages):
        notes.foreign(i, None, message.provider_data)
        out.append(_message(message, notes, i, ids, names))
    return out


def _message(
    message: Message, notes: Notes, i: int, ids: CallIds, names: Mapping[str, str] | None = None
) -> dict[str, Any]:
    role = message.role
    data: dict[str, Any]
    if role is Role.TOOL:
        # A function message carries the name; a tool message (with a call id) has no place,
        # and needs none when the name is its call's (the reader takes it from the call).
        carried = message.tool_call_id is None or named_by_its_call(message, names or {})
        unsupported(message, notes, i, name=carried)
        if message.is_error:
            notes.drop(i, "the error flag", f"{PROVIDER} tool messages have none")
        if message.tool_call_id is None:
            data = {"role": "function", "name": message.name or ""}
            content = _content(message, notes, i, "function")
            if isinstance(content, list):  # a function message's content is a string
                if any(block.get("type") != "text" for block in content):
                    notes.drop(i, "the parts other than text", "function messages hold a string")
                texts = [block for block in content if block.get("type") == "text"]
                content = "".join(str(block.get("text", "")) for block in texts)
            data["content"] = content
        else:
            data = {"role": "tool", "tool_call_id": ids.result_id(i, message)}
            data["content"] = _content(message, notes, i, "tool")
    elif role is Role.ASSISTANT:
        unsupported(message, notes, i, name=True, reasoning=True)
        data = {"role": "assistant"}
        content = _content(message, notes, i, "assistant")
        if content is not None:
            data["content"] = content
        if message.name is not None:
            data["name"] = message.name
        if message.tool_calls:
            data["tool_calls"] = _tool_calls(message, notes, i, ids)
        if message.reasoning_content is not None:
            data["reasoning_content"] = message.reasoning_content
    else:
        unsupported(message, notes, i, name=True)
        data = {"role": role.value, "content": _content(message, notes, i, role.value)}
        if message.name is not None:
            data["name"] = message.name
    return merge(data, own(message.provider_data, PROVIDER))


def _tool_calls(message: Message, notes: Notes, i: int, ids: CallIds) -> list[Any]:
    calls = []
    for k, call in enumerate(message.tool_calls):
        notes.foreign(i, f"tool call {k} ({call.name})", call.provider_data)
        call_item_fields(call, notes, i, k)
        data = {
            "id": ids.call_id(i, k, call),
            "type": "function",
            "function": {"name": call.name, "arguments": arguments_text(call)},
        }
        calls.append(merge(data, own(call.provider_data, PROVIDER)))
    return calls


def _content(message: Message, notes: Notes, i: int, context: str) -> str | list[Any] | None:
    content = message.content
    if content is None:
        return None if context == "assistant" else ""
    if isinstance(content, str):
        return content
    blocks: list[Any] = []
    seen_call = False
    for j, item in elements(message, notes, i):
        if isinstance(item, Placed):
            seen_call = True
            continue
        if seen_call and j >= 0:
            notes.drop(
                i,
                "the places of the tool calls among the parts",
                f"{PROVIDER} sends tool calls after the content",
            )
            seen_call = False
        block = _block(item, notes, i, j, context)
        if block is not None:
            blocks.append(block)
    return blocks


def _own_block(part: Part, what: str, notes: Notes, i: int, context: str) -> dict[str, Any] | None:
    if isinstance(part, TextPart):
        return {"type": "text", "text": part.text}
    if isinstance(part, ImagePart):
        if context != "user":
            notes.drop(i, what, f"{PROVIDER} takes images only in user messages")
            return None
        if part.file_id is not None:
            notes.drop(i, what, f"{PROVIDER} takes images by URL or data only")
            return None
        url_media_type(part, notes, i, what)
        image: dict[str, Any] = {"url": data_url(part)}
        if part.detail is not None:
            image["detail"] = part.detail
        return {"type": "image_url", "image_url": image}
    notes.drop(i, what)
    return None


_block: Final = partial(write_part, _own_block)
"""Part ``j`` of message ``i`` written for the provider (see :func:`write_part`)."""


# Reading --------------------------------------------------------------------------------------


def load(payload: object, created_at: datetime) -> list[Message]:
    """The messages of a Chat Completions ``messages`` list.

    Args:
        payload: the ``messages`` list of a request.
        created_at: the time every message gets (a payload has none).

    Returns:
        One message per entry.

    Raises:
        FormatError: the payload is not of this form; the message says where and why.
    """
    data = plain_json(PROVIDER, payload)
    entries = need_list(PROVIDER, data, (), "the payload (the messages list)")
    # A tool message has no name of its own: it is its call's.
    return named_from_calls([_read(entry, (n,), created_at) for n, entry in enumerate(entries)])


def _read(entry: object, where: Path, created_at: datetime) -> Message:
    entry = need_object(PROVIDER, entry, where, "a message")
    role = need(PROVIDER, entry, "role", str, where)
    name = entry.get("name")
    if name is not None and type(name) is not str:
        fail(PROVIDER, (*where, "name"), "must be a string")
    content: Any = _read_content(entry, where, role)
    fields: dict[str, Any] = {}
    if role in _ROLES:
        plain = Message(_ROLES[role], content, name=name, created_at=created_at)
    elif role == "assistant":
        calls = entry.get("tool_calls")
        if calls is not None:
            calls = need_list(PROVIDER, calls, (*where, "tool_calls"), "tool_calls")
            fields["tool_calls"] = [
                _read_call(call, (*where, "tool_calls", k)) for k, call in enumerate(calls)
            ]
        reasoning = entry.get("reasoning_content")
        if type(reasoning) is str:
            fields["reasoning_content"] = reasoning
        plain = Message(Role.ASSISTANT, content, name=name, created_at=created_at, **fields)
    elif role == "tool":
        ident = need(PROVIDER, entry, "tool_call_id", str, where)
        plain = Message(Role.TOOL, content, tool_call_id=ident, created_at=created_at)
    elif role == "function":
        plain = Message(
            Role.TOOL,
            content,
            name=need(PROVIDER, entry, "name", str, where),
            created_at=created_at,
        )
    else:
        fail(
            PROVIDER,
            (*where, "role"),
            f"unknown role {role!r}; roles are system, developer, user, assistant, tool, function",
        )
    default = _message(plain, Notes(PROVIDER), 0, CallIds(Notes(PROVIDER)))
    return attrs.evolve(plain, provider_data=with_extras(diff(entry, default), PROVIDER))


def _read_content(entry: dict[str, Any], where: Path, role: str) -> str | tuple[Part, ...] | None:
    content = entry.get("content")
    if content is None or type(content) is str:
        return content
    blocks = need_list(PROVIDER, content, (*where, "content"), "content (not a string)")
    context = "user" if role == "user" else role
    return tuple(
        _read_part(block, (*where, "content", k), context) for k, block in enumerate(blocks)
    )


def _read_part(block: object, where: Path, context: str) -> Part:
    block = need_object(PROVIDER, block, where, "a content part")
    kind = need(PROVIDER, block, "type", str, where)
    plain: Part
    if kind == "text":
        plain = TextPart(need(PROVIDER, block, "text", str, where))
    elif kind == "image_url" and context == "user":
        image = need(PROVIDER, block, "image_url", dict, where)
        url = need(PROVIDER, image, "url", str, (*where, "image_url"))
        detail = image.get("detail")
        plain = image_from_url(url, detail=detail if type(detail) is str else None)
    else:
        return ProviderPart(PROVIDER, block)
    default = _block(plain, Notes(PROVIDER), 0, 0, context)
    assert default is not None
    return attrs.evolve(plain, provider_data=with_extras(diff(block, default), PROVIDER))


def _read_call(call: object, where: Path) -> ToolCall:
    call = need_object(PROVIDER, call, where, "a tool call")
    ident = need(PROVIDER, call, "id", str, where)
    if call.get("type") == "custom":
        custom = need(PROVIDER, call, "custom", dict, where)
        name = need(PROVIDER, custom, "name", str, (*where, "custom"))
        arguments: Any = need(PROVIDER, custom, "input", str, (*where, "custom"))
    else:
        function = need(PROVIDER, call, "function", dict, where)
        name = need(PROVIDER, function, "name", str, (*where, "function"))
        arguments = function.get("arguments", "")
        if type(arguments) not in (str, dict):
            fail(PROVIDER, (*where, "function", "arguments"), "must be a string")
    plain = ToolCall(ident, name, arguments)
    default = _tool_calls(
        Message(Role.ASSISTANT, tool_calls=[plain]), Notes(PROVIDER), 0, CallIds(Notes(PROVIDER))
    )[0]
    return attrs.evolve(plain, provider_data=with_extras(diff(call, default), PROVIDER))
