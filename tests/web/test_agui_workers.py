"""A run going on in one worker, resumed through another that shares its store: on a SQLite
file and on PostgreSQL (each worker an app with its own registry and store connection, both
in this process, on asyncio and trio). The second worker follows the first's commits through
the store's change feed, so the resumed stream carries the rest of the run, and only that."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import anyio
import httpx
import orjson
import pytest
from ag_ui.core import RunAgentInput

from nous_session import Message, SessionActor, ToolCall
from nous_session.web import SessionStreams, create_app
from tests.support.processes import shared_store_url

pytestmark = pytest.mark.anyio

BASE = "http://127.0.0.1:8000"
WAIT = 20.0


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    yield from shared_store_url(request.param, tmp_path, "shared")


def events_of(response: httpx.Response) -> list[dict[str, Any]]:
    return [
        orjson.loads(line[len("data: ") :])
        for line in response.text.splitlines()
        if line.startswith("data: ")
    ]


async def test_a_run_resumes_through_another_worker_on_the_same_store(store_url: str) -> None:
    asked, release = anyio.Event(), anyio.Event()

    async def agent(session: SessionActor, run: RunAgentInput) -> None:
        call = ToolCall("call-1", "lookup", {"query": "weather"})
        await session.add_message(Message.assistant("Looking.", tool_calls=[call]))
        asked.set()
        await release.wait()  # the test resumes the stream elsewhere meanwhile
        await session.add_message(Message.tool(call.id, {"found": 1}, name="lookup"))
        await session.add_message(Message.assistant("Found one."))

    first, second = create_app(store_url, agent), create_app(store_url, agent)
    responses: dict[str, httpx.Response] = {}
    async with AsyncExitStack() as stack:
        clients = []
        for app in (first, second):
            await stack.enter_async_context(app.router.lifespan_context(app))
            transport = httpx.ASGITransport(app=app)
            client = httpx.AsyncClient(transport=transport, base_url=BASE, timeout=WAIT)
            clients.append(await stack.enter_async_context(client))
        hello = {"id": "u1", "role": "user", "content": "hello"}
        body = {"threadId": "t1", "runId": "r1", "messages": [hello]}

        async def run() -> None:
            responses["run"] = await clients[0].post("/run", json=body)

        async def resume(cut: int) -> None:
            responses["resumed"] = await clients[1].post(
                "/connect",
                json={"threadId": "t1", "runId": "c1", "messages": []},
                headers={"Last-Event-ID": str(cut)},
            )

        streams: SessionStreams = first.state.streams
        elsewhere: SessionStreams = second.state.streams
        with anyio.fail_after(WAIT):
            async with anyio.create_task_group() as task_group:
                task_group.start_soon(run)
                await asked.wait()
                # The client had everything up to the assistant's tool call when it was cut.
                cut = (await streams.sessions.get("t1")).log.count - 1
                task_group.start_soon(resume, cut)
                # The rest of the run is written once the resumed stream follows the session.
                follower = await elsewhere.sessions.get("t1")
                while follower.statistics().subscribers == 0:  # noqa: ASYNC110 - library state
                    await anyio.sleep(0.01)
                release.set()
    run_events, resumed = events_of(responses["run"]), events_of(responses["resumed"])
    assert [e["type"] for e in resumed] == [
        "RUN_STARTED",
        "TOOL_CALL_RESULT",
        "TEXT_MESSAGE_START",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_END",
        "RUN_FINISHED",
    ]
    assert resumed[0]["runId"] == resumed[-1]["runId"] == "r1"
    # What the resumed stream carried is exactly the run's tail.
    assert resumed[1:-1] == run_events[-5:-1]
