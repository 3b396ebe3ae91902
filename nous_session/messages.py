"""Readers over a list of messages: find, count, extract, split.

Each function takes any sequence of :class:`~nous_session.message.Message` and returns new values;
nothing is mutated.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from nous_session.message import Message, Role, ToolCall

__all__ = [
    "count_by_role",
    "extract_text",
    "extract_tool_calls",
    "find_by_role",
    "last_message",
    "split_system",
]


def find_by_role(messages: Iterable[Message], role: Role | str) -> list[Message]:
    """The messages with ``role``, in order.

    Raises:
        ValueError: ``role`` is not a known role.
    """
    wanted = Role(role)
    return [message for message in messages if message.role is wanted]


def count_by_role(messages: Iterable[Message]) -> dict[Role, int]:
    """How many messages each role has; all four roles are present, zero included."""
    counts = dict.fromkeys(Role, 0)
    for message in messages:
        counts[message.role] += 1
    return counts


def extract_tool_calls(messages: Iterable[Message]) -> list[ToolCall]:
    """Every tool call of the assistant messages, flattened in order."""
    return [
        call
        for message in messages
        if message.role is Role.ASSISTANT
        for call in message.tool_calls
    ]


def extract_text(messages: Iterable[Message]) -> list[str]:
    """The :attr:`~Message.text` of every message, one string per message."""
    return [message.text for message in messages]


def last_message(messages: Sequence[Message]) -> Message | None:
    """The last message, or None for an empty sequence."""
    return messages[-1] if messages else None


def split_system(messages: Iterable[Message]) -> tuple[str | None, list[Message]]:
    """Separate the system messages from the rest.

    Returns:
        The text of every system message joined with ``"\\n\\n"`` (None when there is none), and
        the other messages in order.
    """
    system: list[str] = []
    rest: list[Message] = []
    for message in messages:
        if message.role is Role.SYSTEM:
            system.append(message.text)
        else:
            rest.append(message)
    return ("\n\n".join(system) if system else None), rest
