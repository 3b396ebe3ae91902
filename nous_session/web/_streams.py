"""AG-UI streams read from a session's subscription: a run's, and a reconnecting client's.

Each committed event becomes one SSE chunk: the AG-UI events that stand for it, the last one
carrying the event's seq as its SSE id, so that ``Last-Event-ID`` names a point in the log.
Beside the log, a stream relays the live drafts of its thread's :class:`LiveChannel` (text and
tool-call argument deltas, without an SSE id) and reconciles each with the message that
completes it:

* a draft this stream showed is completed by the rest of its text and arguments, the ends,
  and the tool calls it had not shown;
* a draft going on when a client resumed may be partly on the client already (sent before
  the cut): the stream sends a messages snapshot of the surface first, which drops the
  client's copy, then shows the draft from its start;
* a draft completed after a resume point and not shown by this stream (it was generated on
  another worker) comes as a messages snapshot of the surface, which replaces any copy;
* a draft abandoned (its agent raised) is ended and followed by a messages snapshot that no
  longer holds it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Final, TypeAlias

import anyio
import attrs
from ag_ui.core import (
    BaseEvent,
    CustomEvent,
    MessagesSnapshotEvent,
    RunErrorEvent,
    RunFinishedEvent,
    RunStartedEvent,
    StateSnapshotEvent,
    TextMessageContentEvent,
    TextMessageEndEvent,
    TextMessageStartEvent,
    ToolCallArgsEvent,
    ToolCallEndEvent,
    ToolCallStartEvent,
)
from ag_ui.encoder import EventEncoder

from nous_session import Event, SessionActor, Subscription
from nous_session.actor import deleted
from nous_session.web._agui import (
    RUN_ERROR,
    RUN_FINISHED,
    RUN_MARKERS,
    RUN_STARTED,
    arguments_text,
    as_of,
    content_text,
    live_id,
    messages_snapshot,
    translate,
)
from nous_session.web._live import ChannelDraft, LiveChannel
from nous_session.web._sse import deleted_notice

__all__ = [
    "RESUME_EVENT",
    "Send",
    "active_run",
    "connect_stream",
    "encode",
    "resume_notice",
    "run_stream",
]

Send: TypeAlias = Callable[[bytes, int | None], Awaitable[None]]
"""Where a stream's chunks go, each with the seq its SSE id carries (the response's outbox)."""

_ENCODER = EventEncoder()
# The custom event that ends a stream whose client was too slow: re-attach from its cursor.
RESUME_EVENT: Final = "nous_session.resume"
# Items between a stream's readers (the log, the live channel) and its writer: few, since
# each live item reads the channel's whole state, and the log's reader can wait.
_ITEMS: Final = 16


def resume_notice(cursor: str | None) -> bytes:
    """The last message of a stream that overflowed (its client was too slow): a custom event
    naming the ``Last-Event-ID`` to re-attach with (None: re-attach without one)."""
    return encode([CustomEvent(name=RESUME_EVENT, value={"lastEventId": cursor})], None)


def encode(events: Iterable[BaseEvent], seq: int | None) -> bytes:
    """``events`` as SSE messages, the last one with ``seq`` as its id (none when None)."""
    encoded = [_ENCODER.encode(event) for event in events]
    if encoded and seq is not None:
        encoded[-1] = f"id: {seq}\n{encoded[-1]}"
    return "".join(encoded).encode()


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


class _Shown:
    """What one stream has sent of one live draft.

    Attributes:
        text: characters of its text sent.
        text_open: None before its text message started, True while open, False once ended.
        calls: per tool call id, ``[characters of arguments sent, ended]``.
    """

    __slots__ = ("calls", "text", "text_open")

    def __init__(self) -> None:
        self.text = 0
        self.text_open: bool | None = None
        self.calls: dict[str, list[int | bool]] = {}


def _call_fields(call: object) -> tuple[str, str, str]:
    """``(id, name, arguments as text)`` of a committed tool call."""
    if not isinstance(call, Mapping):
        return "", "", ""
    return str(call.get("id", "")), str(call.get("name", "")), arguments_text(call)


@attrs.define
class _Relay:
    """What one stream has sent of its thread's live drafts, and what it sends next.

    Attributes:
        skip: ids of messages not to send (a run's client sent them).
        resumed_after: the client's ``Last-Event-ID``, if it resumed.
        sent: the drafts this stream shows, and how much of each.
        done: drafts not shown live (any longer): completed or abandoned.
        held: the drafts going on when a client resumed: it may hold part of them from the
            connection it lost, so the first of them shown comes after a messages snapshot
            (which drops the client's partial copy) and is then streamed from its start.
        position: the seq of the last committed event handled.
    """

    session: SessionActor
    thread_id: str
    channel: LiveChannel
    skip: frozenset[str] = frozenset()
    resumed_after: int | None = None
    sent: dict[str, _Shown] = attrs.field(factory=dict)
    done: set[str] = attrs.field(factory=set)
    held: set[str] = attrs.field(factory=set)
    position: int = -1

    def __attrs_post_init__(self) -> None:
        if self.resumed_after is not None:
            self.held.update(self.channel.drafts)

    def committed(self, event: Event) -> list[BaseEvent]:
        """The AG-UI events for a committed event, reconciled with the live drafts."""
        self.position = event.seq
        log = as_of(self.session.log, event.seq)
        draft = live_id(event)
        if draft is not None:
            self.done.add(draft)
            self.held.discard(draft)
            shown = self.sent.pop(draft, None)
            if shown is not None:
                return self._complete(event, draft, shown)
            if self.resumed_after is not None and event.seq > self.resumed_after:
                # The client may hold part of it (sent before the cut, maybe by another
                # worker): a snapshot replaces its copy with the message as committed.
                return [messages_snapshot(log)]
        return translate(event, log, self.thread_id, self.skip)

    @staticmethod
    def _complete(event: Event, draft: str, shown: _Shown) -> list[BaseEvent]:
        """What completes a draft this stream showed: the rest of its text and arguments,
        the ends, and the tool calls it had not shown (as :func:`translate` sends them)."""
        out: list[BaseEvent] = []
        text = content_text(event)
        calls = event.data.get("tool_calls")
        calls = calls if isinstance(calls, list) else []
        if shown.text_open is None and (text or not calls):
            out.append(TextMessageStartEvent(message_id=draft, role="assistant"))
            shown.text_open = True
        if shown.text_open:
            if len(text) > shown.text:
                out.append(TextMessageContentEvent(message_id=draft, delta=text[shown.text :]))
            out.append(TextMessageEndEvent(message_id=draft))
        for call in calls:
            call_id, name, arguments = _call_fields(call)
            progress = shown.calls.get(call_id)
            if progress is None:
                out.append(
                    ToolCallStartEvent(
                        tool_call_id=call_id, tool_call_name=name, parent_message_id=draft
                    )
                )
                progress = [0, False]
            sent, ended = int(progress[0]), bool(progress[1])
            if len(arguments) > sent:
                out.append(ToolCallArgsEvent(tool_call_id=call_id, delta=arguments[sent:]))
            if not ended:
                out.append(ToolCallEndEvent(tool_call_id=call_id))
        return out

    def live(self) -> list[BaseEvent]:
        """The AG-UI events that bring the client up to the live drafts as they are now."""
        channel = self.channel
        out: list[BaseEvent] = []
        for draft, state in list(channel.drafts.items()):
            if draft in self.done or self.position + 1 < state.start:
                continue  # not to be shown, or not before what was committed before it
            shown = self.sent.get(draft)
            if shown is None:
                if draft in self.held:
                    self.held.clear()  # one snapshot drops every partial copy at once
                    out.append(self._surface())
                shown = self.sent[draft] = _Shown()
            self._show(draft, state, shown, out)
        for draft in [draft for draft in self.sent if draft in channel.abandoned]:
            shown = self.sent.pop(draft)
            self.done.add(draft)
            if shown.text_open:
                out.append(TextMessageEndEvent(message_id=draft))
            out.extend(
                ToolCallEndEvent(tool_call_id=call_id)
                for call_id, (_, ended) in shown.calls.items()
                if not ended
            )
            out.append(self._surface())
        return out

    @staticmethod
    def _show(draft: str, state: ChannelDraft, shown: _Shown, out: list[BaseEvent]) -> None:
        """Append to ``out`` what the client lacks of one draft: its text (started when it
        has some, ended when its first tool call begins), then its tool calls' arguments."""
        text = state.text.text()
        if shown.text_open is None and text:
            out.append(TextMessageStartEvent(message_id=draft, role="assistant"))
            shown.text_open = True
        if shown.text_open and len(text) > shown.text:
            out.append(TextMessageContentEvent(message_id=draft, delta=text[shown.text :]))
            shown.text = len(text)
        if shown.text_open and state.calls:
            out.append(TextMessageEndEvent(message_id=draft))
            shown.text_open = False
        for call_id, call in state.calls.items():
            progress = shown.calls.get(call_id)
            if progress is None:
                out.append(
                    ToolCallStartEvent(
                        tool_call_id=call_id, tool_call_name=call.name, parent_message_id=draft
                    )
                )
                progress = shown.calls[call_id] = [0, False]
            arguments = call.arguments.text()
            sent = int(progress[0])
            if len(arguments) > sent:
                out.append(ToolCallArgsEvent(tool_call_id=call_id, delta=arguments[sent:]))
                progress[0] = len(arguments)
            if call.ended and not progress[1]:
                out.append(ToolCallEndEvent(tool_call_id=call_id))
                progress[1] = True

    def _surface(self) -> MessagesSnapshotEvent:
        """A messages snapshot of the surface as this stream has sent it so far."""
        if self.position < 0:
            return MessagesSnapshotEvent(messages=[])
        return messages_snapshot(as_of(self.session.log, self.position))


# A stream's step for one committed event: what to send, and whether the stream ends there.
_Step: TypeAlias = Callable[[Event], tuple[list[BaseEvent], bool]]


async def _follow(subscription: Subscription, relay: _Relay, step: _Step, send: Send) -> None:
    """Send the committed events (through ``step``) and the live drafts, merged in one order,
    until ``step`` ends the stream or the session closes; one that closed because its thread
    was deleted (by another holder of the store) ends the stream with a ``RUN_ERROR`` saying
    so: the run it carried can neither finish nor be followed any more."""
    channel = relay.channel
    items_sender, items = anyio.create_memory_object_stream[Event | bool](_ITEMS)

    async def read_log() -> None:
        async for event in subscription:
            await items_sender.send(event)
        await items_sender.send(False)  # the session closed: the stream ends

    async def watch_live() -> None:
        seen = -1  # the drafts already going on are relayed at once
        while True:
            while channel.version == seen:  # the version, so that no change is missed
                await channel.changed().wait()
            seen = channel.version
            await items_sender.send(True)

    async with items_sender, items, anyio.create_task_group() as task_group:
        task_group.start_soon(read_log)
        task_group.start_soon(watch_live)
        async for item in items:
            if item is True:
                chunk = relay.live()
                if chunk:
                    await send(encode(chunk, None), None)
                continue
            if item is False:
                if deleted(relay.session) is not None:
                    gone = RunErrorEvent(message=deleted_notice(relay.thread_id))
                    await send(encode([gone], None), None)
                break
            chunk, finished = step(item)
            if chunk:
                await send(encode(chunk, item.seq), item.seq)
            if finished:
                break
            if channel.drafts:
                # A draft waiting for this event (it began after it) is shown now.
                chunk = relay.live()
                if chunk:
                    await send(encode(chunk, None), None)
        task_group.cancel_scope.cancel()


async def run_stream(
    session: SessionActor,
    channel: LiveChannel,
    thread_id: str,
    run_id: str,
    since: int,
    skip: frozenset[str],
    send: Send,
) -> None:
    """The run ``run_id``'s stream from ``since`` (its start marker's seq) until its end
    marker. The messages in ``skip`` (the client's own) are not sent back."""
    relay = _Relay(session, thread_id, channel, skip=skip)

    def step(event: Event) -> tuple[list[BaseEvent], bool]:
        if event.type in RUN_MARKERS and event.data.get("run_id") != run_id:
            return [], False  # another run's marker (another worker's): not this stream's
        return relay.committed(event), event.type in (RUN_FINISHED, RUN_ERROR)

    async with session.subscribe(since) as subscription:
        await _follow(subscription, relay, step, send)


async def connect_stream(
    session: SessionActor,
    channel: LiveChannel,
    thread_id: str,
    run_id: str,
    since: int | None,
    send: Send,
) -> None:
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
    relay = _Relay(session, thread_id, channel, resumed_after=None if since is None else since - 1)
    if since is None:
        opening.append(messages_snapshot(log))
        metadata = session.metadata
        if metadata is not None:
            opening.append(StateSnapshotEvent(snapshot=metadata.to_json()))
        since = log.count
    relay.position = since - 1
    opened = since - 1 if since > 0 else None
    await send(encode(opening, opened), opened)

    def closing() -> BaseEvent:
        if error is not None:
            return RunErrorEvent(message=error)
        return RunFinishedEvent(thread_id=thread_id, run_id=envelope)

    def step(event: Event) -> tuple[list[BaseEvent], bool]:
        nonlocal active, error
        chunk: list[BaseEvent] = []
        if event.type in RUN_MARKERS:
            active, error = active_run([event])
        else:
            chunk = relay.committed(event)
        if active is None and event.seq + 1 >= session.log.count:
            return [*chunk, closing()], True
        return chunk, False

    if active is None and since >= log.count:
        await send(encode([closing()], None), None)
        return
    async with session.subscribe(since) as subscription:
        await _follow(subscription, relay, step, send)
