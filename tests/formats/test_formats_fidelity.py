"""Every field of the canonical model either survives a conversion or is named in ``dropped``.

A table: for each provider, each role, and each message, tool-call and part field the model
has, a message with that field set is written in the provider's format and read back. Either
the field comes back as it was, or :attr:`Conversion.dropped` has a note (and ``strict=True``
raises), or, for a change that loses nothing (a made-up call id), :attr:`Conversion.changed`
has one. ``metadata`` and ``created_at`` are exempt: they are never sent, by design (a payload
has no place for either), as the formats' documentation says.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import attrs
import pytest

from nous_session import (
    ImagePart,
    LossyConversionError,
    Message,
    OtherPart,
    ProviderPart,
    RedactedThinkingPart,
    Role,
    TextPart,
    ThinkingPart,
    ToolCall,
    ToolCallPart,
)
from nous_session.formats import PROVIDERS, convert, from_provider, to_provider
from tests.support.message_strategies import T0

CALL = ToolCall("c1", "lookup", {"q": "x"})
PNG = "iVBORw0KGgo="


def base(role: Role) -> Message:
    """A plain message of ``role`` that every provider carries."""
    if role is Role.TOOL:
        return Message.tool("c1", "found", created_at=T0)
    return Message(role, "hello", created_at=T0)


def context(role: Role) -> list[Message]:
    """What comes before the message under test: a user turn, and the call a result answers."""
    before = [Message.user("start", created_at=T0)]
    if role is Role.TOOL:
        before.append(Message.assistant(None, tool_calls=[CALL], created_at=T0))
    return before


Change = Callable[[Message], Message]


def field(**changes: Any) -> Change:
    return lambda message: attrs.evolve(message, **changes)


def content(*parts: Any) -> Change:
    return lambda message: attrs.evolve(message, content=parts)


def call(**changes: Any) -> Change:
    return lambda message: attrs.evolve(message, tool_calls=[attrs.evolve(CALL, **changes)])


def thinking(provider: str | None, **extra: Any) -> Change:
    return content(
        ThinkingPart("mulling", signature="sig", provider=provider, **extra), TextPart("a")
    )


VARIANTS: dict[str, Change] = {
    "name": field(name="alice"),
    "reasoning_content": field(reasoning_content="because"),
    "tool_calls": field(tool_calls=[CALL]),
    "tool_call_id": field(tool_call_id="c7"),
    "is_error": field(is_error=True),
    "content None": field(content=None),
    "content empty": field(content=""),
    "call arguments string": call(arguments='{"q": "x"}'),
    "call arguments not an object": call(arguments="[1, 2]"),
    "call item_id": call(item_id="fc_1"),
    "call status": call(status="completed"),
    "call without id": call(id=""),
    "text part": content(TextPart("a"), TextPart("b")),
    "image url": content(TextPart("see"), ImagePart("https://example.com/a.png")),
    "image url detail": content(
        TextPart("see"), ImagePart("https://example.com/a.png", detail="high")
    ),
    "image data": content(TextPart("see"), ImagePart(data=PNG, media_type="image/png")),
    "image file_id": content(TextPart("see"), ImagePart(file_id="file_1")),
    "image url and media type": content(
        TextPart("see"), ImagePart("https://example.com/a.png", media_type="image/png")
    ),
    "thinking unsigned": content(ThinkingPart("mulling"), TextPart("a")),
    **{f"thinking of {p}": thinking(p) for p in PROVIDERS},
    "thinking with a summary": thinking("openai-responses", summary=["s"], id="rs_1"),
    "redacted thinking": content(RedactedThinkingPart("xyz", provider="anthropic"), TextPart("a")),
    "tool call reference first": lambda m: attrs.evolve(
        m, content=(ToolCallPart(0), TextPart("after")), tool_calls=[CALL]
    ),
    "other part": content(TextPart("a"), OtherPart({"type": "audio", "id": "au_1"})),
    **{
        f"{p} block": content(TextPart("a"), ProviderPart(p, {"type": "x", "v": 1}))
        for p in PROVIDERS
    },
    **{f"provider_data of {p}": field(provider_data={p: {"x_extra": 1}}) for p in PROVIDERS},
    **{f"call provider_data of {p}": call(provider_data={p: {"x_extra": 1}}) for p in PROVIDERS},
    **{
        f"text part provider_data of {p}": content(
            TextPart("a", provider_data={p: {"x_extra": 1}}), TextPart("b")
        )
        for p in PROVIDERS
    },
}

# Which variants exercise each field of the model; every field must be exercised (or exempt).
COVERAGE: dict[type, dict[str, str]] = {
    Message: {
        "role": "every role",
        "content": "content None",
        "reasoning_content": "reasoning_content",
        "tool_calls": "tool_calls",
        "tool_call_id": "tool_call_id",
        "name": "name",
        "metadata": "exempt: never sent",
        "created_at": "exempt: never sent",
        "is_error": "is_error",
        "provider_data": "provider_data of gemini",
    },
    ToolCall: {
        "id": "call without id",
        "name": "tool_calls",
        "arguments": "call arguments string",
        "item_id": "call item_id",
        "status": "call status",
        "provider_data": "call provider_data of gemini",
    },
    TextPart: {"text": "text part", "provider_data": "text part provider_data of gemini"},
    ImagePart: {
        "url": "image url",
        "data": "image data",
        "media_type": "image url and media type",
        "file_id": "image file_id",
        "detail": "image url detail",
        "provider_data": "exempt: as a text part's",
    },
    ThinkingPart: {
        "text": "thinking unsigned",
        "signature": "thinking of anthropic",
        "summary": "thinking with a summary",
        "id": "thinking with a summary",
        "provider": "thinking of gemini",
        "provider_data": "exempt: as a text part's",
    },
    RedactedThinkingPart: {
        "data": "redacted thinking",
        "provider": "redacted thinking",
        "provider_data": "exempt: as a text part's",
    },
    ToolCallPart: {"index": "tool call reference first"},
    ProviderPart: {"provider": "gemini block", "data": "gemini block"},
    OtherPart: {"data": "other part"},
}


def test_the_table_covers_every_field_of_the_model() -> None:
    # A field added to the model fails here until the table exercises it.
    for cls, fields in COVERAGE.items():
        assert set(fields) == {f.name for f in attrs.fields(cls)}, cls.__name__
        for variant in fields.values():
            assert variant in VARIANTS or variant.startswith(("exempt", "every")), variant


def part_view(part: Any, provider: str) -> Any:
    """A part as the model sees it: an image's ``"auto"`` detail is its default, a block kept
    as it came (OtherPart) reads back as the provider's own (ProviderPart), unattributed
    thinking reads back as the provider's, and the provider's own record of its exact form
    (``provider_data[provider]``) is bookkeeping."""
    if getattr(part, "provider_data", None):
        data = {k: v for k, v in part.provider_data.items() if k != provider}
        part = attrs.evolve(part, provider_data=data)
    if isinstance(part, ImagePart) and part.detail == "auto":
        part = attrs.evolve(part, detail=None)
    if isinstance(part, ThinkingPart) and part.provider is None:
        part = attrs.evolve(part, provider=provider)
    if isinstance(part, OtherPart | ProviderPart):
        return ("block", dict(part.data))
    return part


def view(message: Message, provider: str) -> dict[str, Any]:
    """What the model sees of a message, up to forms that mean the same: no content and
    empty content, text parts and their joined string, arguments as an object or its JSON.
    ``metadata`` and ``created_at`` are never sent."""
    content: Any = message.content
    if content is None:
        content = ""
    elif isinstance(content, tuple):
        if all(type(part) is TextPart and not part.provider_data for part in content):
            content = "".join(part.text for part in content)
        else:
            content = [part_view(part, provider) for part in content]
    calls = [
        (
            call.id,
            call.name,
            json.loads(call.arguments) if isinstance(call.arguments, str) else dict(call.arguments),
            call.item_id,
            call.status,
            call.provider_data,
        )
        for call in message.tool_calls
    ]
    fields = attrs.asdict(message, recurse=False)
    own = {k: v for k, v in message.provider_data.items() if k != provider}
    fields.update(content=content, tool_calls=calls, provider_data=own)
    del fields["metadata"], fields["created_at"]
    return fields


CASES = [(provider, role, name) for provider in PROVIDERS for role in Role for name in VARIANTS]


@pytest.mark.parametrize(("provider", "role", "variant"), CASES)
def test_every_field_round_trips_or_is_named_in_dropped(
    provider: Any, role: Role, variant: str
) -> None:
    try:
        message = VARIANTS[variant](base(role))
    except ValueError:
        pytest.skip("not a valid message")
    messages = [*context(role), message]
    result = convert(messages, provider)
    back = from_provider(result.payload, provider, created_at=T0)
    expected = list(messages)
    if (
        provider in ("gemini", "openai-chat", "anthropic")
        and message.role is Role.TOOL
        and message.name is None
        and message.tool_call_id == CALL.id
    ):
        # A tool result's name is its call's: Gemini's function responses carry it, and the
        # OpenAI Chat and Anthropic readers take it from the call (results go by id alone).
        expected[-1] = attrs.evolve(message, name=CALL.name)
    kept = len(back) == len(expected) and all(
        view(sent, provider) == view(read, provider)
        for sent, read in zip(expected, back, strict=True)
    )
    if kept:
        return
    assert result.dropped or result.changed, (
        f"{provider} lost {variant} of a {role} message without a note:\n"
        f"sent {messages[-1]!r}\nread {back[-1] if back else None!r}"
    )
    if result.dropped:
        with pytest.raises(LossyConversionError):
            to_provider(messages, provider, strict=True)
    elif not result.problems:  # changed to fit, nothing lost (a made-up call id): it passes
        assert to_provider(messages, provider, strict=True) == result.payload


@pytest.mark.parametrize("provider", ["anthropic", "openai-chat"])
def test_a_tool_results_name_is_named_in_dropped(provider: Any) -> None:
    # The newcomer's reproduction: the name went, and dropped was empty. A name other than its
    # call's is lost (results go by call id alone there); its call's own name is not.
    messages = [
        Message.assistant(None, tool_calls=[CALL], created_at=T0),
        Message.tool("c1", "found", name="another", created_at=T0),
    ]
    result = convert(messages, provider)
    assert result.dropped == (
        "the name 'another' of message 1 dropped: " + f"{provider} has no place for it",
    )
    with pytest.raises(LossyConversionError):
        to_provider(messages, provider, strict=True)


@pytest.mark.parametrize("provider", ["anthropic", "openai-chat", "gemini", "openai-responses"])
def test_the_readmes_tool_example_converts_strictly_and_comes_back(provider: Any) -> None:
    """``to_provider(messages, provider, strict=True)`` failed on the README's own tool example
    (its tool result names its call's function), so strict mode could not be used."""
    messages = [
        Message.user("Weather in Paris?", created_at=T0),
        Message.assistant(
            tool_calls=[ToolCall("call_1", "get_weather", {"city": "Paris"})], created_at=T0
        ),
        Message.tool("call_1", {"celsius": 18}, name="get_weather", created_at=T0),
        Message.assistant("18C in Paris.", created_at=T0),
    ]
    payload = to_provider(messages, provider, strict=True)
    back = from_provider(payload, provider, created_at=T0)
    assert [m.name for m in back] == [None, None, "get_weather", None]
