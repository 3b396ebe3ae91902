"""Compaction policy and planning: when to compact a session, and what to replace.

This module is pure: it decides, from a committed :class:`~nous_session.log.Log` value, which
tool results to prune and which range of the surface to summarise. The SessionActor runs it in
the background and posts the resulting replaces back through its queue, where they are applied
only if the surface in their range is still exactly what was planned over.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final, TypeAlias

import anyio.lowlevel
import attrs
import orjson

from nous_session._json import JSON
from nous_session.event import Event, EventType, to_message
from nous_session.log import Log
from nous_session.message import Message
from nous_session.transcript import estimate_messages_tokens, prune_tool_results

__all__ = ["CompactionPolicy", "Summarizer", "plan_pruning", "plan_summary"]

Summarizer: TypeAlias = Callable[[Sequence[Message]], Awaitable[str]]
"""An async callable (an LLM call, say) that takes the messages to summarise and returns the
summary text."""

TokenCounter: TypeAlias = Callable[[Sequence[Message]], int]

PRUNING: Final = "pruning"
CHUNK: Final = 8
"""Planning and summarising yield to the event loop after this many events: small enough that
an append arriving meanwhile waits a few tens of microseconds (the p99 append latency during a
compaction stays within 2x of none), at the price of a longer compaction in the background."""
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
    """Counts the tokens of a session's surface incrementally, from its events.

    Every surface event is counted once and remembered by seq, so a surface that grew costs
    only its new events, and one rebuilt by a replace costs a dictionary lookup per event
    (never a re-count of unchanged messages). The default counter is computed from the event
    data without making Messages, exactly as
    :func:`~nous_session.transcript.estimate_messages_tokens` would count them.
    """

    __slots__ = ("_by_seq", "_counter", "_exact_bytes", "_seen", "_total")

    def __init__(self, counter: TokenCounter) -> None:
        self._counter = counter
        # The default estimate divides once over the whole: sum bytes, divide at the end.
        self._exact_bytes = counter is estimate_messages_tokens
        self._by_seq: dict[int, int] = {}
        self._seen = 0
        self._total = 0

    @property
    def total(self) -> int:
        """The token count at the last update."""
        return self._total // 4 if self._exact_bytes else self._total

    def _count(self, event: Event) -> int:
        if self._exact_bytes:
            return event_bytes(event)
        return self._counter([to_message(event)])

    def update(self, surface: Sequence[Event], *, rebuilt: bool) -> int:
        """The token count of ``surface``; ``rebuilt`` says it changed other than by growing."""
        by_seq = self._by_seq
        if rebuilt or len(surface) < self._seen:
            kept: dict[int, int] = {}
            total = 0
            for event in surface:
                value = by_seq.get(event.seq)
                if value is None:
                    value = self._count(event)
                kept[event.seq] = value
                total += value
            self._by_seq, self._total = kept, total
        else:
            for event in surface[self._seen :]:
                value = by_seq[event.seq] = self._count(event)
                self._total += value
        self._seen = len(surface)
        return self.total


def event_bytes(event: Event) -> int:
    """:func:`~nous_session.transcript.message_bytes` of a surface event, from its data."""
    data = event.data
    content = data.get("content")
    if type(content) is str:
        size = len(content.encode())
    elif type(content) is list:
        size = len(
            "".join(
                part["text"]  # type: ignore[misc]
                for part in content
                if type(part) is dict and part.get("type") == "text"
            ).encode()
        )
    else:
        size = 0
    for call in data.get("tool_calls") or ():  # type: ignore[union-attr]
        source: Any = call.get("function", call)  # type: ignore[union-attr]
        arguments = source.get("arguments", {})
        size += len(source["name"].encode())
        size += len(arguments.encode() if isinstance(arguments, str) else orjson.dumps(arguments))
    return size


@attrs.frozen
class Replacement:
    """A planned replace: ``message`` in place of the positions ``start..stop``.

    Planned on the log as it was at count ``planned_at``, and applied only while the surface in
    that range is unchanged since then (see :func:`still_applies`).
    """

    start: int
    stop: int
    message: Message
    planned_at: int
    source: str

    def data(self) -> dict[str, JSON]:
        """The data of the replacing event."""
        data = self.message.to_json()
        data["surface_op"] = ["replace", self.start, self.stop]
        data["source"] = self.source
        return data


async def plan_pruning(log: Log, cap: int) -> list[Replacement]:
    """In-place replacements for the surface's tool results longer than ``cap`` characters.

    Works on the events; only the oversized results are turned into messages. Results that
    are themselves products of pruning are left alone, so pruning is idempotent. Yields to the
    event loop every few hundred events, so planning over a long session never stalls it.
    """
    out: list[Replacement] = []
    surface = log.surface()
    for start in range(0, len(surface), CHUNK):
        for event in surface[start : start + CHUNK]:
            if event.type is not EventType.TOOL_RESULT:
                continue
            content = event.data.get("content")
            if type(content) is str and len(content) > cap and event.data.get("source") != PRUNING:
                (pruned,) = prune_tool_results([to_message(event)], cap)
                position = event.position
                out.append(Replacement(position, position, pruned, log.count, PRUNING))
        await anyio.lowlevel.checkpoint()
    return out


async def plan_summary(log: Log, keep_last: int) -> Sequence[Event] | None:
    """The surface events a summary would replace, or None when nothing would.

    Cut as :func:`~nous_session.transcript.compact` cuts (leading system messages and the kept
    tail of ``keep_last`` excluded, tool results at the head of the tail summarised with their
    call), with two differences for a live session. An earlier compaction summary is not part
    of the leading run: it is summarised again with what came after it, so each summary
    supersedes the last instead of piling up beside it. And an assistant message whose tool
    calls do not all have their results (after it) yet ends the summarised range: its results
    are still to come. Works on the events alone, so nothing is projected, and yields to the
    event loop every few hundred events.
    """
    surface = log.surface()
    size = len(surface)
    lead = 0
    while (
        lead < size
        and surface[lead].type is EventType.SYSTEM_MESSAGE
        and surface[lead].data.get("source") != COMPACTION
    ):
        lead += 1
    if size - lead <= keep_last:
        return None
    cut = size - keep_last
    while cut < size and surface[cut].type is EventType.TOOL_RESULT:
        cut += 1
    old = surface[lead:cut]
    # One backwards pass: a call is answered when its result came after it.
    answered: set[object] = set()
    end = len(old)
    for stop in range(len(old), 0, -CHUNK):
        for index in range(stop - 1, max(stop - CHUNK, 0) - 1, -1):
            event = old[index]
            if event.type is EventType.TOOL_RESULT:
                answered.add(event.data.get("tool_call_id"))
            elif event.type is EventType.ASSISTANT_MESSAGE:
                calls: Any = event.data.get("tool_calls")
                if calls and any(call.get("id") not in answered for call in calls):
                    end = index
        await anyio.lowlevel.checkpoint()
    return old[:end] or None


def summary_replacement(log: Log, events: Sequence[Event], message: Message) -> Replacement:
    """The replace that puts ``message`` in place of ``events`` (a contiguous run of ``log``'s
    surface)."""
    return Replacement(events[0].position, events[-1].position, message, log.count, COMPACTION)


def still_applies(log: Log, replacement: Replacement) -> bool:
    """Whether the surface in ``replacement``'s range is unchanged since it was planned.

    The log only grows, so the surface inside a range of existing positions can change only
    through a replace appended since, whose own range meets it (an ordinary append lands after
    every existing position). Checking the events since the plan costs what was appended
    meanwhile, not the size of the range.
    """
    start, stop = replacement.start, replacement.stop
    for event in log.since(replacement.planned_at):
        op: Any = event.data.get("surface_op")
        if op is not None and op[1] <= stop and start <= op[2]:
            return False
    return True
