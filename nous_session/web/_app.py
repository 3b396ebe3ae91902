"""The ASGI endpoints over a :class:`~nous_session.Sessions` registry, and who may use them."""

from __future__ import annotations

import inspect
import ipaddress
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Final, Literal, TypeAlias

from ag_ui.core import RunAgentInput
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from nous_session import CompactionPolicy, Sessions, Store
from nous_session.errors import StoreError
from nous_session.web._live import LiveChannels
from nous_session.web._native import event_stream
from nous_session.web._run_host import Agent, RunHost, ThreadBusyError
from nous_session.web._runs import BodyTooLargeError, check_positive, read_body
from nous_session.web._sse import SLOW_CLIENT_SECONDS, Outbox, resume_point, stream_response
from nous_session.web._streams import connect_stream, resume_notice, run_stream

__all__ = [
    "MAX_BODY_SIZE",
    "RUN_LEASE_TTL",
    "Access",
    "Authorize",
    "SessionStreams",
    "create_app",
    "is_loopback",
]

logger = logging.getLogger("nous_session.web")

Access: TypeAlias = Literal["read", "write"]
"""What a request wants of a thread: read its stream, or write to it (start a run)."""

Authorize: TypeAlias = Callable[[Request, str, Access], Awaitable[bool] | bool]
"""The application's answer to "may this request read (or write) this thread?"."""

MAX_BODY_SIZE: Final = 8 * 1024 * 1024
"""The largest request body (bytes) ``POST /run`` and ``POST /connect`` take by default: an
AG-UI client sends the thread's whole history with every run."""
RUN_LEASE_TTL: Final = 30.0
"""How long (seconds) a thread stays claimed by a run whose worker stopped renewing it."""


def is_loopback(request: Request) -> bool:
    """Whether the request came from this machine (its peer is a loopback address)."""
    client = request.client
    if client is None:
        return False
    try:
        return ipaddress.ip_address(client.host).is_loopback
    except ValueError:
        return client.host == "localhost"


def _loopback_only(request: Request, thread_id: str, access: Access) -> bool:
    return is_loopback(request)


class SessionStreams:
    """AG-UI streams (and the library's own SSE stream) of the sessions of one store.

    ``streams.app`` is an ASGI application to mount in the application's own Starlette or
    FastAPI app; ``streams.lifespan`` must run for as long as it serves (pass it as, or enter
    it in, the application's lifespan: Starlette runs no lifespan of a mounted app). The
    lifespan opens the registry (when given a store rather than a :class:`Sessions`) and owns
    the task group the runs' agents run in, detached from the requests that started them.

    Routes of ``app``:

    * ``POST /run``: an AG-UI ``RunAgentInput``; appends the messages the session does not
      hold yet (by message id), starts the agent and streams the run. A thread runs one run
      at a time: another run asked for meanwhile, on this worker or any other on the same
      store, gets 409 and appends nothing (through the store's ``"ag-ui-run"`` lease; a store
      without leases is checked per process only). A retry of the run going on streams it
      again. Messages that cannot be appended (too large, say) get 400 and append none.
    * ``POST /connect`` (an AG-UI ``RunAgentInput``: its thread id) and
      ``GET /connect?thread_id=``: hydrate, then follow the run going on; honour
      ``Last-Event-ID``.
    * ``GET /threads/{thread_id}/events``: the library's own SSE format (one JSON object per
      committed event), as the example's page and ``nous-session tail`` read it.

    Args:
        sessions: a :class:`Sessions` registry (the application opens and closes it), or a
            store or store URL for one that the lifespan opens with ``compaction``,
            ``idle_timeout``, ``max_open`` and ``on_conflict="rebase"`` (other workers may
            write to the same sessions).
        agent: the function each run calls; None serves the streams and refuses runs.
        authorize: ``(request, thread_id, access) -> bool`` (or an awaitable of it); None lets
            only loopback clients in.
        slow_client_timeout: how long a stream waits for its client to take a chunk while
            its 64-chunk buffer is full before it ends, telling the client the cursor to
            resume from; a client that takes nothing for six times as long is disconnected.
        max_body_size: the largest body (bytes) a ``POST`` may have; a larger one gets 413,
            read no further than this.
        run_lease_ttl: seconds a run's claim to its thread lasts unless its worker renews it
            (it does every third of that while the agent runs): how long a thread whose
            worker died stays busy, and how long a worker may stall (or its store fail) before
            its run may lose the thread; a run whose claim lapsed stops.

    Raises:
        ValueError: ``slow_client_timeout``, ``max_body_size`` or ``run_lease_ttl`` is not
            a positive number (``run_lease_ttl`` at most a day, ``max_body_size`` an int).
    """

    def __init__(
        self,
        sessions: Sessions | Store | str,
        agent: Agent | None = None,
        *,
        authorize: Authorize | None = None,
        compaction: CompactionPolicy | None = None,
        idle_timeout: float = 60.0,
        max_open: int = 10_000,
        slow_client_timeout: float = SLOW_CLIENT_SECONDS,
        max_body_size: int = MAX_BODY_SIZE,
        run_lease_ttl: float = RUN_LEASE_TTL,
    ) -> None:
        if not slow_client_timeout > 0:
            raise ValueError(f"slow_client_timeout must be positive, got {slow_client_timeout!r}")
        if isinstance(max_body_size, bool) or not isinstance(max_body_size, int):
            raise ValueError(f"max_body_size must be an int, got {max_body_size!r}")
        check_positive("max_body_size", max_body_size)
        lease_ttl = check_positive("run_lease_ttl", run_lease_ttl, most=86_400)
        self._max_body_size = max_body_size
        self._slow_client_timeout = slow_client_timeout
        self._given = sessions if isinstance(sessions, Sessions) else None
        self._store = sessions
        self._authorize = authorize or _loopback_only
        self._compaction = compaction
        self._idle_timeout = idle_timeout
        self._max_open = max_open
        self._sessions: Sessions | None = None
        self._channels = LiveChannels()  # the threads' live drafts, shared by runs and streams
        self._runs = None if agent is None else RunHost(agent, self._channels, lease_ttl)
        self.app = Starlette(
            routes=[
                Route("/run", self._run, methods=["POST"]),
                Route("/connect", self._connect, methods=["GET", "POST"]),
                Route("/threads/{thread_id:path}/events", self._events),
            ]
        )

    @asynccontextmanager
    async def lifespan(self, app: object = None) -> AsyncIterator[None]:
        """Serve: open the registry if this owns it, and host the runs' agents; on exit,
        cancel the runs still going (each records that it failed) and close."""
        async with AsyncExitStack() as stack:
            sessions = self._given
            if sessions is None:
                store = self._store
                assert not isinstance(store, Sessions)
                sessions = await stack.enter_async_context(
                    Sessions(
                        store,
                        compaction=self._compaction,
                        idle_timeout=self._idle_timeout,
                        max_open=self._max_open,
                        on_conflict="rebase",
                    )
                )
            if self._runs is not None:
                await stack.enter_async_context(self._runs.hosting())
            self._sessions = sessions
            try:
                yield
            finally:
                self._sessions = None

    @property
    def sessions(self) -> Sessions:
        """The registry, while the lifespan runs."""
        if self._sessions is None:
            raise RuntimeError("SessionStreams.lifespan is not running")
        return self._sessions

    async def _allowed(self, request: Request, thread_id: str, access: Access) -> bool:
        answer = self._authorize(request, thread_id, access)
        if inspect.isawaitable(answer):
            answer = await answer
        return answer is True

    async def _checked(self, request: Request, thread_id: str, access: Access) -> Response | None:
        """The refusal for a request that may not have ``access`` to ``thread_id``."""
        if not await self._allowed(request, thread_id, access):
            logger.warning("refused %s access to thread %r", access, thread_id)
            return JSONResponse({"error": "forbidden"}, status_code=403)
        return None

    async def _body(self, request: Request) -> RunAgentInput | Response:
        """The request's ``RunAgentInput``, or the response that refuses it: 413 for a body
        over ``max_body_size``, 422 for one that is not a ``RunAgentInput``."""
        try:
            return RunAgentInput.model_validate_json(await read_body(request, self._max_body_size))
        except BodyTooLargeError as error:
            return JSONResponse({"error": str(error)}, status_code=413)
        except ValidationError as error:
            return JSONResponse({"error": str(error)}, status_code=422)

    async def _run(self, request: Request) -> Response:
        run = await self._body(request)
        if isinstance(run, Response):
            return run
        refused = await self._checked(request, run.thread_id, "write")
        if refused is not None:
            return refused
        if self._runs is None:
            return JSONResponse({"error": "this server runs no agent"}, status_code=404)
        try:
            since = await self._runs.begin(self.sessions, run)
        except ThreadBusyError as error:
            return JSONResponse({"error": str(error)}, status_code=409)
        except ValueError as error:
            return JSONResponse({"error": str(error)}, status_code=400)
        except StoreError as error:
            logger.warning(
                "run %r of thread %r not started: the store failed: %r",
                run.run_id,
                run.thread_id,
                error,
            )
            return JSONResponse({"error": f"the store failed: {error}"}, status_code=503)
        skip = frozenset(message.id for message in run.messages)  # the client has them

        async def produce(outbox: Outbox) -> None:
            async with (
                self.sessions.use(run.thread_id) as session,
                self._channels.hold(run.thread_id) as channel,
            ):
                await run_stream(
                    session, channel, run.thread_id, run.run_id, since, skip, outbox.send
                )

        return stream_response(
            produce, resume_notice, slow_client_timeout=self._slow_client_timeout
        )

    async def _connect(self, request: Request) -> Response:
        if request.method == "POST":
            given = await self._body(request)
            if isinstance(given, Response):
                return given
            thread_id, run_id = given.thread_id, given.run_id
        else:
            thread_id = request.query_params.get("thread_id", "")
            run_id = request.query_params.get("run_id") or str(uuid.uuid4())
        resumed = await self._resume(request, thread_id)
        if isinstance(resumed, Response):
            return resumed
        since, why = resumed
        start = None if why == "start" else since

        async def produce(outbox: Outbox) -> None:
            async with (
                self.sessions.use(thread_id) as session,
                self._channels.hold(thread_id) as channel,
            ):
                await connect_stream(session, channel, thread_id, run_id, start, outbox.send)

        return stream_response(
            produce, resume_notice, slow_client_timeout=self._slow_client_timeout
        )

    async def _resume(self, request: Request, thread_id: str) -> tuple[int, str] | Response:
        """Where a read stream of ``thread_id`` starts, ``(since, why)``, or the response that
        refuses it: 403 from the access check, 400 for a bad thread id or resume point."""
        refused = await self._checked(request, thread_id, "read")
        if refused is not None:
            return refused
        try:
            since, why = resume_point(request)
            await self._check_resume_point(thread_id, since, why)
        except ValueError as error:
            return JSONResponse({"error": str(error)}, status_code=400)
        return since, why

    async def _check_resume_point(self, thread_id: str, since: int, why: str) -> None:
        """Open the thread and check that a stream may start at ``since`` (its end at most).

        A point past the end is first checked against the store (another worker may have
        committed what this one has not read yet).

        Raises:
            ValueError: a bad thread id, or ``since`` is past the thread's end (a cursor of
                another thread: the stream would skip what comes next).
        """
        async with self.sessions.use(thread_id) as session:
            if since <= session.log.count:
                return
            count = (await session.reload()).count
        if since > count:
            given = since - 1 if why == "Last-Event-ID" else since
            raise ValueError(
                f"{why} {given} is past the end of thread {thread_id!r} ({count} events):"
                f" a cursor of another thread?"
            )

    async def _events(self, request: Request) -> Response:
        thread_id = request.path_params["thread_id"]
        resumed = await self._resume(request, thread_id)
        if isinstance(resumed, Response):
            return resumed
        since, why = resumed
        logger.info("stream of %r from seq %d (%s)", thread_id, since, why)
        return event_stream(
            self.sessions.use(thread_id), since, slow_client_timeout=self._slow_client_timeout
        )


def create_app(
    store: Sessions | Store | str,
    agent: Agent | None = None,
    *,
    authorize: Authorize | None = None,
    compaction: CompactionPolicy | None = None,
    max_body_size: int = MAX_BODY_SIZE,
    run_lease_ttl: float = RUN_LEASE_TTL,
) -> Starlette:
    """A Starlette app serving :class:`SessionStreams` at its root, with its lifespan (the
    keywords are :class:`SessionStreams`'s)."""
    streams = SessionStreams(
        store,
        agent,
        authorize=authorize,
        compaction=compaction,
        max_body_size=max_body_size,
        run_lease_ttl=run_lease_ttl,
    )
    app = Starlette(routes=streams.app.routes, lifespan=streams.lifespan)
    app.state.streams = streams
    return app
