"""The AG-UI endpoints at their edges: resume points around a snapshot's horizon, runs
started at once on one thread (on one worker or two), resume points too long to be a seq,
messages too large to append, bodies too large to read."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import httpx
import pytest
from ag_ui.core import RunAgentInput

from nous_session import Message, SessionActor, SessionClosedError, Sessions, open_store
from nous_session.web import SessionStreams, create_app
from nous_session.web._agui import RUN_ERROR, RUN_FINISHED, RUN_STARTED
from nous_session.web._run_host import ORPHANED
from tests.support.asgi import http_scope
from tests.web.test_agui_streams import BASE, parse, run_input, types

pytestmark = pytest.mark.anyio


@contextlib.asynccontextmanager
async def serving(
    tmp_path: Path, agent: Any = None
) -> AsyncIterator[tuple[httpx.AsyncClient, SessionStreams]]:
    app = create_app(f"sqlite:///{tmp_path / 'agui.sqlite3'}", agent)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url=BASE) as client:
            yield client, app.state.streams


async def test_a_resume_before_a_snapshots_horizon_gets_the_surface_operations_it_kept(
    tmp_path: Path,
) -> None:
    async with serving(tmp_path) as (client, streams):
        async with streams.sessions.use("t1") as session:
            await session.add_message(Message.user("a"))  # 0
            await session.add_message(Message.assistant("b"))  # 1
            await session.replace(0, 1, Message.system("summary"))  # 2: kept by the snapshot
            await session.add_message(Message.user("c"))  # 3
            await session.snapshot()  # drops 0 and 1: the horizon is 4
            await session.add_message(Message.user("d"))  # 4
            assert [event.seq for event in session.log.events()] == [2, 3, 4]
        for cut in ("0", "1"):
            response = await client.get(
                "/connect", params={"thread_id": "t1"}, headers={"Last-Event-ID": cut}
            )
            assert response.status_code == 200
            events = parse(response.content)
            assert types(events)[0] == "RUN_STARTED"
            assert types(events)[-1] == "RUN_FINISHED"
            # The replace at seq 2 as the surface (no older one is held), then c and d.
            snapshot = next(event for _, event in events if event["type"] == "MESSAGES_SNAPSHOT")
            assert [m["content"] for m in snapshot["messages"]] == ["summary", "c", "d"]
            assert [identifier for identifier, _ in events if identifier] == [cut, "2", "3", "4"]


async def test_runs_started_at_once_on_one_thread_run_one_agent(tmp_path: Path) -> None:
    ran: list[str] = []

    async def agent(session: SessionActor, run: RunAgentInput) -> None:
        ran.append(run.run_id)
        await session.add_message(Message.assistant(f"answer to {run.run_id}"))

    async with serving(tmp_path, agent) as (client, streams):
        codes: dict[str, int] = {}

        async def post(run: str) -> None:
            hello = [{"id": f"u-{run}", "role": "user", "content": "hi"}]
            codes[run] = (await client.post("/run", json=run_input("t1", run, hello))).status_code

        async with anyio.create_task_group() as task_group:
            for run in ("r1", "r2", "r3"):
                task_group.start_soon(post, run)
        assert sorted(codes.values()) == [200, 409, 409]
        assert len(ran) == 1
        (winner,) = ran
        assert codes[winner] == 200
        async with streams.sessions.use("t1") as session:
            # The refused runs appended nothing: only the winner's message and answer.
            assert [m.text for m in session.messages()] == ["hi", f"answer to {winner}"]
        # The thread is free again once the run has ended; a retry of the run is not refused.
        again = run_input("t1", winner, [{"id": f"u-{winner}", "role": "user", "content": "hi"}])
        assert (await client.post("/run", json=again)).status_code == 200
        later = run_input("t1", "r4", [{"id": "u-r4", "role": "user", "content": "more"}])
        assert (await client.post("/run", json=later)).status_code == 200
        assert ran == [winner, "r4"]


async def test_a_resume_point_too_long_to_be_a_seq_is_named(tmp_path: Path) -> None:
    async with serving(tmp_path) as (client, streams):
        huge = "9" * 5000
        header = {"Last-Event-ID": huge}
        for response, name in (
            (await client.get("/threads/t1/events", headers=header), "Last-Event-ID"),
            (await client.get("/connect?thread_id=t1", headers=header), "Last-Event-ID"),
            (await client.get("/connect", params={"thread_id": "t1", "since": huge}), "since"),
        ):
            assert response.status_code == 400
            assert response.json()["error"] == f"{name} must be a seq, got '{'9' * 19}...'"
        async with streams.sessions.use("t1") as session:
            assert session.log.count == 0  # nothing was written


async def silent(session: SessionActor, run: RunAgentInput) -> None:
    """An agent that says nothing."""


async def test_a_message_sent_twice_in_one_run_is_appended_once(tmp_path: Path) -> None:
    async with serving(tmp_path, silent) as (client, streams):
        hello = {"id": "u1", "role": "user", "content": "hi"}
        response = await client.post("/run", json=run_input("t1", "r1", [hello, hello]))
        assert types(parse(response.content)) == ["RUN_STARTED", "RUN_FINISHED"]
        async with streams.sessions.use("t1") as session:
            assert [m.text for m in session.messages()] == ["hi"]


async def test_a_resume_point_past_the_end_of_the_thread_is_refused(tmp_path: Path) -> None:
    release = anyio.Event()

    async def waiting(session: SessionActor, run: RunAgentInput) -> None:
        await release.wait()
        await session.add_message(Message.assistant("done"))

    async with serving(tmp_path, waiting) as (client, streams):
        async with anyio.create_task_group() as task_group:
            hello = [{"id": "u1", "role": "user", "content": "hi"}]

            async def run() -> None:
                await client.post("/run", json=run_input("t1", "r1", hello))

            task_group.start_soon(run)
            async with streams.sessions.use("t1") as session:
                async with session.subscribe(1) as events:
                    async for _ in events:
                        break  # the run has started: the thread holds seqs 0 and 1
            # A cursor from another thread (or another store): past this one's end, it
            # would skip what comes next, this run's end among it.
            with anyio.fail_after(10):
                for response in (
                    await client.get("/connect?thread_id=t1", headers={"Last-Event-ID": "7"}),
                    await client.get("/threads/t1/events", headers={"Last-Event-ID": "7"}),
                    await client.get("/threads/t1/events", params={"since": "3"}),
                ):
                    assert response.status_code == 400
                    assert "past the end of thread 't1'" in response.json()["error"]
            release.set()
        # The end is a place to resume from: nothing follows it yet.
        response = await client.get("/connect?thread_id=t1", headers={"Last-Event-ID": "3"})
        assert types(parse(response.content)) == ["RUN_STARTED", "RUN_FINISHED"]


async def test_a_message_erased_and_sent_again_by_a_stale_client_is_not_appended_again(
    tmp_path: Path,
) -> None:
    async with serving(tmp_path, silent) as (client, streams):
        secret = {"id": "u1", "role": "user", "content": "I live at 12 Rue des Lilas"}
        await client.post("/run", json=run_input("t1", "r1", [secret]))
        async with streams.sessions.use("t1") as session:
            await session.erase([0], reason="asked to")
        # A tab that was closed during the erasure still holds the message, and resends it
        # with its history on its next run.
        again = [secret, {"id": "u2", "role": "user", "content": "hello"}]
        response = await client.post("/run", json=run_input("t1", "r2", again))
        assert response.status_code == 200
        async with streams.sessions.use("t1") as session:
            texts = [m.text for m in session.messages()]
        assert not any("Rue des Lilas" in text for text in texts), texts
        assert texts[-1] == "hello"


def stored(session: SessionActor) -> list[tuple[int, str, dict[str, Any]]]:
    return [(e.seq, str(e.type), dict(e.data)) for e in session.log.events()]


async def test_a_run_with_a_message_too_large_appends_none_of_its_messages(
    tmp_path: Path,
) -> None:
    ran: list[str] = []

    async def agent(session: SessionActor, run: RunAgentInput) -> None:
        ran.append(run.run_id)

    url = f"sqlite:///{tmp_path / 'agui.sqlite3'}"
    async with Sessions(url, max_event_size=500) as sessions:
        streams = SessionStreams(sessions, agent)
        async with streams.lifespan():
            transport = httpx.ASGITransport(app=streams.app)
            async with httpx.AsyncClient(transport=transport, base_url=BASE) as client:
                first = [{"id": "u0", "role": "user", "content": "hello"}]
                assert (await client.post("/run", json=run_input("t1", "r0", first))).is_success
                async with sessions.use("t1") as session:
                    before = stored(session)
                messages = [
                    *first,
                    {"id": "u1", "role": "user", "content": "fits"},
                    {"id": "u2", "role": "user", "content": "x" * 1000},
                    {"id": "u3", "role": "user", "content": "fits too"},
                ]
                response = await client.post("/run", json=run_input("t1", "r1", messages))
                assert response.status_code == 400
                error = response.json()["error"]
                assert "message 'u2' cannot be appended" in error
                assert "500" in error  # the limit it is over
                async with sessions.use("t1") as session:
                    await session.reload()
                    assert stored(session) == before
                assert ran == ["r0"]
                # Without it, the run goes on: the thread was left free.
                del messages[2]
                response = await client.post("/run", json=run_input("t1", "r1", messages))
                assert types(parse(response.content)) == ["RUN_STARTED", "RUN_FINISHED"]
                async with sessions.use("t1") as session:
                    assert [m.text for m in session.messages()] == ["hello", "fits", "fits too"]


async def post_in_chunks(app: Any, path: str, chunks: int) -> tuple[int, int]:
    """POST ``chunks`` chunks of 400 bytes (no Content-Length) straight to the ASGI app: its
    status, and how many chunks it read."""
    scope = http_scope("POST", path, [("content-type", "application/json")])
    pulled = 0
    statuses: list[int] = []

    async def receive() -> dict[str, Any]:
        nonlocal pulled
        pulled += 1
        return {"type": "http.request", "body": b" " * 400, "more_body": pulled < chunks}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            statuses.append(message["status"])

    await app(scope, receive, send)
    return statuses[0], pulled


async def test_a_body_over_max_body_size_is_refused_unread_and_appends_nothing(
    tmp_path: Path,
) -> None:
    app = create_app(f"sqlite:///{tmp_path / 'agui.sqlite3'}", silent, max_body_size=1000)
    streams: SessionStreams = app.state.streams
    big = run_input("t1", "r1", [{"id": "u1", "role": "user", "content": "x" * 2000}])
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url=BASE) as client:
            for route in ("/run", "/connect"):
                # Told by its Content-Length: refused before a byte is read.
                response = await client.post(route, json=big)
                assert response.status_code == 413
                assert "over 1000 bytes" in response.json()["error"]
                # Sent with no length: refused at the chunk that goes over, read no further.
                assert await post_in_chunks(app, route, 100) == (413, 3)
            async with streams.sessions.use("t1") as session:
                assert (await session.reload()).count == 0
            small = run_input("t1", "r1", [{"id": "u1", "role": "user", "content": "hi"}])
            assert (await client.post("/run", json=small)).status_code == 200


@pytest.mark.parametrize(
    ("keyword", "value"),
    [
        ("max_body_size", 0),
        ("max_body_size", -1),
        ("max_body_size", 1.5),
        ("max_body_size", True),
        ("max_body_size", "1000"),
        ("run_lease_ttl", 0),
        ("run_lease_ttl", -1.0),
        ("run_lease_ttl", float("nan")),
        ("run_lease_ttl", 86_401),
        ("run_lease_ttl", True),
        ("run_lease_ttl", "30"),
    ],
)
def test_bad_limits_are_named(tmp_path: Path, keyword: str, value: object) -> None:
    with pytest.raises(ValueError, match=f"^{keyword} must be"):
        SessionStreams(f"sqlite:///{tmp_path / 'agui.sqlite3'}", silent, **{keyword: value})


async def test_a_run_retried_through_another_worker_is_streamed_again_not_run_again(
    tmp_path: Path,
) -> None:
    """Two workers on one SQLite file: the one that does not run the run refuses another run
    on its thread, and streams a retry of the run going on from its start."""
    ran: list[str] = []
    started, release = anyio.Event(), anyio.Event()

    async def waiting(session: SessionActor, run: RunAgentInput) -> None:
        ran.append(run.run_id)
        await session.add_message(Message.assistant("working"))
        started.set()
        await release.wait()
        await session.add_message(Message.assistant("done"))

    url = f"sqlite:///{tmp_path / 'agui.sqlite3'}"
    first, second = create_app(url, waiting), create_app(url, waiting)
    hello = [{"id": "u1", "role": "user", "content": "hi"}]
    responses: dict[str, httpx.Response] = {}
    async with contextlib.AsyncExitStack() as stack:
        clients = []
        for app in (first, second):
            await stack.enter_async_context(app.router.lifespan_context(app))
            transport = httpx.ASGITransport(app=app)
            client = httpx.AsyncClient(transport=transport, base_url=BASE, timeout=20)
            clients.append(await stack.enter_async_context(client))

        async def post(at: int, run: str, name: str) -> None:
            responses[name] = await clients[at].post("/run", json=run_input("t1", run, hello))

        with anyio.fail_after(20):
            async with anyio.create_task_group() as task_group:
                task_group.start_soon(post, 0, "r1", "run")
                await started.wait()
                busy = await clients[1].post("/run", json=run_input("t1", "r2", hello))
                assert busy.status_code == 409
                assert "'r1' is going on in this thread (on another worker)" in busy.text
                task_group.start_soon(post, 1, "r1", "retry")
                # The retry's stream follows the run from its start: it has sent its opening.
                follower = await second.state.streams.sessions.get("t1")
                while follower.statistics().subscribers == 0:  # noqa: ASYNC110 - library state
                    await anyio.sleep(0.01)
                release.set()
    assert ran == ["r1"]
    run, retry = parse(responses["run"].content), parse(responses["retry"].content)
    assert types(retry) == types(run)
    assert types(run)[-1] == "RUN_FINISHED"
    async with first.router.lifespan_context(first):
        async with first.state.streams.sessions.use("t1") as session:
            assert [m.text for m in session.messages()] == ["hi", "working", "done"]


async def test_a_run_left_unended_by_a_dead_worker_is_ended_by_the_next_run(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'agui.sqlite3'}"
    async with Sessions(url, max_event_size=500) as sessions:
        streams = SessionStreams(sessions, silent)
        async with streams.lifespan():
            async with sessions.use("t1") as session:
                # A worker started this run and died: its lease has lapsed (it holds none).
                await session.append(RUN_STARTED, {"run_id": "dead"}, key="ag-ui-run:dead")
                before = stored(session)
            transport = httpx.ASGITransport(app=streams.app)
            async with httpx.AsyncClient(transport=transport, base_url=BASE) as client:
                big = [{"id": "u1", "role": "user", "content": "x" * 1000}]
                response = await client.post("/run", json=run_input("t1", "r1", big))
                assert response.status_code == 400
                async with sessions.use("t1") as session:
                    assert stored(session) == before  # bad input: not even the dead run's end
                hello = [{"id": "u1", "role": "user", "content": "hi"}]
                response = await client.post("/run", json=run_input("t1", "r1", hello))
                assert types(parse(response.content)) == ["RUN_STARTED", "RUN_FINISHED"]
                async with sessions.use("t1") as session:
                    assert [(kind, data.get("run_id")) for _, kind, data in stored(session)] == [
                        (RUN_STARTED, "dead"),
                        (RUN_ERROR, "dead"),
                        ("user_message", None),
                        (RUN_STARTED, "r1"),
                        (RUN_FINISHED, "r1"),
                    ]
                    assert stored(session)[1][2]["message"] == ORPHANED
                # A client following the thread sees the last run end (not the dead one wait).
                with anyio.fail_after(10):
                    response = await client.get("/connect", params={"thread_id": "t1"})
                assert types(parse(response.content))[-1] == "RUN_FINISHED"


async def test_a_thread_deleted_under_its_streams_ends_them_saying_so_and_the_app_serves_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Another process deletes a thread while its run waits and clients follow it: the
    # thread's actor closes (the change feed brings the delete), and every stream ends, each
    # saying the thread was deleted, instead of waiting for a run that can no longer end. The
    # run's end cannot be recorded (a warning says so); the app goes on serving.
    url = f"sqlite:///{tmp_path / 'agui.sqlite3'}"
    waiting, go_on, done = anyio.Event(), anyio.Event(), anyio.Event()
    refused: list[BaseException] = []

    async def agent(session: SessionActor, run: RunAgentInput) -> None:
        await session.add_message(Message.assistant("Starting."))
        if run.run_id != "r1":
            await session.add_message(Message.assistant("too late"))
            return
        waiting.set()
        await go_on.wait()
        try:
            await session.add_message(Message.assistant("too late"))
        except SessionClosedError as error:
            refused.append(error)
            raise
        finally:
            done.set()

    app = create_app(url, agent)
    bodies: dict[str, bytes] = {}
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with (
            httpx.AsyncClient(transport=transport, base_url=BASE) as client,
            app.state.streams.sessions.use("t1") as session,
        ):

            async def fetch(name: str, method: str, target: str, **options: Any) -> None:
                bodies[name] = (await client.request(method, target, **options)).content

            hello = [{"id": "u1", "role": "user", "content": "hi"}]
            with anyio.fail_after(10):
                async with anyio.create_task_group() as task_group:
                    task_group.start_soon(
                        partial(fetch, json=run_input("t1", "r1", hello)), "run", "POST", "/run"
                    )
                    await waiting.wait()
                    task_group.start_soon(fetch, "connect", "GET", "/connect?thread_id=t1")
                    task_group.start_soon(fetch, "native", "GET", "/threads/t1/events")
                    while session.statistics().subscribers < 3:  # every stream follows it
                        await anyio.lowlevel.checkpoint()
                    command = ["-m", "nous_session", "--store", url, "delete", "--yes", "t1"]
                    await anyio.run_process([sys.executable, *command])
                    async with session.subscribe(session.log.count) as events:
                        async for _ in events:
                            pytest.fail("the thread's actor streamed after the delete")
                    go_on.set()
                    await done.wait()  # the agent (in the app's task group) went on
            assert session.closed
        assert len(refused) == 1  # the agent's write after the delete, refused saying why
        assert "'t1' was deleted" in str(refused[0])
        gone = "thread 't1' was deleted (by another holder of its store)"
        for name in ("run", "connect"):
            events = parse(bodies[name])
            assert types(events)[0] == "RUN_STARTED"
            assert types(events)[-1] == "RUN_ERROR"
            assert events[-1][1]["message"].startswith(gone)
        assert "event: deleted" in bodies["native"].decode()
        assert gone in bodies["native"].decode()
        # The app serves on: the thread starts anew (once r1's worker has given it up).
        async with httpx.AsyncClient(transport=transport, base_url=BASE) as client:
            async with app.state.streams.sessions.use("t1") as fresh:
                assert fresh.log.count == 0
            response = await client.post("/run", json=run_input("t1", "r2", hello))
            assert types(parse(response.content))[-1] == "RUN_FINISHED"
        assert "the end of run 'r1' of thread 't1' was not recorded" in caplog.text
    async with open_store(url) as store:
        stored = [event.data.get("content") for event in await store.load("t1")]
    assert stored == ["hi", None, "Starting.", "too late", None]  # r2's alone
