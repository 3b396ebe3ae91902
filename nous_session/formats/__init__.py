"""Provider formats: a conversation as a model provider's API takes it, and back.

::

    from nous_session.formats import convert, from_provider, to_provider

    payload = to_provider(messages, "anthropic")         # {"system": ..., "messages": [...]}
    messages = from_provider(payload, "anthropic")       # the same messages back
    result = convert(messages, "openai-chat")            # another provider, with a report
    result.payload, result.dropped                       # [...], ("thinking of message 3 ...",)

The providers (:data:`PROVIDERS`) and their payloads:

* ``"openai-chat"``: Chat Completions, the ``messages`` list.
* ``"openai-responses"``: the Responses API, the ``input`` items list.
* ``"anthropic"``: the Messages API, ``{"system": ..., "messages": [...]}`` (``system`` only when
  the conversation starts with one).
* ``"gemini"``: ``generateContent``, ``{"system_instruction": ..., "contents": [...]}`` in the
  REST API's JSON (camelCase inside contents; snake_case keys are read too).

Round trips are exact both ways within one provider: ``to_provider(from_provider(payload, p), p)
== payload`` for everything these APIs put in a conversation, and ``from_provider(to_provider(m,
p), p) == m`` for messages in the form reading gives (string content where the provider has it,
for instance). What a provider's form has and the neutral one does not (``cache_control``,
annotations, item ids and statuses, a Gemini ``thoughtSignature`` on a function call...) is kept
in ``provider_data[provider]`` on the message, part or tool call it came with, and written back
only to that provider. Messages get the same ``created_at`` (a payload has no times);
``metadata`` is never sent.

Across providers, whatever has no place in the target is dropped and reported:
:func:`convert` returns the payload with one note per item in :attr:`Conversion.dropped`.
Thinking goes only to the provider that signed it. What is changed to fit without losing
anything is noted apart, in :attr:`Conversion.changed`: tool calls without ids (Gemini's) get
ids where the target needs them; ``developer`` messages become system messages where there is
no such role.

:func:`validate` says what the provider's API would reject in a history (a tool result with no
call, a call with no result, an empty assistant message...), and :func:`convert` puts the same
in :attr:`Conversion.problems`. ``to_provider(..., strict=True)`` raises on both, and only on
them: :class:`~nous_session.errors.InvalidHistoryError` for a problem,
:class:`~nous_session.errors.LossyConversionError` for a loss; a change alone passes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any, Final, Literal, TypeAlias, overload

import attrs

from nous_session._json import JSON
from nous_session.errors import FormatError, InvalidHistoryError, LossyConversionError
from nous_session.formats import anthropic, gemini, openai_chat, openai_responses
from nous_session.formats._common import Notes
from nous_session.formats._validation import HistoryProblem, problems
from nous_session.message import Message, utc_datetime

__all__ = [
    "PROVIDERS",
    "Conversion",
    "Payload",
    "HistoryProblem",
    "Provider",
    "convert",
    "from_provider",
    "to_provider",
    "validate",
]

Provider: TypeAlias = Literal["openai-chat", "openai-responses", "anthropic", "gemini"]
"""A provider name."""

PROVIDERS: Final[tuple[Provider, ...]] = ("openai-chat", "openai-responses", "anthropic", "gemini")
"""Every provider :func:`to_provider` and :func:`from_provider` know."""

Payload: TypeAlias = "list[dict[str, JSON]] | dict[str, JSON]"
"""A provider payload: a list for the OpenAI APIs, an object for Anthropic and Gemini."""

_MODULES: Final[dict[str, Any]] = {
    "openai-chat": openai_chat,
    "openai-responses": openai_responses,
    "anthropic": anthropic,
    "gemini": gemini,
}


def _module(provider: object) -> Any:
    module = _MODULES.get(provider) if isinstance(provider, str) else None
    if module is None:
        raise FormatError(f"unknown provider {provider!r}; known: {', '.join(PROVIDERS)}")
    return module


@attrs.frozen
class Conversion:
    """What :func:`convert` made: the payload, what could not be carried, what was changed to
    fit, and what the provider would reject.

    Attributes:
        provider: the provider the payload is for.
        payload: the payload, plain JSON the caller owns.
        dropped: one human-readable note per item that was lost (dropped, or sent otherwise
            than it was in a way that loses something, like arguments that are not a JSON
            object sent as ``{}``), naming the message by its index; empty when nothing was.
        changed: one note per change made to fit the provider that loses nothing (a made-up
            call id for a call that had none, a developer message sent as system, a media
            type guessed from a URL).
        problems: what the provider's API would reject in this history (see
            :func:`validate`); empty when it would accept it.
    """

    provider: Provider
    payload: Payload
    dropped: tuple[str, ...]
    changed: tuple[str, ...] = ()
    problems: tuple[HistoryProblem, ...] = ()

    @property
    def lossless(self) -> bool:
        """True when nothing was dropped (changes that lose nothing may have been made)."""
        return not self.dropped


def _messages(messages: Iterable[Message]) -> Sequence[Message]:
    if isinstance(messages, Message) or not isinstance(messages, Iterable):
        raise FormatError(f"messages must be a sequence of Message, not {type(messages).__name__}")
    items = list(messages)
    for index, message in enumerate(items):
        if not isinstance(message, Message):
            raise FormatError(f"messages[{index}] is a {type(message).__name__}, not a Message")
    return items


def convert(messages: Iterable[Message], provider: Provider) -> Conversion:
    """Write ``messages`` in ``provider``'s format, saying what could not be carried.

    Args:
        messages: the conversation, in order.
        provider: one of :data:`PROVIDERS`.

    Returns:
        The :class:`Conversion`: ``payload``, the ``dropped`` and ``changed`` notes, and the
        ``problems`` the provider would reject.

    Raises:
        FormatError: ``provider`` is unknown, or ``messages`` holds something else than
            messages.
    """
    module = _module(provider)
    notes = Notes(provider)
    items = _messages(messages)
    payload = module.dump(items, notes)
    found = tuple(problems(items, provider))
    return Conversion(provider, payload, tuple(notes.items), tuple(notes.changed), found)


def validate(messages: Iterable[Message], provider: Provider) -> list[HistoryProblem]:
    """What ``provider``'s API would reject in this history, if it were sent as it is.

    The rules are the APIs' own (the requests they answer with an error), checked on the
    messages: every provider wants each tool result to answer a call an earlier assistant
    message made, and once; each call to get its result; and no empty assistant message (no
    text, no tool calls). OpenAI Chat Completions, Anthropic and Gemini want the results right
    after the message that made the calls (the Responses API pairs them by id wherever they
    are). Anthropic and Gemini want tool-call arguments that are a JSON object (a string that
    is not one would be sent as ``{}``) and no empty user message; Anthropic no empty or
    whitespace-only text part, and no trailing whitespace in a final assistant message.

    What a conversion drops is not a problem here: :attr:`Conversion.dropped` says that.

    Args:
        messages: the conversation, in order.
        provider: one of :data:`PROVIDERS`.

    Returns:
        One :class:`HistoryProblem` per thing the API would reject, in message order, each
        naming the message by its index; an empty list when the API would accept the history.

    Raises:
        FormatError: ``provider`` is unknown, or ``messages`` holds something else than
            messages.
    """
    _module(provider)
    return problems(_messages(messages), provider)


@overload
def to_provider(
    messages: Iterable[Message],
    provider: Literal["openai-chat", "openai-responses"],
    *,
    strict: bool = False,
) -> list[dict[str, JSON]]: ...
@overload
def to_provider(
    messages: Iterable[Message], provider: Literal["anthropic", "gemini"], *, strict: bool = False
) -> dict[str, JSON]: ...
@overload
def to_provider(
    messages: Iterable[Message], provider: Provider, *, strict: bool = False
) -> Payload: ...
def to_provider(
    messages: Iterable[Message], provider: Provider, *, strict: bool = False
) -> Payload:
    """Write ``messages`` in ``provider``'s format.

    Args:
        messages: the conversation, in order.
        provider: one of :data:`PROVIDERS`.
        strict: raise instead of sending a history the provider would reject (see
            :func:`validate`) or dropping what it has no place for; a change that loses
            nothing (a made-up call id, say) does not raise.

    Returns:
        The payload (plain JSON the caller owns): see the module docstring for each provider's.

    Raises:
        FormatError: ``provider`` is unknown, or ``messages`` holds something else than
            messages.
        LossyConversionError: ``strict`` is set and something would be dropped; its
            ``dropped`` says what.
        InvalidHistoryError: ``strict`` is set, nothing would be dropped, and the provider
            would reject the history; its ``problems`` say why.
    """
    result = convert(messages, provider)
    if strict:
        if result.dropped:
            raise LossyConversionError(provider, result.dropped)
        if result.problems:
            raise InvalidHistoryError(provider, result.problems)
    return result.payload


def from_provider(
    payload: object, provider: Provider, *, created_at: datetime | None = None
) -> list[Message]:
    """Read a ``provider`` payload into messages.

    Args:
        payload: the conversation in the provider's format (see the module docstring); it is
            read, never changed.
        provider: one of :data:`PROVIDERS`.
        created_at: the time every message gets (an aware datetime; default: now).

    Returns:
        The messages, in order.

    Raises:
        FormatError: ``provider`` is unknown or the payload is malformed; the message names the
            place in the payload and what is wrong.
        ValueError: ``created_at`` is naive or not a datetime.
    """
    module = _module(provider)
    when = utc_datetime(datetime.now().astimezone() if created_at is None else created_at)
    messages: list[Message] = module.load(payload, when)
    return messages
