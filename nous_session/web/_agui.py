"""A session's log as AG-UI events, and AG-UI's messages as the session's.

Pure functions over events and Log values: no I/O, no event loop. The streams in
:mod:`nous_session.web._streams` call them for each committed event.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Final

import orjson
from ag_ui.core import (
    AssistantMessage,
    BaseEvent,
    CustomEvent,
    DeveloperMessage,
    FunctionCall,
    MessagesSnapshotEvent,
    RunErrorEvent,
    RunFinishedEvent,
    RunStartedEvent,
    StateSnapshotEvent,
    SystemMessage,
    TextMessageContentEvent,
    TextMessageEndEvent,
    TextMessageStartEvent,
    ToolCallArgsEvent,
    ToolCallEndEvent,
    ToolCallResultEvent,
    ToolCallStartEvent,
    ToolMessage,
    UserMessage,
)
from ag_ui.core import Message as AgUiMessage
from ag_ui.core import ToolCall as AgUiToolCall
from pydantic import BaseModel

from nous_session import Event, EventType, Log, Message, Role, ToolCall

__all__ = [
    "RUN_ERROR",
    "RUN_FINISHED",
    "RUN_STARTED",
    "arguments_text",
    "as_of",
    "from_agui",
    "known_message_ids",
    "message_id",
    "messages_snapshot",
    "translate",
]

# The custom events a run leaves in the log: they make a run's start and end durable, so a
# client that reconnects (to any worker) learns whether the run is still going.
RUN_STARTED: Final = "ag_ui.run_started"
RUN_FINISHED: Final = "ag_ui.run_finished"
RUN_ERROR: Final = "ag_ui.run_error"
RUN_MARKERS: Final = frozenset({RUN_STARTED, RUN_FINISHED, RUN_ERROR})
# The custom event that tells a client which messages an erasure changed.
ERASURE_EVENT: Final = "nous_session.erasure"
# Where a message keeps the id an AG-UI client gave it (AG-UI reserves this metadata key).
METADATA_KEY: Final = "ag-ui"
# The prefix of the ids the server gives messages that came with none (the agent's): the seq.
OWN_PREFIX: Final = "nous:"
_TEXT_ROLES: Final = {
    EventType.USER_MESSAGE: "user",
    EventType.SYSTEM_MESSAGE: "system",
    EventType.DEVELOPER_MESSAGE: "developer",
    EventType.ASSISTANT_MESSAGE: "assistant",
}


def _client_id(metadata: object) -> str | None:
    if isinstance(metadata, Mapping):
        own = metadata.get(METADATA_KEY)
        if isinstance(own, Mapping):
            found = own.get("id")
            if isinstance(found, str):
                return found
    return None


def message_id(seq: int, metadata: object, index: int = 0) -> str:
    """The AG-UI id of a message: the client's (kept in its metadata), else one made of the
    seq of the event it came from (and its place in a multi-message replace)."""
    given = _client_id(metadata)
    if given is not None:
        return given
    return f"{OWN_PREFIX}{seq}" if index == 0 else f"{OWN_PREFIX}{seq}.{index}"


def _seq_of(identifier: str) -> int | None:
    """The seq of the event a server-made id (``nous:<seq>[.<index>]``) names, or None."""
    if identifier.startswith(OWN_PREFIX):
        seq = identifier[len(OWN_PREFIX) :].partition(".")[0]
        if seq.isdecimal():
            return int(seq)
    return None


def known_message_ids(log: Log) -> set[str]:
    """The client-given ids of every message the log holds (on the surface or not).

    The ids the server made (``nous:<seq>``) are not listed: :func:`is_known` recognises them
    by their seq.
    """
    known: set[str] = set()
    for event in log.events():
        given = _client_id(event.data.get("metadata"))
        if given is not None:
            known.add(given)
        messages = event.data.get("messages")
        if isinstance(messages, list):
            for message in messages:
                if isinstance(message, Mapping):
                    given = _client_id(message.get("metadata"))
                    if given is not None:
                        known.add(given)
    return known


def is_known(identifier: str, known: set[str], count: int) -> bool:
    """Whether a message with this id is in a log of ``count`` events whose client-given ids
    are ``known``."""
    if identifier in known:
        return True
    seq = _seq_of(identifier)
    return seq is not None and seq < count


def _text(content: object) -> str:
    """A message's content as AG-UI text: a string as is, the text of its text parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list | tuple):
        return "".join(
            part["text"]
            for part in content
            if isinstance(part, Mapping) and isinstance(part.get("text"), str)
        )
    return ""


def _arguments(arguments: object) -> str:
    if isinstance(arguments, str):
        return arguments
    return orjson.dumps(arguments, default=_plain).decode()


def _plain(value: object) -> object:
    """A read-only mapping (how a Message holds JSON objects) as a dict orjson can encode."""
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"not JSON: {type(value).__name__}")


def _text_message(identifier: str, role: Any, text: str) -> Iterator[BaseEvent]:
    yield TextMessageStartEvent(message_id=identifier, role=role)
    if text:
        yield TextMessageContentEvent(message_id=identifier, delta=text)
    yield TextMessageEndEvent(message_id=identifier)


def _message_events(event: Event, identifier: str) -> Iterator[BaseEvent]:
    data = event.data
    if event.type is EventType.TOOL_RESULT:
        call_id = data.get("tool_call_id")
        yield ToolCallResultEvent(
            message_id=identifier,
            tool_call_id=call_id if isinstance(call_id, str) else "",
            content=_text(data.get("content")),
            role="tool",
        )
        return
    text = _text(data.get("content"))
    calls = data.get("tool_calls")
    if text or not calls:
        yield from _text_message(identifier, _TEXT_ROLES[EventType(event.type)], text)
    yield from tool_call_events(event, identifier)


def tool_call_events(event: Event, identifier: str) -> Iterator[BaseEvent]:
    """The tool calls of the message ``event`` holds (its id ``identifier``) as AG-UI events."""
    calls = event.data.get("tool_calls")
    for call in calls if isinstance(calls, list) else ():
        if not isinstance(call, Mapping):
            continue
        call_id = str(call.get("id", ""))
        yield ToolCallStartEvent(
            tool_call_id=call_id,
            tool_call_name=str(call.get("name", "")),
            parent_message_id=identifier,
        )
        arguments = arguments_text(call)
        if arguments:
            yield ToolCallArgsEvent(tool_call_id=call_id, delta=arguments)
        yield ToolCallEndEvent(tool_call_id=call_id)


def arguments_text(call: Mapping[str, Any]) -> str:
    """A stored tool call's arguments as AG-UI carries them: a string as it was kept (a live
    call's, as streamed), an object as compact JSON."""
    return _arguments(call.get("arguments", {}))


def live_id(event: Event) -> str | None:
    """The id of the live draft (:mod:`nous_session.web._live`) that ``event`` completes."""
    metadata = event.data.get("metadata")
    if event.op is None and isinstance(metadata, Mapping):
        own = metadata.get(METADATA_KEY)
        if isinstance(own, Mapping) and own.get("live") is True:
            return _client_id(metadata)
    return None


def content_text(event: Event) -> str:
    """The text of the message ``event`` holds."""
    return _text(event.data.get("content"))


def translate(
    event: Event, log: Log, thread_id: str, skip: frozenset[str] = frozenset()
) -> list[BaseEvent]:
    """The AG-UI events that stand for one committed event of the thread's session.

    ``log`` is a committed Log that holds ``event`` (a compaction's messages snapshot is the
    surface as it was right after it, or the surface of ``log`` when a snapshot dropped the
    history that needs: an event kept before the horizon). A message whose id is in ``skip``
    (the client that sent it has it) gives nothing; so do the bookkeeping events.
    """
    kind = event.type
    data = event.data
    if kind in RUN_MARKERS:
        run_id = str(data.get("run_id", ""))
        if kind == RUN_STARTED:
            return [RunStartedEvent(thread_id=thread_id, run_id=run_id)]
        if kind == RUN_FINISHED:
            return [RunFinishedEvent(thread_id=thread_id, run_id=run_id)]
        return [RunErrorEvent(message=str(data.get("message", "the run failed")))]
    if kind is EventType.ERASURE:
        # Events were erased (here or in another process): the snapshot replaces the text a
        # client shows with the erased form, and the custom event names the seqs and the
        # messages' ids, for a client that keeps copies of its own.
        snapshot = messages_snapshot(as_of(log, event.seq))
        seqs = data.get("seqs")
        erased = set(seqs) if isinstance(seqs, list) else set()
        # An erased message lost the id its client gave it (with its metadata): its id is
        # the server's, made of its seq.
        ids = [message.id for message in snapshot.messages if _seq_of(message.id) in erased]
        value = {"seqs": data.get("seqs"), "message_ids": ids, "reason": data.get("reason")}
        return [snapshot, CustomEvent(name=ERASURE_EVENT, value=value)]
    if event.op is not None:
        # A surface operation (a compaction's summary, a removal, a rewind...): the surface
        # changed otherwise than by one more message.
        return [messages_snapshot(as_of(log, event.seq))]
    if kind in _TEXT_ROLES or kind is EventType.TOOL_RESULT:
        identifier = message_id(event.seq, data.get("metadata"))
        return [] if identifier in skip else list(_message_events(event, identifier))
    if kind is EventType.METADATA:
        # The state is the session's metadata record, as SessionMetadata.to_json gives it.
        return [StateSnapshotEvent(snapshot=data.get("metadata", {}))]
    return []


def _to_agui(seq: int, index: int, message: Message) -> AgUiMessage:
    identifier = message_id(seq, message.metadata, index)
    text = message.text
    if message.role is Role.ASSISTANT:
        calls = [
            AgUiToolCall(
                id=call.id,
                function=FunctionCall(name=call.name, arguments=_arguments(call.arguments)),
            )
            for call in message.tool_calls
        ]
        return AssistantMessage(id=identifier, content=text or None, tool_calls=calls or None)
    if message.role is Role.TOOL:
        return ToolMessage(id=identifier, content=text, tool_call_id=message.tool_call_id or "")
    if message.role is Role.SYSTEM:
        return SystemMessage(id=identifier, content=text)
    if message.role is Role.DEVELOPER:
        return DeveloperMessage(id=identifier, content=text)
    return UserMessage(id=identifier, content=text)


def agui_messages(log: Log) -> list[AgUiMessage]:
    """The surface of ``log`` as AG-UI messages, each with its id (:func:`message_id`)."""
    messages: list[AgUiMessage] = []
    previous, index = -1, 0
    for seq, message in log.derive_indexed():
        index = index + 1 if seq == previous else 0
        previous = seq
        messages.append(_to_agui(seq, index, message))
    return messages


def as_of(log: Log, seq: int) -> Log:
    """The log right after ``seq``, or ``log`` itself when a snapshot dropped what that
    needs (the surface it gives is then newer, never older)."""
    try:
        return log.upto(seq)
    except ValueError:
        return log


def messages_snapshot(log: Log) -> MessagesSnapshotEvent:
    """A messages snapshot of the surface of ``log``."""
    return MessagesSnapshotEvent(messages=agui_messages(log))


def _tool_calls(calls: Sequence[AgUiToolCall] | None) -> list[ToolCall]:
    return [ToolCall(call.id, call.function.name, call.function.arguments) for call in calls or ()]


def from_agui(message: AgUiMessage) -> Message | None:
    """A client's message as the session keeps it (its id in its metadata), or None for the
    roles a session does not keep (activity, reasoning)."""
    metadata: dict[str, Any] = {METADATA_KEY: {"id": message.id}}
    if isinstance(message, UserMessage):
        return Message.user(_text(_dumped(message.content)), metadata=metadata)
    if isinstance(message, AssistantMessage):
        return Message.assistant(
            message.content, tool_calls=_tool_calls(message.tool_calls), metadata=metadata
        )
    if isinstance(message, ToolMessage):
        return Message.tool(
            message.tool_call_id,
            _text(_dumped(message.content)),
            is_error=message.error is not None,
            metadata=metadata,
        )
    if isinstance(message, SystemMessage):
        return Message.system(message.content, metadata=metadata)
    if isinstance(message, DeveloperMessage):
        return Message.developer(message.content, metadata=metadata)
    return None


def _dumped(content: object) -> object:
    """Content parts (pydantic models) as plain mappings; a string as is."""
    if isinstance(content, str):
        return content
    if isinstance(content, Iterable):
        return [part.model_dump() if isinstance(part, BaseModel) else part for part in content]
    return content
