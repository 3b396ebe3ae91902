"""Server-Sent Events responses that end cleanly at server shutdown, and resume points."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Final, TypeAlias

import anyio
from anyio.abc import ObjectSendStream
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.requests import Request

__all__ = ["PING_SECONDS", "RETRY_MS", "Chunk", "resume_point", "stream_response"]

# How long a browser waits before reconnecting a dropped stream (the SSE `retry:` field).
RETRY_MS: Final = 500
# A comment line this often keeps idle connections open and finds departed clients.
PING_SECONDS: Final = 15
# How many chunks wait between the producer and the connection: a slow client holds the
# producer back (it then reads the log later, from its cursor), never the session's writer.
BUFFERED: Final = 64

Chunk: TypeAlias = ServerSentEvent | bytes
"""What a producer sends: an SSE message, or bytes already encoded as SSE."""


def resume_point(request: Request) -> tuple[int, str]:
    """Where a stream starts, and why: right after ``Last-Event-ID`` (a client reconnecting
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


def stream_response(
    produce: Callable[[ObjectSendStream[Chunk]], Awaitable[None]], *, sep: str = "\n"
) -> EventSourceResponse:
    """An SSE response carrying what ``produce`` sends, until it returns.

    ``produce`` runs in a task beside the response (``data_sender_callable``) and hands its
    chunks over a small memory stream, so that at server shutdown (which sse-starlette detects
    and signals) it stops waiting for the next event and the stream ends cleanly: the client
    sees an ended response, not a torn connection, and reconnects. The first chunk tells the
    client how soon to come back if the connection drops. ``sep`` ends the lines of the
    response's own messages (the retry hint, the pings): "\n" by default, since AG-UI's client
    splits messages on "\n\n".
    """
    sender, receiver = anyio.create_memory_object_stream[Chunk](BUFFERED)
    shutdown = anyio.Event()

    async def pump() -> None:
        async with sender, anyio.create_task_group() as task_group:

            async def stop_at_shutdown() -> None:
                await shutdown.wait()
                task_group.cancel_scope.cancel()

            task_group.start_soon(stop_at_shutdown)
            await sender.send(ServerSentEvent(comment="nous_session", retry=RETRY_MS, sep=sep))
            await produce(sender)
            task_group.cancel_scope.cancel()  # everything is sent: the stream is complete

    async def content() -> AsyncIterator[Chunk]:
        async with receiver:
            async for chunk in receiver:
                yield chunk

    return EventSourceResponse(
        content(),
        data_sender_callable=pump,
        ping=PING_SECONDS,
        sep=sep,
        shutdown_event=shutdown,
        shutdown_grace_period=1.0,
    )
