"""The pydantic-ai conversation store: NousConversationStore.

pydantic-ai 2.68.0 ships a storage interface (``pydantic_ai.conversation_store``) but no contract
test suite for it (its source distribution has no tests). So the behaviours its docstrings
promise are checked here on pydantic-ai's own ``InMemoryConversationStore`` (the reference) and
on ours over the memory, SQLite and PostgreSQL stores (when NOUS_SESSION_TEST_POSTGRES is set),
on asyncio and trio: a behaviour test that the reference does not pass is not the contract. Then
what is ours only: real agent runs with tool calls (pydantic-ai's ``TestModel`` and
``FunctionModel``, offline; pydantic-ai runs agents on asyncio only, it calls
``asyncio.get_running_loop``), the exact ``ModelMessagesTypeAdapter`` round trip after reopening a
SQLite file, the events and the surface, and two writers.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

pytest.importorskip("pydantic_ai")

from pydantic_ai import Agent
from pydantic_ai.conversation import Conversation
from pydantic_ai.conversation_store import (
    ConversationConflict,
    ConversationStore,
    InMemoryConversationStore,
)
from pydantic_ai.exceptions import UserError
from pydantic_ai.messages import (
    BinaryContent,
    BinaryImage,
    FilePart,
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel
from pydantic_ai.usage import RunUsage

from nous_session import ConflictError, EventType, Role, SessionActor, open_store
from nous_session.actor import SessionActor as Actor
from nous_session.integrations.pydantic_ai import (
    DELETED_EVENT,
    ENTRY_EVENT,
    RECORD_EVENT,
    NousConversationStore,
    entry_messages,
)
from nous_session.stores.base import Store

POSTGRES = os.environ.get("NOUS_SESSION_TEST_POSTGRES", "")
ASYNCIO_ONLY = pytest.mark.parametrize(
    "anyio_backend", [pytest.param(("asyncio", {"use_uvloop": False}), id="asyncio")]
)

Opener = Callable[[], AbstractAsyncContextManager[ConversationStore]]


def user(text: str) -> ModelRequest:
    return ModelRequest.user_text_prompt(text)


def reply(text: str) -> ModelResponse:
    return ModelResponse(parts=[TextPart(text)])


def texts(messages: list[ModelMessage]) -> list[str]:
    out = []
    for message in messages:
        for part in message.parts:
            content = getattr(part, "content", None)
            if isinstance(content, str):
                out.append(content)
    return out


@pytest.fixture
def postgres_urls() -> Iterator[Callable[[], str]]:
    if not POSTGRES:
        pytest.skip("no PostgreSQL server: set NOUS_SESSION_TEST_POSTGRES=postgresql://...")
    psycopg = pytest.importorskip("psycopg")
    schemas: list[str] = []

    def url() -> str:
        schemas.append(f"t_{uuid.uuid4().hex[:16]}")
        return f"{POSTGRES}?schema={schemas[-1]}"

    yield url
    with psycopg.connect(POSTGRES, autocommit=True) as connection:
        for schema in schemas:
            connection.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


@pytest.fixture(params=["reference", "memory", "sqlite", "postgres"])
def opener(request: pytest.FixtureRequest, tmp_path: Path) -> Opener:
    """Opens a conversation store over the same storage each time it is called."""
    kind = request.param
    if kind == "reference":
        reference = InMemoryConversationStore()

        @asynccontextmanager
        async def open_reference() -> AsyncIterator[ConversationStore]:
            yield reference

        return open_reference
    if kind == "memory":
        memory: Store = open_store("memory:")

        @asynccontextmanager
        async def open_memory() -> AsyncIterator[ConversationStore]:
            async with NousConversationStore.open(memory) as store:
                yield store

        return open_memory
    if kind == "sqlite":
        url = f"sqlite:///{tmp_path / 'conversations.sqlite3'}"
    else:
        url = request.getfixturevalue("postgres_urls")()

    @asynccontextmanager
    async def open_url() -> AsyncIterator[ConversationStore]:
        async with NousConversationStore.open(url) as store:
            yield store

    return open_url


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'conversations.sqlite3'}"


@pytest.fixture(params=["sqlite", "postgres"])
def shared_url(request: pytest.FixtureRequest, sqlite_url: str) -> str:
    """A store two NousConversationStores (as two processes would) open each on its own."""
    if request.param == "sqlite":
        return sqlite_url
    return request.getfixturevalue("postgres_urls")()  # type: ignore[no-any-return]


# The store contract's behaviours, on the reference and on ours ------------------------------------


@pytest.mark.anyio
async def test_a_saved_conversation_loads_back_equal_with_a_revision(opener: Opener) -> None:
    async with opener() as store:
        assert await store.load("c") is None
        conversation = Conversation(conversation_id="c", messages=[user("hi"), reply("hello")])
        entries = await store.save(conversation)
        assert [entry.message for entry in entries] == conversation.messages
        assert entries[0].parent_id is None
        assert entries[1].parent_id == entries[0].id
        assert conversation.revision is not None
    async with opener() as store:  # reopened: a SQLite file, a PostgreSQL schema
        loaded = await store.load("c")
        assert loaded is not None
        assert loaded.messages == conversation.messages
        assert loaded.revision == conversation.revision
        assert loaded.new_message_index == 2
        assert [entry.id for entry in await store.load_entries("c") or []] == [
            entry.id for entry in entries
        ]


@pytest.mark.anyio
async def test_a_save_appends_only_the_new_messages(opener: Opener) -> None:
    async with opener() as store:
        conversation = Conversation(conversation_id="c", messages=[user("one"), reply("two")])
        first = await store.save(conversation)
        first_revision = conversation.revision
        conversation.messages.extend([user("three"), reply("four")])
        second = await store.save(conversation)
        assert [entry.message for entry in second] == conversation.messages[2:]
        assert second[0].parent_id == first[-1].id
        assert conversation.revision not in (None, first_revision)
        assert await store.save(conversation) == []  # nothing new
        stored = await store.load_entries("c")
        assert stored is not None
        assert [entry.id for entry in stored] == [entry.id for entry in [*first, *second]]
        window = await store.load("c", limit=3)
        assert window is not None
        assert texts(window.messages) == ["two", "three", "four"]
        window.messages.append(user("five"))
        await store.save(window)  # appends to the whole conversation, not the window
        whole = await store.load("c")
        assert whole is not None
        assert texts(whole.messages) == ["one", "two", "three", "four", "five"]
        with pytest.raises(UserError):
            await store.load("c", limit=-1)


@pytest.mark.anyio
async def test_a_save_over_another_writers_save_conflicts_and_stores_nothing(
    opener: Opener,
) -> None:
    async with opener() as store:
        await store.save(Conversation(conversation_id="c", messages=[user("hi")]))
        mine = await store.load("c")
        theirs = await store.load("c")
        assert mine is not None
        assert theirs is not None
        theirs.messages.append(reply("theirs"))
        await store.save(theirs)
        mine.messages.append(reply("mine"))
        with pytest.raises(ConversationConflict) as raised:
            await store.save(mine)
        assert raised.value.conversation_id == "c"
        stored = await store.load("c")
        assert stored is not None
        assert texts(stored.messages) == ["hi", "theirs"]
        # A conversation that was not loaded cannot be saved over one that exists.
        with pytest.raises(ConversationConflict):
            await store.save(Conversation(conversation_id="c", messages=[user("new")]))
        # Loading again and retrying lands.
        again = await store.load("c")
        assert again is not None
        again.messages.append(reply("mine"))
        await store.save(again)
        stored = await store.load("c")
        assert stored is not None
        assert texts(stored.messages) == ["hi", "theirs", "mine"]


@pytest.mark.anyio
async def test_a_deleted_conversation_no_longer_loads_lists_or_takes_an_old_copy(
    opener: Opener,
) -> None:
    async with opener() as store:
        await store.save(Conversation(conversation_id="c", messages=[user("hi")]))
        await store.save(Conversation(conversation_id="d", messages=[user("other")]))
        stale = await store.load("c")
        assert stale is not None
        await store.delete("c")
        await store.delete("c")  # deleting what is gone is no error
        assert await store.load("c") is None
        assert [record.conversation_id for record in await store.list_conversations()] == ["d"]
        stale.messages.append(reply("late"))
        with pytest.raises(ConversationConflict):
            await store.save(stale)
        # Created again under the same id: a new revision, and the old copy still cannot land.
        fresh = Conversation(conversation_id="c", messages=[user("again")])
        await store.save(fresh)
        assert fresh.revision != stale.revision
        with pytest.raises(ConversationConflict):
            await store.save(stale)
        loaded = await store.load("c")
        assert loaded is not None
        assert texts(loaded.messages) == ["again"]


@pytest.mark.anyio
async def test_branch_keeps_the_history_it_leaves_and_can_branch_back(opener: Opener) -> None:
    async with opener() as store:
        conversation = Conversation(
            conversation_id="c", messages=[user("q"), reply("a1"), user("more"), reply("a2")]
        )
        entries = await store.save(conversation)
        assert conversation.revision is not None
        with pytest.raises(ConversationConflict):
            await store.branch("c", at=1, expected_revision="not-the-revision")
        with pytest.raises(UserError):
            await store.branch("c", at=9, expected_revision=conversation.revision)
        branched = await store.branch("c", at=1, expected_revision=conversation.revision)
        assert texts(branched.messages) == ["q"]
        branched.messages.append(reply("b1"))
        await store.save(branched)
        loaded = await store.load("c")
        assert loaded is not None
        assert texts(loaded.messages) == ["q", "b1"]
        record = await store.read_record("c")
        assert record is not None
        assert record.branches == [entries[-1].id]
        back = await store.branch("c", from_entry=entries[-1].id, expected_revision=loaded.revision)
        assert texts(back.messages) == ["q", "a1", "more", "a2"]
        record = await store.read_record("c")
        assert record is not None
        assert record.head_id == entries[-1].id
        assert len(record.branches) == 1  # the b1 branch, left now
        with pytest.raises(UserError):
            await store.branch("missing", at=0, expected_revision=None)


@pytest.mark.anyio
async def test_a_rewritten_history_is_stored_as_a_branch(opener: Opener) -> None:
    async with opener() as store:
        conversation = Conversation(conversation_id="c", messages=[user("one"), reply("two")])
        entries = await store.save(conversation)
        loaded = await store.load("c")
        assert loaded is not None
        rewritten = Conversation(
            conversation_id="c",
            messages=[loaded.messages[0], reply("TWO")],  # a message is its timestamp too
            revision=loaded.revision,
        )
        new = await store.save(rewritten)
        assert [entry.parent_id for entry in new] == [entries[0].id]
        record = await store.read_record("c")
        assert record is not None
        assert record.branches == [entries[-1].id]
        reloaded = await store.load("c")
        assert reloaded is not None
        assert texts(reloaded.messages) == ["one", "TWO"]


@pytest.mark.anyio
async def test_fork_starts_a_conversation_that_shares_the_entries(opener: Opener) -> None:
    async with opener() as store:
        conversation = Conversation(
            conversation_id="c", messages=[user("q"), reply("a"), user("q2"), reply("a2")]
        )
        entries = await store.save(conversation)
        fork = await store.fork("c", at=2, new_conversation_id="f")
        assert texts(fork.messages) == ["q", "a"]
        assert fork.revision is not None
        shared = await store.load_entries("f")
        assert shared is not None
        assert [entry.id for entry in shared] == [entry.id for entry in entries[:2]]
        record = await store.read_record("f")
        assert record is not None
        assert (record.forked_from, record.forked_at) == ("c", entries[1].id)
        fork.messages.append(user("fork's own"))
        await store.save(fork)
        original = await store.load("c")
        forked = await store.load("f")
        assert original is not None
        assert forked is not None
        assert texts(original.messages) == ["q", "a", "q2", "a2"]
        assert texts(forked.messages) == ["q", "a", "fork's own"]
        whole = await store.fork("c")  # all of it, a new id
        assert whole.conversation_id not in ("c", "f")
        assert texts(whole.messages) == ["q", "a", "q2", "a2"]
        empty = await store.fork("c", at=0, new_conversation_id="e")
        assert empty.messages == []
        with pytest.raises(ConversationConflict):
            await store.fork("c", new_conversation_id="f")
        with pytest.raises(UserError):
            await store.fork("missing")
        # A fork of a fork, from a branch the source left.
        assert original.revision is not None
        branched = await store.branch("c", at=1, expected_revision=original.revision)
        branched.messages.append(reply("other"))
        await store.save(branched)
        again = await store.fork("c", from_entry=entries[-1].id, new_conversation_id="g")
        assert texts(again.messages) == ["q", "a", "q2", "a2"]
        deeper = await store.fork("f", new_conversation_id="h")
        assert texts(deeper.messages) == ["q", "a", "fork's own"]
    async with opener() as store:  # reopened: every history is read from the store
        for conversation_id, expected in [
            ("c", ["q", "other"]),
            ("f", ["q", "a", "fork's own"]),
            ("g", ["q", "a", "q2", "a2"]),
            ("h", ["q", "a", "fork's own"]),
        ]:
            loaded = await store.load(conversation_id)
            assert loaded is not None
            assert texts(loaded.messages) == expected, conversation_id


@pytest.mark.anyio
async def test_list_conversations_newest_first_by_scope_and_limit(opener: Opener) -> None:
    async with opener() as store:
        await store.save(Conversation(conversation_id="a", messages=[user("1")]), scope="u1")
        await store.save(Conversation(conversation_id="b", messages=[user("2")]), scope="u2")
        await store.save(Conversation(conversation_id="c", messages=[user("3")]), scope="u1")
        listed = [record.conversation_id for record in await store.list_conversations()]
        assert listed == ["c", "b", "a"]
        assert [r.conversation_id for r in await store.list_conversations(scope="u1")] == [
            "c",
            "a",
        ]
        assert [r.conversation_id for r in await store.list_conversations(limit=1)] == ["c"]
        assert await store.list_conversations(limit=0) == []
        with pytest.raises(UserError):
            await store.list_conversations(limit=-1)


@pytest.mark.anyio
async def test_scope_keeps_a_conversation_to_its_owner(opener: Opener) -> None:
    async with opener() as store:
        conversation = Conversation(conversation_id="c", messages=[user("mine")])
        await store.save(conversation, scope="alice")
        assert await store.load("c", scope="bob") is None
        assert await store.load_entries("c", scope="bob") is None
        assert await store.load("c", scope="alice") is not None
        conversation.messages.append(reply("x"))
        with pytest.raises(ConversationConflict):
            await store.save(conversation, scope="bob")
        await store.delete("c", scope="bob")  # left as it is
        assert await store.load("c") is not None
        await store.save(conversation)  # the scope it was saved with
        record = await store.read_record("c")
        assert record is not None
        assert record.scope == "alice"


@pytest.mark.anyio
async def test_the_record_carries_usage_and_entries_read_by_id(opener: Opener) -> None:
    async with opener() as store:
        usage = RunUsage(requests=2, input_tokens=30, output_tokens=7, tool_calls=1)
        conversation = Conversation(conversation_id="c", messages=[user("hi")], usage=usage)
        entries = await store.save(conversation)
    async with opener() as store:  # reopened: the entry's conversation is looked up
        loaded = await store.load("c")
        assert loaded is not None
        assert loaded.usage == usage
        assert await store.read_entry(entries[0].id) == entries[0]
        with pytest.raises(KeyError):
            await store.read_entry("no-such-entry")


def binary_messages() -> list[ModelMessage]:
    """Files of every class, where messages hold them: a plain BinaryContent of an image (whose
    JSON is a BinaryImage's), a BinaryImage, a BinaryContent of audio."""
    png, wav = b"\x89PNG\r\n", b"RIFF"
    return [
        ModelRequest(
            parts=[
                UserPromptPart(
                    content=[
                        "Look:",
                        BinaryContent(data=png, media_type="image/png"),
                        BinaryImage(data=png, media_type="image/png", identifier="mine"),
                        BinaryContent(data=wav, media_type="audio/wav"),
                    ]
                )
            ]
        ),
        ModelResponse(parts=[FilePart(content=BinaryContent(data=png, media_type="image/jpeg"))]),
        ModelRequest(
            parts=[
                ToolReturnPart(
                    tool_name="draw",
                    tool_call_id="call-1",
                    content=["done", {"image": BinaryContent(data=png, media_type="image/png")}],
                )
            ]
        ),
    ]


@pytest.mark.anyio
async def test_files_load_back_as_the_classes_they_were_saved_as(opener: Opener) -> None:
    messages = binary_messages()
    async with opener() as store:
        await store.save(Conversation(conversation_id="c", messages=messages))
    async with opener() as store:
        loaded = await store.load("c")
        assert loaded is not None
        assert loaded.messages == messages
        prompt = loaded.messages[0].parts[0]
        assert isinstance(prompt, UserPromptPart)
        assert [type(item).__name__ for item in prompt.content] == [
            "str",
            "BinaryContent",
            "BinaryImage",
            "BinaryContent",
        ]
        # A fork copies the entries as they were saved.
        fork = await store.fork("c", new_conversation_id="f")
        assert fork.messages == messages
        forked = await store.load("f")
        assert forked is not None
        assert forked.messages == messages


# Ours: agent runs, the events, the surface, the writers ------------------------------------------


def agent_with_tools() -> Agent[None, str]:
    agent: Agent[None, str] = Agent(TestModel())

    @agent.tool_plain
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        return a + b

    @agent.tool_plain
    def weather(city: str) -> dict[str, Any]:
        """The weather in a city."""
        return {"city": city, "celsius": 18}

    return agent


@ASYNCIO_ONLY
@pytest.mark.anyio
async def test_an_agent_run_with_tool_calls_round_trips_exactly_through_a_sqlite_file(
    sqlite_url: str,
) -> None:
    agent = agent_with_tools()
    async with NousConversationStore.open(sqlite_url) as store:
        conversation = await store.load("chat") or Conversation(conversation_id="chat")
        first = await agent.run("What is the weather?", conversation=conversation)
        await store.save(first)
        second = await agent.run("And again", conversation=first.conversation)
        await store.save(second)
        history = second.all_messages()
        assert any(isinstance(part, ToolCallPart) for message in history for part in message.parts)
    async with NousConversationStore.open(sqlite_url) as store:
        loaded = await store.load("chat")
        assert loaded is not None
        assert loaded.messages == history
        assert ModelMessagesTypeAdapter.dump_json(
            loaded.messages
        ) == ModelMessagesTypeAdapter.dump_json(history)
        # message_history= takes them back as they came.
        third = await agent.run("Once more", message_history=loaded.messages)
        assert third.all_messages()[: len(history)] == history
        # A run continued from the loaded conversation saves just what it added.
        fourth = await agent.run("Last", conversation=loaded)
        added = await store.save(fourth)
        assert [entry.message for entry in added] == fourth.new_messages()
        final = await store.load("chat")
        assert final is not None
        assert final.messages == fourth.all_messages()


@ASYNCIO_ONLY
@pytest.mark.anyio
async def test_a_function_model_run_is_on_the_surface_with_its_tool_calls() -> None:
    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if len(messages) == 1:
            return ModelResponse(
                parts=[
                    TextPart("Let me look."),
                    ToolCallPart("weather", {"city": "Paris"}, tool_call_id="call_1"),
                ]
            )
        return ModelResponse(parts=[TextPart("18 degrees in Paris.")])

    agent: Agent[None, str] = Agent(FunctionModel(model), system_prompt="Be terse.")

    @agent.tool_plain
    def weather(city: str) -> dict[str, Any]:
        """The weather in a city."""
        return {"city": city, "celsius": 18}

    async with NousConversationStore.open() as store:
        result = await agent.run(
            "Weather in Paris?", conversation=Conversation(conversation_id="w")
        )
        entries = await store.save(result)
        async with store.session("w") as session:
            surface = list(session.messages())
            events = session.log.events()
    assert [(m.role, m.text) for m in surface] == [
        (Role.SYSTEM, "Be terse."),
        (Role.USER, "Weather in Paris?"),
        (Role.ASSISTANT, "Let me look."),
        (Role.TOOL, '{"city":"Paris","celsius":18}'),
        (Role.ASSISTANT, "18 degrees in Paris."),
    ]
    call = surface[2].tool_calls[0]
    assert (call.id, call.name, dict(call.arguments)) == ("call_1", "weather", {"city": "Paris"})
    assert surface[3].tool_call_id == "call_1"
    assert surface[3].name == "weather"
    assert [m.metadata["pydantic_ai_entry"] for m in surface] == [
        entries[0].id,
        entries[0].id,
        entries[1].id,
        entries[2].id,
        entries[3].id,
    ]
    # Each message once, as an entry event; the record last, in the same commit.
    types = [event.type for event in events]
    assert types.count(ENTRY_EVENT) == len(entries) == 4
    assert types[-1] == RECORD_EVENT
    assert result.conversation.revision == str(len(events))  # the session's count


@ASYNCIO_ONLY
@pytest.mark.anyio
async def test_pydantic_ais_own_ui_adapter_keeps_a_server_held_chat_in_our_store() -> None:
    """pydantic-ai's Vercel AI adapter loads, runs and saves each turn through the store."""
    httpx = pytest.importorskip("httpx")
    starlette_routing = pytest.importorskip("starlette.routing")
    from pydantic_ai.ui.vercel_ai import VercelAIAdapter
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response

    agent = agent_with_tools()
    async with NousConversationStore.open() as store:

        async def chat(request: Request) -> Response:
            return await VercelAIAdapter.dispatch_request(
                request,
                agent=agent,
                conversation_store=store,
                conversation_scope=request.headers["x-user"],
            )

        app = Starlette(routes=[starlette_routing.Route("/chat", chat, methods=["POST"])])
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:

            async def turn(index: int, text: str, user_name: str) -> Any:
                body = {
                    "trigger": "submit-message",
                    "id": "chat-1",
                    "messages": [
                        {
                            "id": f"m{index}",
                            "role": "user",
                            "parts": [{"type": "text", "text": text}],
                        }
                    ],
                }
                return await client.post("/chat", json=body, headers={"x-user": user_name})

            first = await turn(0, "What is 0 + 0?", "alice")
            assert first.status_code == 200
            assert "tool-input-available" in first.text
            assert (await turn(1, "And again?", "alice")).status_code == 200
            assert (await turn(2, "Not yours", "bob")).status_code == 404
        loaded = await store.load("chat-1", scope="alice")
        assert loaded is not None
        assert texts(loaded.messages)[:1] == ["What is 0 + 0?"]
        assert "And again?" in texts(loaded.messages)
        assert "Not yours" not in texts(loaded.messages)
        async with store.session("chat-1") as session:
            surface = list(session.messages())
        expected = [m for message in loaded.messages for m in entry_messages(message)]
        assert [(m.role, m.text) for m in surface] == [(m.role, m.text) for m in expected]
        assert [m.role for m in surface].count(Role.TOOL) == 2  # both tools, called once


@pytest.mark.anyio
async def test_the_surface_follows_branches_forks_and_deletes() -> None:
    async with NousConversationStore.open() as store:
        conversation = Conversation(
            conversation_id="c", messages=[user("q"), reply("a"), user("q2"), reply("a2")]
        )
        await store.save(conversation)
        assert conversation.revision is not None

        async def shown(conversation_id: str) -> list[str | None]:
            async with store.session(conversation_id) as session:
                return [message.text for message in session.messages()]

        assert await shown("c") == ["q", "a", "q2", "a2"]
        branched = await store.branch("c", at=2, expected_revision=conversation.revision)
        assert await shown("c") == ["q", "a"]
        branched.messages.append(user("other"))
        await store.save(branched)
        assert await shown("c") == ["q", "a", "other"]
        await store.fork("c", at=1, new_conversation_id="f")
        assert await shown("f") == ["q"]
        await store.delete("c")
        assert await shown("c") == []
        async with store.session("c") as session:  # nothing erased
            types = [event.type for event in session.log.events()]
        assert types.count(ENTRY_EVENT) == 5
        assert types[-2:] == [DELETED_EVENT, EventType.REMOVE]


@pytest.mark.anyio
async def test_other_events_in_the_session_do_not_move_the_revision() -> None:
    """The revision is the count at the record's commit: an application's own events in the
    session (custom events, a message on the surface) are no conflict."""
    async with NousConversationStore.open() as store:
        await store.save(Conversation(conversation_id="c", messages=[user("hi")]))
        loaded = await store.load("c")
        assert loaded is not None
        async with store.session("c") as session:
            await session.append("x.myapp.note", {"seen": True})
        loaded.messages.append(reply("hello"))
        await store.save(loaded)
        again = await store.load("c")
        assert again is not None
        assert texts(again.messages) == ["hi", "hello"]
        assert again.revision == loaded.revision
        async with store.session("c") as session:
            assert [m.text for m in session.messages()] == ["hi", "hello"]
            assert session.log.count == int(again.revision or 0)


@pytest.mark.anyio
async def test_entries_survive_a_snapshot_and_reopening(sqlite_url: str) -> None:
    async with NousConversationStore.open(sqlite_url) as store:
        conversation = Conversation(
            conversation_id="c", messages=[user("q"), reply("a"), user("q2"), reply("a2")]
        )
        await store.save(conversation)
        assert conversation.revision is not None
        branched = await store.branch("c", at=1, expected_revision=conversation.revision)
        branched.messages.append(reply("b"))
        await store.save(branched)
        async with store.session("c") as session:
            await session.snapshot()  # drops what is off the surface; custom events stay
    async with NousConversationStore.open(sqlite_url) as store:
        loaded = await store.load("c")
        assert loaded is not None
        assert texts(loaded.messages) == ["q", "b"]
        record = await store.read_record("c")
        assert record is not None
        back = await store.branch(
            "c", from_entry=record.branches[-1], expected_revision=loaded.revision
        )
        assert texts(back.messages) == ["q", "a", "q2", "a2"]


@pytest.mark.anyio
async def test_two_stores_on_one_database_conflict_instead_of_overwriting(
    shared_url: str,
) -> None:
    async with (
        NousConversationStore.open(shared_url) as one,
        NousConversationStore.open(shared_url) as two,
    ):
        await one.save(Conversation(conversation_id="c", messages=[user("hi")]))
        mine = await one.load("c")
        theirs = await two.load("c")
        assert mine is not None
        assert theirs is not None
        theirs.messages.append(reply("theirs"))
        await two.save(theirs)
        mine.messages.append(reply("mine"))
        with pytest.raises(ConversationConflict):
            await one.save(mine)
        loaded = await one.load("c")
        assert loaded is not None
        assert texts(loaded.messages) == ["hi", "theirs"]


@pytest.mark.anyio
async def test_another_process_committing_between_check_and_commit_is_a_conflict(
    shared_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store's ConflictError (the count moved under our commit) becomes the check again,
    which finds the other writer's revision: ConversationConflict, and nothing of ours stored."""
    async with (
        NousConversationStore.open(shared_url) as one,
        NousConversationStore.open(shared_url) as two,
    ):
        await one.save(Conversation(conversation_id="c", messages=[user("hi")]))
        mine = await one.load("c")
        theirs = await two.load("c")
        assert mine is not None
        assert theirs is not None
        theirs.messages.append(reply("theirs"))
        mine.messages.append(reply("mine"))
        reload, append_many, write_record = Actor.reload, Actor.append_many, one.write_record
        steps: list[str] = []

        async def write_record_marked(*args: Any, **kwargs: Any) -> None:
            steps.append("write_record")
            await write_record(*args, **kwargs)

        async def reload_then_let_them_commit(actor: SessionActor) -> Any:
            log = await reload(actor)
            if actor.store is one.store and steps == ["write_record"]:
                await two.save(theirs)  # lands after our check read the log: count moved
                steps.append("theirs saved")
            return log

        async def append_many_noting_conflicts(
            actor: SessionActor, *args: Any, **kwargs: Any
        ) -> Any:
            try:
                return await append_many(actor, *args, **kwargs)
            except ConflictError:
                steps.append("ConflictError")
                raise

        monkeypatch.setattr(one, "write_record", write_record_marked)
        monkeypatch.setattr(Actor, "reload", reload_then_let_them_commit)
        monkeypatch.setattr(Actor, "append_many", append_many_noting_conflicts)
        with pytest.raises(ConversationConflict):
            await one.save(mine)
        # Our check passed on the log read before their save; the store refused our commit;
        # the check ran again on the caught-up log and found their revision.
        assert steps == ["write_record", "theirs saved", "ConflictError"]
        monkeypatch.undo()
        loaded = await one.load("c")
        assert loaded is not None
        assert texts(loaded.messages) == ["hi", "theirs"]


@pytest.mark.anyio
async def test_conversations_beyond_max_open_close_and_reopen_from_the_store(
    sqlite_url: str,
) -> None:
    async with NousConversationStore.open(sqlite_url, max_open=1) as store:
        for name in ("a", "b", "c"):
            await store.save(Conversation(conversation_id=name, messages=[user(name)]))
        for name in ("a", "b", "c"):
            loaded = await store.load(name)
            assert loaded is not None
            assert texts(loaded.messages) == [name]
            loaded.messages.append(reply(name.upper()))
            await store.save(loaded)
        async with store.session("a") as held, store.session("b") as other:
            assert held.messages()[-1].text == "A"  # both held open past max_open
            assert other.messages()[-1].text == "B"
        assert [r.conversation_id for r in await store.list_conversations()] == ["c", "b", "a"]
    with pytest.raises(ValueError, match="max_open"):
        async with NousConversationStore.open(max_open=0):
            pass  # pragma: no cover


@pytest.mark.anyio
async def test_concurrent_saves_of_one_loaded_copy_land_once(opener: Opener) -> None:
    async with opener() as store:
        await store.save(Conversation(conversation_id="c", messages=[user("hi")]))
        copies = [await store.load("c") for _ in range(5)]
        outcomes: list[str] = []

        async def save(copy: Conversation | None, index: int) -> None:
            assert copy is not None
            copy.messages.append(reply(f"r{index}"))
            try:
                await store.save(copy)
                outcomes.append("saved")
            except ConversationConflict:
                outcomes.append("conflict")

        async with anyio.create_task_group() as group:
            for index, copy in enumerate(copies):
                group.start_soon(save, copy, index)
        assert sorted(outcomes) == ["conflict"] * 4 + ["saved"]
        loaded = await store.load("c")
        assert loaded is not None
        assert len(loaded.messages) == 2


def test_entry_messages_show_requests_and_responses() -> None:
    request = user("hello")
    assert [(m.role, m.text) for m in entry_messages(request, "e1")] == [(Role.USER, "hello")]
    assert entry_messages(ModelResponse(parts=[]), "e2") == []
    call = ModelResponse(parts=[ToolCallPart("f", '{"x": 1}', tool_call_id="c1")])
    (message,) = entry_messages(call)
    assert message.tool_calls[0].arguments == '{"x": 1}'
    assert "pydantic_ai_entry" not in message.metadata


def test_the_store_is_opened_with_open() -> None:
    with pytest.raises(TypeError):
        NousConversationStore(
            object(),
            store=open_store("memory:"),
            task_group=None,  # type: ignore[arg-type]
            session_prefix="",
            max_open=1,
        )


@pytest.mark.parametrize(
    ("blocked", "module", "extra"),
    [
        ("pydantic,pydantic_ai", "nous_session.integrations.pydantic_ai", "pydantic-ai"),
        ("agents", "nous_session.integrations.openai_agents", "openai-agents"),
        ("langgraph", "nous_session.integrations.langgraph", "langgraph"),
        ("google.adk,google", "nous_session.integrations.google_adk", "google-adk"),
    ],
)
def test_an_adapter_without_its_extra_names_the_install(
    blocked: str, module: str, extra: str
) -> None:
    """Each adapter's import, without its framework, says which extra to install (the
    pydantic-ai adapter raised a bare ``No module named 'pydantic'``)."""
    script = (
        "import importlib, sys\n"
        f"for name in {blocked.split(',')!r}:\n"
        "    sys.modules[name] = None  # importing it raises ImportError, as without the extra\n"
        f"importlib.import_module({module!r})\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode != 0
    assert f"pip install 'nous_session[{extra}]'" in result.stderr, result.stderr
