"""Background compaction in the SessionActor: policy, triggers, summarizers, staleness, pruning.

The contract is the "Compaction" paragraph of docs/design.md's "SessionActor" section and
issue 3. Every async test runs on asyncio and on trio (see ``anyio_backend`` in conftest.py).
Summarizers are gated with anyio.Events the test controls; background work is awaited by polling
a condition under a deadline.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import attrs
import pytest
from structlog.testing import capture_logs

from nous_session import (
    CompactionPolicy,
    Event,
    EventType,
    Log,
    Message,
    Replace,
    Role,
    SessionActor,
    ToolCall,
)
from nous_session.transcript import (
    compact,
    estimate_messages_tokens,
    maybe_compact,
    prune_tool_results,
    summary_line,
)

pytestmark = pytest.mark.anyio

SID = "compacted"
T0 = datetime(2024, 8, 3, 14, 0, 0, 42, tzinfo=UTC)
COMPACTED = "[Compacted "


def at(i: int) -> datetime:
    return T0 + timedelta(minutes=i, microseconds=i)


async def wait_for(predicate: Callable[[], bool]) -> None:
    """Poll ``predicate`` until it holds (a bounded wait on a condition); fail after 5 s."""
    with anyio.fail_after(5):
        while not predicate():  # noqa: ASYNC110 - the condition lives in the library
            await anyio.sleep(0.001)


def chat(n: int, start: int = 0, size: int = 0) -> list[Message]:
    """``n`` alternating user/assistant messages, distinctly timed, padded to ``size`` chars."""
    out = []
    for i in range(start, start + n):
        text = f"message {i}".ljust(size, ".")
        builder = Message.user if i % 2 == 0 else Message.assistant
        out.append(builder(text, created_at=at(i)))
    return out


async def load(session: SessionActor, messages: Sequence[Message]) -> tuple[Event, ...]:
    """Append the events ``Log.seed`` makes for ``messages``, in one atomic commit."""
    items = [(e.type, dict(e.data), e.time) for e in Log.seed(messages).events()]
    return await session.append_many(items)


def texts(session: SessionActor) -> list[str]:
    return [m.text for m in session.messages()]


def summaries(session: SessionActor) -> list[Message]:
    return [m for m in session.messages() if m.text.startswith(COMPACTED)]


async def settled(session: SessionActor) -> None:
    """One round trip through the actor, then no compaction in flight."""
    await session.append(EventType.STEP_END)
    await wait_for(lambda: not session.statistics().compaction_in_flight)


class GatedSummarizer:
    """The first call waits for ``gate`` then returns "S1"; later calls never return."""

    def __init__(self) -> None:
        self.gate = anyio.Event()
        self.calls: list[list[Message]] = []
        self.cancelled = 0

    async def __call__(self, messages: Sequence[Message]) -> str:
        self.calls.append(list(messages))
        n = len(self.calls)
        try:
            if n == 1:
                await self.gate.wait()
            else:
                await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            self.cancelled += 1
            raise
        return f"S{n}"


# The policy ----------------------------------------------------------------------------------


def test_policy_defaults() -> None:
    policy = CompactionPolicy(keep_last=4, every=10)
    assert policy.threshold == 0.8
    assert policy.token_budget is None
    assert policy.prune_tool_results is None
    assert policy.summarizer is None
    assert policy.token_counter is estimate_messages_tokens
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        policy.every = 3  # type: ignore[misc]
    assert CompactionPolicy(keep_last=1, token_budget=1000).every is None


@pytest.mark.parametrize(
    "options",
    [
        {"keep_last": 0, "every": 5},
        {"keep_last": -1, "every": 5},
        {"keep_last": True, "every": 5},
        {"keep_last": 1.5, "every": 5},
        {"keep_last": "2", "every": 5},
        {"keep_last": 2},  # no trigger
        {"keep_last": 2, "every": None, "token_budget": None},
        {"keep_last": 2, "every": -1},
        {"keep_last": 2, "every": 2.5},
        {"keep_last": 2, "every": True},
        {"keep_last": 2, "token_budget": -10},
        {"keep_last": 2, "token_budget": "100"},
        {"keep_last": 2, "token_budget": 100, "threshold": 0},
        {"keep_last": 2, "token_budget": 100, "threshold": -0.5},
        {"keep_last": 2, "token_budget": 100, "threshold": 1.01},
        {"keep_last": 2, "token_budget": 100, "threshold": float("nan")},
        {"keep_last": 2, "token_budget": 100, "threshold": True},
        {"keep_last": 2, "token_budget": 100, "threshold": "0.5"},
        {"keep_last": 2, "every": 5, "prune_tool_results": 0},
        {"keep_last": 2, "every": 5, "prune_tool_results": -3},
        {"keep_last": 2, "every": 5, "summarizer": "not callable"},
        {"keep_last": 2, "every": 5, "token_counter": 42},
        {"keep_last": 2, "every": 5, "summarizer_timeout": 0},
        {"keep_last": 2, "every": 5, "summarizer_timeout": -1},
    ],
)
def test_policy_refuses_bad_options(options: dict[str, Any]) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - each option names itself differently
        CompactionPolicy(**options)


@pytest.mark.parametrize("threshold", [1, 1.0, 0.01, 0.5])
def test_policy_accepts_thresholds_in_the_half_open_unit_interval(threshold: float) -> None:
    assert CompactionPolicy(keep_last=1, token_budget=10, threshold=threshold).threshold == (
        threshold
    )


# Triggers ------------------------------------------------------------------------------------


async def test_count_trigger_summarises_all_but_the_kept_tail() -> None:
    messages = chat(6)
    policy = CompactionPolicy(keep_last=2, every=5)
    async with SessionActor.open(session_id=SID, compaction=policy) as session:
        await load(session, messages[:5])
        await settled(session)
        # Five messages are not more than `every`: nothing happened.
        assert session.statistics().compactions_run == 0
        assert list(session.messages()) == messages[:5]

        before = datetime.now(UTC)
        await session.add_message(messages[5])
        await wait_for(lambda: session.statistics().compactions_run == 1)
        surface = list(session.messages())
        assert surface == compact(messages, 2)
        summary = surface[0]
        assert summary.role is Role.SYSTEM
        assert summary.text.startswith("[Compacted 4 earlier messages]")
        assert summary.created_at == messages[0].created_at
        assert surface[1:] == messages[4:]
        # The summary event replaces positions 0..3 and is dated when it was applied (the
        # history reads forward in time); its message keeps the date of the first it replaces.
        event = session.log.surface()[0]
        assert event.surface_op == Replace(0, 3)
        assert before <= event.time <= datetime.now(UTC)
        assert event.data["created_at"] == messages[0].created_at.isoformat()
        # Nothing is lost: every original event is still in the log.
        originals = [e for e in session.log.events() if e.is_surface and e.surface_op is None]
        assert [e.data["content"] for e in originals] == [m.text for m in messages]
        assert [e.time for e in originals] == [m.created_at for m in messages]
        stats = session.statistics()
        assert stats.compactions_failed == 0
        assert stats.compactions_stale == 0


def seqs_of(events: Sequence[Event]) -> list[int]:
    return [event.seq for event in events]


async def test_token_trigger_uses_budget_times_threshold() -> None:
    # Each message is 60 ASCII bytes: 15 tokens. 0.5 * 100 = 50 tokens: the 4th message fires.
    messages = chat(4, size=60)
    assert estimate_messages_tokens(messages[:3]) == 45
    policy = CompactionPolicy(keep_last=1, token_budget=100, threshold=0.5)
    async with SessionActor.open(session_id=SID, compaction=policy) as session:
        for message in messages[:3]:
            await session.add_message(message)
        await settled(session)
        assert session.statistics().compactions_run == 0
        assert list(session.messages()) == messages[:3]

        await session.add_message(messages[3])
        await wait_for(lambda: session.statistics().compactions_run == 1)
        surface = list(session.messages())
        # Under a token budget the summary keeps to half of what triggers (50 tokens: 100
        # bytes): of its three 70-byte lines, the newest.
        assert surface[0].text == "\n".join(
            [
                "[Compacted 3 earlier messages]",
                "  [... 2 older lines not kept]",
                summary_line(messages[2]),
            ]
        )
        assert surface[0].metadata["compaction"] == {
            "messages": 3,
            "summarizer": "structural",
            "lines_dropped": 2,
        }
        assert surface[1:] == messages[3:]


async def test_token_trigger_default_threshold_is_eight_tenths() -> None:
    # 15 tokens a message; 0.8 * 100 = 80: five messages (75) do not fire, six (90) do.
    messages = chat(6, size=60)
    policy = CompactionPolicy(keep_last=2, token_budget=100)
    async with SessionActor.open(session_id=SID, compaction=policy) as session:
        await load(session, messages[:5])
        await settled(session)
        assert session.statistics().compactions_run == 0
        await session.add_message(messages[5])
        await wait_for(lambda: session.statistics().compactions_run == 1)
        # The summary keeps to 40 tokens (160 bytes): the newest two of its four lines.
        expected = compact(messages, 2)
        assert list(session.messages())[1:] == expected[1:]
        assert session.messages()[0].text == "\n".join(
            [
                "[Compacted 4 earlier messages]",
                "  [... 2 older lines not kept]",
                *map(summary_line, messages[2:4]),
            ]
        )


async def test_a_custom_token_counter_is_used() -> None:
    counted: list[int] = []

    def counter(messages: Sequence[Message]) -> int:
        counted.append(len(messages))
        return 100 * len(messages)  # additive, as the policy requires

    messages = chat(11)
    policy = CompactionPolicy(keep_last=3, token_budget=1000, threshold=1.0, token_counter=counter)
    async with SessionActor.open(session_id=SID, compaction=policy) as session:
        await load(session, messages[:10])
        await settled(session)
        assert session.statistics().compactions_run == 0
        assert counted  # the hook was consulted
        await session.add_message(messages[10])
        await wait_for(lambda: session.statistics().compactions_run == 1)
        assert list(session.messages()) == compact(messages, 3)


async def test_leading_system_messages_are_never_summarised() -> None:
    lead = [
        Message.system("you are terse", created_at=at(0)),
        Message.system("tools: none", created_at=at(1)),
    ]
    messages = [*lead, *chat(6, start=2)]
    policy = CompactionPolicy(keep_last=2, every=6)
    async with SessionActor.open(session_id=SID, compaction=policy) as session:
        await load(session, messages)
        await wait_for(lambda: session.statistics().compactions_run == 1)
        surface = list(session.messages())
        assert surface == compact(messages, 2)
        assert surface[:2] == lead
        summary = surface[2]
        assert summary.text.startswith("[Compacted 4 earlier messages]")
        assert "[system]" not in summary.text
        assert summary.created_at == messages[2].created_at
        assert surface[3:] == messages[6:]
        assert session.log.surface()[2].surface_op == Replace(2, 5)


# Summarizers ---------------------------------------------------------------------------------


async def test_a_slow_summarizer_does_not_delay_appends() -> None:
    summarizer = GatedSummarizer()
    messages = chat(5)
    later = chat(20, start=5)
    policy = CompactionPolicy(keep_last=2, every=4, summarizer=summarizer)
    async with SessionActor.open(session_id=SID, compaction=policy) as session:
        await load(session, messages)
        await wait_for(lambda: len(summarizer.calls) == 1)
        # It was given exactly the messages to summarise.
        assert summarizer.calls[0] == messages[:3]
        with anyio.fail_after(1):
            for message in later:
                await session.add_message(message)
        # The appends completed while the summarizer was blocked, and no second one started.
        assert not summarizer.gate.is_set()
        assert len(summarizer.calls) == 1
        assert session.statistics().compaction_in_flight
        assert list(session.messages()) == [*messages, *later]

        summarizer.gate.set()
        await wait_for(lambda: session.statistics().compactions_run == 1)
        surface = list(session.messages())
        assert surface[0].text == "S1"
        assert surface[0].role is Role.SYSTEM
        assert surface[0].created_at == messages[0].created_at
        assert surface[1:] == [*messages[3:], *later]
        summary_event = session.log.surface()[0]
        assert summary_event.surface_op == Replace(0, 2)
        assert summary_event.seq == 25  # after every message appended meanwhile
        assert seqs_of(session.log.events()) == list(range(26))
    assert session.statistics().compaction_in_flight is False


async def test_a_stale_summary_is_dropped() -> None:
    summarizer = GatedSummarizer()
    messages = chat(5)
    policy = CompactionPolicy(keep_last=2, every=4, summarizer=summarizer)
    with capture_logs() as logs:
        async with SessionActor.open(session_id=SID, compaction=policy) as session:
            await load(session, messages)
            await wait_for(lambda: len(summarizer.calls) == 1)
            assert summarizer.calls[0] == messages[:3]  # positions 0..2
            edited = Message.user("message 1, edited", created_at=at(99))
            await session.replace(1, 1, edited)
            summarizer.gate.set()
            await wait_for(lambda: session.statistics().compactions_stale == 1)
            assert "S1" not in texts(session)
            assert list(session.messages()) == [messages[0], edited, *messages[2:]]
            assert session.statistics().compactions_run == 0
            assert session.log.count == 6  # nothing was appended for the stale result
    stale = [entry for entry in logs if entry["event"] == "nous_session.compaction_stale"]
    assert len(stale) == 1


async def test_a_replace_outside_the_range_does_not_make_the_summary_stale() -> None:
    summarizer = GatedSummarizer()
    messages = chat(5)
    policy = CompactionPolicy(keep_last=2, every=4, summarizer=summarizer)
    async with SessionActor.open(session_id=SID, compaction=policy) as session:
        await load(session, messages)
        await wait_for(lambda: len(summarizer.calls) == 1)
        edited = Message.assistant("message 3, edited", created_at=at(3))
        await session.replace(3, 3, edited)  # in the kept tail, outside 0..2
        summarizer.gate.set()
        await wait_for(lambda: session.statistics().compactions_run == 1)
        assert texts(session) == ["S1", "message 3, edited", "message 4"]
        assert session.statistics().compactions_stale == 0


def failing_summarizer(kind: str) -> tuple[Callable[..., Any], list[int]]:
    """A summarizer whose first call fails as ``kind`` says; later calls return "recovered"."""
    calls: list[int] = []

    async def summarizer(messages: Sequence[Message]) -> Any:
        calls.append(len(messages))
        if len(calls) == 1:
            if kind == "raises":
                raise RuntimeError("the model is down")
            if kind == "hangs":
                await anyio.sleep_forever()
            return {"empty": "", "blank": "  ", "whitespace": " \n\t", "none": None}[kind]
        return "recovered"

    return summarizer, calls


@pytest.mark.parametrize("kind", ["raises", "empty", "blank", "whitespace", "hangs", "none"])
async def test_a_failing_summarizer_loses_nothing(kind: str) -> None:
    summarizer, calls = failing_summarizer(kind)
    messages = chat(5)
    policy = CompactionPolicy(keep_last=2, every=4, summarizer=summarizer, summarizer_timeout=0.05)
    with capture_logs() as logs:
        async with SessionActor.open(session_id=SID, compaction=policy) as session:
            await load(session, messages)
            await wait_for(lambda: session.statistics().compactions_failed == 1)
            await wait_for(lambda: not session.statistics().compaction_in_flight)
            # Nothing lost, nothing summarised.
            assert list(session.messages()) == messages
            assert session.log.count == 5
            assert session.statistics().compactions_run == 0
            assert calls == [3]
            # The session carries on: appends work, and the next compaction succeeds.
            more = chat(1, start=5)
            event = await session.add_message(more[0])
            assert event.seq == 5
            await wait_for(lambda: session.statistics().compactions_run == 1)
            assert texts(session)[0] == "recovered"
            assert list(session.messages())[1:] == [*messages[4:], *more]
            assert session.statistics().compactions_failed == 1
            assert seqs_of(session.log.events()) == list(range(7))
    failed = [entry for entry in logs if entry["event"] == "nous_session.compaction_failed"]
    assert len(failed) == 1


async def test_closing_cancels_a_running_compaction() -> None:
    summarizer = GatedSummarizer()  # its gate is never opened
    messages = chat(5)
    policy = CompactionPolicy(keep_last=2, every=4, summarizer=summarizer, summarizer_timeout=None)
    with anyio.fail_after(1):
        async with SessionActor.open(session_id=SID, compaction=policy) as session:
            await load(session, messages)
            await wait_for(lambda: session.statistics().compaction_in_flight)
            await wait_for(lambda: len(summarizer.calls) == 1)
    assert summarizer.cancelled == 1
    stats = session.statistics()
    assert stats.compaction_in_flight is False
    assert stats.compactions_run == 0
    assert list(session.messages()) == messages
    assert session.log.count == 5


async def test_closing_right_after_the_triggering_commit_cancels_the_compaction() -> None:
    summarizer = GatedSummarizer()  # its gate is never opened
    policy = CompactionPolicy(keep_last=2, every=4, summarizer=summarizer, summarizer_timeout=None)
    with anyio.fail_after(1):
        async with SessionActor.open(session_id=SID, compaction=policy) as session:
            await load(session, chat(5))
            # Leave at once: the compaction this commit triggered may not have started yet.
            assert session.statistics().compaction_in_flight
    assert session.statistics().compaction_in_flight is False
    assert summarizer.calls == [] or summarizer.cancelled == 1
    assert session.statistics().compactions_run == 0


# Tool pairs ----------------------------------------------------------------------------------


def tool_transcript() -> list[Message]:
    """A transcript with parallel tool calls (two runs of several results) and a single one."""
    raw: list[Message] = [
        Message.system("you may call tools"),
        Message.user("plan a trip"),
        Message.assistant(
            None, tool_calls=[ToolCall("a", "weather", {}), ToolCall("b", "flights", {})]
        ),
        Message.tool("a", "sunny", name="weather"),
        Message.tool("b", "3 flights", name="flights"),
        Message.assistant("found weather and flights"),
        Message.user("book the cheapest"),
        Message.assistant(None, tool_calls=[ToolCall("c", "book", {"id": 1})]),
        Message.tool("c", "booked", name="book"),
        Message.assistant(
            "checking extras",
            tool_calls=[
                ToolCall("d", "hotel", {}),
                ToolCall("e", "car", {}),
                ToolCall("f", "insurance", {}),
            ],
        ),
        Message.tool("d", "hotel ok", name="hotel"),
        Message.tool("e", "car ok", name="car"),
        Message.tool("f", "insured", name="insurance"),
        Message.assistant("all done"),
        Message.user("thanks"),
    ]
    return [attrs.evolve(m, created_at=at(i)) for i, m in enumerate(raw)]


def assert_no_orphan_tool_result(surface: Sequence[Message]) -> None:
    """Every tool result on the surface follows the assistant message that made its call."""
    called: set[str] = set()
    for index, message in enumerate(surface):
        if message.role is Role.ASSISTANT:
            called.update(call.id for call in message.tool_calls)
        if message.role is Role.TOOL:
            assert message.tool_call_id in called, (
                f"tool result {message.tool_call_id!r} at {index} without its call: "
                f"{[m.text or m.role.value for m in surface]}"
            )


async def test_a_tool_pair_is_never_split_for_any_keep_last() -> None:
    messages = tool_transcript()
    rest = len(messages) - 1  # after the leading system message
    for keep_last in range(1, rest + 2):
        policy = CompactionPolicy(keep_last=keep_last, every=len(messages) - 1)
        async with SessionActor.open(session_id=SID, compaction=policy) as session:
            await load(session, messages)
            if keep_last >= rest:
                await settled(session)
                assert session.statistics().compactions_run == 0
                assert list(session.messages()) == messages
                continue
            await wait_for(lambda: session.statistics().compactions_run == 1)
            surface = list(session.messages())
            assert surface == compact(messages, keep_last), keep_last
            assert surface[0] == messages[0]
            assert surface[1].text.startswith(COMPACTED)
            tail = surface[2:]
            assert len(tail) <= keep_last
            assert tail == messages[len(messages) - len(tail) :]
            assert_no_orphan_tool_result(surface)
            assert len(session.log.events()) == len(messages) + 1


@pytest.mark.parametrize("keep_last", [1, 2, 3, 4])
async def test_repeated_compactions_never_split_a_tool_pair(keep_last: int) -> None:
    messages = tool_transcript()
    policy = CompactionPolicy(keep_last=keep_last, every=keep_last + 2)
    async with SessionActor.open(session_id=SID, compaction=policy) as session:
        for message in messages:
            await session.add_message(message)
            await settled(session)
            assert_no_orphan_tool_result(session.messages())
        assert session.statistics().compactions_run >= 2
        assert session.statistics().compactions_failed == 0
        # Every original message is still in the log, in order.
        originals = [e for e in session.log.events() if "surface_op" not in e.data]
        originals = [e for e in originals if e.is_surface]
        assert len(originals) == len(messages)


async def test_a_call_answered_after_another_still_running_call_is_not_split() -> None:
    """Two workers share a session: one's tool call ("x") is answered after the other's call
    ("y"), whose tool still runs. The summary ends before "y", and so before "x"'s result:
    it must end before "x" too (it took "x" and left its result on the surface, after the
    summary, answering a call no message on the surface made)."""
    messages = [
        Message.user("first worker asks"),
        Message.assistant(None, tool_calls=[ToolCall("x", "look", {})]),
        Message.assistant(None, tool_calls=[ToolCall("y", "search", {})]),  # the second's
        Message.tool("x", "found", name="look"),
        Message.assistant("first worker answers"),
        Message.user("first worker asks again"),
        Message.assistant("first worker answers again"),
        Message.user("and again"),
    ]
    policy = CompactionPolicy(keep_last=2, every=len(messages) - 1)
    async with SessionActor.open(session_id=SID, compaction=policy) as session:
        await load(session, [attrs.evolve(m, created_at=at(i)) for i, m in enumerate(messages)])
        await session.wait_for_compaction()
        await session.add_message(Message.tool("y", "nothing", name="search"))
        assert_no_orphan_tool_result(session.messages())


# Pruning -------------------------------------------------------------------------------------


def tool_call_transcript(big: int) -> list[Message]:
    return [
        Message.user("look it up", created_at=at(0)),
        Message.assistant(
            None, tool_calls=[ToolCall("c1", "search", {"q": "x"})], created_at=at(1)
        ),
        Message.tool("c1", "R" * big, name="search", created_at=at(2)),
        Message.assistant("ok", created_at=at(3)),
    ]


async def test_pruning_alone_when_it_is_enough() -> None:
    cap = 100
    messages = tool_call_transcript(4000)
    assert estimate_messages_tokens(messages) > 160
    policy = CompactionPolicy(keep_last=1, token_budget=200, prune_tool_results=cap)
    async with SessionActor.open(session_id=SID, compaction=policy) as session:
        await load(session, messages)
        await wait_for(lambda: session.statistics().compactions_run == 1)
        await settled(session)
        surface = list(session.messages())
        assert len(surface) == len(messages)
        assert not summaries(session)
        pruned = surface[2]
        assert pruned == prune_tool_results(messages, cap)[2]
        assert pruned.role is Role.TOOL
        assert pruned.tool_call_id == "c1"
        assert pruned.name == "search"
        assert pruned.created_at == messages[2].created_at
        assert isinstance(pruned.content, str)
        assert "[... 3900 bytes elided by transcript pruning" in pruned.content
        assert pruned.content.startswith("R" * 80)
        assert pruned.content.endswith("R" * 20)
        assert [surface[i] for i in (0, 1, 3)] == [messages[i] for i in (0, 1, 3)]
        # In place: the same position, and the original is still in the log.
        event = session.log.surface()[2]
        assert event.position == 2
        assert event.surface_op == Replace(2, 2)
        original = session.log.events()[2]
        assert original.data["content"] == "R" * 4000
        assert estimate_messages_tokens(surface) <= 160
        assert session.statistics().compactions_run == 1
        assert session.statistics().compactions_failed == 0


async def test_pruning_then_a_summary_when_pruning_is_not_enough() -> None:
    cap = 100
    messages = [
        *chat(3, size=800),
        Message.assistant(None, tool_calls=[ToolCall("c1", "fetch", {})], created_at=at(3)),
        Message.tool("c1", "R" * 4000, name="fetch", created_at=at(4)),
        Message.assistant("done", created_at=at(5)),
    ]
    policy = CompactionPolicy(keep_last=3, token_budget=500, prune_tool_results=cap)
    async with SessionActor.open(session_id=SID, compaction=policy) as session:
        await load(session, messages)
        await wait_for(lambda: session.statistics().compactions_run == 1)
        await settled(session)
        surface = list(session.messages())
        assert len(surface) == 4
        assert surface[0].text.startswith("[Compacted 3 earlier messages]")
        assert surface[0].created_at == messages[0].created_at
        assert surface[1] == messages[3]
        assert surface[2] == prune_tool_results(messages, cap)[4]
        assert surface[3] == messages[5]
        # Every original event, the big tool result included, is still in the log.
        assert session.log.events()[4].data["content"] == "R" * 4000
        assert seqs_of(session.log.events())[:6] == list(range(6))


async def test_pruning_is_not_repeated_on_a_pruned_result() -> None:
    cap = 100
    messages = tool_call_transcript(4000)
    policy = CompactionPolicy(keep_last=1, token_budget=200, prune_tool_results=cap)
    async with SessionActor.open(session_id=SID, compaction=policy) as session:
        await load(session, messages)
        await wait_for(lambda: session.statistics().compactions_run == 1)
        count = session.log.count
        for message in chat(2, start=4):
            await session.add_message(message)
        await settled(session)
        # One prune event only; the pruned result was not pruned again.
        prunes = [e for e in session.log.events() if e.data.get("surface_op") == ["replace", 2, 2]]
        assert len(prunes) == 1
        assert session.log.count == count + 3  # two messages and the settle marker


# Subscribers see compactions -------------------------------------------------------------------


async def test_a_subscriber_sees_the_summary_event() -> None:
    messages = chat(6)
    policy = CompactionPolicy(keep_last=2, every=5)
    received: list[Event] = []
    async with SessionActor.open(session_id=SID, compaction=policy) as session:
        async with session.subscribe() as events:
            await load(session, messages)
            await wait_for(lambda: session.statistics().compactions_run == 1)
            with anyio.fail_after(5):
                async for event in events:
                    received.append(event)
                    if len(received) == 7:
                        break
        assert received == list(session.log.events())
        summary = received[-1]
        assert summary.surface_op == Replace(0, 3)
        assert summary.data["content"].startswith(COMPACTED)  # type: ignore[union-attr]


async def test_a_summarizer_failing_at_every_compaction_warns_once_then_counts() -> None:
    """Nobody awaits a compaction, so its failure is warned about, but not once per commit:
    the first at once, the rest at debug until a minute has passed (then with their count)."""

    async def broken(messages: Any) -> str:
        raise RuntimeError("the summarizer is down")

    policy = CompactionPolicy(keep_last=1, every=2, summarizer=broken)
    with capture_logs() as logs:
        async with SessionActor.open(session_id=SID, compaction=policy) as session:
            for message in chat(12):
                await session.add_message(message)
                await session.wait_for_compaction()
            assert session.statistics().compactions_failed >= 3
    failed = [entry for entry in logs if entry["event"] == "nous_session.compaction_failed"]
    levels = [entry["log_level"] for entry in failed]
    assert len(failed) >= 3
    assert levels[0] == "warning"
    assert failed[0]["failures"] == 1
    assert set(levels[1:]) == {"debug"}


# Summaries merge, and compaction keeps up --------------------------------------------------


def lines_of(summary: Message) -> list[str]:
    """The summary's lines after its header."""
    return summary.text.split("\n")[1:]


async def test_the_default_summary_merges_earlier_summaries_instead_of_nesting() -> None:
    # The newcomer's reproduction: after 6 compactions the summary read "[Compacted 7 earlier
    # messages] [system] [Compacted 7 earlier messages] [system] ...", cut. Now it is one
    # summary, counting every original message it covers, each listed once.
    policy = CompactionPolicy(keep_last=6, every=12)
    messages = chat(43)
    async with SessionActor.open(session_id=SID, compaction=policy) as session:
        for message in messages:
            await session.add_message(message)
            await session.wait_for_compaction()
        assert session.statistics().compactions_run == 6
        surface = list(session.messages())
        assert len(summaries(session)) == 1
        summary = surface[0]
        tail = surface[1:]
        assert tail == messages[len(messages) - len(tail) :]
        covered = messages[: len(messages) - len(tail)]
        assert summary.text.startswith(f"[Compacted {len(covered)} earlier messages]\n")
        assert lines_of(summary) == [summary_line(m) for m in covered]
        assert "[system]" not in summary.text
        assert summary.metadata["compaction"] == {
            "messages": len(covered),
            "summarizer": "structural",
            "lines_dropped": 0,
        }
        assert summary.created_at == messages[0].created_at
        # The pure function, compacting its own result again, gives the same surface.
        expected: list[Message] = []
        for message in messages:
            expected = maybe_compact([*expected, message], keep_last=6, every=12)
        assert surface == expected


def test_summarize_merges_a_structural_and_a_custom_summary() -> None:
    first = compact(chat(5), 2)  # a structural summary of 3, then 2 kept
    assert first[0].metadata["compaction"]["messages"] == 3  # type: ignore[index]
    again = compact([*first, *chat(3, start=5)], 2)
    assert lines_of(again[0]) == [summary_line(m) for m in chat(6)]
    assert again[0].text.startswith("[Compacted 6 earlier messages]\n")
    # A custom summarizer's summary (its metadata says how many it covers) is one line, whole.
    custom = Message.system(
        "the user asked\nabout " + "x" * 300,
        metadata={"compaction": {"messages": 40, "summarizer": "custom"}},
        created_at=at(0),
    )
    merged = compact([custom, *chat(4, start=40)], 1)[0]
    assert merged.text.split("\n") == [
        "[Compacted 43 earlier messages]",
        "  [summary] the user asked about " + "x" * 300,
        *[summary_line(m) for m in chat(3, start=40)],
    ]
    assert merged.created_at == custom.created_at
    # A system message that merely looks like a summary is an ordinary message.
    lookalike = Message.system("[Compacted 9 earlier messages]\n  [user] hi", created_at=at(0))
    assert compact([lookalike, *chat(3, start=1)], 1)[0] == lookalike  # the leading run


async def test_a_custom_summary_is_marked_with_the_messages_it_covers() -> None:
    seen: list[list[Message]] = []

    async def summarizer(messages: Sequence[Message]) -> str:
        seen.append(list(messages))
        return f"S{len(seen)}"

    policy = CompactionPolicy(keep_last=2, every=4, summarizer=summarizer)
    async with SessionActor.open(session_id=SID, compaction=policy) as session:
        await load(session, chat(5))
        await session.wait_for_compaction()
        first = session.messages()[0]
        assert first.text == "S1"
        assert first.metadata["compaction"] == {"messages": 3, "summarizer": "custom"}
        await load(session, chat(3, start=5))
        await session.wait_for_compaction()
        # The second call got the first summary, recognisable by its metadata.
        assert seen[1][0] == first
        second = session.messages()[0]
        assert second.text == "S2"
        assert second.metadata["compaction"] == {"messages": 6, "summarizer": "custom"}


class SharedGateSummarizer:
    """Every call waits for the one ``gate``, then returns a summary naming its call."""

    def __init__(self) -> None:
        self.gate = anyio.Event()
        self.calls: list[list[Message]] = []

    async def __call__(self, messages: Sequence[Message]) -> str:
        self.calls.append(list(messages))
        await self.gate.wait()
        return f"S{len(self.calls)}"


async def test_a_compaction_landing_over_the_trigger_starts_the_next() -> None:
    # The newcomer's reproduction: every=12 and a slow summarizer; messages kept coming while
    # it ran, so when it landed the surface was still over the trigger (32 messages), and
    # wait_for_compaction() returned with it so.
    summarizer = SharedGateSummarizer()
    policy = CompactionPolicy(keep_last=6, every=12, summarizer=summarizer)
    messages = chat(33)
    async with SessionActor.open(session_id=SID, compaction=policy) as session:
        await load(session, messages[:13])
        await wait_for(lambda: len(summarizer.calls) == 1)
        for message in messages[13:]:
            await session.add_message(message)
        assert len(session.messages()) == 33
        summarizer.gate.set()
        with anyio.fail_after(5):
            await session.wait_for_compaction()
        stats = session.statistics()
        assert not stats.compaction_in_flight
        assert stats.compactions_run == 2
        assert stats.compactions_stale == 0
        surface = list(session.messages())
        assert len(surface) <= policy.every  # type: ignore[operator]
        assert [m.text for m in surface] == ["S2", *[m.text for m in messages[-6:]]]
        # The second compaction summarised the first summary with what came after it.
        assert summarizer.calls[1][0].text == "S1"
        assert summarizer.calls[1][1:] == messages[7:27]
        assert surface[0].metadata["compaction"] == {"messages": 27, "summarizer": "custom"}


async def test_wait_for_compaction_returns_when_only_the_kept_tail_is_over_the_trigger() -> None:
    # keep_last above `every`: the kept tail alone is over the trigger, and no compaction can
    # shrink it. wait_for_compaction() returns; the next compaction waits for keep_last // 2
    # new messages to scroll out of the tail.
    policy = CompactionPolicy(keep_last=4, every=3)
    messages = chat(12)
    async with SessionActor.open(session_id=SID, compaction=policy) as session:
        await load(session, messages[:10])
        with anyio.fail_after(5):
            await session.wait_for_compaction()
        assert session.statistics().compactions_run == 1
        assert len(session.messages()) == 5
        await session.add_message(messages[10])
        await session.wait_for_compaction()
        assert session.statistics().compactions_run == 1  # one new message: not worth it
        await session.add_message(messages[11])
        await session.wait_for_compaction()
        assert session.statistics().compactions_run == 2
        assert texts(session)[1:] == [m.text for m in messages[8:]]
        assert session.messages()[0].text.startswith("[Compacted 8 earlier messages]\n")
