"""Live text: an agent's message streamed as it is generated, committed once when complete.

The deltas are not persisted: they go, in this process, to the streams following the thread
(a :class:`LiveChannel` per thread), and the log gets the completed message once, under the
id its deltas carried. How the streams reconcile the two is in :mod:`nous_session.web._streams`.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from contextvars import ContextVar
from typing import Any, Final

import anyio

from nous_session import Message, SessionActor
from nous_session.web._agui import METADATA_KEY

__all__ = ["Draft", "LiveChannel", "live_message"]

# The channel of the thread whose agent this task runs (set by SessionStreams for the agent).
current_channel: ContextVar[LiveChannel | None] = ContextVar(
    "nous_session.web.live_channel", default=None
)
# How many abandoned drafts a channel remembers (for streams that showed part of one).
_ABANDONED_KEPT: Final = 64


class LiveChannel:
    """The drafts in progress on one thread, in this process, and when they change.

    Written by the agent's :class:`Draft` (never waiting), read by any number of streams,
    each at its own pace: a stream reads the whole state when it gets to it, so a slow one
    skips intermediate states instead of queueing them.
    """

    __slots__ = ("_changed", "abandoned", "drafts", "starts", "users", "version")

    def __init__(self) -> None:
        self.drafts: dict[str, list[str]] = {}  # id -> the text so far, in pieces
        # id -> the session's count when the draft began: a stream shows the draft once it
        # has sent every event committed before (the draft then comes after them, as it did).
        self.starts: dict[str, int] = {}
        self.abandoned: dict[str, None] = {}  # ids of drafts dropped uncommitted, oldest first
        self.version = 0
        self.users = 0  # streams and runs holding the channel (SessionStreams drops it at 0)
        self._changed: anyio.Event | None = None

    def changed(self) -> anyio.Event:
        """The event the next change sets."""
        if self._changed is None:
            self._changed = anyio.Event()
        return self._changed

    def _notify(self) -> None:
        self.version += 1
        changed, self._changed = self._changed, None
        if changed is not None:
            changed.set()

    def start(self, identifier: str, after: int) -> None:
        self.drafts[identifier] = []
        self.starts[identifier] = after
        self._notify()

    def add(self, identifier: str, text: str) -> None:
        self.drafts[identifier].append(text)
        self._notify()

    def end(self, identifier: str, *, committed: bool) -> None:
        self.drafts.pop(identifier, None)
        self.starts.pop(identifier, None)
        if not committed:
            self.abandoned[identifier] = None
            while len(self.abandoned) > _ABANDONED_KEPT:
                del self.abandoned[next(iter(self.abandoned))]
        self._notify()

    def text(self, identifier: str) -> str:
        """The draft's text so far (its pieces joined once, then kept joined)."""
        pieces = self.drafts[identifier]
        if len(pieces) > 1:
            pieces[:] = ["".join(pieces)]
        return pieces[0] if pieces else ""


class Draft:
    """An assistant message being generated: :meth:`add` its text as it comes."""

    __slots__ = ("_channel", "_pieces", "id")

    def __init__(self, identifier: str, channel: LiveChannel | None) -> None:
        self.id = identifier
        self._channel = channel
        self._pieces: list[str] = []

    def add(self, text: str) -> None:
        """Append ``text`` to the message and send it to the streams following the thread
        (synchronous and O(1): it never waits for a client)."""
        if not text:
            return
        self._pieces.append(text)
        if self._channel is not None:
            self._channel.add(self.id, text)

    @property
    def text(self) -> str:
        """The message's text so far."""
        return "".join(self._pieces)


@asynccontextmanager
async def live_message(session: SessionActor, **fields: Any) -> AsyncIterator[Draft]:
    """Stream an assistant message while it is generated; commit it when the block ends.

    ``async with live_message(session) as draft: draft.add(token)``. The clients following
    the thread on this worker get each piece as AG-UI text deltas; when the block ends, the
    complete message is committed once (``fields`` go to ``Message.assistant``: tool
    calls, a name) under the id its deltas carried. If the block raises, nothing is committed
    and the clients that showed part of it are given the surface again. Outside an agent run
    by :class:`~nous_session.web.SessionStreams` there is nobody to stream to: the message is
    just committed at the end.
    """
    channel = current_channel.get()
    draft = Draft(f"live:{uuid.uuid4()}", channel)
    if channel is not None:
        channel.start(draft.id, session.log.count)
    committed = False
    try:
        yield draft
        metadata: dict[str, Any] = {METADATA_KEY: {"id": draft.id, "live": True}}
        await session.add_message(
            Message.assistant(draft.text, metadata=metadata, **fields), key=draft.id
        )
        committed = True
    finally:
        if channel is not None:
            channel.end(draft.id, committed=committed)
