"""nous_session.transcript: measuring, compacting and pruning a list of messages.

The contract is the "Transcript" section of docs/design.md; every example of
seeds/transcripts.txt is translated here (the ``test_seed_*`` tests).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import anyio.lowlevel
import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

import nous_session
from nous_session.message import Message, ToolCall
from nous_session.messages import find_by_role
from nous_session.transcript import (
    Compacted,
    Unchanged,
    balance_tool_call_boundary,
    compact,
    compact_async,
    estimate_messages_tokens,
    estimate_tokens,
    maybe_compact,
    maybe_compact_async,
    prune_tool_results,
    should_compact,
    start_compaction,
    summarize,
    summary_line,
    summary_text,
)

T0 = datetime(2024, 5, 17, 9, 0, 0, 250000, tzinfo=UTC)

Outcome = Compacted | Unchanged
Callback = Callable[[Outcome], Awaitable[None] | None]


def at(index: int) -> datetime:
    return T0 + timedelta(seconds=index, microseconds=index)


def users(count: int, template: str = "Message {}") -> list[Message]:
    return [Message.user(template.format(i), created_at=at(i)) for i in range(1, count + 1)]


def big(count: int, size: int) -> list[Message]:
    """``count`` user messages of ``size`` ASCII bytes each."""
    return [Message.user("z" * size, created_at=at(i)) for i in range(count)]


def tool_heavy() -> list[Message]:
    """A small, well-formed transcript with several runs of parallel tool results."""
    return [
        Message.system("You are terse.", created_at=at(0)),
        Message.user("Weather in Paris, Rome and Oslo?", created_at=at(1)),
        Message.assistant(
            "Checking.",
            tool_calls=[
                ToolCall("c1", "get_weather", {"city": "Paris"}),
                ToolCall("c2", "get_weather", {"city": "Rome"}),
                ToolCall("c3", "get_weather", {"city": "Oslo"}),
            ],
            created_at=at(2),
        ),
        Message.tool("c1", "18C", name="get_weather", created_at=at(3)),
        Message.tool("c2", "25C", name="get_weather", created_at=at(4)),
        Message.tool("c3", "3C", name="get_weather", created_at=at(5)),
        Message.assistant("Paris 18, Rome 25, Oslo 3.", created_at=at(6)),
        Message.user("And the time there?", created_at=at(7)),
        Message.assistant(
            None,
            tool_calls=[
                ToolCall("c4", "get_time", '{"tz": "Europe/Paris"}'),
                ToolCall("c5", "get_time", '{"tz": "Europe/Oslo"}'),
            ],
            created_at=at(8),
        ),
        Message.tool("c4", "10:00", name="get_time", created_at=at(9)),
        Message.tool("c5", "10:00", created_at=at(10)),
        Message.assistant(None, tool_calls=[ToolCall("c6", "log", {})], created_at=at(11)),
        Message.tool("c6", "ok", name="log", created_at=at(12)),
        Message.assistant("Both 10:00.", created_at=at(13)),
    ]


def assert_tool_pairs_intact(result: Sequence[Message]) -> None:
    """Every tool message has the assistant message that called it earlier in ``result``."""
    called: set[str] = set()
    for message in result:
        if message.role == "assistant":
            called.update(call.id for call in message.tool_calls)
        if message.role == "tool":
            assert message.tool_call_id in called, f"orphan tool result {message.tool_call_id}"


def split_result(result: Sequence[Message]) -> tuple[list[Message], Message, list[Message]]:
    """(leading system messages, the summary, the kept tail) of a compacted transcript."""
    index = 0
    while not result[index].text.startswith("[Compacted "):
        index += 1
    return list(result[:index]), result[index], list(result[index + 1 :])


# A naive reference, written straight from the design's rules -------------------------------


def reference_summary_line(message: Message) -> str:
    if message.role == "tool":
        return f'  [tool] <result for "{message.name or "unknown"}" omitted from summary>'
    return f"  [{message.role.value}] " + message.text[:101].replace("\n", " ")


def reference_compact(messages: Sequence[Message], keep_last: int) -> list[Message]:
    lead = 0
    while lead < len(messages) and messages[lead].role == "system":
        lead += 1
    rest = list(messages[lead:])
    if len(messages) <= keep_last or len(rest) <= keep_last:
        return list(messages)
    old, recent = rest[: len(rest) - keep_last], rest[len(rest) - keep_last :]
    while recent and recent[0].role == "tool":
        old.append(recent.pop(0))
    lines = [reference_summary_line(message) for message in old]
    summary = Message.system(
        f"[Compacted {len(old)} earlier messages]\n" + "\n".join(lines),
        metadata={
            "compaction": {"messages": len(old), "summarizer": "structural", "lines_dropped": 0}
        },
        created_at=old[0].created_at,
    )
    return [*messages[:lead], summary, *recent]


def reference_bytes(message: Message) -> int:
    size = len(message.text.encode("utf-8"))
    for call in message.tool_calls:
        size += len(call.name.encode("utf-8"))
        arguments = call.arguments
        if isinstance(arguments, str):
            size += len(arguments.encode("utf-8"))
        else:
            encoded = json.dumps(dict(arguments), separators=(",", ":"), ensure_ascii=False)
            size += len(encoded.encode("utf-8"))
    return size


def reference_prune(content: str, cap: int) -> str:
    head = min(4096, cap * 4 // 5)
    tail = min(1024, cap // 5)
    removed = content[head : len(content) - tail]
    kept_tail = content[len(content) - tail :] if tail else ""
    return (
        content[:head]
        + f"\n\n[... {len(removed.encode('utf-8'))} bytes elided by transcript pruning; "
        + f"kept {head} leading and {tail} trailing characters ...]\n\n"
        + kept_tail
    )


@st.composite
def transcripts(draw: st.DrawFn) -> list[Message]:
    """Well-formed transcripts: optional system prompt, then turns, tool results after calls."""
    clock = iter(range(10_000))
    texts = st.text(st.characters(codec="utf-8"), max_size=130)
    messages = [
        Message.system(draw(texts), created_at=at(next(clock)))
        for _ in range(draw(st.integers(0, 2)))
    ]
    call_number = 0
    for kind in draw(
        st.lists(st.sampled_from(["user", "assistant", "tools", "system"]), max_size=14)
    ):
        if kind == "user":
            messages.append(Message.user(draw(texts), created_at=at(next(clock))))
        elif kind == "assistant":
            messages.append(Message.assistant(draw(texts), created_at=at(next(clock))))
        elif kind == "system":
            messages.append(Message.system(draw(texts), created_at=at(next(clock))))
        else:
            calls = []
            for _ in range(draw(st.integers(1, 3))):
                call_number += 1
                calls.append(ToolCall(f"call_{call_number}", f"tool_{call_number}", {}))
            messages.append(
                Message.assistant(
                    draw(st.none() | texts), tool_calls=calls, created_at=at(next(clock))
                )
            )
            for call in calls:
                name = draw(st.sampled_from([call.name, None]))
                messages.append(
                    Message.tool(call.id, draw(texts), name=name, created_at=at(next(clock)))
                )
    return messages


# estimate_tokens -----------------------------------------------------------------------------


def test_seed_estimate_tokens() -> None:
    assert estimate_tokens("Hello world") == 2
    assert estimate_tokens("Hello world, how are you?") == 6
    assert estimate_tokens(None) == 0


def test_estimate_tokens_of_empty_is_zero() -> None:
    assert estimate_tokens("") == 0


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("abc", 0),
        ("abcd", 1),
        ("abcdefg", 1),
        ("abcdefgh", 2),
        ("é", 0),  # 2 bytes
        ("éé", 1),  # 4 bytes, 2 characters
        ("😀", 1),  # 4 bytes, 1 character
        ("日本語", 2),  # 9 bytes, 3 characters
        ("😀😀😀", 3),  # 12 bytes
    ],
)
def test_estimate_tokens_counts_utf8_bytes(text: str, expected: int) -> None:
    assert estimate_tokens(text) == expected


@given(st.text())
def test_estimate_tokens_is_bytes_over_four(text: str) -> None:
    assert estimate_tokens(text) == len(text.encode("utf-8")) // 4


# estimate_messages_tokens -------------------------------------------------------------------


def test_seed_estimate_messages_tokens() -> None:
    messages = [Message.user("Hello"), Message.assistant("Hi there")]
    assert estimate_messages_tokens(messages) == 3


def test_estimate_messages_tokens_divides_once() -> None:
    # 3 + 3 bytes: per-message rounding would give 0 + 0.
    assert estimate_messages_tokens([Message.user("abc"), Message.user("abc")]) == 1
    texts = ["Hello", " world", ", how", " are you?"]
    assert estimate_messages_tokens([Message.user(t) for t in texts]) == estimate_tokens(
        "".join(texts)
    )


def test_estimate_messages_tokens_of_nothing() -> None:
    assert estimate_messages_tokens([]) == 0
    assert estimate_messages_tokens([Message.assistant()]) == 0


def test_estimate_messages_tokens_counts_multibyte_text_in_bytes() -> None:
    assert (
        estimate_messages_tokens([Message.user("😀"), Message.user("é"), Message.user("éé")]) == 2
    )


def test_estimate_messages_tokens_counts_tool_call_name_and_mapping_arguments_compactly() -> None:
    # "x" (1) + "get" (3) + '{"a":1}' (7) = 11 bytes -> 2; '{"a": 1}' would make 12 -> 3.
    message = Message.assistant("x", tool_calls=[ToolCall("c", "get", {"a": 1})])
    assert estimate_messages_tokens([message]) == 2


def test_estimate_messages_tokens_counts_string_arguments_as_given() -> None:
    # "get" (3) + '{"a":  1}' (9) = 12 bytes -> 3; re-encoding compactly would give 10 -> 2.
    message = Message.assistant(None, tool_calls=[ToolCall("c", "get", '{"a":  1}')])
    assert estimate_messages_tokens([message]) == 3


def test_estimate_messages_tokens_counts_arguments_as_utf8_json() -> None:
    # '{"c":"é"}' is 10 bytes as UTF-8 JSON; ASCII-escaped ('{"c":"\\u00e9"}') it would be 14.
    # "fn" (2) + 10 = 12 -> 3; escaped: 16 -> 4.
    message = Message.assistant(None, tool_calls=[ToolCall("c", "fn", {"c": "é"})])
    assert estimate_messages_tokens([message]) == 3


def test_estimate_messages_tokens_ignores_tool_call_ids_and_reasoning() -> None:
    message = Message.assistant(
        "abcd",
        tool_calls=[ToolCall("a-very-long-tool-call-identifier", "f", "{}")],
        reasoning_content="a long chain of thought that is not sent back " * 4,
    )
    # "abcd" (4) + "f" (1) + "{}" (2) = 7 -> 1
    assert estimate_messages_tokens([message]) == 1


def test_estimate_messages_tokens_counts_every_tool_call() -> None:
    message = Message.assistant(
        None,
        tool_calls=[ToolCall("1", "ab", "cd"), ToolCall("2", "ef", {}), ToolCall("3", "gh", "")],
    )
    # "ab"+"cd" (4) + "ef"+"{}" (4) + "gh"+"" (2) = 10 -> 2
    assert estimate_messages_tokens([message]) == 2


def test_estimate_messages_tokens_counts_text_parts_only() -> None:
    message = Message.user(
        [
            {"type": "text", "text": "abcd"},
            {"type": "image_url", "url": "https://example.com/" + "x" * 400},
            {"type": "text", "text": "efgh"},
        ]
    )
    assert estimate_messages_tokens([message]) == 2


def test_estimate_messages_tokens_counts_tool_results_text() -> None:
    assert estimate_messages_tokens([Message.tool("c", {"k": "abcdefgh"})]) == 16 // 4


jsonish = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=6),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=4), children, max_size=3)
    ),
    max_leaves=8,
)
tool_calls_strategy = st.lists(
    st.builds(
        ToolCall,
        st.text(max_size=8),
        st.text(max_size=8),
        st.dictionaries(st.text(max_size=4), jsonish, max_size=3) | st.text(max_size=12),
    ),
    max_size=3,
)
random_messages = st.lists(
    st.builds(
        Message,
        role=st.sampled_from(["system", "user", "assistant", "tool"]),
        content=st.none()
        | st.text(max_size=40)
        | st.lists(
            st.builds(lambda t: {"type": "text", "text": t}, st.text(max_size=10))
            | st.builds(lambda u: {"type": "image_url", "url": u}, st.text(max_size=10)),
            max_size=3,
        ),
        tool_calls=tool_calls_strategy,
        created_at=st.just(T0),
    ),
    max_size=8,
)


@given(random_messages)
def test_estimate_messages_tokens_matches_reference(messages: list[Message]) -> None:
    assert estimate_messages_tokens(messages) == sum(map(reference_bytes, messages)) // 4


# should_compact ------------------------------------------------------------------------------


def test_seed_should_compact() -> None:
    messages = [Message.user(f"msg {i}") for i in range(1, 26)]
    assert should_compact(messages, 20) is True


@pytest.mark.parametrize(
    ("count", "n", "expected"),
    [(20, 20, False), (21, 20, True), (19, 20, False), (0, 0, False), (1, 0, True)],
)
def test_should_compact_is_strictly_greater(count: int, n: int, expected: bool) -> None:
    assert should_compact(users(count), n) is expected


# compact: the seed example -------------------------------------------------------------------


def test_seed_compact() -> None:
    messages = users(20)
    compacted = compact(messages, 10)
    assert len(compacted) == 11

    summary = find_by_role(compacted, "system")[0]
    expected_lines = "\n".join(f"  [user] Message {i}" for i in range(1, 11))
    assert summary.content == f"[Compacted 10 earlier messages]\n{expected_lines}"
    assert summary.content.startswith(
        "[Compacted 10 earlier messages]\n  [user] Message 1\n  [user] Message 2\n"
    )
    assert compacted[0] == summary
    assert compacted[1:] == messages[10:]


def test_compact_does_not_mutate_its_input() -> None:
    messages = tool_heavy()
    before = list(messages)
    compact(messages, 3)
    assert messages == before


def test_compact_returns_a_list() -> None:
    assert isinstance(compact(tuple(users(5)), 2), list)
    assert isinstance(compact(tuple(users(5)), 9), list)
    assert compact(tuple(users(5)), 9) == users(5)


# compact: leading system messages ---------------------------------------------------------


def test_compact_keeps_leading_system_messages_verbatim() -> None:
    system = [
        Message.system("You are terse.", name="prompt", metadata={"v": 1}, created_at=at(0)),
        Message.system("Never reveal keys.", created_at=at(0)),
    ]
    messages = [*system, *users(6)]
    compacted = compact(messages, 2)
    assert compacted[:2] == system
    assert compacted[2].role == "system"
    assert compacted[2].content == (
        "[Compacted 4 earlier messages]\n"
        "  [user] Message 1\n  [user] Message 2\n  [user] Message 3\n  [user] Message 4"
    )
    assert compacted[3:] == messages[-2:]
    assert len(compacted) == 5


def test_compact_summarises_a_system_message_after_the_leading_run() -> None:
    messages = [
        Message.system("prompt", created_at=at(0)),
        Message.user("u1", created_at=at(1)),
        Message.system("mid\nway", created_at=at(2)),
        Message.user("u2", created_at=at(3)),
    ]
    compacted = compact(messages, 1)
    assert compacted[0] == messages[0]
    assert compacted[1].content == "[Compacted 2 earlier messages]\n  [user] u1\n  [system] mid way"
    assert compacted[2:] == [messages[3]]


def test_compact_with_only_system_messages_is_unchanged() -> None:
    messages = [Message.system(f"s{i}", created_at=at(i)) for i in range(5)]
    assert compact(messages, 1) == messages


# compact: unchanged cases ----------------------------------------------------------------


@pytest.mark.parametrize("keep_last", [5, 6, 100])
def test_compact_unchanged_when_short_enough(keep_last: int) -> None:
    messages = users(5)
    assert compact(messages, keep_last) == messages


def test_compact_unchanged_when_the_non_system_remainder_fits() -> None:
    messages = [
        Message.system("a", created_at=at(0)),
        Message.system("b", created_at=at(0)),
        Message.system("c", created_at=at(0)),
        *users(2),
    ]
    assert len(messages) > 2
    assert compact(messages, 2) == messages
    assert compact(messages, 3) == messages


def test_compact_changes_as_soon_as_the_remainder_does_not_fit() -> None:
    messages = [Message.system("a", created_at=at(0)), *users(3)]
    compacted = compact(messages, 2)
    assert compacted != messages
    assert compacted[1].content == "[Compacted 1 earlier messages]\n  [user] Message 1"


def test_compact_of_nothing() -> None:
    assert compact([], 1) == []


# compact: tool pairs are never split ---------------------------------------------------------


def test_compact_moves_parallel_tool_results_into_the_summary() -> None:
    messages = tool_heavy()
    # The last 9 messages start at the second of the three parallel results (index 4).
    compacted = compact(messages, 9)
    lead, summary, tail = split_result(compacted)
    assert lead == [messages[0]]
    assert tail == messages[6:]
    assert len(tail) == 8  # shorter than keep_last
    assert summary.content == (
        "[Compacted 5 earlier messages]\n"
        "  [user] Weather in Paris, Rome and Oslo?\n"
        "  [assistant] Checking.\n"
        '  [tool] <result for "get_weather" omitted from summary>\n'
        '  [tool] <result for "get_weather" omitted from summary>\n'
        '  [tool] <result for "get_weather" omitted from summary>'
    )


def test_compact_tail_of_only_tool_results_leaves_just_the_summary() -> None:
    messages = [
        Message.user("go", created_at=at(1)),
        Message.assistant(
            None, tool_calls=[ToolCall("a", "f", {}), ToolCall("b", "g", {})], created_at=at(2)
        ),
        Message.tool("a", "1", name="f", created_at=at(3)),
        Message.tool("b", "2", name="g", created_at=at(4)),
    ]
    compacted = compact(messages, 2)
    assert len(compacted) == 1
    assert compacted[0].content == (
        "[Compacted 4 earlier messages]\n"
        "  [user] go\n"
        "  [assistant] \n"
        '  [tool] <result for "f" omitted from summary>\n'
        '  [tool] <result for "g" omitted from summary>'
    )


def test_compact_never_splits_tool_pairs_for_any_keep_last() -> None:
    messages = tool_heavy()
    for keep_last in range(1, len(messages) + 1):
        compacted = compact(messages, keep_last)
        assert compacted == reference_compact(messages, keep_last), keep_last
        assert_tool_pairs_intact(compacted)
        if compacted == messages:
            continue
        lead, summary, tail = split_result(compacted)
        assert lead == [messages[0]]
        assert not tail or tail[0].role != "tool", keep_last
        assert len(tail) <= keep_last
        assert tail == messages[len(messages) - len(tail) :]
        replaced = len(messages) - 1 - len(tail)
        assert summary.text.startswith(f"[Compacted {replaced} earlier messages]\n")
        assert summary.text.count("\n") == replaced


def test_balance_tool_call_boundary() -> None:
    messages = tool_heavy()
    old, recent = balance_tool_call_boundary(messages[:4], messages[4:])
    assert old == messages[:6]
    assert recent == messages[6:]


def test_balance_tool_call_boundary_leaves_a_clean_split_alone() -> None:
    messages = tool_heavy()
    old, recent = balance_tool_call_boundary(messages[:6], messages[6:])
    assert old == messages[:6]
    assert recent == messages[6:]


def test_balance_tool_call_boundary_can_empty_recent() -> None:
    messages = tool_heavy()
    old, recent = balance_tool_call_boundary(messages[:4], messages[4:6])
    assert old == messages[:6]
    assert list(recent) == []


def test_balance_tool_call_boundary_does_not_mutate() -> None:
    messages = tool_heavy()
    old_in, recent_in = messages[:3], messages[3:]
    balance_tool_call_boundary(old_in, recent_in)
    assert old_in == messages[:3]
    assert recent_in == messages[3:]


@given(transcripts(), st.integers(1, 40))
def test_compact_matches_reference_and_keeps_tool_pairs(
    messages: list[Message], keep_last: int
) -> None:
    compacted = compact(messages, keep_last)
    assert compacted == reference_compact(messages, keep_last)
    assert_tool_pairs_intact(compacted)
    times = [message.created_at for message in compacted]
    assert times == sorted(times)
    if compacted != messages:
        lead, _summary, tail = split_result(compacted)
        assert all(message.role == "system" for message in lead)
        assert lead == messages[: len(lead)]
        assert not tail or tail[0].role != "tool"
        assert len(tail) <= keep_last


# compact: the summary -------------------------------------------------------------------------


def test_compact_summary_format() -> None:
    long_line = "x" * 100 + "\nsecond line"
    messages = [
        Message.user("Message 1", created_at=at(1)),
        Message.user(long_line, created_at=at(2)),
        Message.user("a" * 250, created_at=at(3)),
        Message.user("b" * 101, created_at=at(4)),
        Message.user("two\nlines\n", created_at=at(5)),
        Message.user("", created_at=at(6)),
        Message.assistant(
            None,
            tool_calls=[ToolCall("k1", "get_weather", {}), ToolCall("k2", "anon", {})],
            created_at=at(7),
        ),
        Message.tool("k1", "SECRET-API-KEY sk-123", name="get_weather", created_at=at(8)),
        Message.tool("k2", "user@example.com", created_at=at(9)),
        Message.assistant(
            [
                {"type": "text", "text": "parts "},
                {"type": "image_url", "url": "u"},
                {"type": "text", "text": "joined"},
            ],
            created_at=at(10),
        ),
        Message.user("kept", created_at=at(11)),
    ]
    compacted = compact(messages, 1)
    assert len(compacted) == 2
    summary = compacted[0]
    assert summary.role == "system"
    assert summary.content == "\n".join(
        [
            "[Compacted 10 earlier messages]",
            "  [user] Message 1",
            "  [user] " + "x" * 100 + " ",
            "  [user] " + "a" * 101,
            "  [user] " + "b" * 101,
            "  [user] two lines ",
            "  [user] ",
            "  [assistant] ",
            '  [tool] <result for "get_weather" omitted from summary>',
            '  [tool] <result for "unknown" omitted from summary>',
            "  [assistant] parts joined",
        ]
    )
    assert "SECRET" not in summary.text
    assert "example.com" not in summary.text
    assert compacted[1] == messages[-1]


def test_compact_summary_preview_counts_characters_not_bytes() -> None:
    messages = [Message.user("é" * 150, created_at=at(1)), Message.user("k", created_at=at(2))]
    summary = compact(messages, 1)[0]
    assert summary.content == "[Compacted 1 earlier messages]\n  [user] " + "é" * 101


def test_compact_summary_counts_old_after_balancing() -> None:
    messages = [
        Message.user("q", created_at=at(1)),
        Message.assistant(
            None, tool_calls=[ToolCall("a", "f", {}), ToolCall("b", "f", {})], created_at=at(2)
        ),
        Message.tool("a", "1", name="f", created_at=at(3)),
        Message.tool("b", "2", name="f", created_at=at(4)),
        Message.user("next", created_at=at(5)),
        Message.assistant("done", created_at=at(6)),
    ]
    # old = [q, call, a] before balancing; the tool result "b" heads the tail and joins them.
    compacted = compact(messages, 3)
    assert compacted[0].content.startswith("[Compacted 4 earlier messages]\n")
    assert compacted[1:] == messages[4:]


def test_compact_summary_is_dated_to_the_first_replaced_message() -> None:
    system = Message.system("prompt", created_at=at(0))
    first = Message.user("first", created_at=at(5))
    messages = [
        system,
        first,
        Message.user("second", created_at=at(6)),
        Message.user("third", created_at=at(7)),
    ]
    compacted = compact(messages, 1)
    assert compacted[1].created_at == first.created_at
    assert compacted[1].created_at.microsecond == first.created_at.microsecond
    times = [message.created_at for message in compacted]
    assert times == sorted(times)


def test_compact_summary_has_no_tool_fields() -> None:
    summary = compact(tool_heavy(), 2)[1]
    assert summary.role == "system"
    assert summary.tool_calls == ()
    assert summary.tool_call_id is None
    assert summary.is_system


# compact: keep_last validation ---------------------------------------------------------------


@pytest.mark.parametrize("keep_last", [0, -1, "3", True, 2.0, 1.5, None])
def test_compact_refuses_a_bad_keep_last_when_it_would_compact(keep_last: Any) -> None:
    with pytest.raises(ValueError, match="keep_last"):
        compact(users(20), keep_last)


@pytest.mark.parametrize("keep_last", [0, -1, "3", True, 2.0, None])
def test_compact_refuses_a_bad_keep_last_with_tool_calls(keep_last: Any) -> None:
    with pytest.raises(ValueError, match="keep_last"):
        compact(tool_heavy(), keep_last)


@pytest.mark.parametrize("keep_last", [0, "3", True, None])
def test_compact_does_not_check_keep_last_on_a_system_only_transcript(keep_last: Any) -> None:
    messages = [Message.system("a", created_at=at(0)), Message.system("b", created_at=at(1))]
    assert compact(messages, keep_last) == messages


def test_compact_does_not_check_keep_last_when_short_enough() -> None:
    assert compact([], 0) == []
    assert compact(users(3), 3.5) == users(3)  # type: ignore[arg-type]
    assert compact(users(3), 3.0) == users(3)  # type: ignore[arg-type]


# prune_tool_results ----------------------------------------------------------------------------


def tool(content: str, **fields: Any) -> Message:
    return Message.tool("call_1", content, created_at=at(1), **fields)


@pytest.mark.parametrize("length", [9, 10])
def test_prune_keeps_a_result_within_the_cap(length: int) -> None:
    message = tool("a" * length)
    pruned = prune_tool_results([message], 10)
    assert pruned[0] is message


def test_prune_elides_a_result_one_over_the_cap() -> None:
    # cap 10: H = 8, T = 2; "abcdefghijk" loses "i".
    pruned = prune_tool_results([tool("abcdefghijk")], 10)
    assert pruned[0].content == (
        "abcdefgh"
        "\n\n[... 1 bytes elided by transcript pruning; kept 8 leading and 2 trailing characters"
        " ...]\n\n"
        "jk"
    )


def test_prune_counts_removed_bytes_not_characters() -> None:
    # cap 10: H = 8, T = 2; 14 characters, the middle 4 are removed.
    content = "abcdefgh" + "é😀aé" + "yz"
    pruned = prune_tool_results([tool(content)], 10)
    assert pruned[0].content == (
        "abcdefgh"
        "\n\n[... 9 bytes elided by transcript pruning; kept 8 leading and 2 trailing characters"
        " ...]\n\n"
        "yz"
    )


def test_prune_multibyte_head_and_tail_are_characters() -> None:
    content = "é" * 8 + "😀" * 3 + "é" * 2  # 13 characters, cap 10: middle is 3 emoji
    pruned = prune_tool_results([tool(content)], 10)
    assert pruned[0].content == (
        "é" * 8 + "\n\n[... 12 bytes elided by transcript pruning; kept 8 leading and 2 trailing"
        " characters ...]\n\n" + "é" * 2
    )


def test_prune_boundary_with_multibyte_characters() -> None:
    at_cap = tool("😀" * 10)
    assert prune_tool_results([at_cap], 10)[0] is at_cap
    pruned = prune_tool_results([tool("é" * 11)], 10)[0]
    assert pruned.content == (
        "é" * 8 + "\n\n[... 2 bytes elided by transcript pruning; kept 8 leading and 2 trailing"
        " characters ...]\n\n" + "é" * 2
    )


@pytest.mark.parametrize(
    ("cap", "content", "expected"),
    [
        (
            1,
            "ab",
            "\n\n[... 2 bytes elided by transcript pruning; kept 0 leading and 0 trailing"
            " characters ...]\n\n",
        ),
        (
            2,
            "😀bc",
            "😀"
            "\n\n[... 2 bytes elided by transcript pruning; kept 1 leading and 0 trailing"
            " characters ...]\n\n",
        ),
        (
            3,
            "abcé",
            "ab"
            "\n\n[... 3 bytes elided by transcript pruning; kept 2 leading and 0 trailing"
            " characters ...]\n\n",
        ),
        (
            4,
            "abcdefg",
            "abc"
            "\n\n[... 4 bytes elided by transcript pruning; kept 3 leading and 0 trailing"
            " characters ...]\n\n",
        ),
        (
            5,
            "abcdef",
            "abcd"
            "\n\n[... 1 bytes elided by transcript pruning; kept 4 leading and 1 trailing"
            " characters ...]\n\n"
            "f",
        ),
    ],
)
def test_prune_small_caps(cap: int, content: str, expected: str) -> None:
    assert prune_tool_results([tool(content)], cap)[0].content == expected


def test_prune_default_cap_is_8192() -> None:
    at_cap = tool("a" * 8192)
    assert prune_tool_results([at_cap])[0] is at_cap
    content = "h" * 4096 + "m" * 3073 + "t" * 1024
    pruned = prune_tool_results([tool(content)])[0]
    assert pruned.content == (
        "h"
        * 4096
        + "\n\n[... 3073 bytes elided by transcript pruning; kept 4096 leading and 1024 trailing"
        " characters ...]\n\n" + "t" * 1024
    )


@pytest.mark.parametrize(
    ("cap", "head", "tail"),
    [(5000, 4000, 1000), (6000, 4096, 1024), (100_000, 4096, 1024), (9, 7, 1), (4, 3, 0)],
)
def test_prune_head_and_tail_sizes(cap: int, head: int, tail: int) -> None:
    content = "".join(chr(0x4E00 + i % 500) for i in range(cap + 7))
    pruned = prune_tool_results([tool(content)], cap)[0]
    removed = content[head : len(content) - tail]
    marker = (
        f"\n\n[... {len(removed.encode())} bytes elided by transcript pruning; "
        f"kept {head} leading and {tail} trailing characters ...]\n\n"
    )
    assert pruned.content == content[:head] + marker + content[len(content) - tail :]
    assert len(removed.encode()) == 3 * len(removed)  # D is bytes, not characters


def test_prune_keeps_every_other_field() -> None:
    message = Message.tool(
        "call_9",
        "z" * 50,
        name="get_weather",
        metadata={"ms": 5, "nested": {"a": [1]}},
        created_at=at(3),
    )
    pruned = prune_tool_results([message], 10)[0]
    assert pruned.content != message.content
    assert pruned.role == "tool"
    assert pruned.tool_call_id == "call_9"
    assert pruned.name == "get_weather"
    assert dict(pruned.metadata) == {"ms": 5, "nested": {"a": [1]}}
    assert pruned.created_at == message.created_at
    assert pruned.tool_calls == ()
    assert pruned.reasoning_content is None


def test_prune_returns_other_messages_as_the_same_objects() -> None:
    long = "w" * 100
    messages = [
        Message.system(long, created_at=at(0)),
        Message.user(long, created_at=at(1)),
        Message.assistant(long, tool_calls=[ToolCall("c", "f", {"x": long})], created_at=at(2)),
        Message.tool("c", long, name="f", created_at=at(3)),
        Message.tool("d", "short", created_at=at(4)),
        # A tool message whose content is a part list, not a string, is left alone.
        Message(
            role="tool",
            content=[{"type": "text", "text": long}],
            tool_call_id="e",
            created_at=at(5),
        ),
        Message(role="tool", content=None, created_at=at(6)),
        Message.user([{"type": "text", "text": long}], created_at=at(7)),
    ]
    pruned = prune_tool_results(messages, 10)
    assert len(pruned) == len(messages)
    for index in (0, 1, 2, 4, 5, 6, 7):
        assert pruned[index] is messages[index], index
    assert pruned[3] is not messages[3]
    assert pruned[3].text.startswith("wwwwwwww\n\n[... 90 bytes elided")


def test_prune_does_not_mutate_its_input() -> None:
    messages = [tool("q" * 40), Message.user("u", created_at=at(2))]
    before = list(messages)
    prune_tool_results(messages, 10)
    assert messages == before
    assert messages[0].content == "q" * 40


def test_prune_of_nothing() -> None:
    assert prune_tool_results([], 5) == []


@pytest.mark.parametrize("cap", [0, -1, 1.5, True, False, "10", None, 10.0])
def test_prune_refuses_a_bad_cap(cap: Any) -> None:
    with pytest.raises(ValueError, match="max_result_chars"):
        prune_tool_results([tool("x" * 20)], cap)
    with pytest.raises(ValueError, match="max_result_chars"):
        prune_tool_results([], cap)


tool_or_other = st.one_of(
    st.builds(
        lambda text, cid: Message.tool(cid, text, created_at=T0),
        st.text(st.characters(codec="utf-8"), max_size=60),
        st.text(max_size=3),
    ),
    st.builds(
        lambda role, text: Message(role=role, content=text, created_at=T0),
        st.sampled_from(["system", "user", "assistant"]),
        st.text(max_size=60),
    ),
)


@given(st.lists(tool_or_other, max_size=8), st.integers(1, 70))
def test_prune_matches_reference(messages: list[Message], cap: int) -> None:
    pruned = prune_tool_results(messages, cap)
    assert len(pruned) == len(messages)
    for before, after in zip(messages, pruned, strict=True):
        content = before.content
        if before.role == "tool" and isinstance(content, str) and len(content) > cap:
            assert after is not before
            assert after.content == reference_prune(content, cap)
            assert attrs.evolve(after, content=content) == before
        else:
            assert after is before


# maybe_compact ---------------------------------------------------------------------------------


def test_seed_maybe_compact_every() -> None:
    # messages = Nous.Transcript.maybe_compact(messages, every: 20, keep_last: 10)
    assert maybe_compact(users(20), every=20, keep_last=10) == users(20)
    compacted = maybe_compact(users(21), every=20, keep_last=10)
    assert len(compacted) == 11
    assert compacted == compact(users(21), 10)


def test_seed_maybe_compact_token_budget() -> None:
    # Compact at 80% of a 128k token budget: more than 102_400 estimated tokens.
    over = big(12, 34_200)  # 410_400 bytes: 102_600 tokens
    assert estimate_messages_tokens(over) == 102_600
    compacted = maybe_compact(over, token_budget=128_000, keep_last=10)
    assert len(compacted) == 11
    assert compacted == compact(over, 10)

    fits = big(12, 34_000)  # 408_000 bytes: 102_000 tokens
    assert estimate_messages_tokens(fits) == 102_000
    assert maybe_compact(fits, token_budget=128_000, keep_last=10) == fits


def test_seed_maybe_compact_both_triggers_custom_threshold() -> None:
    # every: 30, token_budget: 128_000, threshold: 0.75, keep_last: 10
    options: dict[str, Any] = {"every": 30, "token_budget": 128_000, "threshold": 0.75}
    assert maybe_compact(users(30), keep_last=10, **options) == users(30)
    assert len(maybe_compact(users(31), keep_last=10, **options)) == 11
    heavy = big(15, 26_000)  # 97_500 tokens: over 96_000, under 102_400; only 15 messages
    assert estimate_messages_tokens(heavy) == 97_500
    assert len(maybe_compact(heavy, keep_last=10, **options)) == 11
    assert maybe_compact(heavy, keep_last=10, every=30, token_budget=128_000) == heavy


class ChatSession:
    """The GenServer example: compact the run's messages on every completed turn."""

    def __init__(self) -> None:
        self.messages: list[Message] = []

    def handle_agent_complete(self, all_messages: list[Message]) -> None:
        self.messages = maybe_compact(all_messages, every=40, token_budget=128_000, keep_last=12)


def test_seed_chat_session() -> None:
    session = ChatSession()
    session.handle_agent_complete(users(40))
    assert session.messages == users(40)
    session.handle_agent_complete(users(41))
    assert len(session.messages) == 13
    assert session.messages[0].text.startswith("[Compacted 29 earlier messages]\n")
    assert session.messages[1:] == users(41)[-12:]


def test_maybe_compact_every_is_strict() -> None:
    assert maybe_compact(users(5), every=5, keep_last=1) == users(5)
    assert len(maybe_compact(users(6), every=5, keep_last=1)) == 2
    assert len(maybe_compact(users(1), every=0, keep_last=1)) == 1  # fires, but fits
    assert maybe_compact([], every=0, keep_last=1) == []


def test_maybe_compact_token_budget_is_strict() -> None:
    # 32 bytes = 8 tokens; 10 * 0.8 = 8.
    at_limit = [Message.user("a" * 16, created_at=at(1)), Message.user("b" * 16, created_at=at(2))]
    assert estimate_messages_tokens(at_limit) == 8
    assert maybe_compact(at_limit, token_budget=10, keep_last=1) == at_limit
    # 36 bytes = 9 tokens > 8.
    over = [Message.user("a" * 16, created_at=at(1)), Message.user("b" * 20, created_at=at(2))]
    assert estimate_messages_tokens(over) == 9
    assert maybe_compact(over, token_budget=10, keep_last=1) == compact(over, 1)
    assert len(maybe_compact(over, token_budget=10, keep_last=1)) == 2


def test_maybe_compact_threshold() -> None:
    over = [Message.user("a" * 16, created_at=at(1)), Message.user("b" * 20, created_at=at(2))]
    # 9 tokens: 16 * 0.5 = 8 fires, 18 * 0.5 = 9 does not, 9 * 1.0 = 9 does not.
    assert len(maybe_compact(over, token_budget=16, threshold=0.5, keep_last=1)) == 2
    assert maybe_compact(over, token_budget=18, threshold=0.5, keep_last=1) == over
    assert maybe_compact(over, token_budget=9, threshold=1.0, keep_last=1) == over
    assert len(maybe_compact(over, token_budget=8, threshold=1.0, keep_last=1)) == 2


def test_maybe_compact_counts_tool_calls_towards_the_budget() -> None:
    messages = [
        Message.user("hi", created_at=at(1)),
        Message.assistant(
            None, tool_calls=[ToolCall("c", "search", {"q": "x" * 60})], created_at=at(2)
        ),
        Message.tool("c", "r", name="search", created_at=at(3)),
        Message.assistant("ok", created_at=at(4)),
    ]
    assert estimate_messages_tokens(messages) > 16
    assert len(maybe_compact(messages, token_budget=20, keep_last=1)) == 2


def test_maybe_compact_triggers_are_ored() -> None:
    heavy = [Message.user("a" * 400, created_at=at(i)) for i in range(3)]  # 300 tokens
    # Only the token trigger fires.
    assert len(maybe_compact(heavy, every=100, token_budget=100, keep_last=1)) == 2
    # Only the count trigger fires.
    assert len(maybe_compact(heavy, every=2, token_budget=1_000_000, keep_last=1)) == 2
    # Neither fires.
    assert maybe_compact(heavy, every=3, token_budget=1_000_000, keep_last=1) == heavy


def test_maybe_compact_without_a_trigger_never_compacts() -> None:
    many = big(500, 100)
    assert maybe_compact(many, keep_last=1) == many


def test_maybe_compact_needs_keep_last() -> None:
    with pytest.raises(TypeError):
        maybe_compact(users(30), every=20)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        maybe_compact(users(3))  # type: ignore[call-arg]


@pytest.mark.parametrize("keep_last", [0, -1, "3", True, None, 2.5])
def test_maybe_compact_checks_keep_last_only_when_a_trigger_fires(keep_last: Any) -> None:
    messages = users(5)
    assert maybe_compact(messages, every=5, keep_last=keep_last) == messages
    assert maybe_compact(messages, keep_last=keep_last) == messages
    with pytest.raises(ValueError, match="keep_last"):
        maybe_compact(messages, every=4, keep_last=keep_last)
    with pytest.raises(ValueError, match="keep_last"):
        maybe_compact(messages, token_budget=0, keep_last=keep_last)


def test_maybe_compact_does_not_mutate_its_input() -> None:
    messages = tool_heavy()
    before = list(messages)
    maybe_compact(messages, every=3, keep_last=2)
    assert messages == before


@given(transcripts(), st.integers(0, 30), st.integers(1, 30))
def test_maybe_compact_every_matches_compact(
    messages: list[Message], every: int, keep_last: int
) -> None:
    result = maybe_compact(messages, every=every, keep_last=keep_last)
    expected = compact(messages, keep_last) if len(messages) > every else messages
    assert result == expected


# Async -------------------------------------------------------------------------------------


def make_callback(kind: str, received: list[Outcome]) -> Callback:
    if kind == "sync":

        def sync_callback(outcome: Outcome) -> None:
            received.append(outcome)

        return sync_callback

    async def async_callback(outcome: Outcome) -> None:
        await anyio.lowlevel.checkpoint()
        received.append(outcome)

    return async_callback


callback_kinds = pytest.mark.parametrize("kind", ["sync", "async"])


@pytest.mark.anyio
async def test_seed_compact_async() -> None:
    messages = users(20)
    compacted = await compact_async(messages, 10)
    assert compacted == compact(messages, 10)
    assert len(compacted) == 11


@pytest.mark.anyio
@pytest.mark.parametrize("keep_last", [1, 2, 3, 5, 8, 9, 12, 13, 14, 50])
async def test_compact_async_matches_compact(keep_last: int) -> None:
    messages = tool_heavy()
    assert await compact_async(messages, keep_last) == compact(messages, keep_last)
    assert await compact_async(tuple(messages), keep_last) == compact(messages, keep_last)


@pytest.mark.anyio
async def test_compact_async_unchanged() -> None:
    messages = users(4)
    assert await compact_async(messages, 4) == messages
    assert await compact_async([], 1) == []


@pytest.mark.anyio
@pytest.mark.parametrize("keep_last", [0, -1, "3", True])
async def test_compact_async_refuses_a_bad_keep_last(keep_last: Any) -> None:
    with pytest.raises(ValueError, match="keep_last"):
        await compact_async(users(20), keep_last)


@pytest.mark.anyio
@callback_kinds
async def test_seed_start_compaction(kind: str) -> None:
    # compact_async/3: a callback receives the compacted list.
    messages = users(20)
    received: list[Outcome] = []
    async with anyio.create_task_group() as tg:
        started = start_compaction(tg, messages, 10, make_callback(kind, received))
        assert started is None
    assert received == [Compacted(compact(messages, 10))]
    assert isinstance(received[0], Compacted)
    assert len(received[0].messages) == 11


@pytest.mark.anyio
@callback_kinds
async def test_start_compaction_reports_unchanged(kind: str) -> None:
    messages = users(5)
    received: list[Outcome] = []
    async with anyio.create_task_group() as tg:
        start_compaction(tg, messages, 5, make_callback(kind, received))
    assert received == [Unchanged(messages)]
    assert isinstance(received[0], Unchanged)
    assert received[0].messages == messages


@pytest.mark.anyio
@callback_kinds
async def test_start_compaction_keeps_tool_pairs(kind: str) -> None:
    messages = tool_heavy()
    received: list[Outcome] = []
    async with anyio.create_task_group() as tg:
        start_compaction(tg, messages, 9, make_callback(kind, received))
    assert received == [Compacted(compact(messages, 9))]
    assert_tool_pairs_intact(received[0].messages)


@pytest.mark.anyio
@callback_kinds
async def test_seed_maybe_compact_async(kind: str) -> None:
    # maybe_compact_async(messages, [every: 20, keep_last: 10], fn {:compacted, msgs} -> ...)
    transcript_compacted: list[list[Message]] = []
    unchanged: list[list[Message]] = []

    def on_outcome(outcome: Outcome) -> None:
        match outcome:
            case Compacted(messages=msgs):
                transcript_compacted.append(msgs)
            case Unchanged(messages=msgs):
                unchanged.append(msgs)

    async def on_outcome_async(outcome: Outcome) -> None:
        await anyio.lowlevel.checkpoint()
        on_outcome(outcome)

    callback: Callback = on_outcome if kind == "sync" else on_outcome_async

    async with anyio.create_task_group() as tg:
        assert maybe_compact_async(tg, users(21), callback, every=20, keep_last=10) is None
        maybe_compact_async(tg, users(20), callback, every=20, keep_last=10)
    assert transcript_compacted == [compact(users(21), 10)]
    assert unchanged == [users(20)]


@pytest.mark.anyio
@callback_kinds
async def test_maybe_compact_async_token_trigger(kind: str) -> None:
    over = [Message.user("a" * 16, created_at=at(1)), Message.user("b" * 20, created_at=at(2))]
    received: list[Outcome] = []
    async with anyio.create_task_group() as tg:
        maybe_compact_async(tg, over, make_callback(kind, received), token_budget=10, keep_last=1)
    assert received == [Compacted(maybe_compact(over, token_budget=10, keep_last=1))]


@pytest.mark.anyio
@callback_kinds
async def test_maybe_compact_async_without_trigger_is_unchanged(kind: str) -> None:
    messages = users(50)
    received: list[Outcome] = []
    async with anyio.create_task_group() as tg:
        maybe_compact_async(tg, messages, make_callback(kind, received), keep_last=1)
    assert received == [Unchanged(messages)]


@pytest.mark.anyio
@callback_kinds
async def test_maybe_compact_async_trigger_fires_but_fits(kind: str) -> None:
    messages = users(5)
    received: list[Outcome] = []
    async with anyio.create_task_group() as tg:
        maybe_compact_async(tg, messages, make_callback(kind, received), every=1, keep_last=10)
    assert received == [Unchanged(messages)]


@pytest.mark.anyio
async def test_many_compactions_in_one_task_group() -> None:
    received: list[Outcome] = []
    inputs = {count: users(count) for count in range(1, 15)}
    async with anyio.create_task_group() as tg:
        for messages in inputs.values():
            maybe_compact_async(tg, messages, received.append, every=6, keep_last=3)
    assert len(received) == len(inputs)
    expected = {
        len(messages): maybe_compact(messages, every=6, keep_last=3) for messages in inputs.values()
    }
    for outcome in received:
        original = next(m for m in inputs.values() if m[-1] == outcome.messages[-1])
        assert outcome.messages == expected[len(original)]
        assert isinstance(outcome, Compacted) == (len(original) > 6)


def _never_called(outcome: Outcome) -> None:
    raise AssertionError(f"callback called with {outcome!r}")


@pytest.mark.anyio
@pytest.mark.parametrize("keep_last", [0, -1, "3", True, 1.5, None])
async def test_start_compaction_refuses_a_bad_keep_last_in_the_caller(keep_last: Any) -> None:
    async with anyio.create_task_group() as tg:
        with pytest.raises(ValueError, match="keep_last"):
            start_compaction(tg, users(20), keep_last, _never_called)
        with pytest.raises(ValueError, match="keep_last"):
            start_compaction(tg, users(2), keep_last, _never_called)


@pytest.mark.anyio
async def test_start_compaction_missing_or_unknown_options() -> None:
    async with anyio.create_task_group() as tg:
        with pytest.raises(TypeError):
            start_compaction(tg, users(20), callback=_never_called)  # type: ignore[call-arg]
        with pytest.raises(TypeError):
            start_compaction(tg, users(20), 10, _never_called, every=5)  # type: ignore[call-arg]


@pytest.mark.anyio
@pytest.mark.parametrize(
    "options",
    [
        {},
        {"every": 20},
        {"token_budget": 100, "threshold": 0.5},
        {"every": 20, "keep": 10},
        {"every": 20, "keep_last": 10, "keep_lats": 10},
        {"keep_last": 10, "budget": 100},
    ],
    ids=["nothing", "no-keep-last", "no-keep-last-2", "typo", "extra", "unknown"],
)
async def test_maybe_compact_async_missing_or_unknown_options_raise_type_error(
    options: dict[str, Any],
) -> None:
    async with anyio.create_task_group() as tg:
        with pytest.raises(TypeError):
            maybe_compact_async(tg, users(30), _never_called, **options)


@pytest.mark.anyio
@pytest.mark.parametrize(
    "options",
    [
        {"every": 20, "keep_last": 0},
        {"every": 20, "keep_last": -1},
        {"every": 20, "keep_last": "3"},
        {"every": 20, "keep_last": True},
        {"every": 20, "keep_last": 2.5},
        {"keep_last": 0},
        {"every": "20", "keep_last": 10},
        {"token_budget": "lots", "keep_last": 10},
        {"token_budget": 100, "threshold": "high", "keep_last": 10},
    ],
)
async def test_maybe_compact_async_bad_values_raise_value_error(options: dict[str, Any]) -> None:
    async with anyio.create_task_group() as tg:
        with pytest.raises(ValueError):  # noqa: PT011 - the contract says only ValueError
            maybe_compact_async(tg, users(30), _never_called, **options)


# Outcome values ---------------------------------------------------------------------------------


def test_outcomes_are_frozen_values() -> None:
    messages = users(2)
    outcome = Compacted(messages)
    assert outcome.messages == messages
    assert Compacted(messages) == Compacted(users(2))
    assert Compacted(messages) != Unchanged(messages)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        outcome.messages = []  # type: ignore[misc]
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        Unchanged(messages).messages = []  # type: ignore[misc]


def test_outcomes_are_exported() -> None:
    assert nous_session.Compacted is Compacted
    assert nous_session.Unchanged is Unchanged


def test_summarize_writes_exactly_the_summary_lines_across_chunks() -> None:
    call = ToolCall("c1", "lookup", {"q": 1})
    kinds = [
        Message.user("short"),
        Message.user("x" * 300),
        Message.user("line one\nline two " * 20),
        Message.assistant(None, tool_calls=[call]),
        Message.tool("c1", "secret output", name="lookup"),
        Message.tool("c1", "no name"),
        Message.system("a system note"),
        Message.user([{"type": "text", "text": "part\none "}, {"type": "text", "text": "two"}]),
    ]
    for size in (1, 7, 199, 200, 201, 255, 256, 257, 1000):
        old = [kinds[i % len(kinds)] for i in range(size)]
        summary = summarize(old)
        if size <= 200:
            assert summary.text == summary_text([summary_line(m) for m in old])
            assert summary.metadata["compaction"] == {
                "messages": size,
                "summarizer": "structural",
                "lines_dropped": 0,
            }
        else:
            # The newest 200 lines, and a line saying how many older ones were dropped.
            lines = [summary_line(m) for m in old[-200:]]
            assert summary.text == "\n".join(
                [
                    f"[Compacted {size} earlier messages]",
                    f"  [... {size - 200} older lines not kept]",
                    *lines,
                ]
            )
            assert summary.metadata["compaction"]["lines_dropped"] == size - 200  # type: ignore[index]
