"""Adapters: one small, uniform face over each system the ``peers`` suite compares.

Every adapter is a :class:`Backend` (one store: in memory, or one SQLite file) that opens
:class:`PeerSession` objects. Each peer is called through its public API the way its own docs
show it; the adapter only converts our workload's :class:`~nous_session.Message` values into the
peer's native message objects, **before** any timing starts, so every system appends the same
conversation and the conversion is never on the clock.

* ``ours``: ``SessionActor`` over ``MemoryStore`` / ``SQLiteStore`` (default durability,
  ``synchronous="FULL"``), each append awaited.
* ``openai-agents``: ``agents.SQLiteSession`` (``":memory:"`` / a file).
* ``langgraph``: a ``StateGraph(MessagesState)`` (``add_messages``) compiled with
  ``InMemorySaver`` / ``AsyncSqliteSaver``.
* ``google-adk``: ``InMemorySessionService`` / ``SqliteSessionService``.
* ``eventsourcing``: an ``Application`` with a ``Conversation`` aggregate, POPO / SQLite.

Peers are optional (the ``bench`` extra installs them): :func:`available` lists the ones that
import, and :func:`missing` says why the others do not.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from nous_session import Message

MEMORY = "memory"
SQLITE = "sqlite"


class PeerSession(Protocol):
    """One conversation of one system."""

    async def append(self, unit: Any) -> None:
        """Append one converted message (one call of the peer's own append API)."""

    async def history(self) -> Sequence[Any]:
        """The model-visible history, the way an agent loop reads it before a model call."""

    async def tail(self, k: int) -> Sequence[Any]:
        """The last ``k`` history entries, by the cheapest public API the peer has for it."""

    async def fill(self, units: Sequence[Any]) -> None:
        """Append ``units`` untimed, by the fastest public API (a bulk append where there is one).

        Only for setup: the agent loop fills the middle of a slow peer's history with it.
        """


class Backend(Protocol):
    """One store of one system: in memory, or one SQLite file."""

    system: str  # "ours", "openai-agents", ...
    kind: str  # MEMORY or SQLITE
    concurrent: bool  # False: the peer's API is synchronous (calls cannot overlap)

    def convert(self, message: Message) -> Any:
        """Our message as the peer's native append unit (done before timing)."""

    def entries(self, unit: Any) -> int:
        """How many history entries one append of ``unit`` makes."""

    def text(self, entry: Any) -> str | None:
        """The text content of one history entry (None for entries without one)."""

    async def session(self, session_id: str) -> PeerSession:
        """Create (or open) the session ``session_id``."""

    async def close_session(self, session_id: str) -> None:
        """Release what :meth:`session` holds for ``session_id`` (data stays stored)."""

    async def aclose(self) -> None:
        """Close everything; the SQLite file, if any, stays for measuring."""


Opener = Callable[[Path | None], Awaitable[Backend]]


@dataclass(frozen=True)
class System:
    """A system under test and how to open its backends."""

    name: str  # "openai-agents"
    module: str  # adapter module under benchmarks.peers
    packages: tuple[str, ...]  # distributions whose versions the report names

    def versions(self) -> dict[str, str]:
        out = {}
        for package in self.packages:
            try:
                out[package] = importlib.metadata.version(package)
            except importlib.metadata.PackageNotFoundError:
                out[package] = "not installed"
        return out

    def opener(self, kind: str) -> Opener | None:
        """The adapter's ``open_memory`` / ``open_sqlite`` (None if it has no such backend)."""
        module = importlib.import_module(f"benchmarks.peers.{self.module}")
        opener: Opener | None = getattr(module, f"open_{kind}", None)
        return opener


OURS = System("ours", "ours", ("nous_session",))
PEERS = (
    System("openai-agents", "openai_agents_peer", ("openai-agents",)),
    System(
        "langgraph",
        "langgraph_peer",
        ("langgraph", "langgraph-checkpoint", "langgraph-checkpoint-sqlite", "langchain-core"),
    ),
    System("google-adk", "adk_peer", ("google-adk",)),
    System("eventsourcing", "eventsourcing_peer", ("eventsourcing",)),
    # Ours again, through the openai-agents adapter (issue 12): never counted as a peer.
    System("ours-openai-agents", "ours_agents_peer", ("nous_session", "openai-agents")),
    System("ours-openai-agents-loop", "ours_agents_loop_peer", ("nous_session", "openai-agents")),
    # Ours through a Sessions registry (`await sessions.get(id)` before every append).
    System("ours-sessions", "ours_sessions_peer", ("nous_session",)),
    # No library at all: raw sqlite3 in one thread, awaited (a reference, never a peer; only
    # the sequential workloads run it).
    System("floor", "floor_peer", ()),
)
REFERENCES = frozenset({"floor"})
"""Systems measured beside the peers as a bound, never counted as one."""

_broken: dict[str, str] = {}


def available() -> list[System]:
    """The peers whose adapter (and so whose package) imports here."""
    found = []
    for system in PEERS:
        try:
            importlib.import_module(f"benchmarks.peers.{system.module}")
        except ImportError as error:
            _broken[system.name] = f"{type(error).__name__}: {error}"
            continue
        found.append(system)
    return found


def missing() -> dict[str, str]:
    """Why each peer that :func:`available` left out did not import."""
    available()
    return dict(_broken)


class Deadline:
    """A time box: ``expired()`` once ``seconds`` have passed (never, for None)."""

    def __init__(self, seconds: float | None) -> None:
        self.end = None if seconds is None else time.perf_counter() + seconds

    def expired(self) -> bool:
        return self.end is not None and time.perf_counter() >= self.end


def disk_bytes(path: Path) -> int:
    """The bytes a SQLite database takes: the file and its -wal / -journal, if present."""
    total = 0
    for suffix in ("", "-wal", "-journal"):
        candidate = path.with_name(path.name + suffix)
        if candidate.exists():
            total += candidate.stat().st_size
    return total
