"""The LangGraph saver's view of a thread on its session's surface: the LangChain messages of a
root checkpoint's messages channel, as nous_session messages (text, tool calls and tool
results; each with its LangChain id in ``metadata["langgraph_id"]``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)

from nous_session._json import JSON
from nous_session._logging import get_logger
from nous_session.actor import SessionActor
from nous_session.errors import InvalidEventError, OutcomeUnknownError, StoreError
from nous_session.event import message_event
from nous_session.message import Message, ToolCall

_LANGGRAPH_ID: Final = "langgraph_id"
_logger = get_logger()


class MessagesProjection:
    """Projects one channel's LangChain messages onto the surface of a thread's session.

    The surface is a view: only root checkpoints (namespace ``""``) are projected, and a
    projection never fails the checkpoint it comes with (what cannot be projected is logged
    and left off the surface).
    """

    __slots__ = ("channel",)

    def __init__(self, channel: str | None) -> None:
        self.channel = channel  # None projects nothing

    def change(
        self, actor: SessionActor, ns: str, values: Mapping[str, Any]
    ) -> tuple[list[tuple[Any, ...]], list[Message] | None]:
        """What a checkpoint's channel ``values`` change on ``actor``'s surface: the
        ``append_many`` items of its new messages, for the checkpoint's own commit, and the
        messages to replace the surface with after that commit (None: no replace)."""
        if ns or self.channel is None:
            return [], None
        messages = values.get(self.channel)
        if not isinstance(messages, list) or not all(
            isinstance(item, BaseMessage) for item in messages
        ):
            return [], None
        try:
            projected = [_to_message(item) for item in messages]
            for message in projected:
                message_event(message)  # refuses what no store could hold
        except (ValueError, TypeError, KeyError) as error:
            _logger.warning(
                "nous_session.langgraph_messages_not_projected",
                session_id=actor.session_id,
                error=repr(error),
            )
            return [], None
        shown = [message.to_json() for message in actor.messages()]
        if [message.to_json() for message in projected[: len(shown)]] == shown:
            return _message_items(projected[len(shown) :]), None
        return [], projected

    async def replace(self, actor: SessionActor, messages: list[Message]) -> None:
        """Put ``messages`` on the surface in place of what it shows (after the checkpoint's
        commit: a failure here is logged, and the checkpoint stays)."""
        try:
            surface = actor.log.surface()
            if not surface:
                await actor.append_many(_message_items(messages))
            else:
                await actor.replace(surface[0].position, surface[-1].position, messages)
        except (StoreError, OutcomeUnknownError, InvalidEventError) as error:
            _logger.warning(
                "nous_session.langgraph_surface_not_replaced",
                session_id=actor.session_id,
                error=repr(error),
            )


def _message_items(messages: list[Message]) -> list[tuple[Any, ...]]:
    """``append_many`` items for ``messages``, each timed at its ``created_at``."""
    return [(*message_event(message), message.created_at) for message in messages]


def _text(message: BaseMessage) -> str:
    content = message.content
    if isinstance(content, str):
        return content
    return "".join(
        part if isinstance(part, str) else str(part.get("text", ""))
        for part in content
        if isinstance(part, str) or part.get("type") == "text"
    )


def _to_message(message: BaseMessage) -> Message:
    """The nous_session message a LangChain message stands for (text, tool calls and tool
    results; its LangChain id in ``metadata["langgraph_id"]``)."""
    metadata: dict[str, JSON] = {_LANGGRAPH_ID: message.id}
    text = _text(message)
    if isinstance(message, AIMessage):
        calls = [
            ToolCall(call["id"] or f"call_{index}", call["name"], call["args"])
            for index, call in enumerate(message.tool_calls)
        ]
        return Message.assistant(text or None, tool_calls=calls, metadata=metadata)
    if isinstance(message, ToolMessage):
        return Message.tool(
            message.tool_call_id,
            text,
            name=message.name,
            is_error=message.status == "error",
            metadata=metadata,
        )
    if isinstance(message, SystemMessage):
        return Message.system(text, metadata=metadata)
    if isinstance(message, HumanMessage):
        return Message.user(text, metadata=metadata)
    metadata["langgraph_type"] = message.type
    return Message.user(text, metadata=metadata)
