"""Typed content parts, the new Message and ToolCall fields, and how they are stored.

The storage contract: every message survives ``message_event`` -> ``make_event`` ->
``to_message`` (and the record codec) unchanged, and the events earlier versions wrote (plain
part objects, flat and nested tool calls) still project to the messages they did.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from nous_session import (
    EventType,
    ImagePart,
    InvalidEventError,
    Log,
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
from nous_session._json import dumps as json_dumps
from nous_session._json import loads as json_loads
from nous_session.codec import decode, encode
from nous_session.event import make_event, message_event, to_message
from nous_session.parts import as_part, stored_part
from tests.support.message_strategies import T0, json_objects, json_values, messages, parts, texts

# Parts ----------------------------------------------------------------------------------------


def test_text_part_is_a_mapping_of_its_json() -> None:
    part = TextPart("hi")
    assert isinstance(part, Mapping)
    assert part["type"] == "text"
    assert part.get("text") == "hi"
    assert dict(part) == {"type": "text", "text": "hi"}
    assert part == {"type": "text", "text": "hi"}
    assert part.to_json() == {"type": "text", "text": "hi"}
    assert len(part) == 2
    assert "provider_data" not in part


def test_parts_are_frozen() -> None:
    part = TextPart("hi")
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        part.text = "changed"  # type: ignore[misc]


def test_provider_data_is_copied_and_read_only() -> None:
    given_data: dict[str, Any] = {"anthropic": {"cache_control": {"type": "ephemeral"}}}
    part = TextPart("x", provider_data=given_data)
    given_data["anthropic"]["cache_control"]["type"] = "changed"
    given_data["gemini"] = {}
    assert part.provider_data == {"anthropic": {"cache_control": {"type": "ephemeral"}}}
    with pytest.raises(TypeError):
        part.provider_data["gemini"] = {}  # type: ignore[index]
    with pytest.raises(TypeError):
        part.provider_data["anthropic"]["x"] = 1  # type: ignore[index]
    assert part.to_json() == {
        "type": "text",
        "text": "x",
        "provider_data": {"anthropic": {"cache_control": {"type": "ephemeral"}}},
    }


@pytest.mark.parametrize(
    ("value", "match"),
    [
        ("not a mapping", "provider_data"),
        ({1: {}}, "provider name"),
        ({"anthropic": "x"}, "must be a mapping"),
        ({"anthropic": {"a": object()}}, "not JSON"),
    ],
)
def test_bad_provider_data_is_refused(value: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        TextPart("x", provider_data=value)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("build", "match"),
    [
        (lambda: ImagePart(), "exactly one"),
        (lambda: ImagePart("u", file_id="f"), "exactly one"),
        (lambda: ImagePart(data="AAAA"), "media_type"),
        (lambda: ImagePart(5), "url"),  # type: ignore[arg-type]
        (lambda: TextPart(None), "text"),  # type: ignore[arg-type]
        (lambda: ThinkingPart(summary="one"), "summary"),
        (lambda: ThinkingPart(summary=["a", 1]), "summary"),
        (lambda: RedactedThinkingPart(None), "data"),  # type: ignore[arg-type]
        (lambda: ToolCallPart(-1), "index"),
        (lambda: ToolCallPart(True), "index"),
        (lambda: ProviderPart("anthropic", "x"), "data"),  # type: ignore[arg-type]
        (lambda: OtherPart({"text": "x"}), "type"),
        (lambda: OtherPart({"type": "text"}), "text"),
        (lambda: OtherPart({"type": "text", "text": "x"}), "TextPart|use that"),
        (lambda: OtherPart({"type": "tool_call", "index": 1}), "use that"),
    ],
)
def test_bad_parts_are_refused(build: Any, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        build()


def test_every_part_kind_stores_its_fields() -> None:
    assert ImagePart(data="QUJD", media_type="image/png", detail="low").to_json() == {
        "type": "image",
        "data": "QUJD",
        "media_type": "image/png",
        "detail": "low",
    }
    assert ThinkingPart("t", signature="s", summary=["a"], id="rs_1", provider="x").to_json() == {
        "type": "thinking",
        "text": "t",
        "signature": "s",
        "summary": ["a"],
        "id": "rs_1",
        "provider": "x",
    }
    assert ThinkingPart().to_json() == {"type": "thinking", "text": ""}
    assert RedactedThinkingPart("opaque", provider="anthropic").to_json() == {
        "type": "redacted_thinking",
        "data": "opaque",
        "provider": "anthropic",
    }
    assert ToolCallPart(2).to_json() == {"type": "tool_call", "index": 2}
    assert ProviderPart("anthropic", {"type": "document"}).to_json() == {
        "type": "provider",
        "provider": "anthropic",
        "data": {"type": "document"},
    }


@pytest.mark.parametrize(
    ("mapping", "kind"),
    [
        ({"type": "text", "text": "hi"}, TextPart),
        ({"type": "text", "text": "hi", "provider_data": {"x": {"a": 1}}}, TextPart),
        ({"type": "image", "url": "u"}, ImagePart),
        ({"type": "thinking", "text": ""}, ThinkingPart),
        ({"type": "tool_call", "index": 0}, ToolCallPart),
        ({"type": "provider", "provider": "p", "data": {}}, ProviderPart),
        ({"type": "redacted_thinking", "data": "d"}, RedactedThinkingPart),
        # Anything that is not exactly a typed part's form stays as given.
        ({"type": "text", "text": "hi", "cache_control": {}}, OtherPart),
        ({"type": "text", "text": "hi", "provider_data": {}}, OtherPart),
        ({"type": "text", "text": "hi", "provider_data": {"x": 1}}, OtherPart),
        ({"type": "image_url", "url": "u"}, OtherPart),
        ({"type": "image", "url": "u", "data": "d"}, OtherPart),
        ({"type": "image", "url": None}, OtherPart),
        ({"type": "image", "data": "d"}, OtherPart),
        ({"type": "thinking"}, OtherPart),
        ({"type": "thinking", "text": "", "summary": "s"}, OtherPart),
        ({"type": "tool_call", "index": True}, OtherPart),
        ({"type": "tool_call", "index": -1}, OtherPart),
        ({"type": "provider", "provider": "p", "data": []}, OtherPart),
    ],
)
def test_as_part_reads_exact_forms_only(mapping: dict[str, Any], kind: type) -> None:
    part = as_part(mapping)
    assert type(part) is kind
    assert part.to_json() == mapping
    assert part == mapping


def test_a_text_part_with_extra_keys_still_counts_as_text() -> None:
    message = Message.user([{"type": "text", "text": "a", "cache_control": {}}, TextPart("b")])
    assert type(message.content[0]) is OtherPart  # type: ignore[index]
    assert message.text == "ab"


def test_thinking_is_not_text() -> None:
    message = Message.assistant([ThinkingPart("hmm"), TextPart("answer")])
    assert message.text == "answer"


@given(parts)
def test_every_part_reads_back_from_its_json(part: Any) -> None:
    stored = json_loads(json_dumps(part.to_json()))
    assert stored_part(stored) == part
    assert type(stored_part(stored)) is type(part)
    assert as_part(stored) == part


@given(
    json_objects.map(lambda extra: {**extra, "type": "x"})
    | st.builds(
        lambda kind, extra: {**extra, "type": kind},
        st.sampled_from(
            ["text", "image", "thinking", "redacted_thinking", "tool_call", "provider"]
        ),
        st.dictionaries(
            st.sampled_from(
                [
                    "text",
                    "url",
                    "data",
                    "index",
                    "provider",
                    "summary",
                    "media_type",
                    "provider_data",
                    "signature",
                ]
            ),
            json_values,
            max_size=3,
        ),
    )
)
def test_any_stored_part_object_is_kept_exactly(data: dict[str, Any]) -> None:
    if data["type"] == "text" and not isinstance(data.get("text"), str):
        return  # refused on append (a text part needs its text)
    part = stored_part(data)
    assert part.to_json() == data
    assert dict(part) == data


# Message and ToolCall fields -------------------------------------------------------------


def test_new_message_fields_default() -> None:
    message = Message.user("hi")
    assert message.is_error is False
    assert dict(message.provider_data) == {}
    assert message.to_json() == {"content": "hi"}


def test_developer_role_and_builder() -> None:
    message = Message.developer("be brief", created_at=T0)
    assert message.role is Role.DEVELOPER == "developer"
    assert message_event(message) == (EventType.DEVELOPER_MESSAGE, {"content": "be brief"})
    log = Log.seed([message])
    assert log.derive_messages()[0] == message


def test_tool_result_error_flag_and_parts() -> None:
    result = [TextPart("see"), ImagePart(data="QUJD", media_type="image/png")]
    message = Message.tool("call_1", result, name="shot", is_error=True, created_at=T0)
    assert message.content == tuple(result)
    assert message.is_error is True
    assert message.to_json() == {
        "content": [
            {"type": "text", "text": "see"},
            {"type": "image", "data": "QUJD", "media_type": "image/png"},
        ],
        "tool_call_id": "call_1",
        "name": "shot",
        "is_error": True,
    }
    # A list of plain JSON values is still a JSON result.
    assert Message.tool("c", [{"type": "text", "text": "x"}]).content == (
        '[{"type":"text","text":"x"}]'
    )


def test_is_error_must_be_a_bool() -> None:
    with pytest.raises(ValueError, match="is_error"):
        Message(role="tool", is_error=1)  # type: ignore[arg-type]


def test_message_provider_data_is_validated() -> None:
    with pytest.raises(ValueError, match="provider_data"):
        Message(role="user", provider_data={"anthropic": 3})  # type: ignore[dict-item]


def test_tool_call_new_fields() -> None:
    call = ToolCall(
        "call_1",
        "f",
        '{"a":1}',
        item_id="fc_1",
        status="completed",
        provider_data={"openai-responses": {"namespace": "ns"}},
    )
    assert call.to_json() == {
        "id": "call_1",
        "name": "f",
        "arguments": '{"a":1}',
        "item_id": "fc_1",
        "status": "completed",
        "provider_data": {"openai-responses": {"namespace": "ns"}},
    }
    assert ToolCall.coerce(call.to_json()) == call
    assert ToolCall("c", "f").to_json() == {"id": "c", "name": "f", "arguments": {}}
    with pytest.raises(ValueError, match="status"):
        ToolCall("c", "f", status=1)  # type: ignore[arg-type]


# Storage --------------------------------------------------------------------------------------


def _stored(message: Message, seq: int = 3) -> Message:
    kind, data = message_event(message)
    return to_message(make_event(seq, kind, data, message.created_at))


@given(messages)
def test_every_message_survives_its_event(message: Message) -> None:
    assert _stored(message) == message


@given(messages)
def test_every_message_survives_the_record_codec(message: Message) -> None:
    kind, data = message_event(message)
    event = make_event(3, kind, data, message.created_at)
    assert to_message(decode(encode(event))) == message


@given(messages)
def test_event_data_is_plain_json(message: Message) -> None:
    _, data = message_event(message)
    assert json_loads(json_dumps(data)) == data


def test_the_plain_string_projection_is_the_same_message() -> None:
    message = Message.user("hi", created_at=T0)
    assert _stored(message) == message
    assert type(_stored(message).provider_data) is type(message.provider_data)


def test_events_of_earlier_versions_project_as_before() -> None:
    data = {
        "content": [
            {"type": "text", "text": "look at "},
            {"type": "image_url", "url": "https://example.com/cat.png"},
            {"type": "text", "text": "this", "cache_control": {"type": "ephemeral"}},
        ],
        "tool_calls": [
            {"id": "a", "name": "one", "arguments": {"x": 1}},
            {"id": "b", "type": "function", "function": {"name": "two", "arguments": "{}"}},
        ],
        "reasoning_content": "because",
        "source": "model",
    }
    message = to_message(make_event(1, "assistant_message", data, T0))
    assert message == Message(
        Role.ASSISTANT,
        data["content"],
        reasoning_content="because",
        tool_calls=data["tool_calls"],
        created_at=T0,
    )
    assert [dict(part) for part in message.content] == data["content"]  # type: ignore[union-attr]
    assert message.text == "look at this"
    assert message.tool_calls == (ToolCall("a", "one", {"x": 1}), ToolCall("b", "two", "{}"))


def test_a_stored_call_keeps_its_item_fields_without_arguments() -> None:
    data = {"tool_calls": [{"id": "c", "name": "f", "item_id": "fc_1"}]}
    message = to_message(make_event(1, "assistant_message", data, T0))
    assert message.tool_calls == (ToolCall("c", "f", item_id="fc_1"),)
    assert message == Message(Role.ASSISTANT, tool_calls=data["tool_calls"], created_at=T0)


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ({"is_error": "yes"}, "is_error"),
        ({"provider_data": []}, "provider_data"),
        ({"provider_data": {"anthropic": 1}}, "provider_data"),
        ({"tool_calls": [{"id": "c", "name": "f", "item_id": 3}]}, "item_id"),
        ({"tool_calls": [{"id": "c", "name": "f", "provider_data": {"x": []}}]}, "provider_data"),
    ],
)
def test_malformed_new_fields_are_refused_on_append(data: dict[str, Any], match: str) -> None:
    with pytest.raises(InvalidEventError, match=match):
        Log().append("tool_result", data)


@given(texts)
def test_the_hot_path_projects_a_string(text: str) -> None:
    event = make_event(0, "user_message", {"content": text}, T0)
    assert to_message(event) == Message.user(text, created_at=T0)
