"""The ASGI endpoints over a :class:`~nous_session.Sessions` registry, and who may use them."""

from __future__ import annotations

import inspect
import ipaddress
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any, Literal, TypeAlias

import anyio
import anyio.abc
from ag_ui.core import RunAgentInput
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from nous_session import CompactionPolicy, SessionActor, Sessions, Store
from nous_session.web._agui import (
    RUN_ERROR,
    RUN_FINISHED,
    RUN_STARTED,
    from_agui,
    is_known,
    known_message_ids,
)
from nous_session.web._live import LiveChannel, current_channel
from nous_session.web._native import event_stream
from nous_session.web._sse import SLOW_CLIENT_SECONDS, Outbox, resume_point, stream_response
from nous_session.web._streams import connect_stream, resume_notice, run_stream

__all__ = ["Access", "Agent", "Authorize", "SessionStreams", "create_app", "is_loopback"]

logger = logging.getLogger("nous_session.web")

Access: TypeAlias = Literal["read", "write"]
"""What a request wants of a thread: read its stream, or write to it (start a run)."""

Authorize: TypeAlias = Callable[[Request, str, Access], Awaitable[bool] | bool]
"""The application's answer to "may this request read (or write) this thread?"."""

Agent: TypeAlias = Callable[[SessionActor, RunAgentInput], Awaitable[None]]
"""The application's agent: it runs one AG-UI run, writing to the session through the actor
(``add_message``, ``append``); the run ends when it returns, and fails if it raises."""

# How long a run that is cancelled (the server stops) may take to record that it ended.
_END_GRACE = 5.0


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
      hold yet (by message id), starts the agent and streams the run.
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
    ) -> None:
        if not slow_client_timeout > 0:
            raise ValueError(f"slow_client_timeout must be positive, got {slow_client_timeout!r}")
        self._slow_client_timeout = slow_client_timeout
        self._given = sessions if isinstance(sessions, Sessions) else None
        self._store = sessions
        self._agent = agent
        self._authorize = authorize or _loopback_only
        self._compaction = compaction
        self._idle_timeout = idle_timeout
        self._max_open = max_open
        self._sessions: Sessions | None = None
        self._task_group: anyio.abc.TaskGroup | None = None
        self._running: dict[str, str] = {}  # thread id -> the run this worker runs on it
        self._channels: dict[str, LiveChannel] = {}  # thread id -> its live drafts, while used
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
            task_group = await stack.enter_async_context(anyio.create_task_group())
            self._sessions, self._task_group = sessions, task_group
            try:
                yield
            finally:
                task_group.cancel_scope.cancel()
                self._sessions = self._task_group = None

    @property
    def sessions(self) -> Sessions:
        """The registry, while the lifespan runs."""
        if self._sessions is None:
            raise RuntimeError("SessionStreams.lifespan is not running")
        return self._sessions

    @asynccontextmanager
    async def _channel(self, thread_id: str) -> AsyncIterator[LiveChannel]:
        """The thread's live channel, held for the block (dropped when nobody holds it)."""
        channel = self._channels.get(thread_id)
        if channel is None:
            channel = self._channels[thread_id] = LiveChannel()
        channel.users += 1
        try:
            yield channel
        finally:
            channel.users -= 1
            if channel.users == 0:
                del self._channels[thread_id]

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

    async def _run(self, request: Request) -> Response:
        try:
            run = RunAgentInput.model_validate_json(await request.body())
        except ValidationError as error:
            return JSONResponse({"error": str(error)}, status_code=422)
        refused = await self._checked(request, run.thread_id, "write")
        if refused is not None:
            return refused
        if self._agent is None:
            return JSONResponse({"error": "this server runs no agent"}, status_code=404)
        running = self._running.get(run.thread_id)
        if running is not None and running != run.run_id:
            return JSONResponse(
                {"error": f"run {running!r} is going on in this thread"}, status_code=409
            )
        # The thread is this run's from now on: another run asked for while this one's
        # messages are appended is refused, not started beside it.
        reserved = running is None
        if reserved:
            self._running[run.thread_id] = run.run_id
        started = False
        try:
            async with self.sessions.use(run.thread_id) as session:
                since, skip, started = await self._start(session, run)
        except ValueError as error:
            return JSONResponse({"error": str(error)}, status_code=400)
        finally:
            if reserved and not started and self._running.get(run.thread_id) == run.run_id:
                del self._running[run.thread_id]

        async def produce(outbox: Outbox) -> None:
            async with (
                self.sessions.use(run.thread_id) as session,
                self._channel(run.thread_id) as channel,
            ):
                await run_stream(
                    session, channel, run.thread_id, run.run_id, since, skip, outbox.send
                )

        return stream_response(
            produce, resume_notice, slow_client_timeout=self._slow_client_timeout
        )

    async def _start(
        self, session: SessionActor, run: RunAgentInput
    ) -> tuple[int, frozenset[str], bool]:
        """Record the run's start and the client's new messages, start the agent; the seq to
        stream from, the message ids the client has, and whether the agent was started.

        A run id the session has seen before is a client retrying: nothing is appended again
        and its stream is sent again from its start.
        """
        log = session.log
        known, count = known_message_ids(log), log.count
        # The client's messages first: a client that resumes the run's stream after its
        # start is not sent back what it sent. Each is appended with a key of its id, which
        # the store keeps through an erasure (that drops the id from the message's metadata):
        # a client that resends an erased message does not bring it back.
        for given in run.messages:
            if is_known(given.id, known, count):
                continue
            message = from_agui(given)
            if message is not None:
                await session.add_message(message, key=f"ag-ui-message:{given.id}")
        started = await session.append(
            RUN_STARTED, {"run_id": run.run_id}, key=f"ag-ui-run:{run.run_id}"
        )
        skip = frozenset(message.id for message in run.messages)
        if started.seq < count:
            return started.seq, skip, False
        task_group = self._task_group
        assert task_group is not None  # the lifespan runs: self.sessions answered
        task_group.start_soon(self._host, run)
        return started.seq, skip, True

    async def _host(self, run: RunAgentInput) -> None:
        """Run the agent, then record how the run ended (in the log, for every client)."""
        agent = self._agent
        assert agent is not None
        outcome: tuple[str, dict[str, Any]] = (RUN_FINISHED, {"run_id": run.run_id})
        try:
            async with (
                self.sessions.use(run.thread_id) as session,
                self._channel(run.thread_id) as channel,
            ):
                # The agent's live_message() blocks find the thread's channel through this.
                current_channel.set(channel)
                try:
                    await agent(session, run)
                except anyio.get_cancelled_exc_class():
                    outcome = (RUN_ERROR, {"run_id": run.run_id, "message": "server stopped"})
                    raise
                except Exception as error:
                    logger.exception("run %r of thread %r failed", run.run_id, run.thread_id)
                    message = f"{type(error).__name__}: {error}"
                    outcome = (RUN_ERROR, {"run_id": run.run_id, "message": message})
                finally:
                    with anyio.CancelScope(shield=True), anyio.move_on_after(_END_GRACE):
                        await session.append(*outcome, key=f"ag-ui-run-end:{run.run_id}")
        finally:
            if self._running.get(run.thread_id) == run.run_id:
                del self._running[run.thread_id]

    async def _connect(self, request: Request) -> Response:
        if request.method == "POST":
            try:
                given = RunAgentInput.model_validate_json(await request.body())
            except ValidationError as error:
                return JSONResponse({"error": str(error)}, status_code=422)
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
            async with self.sessions.use(thread_id) as session, self._channel(thread_id) as channel:
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
) -> Starlette:
    """A Starlette app serving :class:`SessionStreams` at its root, with its lifespan."""
    streams = SessionStreams(store, agent, authorize=authorize, compaction=compaction)
    app = Starlette(routes=streams.app.routes, lifespan=streams.lifespan)
    app.state.streams = streams
    return app
