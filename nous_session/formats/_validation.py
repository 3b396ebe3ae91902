"""What a provider's API would reject in a history: :func:`problems`, behind
:func:`nous_session.formats.validate`.

These are the requests the APIs answer with a 400, not the fields a conversion drops (those are
:attr:`~nous_session.formats.Conversion.dropped`). Each rule is the provider's own:

* Every provider: a tool result answers a call an earlier assistant message made (by id; a
  result without an id takes the first waiting call without one, by name when it has one, as
  the writers pair them), once; every call gets a result (Chat Completions: "an assistant
  message with 'tool_calls' must be followed by tool messages responding to each
  'tool_call_id'"; Responses: "No tool output found for function call"; Anthropic:
  "tool_use ids were found without tool_result blocks immediately after"; Gemini: "the number
  of function response parts is equal to the number of function call parts"); an assistant
  message says something (text, a part, or a tool call).
* OpenAI Chat Completions, Anthropic and Gemini: the results come right after the assistant
  message that made the calls, before any other message. The Responses API pairs them by
  ``call_id`` wherever they are. A Chat Completions tool message without a ``tool_call_id``
  is the deprecated ``function`` message, which no call id pairs.
* Anthropic and Gemini: a call's arguments are a JSON object (a string that is not one would
  be sent as ``{}``); a user message is not empty.
* Anthropic: no text block is empty or only whitespace ("text content blocks must contain
  non-whitespace text"), and a final assistant message does not end with whitespace ("final
  assistant content cannot end with trailing whitespace").
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Final

import attrs

from nous_session.message import Message, Role, ToolCall
from nous_session.parts import TextPart

__all__: list[str] = []

_ADJACENT: Final = frozenset({"openai-chat", "anthropic", "gemini"})
"""The providers that take a call's results only right after the message that made it."""
_OBJECT_ARGUMENTS: Final = frozenset({"anthropic", "gemini"})
_NO_EMPTY_USER: Final = frozenset({"anthropic", "gemini"})


@attrs.frozen
class HistoryProblem:
    """One thing in a history that a provider's API would reject.

    Attributes:
        index: the index of the message it is about.
        reason: what is wrong, in words.
    """

    index: int
    reason: str

    def __str__(self) -> str:
        return f"message {self.index}: {self.reason}"


@attrs.define
class _Call:
    index: int
    k: int
    call: ToolCall

    def label(self) -> str:
        ident = f", id {self.call.id!r}" if self.call.id else ", no id"
        return f"tool call {self.k} ({self.call.name}{ident}) of message {self.index}"


def problems(messages: Sequence[Message], provider: str) -> list[HistoryProblem]:
    """What ``provider``'s API would reject in ``messages``, in message order (see the module
    docstring for the rules)."""
    found: list[HistoryProblem] = []
    adjacent = provider in _ADJACENT
    waiting: list[_Call] = []  # calls made and not answered yet
    answered: dict[str, int] = {}  # call id -> the index of its result
    made: dict[str, int] = {}  # call id -> the index of the message that made it
    last = len(messages) - 1

    def unanswered() -> None:
        where = " right after it" if adjacent else ""
        found.extend(
            HistoryProblem(
                entry.index, f"{entry.label()} has no result{where}: {provider} needs one"
            )
            for entry in waiting
        )
        waiting.clear()

    for i, message in enumerate(messages):
        role = message.role
        if role is Role.TOOL:
            if provider != "openai-chat" or message.tool_call_id is not None:
                # (a Chat Completions tool message without an id is a function message,
                # which no call id pairs)
                reason = _answer(message, i, waiting, answered, made, provider, adjacent)
                if reason is not None:
                    found.append(HistoryProblem(i, reason))
        elif adjacent:
            unanswered()  # their results had to come before this message
        if (
            (role is Role.ASSISTANT or (role is Role.USER and provider in _NO_EMPTY_USER))
            and not message.tool_calls
            and _empty(message, provider)
        ):
            what = "no text, no tool calls" if role is Role.ASSISTANT else "no content"
            found.append(
                HistoryProblem(i, f"an empty {role.value} message ({what}): {provider} refuses it")
            )
            continue
        if provider == "anthropic":
            found.extend(_empty_text_blocks(message, i))
        if role is not Role.ASSISTANT:
            continue
        for k, call in enumerate(message.tool_calls):
            waiting.append(_Call(i, k, call))
            if call.id:
                made.setdefault(call.id, i)
            if provider in _OBJECT_ARGUMENTS and not _object_arguments(call):
                found.append(
                    HistoryProblem(
                        i,
                        f"the arguments of tool call {k} ({call.name}) are not a JSON object: "
                        f"{provider} needs one (they would be sent as {{}})",
                    )
                )
        if provider == "anthropic" and i == last and _trailing_space(message):
            reason = "the last assistant message ends with whitespace: anthropic refuses that"
            found.append(HistoryProblem(i, reason))
    unanswered()
    found.sort(key=lambda problem: problem.index)  # (stable: each message's in the order found)
    return found


def _answer(
    message: Message,
    i: int,
    waiting: list[_Call],
    answered: dict[str, int],
    made: dict[str, int],
    provider: str,
    adjacent: bool,
) -> str | None:
    """Pair the tool result ``message[i]`` with a waiting call; None, or what is wrong."""
    ident = message.tool_call_id
    if ident:
        for n, entry in enumerate(waiting):
            if entry.call.id == ident:
                del waiting[n]
                answered[ident] = i
                return None
        if ident in answered:
            return f"a second result for call {ident!r} (message {answered[ident]} answered it)"
        if adjacent and ident in made:
            return (
                f"a result for call {ident!r} of message {made[ident]}, not right after it: "
                f"{provider} takes results only right after the message that made the call"
            )
        return f"a tool result for call {ident!r}, which no earlier assistant message made"
    for n, entry in enumerate(waiting):
        # Gemini pairs a result without an id by its function name; the providers that need
        # ids give it the id made up for the first waiting call without one.
        if (provider == "gemini" or not entry.call.id) and (
            message.name is None or entry.call.name == message.name
        ):
            del waiting[n]
            return None
    named = f" for {message.name!r}" if message.name is not None else ""
    where = " right before it" if adjacent else ""
    return f"a tool result{named} with no call id, and no call{where} is waiting for it"


def _texts(message: Message) -> list[str] | None:
    """The message's texts, or None when it holds some other part (an image, thinking...)."""
    content = message.content
    if content is None:
        return []
    if isinstance(content, str):
        return [content]
    texts = []
    for part in content:
        if type(part) is not TextPart:
            return None
        texts.append(part.text)
    return texts


def _empty(message: Message, provider: str) -> bool:
    if any(key[:1] != "$" for key in message.provider_data.get(provider) or {}):
        return False  # it holds the provider's own fields (an OpenAI refusal, say)
    texts = _texts(message)
    if texts is None:
        return False
    if provider == "anthropic":  # (it refuses whitespace-only text too)
        return not any(text.strip() for text in texts)
    return not any(texts)


def _empty_text_blocks(message: Message, i: int) -> list[HistoryProblem]:
    content = message.content
    if content is None or isinstance(content, str):
        return []  # (an empty string is an empty message, checked above, or a tool result's)
    return [
        HistoryProblem(
            i, f"text part {j} is empty or only whitespace: anthropic refuses such blocks"
        )
        for j, part in enumerate(content)
        if type(part) is TextPart and not part.text.strip()
    ]


def _trailing_space(message: Message) -> bool:
    content = message.content
    if message.tool_calls or content is None:
        return False
    if isinstance(content, str):
        return content != content.rstrip()
    last = content[-1] if content else None
    return type(last) is TextPart and last.text != last.text.rstrip()


def _object_arguments(call: ToolCall) -> bool:
    arguments = call.arguments
    if not isinstance(arguments, str):
        return True
    try:
        return isinstance(json.loads(arguments), dict)
    except ValueError:
        return False
