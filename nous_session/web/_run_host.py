"""The agent's runs on one worker: a run's thread claimed, its start recorded, its agent run
detached from the request that asked for it, and its end recorded.

A thread runs one run at a time: this worker refuses a second one while its own goes on, and
the store's run lease (:class:`~nous_session.web._runs.RunLease`) refuses it on every other
worker. Run markers in the log (``ag_ui.run_started`` and its end) are what lets any worker
tell whether a run is still going.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, Final, TypeAlias

import anyio
import anyio.abc
from ag_ui.core import RunAgentInput

from nous_session import LeasingStore, Log, Message, SessionActor, Sessions
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
from nous_session.web._live import LiveChannels, current_channel
from nous_session.web._runs import RunLease
from nous_session.web._streams import active_run

__all__ = ["ORPHANED", "Agent", "RunHost", "ThreadBusyError"]

logger = logging.getLogger("nous_session.web")

Agent: TypeAlias = Callable[[SessionActor, RunAgentInput], Awaitable[None]]
"""The application's agent: it runs one AG-UI run, writing to the session through the actor
(``add_message``, ``append``); the run ends when it returns, and fails if it raises."""

# How long a run that is cancelled (the server stops) may take to record that it ended.
_END_GRACE = 5.0
# How long a run asked for on a thread whose last run has ended, but whose lease another
# worker has not released yet, waits for it (polling every _HANDOVER_POLL) before a 409.
_HANDOVER = 2.0
_HANDOVER_POLL = 0.05
# The end recorded for a run found going on by the worker that took its thread's lease.
ORPHANED: Final = (
    "its server stopped or stalled: it did not renew its claim to the thread within"
    " run_lease_ttl, and another run took it"
)


class ThreadBusyError(Exception):
    """Another run is going on in the thread (the message says which, and where)."""


class RunHost:
    """The runs of one :class:`~nous_session.web.SessionStreams`' agent: which thread runs
    what on this worker, and each run from its claim to its recorded end.

    :meth:`begin` claims the run's thread (in this process, and through the store's lease
    across workers), appends the client's new messages and the run's start, and starts the
    agent in the task group of :meth:`hosting`; the agent's task renews the lease, records how
    the run ended (in the log, for every client) and gives the thread up.

    Args:
        agent: the function each run calls.
        channels: the threads' live channels: the agent's live messages go to its thread's.
        lease_ttl: seconds a run's claim to its thread lasts unless renewed (:class:`RunLease`).
    """

    def __init__(self, agent: Agent, channels: LiveChannels, lease_ttl: float) -> None:
        self._agent = agent
        self._channels = channels
        self._lease_ttl = lease_ttl
        self._worker = secrets.token_hex(8)  # this worker's part of its lease holders' ids
        self._task_group: anyio.abc.TaskGroup | None = None
        self._running: dict[str, str] = {}  # thread id -> the run this worker runs on it
        # thread id -> set once the run ending on it has given the thread up
        self._ending: dict[str, anyio.Event] = {}

    @asynccontextmanager
    async def hosting(self) -> AsyncIterator[None]:
        """Own the task group the agents run in; on exit, cancel the runs still going (each
        records that it failed) and wait for them."""
        async with anyio.create_task_group() as task_group:
            self._task_group = task_group
            try:
                yield
            finally:
                task_group.cancel_scope.cancel()
                self._task_group = None

    async def begin(self, sessions: Sessions, run: RunAgentInput) -> int:
        """Claim ``run``'s thread, record the client's new messages and the run's start, and
        start its agent; the seq of the run's start, to stream it from.

        A run id the session has seen before is a client retrying: nothing is appended again
        and its start is the one recorded (on this worker or another that runs it).

        Raises:
            ThreadBusyError: another run is going on in the thread; nothing was appended.
            ValueError: a bad thread id, or a message cannot be appended (larger than the
                session's ``max_event_size``, say): nothing was appended.
            StoreError: the store failed.
        """
        running = self._running.get(run.thread_id)
        while running is not None and running != run.run_id and run.thread_id in self._ending:
            # A run that is recording its end: its client may have seen it and asked for the
            # next one already. That one waits for the thread (bounded: see _host).
            await self._ending[run.thread_id].wait()
            running = self._running.get(run.thread_id)
        if running is not None and running != run.run_id:
            raise ThreadBusyError(f"run {running!r} is going on in this thread")
        # The thread is this run's from now on: another run asked for while this one's
        # messages are appended is refused, not started beside it. A retry of the run this
        # worker runs (running == run id) neither reserves nor leases: the run holds both.
        reserved = running is None
        if reserved:
            self._running[run.thread_id] = run.run_id
        lease: RunLease | None = None
        started = False
        try:
            async with sessions.use(run.thread_id) as session:
                if reserved:
                    lease = self._lease(session, run)
                    if lease is not None:
                        log = await self._claim(session, lease)
                        if log is not None:
                            lease = None  # not taken: nothing to release
                            return _started_elsewhere(log, run)
                since, started = await self._start(sessions, session, run, lease)
        finally:
            if not started:
                if lease is not None:
                    await lease.release()
                if reserved and self._running.get(run.thread_id) == run.run_id:
                    del self._running[run.thread_id]
        return since

    def _lease(self, session: SessionActor, run: RunAgentInput) -> RunLease | None:
        """The run's lease on its thread, or None when the store keeps none (then only this
        process's check holds)."""
        store = session.store
        if not supports(store, LeasingStore):
            return None
        return RunLease(store, run.thread_id, self._worker, run.run_id, self._lease_ttl)

    async def _claim(self, session: SessionActor, lease: RunLease) -> Log | None:
        """Take the thread's run lease: None once taken, else the log as last read (another
        run holds the lease, or the last one has not given it up within the handover).

        Raises:
            StoreError: the store failed (nothing was taken).
        """
        if await lease.take():
            return None
        log = await session.reload()
        active, _ = active_run(log.events())
        with anyio.move_on_after(min(_HANDOVER, self._lease_ttl)):
            while active is None:
                # The last run has ended and its worker is giving the thread up, or a run is
                # appending its messages: either is over in a moment.
                await anyio.sleep(_HANDOVER_POLL)
                if await lease.take():
                    return None
                log = await session.reload()
                active, _ = active_run(log.events())
        return log

    async def _start(
        self, sessions: Sessions, session: SessionActor, run: RunAgentInput, lease: RunLease | None
    ) -> tuple[int, bool]:
        """Record the run's start and the client's new messages, start the agent; the seq to
        stream from, and whether the agent was started.

        With the thread's ``lease`` taken, a run the log shows going on is one whose worker
        stopped or stalled (it would hold the lease): its end is recorded (failed) first.

        Raises:
            ValueError: a message cannot be appended: nothing was appended.
        """
        if lease is not None:
            # Everything other workers committed before the lease was taken, their runs' ends
            # among it.
            await session.reload()
        log = session.log
        known, count = known_message_ids(log), log.count
        new = _new_messages(session, run, known, count)  # bad input: nothing appended
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
        if started.seq < count:
            return started.seq, False
        task_group = self._task_group
        assert task_group is not None  # the lifespan runs: its registry answered
        task_group.start_soon(self._host, sessions, run, lease)
        return started.seq, True

    async def _host(self, sessions: Sessions, run: RunAgentInput, lease: RunLease | None) -> None:
        """Run the agent (renewing the thread's lease), then record how the run ended (in the
        log, for every client) and give the thread up.

        A run whose claim to the thread lapsed (:class:`RunLease`) stops: its agent is
        cancelled and its end recorded as failed, saying why. It releases the lease only when
        the store's last word was that it holds it (not another run's, nor lapsed).
        """
        outcome: tuple[str, dict[str, Any]] = (RUN_FINISHED, {"run_id": run.run_id})
        finished = anyio.Event()
        working = anyio.CancelScope()  # the agent's: cancelled when the run must stop
        try:
            async with (
                sessions.use(run.thread_id) as session,
                self._channels.hold(run.thread_id) as channel,
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
                            await self._agent(session, run)
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


def _started_elsewhere(log: Log, run: RunAgentInput) -> int:
    """The seq of ``run``'s start, when ``log`` shows it going on (its client retries through
    another worker than the one that runs it).

    Raises:
        ThreadBusyError: another run is going on (or none, but its lease is not given up).
    """
    active, _ = active_run(log.events())
    if active == run.run_id:
        for event in log.events():
            if event.type == RUN_STARTED and event.data.get("run_id") == run.run_id:
                return event.seq
    going = "another run" if active is None else f"run {active!r}"
    raise ThreadBusyError(f"{going} is going on in this thread (on another worker)")


def _new_messages(
    session: SessionActor, run: RunAgentInput, known: set[str], count: int
) -> list[tuple[str, Message]]:
    """``(id, message)`` for each message of ``run`` the session does not hold (by id), each
    checked as the session will append it, before any is.

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
