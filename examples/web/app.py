"""A live web view of a session: its committed events streamed to a browser over SSE.

``GET /sessions/{id}`` is a page (plain JavaScript, no build step) that shows the session's
events as they are committed and, beside them, the surface the model sees, marking the
compactions as they land. The events come from ``GET /sessions/{id}/events``, a Server-Sent
Events stream read from ``session.subscribe(since)``: each SSE message carries one event and
its SSE id is the event's seq, so a browser that reconnects (after a dropped connection or a
server restart) sends ``Last-Event-ID`` and the stream resumes right after the last event it
showed, with no gap and no duplicate. The surface comes from ``GET /sessions/{id}/surface``:
the fold (replaces, removes, rewinds, uncompacts) is the library's, memoised on the committed
Log, so the page asks for it again after each burst of events instead of re-implementing it.

The store is a SQLite file, so the server can be stopped and started again and keep every
session. Each session is opened once, lazily, by the first request that names it, and held
open with a small compaction policy so that compactions happen while you watch.

Run it from the repository root (needs the ``web`` extra: ``pip install -e '.[web]'``)::

    python -m examples.web.app --store sqlite:///web.sqlite3 serve --port 8000
    # open http://127.0.0.1:8000/sessions/demo, then, from another shell:
    curl -X POST 'http://127.0.0.1:8000/sessions/demo/turns?count=5'

and, with the server stopped (two processes must not write one SQLite session at once)::

    python -m examples.web.app --store sqlite:///web.sqlite3 append demo 5
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import orjson
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from nous_session import CompactionPolicy, Message, SessionActor, ToolCall
from nous_session.event import Event, EventType
from nous_session.ops import Replace
from nous_session.stores import open_store
from nous_session.stores.base import Store

logger = logging.getLogger("examples.web")

PAGE = Path(__file__).with_name("index.html")
# How long a browser waits before reconnecting a dropped stream (the SSE `retry:` field).
RETRY_MS = 500
# A comment line this often keeps idle connections open and finds departed browsers.
PING_SECONDS = 15
# What a preview of an event's text is cut to.
PREVIEW = 160


def default_policy() -> CompactionPolicy:
    """Small on purpose: with more than 12 messages on the surface, all but the last 6 are
    summarised, so a few turns are enough to see a compaction happen."""
    return CompactionPolicy(keep_last=6, every=12)


class Sessions:
    """The sessions this server has open: each opened by the first request that names it and
    held by a task of the app's task group until the app shuts down.

    An actor's ``async with`` block must be entered and left by one task, so a request does
    not open it itself: it starts a holder task in the app's task group and waits until the
    actor is open.
    """

    def __init__(
        self, store: Store, policy: CompactionPolicy | None, task_group: anyio.abc.TaskGroup
    ) -> None:
        self._store = store
        self._policy = policy
        self._task_group = task_group
        self._open: dict[str, SessionActor] = {}
        self._opening: dict[str, anyio.Lock] = {}
        self._stop = anyio.Event()

    async def get(self, session_id: str) -> SessionActor:
        """The open actor of ``session_id``, opened now if it is not yet.

        Raises:
            ValueError: ``session_id`` is not a valid session id.
        """
        session = self._open.get(session_id)
        if session is not None:
            return session
        lock = self._opening.setdefault(session_id, anyio.Lock())
        async with lock:
            session = self._open.get(session_id)
            if session is None:
                session = await self._task_group.start(self._hold, session_id)
            return session

    async def _hold(
        self, session_id: str, *, task_status: anyio.abc.TaskStatus[SessionActor]
    ) -> None:
        async with SessionActor.open(
            session_id=session_id, store=self._store, compaction=self._policy
        ) as session:
            logger.info("opened session %r at count %d", session_id, session.log.count)
            self._open[session_id] = session
            task_status.started(session)
            try:
                await self._stop.wait()
            finally:
                del self._open[session_id]

    def close(self) -> None:
        """Close every open session (their subscriptions end once they have sent all)."""
        self._stop.set()


def _preview(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= PREVIEW else text[: PREVIEW - 1] + "…"


def compaction_source(event: Event) -> str | None:
    """``"compaction"`` or ``"pruning"`` for the replaces the compaction runner appends,
    ``"replace"`` for any other replace, None for an event that is not one."""
    if not isinstance(event.op, Replace):
        return None
    source = event.data.get("source")
    return source if isinstance(source, str) else "replace"


def event_json(event: Event) -> dict[str, Any]:
    """What the page shows of one event: its seq, type, role and a preview of its text."""
    shown: dict[str, Any] = {
        "seq": event.seq,
        "type": str(event.type),
        "time": event.time.isoformat(),
        "op": None if event.op is None else event.op.to_json(),
        "replace": compaction_source(event),
    }
    content = event.data.get("content")
    if isinstance(content, str):
        shown["text"] = _preview(content)
    calls = event.data.get("tool_calls")
    if isinstance(calls, list) and calls:
        names = [call.get("name", "?") for call in calls if isinstance(call, Mapping)]
        shown["calls"] = names
    return shown


def surface_json(session: SessionActor) -> dict[str, Any]:
    """The surface the model sees now, one entry per message, with the seq it came from."""
    log = session.log
    entries = [
        {
            "seq": event.seq,
            "position": event.position,
            "role": message.role.value,
            "text": _preview(message.text),
            "replace": compaction_source(event),
        }
        for event, message in zip(log.surface(), log.derive_messages(), strict=True)
    ]
    return {"session_id": session.session_id, "count": log.count, "entries": entries}


def resume_point(request: Request) -> tuple[int, str]:
    """Where a stream starts, and why: right after ``Last-Event-ID`` (a browser reconnecting
    sends the id of the last event it got: its seq), else at ``?since=``, else at 0.

    Raises:
        ValueError: the header or the parameter is not a seq.
    """
    for name, value, after in (
        ("Last-Event-ID", request.headers.get("last-event-id"), 1),
        ("since", request.query_params.get("since"), 0),
    ):
        if value:
            seq = int(value) + after if value.isdecimal() else -1
            if seq < 0:
                raise ValueError(f"{name} must be a seq, got {value!r}")
            return seq, name
    return 0, "start"


def turn(number: int) -> list[Message]:
    """One scripted turn of a deterministic conversation; every third one calls a tool."""
    city = ("Paris", "Oslo", "Lima", "Kyoto", "Accra")[number % 5]
    if number % 3 == 2:
        call = ToolCall(f"call_{number}", "get_weather", {"city": city})
        return [
            Message.user(f"Turn {number}: is it raining in {city}?"),
            Message.assistant(f"Checking {city}.", tool_calls=[call]),
            Message.tool(call.id, {"city": city, "rain_mm": number % 7}, name="get_weather"),
            Message.assistant(f"{city}: {number % 7} mm of rain today."),
        ]
    return [
        Message.user(f"Turn {number}: tell me one fact about {city}."),
        Message.assistant(f"Fact {number} about {city}: it has {number * 37 % 100} parks."),
    ]


async def append_turns(session: SessionActor, count: int) -> None:
    """Append ``count`` scripted turns, then wait for the compactions they triggered."""
    start = sum(1 for e in session.log.events() if e.type is EventType.USER_MESSAGE)
    for number in range(start, start + count):
        for message in turn(number):
            await session.add_message(message)
    await session.wait_for_compaction()


def event_stream(session: SessionActor, since: int) -> EventSourceResponse:
    """The SSE response carrying ``session``'s events from ``since`` on, each with its seq as id.

    A task beside the response (``data_sender_callable``) reads the subscription and hands the
    events over a small memory stream, so that at server shutdown (which sse-starlette detects
    and signals with ``shutdown``) it can stop waiting for the next event and end the stream
    cleanly: the browser then sees an ended response, not a torn connection, and reconnects.
    """
    sender, receiver = anyio.create_memory_object_stream[ServerSentEvent](64)
    shutdown = anyio.Event()

    async def pump() -> None:
        async with sender, anyio.create_task_group() as task_group:

            async def stop_at_shutdown() -> None:
                await shutdown.wait()
                task_group.cancel_scope.cancel()

            task_group.start_soon(stop_at_shutdown)
            # Tell the browser first how soon to come back if the connection drops.
            await sender.send(ServerSentEvent(comment="nous_session", retry=RETRY_MS))
            async with session.subscribe(since) as subscription:
                async for event in subscription:
                    data = orjson.dumps(event_json(event)).decode()
                    await sender.send(ServerSentEvent(data, id=str(event.seq)))
            task_group.cancel_scope.cancel()  # the session closed: the stream is complete

    async def content() -> AsyncIterator[ServerSentEvent]:
        async with receiver:
            async for message in receiver:
                yield message

    return EventSourceResponse(
        content(),
        data_sender_callable=pump,
        ping=PING_SECONDS,
        shutdown_event=shutdown,
        shutdown_grace_period=1.0,
    )


def create_app(store_url: str, policy: CompactionPolicy | None = None) -> Starlette:
    """The ASGI app over the store at ``store_url``."""
    page = PAGE.read_text(encoding="utf-8")

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        store = open_store(store_url)
        try:
            async with anyio.create_task_group() as task_group:
                sessions = Sessions(store, policy or default_policy(), task_group)
                app.state.sessions = sessions
                try:
                    yield
                finally:
                    sessions.close()
        finally:
            await store.aclose()

    async def session_of(request: Request) -> SessionActor:
        sessions: Sessions = request.app.state.sessions
        return await sessions.get(request.path_params["session_id"])

    async def index(request: Request) -> Response:
        return RedirectResponse("/sessions/demo")

    async def show(request: Request) -> Response:
        return HTMLResponse(page)

    async def surface(request: Request) -> Response:
        try:
            session = await session_of(request)
        except ValueError as error:
            return JSONResponse({"error": str(error)}, status_code=400)
        return Response(orjson.dumps(surface_json(session)), media_type="application/json")

    async def turns(request: Request) -> Response:
        try:
            count = int(request.query_params.get("count", "1"))
            if not 1 <= count <= 1000:
                raise ValueError(f"count must be in 1..1000, got {count}")
            session = await session_of(request)
        except ValueError as error:
            return JSONResponse({"error": str(error)}, status_code=400)
        await append_turns(session, count)
        return JSONResponse({"count": session.log.count})

    async def events(request: Request) -> Response:
        try:
            since, why = resume_point(request)
            session = await session_of(request)
        except ValueError as error:
            return JSONResponse({"error": str(error)}, status_code=400)
        logger.info("stream of %r from seq %d (%s)", session.session_id, since, why)
        return event_stream(session, since)

    return Starlette(
        routes=[
            Route("/", index),
            Route("/sessions/{session_id}", show),
            Route("/sessions/{session_id}/events", events),
            Route("/sessions/{session_id}/surface", surface),
            Route("/sessions/{session_id}/turns", turns, methods=["POST"]),
        ],
        lifespan=lifespan,
    )


async def append_offline(store_url: str, session_id: str, count: int) -> int:
    """Append ``count`` turns straight to the store (with the server stopped); the count."""
    async with SessionActor.open(
        session_id=session_id, store=store_url, compaction=default_policy()
    ) as session:
        await append_turns(session, count)
        return session.log.count


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m examples.web.app", description=__doc__)
    parser.add_argument("--store", default="sqlite:///web.sqlite3", help="a store URL")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the web view with uvicorn")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    append = commands.add_parser("append", help="append turns with the server stopped")
    append.add_argument("session")
    append.add_argument("turns", type=int)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if args.command == "append":
        count = anyio.run(append_offline, args.store, args.session, args.turns)
        logger.info("session %r now holds %d events", args.session, count)
        return
    import uvicorn

    uvicorn.run(
        create_app(args.store),
        host=args.host,
        port=args.port,
        log_level="info",
        # Streams end at shutdown (sse-starlette watches for it); this bounds the rest.
        timeout_graceful_shutdown=5,
    )


if __name__ == "__main__":
    main()
