"""Live messages: an agent's text and tool calls streamed as they are generated, committed
once when complete.

The deltas are not persisted: they go, in this process, to the streams following the thread
(a :class:`LiveChannel` per thread), and the log gets the completed message once, under the
id its deltas carried, with each tool call's arguments exactly as they were streamed. How the
streams reconcile the two is in :mod:`nous_session.web._streams`.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from contextvars import ContextVar
from typing import Any, Final

import anyio

from nous_session import Message, SessionActor, ToolCall
from nous_session.web._agui import METADATA_KEY

__all__ = [
    "Draft",
    "LiveChannel",
    "LiveChannels",
    "LiveToolCall",
    "live_message",
    "live_tool_call",
]

# The channel of the thread whose agent this task runs (set by RunHost for the agent).
current_channel: ContextVar[LiveChannel | None] = ContextVar(
    "nous_session.web.live_channel", default=None
)
# How many abandoned drafts a channel remembers (for streams that showed part of one).
_ABANDONED_KEPT: Final = 64


class _Pieces:
    """Text that grows by appends, joined once when read (then kept joined)."""

    __slots__ = ("_pieces",)

    def __init__(self) -> None:
        self._pieces: list[str] = []

    def add(self, text: str) -> None:
        self._pieces.append(text)

    def text(self) -> str:
        pieces = self._pieces
        if len(pieces) > 1:
            pieces[:] = ["".join(pieces)]
        return pieces[0] if pieces else ""


class ChannelCall:
    """A live tool call as the streams see it: its name, its arguments so far, whether done."""

    __slots__ = ("arguments", "ended", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        self.arguments = _Pieces()
        self.ended = False


class ChannelDraft:
    """A live message as the streams see it.

    Attributes:
        start: the session's count when the draft began: a stream shows the draft once it has
            sent every event committed before (the draft then comes after them, as it did).
        text: its text so far.
        calls: its tool calls so far, by call id, in the order they began.
    """

    __slots__ = ("calls", "start", "text")

    def __init__(self, start: int) -> None:
        self.start = start
        self.text = _Pieces()
        self.calls: dict[str, ChannelCall] = {}


class LiveChannel:
    """The drafts in progress on one thread, in this process, and when they change.

    Written by the agent's :class:`Draft` (never waiting), read by any number of streams,
    each at its own pace: a stream reads the whole state when it gets to it, so a slow one
    skips intermediate states instead of queueing them.
    """

    __slots__ = ("_changed", "abandoned", "drafts", "users", "version")

    def __init__(self) -> None:
        self.drafts: dict[str, ChannelDraft] = {}
        self.abandoned: dict[str, None] = {}  # ids of drafts dropped uncommitted, oldest first
        self.version = 0
        self.users = 0  # streams and runs holding the channel (LiveChannels drops it at 0)
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
        self.drafts[identifier] = ChannelDraft(after)
        self._notify()

    def add(self, identifier: str, text: str) -> None:
        self.drafts[identifier].text.add(text)
        self._notify()

    def start_call(self, identifier: str, call_id: str, name: str) -> None:
        self.drafts[identifier].calls[call_id] = ChannelCall(name)
        self._notify()

    def add_arguments(self, identifier: str, call_id: str, fragment: str) -> None:
        self.drafts[identifier].calls[call_id].arguments.add(fragment)
        self._notify()

    def end_call(self, identifier: str, call_id: str) -> None:
        self.drafts[identifier].calls[call_id].ended = True
        self._notify()

    def end(self, identifier: str, *, committed: bool) -> None:
        self.drafts.pop(identifier, None)
        if not committed:
            self.abandoned[identifier] = None
            while len(self.abandoned) > _ABANDONED_KEPT:
                del self.abandoned[next(iter(self.abandoned))]
        self._notify()


class LiveChannels:
    """The live channels of one server's threads: a thread's exists while a stream or a run
    holds it, so the runs' drafts reach the streams following the same thread."""

    __slots__ = ("_channels",)

    def __init__(self) -> None:
        self._channels: dict[str, LiveChannel] = {}

    @asynccontextmanager
    async def hold(self, thread_id: str) -> AsyncIterator[LiveChannel]:
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


class LiveToolCall:
    """A tool call being generated: :meth:`add` its arguments (JSON text) as they come."""

    __slots__ = ("_draft", "_ended", "_pieces", "id", "name")

    def __init__(self, draft: Draft, call_id: str, name: str) -> None:
        self.id = call_id
        self.name = name
        self._draft = draft
        self._pieces: list[str] = []
        self._ended = False

    def add(self, fragment: str) -> None:
        """Append ``fragment`` to the call's arguments and send it to the streams following
        the thread (synchronous and O(1): it never waits for a client).

        Raises:
            TypeError: ``fragment`` is not a string.
            RuntimeError: the call was ended, or its message's block has ended.
        """
        if not isinstance(fragment, str):
            raise TypeError(f"tool call arguments are text, not {type(fragment).__name__}")
        if self._ended:
            raise RuntimeError(f"tool call {self.id!r} has ended: no more arguments")
        self._draft._check_open()
        if not fragment:
            return
        self._pieces.append(fragment)
        channel = self._draft._channel
        if channel is not None:
            channel.add_arguments(self._draft.id, self.id, fragment)

    def end(self) -> None:
        """The arguments are complete: the clients are told now (``TOOL_CALL_END``) rather
        than when the message is committed. Ending twice is harmless."""
        if self._ended:
            return
        self._draft._check_open()
        self._ended = True
        channel = self._draft._channel
        if channel is not None:
            channel.end_call(self._draft.id, self.id)

    @property
    def arguments(self) -> str:
        """The arguments so far, as streamed."""
        return "".join(self._pieces)

    def to_tool_call(self) -> ToolCall:
        """The call as the log keeps it: its arguments the text streamed, not parsed."""
        return ToolCall(self.id, self.name, self.arguments)


class Draft:
    """An assistant message being generated: :meth:`add` its text as it comes, then start its
    tool calls (:meth:`tool_call`) and stream their arguments."""

    __slots__ = ("_calls", "_channel", "_closed", "_pieces", "id")

    def __init__(self, identifier: str, channel: LiveChannel | None) -> None:
        self.id = identifier
        self._channel = channel
        self._pieces: list[str] = []
        self._calls: dict[str, LiveToolCall] = {}
        self._closed = False

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"live message {self.id!r} is complete: its block has ended")

    def add(self, text: str) -> None:
        """Append ``text`` to the message and send it to the streams following the thread
        (synchronous and O(1): it never waits for a client).

        Raises:
            TypeError: ``text`` is not a string.
            RuntimeError: a tool call has begun (a message's text comes before its tool
                calls, as AG-UI shows it), or the block has ended.
        """
        if not isinstance(text, str):
            raise TypeError(f"message text is a string, not {type(text).__name__}")
        self._check_open()
        if self._calls:
            raise RuntimeError(
                f"live message {self.id!r} has begun its tool calls: its text comes before them"
            )
        if not text:
            return
        self._pieces.append(text)
        if self._channel is not None:
            self._channel.add(self.id, text)

    def tool_call(self, name: str, call_id: str | None = None) -> LiveToolCall:
        """Begin a tool call of this message; the clients see it begin now, and its arguments
        as they are added. It ends when :meth:`LiveToolCall.end` is called, or with the block.

        Args:
            name: the tool's name.
            call_id: the call's id (what its result refers to); a new ``call-<uuid>`` if None.

        Raises:
            ValueError: ``name`` is empty, or ``call_id`` is empty or already used in this
                message.
            RuntimeError: the block has ended.
        """
        if not isinstance(name, str) or not name:
            raise ValueError(f"a tool call needs a name, got {name!r}")
        if call_id is None:
            call_id = f"call-{uuid.uuid4()}"
        elif not isinstance(call_id, str) or not call_id:
            raise ValueError(f"a tool call's id must be a non-empty string, got {call_id!r}")
        self._check_open()
        if call_id in self._calls:
            raise ValueError(f"tool call id {call_id!r} is already used in this message")
        call = self._calls[call_id] = LiveToolCall(self, call_id, name)
        if self._channel is not None:
            self._channel.start_call(self.id, call_id, name)
        return call

    @property
    def text(self) -> str:
        """The message's text so far."""
        return "".join(self._pieces)

    @property
    def tool_calls(self) -> list[LiveToolCall]:
        """The message's tool calls so far, in the order they began."""
        return list(self._calls.values())


@asynccontextmanager
async def live_message(session: SessionActor, **fields: Any) -> AsyncIterator[Draft]:
    """Stream an assistant message while it is generated; commit it when the block ends.

    ``async with live_message(session) as draft: draft.add(token)``; a tool call's arguments
    stream the same way (``call = draft.tool_call("search")``, ``call.add(fragment)``). The
    clients following the thread on this worker get each piece as AG-UI deltas; when the
    block ends, the complete message is committed once, under the id its deltas carried: its
    text, then its tool calls (each with its arguments exactly as streamed, a string), then
    any ``tool_calls`` given in ``fields`` (which go to ``Message.assistant``, as a ``name``
    does). If the block raises, nothing is committed and the clients that showed part of it
    are given the surface again. Outside an agent run by
    :class:`~nous_session.web.SessionStreams` there is nobody to stream to: the message is
    just committed at the end.
    """
    channel = current_channel.get()
    draft = Draft(f"live:{uuid.uuid4()}", channel)
    if channel is not None:
        channel.start(draft.id, session.log.count)
    committed = False
    try:
        yield draft
        draft._closed = True
        metadata: dict[str, Any] = {METADATA_KEY: {"id": draft.id, "live": True}}
        calls = [call.to_tool_call() for call in draft.tool_calls]
        calls.extend(fields.pop("tool_calls", ()))
        await session.add_message(
            Message.assistant(draft.text, tool_calls=calls, metadata=metadata, **fields),
            key=draft.id,
        )
        committed = True
    finally:
        draft._closed = True
        if channel is not None:
            channel.end(draft.id, committed=committed)


@asynccontextmanager
async def live_tool_call(
    session: SessionActor, name: str, call_id: str | None = None, **fields: Any
) -> AsyncIterator[LiveToolCall]:
    """Stream one tool call's arguments while they are generated, in an assistant message of
    its own; commit the message when the block ends.

    ``async with live_tool_call(session, "search") as call: call.add('{"query": ')``. The
    same as a :func:`live_message` with no text and this one call (``fields`` go to it).
    """
    async with live_message(session, **fields) as draft:
        yield draft.tool_call(name, call_id)
