"""A live web view of a session: its committed events streamed to a browser over SSE.

``GET /sessions/{id}`` is a page (plain JavaScript, no build step) that shows the session's
events as they are committed and, beside them, the surface the model sees, marking the
compactions as they land. The events come from ``GET /sessions/{id}/events``, the library's
own Server-Sent Events stream (:func:`nous_session.web.event_stream`): each SSE message carries
one event and its SSE id is the event's seq, so a browser that reconnects (after a dropped
connection or a server restart) sends ``Last-Event-ID`` and the stream resumes right after the
last event it showed, with no gap and no duplicate. The surface comes with the page (so its
first paint shows it), then from ``GET /sessions/{id}/surface``: the fold (replaces, removes,
rewinds, uncompacts) is the library's, memoised on the committed Log, so the page asks for it
again after each burst of events instead of re-implementing it. A compaction summary is shown whole,
line by line, with the number of original messages it covers.

The same sessions speak AG-UI, for agent UIs (CopilotKit, ``@ag-ui/client``'s ``HttpAgent``):
``POST /agui/run`` runs a scripted agent and streams the run, ``POST /agui/connect`` re-attaches
(see ``docs/ui-streams.md``); both are :class:`nous_session.web.SessionStreams`, mounted here.

The store is a SQLite file, so the server can be stopped and started again and keep every
session. The sessions are held by a :class:`~nous_session.registry.Sessions` registry: each is
opened by the first request that names it, with a small compaction policy so that compactions
happen while you watch, and closed again once nobody has used it for ``--idle-timeout`` seconds
(a stream holds its session open for as long as it runs). So a request for an id that was
never written opens nothing for good. An id may contain ``/`` (the ADK adapter's
``app/user/session`` ids): ``/sessions/app/user/s1/events`` is that session's stream. (An id
whose last part is ``events``, ``surface`` or ``turns`` has no page of its own: that path is
its parent's stream, surface or turns.)

The view has no authentication: anyone who can reach it reads every session and appends to any
(its AG-UI endpoints too). It refuses a request whose ``Host`` is not one of the allowed hosts
(the loopback names and the ``--host`` it is bound to, plus any ``--allow-host``), which stops
a DNS-rebinding page from reading it, and a POST whose ``Origin`` is another site's, which
stops a cross-origin form from appending. Keep it on loopback, or put it behind a reverse proxy
that authenticates (and add the proxy's public name with ``--allow-host``).

Run it from the repository root (needs the ``web`` extra: ``pip install -e '.[web]'``)::

    python -m examples.web.app --store sqlite:///web.sqlite3 serve --port 8000
    # open http://127.0.0.1:8000/sessions/demo, then, from another shell:
    curl -X POST 'http://127.0.0.1:8000/sessions/demo/turns?count=5'

or append from another process, with the server running or not: the view follows the file
(SQLite's change feed), so an open page shows another process's turns as they land::

    python -m examples.web.app --store sqlite:///web.sqlite3 append demo 5
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import orjson
from ag_ui.core import RunAgentInput
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
)
from starlette.routing import Mount, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from nous_session import CompactionPolicy, Message, SessionActor, ToolCall
from nous_session.event import Event, EventType
from nous_session.registry import Sessions
from nous_session.stores.base import check_session_id
from nous_session.transcript import summary_info
from nous_session.web import RETRY_MS as RETRY_MS  # re-exported: the view's tests read it
from nous_session.web import SessionStreams, compaction_source, event_stream, resume_point
from nous_session.web import event_json as event_json  # re-exported, as RETRY_MS

logger = logging.getLogger("examples.web")

PAGE = Path(__file__).with_name("index.html")
# Where the page holds the surface it is served with (replaced by its JSON).
INITIAL_SURFACE = "null/*INITIAL_SURFACE*/"
# How much of a summary's text the surface shows (the rest is cut with an ellipsis).
SUMMARY_CHARS = 20_000
# What a preview of an event's text is cut to.
PREVIEW = 160
# Seconds after which a session nobody uses (no request, no stream) is closed.
IDLE_TIMEOUT = 60.0
# How many sessions may be open at once before the least recently used idle ones close.
MAX_OPEN = 1000
# The names a browser on this machine reaches a loopback server by; always allowed as Host.
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "[::1]")
# Methods that change nothing; only the others are checked for a foreign Origin.
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def default_policy() -> CompactionPolicy:
    """Small on purpose: with more than 12 messages on the surface, all but the last 6 are
    summarised, so a few turns are enough to see a compaction happen."""
    return CompactionPolicy(keep_last=6, every=12)


def host_pattern(host: str) -> str:
    """``host`` as the Host check compares it: lower case, an IPv6 address in brackets."""
    host = host.lower()
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


class SameOriginMiddleware:
    """Refuse (403) a state-changing request that a page of another origin sent.

    A browser sends ``Origin`` with every cross-origin POST, and a form or ``fetch`` of any
    site can POST here without reading the answer: that alone would append. A request is let
    through when it has no ``Origin`` (curl, a same-origin form in an old browser), when its
    origin is this server as the request names it (the ``Host`` header, which
    :class:`TrustedHostMiddleware` has checked), or when it is one of ``allowed_origins``.
    """

    def __init__(self, app: ASGIApp, allowed_origins: Sequence[str] = ()) -> None:
        self.app = app
        self.allowed_origins = frozenset(origin.lower().rstrip("/") for origin in allowed_origins)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] not in SAFE_METHODS:
            headers = Headers(scope=scope)
            origin = headers.get("origin")
            if origin is not None and not self.allows(origin.lower(), headers.get("host", "")):
                logger.warning("refused a %s from origin %r", scope["method"], origin)
                response = PlainTextResponse("Cross-origin request refused", status_code=403)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def allows(self, origin: str, host: str) -> bool:
        """Whether ``origin`` (lower case) is this server's or an allowed one."""
        if origin in self.allowed_origins:
            return True
        scheme, _, netloc = origin.partition("://")
        return scheme in ("http", "https") and bool(netloc) and netloc == host.lower()


def _preview(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= PREVIEW else text[: PREVIEW - 1] + "…"


def surface_entry(event: Event, message: Message) -> dict[str, Any]:
    """One message of the surface: its seq, role and a one-line preview of its text; for a
    compaction summary, its whole text (line by line, up to ``SUMMARY_CHARS``) and how many
    original messages it covers."""
    entry: dict[str, Any] = {
        "seq": event.seq,
        "position": event.position,
        "role": message.role.value,
        "text": _preview(message.text),
        "replace": compaction_source(event),
    }
    info = summary_info(message)
    if info is not None:
        text = message.text
        entry["text"] = text if len(text) <= SUMMARY_CHARS else text[: SUMMARY_CHARS - 1] + "…"
        entry["covers"] = info["messages"]
    return entry


def surface_json(session: SessionActor) -> dict[str, Any]:
    """The surface the model sees now, one entry per message, with the seq it came from."""
    log = session.log
    entries = [
        surface_entry(event, message)
        for event, message in zip(log.surface(), log.derive_messages(), strict=True)
    ]
    return {"session_id": session.session_id, "count": log.count, "entries": entries}


def page_with_surface(page: str, surface: dict[str, Any]) -> str:
    """The page with the surface as it is now written into it, so that its first paint shows
    the surface (the script draws it before the stream opens). ``<`` is escaped so that no
    text in the JSON can end the script element."""
    data = orjson.dumps(surface).decode().replace("<", "\\u003c")
    return page.replace(INITIAL_SURFACE, data, 1)


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


async def scripted_agent(session: SessionActor, run: RunAgentInput) -> None:
    """The agent AG-UI clients run (``POST /agui/run``): it answers the user's message with
    the assistant's side of a scripted turn (a tool call and its result every third turn)."""
    number = sum(1 for e in session.log.events() if e.type is EventType.USER_MESSAGE)
    for message in turn(number)[1:]:
        await session.add_message(message)


def allow_everyone(request: Request, thread_id: str, access: str) -> bool:
    """The view's AG-UI streams are as open as its pages (see the module's docstring): the
    Host and Origin checks guard them, and a reverse proxy that authenticates, if any."""
    return True


def create_app(
    store_url: str,
    policy: CompactionPolicy | None = None,
    *,
    idle_timeout: float = IDLE_TIMEOUT,
    max_open: int = MAX_OPEN,
    allowed_hosts: Sequence[str] = (),
    allowed_origins: Sequence[str] = (),
) -> Starlette:
    """The ASGI app over the store at ``store_url``.

    Args:
        store_url: the store's URL; the app opens it at startup and closes it at shutdown.
        policy: the sessions' compaction policy; None is :func:`default_policy`.
        idle_timeout: seconds after which a session nobody uses is closed.
        max_open: how many sessions may be open before the least recently used idle ones
            close (those being streamed are held, and may take it above).
        allowed_hosts: the ``Host`` names accepted besides :data:`LOOPBACK_HOSTS` (the name
            the server is bound to, a reverse proxy's public name); others get a 400.
        allowed_origins: the origins (``https://proxy.example``) whose pages may POST, besides
            the server's own; others get a 403.
    """
    page = PAGE.read_text(encoding="utf-8")

    # The sessions, their AG-UI endpoints (mounted at /agui) and the event stream below.
    streams = SessionStreams(
        store_url,
        scripted_agent,
        authorize=allow_everyone,
        compaction=policy or default_policy(),
        idle_timeout=idle_timeout,
        max_open=max_open,
    )

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with streams.lifespan():
            app.state.sessions = streams.sessions
            yield

    def sessions_of(request: Request) -> Sessions:
        sessions: Sessions = request.app.state.sessions
        return sessions

    async def index(request: Request) -> Response:
        return RedirectResponse("/sessions/demo")

    async def show(request: Request) -> Response:
        try:
            session = await sessions_of(request).get(request.path_params["session_id"])
        except ValueError as error:
            return JSONResponse({"error": str(error)}, status_code=400)
        return HTMLResponse(page_with_surface(page, surface_json(session)))

    async def surface(request: Request) -> Response:
        try:
            session = await sessions_of(request).get(request.path_params["session_id"])
        except ValueError as error:
            return JSONResponse({"error": str(error)}, status_code=400)
        return Response(orjson.dumps(surface_json(session)), media_type="application/json")

    async def turns(request: Request) -> Response:
        try:
            count = int(request.query_params.get("count", "1"))
            if not 1 <= count <= 1000:
                raise ValueError(f"count must be in 1..1000, got {count}")
            session_id = check_session_id(request.path_params["session_id"])
        except ValueError as error:
            return JSONResponse({"error": str(error)}, status_code=400)
        # Held for the whole append: the registry does not close it between two turns.
        async with sessions_of(request).use(session_id) as session:
            await append_turns(session, count)
            return JSONResponse({"count": session.log.count})

    async def events(request: Request) -> Response:
        session_id = request.path_params["session_id"]
        try:
            since, why = resume_point(request)
            # Opened here, so that a bad id is a 400 rather than a stream that ends at once.
            await sessions_of(request).get(session_id)
        except ValueError as error:
            return JSONResponse({"error": str(error)}, status_code=400)
        logger.info("stream of %r from seq %d (%s)", session_id, since, why)
        return event_stream(sessions_of(request).use(session_id), since)

    hosts = [*LOOPBACK_HOSTS, *(host_pattern(host) for host in allowed_hosts)]
    return Starlette(
        # The suffixed routes first: an id may contain "/", so "/sessions/{id:path}" alone
        # would take ".../events" for the page of a session whose id ends in "/events".
        routes=[
            Route("/", index),
            Mount("/agui", streams.app),
            Route("/sessions/{session_id:path}/events", events),
            Route("/sessions/{session_id:path}/surface", surface),
            Route("/sessions/{session_id:path}/turns", turns, methods=["POST"]),
            Route("/sessions/{session_id:path}", show),
        ],
        middleware=[
            # The Host check first: a DNS-rebinding page names its own host, and is refused
            # before anything is read; then a foreign page's POST is refused by its Origin.
            Middleware(TrustedHostMiddleware, allowed_hosts=hosts, www_redirect=False),
            Middleware(SameOriginMiddleware, allowed_origins=allowed_origins),
        ],
        lifespan=lifespan,
    )


async def append_offline(store_url: str, session_id: str, count: int) -> int:
    """Append ``count`` turns straight to the store, from this process; the count.

    A server running on the same file sees them (it follows the file). Its compactions may
    land between two of these appends: ``on_conflict="rebase"`` puts each append after them
    instead of failing it."""
    async with SessionActor.open(
        session_id=session_id,
        store=store_url,
        compaction=default_policy(),
        on_conflict="rebase",
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
    serve.add_argument(
        "--idle-timeout",
        type=float,
        default=IDLE_TIMEOUT,
        help="seconds after which a session nobody uses is closed",
    )
    serve.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a Host name to accept besides loopback and --host (a reverse proxy's public name)",
    )
    serve.add_argument(
        "--allow-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="an origin (https://proxy.example) whose pages may POST, besides the server's own",
    )
    append = commands.add_parser(
        "append", help="append turns from this process (a running server follows them)"
    )
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
        create_app(
            args.store,
            idle_timeout=args.idle_timeout,
            allowed_hosts=[args.host, *args.allow_host],
            allowed_origins=args.allow_origin,
        ),
        host=args.host,
        port=args.port,
        log_level="info",
        # Streams end at shutdown (sse-starlette watches for it); this bounds the rest.
        timeout_graceful_shutdown=5,
    )


if __name__ == "__main__":
    main()
