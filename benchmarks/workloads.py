"""The messages every suite uses: chat messages of about 200 bytes, with tool calls.

Shared so later suites (stores, peers) run the same workloads: every 10th assistant message
calls a tool and is followed by its result. Everything is deterministic (no randomness, fixed
timestamps one second apart), so runs compare.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from nous_session import EventType, Message

CONTENT_BYTES = 200
START = datetime(2025, 1, 1, tzinfo=UTC)
_WORDS = (
    "the agent reads the ticket, checks the order history, drafts a reply and asks the "
    "customer to confirm the shipping address before it issues the refund for the parcel "
)


def content(index: int, size: int = CONTENT_BYTES) -> str:
    """``size`` bytes of ASCII chat text, different for every index."""
    head = f"message {index}: "
    body = (_WORDS * (size // len(_WORDS) + 2))[index % len(_WORDS) :]
    return (head + body)[:size]


def chat_data(index: int) -> dict[str, Any]:
    """The data of a typical chat event: ``{"content": ~200-byte str}``."""
    return {"content": content(index)}


def chat_event_type(index: int) -> EventType:
    """User and assistant messages, alternating."""
    return EventType.USER_MESSAGE if index % 2 == 0 else EventType.ASSISTANT_MESSAGE


def chat_messages(count: int, *, tool_every: int = 10) -> list[Message]:
    """A conversation of exactly ``count`` messages: a system prompt, then user/assistant turns.

    Every ``tool_every``-th assistant message calls a tool (``search``) and is followed by its
    tool result (about 200 bytes of JSON text).
    """
    messages: list[Message] = [
        Message.system("You are a helpful support agent. " + content(0, 120), created_at=START)
    ]
    assistant_turns = 0
    index = 1
    while len(messages) < count:
        when = START + timedelta(seconds=index)
        if index % 2 == 1:
            messages.append(Message.user(content(index), created_at=when))
        else:
            assistant_turns += 1
            if assistant_turns % tool_every == 0 and len(messages) + 2 <= count:
                call_id = f"call_{index}"
                arguments = {"query": content(index, 60)}
                messages.append(
                    Message.assistant(
                        content(index, 80),
                        tool_calls=[{"id": call_id, "name": "search", "arguments": arguments}],
                        created_at=when,
                    )
                )
                messages.append(
                    Message.tool(
                        call_id,
                        {"results": [content(index + 1, 90), content(index + 2, 90)]},
                        name="search",
                        created_at=when + timedelta(milliseconds=500),
                    )
                )
            else:
                messages.append(Message.assistant(content(index), created_at=when))
        index += 1
    return messages
