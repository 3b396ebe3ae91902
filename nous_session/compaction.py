"""Compaction: when to compact a session, what to replace, and the runner that does it.

Planning is pure: from a committed :class:`~nous_session.log.Log` value it decides which tool
results to prune and which range of the surface to summarise. The :class:`CompactionRunner`
does that in a background task of the session and posts the resulting replaces back to the
actor through one ``post()`` (a :class:`Compaction` request), where they are applied only if the
surface in their range is still exactly what was planned over.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any, Final, TypeAlias, TypeVar

import anyio
import anyio.abc
import anyio.lowlevel
import attrs

from nous_session._json import JSON, dumps
from nous_session._logging import Throttle
from nous_session._requests import Applied, Call, Request
from nous_session.errors import SessionClosedError
from nous_session.event import Event, EventType, message_event, to_message
from nous_session.log import Log
from nous_session.message import Message
from nous_session.ops import OP_KEY, Remove, Replace
from nous_session.transcript import (
    SUMMARY_METADATA,
    SummaryBuilder,
    estimate_messages_tokens,
    prune_tool_results,
    summary_covers,
)

if TYPE_CHECKING:
    from nous_session.telemetry import SessionTelemetry

__all__ = ["CompactionPolicy", "Summarizer", "plan_pruning", "plan_summary"]

T = TypeVar("T")
U = TypeVar("U")

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
        """The data of the replacing event."""
        data = self.message.to_json()
        data[OP_KEY] = Replace(self.start, self.stop).to_json()
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
    are still to come. A range of nothing but earlier summaries is no range (None). Works on
    the events alone, so nothing is projected, and yields to the event loop every few events.
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
    while 0 < end < len(old) and old[end].position == old[end - 1].position:
        end -= 1  # never split the messages of one replace
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
    """Whether the surface in ``replacement``'s range is unchanged since it was planned.

    The log only grows, so the surface inside a range of existing positions can change only
    through a replace appended since, whose own range meets it (an ordinary append lands after
    every existing position). Checking the events since the plan costs what was appended
    meanwhile, not the size of the range.
    """
    start, stop = replacement.start, replacement.stop
    for event in log.since(replacement.planned_at):
        op = event.op
        if type(op) is Replace or type(op) is Remove:
            if op.start <= stop and start <= op.stop:
                return False
        elif op is not None:
            return False  # a rewind or an uncompact may have changed any range
    return True


# The runner ---------------------------------------------------------------------------------


class Compaction(Request[list[bool]]):
    """Apply planned replacements that still apply; the result says, per replacement, whether
    it was applied (False: the surface in its range changed since the plan, so it is stale)."""

    __slots__ = ("logger", "replacements")

    def __init__(self, replacements: Sequence[Replacement], logger: Any) -> None:
        super().__init__()
        self.replacements = replacements
        self.logger = logger

    def apply(self, log: Log, committed: int) -> Applied:
        """Append one replace event per replacement that still applies."""
        outcome = []
        for replacement in self.replacements:
            if not still_applies(log, replacement):
                self.logger.info(
                    "nous_session.compaction_stale",
                    source=replacement.source,
                    start=replacement.start,
                    stop=replacement.stop,
                )
                outcome.append(False)
                continue
            event_type, _ = message_event(replacement.message)
            log = log.append(event_type, replacement.data(), time=replacement.message.created_at)
            outcome.append(True)
        return Applied(log, outcome, rebuilt=any(outcome))


class CompactionRunner:
    """Runs one session's compactions in the background, one at a time.

    The actor tells it about every commit (:meth:`committed`); when the policy triggers, it
    starts a child task in the session's task group that plans on the committed Log value,
    summarises, and posts the result back through ``post`` (the actor's queue). It keeps the
    session's compaction counters.

    Args:
        policy: when and how to compact.
        post: sends a request to the actor and returns its result (raises
            :class:`SessionClosedError` once the session is closing).
        current: the latest committed Log.
        task_group: where the compaction task runs.
        logger: the session's bound logger (the session id is on it).
        telemetry: the session's telemetry (a span per compaction), or None when it is off.
    """

    __slots__ = (
        "_closing",
        "_current",
        "_done",
        "_logger",
        "_meter",
        "_policy",
        "_post",
        "_retry_at",
        "_scope",
        "_task_group",
        "_telemetry",
        "_warnings",
        "failed",
        "in_flight",
        "run",
        "stale",
    )

    def __init__(
        self,
        policy: CompactionPolicy,
        *,
        post: Call,
        current: Callable[[], Log],
        task_group: anyio.abc.TaskGroup,
        logger: Any,
        telemetry: SessionTelemetry | None = None,
    ) -> None:
        self._policy = policy
        self._telemetry = telemetry
        self._post = post
        self._current = current
        self._task_group = task_group
        self._logger = logger
        self._meter = TokenMeter(policy.token_counter)
        self._warnings = Throttle()
        self._closing = False
        self._scope: anyio.CancelScope | None = None
        self._done = anyio.Event()
        self._done.set()
        self._retry_at = 0  # compaction waits for the surface to reach this size
        self.run = 0
        self.stale = 0
        self.failed = 0
        self.in_flight = False

    def committed(self, log: Log, *, rebuilt: bool) -> None:
        """See a new committed Log; start a compaction when the policy says so.

        ``rebuilt`` says whether the surface changed other than by growing at the end.
        """
        policy, meter = self._policy, self._meter
        surface = log.surface()  # the memoised fold; nothing is projected here
        # The meter must see every commit, or an unseen replace would corrupt its running sum.
        tokens = meter.update(surface, rebuilt=rebuilt) if policy.counts_tokens else 0
        if self.in_flight or self._closing or len(surface) < self._retry_at:
            return
        if policy.triggered(len(surface), tokens):
            self.in_flight = True
            self._done = anyio.Event()
            # The scope exists from now on, so a close before the task first runs cancels it.
            self._scope = anyio.CancelScope()
            self._task_group.start_soon(self._compact, self._scope, log, len(surface), tokens)

    def close(self) -> None:
        """Start no more compactions, and cancel the running one."""
        self._closing = True
        if self._scope is not None:
            self._scope.cancel()

    async def wait(self) -> None:
        """Wait until no compaction is running (including one that starts as the last ends:
        a compaction that lands over the trigger starts the next before it ends)."""
        while self.in_flight:
            await self._done.wait()

    async def _compact(self, scope: anyio.CancelScope, log: Log, size: int, tokens: int) -> None:
        policy = self._policy
        logger = self._logger.bind(count=log.count, surface=size, tokens=tokens)
        logger.info("nous_session.compaction_started")
        telemetry = self._telemetry  # telemetry hook: a span over the whole compaction
        traced = None if telemetry is None else telemetry.compaction_started(size, tokens)
        outcome = "failed"
        try:
            with scope:
                outcome = await self._compaction(log)
            if scope.cancelled_caught:
                outcome = "cancelled"
        except SessionClosedError:
            outcome = "cancelled"
        except Exception as error:
            # Nobody awaits a compaction: warn, but once a minute at most, with the count.
            count = self._warnings.due()
            if count is None:
                logger.debug("nous_session.compaction_failed", error=repr(error))
            else:
                logger.warning("nous_session.compaction_failed", error=repr(error), failures=count)
        finally:
            self._scope = None
            self.in_flight = False
            self._done.set()
            if telemetry is not None and traced is not None:  # telemetry hook
                telemetry.compaction_finished(traced, outcome)
        if outcome in ("applied", "pruned, summary stale"):
            self.run += 1
            logger.info("nous_session.compaction_finished", new_count=self._current().count)
        if outcome in ("stale", "pruned, summary stale"):
            self.stale += 1
        elif outcome == "failed":
            self.failed += 1
        surface = self._current().surface()
        if outcome in ("failed", "nothing"):
            # Do not retry on every commit: wait until the surface has grown.
            self._retry_at = size + 1
        elif (
            outcome != "stale"
            and outcome != "cancelled"
            and policy.triggered(len(surface), self._meter.total)
        ):
            # Still over the trigger: messages appended while this one ran (a slow summarizer
            # falls behind a busy session) are summarised by the next one, started at once. But
            # what remains may be only the kept tail, which no compaction can shrink: then wait
            # until enough has scrolled out of it to be worth a compaction.
            worth = max(1, policy.keep_last // 2)
            missing = worth - summarisable(surface, policy.keep_last)
            if missing > 0:
                self._retry_at = len(surface) + missing
                logger.info("nous_session.compaction_insufficient", retry_at=self._retry_at)
            else:
                self._retry_at = 0  # an earlier wait for the tail to scroll is over
        if outcome != "cancelled":
            self.committed(self._current(), rebuilt=False)

    async def _compaction(self, log: Log) -> str:
        """Prune, then summarise; every long loop yields to the event loop as it goes."""
        policy = self._policy
        pruned = False
        if policy.prune_tool_results is not None:
            replacements = await plan_pruning(log, policy.prune_tool_results)
            if replacements:
                outcome: list[bool] = await self._post(Compaction(replacements, self._logger))
                pruned = any(outcome)
                log = self._current()
                # The commit above brought the meter up to date.
                if pruned and not policy.triggered(len(log.surface()), self._meter.total):
                    return "applied"  # pruning was enough
        events = await plan_summary(log, policy.keep_last)
        if events is None:
            return "applied" if pruned else "nothing"
        old = await _cooperatively(to_message, events)
        if policy.summarizer is None:
            summary = await _structural_summary(old, _summary_bytes(policy))
        else:
            timeout = policy.summarizer_timeout
            with anyio.fail_after(timeout) if timeout is not None else nullcontext():
                text = await policy.summarizer(old)
            if not isinstance(text, str) or not text.strip():
                raise ValueError(f"the summarizer returned an empty summary: {text!r}")
            info: dict[str, JSON] = {"messages": summary_covers(old), "summarizer": "custom"}
            summary = Message.system(
                text, metadata={SUMMARY_METADATA: info}, created_at=old[0].created_at
            )
        replacement = summary_replacement(log, events, summary)
        (applied,) = await self._post(Compaction([replacement], self._logger))
        if applied:
            return "applied"
        return "pruned, summary stale" if pruned else "stale"


def _summary_bytes(policy: CompactionPolicy) -> int | None:
    """The most UTF-8 bytes a structural summary may take: under a token budget, half of what
    triggers (so that the summary and the kept tail fit under the trigger), else no limit."""
    if policy.token_budget is None:
        return None
    return int(policy.token_budget * policy.threshold * 4 / 2)


async def _structural_summary(old: Sequence[Message], max_bytes: int | None) -> Message:
    """:func:`~nous_session.transcript.summarize` of ``old`` (within ``max_bytes``), built a
    chunk at a time so that a long summary never holds the event loop."""
    builder = SummaryBuilder(max_bytes=max_bytes)
    for stop in range(len(old), 0, -CHUNK):
        for message in reversed(old[max(0, stop - CHUNK) : stop]):
            builder.add(message)
        await anyio.lowlevel.checkpoint()
    return builder.message(old[0].created_at)


async def _cooperatively(function: Callable[[T], U], items: Sequence[T]) -> list[U]:
    """``[function(item) for item in items]``, yielding to the event loop every ``CHUNK``
    items, so a compaction of a long session never holds the loop for more than a moment."""
    out: list[U] = []
    for start in range(0, len(items), CHUNK):
        out.extend([function(item) for item in items[start : start + CHUNK]])
        await anyio.lowlevel.checkpoint()
    return out
