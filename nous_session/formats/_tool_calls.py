"""Tool calls among a message's parts, as the provider converters write and read them: their
places among the parts, their arguments as text or as an object, and the ids some providers need."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

import attrs

from nous_session._json import JSON, copy_json_object, dumps
from nous_session.formats._common import Notes, plain_json
from nous_session.message import Message, Role, ToolCall
from nous_session.parts import Part, ToolCallPart


@attrs.frozen
class Placed:
    """A tool call at its place among a message's parts: ``message.tool_calls[index]``."""

    index: int
    call: ToolCall


def elements(message: Message, notes: Notes, index: int) -> list[tuple[int, Part | Placed]]:
    """The message's parts with its tool calls in their places, in order, with positions.

    Each item is ``(j, item)``: ``j`` is the part's index in the content (for notes; ``-1`` for
    a call no part places). A :class:`ToolCallPart` puts its call where it stands; calls no part
    places follow all the parts. A reference to a call the message does not have, or a second
    one to the same call, is dropped with a note. String content is not a part: the caller
    handles it.
    """
    calls = message.tool_calls
    out: list[tuple[int, Part | Placed]] = []
    placed: set[int] = set()
    content = message.content
    if content is not None and not isinstance(content, str):
        for j, part in enumerate(content):
            if type(part) is ToolCallPart:
                k = part.index
                if k < len(calls) and k not in placed:
                    placed.add(k)
                    out.append((j, Placed(k, calls[k])))
                else:
                    notes.drop(
                        index, f"the reference to tool call {k} (part {j})", "there is no such call"
                    )
            else:
                out.append((j, part))
    out.extend((-1, Placed(k, call)) for k, call in enumerate(calls) if k not in placed)
    return out


def arrange(items: Sequence[Part | ToolCall]) -> tuple[tuple[Part, ...], tuple[ToolCall, ...]]:
    """Content parts and tool calls for ``items`` read in provider order.

    References (:class:`ToolCallPart`) are added only when a call comes before some other part;
    when every call follows all the parts, they are left out.
    """
    calls = tuple(item for item in items if isinstance(item, ToolCall))
    parts: list[Part] = [item for item in items if not isinstance(item, ToolCall)]
    if not calls or not parts:
        return tuple(parts), calls
    last_part = max(k for k, item in enumerate(items) if not isinstance(item, ToolCall))
    first_call = min(k for k, item in enumerate(items) if isinstance(item, ToolCall))
    if first_call > last_part:
        return tuple(parts), calls
    out: list[Part] = []
    count = 0
    for item in items:
        if isinstance(item, ToolCall):
            out.append(ToolCallPart(count))
            count += 1
        else:
            out.append(item)
    return tuple(out), calls


def arguments_text(call: ToolCall) -> str:
    """The call's arguments as the JSON string OpenAI wants (kept as written when a string)."""
    arguments = call.arguments
    if isinstance(arguments, str):
        return arguments
    # Exact for ints wider than 64 bits; the read-only mapping is written as the dict it is.
    return dumps(arguments).decode()


def arguments_object(call: ToolCall, notes: Notes, index: int, k: int) -> dict[str, JSON]:
    """The call's arguments as the JSON object Anthropic and Gemini want.

    A string is parsed; one that is not a JSON object is sent as ``{}`` with a note.
    """
    arguments = call.arguments
    if not isinstance(arguments, str):
        return copy_json_object(arguments)
    try:
        value = json.loads(arguments)
    except ValueError:
        value = None
    if not isinstance(value, dict):  # json.loads makes exact dicts: same as type() is dict
        notes.drop(
            index,
            f"the arguments of tool call {k} ({call.name})",
            f"they are not a JSON object, and {notes.provider} needs one; sent {{}}",
        )
        return {}
    copied: dict[str, JSON] = plain_json(notes.provider, value)  # a dict in: a dict out
    return copied


class CallIds:
    """Gives tool calls without an id (Gemini's) one, and their results the same one.

    Only for providers that need ids: a call with ``id == ""`` is sent as ``call_{i}_{k}``; a
    later result with an empty ``tool_call_id`` takes the first such id not yet answered whose
    call has the result's ``name`` (any, when the result has no name).
    """

    def __init__(self, notes: Notes) -> None:
        self.notes = notes
        self.pending: list[tuple[str, str]] = []

    def call_id(self, index: int, k: int, call: ToolCall) -> str:
        """The id to send for ``message[index].tool_calls[k]``."""
        if call.id:
            return call.id
        made = f"call_{index}_{k}"
        self.pending.append((call.name, made))
        self.notes.add(
            f"tool call {k} of message {index} has no id; sent as {made!r}: "
            f"{self.notes.provider} needs one"
        )
        return made

    def result_id(self, index: int, message: Message) -> str:
        """The call id to send for the tool result ``message[index]``."""
        if message.tool_call_id:
            return message.tool_call_id
        for j, (name, made) in enumerate(self.pending):
            if message.name is None or name == message.name:
                del self.pending[j]
                self.notes.add(f"tool result {index} has no call id; sent as {made!r}")
                return made
        self.notes.add(
            f"tool result {index} has no call id, and no call without one is waiting for it: "
            f"{self.notes.provider} needs one"
        )
        return message.tool_call_id or ""


def call_names(messages: Sequence[Message]) -> dict[str, str]:
    """The name of every tool call in ``messages``, by call id."""
    return {call.id: call.name for message in messages for call in message.tool_calls or ()}


def named_by_its_call(message: Message, names: Mapping[str, str]) -> bool:
    """Whether a tool result's ``name`` is its call's: a provider that sends results by call id
    alone loses nothing then (its reader takes the name back from the call)."""
    ident = message.tool_call_id
    return ident is not None and message.name is not None and names.get(ident) == message.name


def named_from_calls(messages: list[Message]) -> list[Message]:
    """``messages`` with each tool result that has no name given its call's name (what a
    provider that sends results by call id alone means by them)."""
    names: dict[str, str] = {}
    out = []
    for message in messages:
        for call in message.tool_calls or ():
            names[call.id] = call.name
        ident = message.tool_call_id
        if message.role is Role.TOOL and message.name is None and ident in names:
            message = attrs.evolve(message, name=names[ident])
        out.append(message)
    return out
