"""Sessions streamed to user interfaces over HTTP: AG-UI streams, and the library's own SSE.

Needs the ``web`` extra (Starlette, sse-starlette and the AG-UI Python SDK). An application
mounts :attr:`SessionStreams.app` in its own Starlette or FastAPI app and runs
:meth:`SessionStreams.lifespan` in its lifespan; see ``docs/ui-streams.md`` for what the
streams guarantee and ``docs/internals.md`` for how they are built.
"""

from __future__ import annotations

try:
    import ag_ui.core  # noqa: F401
    import sse_starlette  # noqa: F401
    import starlette  # noqa: F401
except ImportError as error:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        f"nous_session.web needs the web extra: pip install 'nous-session[web]' ({error})"
    ) from error

from nous_session.web._agui import from_agui, messages_snapshot, translate
from nous_session.web._app import (
    MAX_BODY_SIZE,
    RUN_LEASE_TTL,
    Access,
    Authorize,
    SessionStreams,
    create_app,
    is_loopback,
)
from nous_session.web._live import Draft, LiveToolCall, live_message, live_tool_call
from nous_session.web._native import compaction_source, event_json, event_stream
from nous_session.web._run_host import Agent
from nous_session.web._sse import (
    PING_SECONDS,
    RETRY_MS,
    SLOW_CLIENT_SECONDS,
    Outbox,
    resume_point,
    stream_response,
)

__all__ = [
    "MAX_BODY_SIZE",
    "PING_SECONDS",
    "RETRY_MS",
    "RUN_LEASE_TTL",
    "SLOW_CLIENT_SECONDS",
    "Access",
    "Agent",
    "Authorize",
    "Draft",
    "LiveToolCall",
    "Outbox",
    "SessionStreams",
    "compaction_source",
    "create_app",
    "event_json",
    "event_stream",
    "from_agui",
    "is_loopback",
    "live_message",
    "live_tool_call",
    "messages_snapshot",
    "resume_point",
    "stream_response",
    "translate",
]
