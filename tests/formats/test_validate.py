"""``validate(messages, provider)``: what a provider's API would reject in a history, and
``to_provider(..., strict=True)`` refusing exactly that and real losses (not changes that lose
nothing, like a made-up call id)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from nous_session import (
    InvalidHistoryError,
    LossyConversionError,
    Message,
    TextPart,
    ThinkingPart,
    ToolCall,
)
from nous_session.errors import FormatError
from nous_session.formats import (
    PROVIDERS,
    HistoryProblem,
    convert,
    from_provider,
    to_provider,
    validate,
)
from tests.support.message_strategies import T0

DATA = Path(__file__).parent.parent / "data" / "formats"
WEATHER = ToolCall("call_1", "get_weather", {"city": "Paris"})


def reasons(messages: list[Message], provider: Any) -> list[str]:
    return [str(problem) for problem in validate(messages, provider)]


def readme_history() -> list[Message]:
    return [
        Message.user("Weather in Paris?", created_at=T0),
        Message.assistant(tool_calls=[WEATHER], created_at=T0),
        Message.tool("call_1", {"celsius": 18}, name="get_weather", created_at=T0),
        Message.assistant("18C in Paris.", created_at=T0),
    ]


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_valid_history_has_no_problems(provider: Any) -> None:
    assert validate(readme_history(), provider) == []
    assert convert(readme_history(), provider).problems == ()
    to_provider(readme_history(), provider, strict=True)


@pytest.mark.parametrize(
    ("provider", "name", "payload"),
    [
        pytest.param(provider, name, payload, id=f"{provider}-{name}")
        for provider in PROVIDERS
        for name, payload in json.loads((DATA / f"{provider}.json").read_text()).items()
    ],
)
def test_every_recorded_example_is_valid_for_its_provider(
    provider: Any, name: str, payload: Any
) -> None:
    # The recorded payloads are what the APIs take: none of them is a problem.
    assert validate(from_provider(payload, provider, created_at=T0), provider) == []


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_tool_result_with_no_call(provider: Any) -> None:
    messages = [Message.user("hi", created_at=T0), Message.tool("c9", "orphan", created_at=T0)]
    assert reasons(messages, provider) == [
        "message 1: a tool result for call 'c9', which no earlier assistant message made"
    ]
    with pytest.raises(InvalidHistoryError) as info:
        to_provider(messages, provider, strict=True)
    assert info.value.problems == (
        HistoryProblem(1, "a tool result for call 'c9', which no earlier assistant message made"),
    )
    assert "message 1: a tool result for call 'c9'" in str(info.value)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_call_with_no_result(provider: Any) -> None:
    messages = readme_history()[:2]
    where = "" if provider == "openai-responses" else " right after it"
    assert reasons(messages, provider) == [
        f"message 1: tool call 0 (get_weather, id 'call_1') of message 1 has no result{where}: "
        f"{provider} needs one"
    ]


@pytest.mark.parametrize("provider", ["openai-chat", "anthropic", "gemini"])
def test_a_result_after_another_message_is_not_right_after_its_call(provider: Any) -> None:
    history = readme_history()
    messages = [*history[:2], Message.user("and?", created_at=T0), *history[2:]]
    assert reasons(messages, provider) == [
        f"message 1: tool call 0 (get_weather, id 'call_1') of message 1 has no result right "
        f"after it: {provider} needs one",
        f"message 3: a result for call 'call_1' of message 1, not right after it: {provider} "
        "takes results only right after the message that made the call",
    ]


def test_the_responses_api_pairs_results_by_id_wherever_they_are() -> None:
    history = readme_history()
    messages = [*history[:2], Message.user("and?", created_at=T0), *history[2:]]
    assert validate(messages, "openai-responses") == []


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_second_result_for_one_call(provider: Any) -> None:
    history = readme_history()
    messages = [*history[:3], history[2], history[3]]
    assert reasons(messages, provider) == [
        "message 3: a second result for call 'call_1' (message 2 answered it)"
    ]


@pytest.mark.parametrize("provider", PROVIDERS)
def test_results_without_ids_pair_with_calls_without_ids(provider: Any) -> None:
    messages = [
        Message.assistant(tool_calls=[ToolCall("", "f", {}), ToolCall("", "g", {})], created_at=T0),
        Message.tool("", "for g", name="g", created_at=T0),
        Message.tool("", "for f", name="f", created_at=T0),
    ]
    assert validate(messages, provider) == []
    # The ids made up for other providers are a change, not a loss: strict lets them through.
    in_order = [messages[0], Message.tool("", "for f", created_at=T0), messages[1]]
    result = convert(in_order, provider)
    assert result.dropped == ()
    assert (result.changed != ()) is (provider != "gemini")
    assert to_provider(in_order, provider, strict=True) == result.payload
    unanswered = [*messages[:2], Message.tool("", "for h", name="h", created_at=T0)]
    assert reasons(unanswered, provider)[-1].startswith(
        "message 2: a tool result for 'h' with no call id, and no call"
    )


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("content", [None, "", (), (TextPart(""),)])
def test_an_empty_assistant_message(provider: Any, content: Any) -> None:
    messages = [Message.user("hi", created_at=T0), Message.assistant(content, created_at=T0)]
    assert reasons(messages, provider) == [
        f"message 1: an empty assistant message (no text, no tool calls): {provider} refuses it"
    ]


@pytest.mark.parametrize("provider", PROVIDERS)
def test_an_assistant_message_with_only_thinking_or_only_calls_is_not_empty(
    provider: Any,
) -> None:
    thinking = ThinkingPart("hm", signature="sig", provider="anthropic")
    messages = [Message.user("hi", created_at=T0), Message.assistant([thinking], created_at=T0)]
    assert validate(messages, provider) == []


@pytest.mark.parametrize("provider", ["anthropic", "gemini"])
def test_arguments_that_are_not_a_json_object(provider: Any) -> None:
    for arguments in ('{"city": ', "[1, 2]"):
        messages = [
            Message.assistant(tool_calls=[ToolCall("c1", "f", arguments)], created_at=T0),
            Message.tool("c1", "done", created_at=T0),
        ]
        assert reasons(messages, provider) == [
            f"message 0: the arguments of tool call 0 (f) are not a JSON object: {provider} "
            "needs one (they would be sent as {})"
        ]
        # Also a loss (sent as {}): strict says so first.
        with pytest.raises(LossyConversionError):
            to_provider(messages, provider, strict=True)


@pytest.mark.parametrize("provider", ["openai-chat", "openai-responses"])
def test_openai_takes_the_arguments_string_as_it_is(provider: Any) -> None:
    messages = [
        Message.assistant(tool_calls=[ToolCall("c1", "f", '{"city": ')], created_at=T0),
        Message.tool("c1", "done", created_at=T0),
    ]
    assert validate(messages, provider) == []


@pytest.mark.parametrize("provider", PROVIDERS)
def test_an_empty_user_message(provider: Any) -> None:
    messages = [Message.user("", created_at=T0)]
    expected = (
        ["message 0: an empty user message (no content): " + f"{provider} refuses it"]
        if provider in ("anthropic", "gemini")
        else []
    )
    assert reasons(messages, provider) == expected


def test_anthropic_refuses_empty_text_blocks_and_a_trailing_space_at_the_end() -> None:
    messages = [
        Message.user([TextPart("look"), TextPart(" ")], created_at=T0),
        Message.assistant("It is 18C. ", created_at=T0),
    ]
    assert reasons(messages, "anthropic") == [
        "message 0: text part 1 is empty or only whitespace: anthropic refuses such blocks",
        "message 1: the last assistant message ends with whitespace: anthropic refuses that",
    ]
    # Not at the end, the trailing space is fine; the others take both.
    assert reasons([*messages, Message.user("ok", created_at=T0)], "anthropic") == [
        "message 0: text part 1 is empty or only whitespace: anthropic refuses such blocks"
    ]
    for provider in ("openai-chat", "openai-responses", "gemini"):
        assert validate(messages, provider) == []


def test_an_openai_refusal_is_not_an_empty_message() -> None:
    payload = [
        {"role": "user", "content": "Who is speaking?"},
        {"role": "assistant", "content": None, "refusal": "I can't identify people."},
    ]
    messages = from_provider(payload, "openai-chat", created_at=T0)
    assert validate(messages, "openai-chat") == []
    assert reasons(messages, "anthropic") == [
        "message 1: an empty assistant message (no text, no tool calls): anthropic refuses it"
    ]


def test_a_chat_function_message_is_not_paired() -> None:
    # The deprecated function role (a tool message without a call id) pairs with no call id.
    messages = [Message.user("hi", created_at=T0), Message.tool(None, "r", name="f")]
    assert validate(messages, "openai-chat") == []


def test_validate_refuses_bad_arguments() -> None:
    with pytest.raises(FormatError, match="unknown provider 'nope'"):
        validate([], "nope")  # type: ignore[arg-type]
    with pytest.raises(FormatError, match=r"messages\[0\] is a str, not a Message"):
        validate(["hi"], "anthropic")  # type: ignore[list-item]


def test_strict_raises_on_losses_first_then_on_problems() -> None:
    thinking = ThinkingPart("hm", signature="sig", provider="anthropic")
    lossy = [Message.user("hi", created_at=T0), Message.assistant([thinking, TextPart("4")])]
    with pytest.raises(LossyConversionError):
        to_provider(lossy, "openai-chat", strict=True)
    invalid = [Message.user("hi", created_at=T0), Message.assistant("", created_at=T0)]
    assert convert(invalid, "openai-chat").lossless
    with pytest.raises(InvalidHistoryError) as info:
        to_provider(invalid, "openai-chat", strict=True)
    assert info.value.provider == "openai-chat"
    # Not strict: the payload, as before.
    assert to_provider(invalid, "openai-chat") == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": ""},
    ]
