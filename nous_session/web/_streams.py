"""AG-UI streams read from a session's subscription: a run's, and a reconnecting client's.

Each committed event becomes one SSE chunk: the AG-UI events that stand for it, the last one
carrying the event's seq as its SSE id, so that ``Last-Event-ID`` names a point in the log.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable

from ag_ui.core import (
    BaseEvent,
    RunErrorEvent,
    RunFinishedEvent,
    RunStartedEvent,
    StateSnapshotEvent,
)
from ag_ui.encoder import EventEncoder

from nous_session import Event, Log, SessionActor
from nous_session.web._agui import (
    RUN_ERROR,
    RUN_FINISHED,
    RUN_MARKERS,
    RUN_STARTED,
    messages_snapshot,
    translate,
)

__all__ = ["active_run", "connect_stream", "encode", "run_stream"]

_ENCODER = EventEncoder()


def encode(events: Iterable[BaseEvent], seq: int | None) -> bytes:
    """``events`` as SSE messages, the last one with ``seq`` as its id (none when None)."""
    encoded = [_ENCODER.encode(event) for event in events]
    if encoded and seq is not None:
        encoded[-1] = f"id: {seq}\n{encoded[-1]}"
    return "".join(encoded).encode()


def _as_of(log: Log, event: Event) -> Log:
    """The log right after ``event``, or ``log`` itself when a snapshot dropped what that
    needs (the surface it gives is then newer, never older)."""
    try:
        return log.upto(event.seq)
    except ValueError:
        return log


def active_run(events: Iterable[Event]) -> tuple[str | None, str | None]:
    """``(run, error)`` after ``events``: the id of the run started and not yet ended, and
    the error message of the last run, if it failed."""
    run: str | None = None
    error: str | None = None
    for event in events:
        if event.type == RUN_STARTED:
            run, error = str(event.data.get("run_id", "")), None
        elif event.type in (RUN_FINISHED, RUN_ERROR):
            run = None
            if event.type == RUN_ERROR:
                error = str(event.data.get("message", "the run failed"))
    return run, error


async def run_stream(
    session: SessionActor, thread_id: str, run_id: str, since: int, skip: frozenset[str]
) -> AsyncIterator[bytes]:
    """The run ``run_id``'s stream from ``since`` (its start marker's seq) until its end
    marker. The messages in ``skip`` (the client's own) are not sent back."""
    async with session.subscribe(since) as events:
        async for event in events:
            if event.type in RUN_MARKERS and event.data.get("run_id") != run_id:
                continue  # another run's marker (another worker's): not this stream's
            chunk = translate(event, _as_of(session.log, event), thread_id, skip)
            if chunk:
                yield encode(chunk, event.seq)
            if event.type in (RUN_FINISHED, RUN_ERROR):
                return


async def connect_stream(
    session: SessionActor, thread_id: str, run_id: str, since: int | None
) -> AsyncIterator[bytes]:
    """A client's re-attach: one AG-UI run that hydrates it and follows the run going on.

    Without a resume point (``since`` None) it opens with a messages snapshot of the surface
    and a state snapshot; with one, it sends what the log committed from ``since`` on. Then it
    follows the run in progress, if any (on this worker or another), and ends when that run
    has and the stream has caught up with the log. Its run id is the run in progress's, else
    ``run_id``.
    """
    log = session.log
    held = log.events() if since is None else [e for e in log.events() if e.seq < since]
    active, error = active_run(held)
    envelope = active or run_id
    opening: list[BaseEvent] = [RunStartedEvent(thread_id=thread_id, run_id=envelope)]
    if since is None:
        opening.append(messages_snapshot(log))
        metadata = session.metadata
        if metadata is not None:
            opening.append(StateSnapshotEvent(snapshot=metadata.to_json()))
        since = log.count
    yield encode(opening, since - 1 if since > 0 else None)

    def closing() -> BaseEvent:
        if error is not None:
            return RunErrorEvent(message=error)
        return RunFinishedEvent(thread_id=thread_id, run_id=envelope)

    async with session.subscribe(since) as events:
        if active is None and since >= session.log.count:
            yield encode([closing()], None)
            return
        async for event in events:
            chunk: list[BaseEvent] = []
            if event.type in RUN_MARKERS:
                active, error = active_run([event])
            else:
                chunk = translate(event, _as_of(session.log, event), thread_id)
            if active is None and events.cursor >= session.log.count:
                yield encode([*chunk, closing()], event.seq)
                return
            if chunk:
                yield encode(chunk, event.seq)
