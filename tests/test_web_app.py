"""The web view's parts (examples/web/app.py) without a server or a browser, on asyncio and trio:
where a stream resumes, what it carries, and how the sessions are held open.

The browser test (test_web_view.py) runs the whole thing under uvicorn, which is asyncio only;
these run the same code on both backends, as everything async in the project does.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest
from starlette.requests import Request

from nous_session import SessionActor
from nous_session.stores import open_store

ROOT = Path(__file__).resolve().parent.parent
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
            response = web.event_stream(session, 5)
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


async def test_each_session_is_opened_once_and_held_until_close(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'web.sqlite3'}")
    try:
        async with anyio.create_task_group() as task_group:
            sessions = web.Sessions(store, web.default_policy(), task_group)
            got: list[SessionActor] = []

            async def get() -> None:
                got.append(await sessions.get("a"))

            async with anyio.create_task_group() as getters:
                for _ in range(3):
                    getters.start_soon(get)
            assert len(got) == 3
            assert got[0] is got[1] is got[2]
            await web.append_turns(got[0], 1)
            with pytest.raises(ValueError, match="session_id"):
                await sessions.get("")
            assert await sessions.get("a") is got[0]
            assert web.surface_json(got[0])["count"] == got[0].log.count == 2
            sessions.close()
        assert got[0].closed
    finally:
        await store.aclose()
