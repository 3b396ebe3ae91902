"""nous_session: an append-only event log for AI-agent sessions, and the runtime around it.

How the layers stack (imports only point down):

    cli / examples / benchmarks
    integrations (by path): framework adapters over the registry and the actor
    Sessions, SessionsPortal (registry.py): many sessions of one store
    SessionActor (actor.py)  -- compaction policy + summarizers
    stores (memory, sqlite, postgres) -- codec (orjson), encryption at rest (encryption.py)
    Log (log.py)  -- Transcript (transcript.py)
    Event (event.py)
    Message, ToolCall, content parts, messages helpers (message.py, parts.py, messages.py)
    session metadata (metadata.py), listing queries (listing.py), retention (retention.py)
    provider formats (formats/): Message lists <-> OpenAI, Anthropic and Gemini payloads
    telemetry (telemetry.py): OpenTelemetry spans and metrics, optional, resolved at actor open

Log, Transcript, Event and Message are pure and synchronous: no I/O, no event loop.
"""

from nous_session import formats, messages, retention, telemetry, transcript
from nous_session.actor import SessionActor, SessionStatistics, Subscription
from nous_session.compaction import CompactionPolicy, Summarizer
from nous_session.encryption import Encryption, KeyProvider, LocalKeyFile, RewrappingStore
from nous_session.erasure import Erasure, select_events
from nous_session.errors import (
    ConflictError,
    CorruptRecordError,
    FormatError,
    InvalidEventError,
    InvalidHistoryError,
    LossyConversionError,
    NousSessionError,
    OutcomeUnknownError,
    SessionClosedError,
    SessionDeletedError,
    StoreError,
    WrongEventLoopError,
)
from nous_session.event import SURFACE_TYPES, Event, EventType
from nous_session.formats import Conversion, HistoryProblem
from nous_session.listing import ListArguments, ListQuery, SessionEntry, SessionPage
from nous_session.log import Log
from nous_session.message import ContentPart, Message, Role, ToolCall
from nous_session.metadata import SessionMetadata
from nous_session.ops import Remove, Replace, Rewind, SurfaceOp, Uncompact
from nous_session.parts import (
    ImagePart,
    OtherPart,
    Part,
    ProviderPart,
    RedactedThinkingPart,
    TextPart,
    ThinkingPart,
    ToolCallPart,
)
from nous_session.registry import Sessions, SessionsPortal, SessionsStatistics
from nous_session.retention import RetentionReport
from nous_session.stores import (
    CopyError,
    CopyReport,
    ForkingStore,
    LeasingStore,
    ListingStore,
    MemoryStore,
    OutcomeStore,
    Rebased,
    RebasingStore,
    SessionInfo,
    Store,
    Stored,
    copy_sessions,
    open_store,
)
from nous_session.stores.base import ErasingStore
from nous_session.transcript import Compacted, Unchanged

__all__ = [
    "Compacted",
    "CompactionPolicy",
    "ConflictError",
    "ContentPart",
    "Conversion",
    "CopyError",
    "CopyReport",
    "CorruptRecordError",
    "Encryption",
    "ErasingStore",
    "Erasure",
    "Event",
    "EventType",
    "ForkingStore",
    "FormatError",
    "HistoryProblem",
    "ImagePart",
    "InvalidEventError",
    "InvalidHistoryError",
    "KeyProvider",
    "LeasingStore",
    "ListArguments",
    "ListQuery",
    "ListingStore",
    "LocalKeyFile",
    "Log",
    "LossyConversionError",
    "MemoryStore",
    "Message",
    "NousSessionError",
    "OtherPart",
    "OutcomeStore",
    "OutcomeUnknownError",
    "Part",
    "ProviderPart",
    "Rebased",
    "RebasingStore",
    "RedactedThinkingPart",
    "Remove",
    "Replace",
    "RetentionReport",
    "Rewind",
    "RewrappingStore",
    "Role",
    "SURFACE_TYPES",
    "SessionActor",
    "SessionClosedError",
    "SessionDeletedError",
    "SessionEntry",
    "SessionInfo",
    "SessionMetadata",
    "SessionPage",
    "SessionStatistics",
    "Sessions",
    "SessionsPortal",
    "SessionsStatistics",
    "Store",
    "StoreError",
    "Stored",
    "Subscription",
    "Summarizer",
    "SurfaceOp",
    "TextPart",
    "ThinkingPart",
    "ToolCall",
    "ToolCallPart",
    "Unchanged",
    "Uncompact",
    "WrongEventLoopError",
    "copy_sessions",
    "formats",
    "messages",
    "open_store",
    "retention",
    "select_events",
    "telemetry",
    "transcript",
]
