"""Compaction: when to compact a session (:class:`CompactionPolicy`) and what to replace.

Planning is pure: from a committed :class:`~nous_session.log.Log` value it decides which tool
results to prune and which range of the surface to summarise. The session's compaction runner
(internal) does that in a background task of the session and posts the resulting replaces back
to the actor, where they are applied only if the surface in their range is still exactly what
was planned over.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final, TypeAlias

import anyio
import anyio.abc
import anyio.lowlevel
import attrs

from nous_session._json import JSON, dumps
from nous_session.event import Event, EventType, to_message
from nous_session.log import Log
from nous_session.message import Message
from nous_session.ops import OP_KEY, Remove, Replace
from nous_session.transcript import (
    SUMMARY_METADATA,
    estimate_messages_tokens,
    prune_tool_results,
)

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


def _seconds(_instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 86_400:
        raise ValueError(
            f"{attribute.name} must be a number of seconds in (0, 86400], got {value!r}"
        )


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
        turn_ttl: with the session open in several actors or processes on a store that has
            leases (:class:`~nous_session.stores.base.LeasingStore`: every built-in store),
            one holder at a time compacts it, and the others follow its result; this is how
            long one holder's turn lasts unless renewed (it is renewed every third of it
            while the holder compacts), so a holder that dies gives the turn up within
            ``turn_ttl`` seconds.

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
    turn_ttl: float = attrs.field(default=30.0, validator=_seconds)

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
        """The token count of ``surface``; ``rebuilt`` says it changed other than by growing.

        Counts are remembered per seq: the messages of a multi-message replace share its seq
        and always come and go together, so they are remembered as one sum.
        """
        by_seq = self._by_seq
        if rebuilt or len(surface) < self._seen:
            kept: dict[int, int] = {}
            for event in surface:
                seq = event.seq
                if seq in kept:
                    if seq not in by_seq:
                        kept[seq] += self._count(event)  # the next message of a new group
                    continue
                value = by_seq.get(seq)
                kept[seq] = self._count(event) if value is None else value
            self._by_seq, self._total = kept, sum(kept.values())
        else:
            for event in surface[self._seen :]:
                value = self._count(event)
                by_seq[event.seq] = by_seq.get(event.seq, 0) + value
                self._total += value
        self._seen = len(surface)
        return self.total

    def forget(self) -> None:
        """Count every event again at the next update: an erasure changed events in place,
        under the seqs their counts are remembered by."""
        self._by_seq = {}
        self._seen = 0
        self._total = 0


def event_bytes(event: Event) -> int:
    """:func:`~nous_session.transcript.message_bytes` of a surface event, from its data."""
    data = event.data
    content = data.get("content")
    if type(content) is str:
        size = len(content.encode())
    elif type(content) is list:
        size = sum(
            len(str(part["text"]).encode())  # a validated text part's text is a str
            for part in content
            if type(part) is dict and part.get("type") == "text"
        )
    else:
        size = 0
    # A stored event's data is validated: its tool calls are objects (JSON says no more).
    calls: Any = data.get("tool_calls") or ()
    for call in calls:
        source = call.get("function", call)
        arguments = source.get("arguments", {})
        size += len(source["name"].encode())
        size += len(arguments.encode() if isinstance(arguments, str) else dumps(arguments))
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
        """The data of the replacing event: the message, dated in ``created_at`` (to the
        first message it replaces), since the event itself is dated when it is applied."""
        data = self.message.to_json()
        data[OP_KEY] = Replace(self.start, self.stop).to_json()
        data["source"] = self.source
        data["created_at"] = self.message.created_at.isoformat()
        return data


async def plan_pruning(log: Log, cap: int) -> list[Replacement]:
    """In-place replacements for the surface's tool results longer than ``cap`` characters.

    Works on the events; only the oversized results are turned into messages. Results that
    are themselves products of pruning are left alone, so pruning is idempotent. Yields to the
    event loop every few hundred events, so planning over a long session never stalls it.
    """
    out: list[Replacement] = []
    surface = log.surface()
    size = len(surface)
    for start in range(0, size, CHUNK):
        for index in range(start, min(start + CHUNK, size)):
            event = surface[index]
            if event.type is not EventType.TOOL_RESULT:
                continue
            content = event.data.get("content")
            if (
                type(content) is str
                and len(content) > cap
                and event.data.get("source") != PRUNING
                and not _in_group(surface, index)
            ):
                (pruned,) = prune_tool_results([to_message(event)], cap)
                position = event.position
                out.append(Replacement(position, position, pruned, log.count, PRUNING))
        await anyio.lowlevel.checkpoint()
    return out


def _in_group(surface: Sequence[Event], index: int) -> bool:
    """Whether the entry shares its position with another (the messages of one replace):
    replacing that position would replace them all."""
    position = surface[index].position
    return (index > 0 and surface[index - 1].position == position) or (
        index + 1 < len(surface) and surface[index + 1].position == position
    )


async def plan_summary(log: Log, keep_last: int) -> Sequence[Event] | None:
    """The surface events a summary would replace, or None when nothing would.

    Cut as :func:`~nous_session.transcript.compact` cuts (leading system messages and the kept
    tail of ``keep_last`` excluded, tool results at the head of the tail summarised with their
    call), with two differences for a live session. An earlier compaction summary is not part
    of the leading run: it is summarised again with what came after it, so each summary
    supersedes the last instead of piling up beside it. And an assistant message whose tool
    calls do not all have their results (after it) yet ends the summarised range: its results
    are still to come. The range holds every result of each call in it (it ends before a call
    whose result comes after the range). A range of nothing but earlier summaries is no range
    (None). Works on the events alone, so nothing is projected, and yields to the event loop
    every few events.
    """
    surface = log.surface()
    size = len(surface)
    lead = 0
    while (
        lead < size
        and surface[lead].type is EventType.SYSTEM_MESSAGE
        and not _is_summary(surface[lead])
    ):
        lead += 1
    if size - lead <= keep_last:
        return None
    cut = size - keep_last
    # Tool results at the head of the tail go with their call; the messages of one replace
    # share a position and go together.
    while cut < size and (
        surface[cut].type is EventType.TOOL_RESULT
        or surface[cut].position == surface[cut - 1].position
    ):
        cut += 1
    old = surface[lead:cut]
    # One forward pass: the range ends where the longest run of `old` ends in which every call
    # has its result, between the messages of two positions (one replace's go together). A
    # call still waiting for its result (another worker's tool still runs) ends it before the
    # call, and before the calls made earlier whose results came after that one.
    waiting: set[object] = set()
    end = 0
    for start in range(0, len(old), CHUNK):
        for index in range(start, min(start + CHUNK, len(old))):
            event = old[index]
            if event.type is EventType.TOOL_RESULT:
                waiting.discard(event.data.get("tool_call_id"))
            elif event.type is EventType.ASSISTANT_MESSAGE:
                calls: Any = event.data.get("tool_calls")
                if calls:
                    waiting.update(call.get("id") for call in calls)
            if not waiting and (index + 1 == len(old) or old[index + 1].position != event.position):
                end = index + 1
        await anyio.lowlevel.checkpoint()
    if all(event.type is EventType.SYSTEM_MESSAGE and _is_summary(event) for event in old[:end]):
        return None  # earlier summaries alone: summarising them again changes nothing
    return old[:end]


def _is_summary(event: Event) -> bool:
    """Whether a system message event is a compaction summary: appended by a compaction, or
    marked as one in its metadata (a summary made by :func:`~nous_session.transcript.compact`
    and added as a message)."""
    if event.data.get("source") == COMPACTION:
        return True
    metadata = event.data.get("metadata")
    return isinstance(metadata, dict) and SUMMARY_METADATA in metadata


def summarisable(surface: Sequence[Event], keep_last: int) -> int:
    """How many messages, earlier summaries aside, a compaction of ``surface`` could summarise
    at most: those between the leading system messages (and the summaries after them) and the
    kept tail. Costs the length of that head, not of the surface."""
    size = len(surface)
    head = 0
    while head < size and surface[head].type is EventType.SYSTEM_MESSAGE:
        head += 1
    return max(0, size - head - keep_last)


def summary_replacement(log: Log, events: Sequence[Event], message: Message) -> Replacement:
    """The replace that puts ``message`` in place of ``events`` (a contiguous run of ``log``'s
    surface)."""
    return Replacement(events[0].position, events[-1].position, message, log.count, COMPACTION)


def still_applies(log: Log, replacement: Replacement) -> bool:
    """Whether the surface in ``replacement``'s range is unchanged since it was planned, and
    nothing was erased since (a replacement planned on the content before an erasure may copy
    it: it is stale, and the next compaction plans on the erased log).

    The log only grows, so the surface inside a range of existing positions can change only
    through a replace appended since, whose own range meets it (an ordinary append lands after
    every existing position). Checking the events since the plan costs what was appended
    meanwhile, not the size of the range. A snapshot that dropped any of them leaves that
    check blind: the replacement is then stale too.
    """
    start, stop = replacement.start, replacement.stop
    since = log.since(replacement.planned_at)
    if len(since) != log.count - replacement.planned_at:
        # A snapshot dropped events appended since the plan: a replace among them may have
        # changed the range, and the replace that hid it need not meet the range itself.
        return False
    for event in since:
        if event.type is EventType.ERASURE:
            return False  # planned on content erased since: it may quote it
        op = event.op
        if type(op) is Replace or type(op) is Remove:
            if op.start <= stop and start <= op.stop:
                return False
        elif op is not None:
            return False  # a rewind or an uncompact may have changed any range
    return True
