"""Suite "log": the pure core, against issue 2's performance targets.

* ``append``: ``log.append`` of a typical chat event vs a bare ``list.append(Event(...))``.
* ``agent_loop``: "append one message, read ``derive_messages()``" at 100,000 vs 1,000 events.
* ``since``: ``since(count - 10)`` at 1,000,000 vs 1,000 events.
* ``compact``: ``transcript.compact`` and ``maybe_compact`` on 100,000 vs 10,000 messages.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime

from benchmarks.harness import (
    Context,
    Measurement,
    Side,
    Target,
    expect,
    interleave_slices,
    measure,
    ratio,
)
from benchmarks.workloads import chat_data, chat_event_type, chat_messages
from nous_session import Event, EventType, Log, Message
from nous_session.transcript import SUMMARY_LINES, maybe_compact
from nous_session.transcript import compact as transcript_compact

US = 1e6
MS = 1e3
ISSUE_2 = "issue 2"


SLICE_NOTE = "sides interleaved in ~1 ms slices within each round"


def append(ctx: Context) -> list[Measurement]:
    """``log.append`` of a ~200-byte chat event (time given) vs ``list.append(Event(...))``."""
    slices, per_slice = ctx.size(20, 10), 1_000
    n = slices * per_slice
    data = chat_data(7)
    when = datetime.now(UTC)
    user = EventType.USER_MESSAGE

    def log_append() -> Iterator[float | None]:
        log = Log()
        yield None
        for _ in range(slices):
            start = time.perf_counter()
            for _ in range(per_slice):
                log = log.append(user, data, time=when)
            yield time.perf_counter() - start
        expect(log.count == n, f"log.append: count {log.count} != {n}")
        last = log.last
        expect(
            last is not None and last.data["content"] == data["content"] and last.time == when,
            "log.append: the last event is not the one appended",
        )

    def log_append_now() -> Iterator[float | None]:
        log = Log()
        yield None
        for _ in range(slices):
            start = time.perf_counter()
            for _ in range(per_slice):
                log = log.append(user, data)
            yield time.perf_counter() - start
        expect(log.count == n, f"log.append(time=None): count {log.count} != {n}")

    def bare_list_append() -> Iterator[float | None]:
        events: list[Event] = []
        seq = 0
        yield None
        for _ in range(slices):
            start = time.perf_counter()
            for _ in range(per_slice):
                events.append(Event(seq, user, data, when))
                seq += 1
            yield time.perf_counter() - start
        expect(len(events) == n and events[-1].seq == n - 1, "list.append: wrong events")

    samples = interleave_slices(
        ctx.rounds,
        {
            "log": Side(log_append, slices),
            "bare": Side(bare_list_append, slices),
            "log_now": Side(log_append_now, slices),
        },
    )
    per_op = {key: [s / n * US for s in values] for key, values in samples.items()}
    return [
        measure("log.append.chat_event", "us/op", per_op["log"]),
        measure("log.append.time_none", "us/op", per_op["log_now"]),
        measure("log.append.bare_list_append", "us/op", per_op["bare"]),
        ratio(
            "log.append.ratio",
            per_op["log"],
            per_op["bare"],
            target=Target("<=", 4, ISSUE_2),
            note="log.append(USER_MESSAGE, {content: 200 B}, time=t) / "
            "list.append(Event(seq, USER_MESSAGE, data, t)), prebuilt data and time, "
            f"{n:,} appends per round; {SLICE_NOTE}",
        ),
        ratio(
            "log.append.time_none_ratio",
            per_op["log_now"],
            per_op["bare"],
            note="the same with time=None (the log reads the clock)",
        ),
    ]


def _chat_log(count: int) -> Log:
    """A log of ``count`` surface events: a realistic chat with tool calls and results."""
    log = Log.seed(chat_messages(count))
    expect(log.count == count, f"seeded log has count {log.count}, not {count}")
    return log


def agent_loop(ctx: Context) -> list[Measurement]:
    """Per-iteration cost of "append one message, read derive_messages()" at 100k vs 1k."""
    slices, per_slice = ctx.size(40, 20), 100
    iterations = slices * per_slice
    small, large = 1_000, 100_000
    bases = {}
    for size in (small, large):
        base = _chat_log(size)
        expect(len(base.derive_messages()) == size, "the seeded surface is incomplete")
        bases[size] = base
    payloads = [(chat_event_type(i), chat_data(i)) for i in range(iterations)]
    when = datetime.now(UTC)

    def loop(size: int) -> Iterator[float | None]:
        # A private fork of the base, its memo warm, made outside the timing: the loop then
        # measures the linear case only (no fork copies inside it).
        log = bases[size].append(EventType.USER_MESSAGE, chat_data(0), time=when)
        messages: Sequence[Message] = log.derive_messages()
        yield None
        for index in range(0, iterations, per_slice):
            start = time.perf_counter()
            for event_type, data in payloads[index : index + per_slice]:
                log = log.append(event_type, data, time=when)
                messages = log.derive_messages()
                last = messages[-1]
            yield time.perf_counter() - start
        expect(len(messages) == size + 1 + iterations, "agent loop: surface length is wrong")
        expect(last.text == payloads[-1][1]["content"], "agent loop: wrong last message")

    samples = interleave_slices(
        ctx.rounds,
        {"1k": Side(lambda: loop(small), slices), "100k": Side(lambda: loop(large), slices)},
    )
    per_iteration = {key: [s / iterations * US for s in values] for key, values in samples.items()}
    return [
        measure("log.agent_loop.at_1k", "us/iter", per_iteration["1k"]),
        measure("log.agent_loop.at_100k", "us/iter", per_iteration["100k"]),
        ratio(
            "log.agent_loop.ratio",
            per_iteration["100k"],
            per_iteration["1k"],
            target=Target("<=", 1.5, ISSUE_2),
            note=f"per iteration at 100,000 / at 1,000 events; {iterations:,} iterations per "
            f"round on a fork whose memo is warm; {SLICE_NOTE}",
        ),
    ]


def _plain_log(count: int, *, gap: int = 1) -> Log:
    """``count`` chat events; with ``gap`` > 1 their seqs leap (as a snapshot leaves them)."""
    data = chat_data(3)  # one shared payload: since() never looks at it
    when = datetime.now(UTC)
    user = EventType.USER_MESSAGE
    log = Log()
    if gap == 1:
        for _ in range(count):
            log = log.append(user, data, time=when)
    else:
        for index in range(count):
            log = log.append_at(index * gap, user, data, time=when)
    return log


def since(ctx: Context) -> list[Measurement]:
    """``list(log.since(count - 10))`` at 1,000,000 vs 1,000 events (and across gaps)."""
    slices, per_slice = ctx.size(20, 10), 1_000
    calls = slices * per_slice
    small, large = 1_000, 1_000_000
    logs = {"1k": _plain_log(small), "1M": _plain_log(large)}
    gapped = not ctx.quick  # the bisect path; a second million events, so full runs only
    if gapped:
        logs["gapped_1k"] = _plain_log(small, gap=3)
        logs["gapped_1M"] = _plain_log(large, gap=3)

    def run(key: str) -> Iterator[float | None]:
        log = logs[key]
        step = 3 if key.startswith("gapped") else 1
        seq = log.count - 1 - 9 * step  # the tenth newest event (count - 10 without gaps)
        expected = [seq + step * i for i in range(10)]
        events: list[Event] = []
        yield None
        for _ in range(slices):
            start = time.perf_counter()
            for _ in range(per_slice):
                events = list(log.since(seq))
            yield time.perf_counter() - start
        seqs = [event.seq for event in events]
        expect(seqs == expected, f"since at {key}: got seqs {seqs}, expected {expected}")

    samples = interleave_slices(
        ctx.rounds, {key: Side(lambda key=key: run(key), slices) for key in logs}
    )
    per_call = {key: [s / calls * US for s in values] for key, values in samples.items()}
    out = [
        measure("log.since.at_1k", "us/call", per_call["1k"]),
        measure("log.since.at_1M", "us/call", per_call["1M"]),
        ratio(
            "log.since.ratio",
            per_call["1M"],
            per_call["1k"],
            target=Target("<=", 2, ISSUE_2),
            note=f"list(log.since(count - 10)) at 1,000,000 / at 1,000 events; {SLICE_NOTE}",
        ),
    ]
    if gapped:
        out += [
            measure("log.since.gapped_at_1k", "us/call", per_call["gapped_1k"]),
            measure("log.since.gapped_at_1M", "us/call", per_call["gapped_1M"]),
            ratio(
                "log.since.gapped_ratio",
                per_call["gapped_1M"],
                per_call["gapped_1k"],
                target=Target("<=", 2, ISSUE_2),
                informational=True,
                note="the same with gaps between seqs (held != count: the bisect path)",
            ),
        ]
    return out


def compact(ctx: Context) -> list[Measurement]:
    """``compact`` and ``maybe_compact`` on 100,000 vs 10,000 messages (with tool calls)."""
    keep_last = 20
    small, large = 10_000, 100_000
    repeats = large // small  # the small side runs this often per round, around the large one
    # The small side runs on distinct transcripts, so together they touch as much fresh memory
    # as the large one (repeating one 10k transcript would run it from a warm cache).
    smalls = [chat_messages(small) for _ in range(repeats)]
    big = chat_messages(large)

    def check(result: list[Message], size: int) -> None:
        expect(len(result) <= 2 + keep_last, f"compact({size}) kept {len(result)} messages")
        summary = result[1]
        header = summary.text.split("\n", 1)[0]
        summarised = size - 1 - (len(result) - 2)
        expect(
            summary.is_system and header == f"[Compacted {summarised} earlier messages]",
            f"compact({size}): unexpected summary header {header!r}",
        )
        # The newest SUMMARY_LINES lines, and one saying how many older ones were dropped.
        lines = min(summarised, SUMMARY_LINES) + (summarised > SUMMARY_LINES)
        expect(summary.text.count("\n") == lines, f"compact({size}): wrong line count")

    def run(size: int, *, through_maybe: bool) -> Iterator[float | None]:
        yield None
        for messages in smalls if size == small else [big]:
            start = time.perf_counter()
            if through_maybe:
                # The token trigger: the estimate walks every message before compacting.
                result = maybe_compact(messages, keep_last=keep_last, token_budget=10_000)
            else:
                result = transcript_compact(messages, keep_last)
            yield time.perf_counter() - start
            check(result, size)

    samples = interleave_slices(
        ctx.rounds,
        {
            "compact_10k": Side(lambda: run(small, through_maybe=False), repeats),
            "compact_100k": Side(lambda: run(large, through_maybe=False), 1),
            "maybe_10k": Side(lambda: run(small, through_maybe=True), repeats),
            "maybe_100k": Side(lambda: run(large, through_maybe=True), 1),
        },
    )
    per_call = {
        key: [s / (repeats if key.endswith("_10k") else 1) * MS for s in values]
        for key, values in samples.items()
    }
    mix = (
        f"100,000 / 10,000 messages (a system prompt, user/assistant turns, a tool call and its "
        f"result every 10th assistant turn), keep_last={keep_last}; per round the 10k side runs "
        f"{repeats} times (on distinct transcripts) around one 100k call"
    )
    return [
        measure("log.compact.at_10k", "ms", per_call["compact_10k"]),
        measure("log.compact.at_100k", "ms", per_call["compact_100k"]),
        ratio(
            "log.compact.ratio",
            per_call["compact_100k"],
            per_call["compact_10k"],
            target=Target("<=", 12, ISSUE_2),
            note=mix,
        ),
        measure("log.maybe_compact.at_10k", "ms", per_call["maybe_10k"]),
        measure("log.maybe_compact.at_100k", "ms", per_call["maybe_100k"]),
        ratio(
            "log.maybe_compact.ratio",
            per_call["maybe_100k"],
            per_call["maybe_10k"],
            target=Target("<=", 12, ISSUE_2),
            note="the same through maybe_compact's token trigger (token_budget=10,000)",
        ),
    ]


BENCHMARKS = [append, agent_loop, since, compact]
