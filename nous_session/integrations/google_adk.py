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

import json
import time
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import quote, unquote

import anyio

from nous_session.errors import OutcomeUnknownError, StoreError
from nous_session.integrations._common import missing_extra, named_store
from nous_session.metadata import SessionMetadata
from nous_session.registry import SessionsPortal
from nous_session.stores.base import Store

try:
    from google.adk.errors.already_exists_error import AlreadyExistsError
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

from nous_session.integrations._google_adk_logs import (
    CREATED_EVENT,
    DELETED_EVENT,
    EVENT_EVENT,
    STATE_EVENT,
    AdkLogs,
)

if TYPE_CHECKING:
    from nous_session.actor import SessionActor

__all__ = [
    "CREATED_EVENT",
    "DELETED_EVENT",
    "EVENT_EVENT",
    "STATE_EVENT",
    "NousSessionService",
]

# Folds kept per kind (sessions; app and user states), least recently used dropped beyond.
_CACHED: Final = 1024


def _part(text: str) -> str:
    return quote(text, safe="")


def _normal_id(session_id: str) -> str:
    # ADK's in-memory and SQLite services strip the id they are given, on every call.
    return session_id.strip() if session_id else session_id


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
        self._logs = AdkLogs(sessions, cached=_CACHED)

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

        async def create_and_apply(
            actor: SessionActor,
        ) -> tuple[str | None, dict[str, Any], dict[str, Any]]:
            """The creation, then its app and user state, in one call on the portal: a
            caller cancelled meanwhile leaves none of them half done."""
            marker, created, shared = await self._logs.create(actor, sid, deltas, now, record)
            # The creation's own app and user state (the existing one's when it exists: a
            # create that failed after its commit is finished by creating again), keyed by
            # it: applied once.
            app, user = (json.loads(text) if text is not None else {} for text in shared)
            key = f"{sid}:adk:{created}:created"
            if marker is None:
                if app or user:
                    await self._update_state(app_name, user_id, app, user, key=key)
                raise AlreadyExistsError(f"Session with id {session_id} already exists.")
            try:
                app_state, user_state = await self._update_state(
                    app_name, user_id, app, user, key=key
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
        read = await self._logs.read(self.session_id(app_name, user_id, session_id))
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
        app_state = await self._logs.state(self._app_id(app_name))
        user_state = await self._logs.state(self._user_id(app_name, user_id))
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

        app_id = self._app_id(app_name)
        app_state = await self._logs.state(app_id)
        user_states: dict[str, dict[str, Any]] = {}
        listed: list[Session] = []
        for sid in await self._logs.session_ids(app_id, where, prefix):
            read = await self._logs.read(sid)
            if read is None:
                continue
            _, user_part, id_part = sid[len(f"{self._prefix}:s/") :].split("/")
            owner = unquote(user_part)
            if owner not in user_states:
                user_states[owner] = await self._logs.state(self._user_id(app_name, owner))
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
        await self._logs.delete(self.session_id(app_name, user_id, session_id))

    async def get_user_state(self, *, app_name: str, user_id: str) -> dict[str, Any]:
        """The user's state in the app, with its keys unprefixed (``{}`` when none)."""
        return await self._logs.state(self._user_id(app_name, user_id))

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
        sid = self.session_id(session.app_name, session.user_id, session.id)
        marker = session._storage_update_marker
        seen = session.last_update_time

        async def append_and_apply(actor: SessionActor) -> tuple[str | None, Exception | None]:
            """The event's append, then its app and user deltas, in one call on the portal:
            a caller cancelled meanwhile leaves none of them half done."""
            new_marker, key = await self._logs.append(
                actor, sid, event, session_id=session.id, marker=marker, seen=seen
            )
            if event.actions is not None and event.actions.state_delta:
                # Keyed by the event's own key: an event delivered again (after this failed,
                # or after a crash between its commit and these) applies its app and user
                # deltas if they did not land, and never twice.
                deltas = _session_util.extract_json_safe_state_delta(event.actions.state_delta)
                try:
                    await self._update_state(
                        session.app_name,
                        session.user_id,
                        deltas["app"],
                        deltas["user"],
                        key=f"{sid}:{key}",
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

    async def _update_state(
        self, app_name: str, user_id: str, app: dict[str, Any], user: dict[str, Any], *, key: str
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Apply deltas to the app's state, then to the user's, each keyed by ``key`` (a delta
        applied under its key before is not applied again); the two states."""
        app_state = await self._logs.update_state(self._app_id(app_name), app, key=f"{key}:app")
        user_state = await self._logs.update_state(
            self._user_id(app_name, user_id), user, key=f"{key}:user"
        )
        return app_state, user_state


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
