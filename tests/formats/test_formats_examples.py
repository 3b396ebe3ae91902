"""Recorded example payloads (tests/data/formats/*.json): exact round trips, what they read as,
and validity against the providers' own SDK request types.

The examples are written after the shapes the APIs return and take (ids, signatures, statuses,
annotations as the APIs give them), covering tool calls, tool errors, images, and thinking or
reasoning for each provider.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from nous_session import (
    ImagePart,
    Log,
    Message,
    ProviderPart,
    RedactedThinkingPart,
    Role,
    TextPart,
    ThinkingPart,
    ToolCall,
    ToolCallPart,
)
from nous_session.formats import PROVIDERS, convert, from_provider, to_provider
from nous_session.formats._common import same
from tests.support.message_strategies import T0
from tests.support.sdk_validation import validate

DATA = Path(__file__).parent.parent / "data" / "formats"
EXAMPLES = [
    pytest.param(provider, name, payload, id=f"{provider}-{name}")
    for provider in PROVIDERS
    for name, payload in json.loads((DATA / f"{provider}.json").read_text()).items()
]
# Keys that hold what the neutral fields carry: kept in provider_data, they would shadow it.
DERIVED = {"content", "parts", "tool_calls", "text", "input", "arguments", "output", "messages"}


def test_every_provider_has_examples() -> None:
    assert {param.values[0] for param in EXAMPLES} == set(PROVIDERS)


@pytest.mark.parametrize(("provider", "name", "payload"), EXAMPLES)
def test_an_example_round_trips_exactly(provider: Any, name: str, payload: Any) -> None:
    messages = from_provider(payload, provider, created_at=T0)
    assert same(to_provider(messages, provider), payload)
    assert from_provider(to_provider(messages, provider), provider, created_at=T0) == messages


@pytest.mark.parametrize(("provider", "name", "payload"), EXAMPLES)
def test_an_example_is_read_into_the_neutral_fields(provider: Any, name: str, payload: Any) -> None:
    for message in from_provider(payload, provider, created_at=T0):
        objects: list[Any] = [message, *message.tool_calls]
        if isinstance(message.content, tuple):
            objects.extend(message.content)
        for obj in objects:
            extras = getattr(obj, "provider_data", {}).get(provider, {})
            shadowing = {
                key for key, value in extras.items() if key in DERIVED and value is not None
            }
            assert not shadowing, (obj, shadowing)


@pytest.mark.parametrize(("provider", "name", "payload"), EXAMPLES)
def test_an_example_is_valid_for_its_sdk(provider: Any, name: str, payload: Any) -> None:
    validate(provider, payload)


@pytest.mark.parametrize(("provider", "name", "payload"), EXAMPLES)
@pytest.mark.parametrize("target", PROVIDERS)
def test_an_example_converts_to_every_provider_validly(
    provider: Any, name: str, payload: Any, target: Any
) -> None:
    messages = from_provider(payload, provider, created_at=T0)
    result = convert(messages, target)
    validate(target, result.payload)
    if target == provider:
        assert result.lossless
    # What another provider could not take is said; what it took reads back the same way.
    assert same(to_provider(from_provider(result.payload, target), target), result.payload)


@pytest.mark.parametrize(("provider", "name", "payload"), EXAMPLES)
def test_an_example_survives_the_log(provider: Any, name: str, payload: Any) -> None:
    messages = from_provider(payload, provider, created_at=T0)
    stored = Log.seed(messages).derive_messages()
    assert list(stored) == messages
    assert same(to_provider(stored, provider), payload)


def read(provider: str, name: str) -> list[Message]:
    payload = json.loads((DATA / f"{provider}.json").read_text())[name]
    return from_provider(payload, provider, created_at=T0)  # type: ignore[arg-type]


def test_what_the_anthropic_examples_read_as() -> None:
    messages = read("anthropic", "tool_use_and_results")
    assert [m.role for m in messages] == [
        Role.SYSTEM, Role.USER, Role.ASSISTANT, Role.TOOL, Role.TOOL,
        Role.ASSISTANT, Role.USER, Role.ASSISTANT, Role.TOOL, Role.USER,
    ]  # fmt: skip
    assert messages[2].content == "I'll look up both cities."
    assert [call.arguments for call in messages[2].tool_calls] == [
        {"city": "Paris", "unit": "celsius"},
        {"city": "Rome", "unit": "celsius"},
    ]
    assert messages[4].is_error is True
    assert messages[4].content == (TextPart("upstream weather service timed out"),)
    assert messages[8].content == "22°C, sunny"
    assert messages[9].text == "And should I bring an umbrella?"

    assistant = read("anthropic", "thinking_interleaved_with_tools")[1]
    assert [type(part) for part in assistant.content] == [  # type: ignore[union-attr]
        ThinkingPart,
        TextPart,
        ToolCallPart,
        TextPart,
    ]
    thinking = assistant.content[0]  # type: ignore[index]
    assert thinking.provider == "anthropic"  # type: ignore[union-attr]
    assert thinking.signature.startswith("EqQBCkYIBxgCKkDb")  # type: ignore[union-attr]
    redacted = read("anthropic", "thinking_interleaved_with_tools")[3].content[0]  # type: ignore[index]
    assert isinstance(redacted, RedactedThinkingPart)

    system, user, *_ = read("anthropic", "images_documents_and_cache_markers")
    assert system.content[1].provider_data == {  # type: ignore[index,union-attr]
        "anthropic": {"cache_control": {"type": "ephemeral", "ttl": "1h"}}
    }
    image, url_image, document, _ = user.content  # type: ignore[misc]
    assert image == ImagePart(data=image.data, media_type="image/png")
    assert url_image.url.endswith("ant.jpg")
    assert isinstance(document, ProviderPart)
    assert document.data["type"] == "document"


def test_what_the_openai_examples_read_as() -> None:
    chat = read("openai-chat", "parallel_tool_calls")
    assert chat[2].content is None
    assert chat[2].tool_calls[0] == ToolCall(
        "call_Lq2zWbm1dT4mNkXk8XDi7Qv0", "get_weather", '{"city":"Paris","unit":"celsius"}'
    )
    images = read("openai-chat", "developer_images_and_names")[1]
    assert images.name == "alice"
    assert images.content[1] == ImagePart(images.content[1].url, detail="high")  # type: ignore[index,union-attr]
    assert images.content[2].media_type == "image/png"  # type: ignore[index,union-attr]
    reasoning = read("openai-chat", "reasoning_content_and_legacy_function")
    assert reasoning[1].reasoning_content.startswith("Compare the decimals")  # type: ignore[union-attr]
    assert reasoning[4] == Message(Role.TOOL, "9.8", name="compare", created_at=T0)

    responses = read("openai-responses", "reasoning_and_function_calls")
    assert [m.role for m in responses] == [
        Role.DEVELOPER,
        Role.USER,
        Role.ASSISTANT,
        Role.TOOL,
        Role.TOOL,
        Role.ASSISTANT,
        Role.USER,
    ]
    turn = responses[2]
    (thinking,) = turn.content  # type: ignore[misc]
    assert thinking.id == "rs_68af2c3e9a6c8193a2b1f0d8e4c7b6a5"
    assert thinking.summary == (
        "**Planning the lookups**\n\nTwo cities, so two calls.",
        "Use celsius.",
    )
    assert thinking.signature.startswith("gAAAAAB")
    assert [(c.id, c.item_id, c.status) for c in turn.tool_calls] == [
        ("call_QqHgC3DDWmYFx7zAuvuR0hEl", "fc_68af2c41b7d48193b4e4c6e5f1a2b3c4", "completed"),
        ("call_1o3cRv4kKX0JwUk3mAQzZc7v", "fc_68af2c41c0e88193a7d1b2c3d4e5f6a7", "completed"),
    ]
    assert responses[5].text == "Paris is 18°C; Rome's lookup failed."
    tool = read("openai-responses", "images_and_structured_outputs")[2]
    assert tool.content[1] == ImagePart(  # type: ignore[index]
        data=tool.content[1].data,
        media_type="image/png",  # type: ignore[index,union-attr]
    )


def test_what_the_gemini_examples_read_as() -> None:
    system, user, model, paris, rome, final = read(
        "gemini", "parallel_function_calls_with_thought_signatures"
    )
    assert system == Message.system("You are a weather assistant.", created_at=T0)
    assert isinstance(model.content[0], ThinkingPart)  # type: ignore[index]
    assert model.tool_calls[0].provider_data["gemini"]["thoughtSignature"].startswith("Cpw")
    assert (paris.name, paris.content, paris.is_error) == ("get_weather", "18°C, clear", False)
    assert (rome.content, rome.is_error) == ("upstream timeout", True)
    assert final.content[0].provider_data == {
        "gemini": {"thoughtSignature": "Cs4BAdHtim9N3fL1kQ=="}
    }  # type: ignore[index,union-attr]

    user, model, measured, question, code = read("gemini", "images_ids_and_structured_results")
    assert [type(part) for part in user.content] == [TextPart, ImagePart, ImagePart, ProviderPart]  # type: ignore[union-attr]
    assert model.tool_calls == (ToolCall("fc-1a2b", "measure", {"object": "ant", "units": ["mm"]}),)
    assert measured.tool_call_id == "fc-1a2b"
    assert measured.content[0] == TextPart('{"length_mm":7.5,"confidence":0.9}')  # type: ignore[index]
    assert question.text == "Is that typical?"
    assert code.text == "It is 25% longer than average."
