"""Live messages (nous_session.web.live_message, live_tool_call): text and tool-call argument
deltas reach the client while the message is generated, the log keeps the completed message
once, and a stream that resumes or a draft that is abandoned leaves the client with the
surface the log holds. On asyncio and trio, the
app called as a server calls it, so that each chunk is seen as it is sent."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest
from ag_ui.core import Event as AgUiEvent
from ag_ui.core import RunAgentInput
from pydantic import TypeAdapter
from starlette.applications import Starlette
from starlette.types import Message as AsgiMessage

from nous_session import EventType, Message, SessionActor
from nous_session.web import SessionStreams, create_app, live_message, live_tool_call
from tests.support.asgi import http_scope

pytestmark = pytest.mark.anyio

EVENTS: TypeAdapter[Any] = TypeAdapter(AgUiEvent)
WAIT = 20.0


class Stream:
    """An SSE response read as it is sent: its AG-UI events (validated), with their ids."""

    def __init__(self, received: anyio.abc.ObjectReceiveStream[AsgiMessage]) -> None:
        self._received = received
        self._buffer = ""
        self.events: list[tuple[str | None, dict[str, Any]]] = []
        self.ended = False

    async def until(self, condition: Any) -> None:
        """Read until ``condition(events)`` holds or the response ends."""
        while not condition(self.events) and not self.ended:
            message = await self._received.receive()
            if message["type"] != "http.response.body":
                continue
            self._buffer += message.get("body", b"").decode()
            self.ended = not message.get("more_body", False)
            *blocks, self._buffer = self._buffer.split("\n\n")
            for block in blocks:
                identifier, data = None, []
                for line in block.split("\n"):
                    if line.startswith("id:"):
                        identifier = line[3:].strip()
                    elif line.startswith("data:"):
                        data.append(line[5:].lstrip(" "))
                if data:
                    event = orjson.loads("\n".join(data))
                    EVENTS.validate_python(event)
                    self.events.append((identifier, event))

    async def to_end(self) -> list[dict[str, Any]]:
        await self.until(lambda events: False)
        return [event for _, event in self.events]


@contextlib.asynccontextmanager
async def request(
    app: Starlette, path: str, body: dict[str, Any], headers: dict[str, str] | None = None
) -> AsyncIterator[Stream]:
    """POST ``body`` to ``path``, the response read as it streams."""
    sent, received = anyio.create_memory_object_stream[AsgiMessage](1000)
    raw = orjson.dumps(body)
    scope = http_scope(
        "POST", path, [("content-type", "application/json"), *(headers or {}).items()]
    )
    requested = False

    async def receive() -> AsgiMessage:
        nonlocal requested
        if not requested:
            requested = True
            return {"type": "http.request", "body": raw, "more_body": False}
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    async with anyio.create_task_group() as task_group, sent, received:
        task_group.start_soon(app, scope, receive, sent.send)
        yield Stream(received)
        task_group.cancel_scope.cancel()


def run_input(run: str, text: str) -> dict[str, Any]:
    return {
        "threadId": "t1",
        "runId": run,
        "messages": [{"id": f"u-{run}", "role": "user", "content": text}],
    }


def deltas(events: list[dict[str, Any]], message_id: str) -> list[str]:
    return [
        e["delta"]
        for e in events
        if e["type"] == "TEXT_MESSAGE_CONTENT" and e["messageId"] == message_id
    ]


def started(events: list[tuple[str | None, dict[str, Any]]]) -> str | None:
    """The id of the first live message started, if any."""
    for _, event in events:
        if event["type"] == "TEXT_MESSAGE_START" and event["messageId"].startswith("live:"):
            return str(event["messageId"])
    return None


@contextlib.asynccontextmanager
async def serving(tmp_path: Path, agent: Any) -> AsyncIterator[Starlette]:
    app = create_app(f"sqlite:///{tmp_path / 'live.sqlite3'}", agent)
    async with app.router.lifespan_context(app):
        yield app


async def test_text_reaches_the_client_as_it_is_generated_and_is_committed_once(
    tmp_path: Path,
) -> None:
    pieces = ["Hel", "lo, ", "world"]
    seen = [anyio.Event() for _ in pieces]

    async def agent(session: SessionActor, run: RunAgentInput) -> None:
        async with live_message(session) as draft:
            for piece, shown in zip(pieces, seen, strict=True):
                draft.add(piece)
                await shown.wait()  # the client has it before the message is complete

    async with serving(tmp_path, agent) as app:
        with anyio.fail_after(WAIT):
            async with request(app, "/run", run_input("r1", "hi")) as stream:
                for count, shown in enumerate(seen, 1):
                    await stream.until(lambda events, count=count: len(_live(events)) >= count)
                    shown.set()
                events = await stream.to_end()
        streams: SessionStreams = app.state.streams
        session = await streams.sessions.get("t1")
        answers = [e for e in session.log.events() if e.type is EventType.ASSISTANT_MESSAGE]
    identifier = started(stream.events)
    assert identifier is not None
    assert deltas(events, identifier) == pieces  # each piece as it came, then nothing more
    assert [e["type"] for e in events if e.get("messageId") == identifier] == [
        "TEXT_MESSAGE_START",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_END",
    ]
    assert events[-1]["type"] == "RUN_FINISHED"
    (answer,) = answers  # committed once, whole, under the id its deltas carried
    assert answer.data["content"] == "Hello, world"
    assert answer.data["metadata"]["ag-ui"]["id"] == identifier


def _live(events: list[tuple[str | None, dict[str, Any]]]) -> list[str]:
    identifier = started(events)
    return [] if identifier is None else deltas([e for _, e in events], identifier)


async def test_an_abandoned_draft_is_ended_and_the_surface_sent_again(tmp_path: Path) -> None:
    shown = anyio.Event()

    async def agent(session: SessionActor, run: RunAgentInput) -> None:
        async with live_message(session) as draft:
            draft.add("I think")
            await shown.wait()
            raise RuntimeError("the model stopped")

    async with serving(tmp_path, agent) as app:
        with anyio.fail_after(WAIT):
            async with request(app, "/run", run_input("r1", "hi")) as stream:
                await stream.until(lambda events: len(_live(events)) >= 1)
                shown.set()
                events = await stream.to_end()
    identifier = started(stream.events)
    types = [e["type"] for e in events]
    assert types[-1] == "RUN_ERROR"
    end = types.index("TEXT_MESSAGE_END")
    assert events[end]["messageId"] == identifier
    snapshot = events[end + 1]
    assert snapshot["type"] == "MESSAGES_SNAPSHOT"
    assert [m["id"] for m in snapshot["messages"]] == ["u-r1"]  # the draft is gone


async def test_a_client_that_resumes_during_a_draft_gets_a_snapshot_then_the_draft_whole(
    tmp_path: Path,
) -> None:
    shown, resumed = anyio.Event(), anyio.Event()

    async def agent(session: SessionActor, run: RunAgentInput) -> None:
        async with live_message(session) as draft:
            draft.add("Part one, ")
            await shown.wait()
            await resumed.wait()
            draft.add("part two.")
        await session.add_message(Message.assistant("Done."))

    async with serving(tmp_path, agent) as app:
        with anyio.fail_after(WAIT):
            async with request(app, "/run", run_input("r1", "hi")) as stream:
                await stream.until(lambda events: len(_live(events)) >= 1)
                shown.set()
                cut = next(identifier for identifier, _ in stream.events if identifier)
            # The connection was cut with part of the draft shown; the client resumes.
            connect = {"threadId": "t1", "runId": "c1", "messages": []}
            async with request(app, "/connect", connect, {"Last-Event-ID": cut}) as again:
                await again.until(lambda events: len(_live(events)) >= 1)
                resumed.set()
                events = await again.to_end()
    identifier = started(stream.events)
    types = [e["type"] for e in events]
    assert types[0] == "RUN_STARTED"
    assert types[-1] == "RUN_FINISHED"
    # The client may hold part of the draft: a snapshot of the surface without it drops that
    # copy, then the draft is shown from its start, so the client has its text once, whole.
    first = types.index("TEXT_MESSAGE_START")
    assert types[first - 1] == "MESSAGES_SNAPSHOT"
    assert [m["id"] for m in events[first - 1]["messages"]] == ["u-r1"]
    assert events[first]["messageId"] == identifier
    assert "".join(deltas(events, identifier)) == "Part one, part two."
    assert types.count("MESSAGES_SNAPSHOT") == 1
    done = events[types.index("TEXT_MESSAGE_START", first + 1)]["messageId"]
    assert deltas(events, done) == ["Done."]


def _call_events(events: list[dict[str, Any]], call_id: str) -> list[dict[str, Any]]:
    return [e for e in events if e.get("toolCallId") == call_id]


async def test_tool_call_arguments_reach_the_client_as_generated_and_are_kept_as_streamed(
    tmp_path: Path,
) -> None:
    fragments = ['{"query": ', '"weather in ', 'Paris"}']
    seen = [anyio.Event() for _ in fragments]

    async def agent(session: SessionActor, run: RunAgentInput) -> None:
        async with live_message(session) as draft:
            draft.add("Let me look.")
            call = draft.tool_call("search", "call-1")
            for fragment, shown in zip(fragments, seen, strict=True):
                call.add(fragment)
                await shown.wait()  # the client has it before the call is complete
            call.end()
            with pytest.raises(RuntimeError, match="has ended"):
                call.add("more")
            with pytest.raises(RuntimeError, match="text comes before"):
                draft.add("and more text")

    def arguments_seen(events: list[tuple[str | None, dict[str, Any]]]) -> int:
        return sum(1 for _, e in events if e["type"] == "TOOL_CALL_ARGS")

    async with serving(tmp_path, agent) as app:
        with anyio.fail_after(WAIT):
            async with request(app, "/run", run_input("r1", "hi")) as stream:
                for count, shown in enumerate(seen, 1):
                    await stream.until(lambda events, count=count: arguments_seen(events) >= count)
                    shown.set()
                events = await stream.to_end()
        streams: SessionStreams = app.state.streams
        session = await streams.sessions.get("t1")
        stored = list(session.log.events())
    identifier = started(stream.events)
    assert identifier is not None
    # The text, ended when the call begins; the call under the message, each fragment as it
    # came, its end when the agent ended it; nothing of either sent again at the commit.
    assert [(e["type"], e.get("delta")) for e in events if e.get("messageId") == identifier] == [
        ("TEXT_MESSAGE_START", None),
        ("TEXT_MESSAGE_CONTENT", "Let me look."),
        ("TEXT_MESSAGE_END", None),
    ]
    call_events = _call_events(events, "call-1")
    assert [e["type"] for e in call_events] == [
        "TOOL_CALL_START",
        "TOOL_CALL_ARGS",
        "TOOL_CALL_ARGS",
        "TOOL_CALL_ARGS",
        "TOOL_CALL_END",
    ]
    assert call_events[0]["toolCallName"] == "search"
    assert call_events[0]["parentMessageId"] == identifier
    assert [e["delta"] for e in call_events[1:4]] == fragments
    assert events[-1]["type"] == "RUN_FINISHED"
    # The log holds the completed message once (no delta is an event), its arguments as
    # streamed: the string the deltas make.
    answers = [e for e in stored if e.type is EventType.ASSISTANT_MESSAGE]
    (answer,) = answers
    assert answer.data["content"] == "Let me look."
    (call,) = answer.data["tool_calls"]
    assert (call["id"], call["name"], call["arguments"]) == ("call-1", "search", "".join(fragments))
    assert [e.type for e in stored].count(EventType.ASSISTANT_MESSAGE) == 1


async def test_a_client_that_resumes_mid_call_gets_the_call_whole_once(tmp_path: Path) -> None:
    shown, resumed = anyio.Event(), anyio.Event()

    async def agent(session: SessionActor, run: RunAgentInput) -> None:
        async with live_tool_call(session, "search", "call-1") as call:
            call.add('{"query": ')
            await shown.wait()
            await resumed.wait()
            call.add('"Paris"}')

    async with serving(tmp_path, agent) as app:
        with anyio.fail_after(WAIT):
            async with request(app, "/run", run_input("r1", "hi")) as stream:
                await stream.until(
                    lambda events: any(e["type"] == "TOOL_CALL_ARGS" for _, e in events)
                )
                shown.set()
                cut = next(identifier for identifier, _ in stream.events if identifier)
            connect = {"threadId": "t1", "runId": "c1", "messages": []}
            async with request(app, "/connect", connect, {"Last-Event-ID": cut}) as again:
                await again.until(
                    lambda events: any(e["type"] == "TOOL_CALL_ARGS" for _, e in events)
                )
                resumed.set()
                events = await again.to_end()
            async with request(app, "/connect", connect) as fresh:
                page = await fresh.to_end()
    first = [e for _, e in stream.events]
    # A message with no text: the call alone, under the message's id.
    assert not any(e["type"].startswith("TEXT_MESSAGE") for e in first)
    parent = _call_events(first, "call-1")[0]["parentMessageId"]
    assert parent.startswith("live:")
    types = [e["type"] for e in events]
    snapshot = types.index("MESSAGES_SNAPSHOT")
    assert [m["id"] for m in events[snapshot]["messages"]] == ["u-r1"]  # no partial call
    call_events = _call_events(events, "call-1")
    assert call_events[0]["type"] == "TOOL_CALL_START"
    assert events.index(call_events[0]) > snapshot
    assert "".join(e["delta"] for e in call_events if e["type"] == "TOOL_CALL_ARGS") == (
        '{"query": "Paris"}'
    )
    assert call_events[-1]["type"] == "TOOL_CALL_END"
    assert types[-1] == "RUN_FINISHED"
    # A page opened after: the stored call, with the same arguments.
    (message,) = [m for m in page[1]["messages"] if m["role"] == "assistant"]
    assert message["id"] == parent
    assert message["toolCalls"][0]["function"]["arguments"] == '{"query": "Paris"}'


async def test_an_abandoned_tool_call_is_ended_and_the_surface_sent_again(tmp_path: Path) -> None:
    shown = anyio.Event()

    async def agent(session: SessionActor, run: RunAgentInput) -> None:
        async with live_tool_call(session, "search", "call-1") as call:
            call.add('{"query": ')
            await shown.wait()
            raise RuntimeError("the model stopped")

    async with serving(tmp_path, agent) as app:
        with anyio.fail_after(WAIT):
            async with request(app, "/run", run_input("r1", "hi")) as stream:
                await stream.until(
                    lambda events: any(e["type"] == "TOOL_CALL_ARGS" for _, e in events)
                )
                shown.set()
                events = await stream.to_end()
        streams: SessionStreams = app.state.streams
        session = await streams.sessions.get("t1")
        stored = [e.type for e in session.log.events()]
    types = [e["type"] for e in events]
    assert types[-1] == "RUN_ERROR"
    end = types.index("TOOL_CALL_END")
    assert events[end]["toolCallId"] == "call-1"
    assert types[end + 1] == "MESSAGES_SNAPSHOT"
    assert [m["id"] for m in events[end + 1]["messages"]] == ["u-r1"]
    assert EventType.ASSISTANT_MESSAGE not in stored  # nothing of it was committed


async def test_a_live_message_refuses_bad_input_and_commits_nothing_after_it(
    tmp_path: Path,
) -> None:
    async def agent(session: SessionActor, run: RunAgentInput) -> None:
        async with live_message(session) as draft:
            with pytest.raises(TypeError, match="string"):
                draft.add(3)  # type: ignore[arg-type]  # the error is the point
            with pytest.raises(ValueError, match="needs a name"):
                draft.tool_call("")
            call = draft.tool_call("search", "call-1")
            with pytest.raises(ValueError, match="already used"):
                draft.tool_call("search", "call-1")
            with pytest.raises(TypeError, match="text"):
                call.add({"query": "x"})  # type: ignore[arg-type]  # the error is the point
            call.add("{}")
        with pytest.raises(RuntimeError, match="is complete"):
            draft.add("late")
        with pytest.raises(RuntimeError, match="is complete"):
            call.add("late")
        await session.add_message(Message.assistant("after"))

    async with serving(tmp_path, agent) as app:
        with anyio.fail_after(WAIT):
            async with request(app, "/run", run_input("r1", "hi")) as stream:
                events = await stream.to_end()
        streams: SessionStreams = app.state.streams
        session = await streams.sessions.get("t1")
        stored = [e for e in session.log.events() if e.type is EventType.ASSISTANT_MESSAGE]
    assert events[-1]["type"] == "RUN_FINISHED"
    assert [(e.data["content"], len(e.data.get("tool_calls") or [])) for e in stored] == [
        ("", 1),
        ("after", 0),
    ]
    assert stored[0].data["tool_calls"][0]["arguments"] == "{}"
