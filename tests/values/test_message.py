"""Message and ToolCall: fields, builders, coercion, validation and properties.

The contract is the "Messages" section of docs/design.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import attrs
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from nous_session.message import Message, Role, ToolCall

T0 = datetime(2024, 5, 17, 9, 30, 15, 123456, tzinfo=UTC)

ROLES = ("system", "developer", "user", "assistant", "tool")


# Fields and defaults -----------------------------------------------------------------------


def test_defaults() -> None:
    before = datetime.now(UTC)
    message = Message(role="user")
    after = datetime.now(UTC)

    assert message.role == "user"
    assert message.content is None
    assert message.reasoning_content is None
    assert message.tool_calls == ()
    assert isinstance(message.tool_calls, tuple)
    assert message.tool_call_id is None
    assert message.name is None
    assert isinstance(message.metadata, Mapping)
    assert dict(message.metadata) == {}
    assert message.created_at.utcoffset() == timedelta(0)
    assert before <= message.created_at <= after


@pytest.mark.parametrize("role", ROLES)
def test_roles_compare_equal_to_their_strings(role: str) -> None:
    message = Message(role=role)
    assert message.role == role
    assert Message(role=Role(role)).role == role


def test_role_is_a_str_enum() -> None:
    assert Role.USER == "user"
    assert {role.value for role in Role} == set(ROLES)


def test_unknown_role_is_refused() -> None:
    with pytest.raises(ValueError, match="role"):
        Message(role="robot")


def test_all_fields_are_kept() -> None:
    call = ToolCall("call_1", "lookup", {"q": "x"})
    message = Message(
        role="assistant",
        content="thinking done",
        reasoning_content="because",
        tool_calls=(call,),
        tool_call_id="tc",
        name="bot",
        metadata={"k": [1, 2]},
        created_at=T0,
    )
    assert message.role == "assistant"
    assert message.content == "thinking done"
    assert message.reasoning_content == "because"
    assert message.tool_calls == (call,)
    assert message.tool_call_id == "tc"
    assert message.name == "bot"
    assert dict(message.metadata) == {"k": [1, 2]}
    assert message.created_at == T0


def test_message_is_frozen() -> None:
    message = Message.user("hi")
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        message.content = "changed"  # type: ignore[misc]
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        message.role = Role.SYSTEM  # type: ignore[misc]
    assert message.content == "hi"


def test_equal_fields_make_equal_messages() -> None:
    assert Message.user("a", created_at=T0) == Message.user("a", created_at=T0)
    assert Message.user("a", created_at=T0) != Message.user("b", created_at=T0)
    assert Message.user("a", created_at=T0) != Message.system("a", created_at=T0)


# Builders -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("build", "role"),
    [(Message.system, "system"), (Message.user, "user")],
)
def test_system_and_user_builders(build: Any, role: str) -> None:
    message = build("hello", name="n", metadata={"a": 1}, created_at=T0)
    assert message.role == role
    assert message.content == "hello"
    assert message.name == "n"
    assert dict(message.metadata) == {"a": 1}
    assert message.created_at == T0
    assert message.tool_calls == ()
    assert message.tool_call_id is None
    assert message.reasoning_content is None


def test_builders_default_created_at_to_now() -> None:
    before = datetime.now(UTC)
    messages = [
        Message.system("s"),
        Message.user("u"),
        Message.assistant("a"),
        Message.tool("c", "r"),
    ]
    after = datetime.now(UTC)
    for message in messages:
        assert message.created_at.utcoffset() == timedelta(0)
        assert before <= message.created_at <= after


def test_assistant_builder_defaults() -> None:
    message = Message.assistant()
    assert message.role == "assistant"
    assert message.content is None
    assert message.tool_calls == ()
    assert message.reasoning_content is None
    assert message.name is None


def test_assistant_builder_with_everything() -> None:
    message = Message.assistant(
        "Checking.",
        tool_calls=[{"id": "call_1", "name": "get_weather", "arguments": {"city": "Paris"}}],
        reasoning_content="need the weather",
        name="agent",
        metadata={"step": 3},
        created_at=T0,
    )
    assert message.role == "assistant"
    assert message.content == "Checking."
    assert message.tool_calls == (ToolCall("call_1", "get_weather", {"city": "Paris"}),)
    assert isinstance(message.tool_calls, tuple)
    assert message.reasoning_content == "need the weather"
    assert message.name == "agent"
    assert dict(message.metadata) == {"step": 3}
    assert message.created_at == T0


def test_assistant_tool_calls_go_through_coerce() -> None:
    given_calls = [
        ToolCall("a", "one", {"x": 1}),
        {"id": "b", "name": "two", "arguments": '{"y": 2}'},
        {"id": "c", "type": "function", "function": {"name": "three", "arguments": {"z": 3}}},
    ]
    message = Message.assistant(tool_calls=given_calls)
    assert message.tool_calls == (
        ToolCall("a", "one", {"x": 1}),
        ToolCall("b", "two", '{"y": 2}'),
        ToolCall("c", "three", {"z": 3}),
    )
    assert all(type(call) is ToolCall for call in message.tool_calls)


def test_bad_tool_call_entry_is_refused() -> None:
    with pytest.raises(ValueError, match="tool call"):
        Message.assistant(tool_calls=[42])  # type: ignore[list-item]


def test_builder_options_are_keyword_only() -> None:
    call = ToolCall("c", "f", {})
    with pytest.raises(TypeError):
        Message.assistant("x", [call])  # type: ignore[misc]
    with pytest.raises(TypeError):
        Message.tool("c", "r", "name")  # type: ignore[misc]
    with pytest.raises(TypeError):
        Message.user("u", "name")  # type: ignore[misc]


def test_tool_builder_with_string_result() -> None:
    message = Message.tool(
        "call_1", "18C, clear", name="get_weather", metadata={"ms": 12}, created_at=T0
    )
    assert message.role == "tool"
    assert message.tool_call_id == "call_1"
    assert message.content == "18C, clear"
    assert message.name == "get_weather"
    assert dict(message.metadata) == {"ms": 12}
    assert message.created_at == T0
    assert message.tool_calls == ()


def test_tool_builder_name_defaults_to_none() -> None:
    assert Message.tool("call_1", "ok").name is None


def test_tool_string_result_is_not_reencoded() -> None:
    # A string that happens to look like JSON is still kept exactly as given.
    raw = '{"a": 1,   "b": "é"}'
    assert Message.tool("c", raw).content == raw


@pytest.mark.parametrize(
    ("result", "encoded"),
    [
        ({"a": 1}, '{"a":1}'),
        ({"a": 1, "b": [1, 2, {"c": None}]}, '{"a":1,"b":[1,2,{"c":null}]}'),
        ([1, "two", 3.5], '[1,"two",3.5]'),
        ({"city": "Zürich", "emoji": "😀"}, '{"city":"Zürich","emoji":"😀"}'),
        (["日本語"], '["日本語"]'),
        (42, "42"),
        (True, "true"),
        (None, "null"),
    ],
)
def test_tool_encodes_non_string_results_as_compact_utf8_json(result: object, encoded: str) -> None:
    message = Message.tool("c", result)
    assert message.content == encoded
    assert isinstance(message.content, str)
    assert "\\u" not in message.content


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(),
        lambda children: (
            st.lists(children, max_size=4)
            | st.dictionaries(st.text(max_size=5), children, max_size=4)
        ),
        max_leaves=12,
    ).filter(lambda value: not isinstance(value, str))
)
def test_tool_encoding_matches_orjson(result: object) -> None:
    content = Message.tool("c", result).content
    assert content == orjson.dumps(result).decode()
    assert isinstance(content, str)
    assert orjson.loads(content) == result


def test_tool_result_that_is_not_json_is_refused() -> None:
    with pytest.raises(ValueError, match="JSON"):
        Message.tool("c", object())


# Content -------------------------------------------------------------------------------------


def test_content_list_is_stored_as_tuple() -> None:
    parts = [
        {"type": "text", "text": "look at "},
        {"type": "image_url", "url": "https://example.com/cat.png"},
        {"type": "text", "text": "this"},
    ]
    message = Message.user(parts)
    assert isinstance(message.content, tuple)
    assert len(message.content) == 3
    assert [dict(part) for part in message.content] == parts


def test_content_tuple_is_stored_as_tuple() -> None:
    parts = ({"type": "text", "text": "a"},)
    message = Message(role="user", content=parts)
    assert isinstance(message.content, tuple)
    assert [dict(part) for part in message.content] == [{"type": "text", "text": "a"}]


def test_content_list_given_to_constructor_is_stored_as_tuple() -> None:
    message = Message(role="assistant", content=[{"type": "text", "text": "x"}])
    assert isinstance(message.content, tuple)


def test_content_parts_are_copied() -> None:
    part: dict[str, Any] = {"type": "text", "text": "before"}
    parts = [part]
    message = Message.user(parts)
    part["text"] = "after"
    parts.append({"type": "text", "text": "more"})
    assert message.text == "before"
    assert message.content is not None
    assert len(message.content) == 1


# Metadata ------------------------------------------------------------------------------------


def test_metadata_is_copied() -> None:
    metadata: dict[str, Any] = {"a": {"b": [1, 2]}, "c": "d"}
    message = Message.user("x", metadata=metadata)
    metadata["c"] = "changed"
    metadata["new"] = True
    metadata["a"]["b"].append(3)
    metadata["a"]["e"] = 1
    assert dict(message.metadata) == {"a": {"b": [1, 2]}, "c": "d"}


def test_metadata_is_copied_by_the_constructor() -> None:
    metadata: dict[str, Any] = {"k": [1]}
    message = Message(role="system", content="s", metadata=metadata)
    metadata["k"].append(2)
    del metadata["k"]
    assert dict(message.metadata) == {"k": [1]}


def test_metadata_is_read_only() -> None:
    message = Message.user("x", metadata={"a": 1})
    with pytest.raises(TypeError):
        message.metadata["a"] = 2  # type: ignore[index]
    with pytest.raises(TypeError):
        message.metadata["b"] = 3  # type: ignore[index]
    assert dict(message.metadata) == {"a": 1}


@pytest.mark.parametrize(
    "metadata",
    [
        {"a": object()},
        {"a": {"b": {1, 2}}},
        {"a": float("nan")},
        {"a": float("inf")},
        {"a": 10**4000},
        {1: "non-string key"},
        {"a": [1, b"bytes"]},
        {"when": datetime(2024, 1, 1, tzinfo=UTC)},
    ],
)
def test_metadata_must_be_json(metadata: Any) -> None:
    with pytest.raises(ValueError, match="metadata"):
        Message.user("x", metadata=metadata)
    with pytest.raises(ValueError, match="metadata"):
        Message(role="user", metadata=metadata)


@pytest.mark.parametrize("metadata", [[("a", 1)], "not a mapping", 5])
def test_metadata_must_be_a_mapping(metadata: Any) -> None:
    with pytest.raises(ValueError, match="metadata"):
        Message.user("x", metadata=metadata)


def test_metadata_accepts_every_json_value() -> None:
    metadata = {
        "s": "é😀",
        "i": -(2**63),
        "j": 2**63 - 1,
        "w": 2**64,  # wider than 64 bits: kept exactly
        "v": -(10**3999),
        "f": 1.5,
        "b": False,
        "n": None,
        "l": [1, [2, {"x": "y"}]],
        "d": {"nested": {}},
    }
    assert dict(Message.user("x", metadata=metadata).metadata) == metadata


# created_at ----------------------------------------------------------------------------------


def test_created_at_keeps_microseconds() -> None:
    message = Message.user("x", created_at=T0)
    assert message.created_at == T0
    assert message.created_at.microsecond == 123456
    assert message.created_at.utcoffset() == timedelta(0)


def test_created_at_in_another_zone_is_converted_to_utc() -> None:
    plus_two = timezone(timedelta(hours=2))
    local = datetime(2024, 5, 17, 11, 30, 15, 654321, tzinfo=plus_two)
    message = Message.user("x", created_at=local)
    assert message.created_at == local  # the same instant
    assert message.created_at.utcoffset() == timedelta(0)
    assert message.created_at.tzinfo == UTC
    assert (message.created_at.hour, message.created_at.minute) == (9, 30)
    assert message.created_at.microsecond == 654321


def test_created_at_in_another_zone_is_converted_by_the_constructor() -> None:
    minus_five = timezone(timedelta(hours=-5))
    local = datetime(2024, 1, 1, 20, 0, 0, 1, tzinfo=minus_five)
    message = Message(role="tool", content="r", created_at=local)
    assert message.created_at.utcoffset() == timedelta(0)
    assert message.created_at == datetime(2024, 1, 2, 1, 0, 0, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    "build",
    [
        lambda at: Message.user("x", created_at=at),
        lambda at: Message.system("x", created_at=at),
        lambda at: Message.assistant("x", created_at=at),
        lambda at: Message.tool("c", "x", created_at=at),
        lambda at: Message(role="user", created_at=at),
    ],
)
def test_naive_created_at_is_refused(build: Any) -> None:
    with pytest.raises(ValueError, match="created_at"):
        build(datetime(2024, 5, 17, 9, 30))


@given(
    st.datetimes(
        timezones=st.builds(
            timezone, st.integers(-23 * 60 + 1, 23 * 60 - 1).map(lambda m: timedelta(minutes=m))
        )
    )
)
def test_created_at_is_always_aware_utc(moment: datetime) -> None:
    message = Message.user("x", created_at=moment)
    assert message.created_at == moment
    assert message.created_at.utcoffset() == timedelta(0)
    assert message.created_at.microsecond == moment.microsecond


# Properties ----------------------------------------------------------------------------------


def test_text_of_a_string_is_the_string() -> None:
    assert Message.user("Hello\nworld ").text == "Hello\nworld "


def test_text_of_none_is_empty() -> None:
    assert Message.assistant().text == ""
    assert Message(role="user").text == ""


def test_text_of_parts_joins_text_parts_and_ignores_images() -> None:
    message = Message.user(
        [
            {"type": "text", "text": "one"},
            {"type": "image_url", "url": "https://example.com/a.png"},
            {"type": "text", "text": " two"},
            {"type": "text", "text": ""},
            {"type": "text", "text": "\nthree"},
        ]
    )
    assert message.text == "one two\nthree"


def test_text_of_only_images_is_empty() -> None:
    message = Message.user([{"type": "image_url", "url": "https://example.com/a.png"}])
    assert message.text == ""


def test_text_of_empty_part_list_is_empty() -> None:
    assert Message.user([]).text == ""


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        (Message.system("s"), True),
        (Message.user("u"), False),
        (Message.assistant("a"), False),
        (Message.tool("c", "t"), False),
    ],
)
def test_is_system(message: Message, expected: bool) -> None:
    assert message.is_system is expected


def test_has_tool_calls() -> None:
    call = ToolCall("c1", "f", {})
    assert Message.assistant(tool_calls=[call]).has_tool_calls is True
    assert Message.assistant("no calls").has_tool_calls is False
    assert Message.user("u").has_tool_calls is False
    assert Message.tool("c1", "r").has_tool_calls is False
    # No cross-field validation: a user message may carry tool calls, and then it has them.
    assert Message(role="user", content="u", tool_calls=[call]).has_tool_calls is True


def test_is_tool_related() -> None:
    call = ToolCall("c1", "f", {})
    assert Message.tool("c1", "r").is_tool_related is True
    assert Message.assistant(tool_calls=[call]).is_tool_related is True
    assert Message.assistant("plain").is_tool_related is False
    assert Message.user("u").is_tool_related is False
    assert Message.system("s").is_tool_related is False
    # Only a tool message or an *assistant* message with tool calls is tool related.
    assert Message(role="user", content="u", tool_calls=[call]).is_tool_related is False
    assert Message(role="system", content="s", tool_calls=[call]).is_tool_related is False


def test_no_cross_field_validation() -> None:
    call = ToolCall("c1", "f", {"x": 1})
    user = Message(role="user", content="u", tool_calls=[call], tool_call_id="c0")
    assert user.tool_calls == (call,)
    assert user.tool_call_id == "c0"
    system = Message(role="system", tool_calls=[{"id": "c2", "name": "g"}])
    assert system.tool_calls == (ToolCall("c2", "g", {}),)
    tool = Message(role="tool", content=None)
    assert tool.tool_call_id is None
    assert tool.text == ""
    empty_assistant = Message(role="assistant")
    assert empty_assistant.content is None
    assert empty_assistant.tool_calls == ()


# ToolCall -----------------------------------------------------------------------------------


def test_tool_call_fields() -> None:
    call = ToolCall("call_1", "get_weather", {"city": "Paris"})
    assert call.id == "call_1"
    assert call.name == "get_weather"
    assert dict(call.arguments) == {"city": "Paris"}  # type: ignore[arg-type]


def test_tool_call_keywords() -> None:
    call = ToolCall(id="i", name="n", arguments='{"a":1}')
    assert (call.id, call.name, call.arguments) == ("i", "n", '{"a":1}')


def test_tool_call_is_frozen() -> None:
    call = ToolCall("call_1", "get_weather", {"city": "Paris"})
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        call.name = "other"  # type: ignore[misc]
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        call.arguments = {}  # type: ignore[misc]
    assert call.name == "get_weather"


def test_tool_call_string_arguments_are_kept_as_given() -> None:
    raw = '{"city":  "Paris" , "days": 3}'
    call = ToolCall("c", "f", raw)
    assert call.arguments == raw
    assert isinstance(call.arguments, str)


def test_tool_call_mapping_arguments_are_kept_as_a_mapping() -> None:
    arguments = {"city": "Paris", "days": [1, 2], "opts": {"metric": True}}
    call = ToolCall("c", "f", arguments)
    assert isinstance(call.arguments, Mapping)
    assert dict(call.arguments) == arguments


def test_tool_call_equality() -> None:
    assert ToolCall("c", "f", {"a": 1}) == ToolCall("c", "f", {"a": 1})
    assert ToolCall("c", "f", {"a": 1}) != ToolCall("c", "f", {"a": 2})
    assert ToolCall("c", "f", '{"a":1}') != ToolCall("c", "f", {"a": 1})


def test_coerce_returns_a_tool_call_unchanged() -> None:
    call = ToolCall("c", "f", {"a": 1})
    coerced = ToolCall.coerce(call)
    assert coerced == call


def test_coerce_flat_mapping() -> None:
    coerced = ToolCall.coerce(
        {"id": "call_1", "name": "get_weather", "arguments": {"city": "Paris"}}
    )
    assert coerced == ToolCall("call_1", "get_weather", {"city": "Paris"})


def test_coerce_flat_mapping_with_string_arguments() -> None:
    coerced = ToolCall.coerce({"id": "call_1", "name": "f", "arguments": '{"x": 1}'})
    assert coerced.arguments == '{"x": 1}'


def test_coerce_openai_nested_form() -> None:
    coerced = ToolCall.coerce(
        {
            "id": "call_abc",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
        }
    )
    assert coerced == ToolCall("call_abc", "get_weather", '{"city":"Paris"}')
    assert coerced.arguments == '{"city":"Paris"}'


def test_coerce_openai_nested_form_with_mapping_arguments() -> None:
    coerced = ToolCall.coerce(
        {"id": "call_abc", "type": "function", "function": {"name": "f", "arguments": {"k": "v"}}}
    )
    assert coerced == ToolCall("call_abc", "f", {"k": "v"})


@pytest.mark.parametrize("obj", [42, None, "call_1", ["id", "name"], ("c", "f", {})])
def test_coerce_refuses_non_mappings(obj: object) -> None:
    with pytest.raises(ValueError, match="tool call"):
        ToolCall.coerce(obj)


@pytest.mark.parametrize(
    ("obj", "named"),
    [
        ({"name": "f", "arguments": {}}, "id"),
        ({"id": "c", "arguments": {}}, "name"),
        ({"id": "c", "type": "function", "function": {"arguments": "{}"}}, "name"),
        ({"type": "function", "function": {"name": "f", "arguments": "{}"}}, "id"),
        ({"id": "c", "type": "function", "function": "f"}, "function"),
        ({"id": 1, "name": "f", "arguments": {}}, "id"),
        ({"id": "c", "name": 2, "arguments": {}}, "name"),
    ],
)
def test_coerce_names_the_problem(obj: Mapping[str, Any], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        ToolCall.coerce(obj)


def test_tool_call_arguments_must_be_json() -> None:
    with pytest.raises(ValueError, match="arguments"):
        ToolCall("c", "f", {"a": object()})
    with pytest.raises(ValueError, match="arguments"):
        ToolCall.coerce({"id": "c", "name": "f", "arguments": {"a": {1, 2}}})


def test_tool_call_mapping_arguments_are_copied() -> None:
    arguments: dict[str, Any] = {"a": [1]}
    call = ToolCall("c", "f", arguments)
    arguments["a"].append(2)
    arguments["b"] = 1
    assert dict(call.arguments) == {"a": [1]}  # type: ignore[arg-type]
