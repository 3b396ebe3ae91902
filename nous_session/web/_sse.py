"""Server-Sent Events responses that end cleanly at server shutdown and never buffer more than
a few chunks for a slow client, and resume points.

Backpressure, in one place: a stream's producer (which reads the session's log by its own
cursor) hands its chunks to the connection through an :class:`Outbox` of :data:`BUFFERED`
chunks. The session's writer and the other clients never wait for it. When the client does
not take a chunk for ``slow_client_timeout`` seconds while the outbox is full, the stream
*overflows*: the producer stops (its subscription and its hold on the session are released)
and, after the chunks already buffered, the client is sent a notice naming the cursor to
resume from (the SSE id of the last chunk buffered), then the response ends. A client that
takes nothing at all for :data:`STUCK_FACTOR` times that long is disconnected.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Final, TypeAlias

import anyio
from anyio.streams.memory import MemoryObjectSendStream
from sse_starlette import EventSourceResponse, ServerSentEvent
from sse_starlette.sse import SendTimeoutError
from starlette.requests import Request
from starlette.types import Receive, Scope, Send

__all__ = [
    "BUFFERED",
    "PING_SECONDS",
    "RETRY_MS",
    "SLOW_CLIENT_SECONDS",
    "STUCK_FACTOR",
    "Chunk",
    "Outbox",
    "deleted_notice",
    "resume_point",
    "stream_response",
]

logger = logging.getLogger("nous_session.web")

# How long a browser waits before reconnecting a dropped stream (the SSE `retry:` field).
RETRY_MS: Final = 500
# A comment line this often keeps idle connections open and finds departed clients.
PING_SECONDS: Final = 15
# How many chunks wait between the producer and the connection: a slow client holds the
# producer back (it then reads the log later, from its cursor), never the session's writer.
BUFFERED: Final = 64
# How long a producer waits for room in a full outbox before the stream overflows.
SLOW_CLIENT_SECONDS: Final = 10.0
# A write to the connection that waits this many times as long drops the connection.
STUCK_FACTOR: Final = 6
# The most digits a seq is written with (a 64-bit integer's).
_SEQ_DIGITS: Final = 19


def deleted_notice(thread_id: str) -> str:
    """What a stream's last message says when its thread was deleted under it (by another
    holder of the store): the session its stream followed has closed."""
    return (
        f"thread {thread_id!r} was deleted (by another holder of its store): nothing more"
        " comes of it; open it again to start anew"
    )


Chunk: TypeAlias = ServerSentEvent | bytes
"""What a producer sends: an SSE message, or bytes already encoded as SSE."""

Notice: TypeAlias = Callable[[str | None], Chunk]
"""The last chunk of a stream that overflowed, made from the cursor to resume from."""


class Overflow(Exception):
    """The client took no chunk for too long while the outbox was full (internal)."""


class Outbox:
    """The bounded way from a stream's producer to its connection.

    The memory stream under it is unbounded, and this bounds it: :meth:`send` waits while
    ``BUFFERED`` (64) chunks are waiting (so the notice of an overflow always fits after
    them), and tracks the cursor of the last chunk it buffered.
    """

    __slots__ = ("_room", "_sender", "_timeout", "cursor")

    def __init__(self, sender: MemoryObjectSendStream[Chunk], timeout: float) -> None:
        self._sender = sender
        self._timeout = timeout
        self._room: anyio.Event | None = None
        self.cursor: str | None = None

    async def send(self, chunk: Chunk, cursor: int | str | None = None) -> None:
        """Buffer ``chunk`` (whose SSE id is ``cursor``, or the ServerSentEvent's own id),
        waiting for room at most the slow-client timeout.

        Raises:
            Overflow: the client took nothing for that long.
        """
        with anyio.move_on_after(self._timeout):
            while self._sender.statistics().current_buffer_used >= BUFFERED:
                if self._room is None:
                    self._room = anyio.Event()
                await self._room.wait()
            self._sender.send_nowait(chunk)
            if cursor is None and isinstance(chunk, ServerSentEvent) and chunk.id:
                cursor = chunk.id
            if cursor is not None:
                self.cursor = str(cursor)
            return
        raise Overflow

    def taken(self) -> None:
        """The connection took a chunk: a producer waiting for room may go on."""
        room, self._room = self._room, None
        if room is not None:
            room.set()


class _Response(EventSourceResponse):
    """sse-starlette's response; a client dropped for not reading is logged, not raised."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        except SendTimeoutError:
            logger.info("dropped a client that read nothing for %.0f s", self.send_timeout)


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
            # A seq is ASCII digits, no longer than a 64-bit integer is written (a longer
            # value is no seq of any log, and one of thousands of digits int() refuses).
            if not (value.isascii() and value.isdecimal() and len(value) <= _SEQ_DIGITS):
                shown = value if len(value) <= _SEQ_DIGITS else f"{value[:_SEQ_DIGITS]}..."
                raise ValueError(f"{name} must be a seq, got {shown!r}")
            return int(value) + after, name
    return 0, "start"


def stream_response(
    produce: Callable[[Outbox], Awaitable[None]],
    notice: Notice,
    *,
    sep: str = "\n",
    slow_client_timeout: float = SLOW_CLIENT_SECONDS,
) -> EventSourceResponse:
    """An SSE response carrying what ``produce`` sends, until it returns or overflows.

    ``produce`` runs in a task beside the response (``data_sender_callable``) and hands its
    chunks over an :class:`Outbox`, so that at server shutdown (which sse-starlette detects
    and signals) it stops waiting for the next event and the stream ends cleanly: the client
    sees an ended response, not a torn connection, and reconnects. The first chunk tells the
    client how soon to come back if the connection drops. If the client is too slow (see the
    module's docstring), ``produce`` is stopped and ``notice(cursor)`` ends the stream. ``sep``
    ends the lines of the response's own messages (the retry hint, the pings): "\n" by
    default, since AG-UI's client splits messages on "\n\n".
    """
    sender, receiver = anyio.create_memory_object_stream[Chunk](float("inf"))
    outbox = Outbox(sender, slow_client_timeout)
    shutdown = anyio.Event()

    async def pump() -> None:
        async with sender, anyio.create_task_group() as task_group:

            async def stop_at_shutdown() -> None:
                await shutdown.wait()
                task_group.cancel_scope.cancel()

            task_group.start_soon(stop_at_shutdown)
            await outbox.send(ServerSentEvent(comment="nous_session", retry=RETRY_MS, sep=sep))
            try:
                await produce(outbox)
            except* Overflow:
                logger.info("a slow client is told to resume after %s", outbox.cursor)
                sender.send_nowait(notice(outbox.cursor))  # the outbox left room for it
            task_group.cancel_scope.cancel()  # everything is sent: the stream is complete

    async def content() -> AsyncIterator[Chunk]:
        async with receiver:
            async for chunk in receiver:
                outbox.taken()
                yield chunk

    return _Response(
        content(),
        data_sender_callable=pump,
        ping=PING_SECONDS,
        sep=sep,
        shutdown_event=shutdown,
        shutdown_grace_period=1.0,
        send_timeout=STUCK_FACTOR * slow_client_timeout,
    )
