"""The transcript toolbox: measure a list of messages, decide when it is too long, compact it.

A transcript is a plain list of :class:`~nous_session.message.Message`. Every function here
takes one and returns a new one; nothing is mutated and nothing is stored. The compaction here
is structural (no LLM call): older turns become one system message listing a preview of each.
The async variants run the same work in a worker thread so a long transcript does not stall the
event loop.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Sequence
from numbers import Real
from typing import Any, TypeAlias, TypeGuard

import anyio
import anyio.abc
import anyio.to_thread
import attrs

from nous_session._json import dumps

# The summaries' constants and builder are imported from here too (compaction does).
from nous_session._summary import PREVIEW_CHARS as PREVIEW_CHARS
from nous_session._summary import STRUCTURAL as STRUCTURAL
from nous_session._summary import SUMMARY_LINES as SUMMARY_LINES
from nous_session._summary import SUMMARY_METADATA as SUMMARY_METADATA
from nous_session._summary import SummaryBuilder as SummaryBuilder
from nous_session._summary import (
    summarize,
    summary_covers,
    summary_info,
    summary_line,
    summary_text,
)
from nous_session.message import Message, Role

__all__ = [
    "Compacted",
    "Outcome",
    "Unchanged",
    "balance_tool_call_boundary",
    "compact",
    "compact_async",
    "estimate_messages_tokens",
    "estimate_tokens",
    "maybe_compact",
    "maybe_compact_async",
    "message_bytes",
    "plan_compaction",
    "prune_tool_results",
    "should_compact",
    "start_compaction",
    "summarize",
    "summary_covers",
    "summary_info",
    "summary_line",
    "summary_text",
]

# Measuring ----------------------------------------------------------------------------------


def estimate_tokens(text: str | None) -> int:
    """A rough token count: UTF-8 bytes divided by four. ``None`` and ``""`` give 0.

    Deliberately cheap, not accurate: it under-counts code and JSON and over-counts CJK.
    """
    return len(text.encode()) // 4 if text else 0


def message_bytes(message: Message) -> int:
    """The UTF-8 bytes :func:`estimate_messages_tokens` counts for one message."""
    size = len(message.text.encode())
    for call in message.tool_calls:
        arguments = call.arguments
        size += len(call.name.encode())
        size += len(
            arguments.encode()
            if isinstance(arguments, str)
            # Exact for ints wider than 64 bits; the read-only mapping is written as a dict.
            else dumps(arguments)
        )
    return size


def estimate_messages_tokens(messages: Sequence[Message]) -> int:
    """The tokens of every message's text and tool calls (names and arguments), divided once.

    Summing bytes and dividing once matches :func:`estimate_tokens` of the concatenation, with
    no rounding error per message.
    """
    return sum(message_bytes(message) for message in messages) // 4


def should_compact(messages: Sequence[Message], n: int) -> bool:
    """True when there are more than ``n`` messages."""
    return len(messages) > n


# Compacting ---------------------------------------------------------------------------------


def balance_tool_call_boundary(
    old: Sequence[Message], recent: Sequence[Message]
) -> tuple[list[Message], list[Message]]:
    """Move the tool messages at the head of ``recent`` to the end of ``old``.

    A kept tail must never open with a tool result whose assistant call was summarised away:
    providers reject it.
    """
    split = 0
    while split < len(recent) and recent[split].role is Role.TOOL:
        split += 1
    return [*old, *recent[:split]], list(recent[split:])


def _leading_system(messages: Sequence[Message]) -> int:
    # An earlier summary is not part of the leading run: it is summarised again (merged) with
    # what came after it, so summaries supersede each other instead of piling up.
    count = 0
    while (
        count < len(messages)
        and messages[count].role is Role.SYSTEM
        and summary_info(messages[count]) is None
    ):
        count += 1
    return count


def _is_number(value: object) -> TypeGuard[float]:
    # float: any real number but a bool (an int, a float, a Fraction...) compares like one.
    return isinstance(value, Real) and not isinstance(value, bool)


def _valid_keep_last(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def plan_compaction(
    messages: Sequence[Message], keep_last: object, *, keep_leading: int | None = None
) -> tuple[int, int] | None:
    """Where :func:`compact` would cut: ``(lead, cut)``, or None when it would change nothing.

    ``messages[:lead]`` survives verbatim (by default the leading run of system messages, or
    the first ``keep_leading`` messages), ``messages[lead:cut]`` is what the summary replaces,
    and ``messages[cut:]`` is the kept tail (tool results at its head already moved into the
    summarised part).

    Raises:
        ValueError: compaction would happen and ``keep_last`` is not an int > 0.
    """
    lead = _leading_system(messages) if keep_leading is None else keep_leading
    rest = len(messages) - lead
    if _is_number(keep_last):
        if len(messages) <= keep_last or rest <= keep_last:
            return None
    elif rest == 0:
        return None
    if not _valid_keep_last(keep_last):
        raise ValueError(f"keep_last must be an int > 0, got {keep_last!r}")
    cut = len(messages) - keep_last
    # balance_tool_call_boundary, by index: tool results at the head of the tail go to old.
    while cut < len(messages) and messages[cut].role is Role.TOOL:
        cut += 1
    return lead, cut


def compact(messages: Sequence[Message], keep_last: int) -> list[Message]:
    """Replace all but the last ``keep_last`` messages with one structural summary.

    The leading run of system messages survives verbatim in front of the summary; an earlier
    summary (see :func:`summary_info`) is not part of it, and is merged into the new one. Tool
    results at the head of the kept tail are summarised with their call, so the tail may be
    shorter than ``keep_last`` but never opens with an orphan tool result. Unchanged (the same list)
    when ``len(messages) <= keep_last`` or when what follows the leading system messages fits.

    Raises:
        ValueError: compaction would happen and ``keep_last`` is not an int > 0.
    """
    split = plan_compaction(messages, keep_last)
    if split is None:
        return list(messages)
    lead, cut = split
    return [*messages[:lead], summarize(messages[lead:cut]), *messages[cut:]]


def prune_tool_results(messages: Sequence[Message], max_result_chars: int = 8192) -> list[Message]:
    """Elide the middle of every tool result longer than ``max_result_chars`` characters.

    An oversized result keeps its first ``min(4096, cap*4//5)`` and last ``min(1024, cap//5)``
    characters around a marker saying how many UTF-8 bytes were removed; every other field is
    kept. Every other message is returned as the same object; order and length never change.

    Raises:
        ValueError: ``max_result_chars`` is not an int >= 1.
    """
    cap = max_result_chars
    if not isinstance(cap, int) or isinstance(cap, bool) or cap < 1:
        raise ValueError(f"max_result_chars must be an int >= 1, got {cap!r}")
    head, tail = min(4096, cap * 4 // 5), min(1024, cap // 5)
    out: list[Message] = []
    for message in messages:
        content = message.content
        if message.role is Role.TOOL and isinstance(content, str) and len(content) > cap:
            removed = content[head : len(content) - tail]
            marker = (
                f"\n\n[... {len(removed.encode())} bytes elided by transcript pruning; "
                f"kept {head} leading and {tail} trailing characters ...]\n\n"
            )
            kept_tail = content[len(content) - tail :] if tail else ""
            message = attrs.evolve(message, content=content[:head] + marker + kept_tail)
        out.append(message)
    return out


def _check_trigger_options(every: object, token_budget: object, threshold: object) -> None:
    for name, value in (("every", every), ("token_budget", token_budget)):
        if value is not None and (
            not isinstance(value, int) or isinstance(value, bool) or value < 0
        ):
            raise ValueError(f"{name} must be None or an int >= 0, got {value!r}")
    if not _is_number(threshold) or not 0 < threshold <= 1:
        raise ValueError(f"threshold must be a number in (0, 1], got {threshold!r}")


def _triggered(
    messages: Sequence[Message], every: int | None, token_budget: int | None, threshold: float
) -> bool:
    if every is not None and len(messages) > every:
        return True
    return (
        token_budget is not None and estimate_messages_tokens(messages) > token_budget * threshold
    )


def maybe_compact(
    messages: Sequence[Message],
    *,
    keep_last: int,
    every: int | None = None,
    token_budget: int | None = None,
    threshold: float = 0.8,
) -> list[Message]:
    """Compact when a trigger fires, else return the messages unchanged.

    Triggers are OR'd: more than ``every`` messages, or more than ``token_budget * threshold``
    estimated tokens. With neither set nothing triggers. ``keep_last`` is validated only when a
    trigger fires.

    Raises:
        ValueError: an option has a bad value (``keep_last`` only when a trigger fires).
    """
    _check_trigger_options(every, token_budget, threshold)
    if _triggered(messages, every, token_budget, threshold):
        return compact(messages, keep_last)
    return list(messages)


# Async --------------------------------------------------------------------------------------


@attrs.frozen
class Compacted:
    """The outcome of a compaction that changed the transcript."""

    messages: list[Message]


@attrs.frozen
class Unchanged:
    """The outcome of a compaction that left the transcript as it was."""

    messages: list[Message]


Outcome: TypeAlias = Compacted | Unchanged
Callback: TypeAlias = Callable[[Outcome], Awaitable[object] | object]


async def compact_async(messages: Sequence[Message], keep_last: int) -> list[Message]:
    """:func:`compact` in a worker thread, keeping the work off the event loop.

    Raises:
        ValueError: as :func:`compact`, before any thread is started.
    """
    if plan_compaction(messages, keep_last) is None:
        return list(messages)
    snapshot = list(messages)  # the worker must not see later changes to the caller's list
    return await anyio.to_thread.run_sync(compact, snapshot, keep_last)


async def _deliver(callback: Callback, outcome: Outcome) -> None:
    result = callback(outcome)
    if inspect.isawaitable(result):
        await result


async def _compact_task(
    messages: list[Message], keep_last: int, callback: Callback, trigger: dict[str, Any] | None
) -> None:
    def work() -> Outcome:
        if trigger is not None and not _triggered(messages, **trigger):
            return Unchanged(messages)
        if plan_compaction(messages, keep_last) is None:
            return Unchanged(messages)
        return Compacted(compact(messages, keep_last))

    await _deliver(callback, await anyio.to_thread.run_sync(work))


def start_compaction(
    task_group: anyio.abc.TaskGroup,
    messages: Sequence[Message],
    keep_last: int,
    callback: Callback,
) -> None:
    """Start :func:`compact` in ``task_group``; ``callback`` receives the outcome.

    The callback (sync or async) always learns what happened: :class:`Compacted` or
    :class:`Unchanged`. Unlike the synchronous :func:`compact`, ``keep_last`` is checked here,
    in the caller, before anything starts: an error in the background task could only reach
    the task group.

    Raises:
        ValueError: ``keep_last`` is not an int > 0.
        TypeError: ``callback`` is not callable.
    """
    if not _valid_keep_last(keep_last):
        raise ValueError(f"keep_last must be an int > 0, got {keep_last!r}")
    if not callable(callback):
        raise TypeError(f"callback must be callable, not {type(callback).__name__}")
    task_group.start_soon(_compact_task, list(messages), keep_last, callback, None)


_MAYBE_OPTIONS = frozenset({"keep_last", "every", "token_budget", "threshold"})


def maybe_compact_async(
    task_group: anyio.abc.TaskGroup,
    messages: Sequence[Message],
    callback: Callback,
    **options: Any,
) -> None:
    """Start :func:`maybe_compact` in ``task_group``; ``callback`` receives the outcome.

    Takes the options of :func:`maybe_compact` (``keep_last`` required). They are all checked
    here, in the caller, before anything starts (``keep_last`` too, whether or not a trigger
    would fire); the trigger itself is evaluated in the worker thread.

    Raises:
        TypeError: ``keep_last`` is missing, an option is unknown, or ``callback`` is not
            callable.
        ValueError: an option has a bad value.
    """
    unknown = set(options) - _MAYBE_OPTIONS
    if unknown:
        raise TypeError(f"maybe_compact_async got unknown options: {', '.join(sorted(unknown))}")
    if "keep_last" not in options:
        raise TypeError("maybe_compact_async needs keep_last")
    keep_last = options["keep_last"]
    trigger = {
        "every": options.get("every"),
        "token_budget": options.get("token_budget"),
        "threshold": options.get("threshold", 0.8),
    }
    _check_trigger_options(**trigger)
    if not _valid_keep_last(keep_last):
        raise ValueError(f"keep_last must be an int > 0, got {keep_last!r}")
    if not callable(callback):
        raise TypeError(f"callback must be callable, not {type(callback).__name__}")
    task_group.start_soon(_compact_task, list(messages), keep_last, callback, trigger)
