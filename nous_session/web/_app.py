"""The ASGI endpoints over a :class:`~nous_session.Sessions` registry, and who may use them."""

from __future__ import annotations

import inspect
import ipaddress
import logging
import secrets
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any, Final, Literal, TypeAlias

import anyio
import anyio.abc
from ag_ui.core import RunAgentInput
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from nous_session import CompactionPolicy, LeasingStore, Message, SessionActor, Sessions, Store
from nous_session.errors import SessionClosedError, StoreError
from nous_session.event import check_size, message_event
from nous_session.stores.base import supports
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
from nous_session.web._runs import BodyTooLargeError, RunLease, check_positive, read_body
from nous_session.web._sse import SLOW_CLIENT_SECONDS, Outbox, resume_point, stream_response
from nous_session.web._streams import active_run, connect_stream, resume_notice, run_stream

__all__ = [
    "MAX_BODY_SIZE",
    "RUN_LEASE_TTL",
    "Access",
    "Agent",
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

Agent: TypeAlias = Callable[[SessionActor, RunAgentInput], Awaitable[None]]
"""The application's agent: it runs one AG-UI run, writing to the session through the actor
(``add_message``, ``append``); the run ends when it returns, and fails if it raises."""

# How long a run that is cancelled (the server stops) may take to record that it ended.
_END_GRACE = 5.0
# How long a run asked for on a thread whose last run has ended, but whose lease another
# worker has not released yet, waits for it (polling every _HANDOVER_POLL) before a 409.
_HANDOVER = 2.0
_HANDOVER_POLL = 0.05
MAX_BODY_SIZE: Final = 8 * 1024 * 1024
"""The largest request body (bytes) ``POST /run`` and ``POST /connect`` take by default: an
AG-UI client sends the thread's whole history with every run."""
RUN_LEASE_TTL: Final = 30.0
"""How long (seconds) a thread stays claimed by a run whose worker stopped renewing it."""
# The end recorded for a run found going on by the worker that took its thread's lease.
ORPHANED: Final = (
    "its server stopped or stalled: it did not renew its claim to the thread within"
    " run_lease_ttl, and another run took it"
)


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
        self._run_lease_ttl = check_positive("run_lease_ttl", run_lease_ttl, most=86_400)
        self._max_body_size = max_body_size
        self._slow_client_timeout = slow_client_timeout
        self._worker = secrets.token_hex(8)  # this worker's part of its lease holders' ids
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
        # thread id -> set once the run ending on it has given the thread up
        self._ending: dict[str, anyio.Event] = {}
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
        if self._agent is None:
            return JSONResponse({"error": "this server runs no agent"}, status_code=404)
        running = self._running.get(run.thread_id)
        while running is not None and running != run.run_id and run.thread_id in self._ending:
            # A run that is recording its end: its client may have seen it and asked for the
            # next one already. That one waits for the thread (bounded: see _host).
            await self._ending[run.thread_id].wait()
            running = self._running.get(run.thread_id)
        if running is not None and running != run.run_id:
            return JSONResponse(
                {"error": f"run {running!r} is going on in this thread"}, status_code=409
            )
        # The thread is this run's from now on: another run asked for while this one's
        # messages are appended is refused, not started beside it. A retry of the run this
        # worker runs (running == run id) neither reserves nor leases: the run holds both.
        reserved = running is None
        if reserved:
            self._running[run.thread_id] = run.run_id
        lease: RunLease | None = None
        started = False
        try:
            async with self.sessions.use(run.thread_id) as session:
                if reserved:
                    lease = self._lease(session, run)
                    if lease is not None:
                        busy = await self._claim(session, lease, run)
                        if busy is not None:
                            lease = None  # not taken: nothing to release
                            return busy
                since, skip, started = await self._start(session, run, lease)
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
        finally:
            if not started:
                if lease is not None:
                    await lease.release()
                if reserved and self._running.get(run.thread_id) == run.run_id:
                    del self._running[run.thread_id]
        return self._run_response(run, since, skip)

    def _run_response(self, run: RunAgentInput, since: int, skip: frozenset[str]) -> Response:
        """The stream of ``run`` from ``since`` (its start marker's seq)."""

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

    def _lease(self, session: SessionActor, run: RunAgentInput) -> RunLease | None:
        """The run's lease on its thread, or None when the store keeps none (then only this
        process's check holds)."""
        store = session.store
        if not supports(store, LeasingStore):
            return None
        return RunLease(store, run.thread_id, self._worker, run.run_id, self._run_lease_ttl)

    async def _claim(
        self, session: SessionActor, lease: RunLease, run: RunAgentInput
    ) -> Response | None:
        """Take the thread's run lease for ``run``; the response when another run holds it:
        409, or, when that run is ``run`` itself (its client retries through another worker),
        its stream again from its start.

        Raises:
            StoreError: the store failed (nothing was taken).
        """
        if await lease.take():
            return None
        log = await session.reload()
        active, _ = active_run(log.events())
        with anyio.move_on_after(min(_HANDOVER, self._run_lease_ttl)):
            while active is None:
                # The last run has ended and its worker is giving the thread up, or a run is
                # appending its messages: either is over in a moment.
                await anyio.sleep(_HANDOVER_POLL)
                if await lease.take():
                    return None
                log = await session.reload()
                active, _ = active_run(log.events())
        if active == run.run_id:
            for event in log.events():
                if event.type == RUN_STARTED and event.data.get("run_id") == run.run_id:
                    skip = frozenset(message.id for message in run.messages)
                    return self._run_response(run, event.seq, skip)
        going = "another run" if active is None else f"run {active!r}"
        return JSONResponse(
            {"error": f"{going} is going on in this thread (on another worker)"},
            status_code=409,
        )

    async def _start(
        self, session: SessionActor, run: RunAgentInput, lease: RunLease | None
    ) -> tuple[int, frozenset[str], bool]:
        """Record the run's start and the client's new messages, start the agent; the seq to
        stream from, the message ids the client has, and whether the agent was started.

        A run id the session has seen before is a client retrying: nothing is appended again
        and its stream is sent again from its start. With the thread's ``lease`` taken, a run
        the log shows going on is one whose worker stopped or stalled (it would hold the
        lease): its end is recorded (failed) first.

        Raises:
            ValueError: a message cannot be appended (larger than the session's
                ``max_event_size``, say): nothing was appended.
        """
        if lease is not None:
            # Everything other workers committed before the lease was taken, their runs' ends
            # among it.
            await session.reload()
        log = session.log
        known, count = known_message_ids(log), log.count
        new = self._new_messages(session, run, known, count)  # bad input: nothing appended
        orphan = active_run(log.events())[0] if lease is not None else None
        if orphan is not None:
            # Its worker died, or stalled for longer than the ttl: then it stops the run when
            # it learns, and its end, under the same key, is this one.
            logger.warning(
                "run %r of thread %r never ended: its server stopped or stalled",
                orphan,
                run.thread_id,
            )
            await session.append(
                RUN_ERROR,
                {"run_id": orphan, "message": ORPHANED},
                key=f"ag-ui-run-end:{orphan}",
            )
        # The client's messages first: a client that resumes the run's stream after its
        # start is not sent back what it sent. Each is appended with a key of its id, which
        # the store keeps through an erasure (that drops the id from the message's metadata):
        # a client that resends an erased message does not bring it back.
        for identifier, message in new:
            await session.add_message(message, key=f"ag-ui-message:{identifier}")
        started = await session.append(
            RUN_STARTED, {"run_id": run.run_id}, key=f"ag-ui-run:{run.run_id}"
        )
        skip = frozenset(message.id for message in run.messages)
        if started.seq < count:
            return started.seq, skip, False
        task_group = self._task_group
        assert task_group is not None  # the lifespan runs: self.sessions answered
        task_group.start_soon(self._host, run, lease)
        return started.seq, skip, True

    @staticmethod
    def _new_messages(
        session: SessionActor, run: RunAgentInput, known: set[str], count: int
    ) -> list[tuple[str, Message]]:
        """``(id, message)`` for each message of ``run`` the session does not hold (by id),
        each checked as the session will append it, before any is.

        Raises:
            ValueError: naming the first message that cannot be appended, and why.
        """
        new: list[tuple[str, Message]] = []
        seen: set[str] = set()
        for given in run.messages:
            if given.id in seen or is_known(given.id, known, count):
                continue
            seen.add(given.id)
            try:
                message = from_agui(given)
                if message is None:
                    continue
                event_type, data = message_event(message)
                check_size(event_type, data, session.max_event_size)
            except ValueError as error:
                raise ValueError(f"message {given.id!r} cannot be appended: {error}") from None
            new.append((given.id, message))
        return new

    async def _host(self, run: RunAgentInput, lease: RunLease | None) -> None:
        """Run the agent (renewing the thread's lease), then record how the run ended (in the
        log, for every client) and give the thread up.

        A run whose claim to the thread lapsed (:class:`RunLease`) stops: its agent is
        cancelled and its end recorded as failed, saying why. It releases the lease only when
        the store's last word was that it holds it (not another run's, nor lapsed).
        """
        agent = self._agent
        assert agent is not None
        outcome: tuple[str, dict[str, Any]] = (RUN_FINISHED, {"run_id": run.run_id})
        finished = anyio.Event()
        working = anyio.CancelScope()  # the agent's: cancelled when the run must stop
        try:
            async with (
                self.sessions.use(run.thread_id) as session,
                self._channel(run.thread_id) as channel,
                anyio.create_task_group() as keeping,
            ):

                async def still_running() -> bool:
                    log = await session.reload()
                    return active_run(log.events())[0] == run.run_id

                if lease is not None:
                    keeping.start_soon(lease.keep, finished, working.cancel, still_running)
                try:
                    # The agent's live_message() blocks find the thread's channel here.
                    current_channel.set(channel)
                    try:
                        with working:
                            await agent(session, run)
                    except anyio.get_cancelled_exc_class():
                        outcome = (RUN_ERROR, {"run_id": run.run_id, "message": "server stopped"})
                        raise
                    except Exception as error:
                        logger.exception("run %r of thread %r failed", run.run_id, run.thread_id)
                        message = f"{type(error).__name__}: {error}"
                        outcome = (RUN_ERROR, {"run_id": run.run_id, "message": message})
                    finally:
                        # From here the run's clients may see its end and ask for the next
                        # run: one asked for on this worker waits until the thread is free.
                        self._ending.setdefault(run.thread_id, anyio.Event())
                        with anyio.CancelScope(shield=True), anyio.move_on_after(_END_GRACE):
                            # The end is the run's last write: made while its claim holds, or
                            # as the failure of a run that lost it.
                            why = None if lease is None else await lease.settle(still_running)
                            if why is not None:
                                outcome = (RUN_ERROR, {"run_id": run.run_id, "message": why})
                            try:
                                await session.append(*outcome, key=f"ag-ui-run-end:{run.run_id}")
                            except (SessionClosedError, StoreError) as error:
                                # The thread was deleted under the run (its actor has closed:
                                # the run's streams end saying so), or the store failed: no
                                # end to record, and no reason to stop serving.
                                logger.warning(
                                    "the end of run %r of thread %r was not recorded: %s",
                                    run.run_id,
                                    run.thread_id,
                                    error,
                                )
                finally:
                    # The renewal ends by itself, not by a cancellation.
                    finished.set()
        finally:
            if lease is not None and lease.holds:
                await lease.release()
            if self._running.get(run.thread_id) == run.run_id:
                del self._running[run.thread_id]
            ending = self._ending.pop(run.thread_id, None)
            if ending is not None:
                ending.set()

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
