"""The web view's parts (examples/web/app.py) without a server or a browser, on asyncio and trio:
where a stream resumes, what it carries, how the sessions are held open and closed again, which
Hosts and Origins it refuses, and that an id containing "/" is routed.

The browser test (test_web_view.py) runs the whole thing under uvicorn, which is asyncio only;
these run the same code on both backends, as everything async in the project does.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.types import Message as AsgiMessage

from nous_session import SessionActor
from nous_session.registry import Sessions
from tests.support.asgi import http_scope

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # examples/ is not a package installed with the library
web = importlib.import_module("examples.web.app")

pytestmark = pytest.mark.anyio


def request(headers: dict[str, str], query: str = "") -> Request:
    return Request(
        {
            "type": "http",
            "method": "GET",
            "path": "/sessions/s/events",
            "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
            "query_string": query.encode(),
        }
    )


def test_a_stream_starts_right_after_the_last_event_id_else_at_since_else_at_zero() -> None:
    assert web.resume_point(request({"Last-Event-ID": "41"}, "since=3")) == (42, "Last-Event-ID")
    assert web.resume_point(request({"Last-Event-ID": "0"})) == (1, "Last-Event-ID")
    assert web.resume_point(request({}, "since=3")) == (3, "since")
    assert web.resume_point(request({})) == (0, "start")
    for headers, query in (
        ({"Last-Event-ID": "x"}, ""),
        ({"Last-Event-ID": "-1"}, ""),
        ({}, "since=-2"),
    ):
        with pytest.raises(ValueError, match="must be a seq"):
            web.resume_point(request(headers, query))


async def take(body: AsyncIterator[Any], count: int) -> list[Any]:
    with anyio.fail_after(10):
        return [await body.__anext__() for _ in range(count)]


async def test_the_stream_carries_each_event_from_since_once_in_order_then_ends(
    tmp_path: Path,
) -> None:
    store = f"sqlite:///{tmp_path / 'web.sqlite3'}"
    async with anyio.create_task_group() as task_group:
        async with SessionActor.open(
            session_id="s", store=store, compaction=web.default_policy()
        ) as session:
            await web.append_turns(session, 8)
            first = session.log.count
            assert any(web.compaction_source(e) == "compaction" for e in session.log.events())
            response = web.event_stream(contextlib.nullcontext(session), 5)
            task_group.start_soon(response.data_sender_callable)
            body = response.body_iterator
            hint, *messages = await take(body, 1 + first - 5)
            assert hint.retry == web.RETRY_MS
            await web.append_turns(session, 2)  # live, after the catch-up
            messages += await take(body, session.log.count - first)
            shown = [web.event_json(e) for e in session.log.since(5)]
        # The session closed: the stream ends after everything it committed.
        with anyio.fail_after(10):
            rest = [message async for message in body]
    assert rest == []
    assert (
        [int(m.id) for m in messages] == [s["seq"] for s in shown] == list(range(5, len(shown) + 5))
    )
    assert [orjson.loads(m.data) for m in messages] == shown
    assert any(s["replace"] == "compaction" and s["op"][0] == "replace" for s in shown)


# The server as a browser on this machine names it; the Host and Origin checks compare to it.
BASE = "http://127.0.0.1:8000"
# Bounds for the waits on a condition (never a bare sleep): generous for a loaded host.
WAIT = 10.0


@contextlib.asynccontextmanager
async def serving(
    tmp_path: Path, **options: Any
) -> AsyncIterator[tuple[Starlette, httpx.AsyncClient]]:
    """The app over a SQLite file, started (its lifespan entered), with a client calling it."""
    app = web.create_app(f"sqlite:///{tmp_path / 'web.sqlite3'}", **options)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url=BASE) as client:
            yield app, client


def statistics(app: Starlette) -> Any:
    sessions: Sessions = app.state.sessions
    return sessions.statistics()


async def wait_until_all_closed(app: Starlette) -> None:
    with anyio.fail_after(WAIT):
        while statistics(app).open:  # noqa: ASYNC110 - the condition lives in the library
            await anyio.sleep(0.01)


async def stream_events(app: Starlette, path: str, count: int) -> list[dict[str, Any]]:
    """The first ``count`` events of the SSE stream at ``path``, the app called as a server
    would call it (httpx's ASGI transport answers only once a response is complete); checks
    on the way that the stream holds its session open (a lease of the registry)."""
    sent, received = anyio.create_memory_object_stream[AsgiMessage](1000)
    scope = http_scope("GET", path, [("accept", "text/event-stream")])

    async def receive() -> AsgiMessage:
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    events: list[dict[str, Any]] = []
    with anyio.fail_after(WAIT), sent:
        async with anyio.create_task_group() as task_group:
            task_group.start_soon(app, scope, receive, sent.send)
            async with received:
                start = await received.receive()
                assert start["type"] == "http.response.start"
                assert start["status"] == 200
                buffer = b""
                while len(events) < count:
                    message = await received.receive()
                    buffer += message.get("body", b"")
                    *chunks, buffer = buffer.split(b"\r\n\r\n")
                    for chunk in chunks:
                        for line in chunk.split(b"\r\n"):
                            if line.startswith(b"data: "):
                                events.append(orjson.loads(line[len(b"data: ") :]))
                assert statistics(app).leased == 1  # held while it streams
                task_group.cancel_scope.cancel()  # the browser leaves
    assert statistics(app).leased == 0
    return events


async def test_a_session_never_written_is_opened_once_and_closed_when_idle(tmp_path: Path) -> None:
    async with serving(tmp_path, idle_timeout=0.2) as (app, client):
        ids = [f"never-{n}" for n in range(20)]
        responses = []

        async def get(session_id: str) -> None:
            responses.append(await client.get(f"/sessions/{session_id}/surface"))

        async with anyio.create_task_group() as task_group:
            for session_id in ids * 3:  # each asked for three times at once: opened once
                task_group.start_soon(get, session_id)
        assert [r.status_code for r in responses] == [200] * 60
        assert {r.json()["session_id"] for r in responses} == set(ids)
        assert all(r.json()["count"] == 0 for r in responses)
        assert statistics(app).opened == 20
        await wait_until_all_closed(app)
        assert statistics(app).closed_idle == 20
        # Closed, not forgotten: asked for again, a session opens again.
        assert (await client.get("/sessions/never-0/surface")).json()["count"] == 0
        assert statistics(app).opened == 21
        # A bad id is refused by name, and opens nothing.
        bad = await client.get("/sessions//surface")
        assert bad.status_code == 400
        assert "session_id" in bad.json()["error"]
        await wait_until_all_closed(app)


async def test_a_stream_leases_its_session_while_it_runs_and_then_lets_it_close(
    tmp_path: Path,
) -> None:
    async with serving(tmp_path, idle_timeout=0.05) as (app, client):
        appended = await client.post("/sessions/s/turns", params={"count": "2"})
        assert appended.json() == {"count": 4}
        # The stream takes the session's lease (stream_events checks it) and gives it back.
        events = await stream_events(app, "/sessions/s/events", 4)
        assert [e["seq"] for e in events] == [0, 1, 2, 3]
        await wait_until_all_closed(app)


async def test_a_cross_origin_post_is_refused_and_appends_nothing(tmp_path: Path) -> None:
    async with serving(tmp_path) as (_app, client):
        for origin in ("http://evil.example", "http://127.0.0.1:9999", "null"):
            refused = await client.post(
                "/sessions/s/turns", params={"count": "3"}, headers={"Origin": origin}
            )
            assert refused.status_code == 403, origin
        assert (await client.get("/sessions/s/surface")).json()["count"] == 0
        # The server's own page may append, and so may curl (no Origin at all).
        own = await client.post("/sessions/s/turns", headers={"Origin": BASE})
        assert own.status_code == 200
        assert own.json() == {"count": 2}
        assert (await client.post("/sessions/s/turns")).json() == {"count": 4}
    async with serving(tmp_path, allowed_origins=["https://proxy.example"]) as (_app, client):
        allowed = await client.post(
            "/sessions/s/turns", headers={"Origin": "https://proxy.example"}
        )
        assert allowed.status_code == 200
        assert allowed.json()["count"] > 4


async def test_a_foreign_host_is_refused(tmp_path: Path) -> None:
    async with serving(tmp_path) as (app, client):
        # A DNS-rebinding page: its own name resolved to 127.0.0.1, so it names itself.
        for host in ("evil.example:8000", "evil.example", "127.0.0.1.evil.example:8000"):
            for method, path in (("GET", "/sessions/s/surface"), ("POST", "/sessions/s/turns")):
                refused = await client.request(method, path, headers={"Host": host})
                assert refused.status_code == 400, (host, method)
        assert statistics(app).opened == 0  # refused before a session was looked at
        for host in ("127.0.0.1:8000", "localhost:8000", "[::1]:8000", "LOCALHOST"):
            shown = await client.get("/sessions/s/surface", headers={"Host": host})
            assert shown.status_code == 200, host
            assert shown.json()["count"] == 0
    async with serving(tmp_path, allowed_hosts=["view.example", "::2"]) as (_app, client):
        for host in ("view.example", "[::2]:8000"):
            shown = await client.get("/sessions/s/surface", headers={"Host": host})
            assert shown.status_code == 200, host


async def test_an_id_containing_a_slash_is_shown_read_streamed_and_appended_to(
    tmp_path: Path,
) -> None:
    session_id = "app/user/s1"
    async with serving(tmp_path) as (app, client):
        for path in (f"/sessions/{session_id}", "/sessions/app%2Fuser%2Fs1"):
            page = await client.get(path)
            assert page.status_code == 200, path
            assert page.headers["content-type"].startswith("text/html")
        appended = await client.post(f"/sessions/{session_id}/turns", params={"count": "2"})
        assert appended.status_code == 200
        assert appended.json() == {"count": 4}
        for path in (f"/sessions/{session_id}/surface", "/sessions/app%2Fuser%2Fs1/surface"):
            surface = (await client.get(path)).json()
            assert surface["session_id"] == session_id
            assert surface["count"] == 4
        # Its parent and its last part are other sessions, never written.
        assert (await client.get("/sessions/app/user/surface")).json()["count"] == 0
        assert (await client.get("/sessions/s1/surface")).json()["count"] == 0
        events = await stream_events(app, f"/sessions/{session_id}/events", 4)
        assert [e["seq"] for e in events] == [0, 1, 2, 3]
    async with SessionActor.open(
        session_id=session_id, store=f"sqlite:///{tmp_path / 'web.sqlite3'}"
    ) as session:
        assert [web.event_json(e) for e in session.log.events()] == events


async def test_the_view_follows_turns_another_process_appends(tmp_path: Path) -> None:
    # The server holds the session open; a separate process appends to the same file; the
    # stream and the surface show what it wrote, through SQLite's change feed.
    async with serving(tmp_path) as (app, client):
        assert (await client.get("/sessions/s/surface")).json()["count"] == 0
        await anyio.run_process(
            [
                sys.executable,
                "-m",
                "examples.web.app",
                "--store",
                f"sqlite:///{tmp_path / 'web.sqlite3'}",
                "append",
                "s",
                "3",
            ],
            cwd=ROOT,
        )
        events = await stream_events(app, "/sessions/s/events", 6)
        assert [e["seq"] for e in events] == list(range(6))
        # The stream reads the server's own log: it holds what the other process wrote.
        assert (await client.get("/sessions/s/surface")).json()["count"] >= 6  # + compactions


async def test_the_page_comes_with_the_surface_and_a_summary_whole(tmp_path: Path) -> None:
    async with serving(tmp_path) as (_app, client):
        page = (await client.get("/sessions/s")).text
        assert (
            '<script id="initial-surface" type="application/json">{"session_id":"s","count":0,'
            in page
        )
        await client.post("/sessions/s/turns", params={"count": "8"})
        page = (await client.get("/sessions/s")).text
        surface = (await client.get("/sessions/s/surface")).json()
        start = page.index('type="application/json">') + len('type="application/json">')
        assert orjson.loads(page[start : page.index("</script>", start)]) == surface
        (summary,) = [entry for entry in surface["entries"] if entry["replace"] == "compaction"]
        # Whole, line by line, with the count of original messages it covers.
        assert summary["text"].startswith(f"[Compacted {summary['covers']} earlier messages]\n")
        assert summary["text"].count("\n") == summary["covers"]


def test_no_text_in_the_surface_can_end_the_pages_script() -> None:
    page = web.page_with_surface(
        '<script type="application/json">' + web.INITIAL_SURFACE + "</script>",
        {"entries": [{"text": "</script><script>alert(1)</script>"}]},
    )
    assert page.count("</script>") == 1
    start = len('<script type="application/json">')
    assert orjson.loads(page[start : page.index("</script>")]) == {
        "entries": [{"text": "</script><script>alert(1)</script>"}]
    }
