"""A Google ADK ``BaseSessionService`` kept in nous_session.

:class:`NousSessionService` implements every method of ADK's ``BaseSessionService``
(``create_session``, ``get_session`` with its ``GetSessionConfig``, ``list_sessions``,
``delete_session``, ``get_user_state``, ``append_event``, ``flush``) over nous_session
sessions, in any store (memory, SQLite, PostgreSQL)::

    from google.adk.runners import Runner
    from nous_session.integrations.google_adk import NousSessionService

    service = NousSessionService("sqlite:///sessions.sqlite3")
    runner = Runner(app_name="app", agent=agent, session_service=service)

The mapping:

* **One nous_session session per ADK session**, id ``adk:s/<app>/<user>/<session>`` with each
  part percent-encoded (``/`` and ``%`` included), so that no two ``(app_name, user_id,
  session_id)`` triples share a session. App state is the session ``adk:a/<app>``, user state
  ``adk:u/<app>/<user>``: each holds ``x.adk.state`` events (a delta each), folded in order.
* ``x.adk.created``: the session was created, with its session-scoped initial state.
  ``x.adk.event``: one ADK ``Event``, stored once, as the JSON text ADK's own pydantic
  serialisation made (``model_dump_json(exclude_none=True)``, what ADK's SQLite service
  stores), beside its id, author, invocation id and timestamp, and read back with
  ``Event.model_validate_json``: exact, integers beyond 64 bits and all. Its session-scoped
  state delta is folded from it. State is kept as JSON text the same way (``json.dumps``).
  ``x.adk.deleted``: ``delete_session``. The log is append-only, so a deleted session's events
  stay (and a session created again under that id starts from its new ``x.adk.created``).
* **The surface.** An event's content (text, function calls, function responses, whatever
  the ``"gemini"`` provider format reads) is also put on the session's surface, in the same
  commit, as nous_session messages carrying ``metadata["adk_event_id"]`` and
  ``["adk_timestamp"]``, so ``session.messages()``, subscribers and ``nous-session messages``
  show the conversation. An event whose actions carry an ``EventCompaction`` replaces the
  surface entries of the events it compacted (those with timestamps in its range) with its
  summary, in one conditional ``replace``: the compacted events stay in the log (``uncompact``
  shows them again). ADK reads only the ``x.adk.event`` events back: the surface is a view.
* **State deltas** are split as ADK's own services split them: ``app:`` keys go to the app's
  state, ``user:`` keys to the user's, ``temp:`` keys are applied to the in-memory session
  only and never stored, the rest to the session. A value replaces the stored one (no deep
  merge); ``None`` is stored.
* **Stale writers.** Every session object this service returns carries the session's log
  count as ADK's storage revision marker (``Session._storage_update_marker``, as ADK's
  ``DatabaseSessionService``). ``append_event`` on a session object whose marker is not the
  current count (another writer appended since it was read), or whose conditional append
  (``append_many(..., expect_count=)``) loses to another process's commit (nous_session's
  :class:`~nous_session.errors.ConflictError`), raises ADK's ``StaleSessionError`` and
  appends nothing.
* **Idempotence.** An event delivered twice (equal JSON, same id) is stored once: its
  append carries an idempotency key made from its JSON and the session's creation, checked
  before the session object's marker.
* **Outcomes.** The event, its session-scoped state and its surface messages are one commit:
  ``append_event`` raising :class:`~nous_session.errors.StoreError` (or ``StaleSessionError``)
  stored nothing. App and user state deltas are committed after it, in their own sessions,
  each keyed by the event: if one fails, the event is stored (and applied to the session
  object) and the call raises :class:`~nous_session.errors.OutcomeUnknownError`, as it does
  when the store cannot say whether the event's commit landed. Either way, appending the same
  event again finishes the call, with the same session object (or a reloaded one, after a
  crash): the event is stored once, each delta applied once, and an object read just before
  the event was stored takes it instead of being stale. A compaction's surface ``replace``
  that fails is logged and skipped: the event is stored, the surface keeps what it covered.
  ``create_session`` likewise: the creation (with its session-scoped state, and its app and
  user initial state recorded) is one commit, that app and user state one commit each after
  it, keyed by the creation; creating the session again after an ``OutcomeUnknownError``
  applies what is missing, then raises ``AlreadyExistsError``. A caller cancelled while
  either call runs does not cut it short: the event (or the creation) and its app and user
  state are committed in one call on the portal, which completes whatever the caller does.

Sessions live on a :class:`~nous_session.registry.SessionsPortal` (an event loop in a thread
of its own), because ADK calls its session service from several event loops (``Runner.run``
runs each turn under a fresh ``asyncio.run`` in a thread). Pass ``sessions=`` to use a portal
of your own.

Needs the ``google-adk`` extra: ``pip install 'nous_session[google-adk]'``.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final, TypeVar
from urllib.parse import quote, unquote

import anyio
import attrs

from nous_session._logging import get_logger
from nous_session.errors import ConflictError, FormatError, OutcomeUnknownError, StoreError
from nous_session.event import EventType, message_event
from nous_session.formats import from_provider
from nous_session.integrations._common import missing_extra, named_store
from nous_session.integrations._listing import listed_ids
from nous_session.message import Message
from nous_session.metadata import SessionMetadata
from nous_session.registry import SessionsPortal
from nous_session.stores.base import Store

try:
    from google.adk.errors._stale_session_error import StaleSessionError
    from google.adk.errors.already_exists_error import AlreadyExistsError
    from google.adk.errors.session_not_found_error import SessionNotFoundError
    from google.adk.events.event import Event as AdkEvent
    from google.adk.sessions import _session_util
    from google.adk.sessions.base_session_service import (
        BaseSessionService,
        GetSessionConfig,
        ListSessionsResponse,
    )
    from google.adk.sessions.session import Session
    from google.adk.sessions.state import State
except ImportError as error:  # pragma: no cover - the extra is installed for the tests
    raise missing_extra(__name__, "Google ADK", "google-adk") from error

if TYPE_CHECKING:
    from nous_session.actor import SessionActor
    from nous_session.event import Event
    from nous_session.log import Log

__all__ = [
    "CREATED_EVENT",
    "DELETED_EVENT",
    "EVENT_EVENT",
    "STATE_EVENT",
    "NousSessionService",
]

CREATED_EVENT: Final = "x.adk.created"
"""The custom event type of a session's creation (with its session-scoped initial state)."""
EVENT_EVENT: Final = "x.adk.event"
"""The custom event type of one ADK ``Event``, as ADK's pydantic serialisation made it."""
DELETED_EVENT: Final = "x.adk.deleted"
"""The custom event type recording ``delete_session``."""
STATE_EVENT: Final = "x.adk.state"
"""The custom event type of an app or user state delta (in the app's or user's session)."""

PROVIDER: Final = "gemini"
_STALE: Final = (
    "The session has been modified in storage since it was loaded. "
    "Please reload the session before appending more events."
)
# A state delta to an app or user session that keeps losing to other processes gives up.
_STATE_ATTEMPTS: Final = 32
# Folds kept per kind (sessions; app and user states), least recently used dropped beyond.
_CACHED: Final = 1024
_logger = get_logger("nous_session.integrations.google_adk")


def _part(text: str) -> str:
    return quote(text, safe="")


def _normal_id(session_id: str) -> str:
    # ADK's in-memory and SQLite services strip the id they are given, on every call.
    return session_id.strip() if session_id else session_id


@attrs.define
class _Folded:
    """What an ADK session's events say, folded in seq order."""

    count: int = 0  # events folded: every seq below this
    alive: bool = False
    created: int = -1  # the seq of the x.adk.created event that began the current life
    # That creation's app and user initial state (JSON text; None: none, or written before
    # creations recorded it), applied after it under keys of the creation.
    shared: tuple[str | None, str | None] = (None, None)
    state: dict[str, Any] = attrs.field(factory=dict)
    events: list[tuple[float, str]] = attrs.field(factory=list)  # (timestamp, event JSON)
    update_time: float = 0.0

    def fold(self, events: Sequence[Event], count: int) -> None:
        for event in events:
            if event.seq < self.count:
                continue
            kind = event.type
            data = event.data
            if kind == CREATED_EVENT:
                self.alive = True
                self.created = event.seq
                state, when = data["state"], data["time"]
                # What this service wrote: the state as JSON text, the time as a number.
                assert isinstance(state, str)
                assert isinstance(when, int | float)
                self.state = json.loads(state)
                self.events = []
                self.update_time = when
                app, user = data.get("app"), data.get("user")
                assert app is None or isinstance(app, str)
                assert user is None or isinstance(user, str)
                self.shared = (app, user)
            elif kind == EVENT_EVENT and self.alive:
                raw = data["event"]
                assert isinstance(raw, str)  # the ADK event's JSON, as this service wrote it
                stored = json.loads(raw)
                timestamp = float(stored.get("timestamp", 0.0))
                self.events.append((timestamp, raw))
                actions = stored.get("actions") or {}
                delta = actions.get("state_delta") or {}
                self.state.update(_session_util.extract_state_delta(delta)["session"])
                self.update_time = timestamp
            elif kind == DELETED_EVENT:
                self.alive = False
                self.state = {}
                self.events = []
        self.count = max(self.count, count)


@attrs.define
class _FoldedState:
    """An app's or a user's state, folded from its ``x.adk.state`` deltas."""

    count: int = 0
    state: dict[str, Any] = attrs.field(factory=dict)

    def fold(self, events: Sequence[Event], count: int) -> None:
        for event in events:
            if event.seq >= self.count and event.type == STATE_EVENT:
                delta = event.data["delta"]
                assert isinstance(delta, str)  # the delta's JSON, as this service wrote it
                self.state.update(json.loads(delta))
        self.count = max(self.count, count)


@attrs.frozen
class _Read:
    """One ADK session as read from its log, with the revision marker of that read."""

    state: dict[str, Any]
    events: list[tuple[float, str]]
    update_time: float
    marker: str


class NousSessionService(BaseSessionService):
    """A Google ADK session service whose sessions are nous_session sessions.

    Usable from any event loop and thread (see the module's docstring). Every write follows
    nous_session's outcome rules: a method that returns has committed; one that raises
    :class:`~nous_session.errors.StoreError` (or ADK's ``StaleSessionError``) committed
    nothing; one that raises :class:`~nous_session.errors.OutcomeUnknownError` may have
    committed some of it, and calling it again with the same arguments finishes it (see
    :meth:`append_event`).
    """

    def __init__(
        self,
        store: Store | str | None = None,
        *,
        sessions: SessionsPortal | None = None,
        prefix: str = "adk",
    ) -> None:
        """Name where sessions live; nothing is read or written before the first call.

        Args:
            store: a store URL (``"sqlite:///sessions.sqlite3"``, ``"postgresql://..."``), a
                Store (used from the portal's loop only from now on), or None for the store
                ``NOUS_SESSION_STORE`` names, else a private in-memory store that ends with
                this service.
            sessions: a portal of your own to run on (then leave ``store`` out); it must use
                ``on_conflict="raise"``, the default, for stale writers to be detected
                across processes.
            prefix: the first part of every nous_session session id this service uses.

        Raises:
            ValueError: a bad argument.
        """
        if sessions is not None and store is not None:
            raise ValueError("give store or sessions, not both")
        if sessions is not None and not isinstance(sessions, SessionsPortal):
            raise ValueError(f"sessions must be a SessionsPortal, got {sessions!r}")
        if not isinstance(prefix, str) or not prefix:
            raise ValueError(f"prefix must be a non-empty string, got {prefix!r}")
        self._owned = sessions is None
        if sessions is None:
            named = named_store(store)  # "" is a bad URL, not "none given"
            sessions = SessionsPortal("memory:" if named is None else named)
        self._portal = sessions
        self._prefix = prefix
        # Folds by nous_session session id (the most recently used _CACHED of each kind; the
        # others are folded again from their actor's log when next needed), and the locks that
        # make a stale check and its append one step; all touched on the portal's loop only.
        self._folds: OrderedDict[str, _Folded] = OrderedDict()
        self._states: OrderedDict[str, _FoldedState] = OrderedDict()
        self._locks: dict[str, tuple[anyio.Lock, int]] = {}

    # Ids ----------------------------------------------------------------------------------------

    def session_id(self, app_name: str, user_id: str, session_id: str) -> str:
        """The nous_session session id of an ADK session."""
        return (
            f"{self._prefix}:s/{_part(app_name)}/{_part(user_id)}/{_part(_normal_id(session_id))}"
        )

    def _app_id(self, app_name: str) -> str:
        return f"{self._prefix}:a/{_part(app_name)}"

    def _user_id(self, app_name: str, user_id: str) -> str:
        return f"{self._prefix}:u/{_part(app_name)}/{_part(user_id)}"

    @property
    def portal(self) -> SessionsPortal:
        """The portal the sessions' actors run on (to reach one with ``portal.call``)."""
        return self._portal

    # BaseSessionService -------------------------------------------------------------------------

    async def create_session(
        self,
        *,
        app_name: str,
        user_id: str,
        state: dict[str, Any] | None = None,
        session_id: str | None = None,
    ) -> Session:
        """Create a session (a fresh uuid4 id when ``session_id`` is None or blank), its
        ``app:`` and ``user:`` initial state going to the app's and the user's state.

        The session (with its session-scoped state) is one commit; its app and user initial
        state are one commit each, after it, in their own sessions, each keyed by the
        creation. If one of those fails, the session exists and the call raises
        :class:`~nous_session.errors.OutcomeUnknownError`, as it does when the store cannot
        say whether the creation's commit landed: creating the session again then applies
        what is missing (once) and raises ``AlreadyExistsError``.

        Raises:
            AlreadyExistsError: a session with this id exists for this app and user.
            StoreError: the store failed to commit the creation (nothing was created).
            OutcomeUnknownError: whether the session was created is not known, or it was
                but its app or user state may not have been applied.
        """
        session_id = _normal_id(session_id) if session_id else None
        session_id = session_id or str(uuid.uuid4())
        deltas = _session_util.extract_json_safe_state_delta(state or {})
        now = time.time()
        sid = self.session_id(app_name, user_id, session_id)

        record = self._metadata(app_name, user_id)

        async def create(actor: SessionActor) -> tuple[str | None, int, tuple[Any, Any]]:
            """The new marker (None when the session exists), and the creation's seq and
            its app and user initial state (the existing session's when it exists)."""
            async with self._locked(sid):
                while True:
                    folded = self._fold(sid, actor.log)
                    if folded.alive:
                        return None, folded.created, folded.shared
                    data: dict[str, Any] = {"state": json.dumps(deltas["session"]), "time": now}
                    for scope in ("app", "user"):
                        if deltas[scope]:
                            data[scope] = json.dumps(deltas[scope])
                    items: list[tuple[str, dict[str, Any]]] = [(CREATED_EVENT, data)]
                    if record is not None and actor.metadata != record:
                        # Who and what it belongs to, for list_sessions (the store's index).
                        items.append((EventType.METADATA, {"metadata": record.to_json()}))
                    try:
                        await actor.append_many(items, expect_count=actor.log.count)
                    except ConflictError:  # another writer came first; the actor caught up
                        continue
                    folded = self._fold(sid, actor.log)
                    return str(actor.log.count), folded.created, folded.shared

        async def create_and_apply(
            actor: SessionActor,
        ) -> tuple[str | None, dict[str, Any], dict[str, Any]]:
            """The creation, then its app and user state, in one call on the portal: a
            caller cancelled meanwhile leaves none of them half done."""
            marker, created, shared = await create(actor)
            # The creation's own app and user state (the existing one's when it exists: a
            # create that failed after its commit is finished by creating again), keyed by
            # it: applied once.
            app, user = (json.loads(text) if text is not None else {} for text in shared)
            key = f"{sid}:adk:{created}:created"
            if marker is None:
                if app or user:
                    await self._update_state(self._app_id(app_name), app, key=f"{key}:app")
                    await self._update_state(
                        self._user_id(app_name, user_id), user, key=f"{key}:user"
                    )
                raise AlreadyExistsError(f"Session with id {session_id} already exists.")
            try:
                app_state = await self._update_state(self._app_id(app_name), app, key=f"{key}:app")
                user_state = await self._update_state(
                    self._user_id(app_name, user_id), user, key=f"{key}:user"
                )
            except (StoreError, OutcomeUnknownError) as error:
                raise OutcomeUnknownError(
                    f"session {session_id} was created, but its app or user state may not "
                    f"have been ({error}); create it again to apply what is missing"
                ) from error
            return marker, app_state, user_state

        marker, app_state, user_state = await self._portal.acall(sid, create_and_apply)
        session = Session(
            app_name=app_name,
            user_id=user_id,
            id=session_id,
            state=_merge(app_state, user_state, deltas["session"]),
            events=[],
            last_update_time=now,
        )
        session._storage_update_marker = marker
        return session

    async def get_session(
        self,
        *,
        app_name: str,
        user_id: str,
        session_id: str,
        config: GetSessionConfig | None = None,
    ) -> Session | None:
        """The session with its merged state and its events (filtered by ``config``: the
        latest ``num_recent_events``, those at or after ``after_timestamp``), or None."""
        session_id = _normal_id(session_id)
        read = await self._read(self.session_id(app_name, user_id, session_id))
        if read is None:
            return None
        events = read.events
        if config is not None:
            if config.after_timestamp is not None:
                after = config.after_timestamp
                events = [item for item in events if item[0] >= after]
            if config.num_recent_events is not None:
                recent = config.num_recent_events
                events = events[max(0, len(events) - recent) :] if recent else []
        app_state = await self._state(self._app_id(app_name))
        user_state = await self._state(self._user_id(app_name, user_id))
        session = Session(
            app_name=app_name,
            user_id=user_id,
            id=session_id,
            state=_merge(app_state, user_state, read.state),
            events=[AdkEvent.model_validate_json(raw) for _, raw in events],
            last_update_time=read.update_time,
        )
        session._storage_update_marker = read.marker
        return session

    def _metadata(self, app_name: str, user_id: str) -> SessionMetadata | None:
        """The metadata a session of this app and user gets: owner and app, and this
        service's prefix (``extra.adk``), so that listing finds exactly its sessions. None for
        names metadata cannot hold (an empty one): such sessions are found by a scan."""
        try:
            return SessionMetadata(owner=user_id, app=app_name, extra={"adk": self._prefix})
        except ValueError:
            return None

    async def list_sessions(
        self, *, app_name: str, user_id: str | None = None
    ) -> ListSessionsResponse:
        """The app's sessions (of one user, or of all users for None), with their merged
        state and no events, least recently updated first.

        Listed through the store's index (:class:`~nous_session.stores.base.ListingStore`:
        owner and app from each session's metadata), so the cost follows the sessions
        listed, not all those stored. Sessions created by a version of this service that
        set no metadata, or whose app or user name metadata cannot hold, are found by
        scanning every session id instead, as before.
        """
        prefix = f"{self._prefix}:s/{_part(app_name)}/"
        if user_id is not None:
            prefix += f"{_part(user_id)}/"
        where: dict[str, Any] | None = {"app": app_name, "adk": self._prefix}
        if user_id is not None:
            assert where is not None
            where["owner"] = user_id
        if self._metadata(app_name, user_id or "-") is None:
            where = None

        async def stored(actor: SessionActor) -> list[str]:
            store = actor.store
            found = await listed_ids(store, where, prefix)
            if found is None:
                infos = await store.sessions()
                return [info.session_id for info in infos if info.session_id.startswith(prefix)]
            return found

        app_id = self._app_id(app_name)
        app_state = await self._state(app_id)
        user_states: dict[str, dict[str, Any]] = {}
        listed: list[Session] = []
        for sid in await self._portal.acall(app_id, stored):
            read = await self._read(sid)
            if read is None:
                continue
            _, user_part, id_part = sid[len(f"{self._prefix}:s/") :].split("/")
            owner = unquote(user_part)
            if owner not in user_states:
                user_states[owner] = await self._state(self._user_id(app_name, owner))
            session = Session(
                app_name=app_name,
                user_id=owner,
                id=unquote(id_part),
                state=_merge(app_state, user_states[owner], read.state),
                events=[],
                last_update_time=read.update_time,
            )
            session._storage_update_marker = read.marker
            listed.append(session)
        listed.sort(key=lambda s: (s.last_update_time, s.user_id, s.id))
        return ListSessionsResponse(sessions=listed)

    async def delete_session(self, *, app_name: str, user_id: str, session_id: str) -> None:
        """Delete the session: an ``x.adk.deleted`` event (its events stay in the log) and a
        remove of its surface. Nothing happens for a session that does not exist."""
        sid = self.session_id(app_name, user_id, session_id)

        async def delete(actor: SessionActor) -> None:
            async with self._locked(sid):
                await actor.reload()
                while self._fold(sid, actor.log).alive:
                    deleted = (DELETED_EVENT, {"time": time.time()})
                    try:
                        await actor.append_many([deleted], expect_count=actor.log.count)
                    except ConflictError:  # another writer came first; the actor caught up
                        continue
                    entries = actor.log.surface()
                    if entries:
                        try:
                            await actor.remove(entries[0].position, entries[-1].position)
                        except ConflictError:  # the surface is a view
                            pass
                        except (StoreError, OutcomeUnknownError) as error:
                            # The deletion is stored: a StoreError would say it was not.
                            _logger.warning(
                                "nous_session.adk_surface_not_removed",
                                session_id=sid,
                                error=str(error),
                            )

        await self._portal.acall(sid, delete)

    async def get_user_state(self, *, app_name: str, user_id: str) -> dict[str, Any]:
        """The user's state in the app, with its keys unprefixed (``{}`` when none)."""
        return await self._state(self._user_id(app_name, user_id))

    async def append_event(self, session: Session, event: AdkEvent) -> AdkEvent:
        """Store ``event`` in ``session`` (and apply it to the session object), as ADK's own
        services do: a partial event is not stored, ``temp:`` state is applied to the
        object only, ``app:``/``user:`` deltas go to the app's and the user's state.

        The event (with its session-scoped state) is one commit; its app and user deltas are
        one commit each, after it, in their own sessions, and each is keyed by the event.
        Appending an event again (equal JSON, the same id) is idempotent: it is stored once,
        each delta applied once, and a delta that did not land is applied then. So a call
        that raised :class:`~nous_session.errors.OutcomeUnknownError` is completed by
        appending the same event again, with the same ``session`` object: if the event was
        stored meanwhile, the object is brought up to date with it instead of being
        stale.

        Raises:
            SessionNotFoundError: the session does not exist (or was deleted).
            StaleSessionError: another writer appended to the session since ``session`` was
                read (nothing was appended).
            StoreError: the store failed to commit the event (nothing was stored).
            OutcomeUnknownError: whether the event was stored is not known, or it was (and
                is applied to ``session``) but its app or user delta may not have been.
                Append the same event again to finish.
        """
        if event.partial:
            return event
        self._apply_temp_state(session, event)
        event = self._trim_temp_delta_state(event)
        raw = event.model_dump_json(exclude_none=True)
        digest = hashlib.sha256(raw.encode()).hexdigest()
        data = {
            "id": event.id,
            "author": event.author,
            "invocation_id": event.invocation_id,
            "timestamp": event.timestamp,
            "event": raw,
        }
        items: list[tuple[Any, ...]] = [(EVENT_EVENT, data)]
        items.extend((*message_event(m), m.created_at) for m in _messages(event))
        sid = self.session_id(session.app_name, session.user_id, session.id)
        marker = session._storage_update_marker
        seen = session.last_update_time
        compacts = event.actions is not None and event.actions.compaction is not None

        async def append(actor: SessionActor) -> tuple[str | None, str]:
            async with self._locked(sid):
                folded = self._fold(sid, actor.log)
                if not folded.alive:
                    raise SessionNotFoundError(f"Session {session.id} not found.")
                count = actor.log.count
                if marker is None and folded.update_time > seen:
                    raise StaleSessionError(_STALE)
                read_at = count if marker is None else _marker_count(marker)
                if read_at is None:
                    raise StaleSessionError(_STALE)
                # Equal events (same id, same JSON) in one life of the session are one event.
                key = f"adk:{folded.created}:{digest}"
                try:
                    # Conditional on the count the session object was read at: a commit
                    # another writer made since, whether this actor has heard of it yet or
                    # not, refuses the append. The key comes first: an event stored before
                    # is answered with its events whatever the count.
                    appended = await actor.append_many(items, key=key, expect_count=read_at)
                except ConflictError as error:
                    raise StaleSessionError(_STALE) from error
                first, end = appended[0].seq, appended[-1].seq + 1
                if first < read_at:
                    return None, key  # the object holds it already: stored once, applied once
                if first > read_at:
                    # Stored before, after other writers' events this object has not seen:
                    # it cannot take the event; a fresh read can (and applies the deltas).
                    raise StaleSessionError(_STALE)
                # Right on top of what the object holds: stored now, or by an earlier call
                # that failed before the object heard of it (its outcome unknown). The object
                # takes it, and the surface is compacted unless something came after it.
                if compacts and actor.log.count == end:
                    replaced = await _compact(actor, event)
                    if replaced is not None and replaced.seq == end:
                        end += 1
                return str(end), key

        async def append_and_apply(actor: SessionActor) -> tuple[str | None, Exception | None]:
            """The event's append, then its app and user deltas, in one call on the portal:
            a caller cancelled meanwhile leaves none of them half done."""
            new_marker, key = await append(actor)
            if event.actions is not None and event.actions.state_delta:
                # Keyed by the event's own key: an event delivered again (after this failed,
                # or after a crash between its commit and these) applies its app and user
                # deltas if they did not land, and never twice.
                deltas = _session_util.extract_json_safe_state_delta(event.actions.state_delta)
                try:
                    await self._update_state(
                        self._app_id(session.app_name), deltas["app"], key=f"{sid}:{key}:app"
                    )
                    await self._update_state(
                        self._user_id(session.app_name, session.user_id),
                        deltas["user"],
                        key=f"{sid}:{key}:user",
                    )
                except (StoreError, OutcomeUnknownError) as error:
                    return new_marker, error
            return new_marker, None

        new_marker, failed = await self._portal.acall(sid, append_and_apply)
        if new_marker is not None:
            session.last_update_time = event.timestamp
            session._storage_update_marker = new_marker
            self._commit_event_to_session(session, event)
        if failed is not None:
            raise OutcomeUnknownError(
                f"event {event.id} was stored in session {session.id} and applied to the "
                f"session object, but its app or user state delta may not have been "
                f"({failed}); append the same event again to apply what is missing"
            ) from failed
        return event

    async def flush(self) -> None:
        """Nothing is buffered: every method returns once committed."""

    # Closing --------------------------------------------------------------------------------

    async def close(self) -> None:
        """Close the portal this service made (its actors commit what is queued first).
        Idempotent; a portal passed in as ``sessions=`` stays open."""
        if self._owned and not self._portal.closed:
            await anyio.to_thread.run_sync(self._portal.close)

    async def __aenter__(self) -> NousSessionService:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} prefix={self._prefix!r} portal={self._portal!r}>"

    # Helpers --------------------------------------------------------------------------------

    def _locked(self, sid: str) -> _Held:
        return _Held(self._locks, sid)

    def _fold(self, sid: str, log: Log) -> _Folded:
        folded = _cached(self._folds, sid, log, _Folded)
        if not folded.alive and not folded.events:
            self._folds.pop(sid, None)  # nothing to keep: folded again when next needed
        return folded

    async def _read(self, sid: str) -> _Read | None:
        async def read(actor: SessionActor) -> _Read | None:
            log = await actor.reload()
            folded = self._fold(sid, log)
            if not folded.alive:
                return None
            return _Read(
                dict(folded.state), list(folded.events), folded.update_time, str(log.count)
            )

        return await self._portal.acall(sid, read)

    async def _state(self, sid: str) -> dict[str, Any]:
        async def read(actor: SessionActor) -> dict[str, Any]:
            log = await actor.reload()
            return dict(self._folded_state(sid, log).state)

        return await self._portal.acall(sid, read)

    def _folded_state(self, sid: str, log: Log) -> _FoldedState:
        return _cached(self._states, sid, log, _FoldedState)

    async def _update_state(
        self, sid: str, delta: dict[str, Any], *, key: str | None = None
    ) -> dict[str, Any]:
        """Apply a delta to an app's or user's state (retrying when another process wrote
        first: a delta does not depend on what it replaces) and return the state. With
        ``key``, a delta already applied under that key is not applied again."""

        async def update(actor: SessionActor) -> dict[str, Any]:
            if delta:
                for attempt in range(_STATE_ATTEMPTS):
                    try:
                        await actor.append(STATE_EVENT, {"delta": json.dumps(delta)}, key=key)
                        break
                    except ConflictError:  # the actor caught up: trying again lands
                        if attempt == _STATE_ATTEMPTS - 1:
                            raise
            else:
                await actor.reload()
            return dict(self._folded_state(sid, actor.log).state)

        return await self._portal.acall(sid, update)


class _Held:
    """``async with``: the lock of one session id, dropped from the table when unused."""

    def __init__(self, table: dict[str, tuple[anyio.Lock, int]], key: str) -> None:
        self._table = table
        self._key = key

    async def __aenter__(self) -> None:
        lock, users = self._table.get(self._key) or (anyio.Lock(), 0)
        self._table[self._key] = (lock, users + 1)
        try:
            await lock.acquire()
        except BaseException:
            self._release_user()
            raise

    async def __aexit__(self, *exc_info: object) -> None:
        self._table[self._key][0].release()
        self._release_user()

    def _release_user(self) -> None:
        lock, users = self._table[self._key]
        if users <= 1:
            del self._table[self._key]
        else:
            self._table[self._key] = (lock, users - 1)


_F = TypeVar("_F", _Folded, _FoldedState)


def _cached(cache: OrderedDict[str, _F], sid: str, log: Log, make: Callable[[], _F]) -> _F:
    """The fold of ``sid`` caught up with ``log``, from ``cache`` (least recently used out)."""
    folded = cache.get(sid)
    if folded is None or log.count < folded.count:
        folded = cache[sid] = make()
        while len(cache) > _CACHED:
            cache.popitem(last=False)
    else:
        cache.move_to_end(sid)
    if log.count > folded.count:
        folded.fold(log.since(folded.count), log.count)
    return folded


def _marker_count(marker: str) -> int | None:
    """The log count a session object's storage marker names (None: not one of ours)."""
    try:
        count = int(marker)
    except ValueError:
        return None
    return count if count >= 0 and str(count) == marker else None


def _merge(
    app_state: Mapping[str, Any], user_state: Mapping[str, Any], session_state: Mapping[str, Any]
) -> dict[str, Any]:
    """The state ADK sees: the session's, then the app's and the user's under their prefixes."""
    merged: dict[str, Any] = json.loads(json.dumps(dict(session_state)))  # a copy of our own
    for key, value in json.loads(json.dumps(dict(app_state))).items():
        merged[State.APP_PREFIX + key] = value
    for key, value in json.loads(json.dumps(dict(user_state))).items():
        merged[State.USER_PREFIX + key] = value
    return merged


def _messages(event: AdkEvent) -> list[Message]:
    """The surface messages an ADK event's content stands for (none when it has none, or
    when the ``"gemini"`` format cannot read it), each naming its event."""
    content = event.content
    if content is None or not content.parts:
        return []
    payload = {"contents": [content.model_dump(mode="json", by_alias=True, exclude_none=True)]}
    created = datetime.fromtimestamp(event.timestamp, UTC)
    try:
        read = from_provider(payload, PROVIDER, created_at=created)
        tag = {
            "adk_event_id": event.id,
            "adk_timestamp": event.timestamp,
            "adk_author": event.author,
        }
        return [attrs.evolve(message, metadata={**message.metadata, **tag}) for message in read]
    except (FormatError, ValueError, TypeError, OverflowError, OSError):
        return []  # not something the format reads: the event itself is kept all the same


async def _compact(actor: SessionActor, event: AdkEvent) -> Event | None:
    """Replace the surface entries of the events an ``EventCompaction`` covers with its
    summary, conditional on them still being there; the replace event, or None."""
    compaction = event.actions.compaction
    assert compaction is not None
    start, end = compaction.start_timestamp, compaction.end_timestamp
    log = actor.log
    covered: list[tuple[int, int]] = []  # (position, seq) of the surface entries covered
    for entry, (_, message) in zip(log.surface(), log.derive_indexed(), strict=True):
        stamp = message.metadata.get("adk_timestamp")
        if (
            isinstance(stamp, int | float)
            and start <= stamp <= end
            and message.metadata.get("adk_event_id") != event.id
            and (not covered or covered[-1][1] != entry.seq)
        ):
            covered.append((entry.position, entry.seq))
    if not covered:
        return None
    first, last = covered[0][0], covered[-1][0]
    within = [entry.seq for entry in log.surface() if first <= entry.position <= last]
    summary = _messages(
        AdkEvent(
            author=event.author,
            content=compaction.compacted_content,
            timestamp=end,
            id=event.id,
        )
    )
    try:
        return await actor.replace(
            first, last, summary, expect=sorted(set(within), key=within.index)
        )
    except ConflictError:
        _logger.info("nous_session.adk_compaction_skipped", session_id=actor.session_id)
    except (StoreError, OutcomeUnknownError) as error:
        # The event is stored: the surface is a view, and keeps the compacted entries.
        _logger.warning(
            "nous_session.adk_compaction_failed", session_id=actor.session_id, error=str(error)
        )
    return None
