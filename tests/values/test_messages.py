"""nous_session.messages: the readers over a list of messages.

The contract is the end of the "Messages" section of docs/design.md; the seed examples come from
the "When you would reach for a transcript" part of seeds/transcripts.txt.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from nous_session.message import Message, Role, ToolCall
from nous_session.messages import (
    count_by_role,
    extract_text,
    extract_tool_calls,
    find_by_role,
    last_message,
    split_system,
)

T0 = datetime(2024, 5, 17, 9, 0, tzinfo=UTC)


def at(minutes: int) -> datetime:
    return T0 + timedelta(minutes=minutes)


def conversation() -> list[Message]:
    return [
        Message.system("You are terse.", created_at=at(0)),
        Message.user("Weather in Paris and Rome?", created_at=at(1)),
        Message.assistant(
            "Checking both.",
            tool_calls=[
                ToolCall("c1", "get_weather", {"city": "Paris"}),
                ToolCall("c2", "get_weather", {"city": "Rome"}),
            ],
            created_at=at(2),
        ),
        Message.tool("c1", "18C", name="get_weather", created_at=at(3)),
        Message.tool("c2", "25C", name="get_weather", created_at=at(4)),
        Message.system("Be brief.", created_at=at(5)),
        Message.assistant("Paris 18C, Rome 25C.", created_at=at(6)),
        Message.user("Thanks", created_at=at(7)),
        Message.assistant(
            None, tool_calls=[ToolCall("c3", "log_visit", '{"n":1}')], created_at=at(8)
        ),
        Message.tool("c3", "ok", name="log_visit", created_at=at(9)),
    ]


# find_by_role ------------------------------------------------------------------------------


def test_find_by_role_keeps_order() -> None:
    messages = conversation()
    assert find_by_role(messages, "user") == [messages[1], messages[7]]
    assert find_by_role(messages, "system") == [messages[0], messages[5]]
    assert find_by_role(messages, "tool") == [messages[3], messages[4], messages[9]]
    assert find_by_role(messages, "assistant") == [messages[2], messages[6], messages[8]]


def test_find_by_role_accepts_the_enum() -> None:
    messages = conversation()
    assert find_by_role(messages, Role.USER) == find_by_role(messages, "user")


def test_find_by_role_returns_the_same_objects() -> None:
    messages = conversation()
    found = find_by_role(messages, "tool")
    assert all(any(m is original for original in messages) for m in found)


def test_find_by_role_none_found() -> None:
    assert find_by_role([Message.user("u")], "tool") == []
    assert find_by_role([], "system") == []


def test_find_by_role_unknown_role() -> None:
    with pytest.raises(ValueError, match=r"(?i)role"):
        find_by_role(conversation(), "robot")


def test_find_by_role_does_not_mutate() -> None:
    messages = conversation()
    before = list(messages)
    find_by_role(messages, "user")
    assert messages == before


# count_by_role -----------------------------------------------------------------------------


def test_count_by_role_counts_every_role() -> None:
    counts = count_by_role(conversation())
    assert counts == {"system": 2, "developer": 0, "user": 2, "assistant": 3, "tool": 3}


def test_count_by_role_includes_zeros() -> None:
    counts = count_by_role([Message.user("a"), Message.user("b")])
    assert counts == {"system": 0, "developer": 0, "user": 2, "assistant": 0, "tool": 0}
    assert set(counts) == {"system", "developer", "user", "assistant", "tool"}
    assert counts["tool"] == 0
    assert counts["user"] == 2
    assert counts[Role.USER] == 2


def test_count_by_role_of_nothing() -> None:
    counts = count_by_role([])
    assert counts == {"system": 0, "developer": 0, "user": 0, "assistant": 0, "tool": 0}
    assert len(counts) == 5


def test_count_by_role_seed_example() -> None:
    # Nous.Messages.count_by_role(result.all_messages)
    # #=> %{system: 1, user: 1, assistant: 4, tool: 4}
    counts = count_by_role(flight_run())
    assert counts == {"system": 1, "developer": 0, "user": 1, "assistant": 4, "tool": 4}


ROLES = ("system", "developer", "user", "assistant", "tool")
role_lists = st.lists(st.sampled_from(ROLES), max_size=30)


@given(role_lists)
def test_count_by_role_matches_naive_count(roles: list[str]) -> None:
    messages = [Message(role=role, content="x") for role in roles]
    counts = count_by_role(messages)
    assert counts == {role: roles.count(role) for role in ROLES}
    assert sum(counts.values()) == len(messages)


# extract_tool_calls ------------------------------------------------------------------------


def test_extract_tool_calls_flattens_in_order() -> None:
    calls = extract_tool_calls(conversation())
    assert calls == [
        ToolCall("c1", "get_weather", {"city": "Paris"}),
        ToolCall("c2", "get_weather", {"city": "Rome"}),
        ToolCall("c3", "log_visit", '{"n":1}'),
    ]
    assert all(type(call) is ToolCall for call in calls)


def test_extract_tool_calls_only_reads_assistant_messages() -> None:
    stray = ToolCall("x", "stray", {})
    kept = ToolCall("y", "kept", {})
    messages = [
        Message(role="user", content="u", tool_calls=[stray]),
        Message(role="system", content="s", tool_calls=[stray]),
        Message(role="tool", content="t", tool_calls=[stray]),
        Message.assistant(tool_calls=[kept]),
    ]
    assert extract_tool_calls(messages) == [kept]


def test_extract_tool_calls_of_nothing() -> None:
    assert extract_tool_calls([]) == []
    assert extract_tool_calls([Message.user("u"), Message.assistant("a")]) == []


def test_extract_tool_calls_seed_example() -> None:
    # result.all_messages |> Nous.Messages.extract_tool_calls() |> Enum.map(& &1.name)
    names = [call.name for call in extract_tool_calls(flight_run())]
    assert names == ["search_flights", "search_flights", "search_flights", "book_flight"]


# extract_text ------------------------------------------------------------------------------


def test_extract_text_one_string_per_message() -> None:
    messages = [
        Message.user("hello"),
        Message.assistant(),
        Message.user([{"type": "text", "text": "a"}, {"type": "image_url", "url": "u"}]),
        Message.tool("c", {"k": 1}),
        Message.assistant([{"type": "text", "text": "b"}, {"type": "text", "text": "c"}]),
    ]
    assert extract_text(messages) == ["hello", "", "a", '{"k":1}', "bc"]


def test_extract_text_of_nothing() -> None:
    assert extract_text([]) == []


def test_extract_text_matches_text_property() -> None:
    messages = conversation()
    assert extract_text(messages) == [message.text for message in messages]
    assert len(extract_text(messages)) == len(messages)


# last_message ------------------------------------------------------------------------------


def test_last_message() -> None:
    messages = conversation()
    assert last_message(messages) is messages[-1]
    assert last_message([messages[0]]) is messages[0]


def test_last_message_of_nothing_is_none() -> None:
    assert last_message([]) is None


# split_system ------------------------------------------------------------------------------


def test_split_system_joins_every_system_text() -> None:
    messages = conversation()
    system, rest = split_system(messages)
    assert system == "You are terse.\n\nBe brief."
    assert rest == [m for m in messages if m.role != "system"]
    assert len(rest) == 8
    assert all(not m.is_system for m in rest)


def test_split_system_without_system_is_none() -> None:
    messages = [Message.user("u"), Message.assistant("a")]
    system, rest = split_system(messages)
    assert system is None
    assert rest == messages


def test_split_system_of_nothing() -> None:
    assert split_system([]) == (None, [])


def test_split_system_single_system_message() -> None:
    system, rest = split_system([Message.system("only")])
    assert system == "only"
    assert rest == []


def test_split_system_empty_system_text_is_not_none() -> None:
    system, rest = split_system([Message.system(""), Message.user("u")])
    assert system == ""
    assert [m.text for m in rest] == ["u"]


def test_split_system_uses_text_of_part_lists() -> None:
    system, _ = split_system(
        [
            Message.system([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]),
            Message.system("c"),
        ]
    )
    assert system == "ab\n\nc"


@given(st.lists(st.tuples(st.booleans(), st.text(max_size=5)), max_size=12))
def test_split_system_matches_naive(spec: list[tuple[bool, str]]) -> None:
    messages = [
        Message.system(text) if is_system else Message.user(text) for is_system, text in spec
    ]
    system, rest = split_system(messages)
    system_texts = [text for is_system, text in spec if is_system]
    assert system == ("\n\n".join(system_texts) if system_texts else None)
    assert rest == [m for m in messages if not m.is_system]


# Seed examples from "When you would reach for a transcript" ----------------------------------


def flight_run() -> list[Message]:
    """The transcript of an agent that burned its budget on repeated searches."""
    messages = [
        Message.system("You book flights."),
        Message.user("Find and book a flight"),
    ]
    calls = [
        ("s1", "search_flights", {"from": "CDG", "to": "JFK"}),
        ("s2", "search_flights", {"from": "CDG", "to": "JFK"}),
        ("s3", "search_flights", {"from": "CDG", "to": "JFK"}),
        ("b1", "book_flight", {"flight": "AF22"}),
    ]
    for call_id, name, arguments in calls:
        messages.append(Message.assistant(tool_calls=[ToolCall(call_id, name, arguments)]))
        messages.append(Message.tool(call_id, {"ok": True}, name=name))
    return messages


def render(messages: list[Message]) -> str:
    """The ChatView.render/1 example: drop the system prompt and the tool plumbing."""
    return "\n\n".join(
        f"{message.role}: {message.text}"
        for message in messages
        if not message.is_system and not message.is_tool_related
    )


def test_render_a_conversation() -> None:
    assert render(conversation()) == (
        "user: Weather in Paris and Rome?\n\nassistant: Paris 18C, Rome 25C.\n\nuser: Thanks"
    )


def test_render_keeps_assistant_text_without_tool_calls_only() -> None:
    messages = [
        Message.system("s"),
        Message.user("hi"),
        Message.assistant("calling", tool_calls=[ToolCall("c", "f", {})]),
        Message.tool("c", "r"),
        Message.assistant("done"),
    ]
    assert render(messages) == "user: hi\n\nassistant: done"


def test_export_a_run(tmp_path: Path) -> None:
    # Enum.map(result.all_messages, &%{role:, content: extract_text, tool_calls:, at:})
    # then File.write!("run.json", JSON.encode!(export)).
    messages = conversation()
    export = [
        {
            "role": message.role,
            "content": message.text,
            "tool_calls": [
                {
                    "id": call.id,
                    "name": call.name,
                    "arguments": call.arguments
                    if isinstance(call.arguments, str)
                    else dict(call.arguments),
                }
                for call in message.tool_calls
            ],
            "at": message.created_at,
        }
        for message in messages
    ]
    path = tmp_path / "run.json"
    path.write_bytes(orjson.dumps(export))

    loaded = orjson.loads(path.read_bytes())
    assert [item["role"] for item in loaded] == [str(message.role) for message in messages]
    assert loaded[0]["role"] == "system"
    assert [item["content"] for item in loaded] == extract_text(messages)
    assert loaded[2]["tool_calls"] == [
        {"id": "c1", "name": "get_weather", "arguments": {"city": "Paris"}},
        {"id": "c2", "name": "get_weather", "arguments": {"city": "Rome"}},
    ]
    assert loaded[8]["tool_calls"] == [{"id": "c3", "name": "log_visit", "arguments": '{"n":1}'}]
    assert [datetime.fromisoformat(item["at"]) for item in loaded] == [
        message.created_at for message in messages
    ]
