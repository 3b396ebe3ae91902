"""The library's own SSE format: one JSON object per committed event, its seq as the SSE id.

What the example's page (``examples/web``) and ``nous-session tail`` read: each message is
:func:`event_json` of one event, and a client that reconnects with ``Last-Event-ID`` resumes
right after the last event it got.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any, Final

import orjson
from sse_starlette import EventSourceResponse, ServerSentEvent

from nous_session import Event, Replace, SessionActor
from nous_session.actor import deleted
from nous_session.web._sse import SLOW_CLIENT_SECONDS, Outbox, deleted_notice, stream_response

__all__ = ["compaction_source", "event_json", "event_stream", "resume_notice"]

# What a preview of an event's text is cut to.
PREVIEW: Final = 160


def preview(text: str) -> str:
    """``text`` on one line, cut to :data:`PREVIEW` characters with an ellipsis."""
    text = " ".join(text.split())
    return text if len(text) <= PREVIEW else text[: PREVIEW - 1] + "…"


def compaction_source(event: Event) -> str | None:
    """``"compaction"`` or ``"pruning"`` for the replaces the compaction runner appends,
    ``"replace"`` for any other replace, None for an event that is not one."""
    if not isinstance(event.op, Replace):
        return None
    source = event.data.get("source")
    return source if isinstance(source, str) else "replace"


def event_json(event: Event) -> dict[str, Any]:
    """What the stream carries of one event: its seq, type, role and a preview of its text."""
    shown: dict[str, Any] = {
        "seq": event.seq,
        "type": str(event.type),
        "time": event.time.isoformat(),
        "op": None if event.op is None else event.op.to_json(),
        "replace": compaction_source(event),
    }
    content = event.data.get("content")
    if isinstance(content, str):
        shown["text"] = preview(content)
    calls = event.data.get("tool_calls")
    if isinstance(calls, list) and calls:
        names = [call.get("name", "?") for call in calls if isinstance(call, Mapping)]
        shown["calls"] = names
    return shown


def resume_notice(cursor: str | None) -> ServerSentEvent:
    """The last message of a stream whose client was too slow: a ``resume`` event naming the
    seq of the last event sent (``Last-Event-ID`` already holds it; EventSource reconnects
    with it when the response ends)."""
    data = orjson.dumps({"last_event_id": cursor}).decode()
    return ServerSentEvent(data, event="resume", id=cursor, sep="\r\n")


def event_stream(
    hold: AbstractAsyncContextManager[SessionActor],
    since: int,
    *,
    slow_client_timeout: float = SLOW_CLIENT_SECONDS,
) -> EventSourceResponse:
    """The SSE response carrying a session's events from ``since`` on, each with its seq as id.

    ``hold`` gives the session for as long as the stream runs (``sessions.use(id)``, so that
    the registry does not close it as idle under a client that is watching it). The stream
    ends when the session closes, after everything it committed (with a ``deleted`` event
    saying so when it closed because another holder of the store deleted it), or, when the
    client is too slow (see ``slow_client_timeout``), with a ``resume`` event naming its
    cursor.
    """

    async def produce(outbox: Outbox) -> None:
        async with hold as session, session.subscribe(since) as subscription:
            async for event in subscription:
                data = orjson.dumps(event_json(event)).decode()
                await outbox.send(ServerSentEvent(data, id=str(event.seq)))
            if deleted(session) is not None:
                data = orjson.dumps({"error": deleted_notice(session.session_id)}).decode()
                await outbox.send(ServerSentEvent(data, event="deleted"))

    # Lines end with "\r\n", sse-starlette's default, as this stream's readers have known it.
    return stream_response(
        produce, resume_notice, sep="\r\n", slow_client_timeout=slow_client_timeout
    )
