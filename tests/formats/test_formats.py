"""nous_session.formats: the API, bad input, and the structural cases of each provider.

Exactness over many generated messages and payloads is in test_formats_properties.py; the
recorded examples and the SDK validation are in test_formats_examples.py.
"""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from nous_session import (
    Conversion,
    FormatError,
    ImagePart,
    Log,
    LossyConversionError,
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
from tests.support.message_strategies import T0

WEATHER = ToolCall("call_1", "get_weather", {"city": "Paris"})


def conversation() -> list[Message]:
    return [
        Message.system("Be brief.", created_at=T0),
        Message.user("Weather in Paris?", created_at=T0),
        Message.assistant("Checking.", tool_calls=[WEATHER], created_at=T0),
        Message.tool("call_1", "18C", name="get_weather", created_at=T0),
        Message.assistant("It is 18C.", created_at=T0),
    ]


# The API --------------------------------------------------------------------------------------


def test_providers() -> None:
    assert PROVIDERS == ("openai-chat", "openai-responses", "anthropic", "gemini")


@pytest.mark.parametrize("provider", ["openai", "claude", "", None, 3])
def test_an_unknown_provider_is_refused(provider: Any) -> None:
    for call in (
        lambda: to_provider([], provider),
        lambda: convert([], provider),
        lambda: from_provider([], provider),
    ):
        with pytest.raises(FormatError, match="unknown provider") as info:
            call()
        assert isinstance(info.value, ValueError)
        assert "openai-chat" in str(info.value)


@pytest.mark.parametrize("messages", [Message.user("hi"), ["hi"], [Message.user("a"), {"a": 1}], 5])
def test_messages_must_be_messages(messages: Any) -> None:
    with pytest.raises(FormatError, match="Message"):
        to_provider(messages, "openai-chat")


def test_the_simple_conversation_in_every_format() -> None:
    messages = conversation()
    assert to_provider(messages, "openai-chat") == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
        {"role": "assistant", "content": "It is 18C."},
    ]
    assert to_provider(messages, "openai-responses") == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "Checking."},
        {
            "type": "function_call",
            "call_id": "call_1",
            "name": "get_weather",
            "arguments": '{"city":"Paris"}',
        },
        {
            "type": "function_call_output",
            "call_id": "call_1",
            "output": "18C",
            "name": "get_weather",
        },
        {"role": "assistant", "content": "It is 18C."},
    ]
    assert to_provider(messages, "anthropic") == {
        "system": "Be brief.",
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Checking."},
                    {
                        "type": "tool_use",
                        "id": "call_1",
                        "name": "get_weather",
                        "input": {"city": "Paris"},
                    },
                ],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "call_1", "content": "18C"}],
            },
            {"role": "assistant", "content": "It is 18C."},
        ],
    }
    assert to_provider(messages, "gemini") == {
        "system_instruction": {"parts": [{"text": "Be brief."}]},
        "contents": [
            {"role": "user", "parts": [{"text": "Weather in Paris?"}]},
            {
                "role": "model",
                "parts": [
                    {"text": "Checking."},
                    {
                        "functionCall": {
                            "name": "get_weather",
                            "args": {"city": "Paris"},
                            "id": "call_1",
                        }
                    },
                ],
            },
            {
                "role": "user",
                "parts": [
                    {
                        "functionResponse": {
                            "name": "get_weather",
                            "response": {"output": "18C"},
                            "id": "call_1",
                        }
                    }
                ],
            },
            {"role": "model", "parts": [{"text": "It is 18C."}]},
        ],
    }


@pytest.mark.parametrize("provider", PROVIDERS)
def test_the_simple_conversation_comes_back_equal(provider: Any) -> None:
    messages = conversation()
    # A tool result's name is its call's: where results go by call id alone (OpenAI Chat,
    # Anthropic), the reader takes the name back from the call.
    if provider.startswith("openai"):  # OpenAI's arguments are a JSON string
        call = ToolCall("call_1", "get_weather", '{"city":"Paris"}')
        messages[2] = Message.assistant("Checking.", tool_calls=[call], created_at=T0)
    result = convert(messages, provider)
    assert isinstance(result, Conversion)
    assert result.lossless
    assert result.dropped == ()
    assert from_provider(result.payload, provider, created_at=T0) == messages


def test_created_at() -> None:
    before = datetime.now(UTC)
    (message,) = from_provider([{"role": "user", "content": "hi"}], "openai-chat")
    assert before <= message.created_at <= datetime.now(UTC)
    plus_two = timezone(timedelta(hours=2))
    (message,) = from_provider(
        [{"role": "user", "content": "hi"}], "openai-chat", created_at=T0.astimezone(plus_two)
    )
    assert message.created_at == T0
    assert message.created_at.tzinfo is UTC
    with pytest.raises(ValueError, match="timezone-aware"):
        from_provider([], "openai-chat", created_at=datetime(2026, 1, 1))


def test_strict_raises_with_what_would_be_lost() -> None:
    thinking = Message.assistant(
        [ThinkingPart("hmm", signature="sig", provider="anthropic"), TextPart("ok")],
        created_at=T0,
    )
    assert to_provider([thinking], "anthropic", strict=True) == {
        "messages": [
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "hmm", "signature": "sig"},
                    {"type": "text", "text": "ok"},
                ],
            }
        ]
    }
    with pytest.raises(LossyConversionError) as info:
        to_provider([thinking], "openai-chat", strict=True)
    assert info.value.dropped == (
        "thinking (part 0) of message 0 dropped: openai-chat has no place for it",
    )
    assert info.value.provider == "openai-chat"
    assert "would lose 1 item" in str(info.value)
    assert isinstance(info.value, FormatError)
    # Without strict, the same conversion drops it and says so.
    result = convert([thinking], "openai-chat")
    assert result.payload == [{"role": "assistant", "content": [{"type": "text", "text": "ok"}]}]
    assert not result.lossless


def test_the_payload_is_the_callers_and_the_input_is_never_changed() -> None:
    messages = [Message.user([TextPart("x", provider_data={"anthropic": {"cache_control": {}}})])]
    payload = to_provider(messages, "anthropic")
    payload["messages"][0]["content"][0]["cache_control"]["type"] = "changed"  # type: ignore[index,call-overload]
    assert messages[0].content[0].provider_data["anthropic"]["cache_control"] == {}  # type: ignore[index,union-attr]
    given = {"messages": [{"role": "user", "content": [{"type": "text", "text": "x", "z": [1]}]}]}
    kept = copy.deepcopy(given)
    read = from_provider(given, "anthropic")
    assert given == kept
    given["messages"][0]["content"][0]["z"].append(2)  # type: ignore[index]
    assert to_provider(read, "anthropic") == kept


@pytest.mark.parametrize("provider", PROVIDERS)
def test_read_messages_survive_the_log(provider: Any) -> None:
    messages = from_provider(to_provider(conversation(), provider), provider, created_at=T0)
    assert Log.seed(messages).derive_messages() == messages


# Bad payloads ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("provider", "payload", "match"),
    [
        ("openai-chat", {"role": "user"}, "must be a list"),
        ("openai-chat", ["hi"], r"\[0\]: a message must be an object, not str"),
        ("openai-chat", [{"content": "x"}], r'\[0\]: needs a str "role"'),
        ("openai-chat", [{"role": "robot", "content": "x"}], "unknown role 'robot'"),
        ("openai-chat", [{"role": "tool", "content": "x"}], 'needs a str "tool_call_id"'),
        ("openai-chat", [{"role": "assistant", "tool_calls": {}}], "tool_calls must be a list"),
        ("openai-chat", [{"role": "assistant", "tool_calls": [{"id": "c"}]}], 'a dict "function"'),
        (
            "openai-chat",
            [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}],
            r'\[0\]\["content"\]\[0\]\["image_url"\]: needs a str "url"',
        ),
        ("openai-chat", [{"role": "user", "content": {1, 2}}], "set is not JSON"),
        ("openai-responses", {"role": "user"}, "must be a list"),
        ("openai-responses", [{"content": "x"}], 'needs a string "type" or a "role"'),
        ("openai-responses", [{"role": "robot", "content": "x"}], "unknown role"),
        (
            "openai-responses",
            [{"type": "function_call", "name": "f", "arguments": "{}"}],
            "call_id",
        ),
        ("openai-responses", [{"type": "reasoning", "id": "rs_1"}], 'needs a list "summary"'),
        ("openai-responses", [{"type": "function_call_output", "call_id": "c"}], '"output"'),
        ("anthropic", [], "must be an object"),
        ("anthropic", {"model": "claude", "messages": []}, r"unexpected key\(s\) \['model'\]"),
        ("anthropic", {"system": "x"}, 'needs "messages"'),
        ("anthropic", {"messages": [{"role": "user"}]}, r'messages\[0\]: needs "content"'),
        ("anthropic", {"messages": [{"role": "tool", "content": "x"}]}, "unknown role 'tool'"),
        (
            "anthropic",
            {"messages": [{"role": "assistant", "content": [{"type": "tool_use", "name": "f"}]}]},
            r'messages\[0\]\["content"\]\[0\]: needs a str "id"',
        ),
        (
            "anthropic",
            {
                "messages": [
                    {"role": "assistant", "content": [{"type": "thinking", "thinking": "t"}]}
                ]
            },
            'needs a str "signature"',
        ),
        (
            "anthropic",
            {"messages": [{"role": "user", "content": [{"type": "tool_result"}]}]},
            'needs a str "tool_use_id"',
        ),
        (
            "anthropic",
            {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]},
            r'\["text"\]: must be a str, not int',
        ),
        ("gemini", [], "must be an object"),
        ("gemini", {"contents": {}}, "contents must be a list"),
        ("gemini", {"contents": [], "tools": []}, r"unexpected key\(s\) \['tools'\]"),
        ("gemini", {"contents": [{"role": "system", "parts": []}]}, "unknown role 'system'"),
        (
            "gemini",
            {"contents": [{"role": "model", "parts": [{"functionCall": {"args": {}}}]}]},
            r'\["functionCall"\]: needs a str "name"',
        ),
        (
            "gemini",
            {"contents": [{"parts": [{"functionResponse": {"name": "f", "response": "x"}}]}]},
            r'\["response"\]: must be an object',
        ),
    ],
)
def test_a_malformed_payload_is_refused_naming_the_place(
    provider: Any, payload: Any, match: str
) -> None:
    with pytest.raises(FormatError, match=match) as info:
        from_provider(payload, provider)
    assert str(info.value).startswith(f"{provider} payload")


# Anthropic ------------------------------------------------------------------------------------


def anthropic_user(*blocks: Any) -> dict[str, Any]:
    return {"role": "user", "content": list(blocks)}


def result(ident: str, content: str = "ok") -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": ident, "content": content}


@pytest.mark.parametrize(
    "messages",
    [
        [anthropic_user(result("a"), result("b"))],
        [anthropic_user(result("a")), anthropic_user(result("b"))],
        [anthropic_user(result("a"), {"type": "text", "text": "more"})],
        [anthropic_user({"type": "text", "text": "first"}, result("a"), result("b"))],
        [anthropic_user(result("a")), anthropic_user({"type": "text", "text": "x"}, result("b"))],
        [anthropic_user(result("a"), {"type": "text", "text": "x"}, result("b"))],
        [anthropic_user()],
    ],
    ids=["together", "apart", "then-text", "text-first", "apart-mixed", "sandwich", "empty"],
)
def test_anthropic_tool_results_split_and_merge_exactly(messages: list[Any]) -> None:
    payload = {"messages": messages}
    read = from_provider(payload, "anthropic", created_at=T0)
    assert to_provider(read, "anthropic") == payload
    results = [m for m in read if m.role is Role.TOOL]
    assert [m.tool_call_id for m in results] == [
        block["tool_use_id"]
        for message in messages
        for block in message["content"]
        if block["type"] == "tool_result"
    ]


def test_anthropic_turn_order_and_error_flags() -> None:
    payload = {
        "messages": [
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "plan", "signature": "s1"},
                    {"type": "text", "text": "one"},
                    {"type": "tool_use", "id": "t1", "name": "f", "input": {"x": 1}},
                    {"type": "text", "text": "two"},
                    {"type": "redacted_thinking", "data": "opaque"},
                    {"type": "tool_use", "id": "t2", "name": "g", "input": {}},
                ],
            },
            anthropic_user(
                {"type": "tool_result", "tool_use_id": "t1", "is_error": True},
                {
                    "type": "tool_result",
                    "tool_use_id": "t2",
                    "content": [{"type": "text", "text": "r"}],
                },
            ),
        ]
    }
    assistant, first, second = from_provider(payload, "anthropic", created_at=T0)
    assert assistant == Message.assistant(
        [
            ThinkingPart("plan", signature="s1", provider="anthropic"),
            TextPart("one"),
            ToolCallPart(0),
            TextPart("two"),
            RedactedThinkingPart("opaque", provider="anthropic"),
            ToolCallPart(1),
        ],
        tool_calls=[ToolCall("t1", "f", {"x": 1}), ToolCall("t2", "g", {})],
        created_at=T0,
    )
    # Each result gets its call's name (a tool_result block has none of its own).
    assert first == Message(
        Role.TOOL, None, tool_call_id="t1", name="f", is_error=True, created_at=T0
    )
    assert second == Message.tool("t2", [TextPart("r")], name="g", created_at=T0)
    assert to_provider([assistant, first, second], "anthropic") == payload


def test_anthropic_system_in_the_list_stays_there() -> None:
    payload = {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]}
    read = from_provider(payload, "anthropic")
    assert read[0].role is Role.SYSTEM
    assert to_provider(read, "anthropic") == payload
    plain = [Message.system("s"), Message.user("u"), Message.system("later")]
    assert to_provider(plain, "anthropic") == {
        "system": "s",
        "messages": [{"role": "user", "content": "u"}, {"role": "system", "content": "later"}],
    }


def test_anthropic_cache_control_is_provider_data() -> None:
    ephemeral = {"cache_control": {"type": "ephemeral"}}
    message = Message.user([TextPart("long document", provider_data={"anthropic": ephemeral})])
    assert to_provider([message], "anthropic") == {
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "long document", **ephemeral}]}
        ]
    }
    result = convert([message], "openai-chat")
    assert result.payload == [
        {"role": "user", "content": [{"type": "text", "text": "long document"}]}
    ]
    assert result.dropped == (
        "the anthropic field cache_control of text (part 0) of message 0 dropped: "
        "only anthropic reads it",
    )


# OpenAI ---------------------------------------------------------------------------------------


def test_chat_reasoning_content_and_refusal() -> None:
    payload = [{"role": "assistant", "content": "9.8", "reasoning_content": "0.8 > 0.11"}]
    (message,) = from_provider(payload, "openai-chat", created_at=T0)
    assert message == Message.assistant("9.8", reasoning_content="0.8 > 0.11", created_at=T0)
    assert to_provider([message], "openai-chat") == payload
    assert convert([message], "anthropic").dropped == (
        "reasoning_content of message 0 dropped: anthropic has no place for it",
    )


def test_chat_images_by_url_and_data() -> None:
    message = Message.user(
        [
            ImagePart("https://example.com/a.png", detail="low"),
            ImagePart(data="iVBORw0KGgo=", media_type="image/png"),
        ]
    )
    payload = to_provider([message], "openai-chat")
    assert payload == [
        {
            "role": "user",
            "content": [
                {
                    "type": "image_url",
                    "image_url": {"url": "https://example.com/a.png", "detail": "low"},
                },
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
            ],
        }
    ]
    assert from_provider(payload, "openai-chat", created_at=message.created_at) == [message]
    assert to_provider([message], "anthropic")["messages"][0]["content"] == [  # type: ignore[call-overload,index]
        {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}},
        {
            "type": "image",
            "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="},
        },
    ]


def test_arguments_are_a_string_for_openai_and_an_object_elsewhere() -> None:
    from_anthropic = Message.assistant(tool_calls=[ToolCall("t", "f", {"q": "é", "n": [1, 2.5]})])
    chat = to_provider([from_anthropic], "openai-chat")
    assert chat[0]["tool_calls"][0]["function"]["arguments"] == '{"q":"é","n":[1,2.5]}'  # type: ignore[index,call-overload]
    from_openai = Message.assistant(tool_calls=[ToolCall("c", "f", '{"q": "é"}')])
    assert to_provider([from_openai], "anthropic")["messages"][0]["content"][0]["input"] == {
        "q": "é"
    }  # type: ignore[call-overload,index]
    broken = Message.assistant(tool_calls=[ToolCall("c", "f", '{"q": ')])
    result = convert([broken], "gemini")
    assert result.payload["contents"][0]["parts"][0]["functionCall"]["args"] == {}  # type: ignore[call-overload,index]
    assert result.dropped == (
        "the arguments of tool call 0 (f) of message 0 dropped: they are not a JSON object, "
        "and gemini needs one; sent {}",
    )


def test_responses_items_keep_their_ids_and_statuses() -> None:
    items = [
        {
            "id": "rs_1",
            "type": "reasoning",
            "summary": [{"type": "summary_text", "text": "s"}],
            "encrypted_content": "enc",
        },
        {
            "type": "function_call",
            "id": "fc_1",
            "call_id": "call_1",
            "name": "f",
            "arguments": "{}",
            "status": "completed",
        },
        {"type": "function_call_output", "call_id": "call_1", "output": "r"},
    ]
    assistant, tool = from_provider(items, "openai-responses", created_at=T0)
    assert assistant == Message.assistant(
        [ThinkingPart(signature="enc", summary=["s"], id="rs_1", provider="openai-responses")],
        tool_calls=[ToolCall("call_1", "f", "{}", item_id="fc_1", status="completed")],
        created_at=T0,
    )
    assert tool == Message.tool("call_1", "r", created_at=T0)
    assert to_provider([assistant, tool], "openai-responses") == items


def test_responses_groups_a_turn_and_splits_at_a_second_message() -> None:
    output = {
        "type": "message",
        "id": "msg_1",
        "status": "completed",
        "role": "assistant",
        "content": [{"type": "output_text", "text": "a", "annotations": []}],
    }
    second = {"role": "assistant", "content": "b"}
    call = {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}
    items = [output, call, second]
    first, other = from_provider(items, "openai-responses", created_at=T0)
    assert first.tool_calls == (ToolCall("c", "f", "{}"),)
    assert first.text == "a"
    assert first.provider_data == {
        "openai-responses": {"type": "message", "id": "msg_1", "status": "completed"}
    }
    assert other == Message.assistant("b", created_at=T0)
    assert to_provider([first, other], "openai-responses") == items


def test_responses_string_input_is_one_user_message() -> None:
    assert from_provider("hi", "openai-responses", created_at=T0) == [
        Message.user("hi", created_at=T0)
    ]


def test_developer_messages_where_there_is_no_such_role() -> None:
    messages = [Message.developer("rules"), Message.user("hi")]
    assert to_provider(messages, "openai-chat")[0] == {"role": "developer", "content": "rules"}  # type: ignore[index]
    assert to_provider(messages, "openai-responses")[0] == {"role": "developer", "content": "rules"}  # type: ignore[index]
    anthropic = convert(messages, "anthropic")
    assert anthropic.payload["system"] == "rules"  # type: ignore[call-overload]
    assert anthropic.changed == (
        "message 0 is a developer message; sent as system: anthropic has none",
    )
    assert anthropic.dropped == ()
    assert anthropic.lossless
    assert to_provider(messages, "anthropic", strict=True) == anthropic.payload
    gemini = convert(messages, "gemini")
    assert gemini.payload["system_instruction"] == {"parts": [{"text": "rules"}]}  # type: ignore[call-overload]
    assert gemini.changed == ("message 0 is a developer message; sent as the system instruction",)
    assert gemini.dropped == ()


# Gemini ---------------------------------------------------------------------------------------


def test_gemini_takes_the_function_name_from_the_call() -> None:
    messages = [
        Message.assistant(tool_calls=[ToolCall("c1", "lookup", {}), ToolCall("", "search", {})]),
        Message.tool("c1", "found"),
        Message.tool("", "nothing"),
        Message.tool("c9", "orphan"),
    ]
    result = convert(messages, "gemini")
    responses = [part["functionResponse"] for part in result.payload["contents"][1]["parts"]]  # type: ignore[call-overload,index]
    assert [r["name"] for r in responses] == ["lookup", "search", ""]
    assert result.changed == (
        "tool result 3 has no function name and answers no known call; gemini needs the name, "
        "sent as ''",
    )
    assert [str(problem) for problem in result.problems] == [
        "message 3: a tool result for call 'c9', which no earlier assistant message made"
    ]


def test_gemini_calls_without_ids_get_ids_elsewhere() -> None:
    payload = {
        "contents": [
            {
                "role": "model",
                "parts": [
                    {"functionCall": {"name": "f", "args": {}}},
                    {"functionCall": {"name": "g", "args": {}}},
                ],
            },
            {
                "role": "user",
                "parts": [
                    {"functionResponse": {"name": "g", "response": {"output": "G"}}},
                    {"functionResponse": {"name": "f", "response": {"output": "F"}}},
                ],
            },
        ]
    }
    messages = from_provider(payload, "gemini")
    assert [call.id for call in messages[0].tool_calls] == ["", ""]
    chat = convert(messages, "openai-chat")
    calls = chat.payload[0]["tool_calls"]  # type: ignore[index]
    assert [(c["id"], c["function"]["name"]) for c in calls] == [
        ("call_0_0", "f"),
        ("call_0_1", "g"),
    ]
    # The results pair with the calls by function name.
    assert [(m["tool_call_id"], m["content"]) for m in chat.payload[1:]] == [  # type: ignore[index]
        ("call_0_1", "G"),
        ("call_0_0", "F"),
    ]
    assert "tool call 0 of message 0 has no id; sent as 'call_0_0': openai-chat needs one" in (
        chat.changed
    )
    assert to_provider(messages, "gemini") == payload


def test_gemini_structured_and_error_responses() -> None:
    payload = {
        "contents": [
            {
                "role": "user",
                "parts": [
                    {"functionResponse": {"name": "a", "response": {"output": "text"}}},
                    {"functionResponse": {"name": "b", "response": {"error": "boom"}}},
                    {"functionResponse": {"name": "c", "response": {"celsius": 18}}},
                    {"functionResponse": {"name": "d", "response": {"error": {"code": 7}}}},
                ],
            },
        ]
    }
    a, b, c, d = from_provider(payload, "gemini", created_at=T0)
    assert (a.content, a.is_error, a.name) == ("text", False, "a")
    assert (b.content, b.is_error) == ("boom", True)
    assert (c.content, c.is_error) == ('{"celsius":18}', False)
    assert (d.content, d.is_error) == ('{"error":{"code":7}}', True)
    assert to_provider([a, b, c, d], "gemini") == payload
    # A tool message written by hand sends its text as the output (or the error).
    written = [
        Message.tool("", '{"celsius":18}', name="c"),
        Message.tool("", "x", name="e", is_error=True),
    ]
    parts = to_provider(written, "gemini")["contents"][0]["parts"]  # type: ignore[call-overload,index]
    assert [part["functionResponse"]["response"] for part in parts] == [
        {"output": '{"celsius":18}'},
        {"error": "x"},
    ]


def test_gemini_reads_the_sdks_snake_case_and_writes_it_back_as_it_came() -> None:
    # The newcomer's reproduction: snake_case input (inline_data, mime_type) came back in
    # camelCase. Each part, call and result now remembers its own casing.
    payload = {
        "systemInstruction": {"parts": [{"text": "s"}]},
        "contents": [
            {
                "role": "user",
                "parts": [
                    {"text": "q"},
                    {"inline_data": {"mime_type": "image/png", "data": "AAAA"}},
                ],
            },
            {
                "role": "model",
                "parts": [
                    {
                        "function_call": {"name": "f", "args": {"snake_key": 1}},
                        "thought_signature": "AAAA",
                    },
                    {"functionCall": {"name": "g", "args": {}}},
                    {"inline_data": {"mime_type": "image/png", "data": "AAAA"}},
                    {"inlineData": {"mimeType": "image/png", "data": "BBBB"}},
                    {"executable_code": {"language": "PYTHON", "code": "1"}},
                ],
            },
            {
                "role": "user",
                "parts": [
                    {
                        "function_response": {
                            "name": "f",
                            "response": {"output": "r"},
                            "will_continue": False,
                        }
                    },
                    {"functionResponse": {"name": "g", "response": {"output": "r"}}},
                ],
            },
        ],
    }
    system, user, model, first, second = from_provider(payload, "gemini", created_at=T0)
    # Read as the neutral fields, whatever the casing.
    assert system.text == "s"
    assert user.content[1] == ImagePart(  # type: ignore[index]
        data="AAAA",
        media_type="image/png",
        provider_data=user.content[1].provider_data,  # type: ignore[index]
    )
    assert [call.name for call in model.tool_calls] == ["f", "g"]
    assert model.tool_calls[0].arguments == {"snake_key": 1}
    assert model.tool_calls[0].provider_data["gemini"]["thoughtSignature"] == "AAAA"
    assert (first.name, first.text, second.name, second.text) == ("f", "r", "g", "r")
    # Written back exactly as it came, camelCase where it was camelCase.
    assert to_provider([system, user, model, first, second], "gemini") == payload
    # Another provider reads the same neutral message from either casing.
    camel = to_provider([Message.user([TextPart("q"), *user.content[1:]])], "gemini")  # type: ignore[index]
    assert camel["contents"][0]["parts"][1] == {  # type: ignore[call-overload,index]
        "inline_data": {"mime_type": "image/png", "data": "AAAA"}
    }
    assert to_provider(
        [Message.user([TextPart("q"), ImagePart(data="AAAA", media_type="image/png")])], "gemini"
    ) == {
        "contents": [
            {
                "role": "user",
                "parts": [{"text": "q"}, {"inlineData": {"mimeType": "image/png", "data": "AAAA"}}],
            }
        ]
    }


def test_thinking_goes_only_to_the_provider_that_signed_it() -> None:
    signed = {
        provider: Message.assistant(
            [ThinkingPart("t", signature="s", id="rs_1", provider=provider), TextPart("answer")]
        )
        for provider in ("anthropic", "gemini", "openai-responses")
    }
    for origin, message in signed.items():
        for target in PROVIDERS:
            result = convert([message], target)
            if target == origin:
                assert result.lossless, (origin, target, result.dropped)
            else:
                assert len(result.dropped) == 1, (origin, target, result.dropped)
                assert result.dropped[0].startswith("thinking (part 0) of message 0 dropped")


def test_provider_parts_go_only_to_their_provider() -> None:
    document = ProviderPart(
        "anthropic",
        {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "d"}},
    )
    message = Message.user([document, TextPart("summarise")])
    assert to_provider([message], "anthropic")["messages"][0]["content"][0] == dict(document.data)  # type: ignore[call-overload,index]
    result = convert([message], "gemini")
    assert result.payload["contents"][0]["parts"] == [{"text": "summarise"}]  # type: ignore[call-overload,index]
    assert result.dropped == (
        "the anthropic document block (part 0) of message 0 dropped: gemini has no place for it",
    )


# Integers wider than 64 bits ---------------------------------------------------------------

WIDE = 2**70


def test_wide_ints_in_provider_payloads_are_kept_exactly() -> None:
    """Anthropic ``tool_use.input``, Gemini ``functionCall.args`` and ``functionResponse``
    may hold ints wider than 64 bits: they are read, written to every provider, and measured
    for compaction without loss or error."""
    from nous_session.transcript import estimate_messages_tokens

    anthropic = from_provider(
        {
            "messages": [
                {
                    "role": "assistant",
                    "content": [
                        {"type": "tool_use", "id": "t1", "name": "f", "input": {"n": -WIDE}}
                    ],
                }
            ]
        },
        "anthropic",
    )
    gemini = from_provider(
        {
            "contents": [
                {"role": "model", "parts": [{"functionCall": {"name": "g", "args": {"n": WIDE}}}]},
                {
                    "role": "user",
                    "parts": [{"functionResponse": {"name": "g", "response": {"total": WIDE}}}],
                },
            ]
        },
        "gemini",
    )
    messages = [*anthropic, *gemini]
    assert anthropic[0].tool_calls[0].arguments == {"n": -WIDE}
    assert gemini[0].tool_calls[0].arguments == {"n": WIDE}
    assert str(WIDE) in gemini[1].text
    assert estimate_messages_tokens(messages) > 0
    chat = to_provider(messages, "openai-chat")
    assert chat[0]["tool_calls"][0]["function"]["arguments"] == f'{{"n":{-WIDE}}}'
    back = to_provider(messages, "gemini")["contents"]
    assert back[1]["parts"][0]["functionCall"]["args"] == {"n": WIDE}
    assert back[2]["parts"][0]["functionResponse"]["response"] == {"total": WIDE}
    assert to_provider(messages, "anthropic")["messages"][0]["content"][0]["input"] == {"n": -WIDE}


def test_a_tool_result_with_a_wide_int_is_encoded_exactly() -> None:
    assert Message.tool("c1", {"id": WIDE}).text == f'{{"id":{WIDE}}}'
