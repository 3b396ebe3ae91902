"""A slow client never slows the session's writer or another client: its stream buffers at most
64 chunks; when it takes nothing for the slow-client timeout with the buffer full, the stream
ends with a notice naming the cursor to resume from; a client that takes nothing at all is
disconnected. In both formats (the library's own and AG-UI's), on asyncio and trio.

The app is called as a server calls it, with an ASGI ``send`` that blocks until the test
takes the message: a client that stops reading is a test that stops taking.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import orjson
import pytest
from starlette.applications import Starlette
from starlette.types import Message as AsgiMessage

from nous_session import Message
from nous_session.web import SessionStreams
from nous_session.web._sse import BUFFERED, STUCK_FACTOR
from tests.support.asgi import http_scope

pytestmark = pytest.mark.anyio

WAIT = 60.0
# More events than a stream buffers, so that a client that stops reading overflows.
WRITES = BUFFERED + 40
# The slow-client timeout of these tests: a stuck client is dropped after six times as long.
SLOW = 1.0
FORMATS = {
    "native": "/threads/t/events",
    "agui": "/connect?thread_id=t",
}


class Client:
    """One GET of an SSE stream whose messages the test takes (or does not) as it likes."""

    def __init__(self, received: anyio.abc.ObjectReceiveStream[AsgiMessage]) -> None:
        self._received = received
        self._buffer = ""
        self.blocks: list[tuple[str | None, str | None, dict[str, Any]]] = []  # id, event, data
        self.ended = False
        self.bodies = 0  # body messages taken

    async def take(self, until: Any = lambda blocks: False) -> None:
        """Take messages until ``until(blocks)`` holds or the response ends."""
        while not until(self.blocks) and not self.ended:
            message = await self._received.receive()
            if message["type"] != "http.response.body":
                continue
            self.bodies += 1
            self._buffer += message.get("body", b"").decode().replace("\r\n", "\n")
            self.ended = not message.get("more_body", False)
            *blocks, self._buffer = self._buffer.split("\n\n")
            for block in blocks:
                identifier = event = None
                data = []
                for line in block.split("\n"):
                    if line.startswith("id:"):
                        identifier = line[3:].strip()
                    elif line.startswith("event:"):
                        event = line[6:].strip()
                    elif line.startswith("data:"):
                        data.append(line[5:].lstrip(" "))
                if data:
                    self.blocks.append((identifier, event, orjson.loads("\n".join(data))))

    @property
    def ids(self) -> list[int]:
        """The SSE ids of the events (a resume notice repeats the last one: not counted)."""
        return [int(i) for i, event, _ in self.blocks if i and event != "resume"]


@contextlib.asynccontextmanager
async def get(
    app: Starlette, target: str, headers: dict[str, str] | None = None
) -> AsyncIterator[tuple[Client, anyio.Event]]:
    """GET ``target``; the client, and an event set when the app is done with the request."""
    sent, received = anyio.create_memory_object_stream[AsgiMessage](0)  # send waits for take
    scope = http_scope("GET", target, headers or {})
    requested = False
    done = anyio.Event()

    async def receive() -> AsgiMessage:
        nonlocal requested
        if not requested:
            requested = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    async def call() -> None:
        try:
            await app(scope, receive, sent.send)
        finally:
            done.set()

    async with anyio.create_task_group() as task_group, sent, received:
        task_group.start_soon(call)
        yield Client(received), done
        task_group.cancel_scope.cancel()


@contextlib.asynccontextmanager
async def serving(tmp_path: Path) -> AsyncIterator[tuple[Starlette, SessionStreams]]:
    streams = SessionStreams(f"sqlite:///{tmp_path / 'slow.sqlite3'}", slow_client_timeout=SLOW)
    app = Starlette(routes=streams.app.routes, lifespan=streams.lifespan)
    async with app.router.lifespan_context(app):
        yield app, streams


def resume_cursor(blocks: list[tuple[str | None, str | None, dict[str, Any]]]) -> str | None:
    """The cursor the stream's last message tells its client to resume from."""
    _, event, data = blocks[-1]
    if event == "resume":
        return data["last_event_id"]  # type: ignore[no-any-return]
    assert data["type"] == "CUSTOM", data
    assert data["name"] == "nous_session.resume", data
    return data["value"]["lastEventId"]  # type: ignore[no-any-return]


@pytest.mark.parametrize("kind", sorted(FORMATS))
async def test_a_client_that_stops_reading_is_told_to_resume_and_slows_nobody(
    tmp_path: Path, kind: str
) -> None:
    target = FORMATS[kind]
    overflowed = anyio.Event()
    watching = Overflows(overflowed)
    logger = logging.getLogger("nous_session.web")
    level = logger.level
    logger.addHandler(watching)
    logger.setLevel(logging.INFO)
    try:
        await _stops_reading(tmp_path, target, overflowed)
    finally:
        logger.removeHandler(watching)
        logger.setLevel(level)


class Overflows(logging.Handler):
    """Sets an event when a stream logs that it overflowed (after letting go of the session)."""

    def __init__(self, event: anyio.Event) -> None:
        super().__init__(logging.INFO)
        self.event = event

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("a slow client is told to resume"):
            self.event.set()


async def _stops_reading(tmp_path: Path, target: str, overflowed: anyio.Event) -> None:
    async with serving(tmp_path) as (app, streams):
        session = await streams.sessions.get("t")
        # A run going on (as another worker records it), so the AG-UI stream follows it.
        await session.append("ag_ui.run_started", {"run_id": "r1"})
        first = session.log.count
        last = first + WRITES - 1
        with anyio.fail_after(WAIT):
            async with get(app, target) as (slow, slow_done), get(app, target) as (other, _):
                await slow.take(lambda blocks: slow.bodies > 0)
                # The slow client takes nothing more from here on. The writer commits every
                # message and the other client gets each of them meanwhile: neither waits for it.
                async with anyio.create_task_group() as task_group:
                    task_group.start_soon(other.take, lambda blocks: last in other.ids)
                    for number in range(WRITES):
                        await session.add_message(Message.user(f"message {number}"))
                assert other.ids[-WRITES:] == list(range(first, last + 1))
                # Its stream overflows: it lets go of its subscription (the other's remains).
                await overflowed.wait()
                assert session.statistics().subscribers == 1
                assert not slow_done.is_set(), "not dropped: the notice waits behind its buffer"
                # When it reads again: what was buffered, then where to resume, then the end.
                await slow.take()
                assert slow.ended
                got = slow.ids
                assert got == list(range(got[0], got[-1] + 1)), "no gap, no duplicate"
                assert got[-1] < last, "it overflowed before the end"
                cursor = resume_cursor(slow.blocks)
                assert cursor == str(got[-1]), "resume right after the last event it had"
            # It resumes from that cursor and gets exactly the rest.
            async with get(app, target, {"Last-Event-ID": str(cursor)}) as (resumed, _):
                await resumed.take(lambda blocks: last in resumed.ids)
                after = int(str(cursor))
                assert [i for i in resumed.ids if i > after] == list(range(after + 1, last + 1))
                assert min(resumed.ids) >= after


async def test_a_client_that_reads_nothing_at_all_is_disconnected(tmp_path: Path) -> None:
    async with serving(tmp_path) as (app, streams):
        session = await streams.sessions.get("t")
        with anyio.fail_after(WAIT + STUCK_FACTOR * SLOW):
            async with get(app, FORMATS["native"]) as (stuck, done):
                await stuck.take(lambda blocks: stuck.bodies > 0)
                for number in range(WRITES):
                    await session.add_message(Message.user(f"message {number}"))
                # The response ends on its own (the server closes the connection), and the
                # session is held by nobody any more.
                await done.wait()
                assert session.statistics().subscribers == 0
