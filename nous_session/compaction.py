"""Compaction policy and planning: when to compact a session, and what to replace.

This module is pure: it decides, from a committed :class:`~nous_session.log.Log` value, which
tool results to prune and which range of the surface to summarise. The SessionActor runs it in
the background and posts the resulting replaces back through its queue, where they are applied
only if the surface in their range is still exactly what was planned over.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final, TypeAlias

import attrs

from nous_session._json import JSON
from nous_session.event import Event
from nous_session.log import Log
from nous_session.message import Message, Role
from nous_session.transcript import (
    estimate_messages_tokens,
    message_bytes,
    plan_compaction,
    prune_tool_results,
    summarize,
)

__all__ = ["CompactionPolicy", "Summarizer", "plan_pruning", "plan_summary"]

Summarizer: TypeAlias = Callable[[Sequence[Message]], Awaitable[str]]
"""An async callable (an LLM call, say) that takes the messages to summarise and returns the
summary text."""

TokenCounter: TypeAlias = Callable[[Sequence[Message]], int]

PRUNING: Final = "pruning"
COMPACTION: Final = "compaction"


def _optional_count(_instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise ValueError(f"{attribute.name} must be None or an int >= 1, got {value!r}")


def _positive_int(_instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{attribute.name} must be an int >= 1, got {value!r}")


def _threshold(_instance: object, _attribute: attrs.Attribute[Any], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
        raise ValueError(f"threshold must be a number in (0, 1], got {value!r}")


def _timeout(_instance: object, _attribute: attrs.Attribute[Any], value: object) -> None:
    if value is not None and (
        isinstance(value, bool) or not isinstance(value, int | float) or not value > 0
    ):
        raise ValueError(f"summarizer_timeout must be None or a number > 0, got {value!r}")


def _callable_or_none(_instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is not None and not callable(value):
        raise ValueError(f"{attribute.name} must be callable, got {value!r}")


@attrs.frozen
class CompactionPolicy:
    """When and how a SessionActor compacts its session in the background.

    Triggers are OR'd and checked on the surface after every commit: more than ``every``
    messages, or more than ``token_budget * threshold`` tokens (by ``token_counter``).

    Attributes:
        keep_last: how many of the newest messages stay verbatim (tool pairs are never split,
            so the kept tail may be a little shorter).
        every: trigger on more than this many surface messages.
        token_budget: trigger on more than ``token_budget * threshold`` tokens.
        threshold: the share of ``token_budget`` that triggers, in (0, 1].
        prune_tool_results: when set, first elide the middle of tool results longer than this
            many characters (each replaced in place), and skip the summary if that was enough.
        summarizer: an async callable returning the summary text for the messages it is given;
            None means the structural summary of :func:`nous_session.transcript.summarize`.
        token_counter: counts the tokens of a list of messages. The actor counts incrementally
            (only new messages, then sums), so a custom counter must be additive over
            concatenation, as a per-message tokenizer sum is. The default is
            :func:`~nous_session.transcript.estimate_messages_tokens`, counted exactly.
        summarizer_timeout: seconds the summarizer may take before the attempt counts as
            failed; None waits for ever.

    Raises:
        ValueError: an option has a bad value, or neither trigger is set.
    """

    keep_last: int = attrs.field(validator=_positive_int)
    every: int | None = attrs.field(default=None, validator=_optional_count)
    token_budget: int | None = attrs.field(default=None, validator=_optional_count)
    threshold: float = attrs.field(default=0.8, validator=_threshold)
    prune_tool_results: int | None = attrs.field(default=None, validator=_optional_count)
    summarizer: Summarizer | None = attrs.field(default=None, validator=_callable_or_none)
    token_counter: TokenCounter = attrs.field(
        default=estimate_messages_tokens, validator=_callable_or_none
    )
    summarizer_timeout: float | None = attrs.field(default=120.0, validator=_timeout)

    def __attrs_post_init__(self) -> None:
        if self.every is None and self.token_budget is None:
            raise ValueError("a compaction policy needs a trigger: every, token_budget, or both")

    def triggered(self, surface_size: int, tokens: int) -> bool:
        """True when either trigger fires for a surface of this size and token count."""
        if self.every is not None and surface_size > self.every:
            return True
        return self.token_budget is not None and tokens > self.token_budget * self.threshold

    @property
    def counts_tokens(self) -> bool:
        """Whether the token trigger is set (else tokens need not be counted)."""
        return self.token_budget is not None


class TokenMeter:
    """Counts the tokens of a growing surface incrementally.

    ``update(messages, extended=True)`` counts only the messages past those seen before; a
    surface that was rebuilt (a replace, a reload) is recounted from scratch.
    """

    __slots__ = ("_counter", "_exact_bytes", "_seen", "_total")

    def __init__(self, counter: TokenCounter) -> None:
        self._counter = counter
        # The default estimate divides once over the whole: sum bytes, divide at the end.
        self._exact_bytes = counter is estimate_messages_tokens
        self._seen = 0
        self._total = 0

    def update(self, messages: Sequence[Message], *, extended: bool) -> int:
        """The token count of ``messages``; ``extended`` says the earlier ones are unchanged."""
        if not extended or len(messages) < self._seen:
            self._seen = 0
            self._total = 0
        new = messages[self._seen :]
        if new:
            if self._exact_bytes:
                self._total += sum(message_bytes(message) for message in new)
            else:
                self._total += self._counter(new)
            self._seen = len(messages)
        return self._total // 4 if self._exact_bytes else self._total


@attrs.frozen
class Replacement:
    """A planned replace: ``message`` in place of the positions ``start..stop``.

    Applied only while the surface events in that range are exactly ``expected`` (their seqs).
    """

    start: int
    stop: int
    message: Message
    expected: tuple[int, ...]
    source: str

    def data(self) -> dict[str, JSON]:
        """The data of the replacing event."""
        data = self.message.to_json()
        data["surface_op"] = ["replace", self.start, self.stop]
        data["source"] = self.source
        return data


def plan_pruning(log: Log, cap: int) -> list[Replacement]:
    """In-place replacements for the surface's tool results longer than ``cap`` characters.

    Results that are themselves products of pruning are left alone, so pruning is idempotent.
    """
    out: list[Replacement] = []
    for event, message in zip(log.surface(), log.derive_messages(), strict=True):
        if (
            message.role is Role.TOOL
            and isinstance(message.content, str)
            and len(message.content) > cap
            and event.data.get("source") != PRUNING
        ):
            (pruned,) = prune_tool_results([message], cap)
            position = event.position
            out.append(Replacement(position, position, pruned, (event.seq,), PRUNING))
    return out


def plan_summary(log: Log, keep_last: int) -> tuple[Sequence[Event], Sequence[Message]] | None:
    """The surface events and messages a summary would replace, or None when nothing would.

    The kept tail (``keep_last``, tool pairs never split) and the leading system messages are
    excluded, as :func:`~nous_session.transcript.compact` cuts, with two differences for a live
    session. An earlier compaction summary is not part of that leading run: it is summarised
    again with what came after it, so each new summary supersedes the last instead of piling up
    beside it. And an assistant message whose tool calls do not all have their results yet
    ends the summarised range, since its results are still to come.
    """
    messages = log.derive_messages()
    surface = log.surface()
    lead = 0
    while (
        lead < len(messages)
        and messages[lead].role is Role.SYSTEM
        and surface[lead].data.get("source") != COMPACTION
    ):
        lead += 1
    split = plan_compaction(messages, keep_last, keep_leading=lead)
    if split is None:
        return None
    lead, cut = split
    # A tool call whose results are not all in yet stays on the surface with what follows it:
    # summarising it now would leave its late results with no call before them.
    answered = {m.tool_call_id for m in messages[lead:cut] if m.role is Role.TOOL}
    for index in range(lead, cut):
        message = messages[index]
        if message.role is Role.ASSISTANT and any(
            call.id not in answered for call in message.tool_calls
        ):
            cut = index
            break
    if cut <= lead:
        return None
    return surface[lead:cut], messages[lead:cut]


def summary_replacement(events: Sequence[Event], message: Message) -> Replacement:
    """The replace that puts ``message`` in place of ``events`` (a contiguous surface run)."""
    return Replacement(
        events[0].position,
        events[-1].position,
        message,
        tuple(event.seq for event in events),
        COMPACTION,
    )


def structural_summary(messages: Sequence[Message]) -> Message:
    """The default summary: :func:`nous_session.transcript.summarize`."""
    return summarize(messages)
