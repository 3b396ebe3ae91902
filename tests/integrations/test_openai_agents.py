"""nous_session.integrations.openai_agents: the openai-agents Session over nous_session.

The SDK's own session tests run against NousSession in .ci/openai_agents (`make test`); these
check what only we can see: what the log holds, other writers, other event loops, and a real
``Runner.run`` with a scripted model. The SDK is asyncio-only, so these tests pin asyncio.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from agents import Agent, Runner, function_tool
from agents.items import ModelResponse
from agents.models.interface import Model
from agents.usage import Usage
from hypothesis import given, settings
from hypothesis import strategies as st
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

from nous_session import EventType, InvalidEventError, Message, SessionActor, SessionClosedError
from nous_session.event import message_event
from nous_session.integrations.openai_agents import (
    NousSession,
    item_event,
    item_message,
    message_items,
)
from nous_session.registry import Sessions, SessionsPortal

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    """The SDK runs on asyncio only (its sessions and runner use asyncio's own APIs)."""
    return "asyncio"


ITEMS: list[Any] = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris?"},
    {
        "type": "reasoning",
        "id": "rs_1",
        "summary": [{"type": "summary_text", "text": "look it up"}],
        "encrypted_content": "gAAAA",
    },
    {
        "type": "function_call",
        "call_id": "call_1",
        "name": "weather",
        "arguments": '{"city": "Paris"}',
        "id": "fc_1",
        "status": "completed",
    },
    {"type": "function_call_output", "call_id": "call_1", "output": "18C"},
    {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": "18C in Paris.", "annotations": []}],
    },
    {"type": "web_search_call", "id": "ws_1", "status": "completed", "action": {"type": "x"}},
    {"role": "user", "content": [{"type": "input_text", "text": "thanks"}]},
]


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'agents.sqlite3'}"


def test_every_item_round_trips_alone() -> None:
    for item in ITEMS:
        assert message_items(item_message(item)) == [item]
    with pytest.raises(InvalidEventError, match="dict"):
        item_message(["not", "an", "item"])
    with pytest.raises(TypeError, match="not JSON"):
        item_message({"role": "user", "content": object()})


async def test_items_are_stored_once_each_on_the_surface_and_come_back_exactly(url: str) -> None:
    session = NousSession("chat", url)
    try:
        await session.add_items(ITEMS)
        assert await session.get_items() == ITEMS
        assert await session.get_items(limit=3) == ITEMS[-3:]
        assert await session.get_items(limit=0) == []
    finally:
        session.close()
    # What the log holds: one surface event per item, the neutral messages the formats read.
    async with SessionActor.open(session_id="chat", store=url) as actor:
        assert len(actor.log.events()) == len(ITEMS)
        assert all(event.is_surface for event in actor.log.events())
        texts = [m.text for m in actor.messages()]
        assert texts[1] == "Weather in Paris?"
        assert actor.messages()[3].tool_calls[0].name == "weather"


async def test_items_holding_ints_wider_than_64_bits_come_back_exactly(url: str) -> None:
    """The SDK's SQLiteSession keeps such ints (it stores JSON text); so do we, through a
    real store and a fresh session reading it."""
    wide = [
        {"type": "x_ledger", "id": "l1", "balance": 2**70, "history": [-(2**64), 10**30, 0.5]},
        {"type": "function_call_output", "call_id": "c1", "output": {"n": 2**100}},
    ]
    session = NousSession("wide", url)
    try:
        await session.add_items(wide)
        assert await session.get_items() == wide
    finally:
        session.close()
    again = NousSession("wide", url)
    try:
        got = await again.get_items()
        assert got == wide
        assert type(got[0]["balance"]) is int
        assert await again.pop_item() == wide[-1]
    finally:
        again.close()


async def test_pop_and_clear_are_surface_operations_and_keep_the_log(url: str) -> None:
    session = NousSession("chat", url)
    try:
        await session.add_items(ITEMS)
        assert await session.pop_item() == ITEMS[-1]
        assert await session.get_items() == ITEMS[:-1]
        await session.clear_session()
        assert await session.get_items() == []
        assert await session.pop_item() is None
        await session.add_items([{"role": "user", "content": "again"}])
        assert await session.get_items() == [{"role": "user", "content": "again"}]
    finally:
        session.close()
    async with SessionActor.open(session_id="chat", store=url) as actor:
        types = [event.type for event in actor.log.events()]
        assert types.count(EventType.REMOVE) == 2  # the pop and the clear
        assert len(types) == len(ITEMS) + 3
        # Nothing was lost: rewinding to before the clear shows the popped history again.
        clear_seq = [e.seq for e in actor.log.events() if e.type is EventType.REMOVE][-1]
        await actor.rewind(clear_seq - 1)
        assert len(actor.messages()) == len(ITEMS) - 1


@pytest.mark.parametrize("store", ["memory:", "sqlite"])
async def test_sixty_four_concurrent_pops_each_take_one_item(store: str, url: str) -> None:
    """As many concurrent pop_item() calls as the SDK's own session survives (64): each takes
    one item (past the 32nd they failed with ConflictError, on a memory store too)."""
    session = NousSession("pops", "memory:" if store == "memory:" else url)
    try:
        await session.add_items([{"role": "user", "content": str(i)} for i in range(64)])
        popped = await asyncio.gather(*(session.pop_item() for _ in range(64)))
        assert sorted(int(item["content"]) for item in popped) == list(range(64))  # type: ignore[index]
        assert await session.get_items() == []
    finally:
        session.close()


async def test_a_message_added_by_the_application_reaches_the_sdk_as_items(url: str) -> None:
    async with SessionActor.open(session_id="chat", store=url) as actor:
        await actor.add_message(Message.user("from the app"))
    session = NousSession("chat", url)
    try:
        assert await session.get_items() == [{"role": "user", "content": "from the app"}]
    finally:
        session.close()


async def test_two_sessions_on_one_store_see_each_others_writes_and_pop_atomically(
    url: str,
) -> None:
    first, second = NousSession("shared", url), NousSession("shared", url)
    try:
        await first.add_items([{"role": "user", "content": str(i)} for i in range(20)])
        popped = await asyncio.gather(*(s.pop_item() for s in [first, second] * 10))
        assert sorted(int(item["content"]) for item in popped) == list(range(20))  # type: ignore[index]
        assert await second.get_items() == []
    finally:
        first.close()
        second.close()


async def test_a_session_is_usable_from_other_event_loops_and_threads(url: str) -> None:
    session = NousSession("loops", url)
    try:
        await session.add_items([{"role": "user", "content": "main loop"}])

        def elsewhere() -> None:
            asyncio.run(session.add_items([{"role": "user", "content": "other loop"}]))

        thread = threading.Thread(target=elsewhere)
        thread.start()
        thread.join()
        # This loop's actor has not seen the other loop's write: its append loses to it
        # (ConflictError, the actor catches up) and is tried again, landing after it.
        await session.add_items([{"role": "user", "content": "main loop again"}])
        assert [i["content"] for i in await session.get_items()] == [  # type: ignore[index]
            "main loop",
            "other loop",
            "main loop again",
        ]
        assert isinstance(session.sessions, Sessions)
    finally:
        session.close()


async def test_a_closed_session_refuses_calls_and_a_bad_item_adds_nothing() -> None:
    session = NousSession("closing")
    await session.add_items([{"role": "user", "content": "one"}])
    # A TypeError, as the SDK's SQLiteSession raises (json.dumps), and one of ours.
    with pytest.raises(TypeError, match="item 1") as caught:
        await session.add_items([{"role": "user", "content": "two"}, {"bad": object()}])
    assert isinstance(caught.value, InvalidEventError)
    assert len(await session.get_items()) == 1
    session.close()
    session.close()
    with pytest.raises(SessionClosedError):
        await session.get_items()
    with pytest.raises(ValueError, match="session_id"):
        NousSession("")


async def test_a_portal_of_ones_own_is_shared_and_stays_open() -> None:
    with SessionsPortal("memory:") as portal:
        session = NousSession("mine", sessions=portal)
        await session.add_items([{"role": "user", "content": "hi"}])
        session.close()
        assert not portal.closed
        assert (
            portal.call("mine", lambda actor: _texts(actor)) == ["hi"]  # the same session
        )
    with pytest.raises(ValueError, match="not both"):
        NousSession("x", "memory:", sessions=portal)


async def _texts(actor: SessionActor) -> list[str | None]:
    return [m.text for m in actor.messages()]


async def test_the_compaction_hook_replaces_a_suffix_in_one_event_and_keeps_the_log(
    url: str,
) -> None:
    session = NousSession("compact", url)
    try:
        await session.add_items([{"role": "user", "content": str(i)} for i in range(6)])
        snapshot = await session._get_compaction_snapshot(4)
        assert snapshot is not None
        assert snapshot.items == [{"role": "user", "content": str(i)} for i in range(2, 6)]
        assert not snapshot.complete
        summary = {"role": "user", "content": "[summary of 3..5]"}
        assert await snapshot.replace_suffix(1, [summary])
        assert [i["content"] for i in await session.get_items()] == [  # type: ignore[index]
            "0",
            "1",
            "2",
            "[summary of 3..5]",
        ]
        assert not await snapshot.replace_suffix(1, [summary])  # the suffix changed: nothing
    finally:
        session.close()
    async with SessionActor.open(session_id="compact", store=url) as actor:
        assert len(actor.log.events()) == 7  # six items and one replace; nothing deleted


class RecordingSession(NousSession):
    """A subclass that overrides the item methods, as one keeping an index of its own would:
    it records every call it is given."""

    def __init__(self, session_id: str, store: str) -> None:
        super().__init__(session_id, store)
        self.calls: list[tuple[str, Any]] = []

    async def get_items(self, limit: int | None = None) -> list[Any]:
        self.calls.append(("get_items", limit))
        return await super().get_items(limit)

    async def add_items(self, items: list[Any]) -> None:
        self.calls.append(("add_items", list(items)))
        await super().add_items(items)

    async def clear_session(self) -> None:
        self.calls.append(("clear_session", None))
        await super().clear_session()


class OnlyAddItems(NousSession):
    async def add_items(self, items: list[Any]) -> None:
        await super().add_items(items)


class OnlyInit(NousSession):
    def __init__(self, session_id: str, store: str) -> None:
        super().__init__(session_id, store)
        self.label = "mine"


async def test_a_subclass_overriding_an_item_method_gets_no_compaction_snapshot(url: str) -> None:
    """As the SDK's SQLiteSession does for its subclasses: the snapshot would write the log
    directly, past the subclass's methods. One that leaves them alone keeps it."""
    for cls, kept in ((NousSession, True), (OnlyInit, True), (OnlyAddItems, False)):
        session = cls("snap", url)
        try:
            await session.add_items([{"role": "user", "content": "hi"}])
            snapshot = await session._get_compaction_snapshot(4)
            assert (snapshot is not None) is kept, cls
        finally:
            session.close()


class TextModel(Model):
    """A model that answers with text, under a response id (automatic compaction needs one)."""

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        message = ResponseOutputMessage(
            id="msg_1",
            type="message",
            role="assistant",
            status="completed",
            content=[ResponseOutputText(type="output_text", text="Hello", annotations=[])],
        )
        return ModelResponse(output=[message], usage=Usage(), response_id="resp_1")

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError


class CompactingClient:
    """The part of an AsyncOpenAI client that the SDK's compaction calls."""

    def __init__(self) -> None:
        self.responses = self
        self.calls = 0

    async def compact(self, **kwargs: Any) -> Any:
        self.calls += 1
        return SimpleNamespace(output=[SUMMARY], usage=None)


SUMMARY: dict[str, Any] = {
    "type": "message",
    "role": "user",
    "content": [{"type": "input_text", "text": "[summary]"}],
}


@pytest.mark.parametrize("cls", [NousSession, RecordingSession])
async def test_automatic_compaction_goes_through_a_subclass_item_methods(
    url: str, cls: type[NousSession]
) -> None:
    from agents.memory import OpenAIResponsesCompactionSession

    client = CompactingClient()
    backend = cls("auto", url)
    compacting = OpenAIResponsesCompactionSession(
        "auto",
        backend,
        client=client,  # type: ignore[arg-type]  # only responses.compact is called
        should_trigger_compaction=lambda context: True,
    )
    try:
        await Runner.run(Agent(name="Assistant", model=TextModel()), "Hi!", session=compacting)
        assert client.calls == 1
        assert await backend.get_items() == [SUMMARY]
    finally:
        backend.close()
    async with SessionActor.open(session_id="auto", store=url) as actor:
        kinds = [event.type for event in actor.log.events()]
    if isinstance(backend, RecordingSession):
        # The SDK's path for a session with no snapshot: the compacted output went in through
        # the subclass's add_items, after its clear_session.
        writes = [call for call in backend.calls if call[0] != "get_items"]
        assert writes[-2:] == [("clear_session", None), ("add_items", [SUMMARY])]
        assert kinds[-2:] == [EventType.REMOVE, EventType.USER_MESSAGE]
    else:  # the snapshot's path: one conditional replace event
        assert kinds[-1] == EventType.REPLACE


class ScriptedModel(Model):
    """A model that answers from a script: a tool call first, then text."""

    def __init__(self) -> None:
        self.inputs: list[Any] = []

    async def get_response(self, system_instructions, input, *args, **kwargs):  # type: ignore[no-untyped-def, override]
        self.inputs.append(input)
        turn = len(self.inputs)
        if turn % 2 == 1:
            output: list[Any] = [
                ResponseFunctionToolCall(
                    type="function_call",
                    id=f"fc_{turn}",
                    call_id=f"call_{turn}",
                    name="weather",
                    arguments='{"city": "Paris"}',
                    status="completed",
                )
            ]
        else:
            output = [
                ResponseOutputMessage(
                    id=f"msg_{turn}",
                    type="message",
                    role="assistant",
                    status="completed",
                    content=[ResponseOutputText(type="output_text", text="18C", annotations=[])],
                )
            ]
        return ModelResponse(output=output, usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError


@function_tool
def weather(city: str) -> str:
    """The weather in a city."""
    return f"18C in {city}"


async def test_a_real_runner_run_keeps_its_history_in_nous_session(url: str) -> None:
    model = ScriptedModel()
    agent = Agent(name="Assistant", model=model, tools=[weather])
    session = NousSession("run", url)
    try:
        first = await Runner.run(agent, "Weather in Paris?", session=session)
        assert first.final_output == "18C"
        second = await Runner.run(agent, "And tomorrow?", session=session)
        assert second.final_output == "18C"
        items = await session.get_items()
    finally:
        session.close()
    # The second run's model input carried the first run's history, read back from the log.
    assert model.inputs[2][0] == {"content": "Weather in Paris?", "role": "user"}
    kinds = [item.get("type", item.get("role")) for item in items]  # type: ignore[union-attr]
    assert kinds == [
        "user",
        "function_call",
        "function_call_output",
        "message",
        "user",
        "function_call",
        "function_call_output",
        "message",
    ]
    async with SessionActor.open(session_id="run", store=url) as actor:
        assert [m.role.value for m in actor.messages()] == [
            "user",
            "assistant",
            "tool",
            "assistant",
        ] * 2


def test_runner_run_sync_from_synchronous_code(tmp_path: Path) -> None:
    agent = Agent(name="Assistant", model=ScriptedModel(), tools=[weather])
    session = NousSession("sync", f"sqlite:///{tmp_path / 'sync.sqlite3'}")
    # run_sync runs on the thread's default event loop and leaves it open: give it one that
    # this test closes (warnings are errors here, an unclosed loop among them).
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        Runner.run_sync(agent, "one", session=session)
        Runner.run_sync(agent, "two", session=session)
        # run_sync runs the loop by hand and shuts its async generators down after each run
        # without cancelling its tasks: the session ran on the portal, not on that loop.
        assert isinstance(session.sessions, SessionsPortal)
        assert len(loop.run_until_complete(session.get_items())) == 8
    finally:
        asyncio.set_event_loop(None)
        loop.close()
        session.close()


async def test_a_registry_on_the_callers_loop_serves_the_session_without_a_thread(
    url: str,
) -> None:
    async with Sessions(url) as sessions:
        session = NousSession("local", sessions=sessions)
        await session.add_items(ITEMS)
        assert await session.get_items() == ITEMS
        assert await session.pop_item() == ITEMS[-1]
        assert "local" in sessions  # the actor runs in this registry, on this loop
        session.close()
        assert "local" in sessions  # closing the session leaves the registry's actors alone
    session = NousSession("local", url)
    try:
        assert await session.get_items() == ITEMS[:-1]
    finally:
        session.close()


async def test_a_cancelled_write_completes_before_the_cancellation_is_raised(url: str) -> None:
    async with Sessions(url) as sessions:
        session = NousSession("cancel", sessions=sessions)
        task = asyncio.ensure_future(session.add_items([{"role": "user", "content": "kept"}]))
        await asyncio.sleep(0)  # let it start, then cancel it while it is in flight
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # Cancelled after the outcome was known: the write landed, exactly once.
        assert await session.get_items() == [{"role": "user", "content": "kept"}]
        session.close()


# The SDK's EncryptedSession over NousSession ----------------------------------------------------


async def test_an_encrypted_pop_with_the_wrong_key_keeps_the_history(url: str) -> None:
    """As over the SDK's SQLiteSession: the pop authenticates the item before removing it, so
    a wrong key raises InvalidToken and removes nothing (a blind pop emptied the history)."""
    pytest.importorskip("cryptography")
    from agents.extensions.memory.encrypt_session import EncryptedSession
    from cryptography.fernet import InvalidToken

    backend = NousSession("secret", url)
    items: list[Any] = [
        {"role": "user", "content": "First"},
        {"role": "assistant", "content": "Second"},
    ]
    try:
        await EncryptedSession("secret", backend, "correct-key").add_items(items)
        ciphertext = await backend.get_items()
        with pytest.raises(InvalidToken):
            await EncryptedSession("secret", backend, "wrong-key").pop_item()
        assert await backend.get_items() == ciphertext
        correct = EncryptedSession("secret", backend, "correct-key")
        assert await correct.pop_item() == items[-1]
        assert await correct.get_items() == items[:-1]
    finally:
        backend.close()


async def test_an_encrypted_pop_checks_each_item_it_reaches(url: str) -> None:
    """An item the wrong key can authenticate but not read (expired) is popped; the next, which
    it cannot authenticate, stops the pop with InvalidToken and stays."""
    pytest.importorskip("cryptography")
    from agents.extensions.memory.encrypt_session import EncryptedSession
    from cryptography.fernet import InvalidToken

    backend = NousSession("secret", url)
    try:
        await EncryptedSession("secret", backend, "right", ttl=60).add_items(
            [{"role": "user", "content": "keep"}]
        )
        kept = await backend.get_items()
        tail = {"role": "assistant", "content": "expired tail"}
        await EncryptedSession("secret", backend, "wrong").add_items([tail])
        # ttl=-1: to this reader every item has expired (authentic, but not readable).
        with pytest.raises(InvalidToken):
            await EncryptedSession("secret", backend, "wrong", ttl=-1).pop_item()
        assert await backend.get_items() == kept
    finally:
        backend.close()


# Where the session runs: picked by how it is called -------------------------------------------


def _portal_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name == "nous_session-portal"]


def test_an_async_call_under_asyncio_run_uses_a_registry_on_that_loop_and_no_thread(
    url: str,
) -> None:
    session = NousSession("mode", url)

    async def main() -> list[Any]:
        await session.add_items(ITEMS[:2])
        assert isinstance(session.sessions, Sessions)  # the loop's registry, on this loop
        assert "mode" in session.sessions
        assert _portal_threads() == []
        return await session.get_items()

    try:
        assert asyncio.run(main()) == ITEMS[:2]
    finally:
        session.close()
    assert _portal_threads() == []


def test_two_asyncio_runs_in_sequence_each_get_a_registry_closed_with_its_loop(
    url: str,
) -> None:
    """The first run's registry closes when its loop ends (its actors, then its store: no
    ResourceWarning, which is an error here); the second run opens its own."""
    on_file, private = NousSession("twice", url), NousSession("private")
    registries: list[Any] = []

    async def run(text: str) -> tuple[list[Any], list[Any]]:
        for session in (on_file, private):
            await session.add_items([{"role": "user", "content": text}])
        registries.append(on_file.sessions)
        return await on_file.get_items(), await private.get_items()

    try:
        first = asyncio.run(run("one"))
        assert repr(registries[0]).startswith("<Sessions closed")
        second = asyncio.run(run("two"))
        assert repr(registries[1]).startswith("<Sessions closed")
    finally:
        on_file.close()
        private.close()
    assert registries[0] is not registries[1]
    one, two = {"role": "user", "content": "one"}, {"role": "user", "content": "two"}
    assert first == ([one], [one])
    # The file, and the private in-memory store the session keeps, outlive the first loop.
    assert second == ([one, two], [one, two])


def test_writes_in_flight_when_asyncio_run_ends_land_and_nothing_is_logged(
    url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """asyncio.run cancels the tasks left when its main coroutine returns: the registry's
    task among them, which closes its actors (they commit what they had queued) and its store
    on the way out, with no error logged (and no ResourceWarning, an error here)."""
    sessions = [NousSession(f"late-{i}", url) for i in range(5)]

    async def main() -> list[asyncio.Future[None]]:
        await asyncio.gather(*(s.add_items(ITEMS[:1]) for s in sessions))
        # Left running, never awaited: queued by the next await.
        left = [asyncio.ensure_future(s.add_items(ITEMS[1:2])) for s in sessions]
        await asyncio.sleep(0)
        return left

    async def read() -> list[list[Any]]:
        return [await s.get_items() for s in sessions]

    try:
        asyncio.run(main())
        assert asyncio.run(read()) == [ITEMS[:2]] * len(sessions)
    finally:
        for session in sessions:
            session.close()
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_closing_the_last_session_of_a_loop_registry_closes_it(url: str) -> None:
    async def main() -> None:
        first, second = NousSession("a", url), NousSession("b", url)
        await first.add_items(ITEMS[:1])
        await second.add_items(ITEMS[:1])
        registry = first.sessions
        assert registry is second.sessions  # one registry per loop and store
        assert isinstance(registry, Sessions)
        host = first._calls._local[1]  # type: ignore[index]
        first.close()
        assert not host.finished
        assert "b" in registry
        second.close()
        await host._task  # it stops by itself once the last session closed
        assert repr(registry).startswith("<Sessions closed")
        third = NousSession("a", url)  # a new session on the loop gets a new registry
        try:
            assert await third.get_items() == ITEMS[:1]
            assert third.sessions is not registry
        finally:
            third.close()

    asyncio.run(main())


def test_sync_code_a_loop_run_by_hand_and_trio_use_the_portal(tmp_path: Path) -> None:
    pytest.importorskip("trio")
    import trio

    session = NousSession("portal", f"sqlite:///{tmp_path / 'portal.sqlite3'}")
    loop = asyncio.new_event_loop()
    try:
        # run_until_complete by hand (as Runner.run_sync does): nothing cancels a task left on
        # the loop before it shuts its async generators down, so the portal serves it.
        loop.run_until_complete(session.add_items([{"role": "user", "content": "by hand"}]))
        assert isinstance(session.sessions, SessionsPortal)
        assert _portal_threads() == ["nous_session-portal"]
        trio.run(session.add_items, [{"role": "user", "content": "trio"}])
        got = trio.run(session.get_items)
        assert [item["content"] for item in got] == ["by hand", "trio"]  # type: ignore[index]
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
        session.close()
    assert _portal_threads() == []


@pytest.mark.parametrize("warm", [False, True], ids=["while-opening", "open"])
def test_a_cancelled_add_in_the_default_mode_lands_before_the_cancellation(
    url: str, warm: bool
) -> None:
    """As with a registry given (above): cancelled while the session opens on this loop, or
    while its request is in the actor's queue, and again while it waits, the write lands
    exactly once and the caller sees CancelledError only after."""
    session = NousSession("cancel", url)
    kept = {"role": "user", "content": "kept"}

    async def main() -> list[Any]:
        if warm:
            await session.get_items()  # the actor is open and its queue empty
        task = asyncio.ensure_future(session.add_items([kept]))
        await asyncio.sleep(0)  # let it start, then cancel it twice while it is in flight
        task.cancel()
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return await session.get_items()

    try:
        assert asyncio.run(main()) == [kept]
    finally:
        session.close()


def test_a_bad_store_is_refused_when_the_session_is_made() -> None:
    with pytest.raises(ValueError, match="scheme"):
        NousSession("x", "nosuch://place")
    with pytest.raises(ValueError, match="store must be"):
        NousSession("x", 42)  # type: ignore[arg-type]


# The items agents add most take a short way to the same event ---------------------------------

_TEXTS = st.text() | st.sampled_from(["", "\ud800", "a\udfffb", "{}"])


@settings(max_examples=500, deadline=None)
@given(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "assistant", "system", "developer", "tool"])},
        optional={"content": _TEXTS | st.none()},
    )
    | st.fixed_dictionaries(
        {"type": st.just("function_call_output"), "call_id": _TEXTS, "output": _TEXTS}
    )
    | st.fixed_dictionaries(
        {"type": st.just("function_call"), "call_id": _TEXTS, "name": _TEXTS},
        optional={"arguments": _TEXTS, "id": _TEXTS | st.none(), "status": _TEXTS},
    )
)
def test_item_event_is_the_event_of_item_message(item: dict[str, Any]) -> None:
    def event(make: Any) -> Any:
        try:
            kind, data = make(item)
        except InvalidEventError as error:
            return type(error)
        return kind, data, list(data)  # the same keys in the same order

    assert event(item_event) == event(lambda item: message_event(item_message(item)))
