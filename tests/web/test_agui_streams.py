"""nous_session.web's AG-UI endpoints through httpx's ASGI transport, on asyncio and trio.

Every event sent is validated against the AG-UI Python SDK's models; the Node tests
(test_agui_client.py) do the same with the protocol's own JavaScript client.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import orjson
import pytest
from ag_ui.core import Event as AgUiEvent
from ag_ui.core import RunAgentInput
from pydantic import TypeAdapter
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.routing import Mount

from nous_session import CompactionPolicy, Message, SessionActor, ToolCall
from nous_session.web import SessionStreams, create_app

pytestmark = pytest.mark.anyio

BASE = "http://127.0.0.1:8000"
EVENTS: TypeAdapter[Any] = TypeAdapter(AgUiEvent)


async def weather_agent(session: SessionActor, run: RunAgentInput) -> None:
    """A scripted agent: a tool call, its result, an answer that quotes the last user text."""
    said = next(
        (m.content for m in reversed(run.messages) if m.role == "user"),
        "",
    )
    call = ToolCall(f"call_{run.run_id}", "get_weather", {"city": "Paris"})
    await session.add_message(Message.assistant("Checking.", tool_calls=[call]))
    await session.add_message(Message.tool(call.id, {"rain_mm": 3}, name="get_weather"))
    await session.add_message(Message.assistant(f"You said: {said}"))


async def failing_agent(session: SessionActor, run: RunAgentInput) -> None:
    await session.add_message(Message.assistant("Trying."))
    raise RuntimeError("the model is down")


def parse(body: bytes) -> list[tuple[str | None, dict[str, Any]]]:
    """The SSE messages of ``body`` that carry data: (id, the validated AG-UI event)."""
    found: list[tuple[str | None, dict[str, Any]]] = []
    for block in body.decode().split("\n\n"):
        identifier = None
        data = []
        for line in block.split("\n"):
            if line.startswith("id:"):
                identifier = line[3:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].lstrip(" "))
        if data:
            event = orjson.loads("\n".join(data))
            EVENTS.validate_python(event)
            found.append((identifier, event))
    return found


def run_input(thread: str, run: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "threadId": thread,
        "runId": run,
        "state": {},
        "messages": messages,
        "tools": [],
        "context": [],
        "forwardedProps": {},
    }


@contextlib.asynccontextmanager
async def serving(tmp_path: Path, **options: Any) -> AsyncIterator[httpx.AsyncClient]:
    options.setdefault("agent", weather_agent)
    app = create_app(f"sqlite:///{tmp_path / 'agui.sqlite3'}", **options)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url=BASE) as client:
            yield client


def types(events: list[tuple[str | None, dict[str, Any]]]) -> list[str]:
    return [event["type"] for _, event in events]


async def test_a_run_streams_its_tool_call_result_and_answer_between_start_and_finish(
    tmp_path: Path,
) -> None:
    async with serving(tmp_path) as client:
        hello = {"id": "u1", "role": "user", "content": "hello"}
        response = await client.post("/run", json=run_input("t1", "r1", [hello]))
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = parse(response.content)
    assert types(events) == [
        "RUN_STARTED",
        "TEXT_MESSAGE_START",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_END",
        "TOOL_CALL_START",
        "TOOL_CALL_ARGS",
        "TOOL_CALL_END",
        "TOOL_CALL_RESULT",
        "TEXT_MESSAGE_START",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_END",
        "RUN_FINISHED",
    ]
    assert events[0][1]["runId"] == events[-1][1]["runId"] == "r1"
    assert events[5][1]["delta"] == '{"city":"Paris"}'
    assert events[9][1]["delta"] == "You said: hello"
    # The user's own message is not sent back; each committed event's last AG-UI event
    # carries its seq as the SSE id, in order.
    ids = [int(identifier) for identifier, _ in events if identifier is not None]
    assert ids == sorted(ids)
    assert len(ids) == 5


async def test_a_client_that_resends_its_history_appends_nothing_twice(tmp_path: Path) -> None:
    async with serving(tmp_path) as client:
        first = [{"id": "u1", "role": "user", "content": "hello"}]
        await client.post("/run", json=run_input("t1", "r1", first))
        snapshot = await hydrate(client, "t1")
        history = [*snapshot, {"id": "u2", "role": "user", "content": "again"}]
        await client.post("/run", json=run_input("t1", "r2", history))
        after = await hydrate(client, "t1")
    assert [m["role"] for m in after] == ["user", "assistant", "tool", "assistant"] * 2
    assert [m["id"] for m in after][:4] == [m["id"] for m in snapshot]
    assert after[0]["id"] == "u1"
    assert after[4]["id"] == "u2"
    assert after[-1]["content"] == "You said: again"


async def hydrate(client: httpx.AsyncClient, thread: str) -> list[dict[str, Any]]:
    response = await client.post("/connect", json=run_input(thread, "c", []))
    events = parse(response.content)
    assert types(events)[:2] == ["RUN_STARTED", "MESSAGES_SNAPSHOT"]
    assert types(events)[-1] == "RUN_FINISHED"
    messages: list[dict[str, Any]] = events[1][1]["messages"]
    return messages


async def test_a_retried_run_id_streams_the_same_run_without_running_it_again(
    tmp_path: Path,
) -> None:
    async with serving(tmp_path) as client:
        body = run_input("t1", "r1", [{"id": "u1", "role": "user", "content": "hi"}])
        first = parse((await client.post("/run", json=body)).content)
        again = parse((await client.post("/run", json=body)).content)
        assert again == first
        assert len(await hydrate(client, "t1")) == 4


async def test_connect_with_last_event_id_sends_what_followed_it(tmp_path: Path) -> None:
    async with serving(tmp_path) as client:
        body = run_input("t1", "r1", [{"id": "u1", "role": "user", "content": "hi"}])
        run = parse((await client.post("/run", json=body)).content)
        cut = next(identifier for identifier, _ in run if identifier is not None)  # RUN_STARTED
        response = await client.post(
            "/connect", json=run_input("t1", "c", []), headers={"Last-Event-ID": cut}
        )
        resumed = parse(response.content)
    # The same run from right after the cut: no snapshot, nothing twice.
    assert types(resumed) == types(run)
    assert resumed[1:] == run[1:]


async def test_a_failing_agent_ends_its_run_with_run_error(tmp_path: Path) -> None:
    async with serving(tmp_path, agent=failing_agent) as client:
        body = run_input("t1", "r1", [{"id": "u1", "role": "user", "content": "hi"}])
        events = parse((await client.post("/run", json=body)).content)
        assert types(events)[0] == "RUN_STARTED"
        assert types(events)[-1] == "RUN_ERROR"
        assert "the model is down" in events[-1][1]["message"]


async def test_requests_from_elsewhere_are_refused_unless_the_application_allows_them(
    tmp_path: Path,
) -> None:
    body = run_input("t1", "r1", [{"id": "u1", "role": "user", "content": "hi"}])
    app = create_app(f"sqlite:///{tmp_path / 'agui.sqlite3'}", weather_agent)
    async with app.router.lifespan_context(app):
        remote = httpx.ASGITransport(app=app, client=("203.0.113.9", 5000))
        async with httpx.AsyncClient(transport=remote, base_url=BASE) as client:
            assert (await client.post("/run", json=body)).status_code == 403
            assert (await client.get("/connect?thread_id=t1")).status_code == 403
            assert (await client.get("/threads/t1/events")).status_code == 403

    def owner_only(request: Request, thread_id: str, access: str) -> bool:
        return request.headers.get("x-user") == "alice" and thread_id.startswith("alice/")

    async with serving(tmp_path, authorize=owner_only) as client:
        mine = run_input("alice/1", "r1", body["messages"])
        assert (await client.post("/run", json=mine)).status_code == 403
        allowed = await client.post("/run", json=mine, headers={"x-user": "alice"})
        assert allowed.status_code == 200
        other = run_input("bob/1", "r2", body["messages"])
        assert (
            await client.post("/run", json=other, headers={"x-user": "alice"})
        ).status_code == 403


async def test_a_compaction_reaches_the_client_as_a_messages_snapshot(tmp_path: Path) -> None:
    async def chatty(session: SessionActor, run: RunAgentInput) -> None:
        for number in range(8):
            await session.add_message(Message.assistant(f"part {number}"))
        await session.wait_for_compaction()

    policy = CompactionPolicy(keep_last=2, every=4)
    async with serving(tmp_path, agent=chatty, compaction=policy) as client:
        body = run_input("t1", "r1", [{"id": "u1", "role": "user", "content": "go"}])
        events = parse((await client.post("/run", json=body)).content)
        final = await hydrate(client, "t1")
    snapshots = [event for _, event in events if event["type"] == "MESSAGES_SNAPSHOT"]
    assert snapshots
    assert len(final) < 9
    assert final[-1]["content"] == "part 7"


async def test_mounted_in_an_application_with_its_lifespan(tmp_path: Path) -> None:
    streams = SessionStreams(f"sqlite:///{tmp_path / 'agui.sqlite3'}", weather_agent)
    app = Starlette(routes=[Mount("/agent", streams.app)], lifespan=streams.lifespan)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url=BASE) as client:
            body = run_input("t1", "r1", [{"id": "u1", "role": "user", "content": "hi"}])
            events = parse((await client.post("/agent/run", json=body)).content)
            assert types(events)[-1] == "RUN_FINISHED"
            assert (await client.post("/run", json=body)).status_code == 404
    with pytest.raises(RuntimeError, match="not running"):
        _ = streams.sessions


async def test_a_second_run_on_a_busy_thread_is_refused_and_a_bad_request_named(
    tmp_path: Path,
) -> None:
    started, release = anyio.Event(), anyio.Event()

    async def waiting(session: SessionActor, run: RunAgentInput) -> None:
        started.set()
        await release.wait()
        await session.add_message(Message.assistant("done"))

    async with serving(tmp_path, agent=waiting) as client:
        hello = [{"id": "u1", "role": "user", "content": "hi"}]
        async with anyio.create_task_group() as task_group:
            first: list[httpx.Response] = []

            async def run_first() -> None:
                first.append(await client.post("/run", json=run_input("t1", "r1", hello)))

            task_group.start_soon(run_first)
            with anyio.fail_after(10):
                await started.wait()
            busy = await client.post("/run", json=run_input("t1", "r2", []))
            assert busy.status_code == 409
            assert "r1" in busy.json()["error"]
            release.set()
        assert parse(first[0].content)[-1][1]["type"] == "RUN_FINISHED"
        assert (await client.post("/run", content=b"{not json")).status_code == 422
        assert (await client.post("/run", json={"threadId": "t1"})).status_code == 422
        assert (await client.get("/connect")).status_code == 400
        # GET /connect, as a browser's EventSource would open it.
        events = parse((await client.get("/connect", params={"thread_id": "t1"})).content)
        assert types(events) == ["RUN_STARTED", "MESSAGES_SNAPSHOT", "RUN_FINISHED"]
        assert [m["content"] for m in events[1][1]["messages"]] == ["hi", "done"]
