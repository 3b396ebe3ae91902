"""The Google ADK session service's logs on its portal: what each ADK session and each app's
and user's state say (folded from their events, the most recently used folds kept), and the
commits that write them: a creation, an event with its surface messages, a deletion, a state
delta. The mapping itself is described in :mod:`nous_session.integrations.google_adk`."""

from __future__ import annotations

import hashlib
import json
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final, TypeVar

import anyio
import attrs
from google.adk.errors._stale_session_error import StaleSessionError
from google.adk.errors.session_not_found_error import SessionNotFoundError
from google.adk.events.event import Event as AdkEvent
from google.adk.sessions import _session_util

from nous_session._logging import get_logger
from nous_session.errors import ConflictError, FormatError, OutcomeUnknownError, StoreError
from nous_session.event import EventType, message_event
from nous_session.formats import from_provider
from nous_session.integrations._listing import listed_ids
from nous_session.message import Message

if TYPE_CHECKING:
    from nous_session.actor import SessionActor
    from nous_session.event import Event
    from nous_session.log import Log
    from nous_session.metadata import SessionMetadata
    from nous_session.registry import SessionsPortal

CREATED_EVENT: Final = "x.adk.created"
"""The custom event type of a session's creation (with its session-scoped initial state)."""
EVENT_EVENT: Final = "x.adk.event"
"""The custom event type of one ADK ``Event``, as ADK's pydantic serialisation made it."""
DELETED_EVENT: Final = "x.adk.deleted"
"""The custom event type recording ``delete_session``."""
STATE_EVENT: Final = "x.adk.state"
"""The custom event type of an app or user state delta (in the app's or user's session)."""

# The service's own logger: the events logged here are documented under its name.
_logger = get_logger("nous_session.integrations.google_adk")


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


_STALE: Final = (
    "The session has been modified in storage since it was loaded. "
    "Please reload the session before appending more events."
)
# A state delta to an app or user session that keeps losing to other processes gives up.
_STATE_ATTEMPTS: Final = 32


class AdkLogs:
    """The logs of a ``NousSessionService``'s sessions, on its portal, and what they say.

    Folds are kept by nous_session session id, the most recently used ``cached`` of each kind
    (ADK sessions; app and user states), the others folded again from their actor's log when
    next needed. A commit to an ADK session checks its fold and appends under that session's
    lock, so that the check and its append are one step. Folds and locks are touched on the
    portal's loop only: the methods taking an actor run inside a call on the portal, the
    others make one.
    """

    def __init__(self, portal: SessionsPortal, *, cached: int) -> None:
        self._portal = portal
        self._cached = cached
        self._folds: OrderedDict[str, _Folded] = OrderedDict()
        self._states: OrderedDict[str, _FoldedState] = OrderedDict()
        self._locks: dict[str, tuple[anyio.Lock, int]] = {}

    # Reading ------------------------------------------------------------------------------------

    async def read(self, sid: str) -> _Read | None:
        """The ADK session ``sid`` as its log says now, or None when it does not exist."""

        async def read(actor: SessionActor) -> _Read | None:
            log = await actor.reload()
            folded = self._fold(sid, log)
            if not folded.alive:
                return None
            return _Read(
                dict(folded.state), list(folded.events), folded.update_time, str(log.count)
            )

        return await self._portal.acall(sid, read)

    async def state(self, sid: str) -> dict[str, Any]:
        """The app's or user's state kept in the session ``sid`` (``{}`` when none)."""

        async def read(actor: SessionActor) -> dict[str, Any]:
            log = await actor.reload()
            return dict(self._folded_state(sid, log).state)

        return await self._portal.acall(sid, read)

    async def session_ids(
        self, via: str, where: Mapping[str, Any] | None, prefix: str
    ) -> list[str]:
        """The ids of the stored sessions that start with ``prefix``: through the store's
        index by their metadata (``where``), else (None, or a store without one) by a scan.
        Run on the actor of ``via``, for its store."""

        async def stored(actor: SessionActor) -> list[str]:
            store = actor.store
            found = await listed_ids(store, where, prefix)
            if found is None:
                infos = await store.sessions()
                return [info.session_id for info in infos if info.session_id.startswith(prefix)]
            return found

        return await self._portal.acall(via, stored)

    # Writing ------------------------------------------------------------------------------------

    async def create(
        self,
        actor: SessionActor,
        sid: str,
        deltas: Mapping[str, dict[str, Any]],
        now: float,
        record: SessionMetadata | None,
    ) -> tuple[str | None, int, tuple[str | None, str | None]]:
        """Create the ADK session ``sid`` (``actor``'s) with the session, app and user
        initial state in ``deltas``, and ``record`` as its metadata, unless it exists.

        Returns the new session's marker (None when the session exists), and the seq of the
        creation and its app and user initial state (the existing session's when it exists).
        """
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

    async def append(
        self,
        actor: SessionActor,
        sid: str,
        event: AdkEvent,
        *,
        session_id: str,
        marker: str | None,
        seen: float,
    ) -> tuple[str | None, str]:
        """Append an event to the ADK session ``sid`` (``actor``'s), conditional on the log
        count the session object (of ADK id ``session_id``) was read at: its ``marker`` (with
        none, the update time it has ``seen``). Returns the object's new marker (None: it
        holds the event already) and the event's idempotency key.

        Raises:
            SessionNotFoundError: the session does not exist (or was deleted).
            StaleSessionError: another writer appended since the object was read.
        """
        items, digest = _stored(event)
        async with self._locked(sid):
            folded = self._fold(sid, actor.log)
            if not folded.alive:
                raise SessionNotFoundError(f"Session {session_id} not found.")
            count = actor.log.count
            if marker is None and folded.update_time > seen:
                raise StaleSessionError(_STALE)
            read_at = count if marker is None else _marker_count(marker)
            if read_at is None:
                raise StaleSessionError(_STALE)
            # Equal events (same id, same JSON) in one life of the session are one event.
            key = f"adk:{folded.created}:{digest}"
            try:
                # Conditional on the count the session object was read at: a commit another
                # writer made since, whether this actor has heard of it yet or not, refuses
                # the append. The key comes first: an event stored before is answered with
                # its events whatever the count.
                appended = await actor.append_many(items, key=key, expect_count=read_at)
            except ConflictError as error:
                raise StaleSessionError(_STALE) from error
            first, end = appended[0].seq, appended[-1].seq + 1
            if first < read_at:
                return None, key  # the object holds it already: stored once, applied once
            if first > read_at:
                # Stored before, after other writers' events this object has not seen: it
                # cannot take the event; a fresh read can (and applies the deltas).
                raise StaleSessionError(_STALE)
            # Right on top of what the object holds: stored now, or by an earlier call that
            # failed before the object heard of it (its outcome unknown). The object takes
            # it, and the surface is compacted unless something came after it.
            compacts = event.actions is not None and event.actions.compaction is not None
            if compacts and actor.log.count == end:
                replaced = await _compact(actor, event)
                if replaced is not None and replaced.seq == end:
                    end += 1
            return str(end), key

    async def update_state(
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

    async def delete(self, sid: str) -> None:
        """Delete the ADK session ``sid``: an ``x.adk.deleted`` event and a remove of its
        surface; nothing for a session that does not exist."""

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

    # Folds ----------------------------------------------------------------------------------

    def _locked(self, sid: str) -> _Held:
        return _Held(self._locks, sid)

    def _fold(self, sid: str, log: Log) -> _Folded:
        folded = _cached(self._folds, sid, log, _Folded, self._cached)
        if not folded.alive and not folded.events:
            self._folds.pop(sid, None)  # nothing to keep: folded again when next needed
        return folded

    def _folded_state(self, sid: str, log: Log) -> _FoldedState:
        return _cached(self._states, sid, log, _FoldedState, self._cached)


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


def _cached(
    cache: OrderedDict[str, _F], sid: str, log: Log, make: Callable[[], _F], bound: int
) -> _F:
    """The fold of ``sid`` caught up with ``log``, from ``cache`` (least recently used out
    beyond ``bound``)."""
    folded = cache.get(sid)
    if folded is None or log.count < folded.count:
        folded = cache[sid] = make()
        while len(cache) > bound:
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


def _stored(event: AdkEvent) -> tuple[list[tuple[Any, ...]], str]:
    """What storing an ADK event appends (its ``x.adk.event``, then the surface messages its
    content stands for), and the digest of its JSON that keys the append, so that the same
    event delivered again is stored once."""
    raw = event.model_dump_json(exclude_none=True)
    data = {
        "id": event.id,
        "author": event.author,
        "invocation_id": event.invocation_id,
        "timestamp": event.timestamp,
        "event": raw,
    }
    items: list[tuple[Any, ...]] = [(EVENT_EVENT, data)]
    items.extend((*message_event(m), m.created_at) for m in _messages(event))
    return items, hashlib.sha256(raw.encode()).hexdigest()


PROVIDER: Final = "gemini"


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
