"""MemoryStore: the reference store, holding sessions in process memory.

It keeps the Event values themselves (they are immutable), so nothing is encoded. It is the
default store of a SessionActor and the behaviour every other backend must match. A fork
shares its parent's event list up to the fork point instead of copying it; a snapshot or a
delete of the parent first gives the forks that share the affected history their own copy.
"""

from __future__ import annotations

import secrets
import time
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from operator import attrgetter
from types import MappingProxyType
from typing import Any

import attrs

from nous_session.erasure import (
    Erasure,
)
from nous_session.errors import ConflictError, StoreError
from nous_session.event import Event, EventType
from nous_session.listing import (
    ListQuery,
    SessionEntry,
    from_micros,
    metadata_of,
    to_micros,
)
from nous_session.metadata import SessionMetadata
from nous_session.stores._common import Commit, StoreBase, identity_conflict
from nous_session.stores._erase import Erasing, ErasureRequest, erase_rows
from nous_session.stores._lineage import SessionRow, fork_exists, fork_parent
from nous_session.stores.base import (
    Rebased,
    SessionInfo,
    Stored,
    check_commit_state,
    check_held,
    check_lease,
    check_since,
    moved,
    moved_keys,
)

__all__ = ["MemoryStore"]

_SEQ = attrgetter("seq")


@attrs.define
class _Session:
    events: list[Event] = attrs.Factory(list)  # its own (a sharing fork: seqs > fork_point)
    count: int = 0
    horizon: int = 0
    keys: dict[str, tuple[int, int]] = attrs.Factory(dict)
    kept: dict[int, Event] = attrs.Factory(dict)
    commits: dict[str, tuple[int, int]] = attrs.Factory(dict)
    parent: str | None = None
    fork_point: int | None = None
    shares: bool = False  # reads its parent's events up to fork_point
    metadata: SessionMetadata | None = None  # the newest metadata event's record
    meta_seq: int | None = None  # that event's seq
    created: int = 0  # microseconds since the epoch, the store's clock
    active: int = 0
    uid: str = attrs.Factory(lambda: secrets.token_hex(8))  # its identity (see SessionRow)
    parent_uid: str | None = None


def _now() -> int:
    return to_micros(datetime.now(UTC))


def _touch(session: _Session, events: Sequence[Event]) -> None:
    """After a commit: the last-active time, and the metadata if ``events`` set it."""
    now = _now()
    if not session.created:
        session.created = now
    if events:
        session.active = max(now, session.active)
        for event in reversed(events):
            if event.type is EventType.METADATA:
                session.metadata = metadata_of((event,))
                session.meta_seq = event.seq
                break


@attrs.define
class MemoryStore(Erasing, StoreBase):
    """Sessions in a dict, in this process. Durable only as long as the process lives."""

    _sessions: dict[str, _Session] = attrs.field(factory=dict, init=False)
    _closed: bool = attrs.field(default=False, init=False)
    # Leases by (session, name): (holder, expiry on time.monotonic()).
    _leases: dict[tuple[str, str], tuple[str, float]] = attrs.field(factory=dict, init=False)

    # Leases -----------------------------------------------------------------------------------

    async def lease(self, session_id: str, name: str, *, holder: str, ttl: float) -> bool:
        """See :meth:`LeasingStore.lease <nous_session.stores.base.LeasingStore.lease>`."""
        ttl = check_lease(session_id, name, holder, ttl)
        self._check_open()
        now = time.monotonic()
        current = self._leases.get((session_id, name))
        if current is not None and current[0] != holder and current[1] > now:
            return False
        self._leases[(session_id, name)] = (holder, now + ttl)
        return True

    async def release(self, session_id: str, name: str, *, holder: str) -> None:
        """See :meth:`LeasingStore.release <nous_session.stores.base.LeasingStore.release>`."""
        check_lease(session_id, name, holder)
        current = self._leases.get((session_id, name))
        if current is not None and current[0] == holder:
            del self._leases[(session_id, name)]

    # Views ------------------------------------------------------------------------------------

    def _view(self, session: _Session, since: int, upto: int | None = None) -> list[Event]:
        """The session's held events with ``since <= seq <= upto``, its parent's included."""
        own = session.events
        low = bisect_left(own, since, key=_SEQ)
        high = len(own) if upto is None else bisect_right(own, upto, key=_SEQ)
        mine = own[low:high]
        parent_id, point = session.parent, session.fork_point
        if session.shares and parent_id is not None and point is not None and since <= point:
            limit = point if upto is None else min(upto, point)
            return [*self._view(self._sessions[parent_id], since, limit), *mine]
        return mine

    def _inherited(self, session: _Session) -> tuple[dict[str, tuple[int, int]], dict[int, Event]]:
        """The idempotency keys and kept events a sharing fork answers from its lineage: its
        parent's (and, for a fork of a fork, theirs) whose events are all at or before its
        fork point. Looked up, not copied: a retry in the fork of a call made in the parent
        before the fork finds the key."""
        if not session.shares or session.parent is None or session.fork_point is None:
            return {}, {}
        parent = self._sessions[session.parent]
        inherited, inherited_kept = self._inherited(parent)
        point = session.fork_point
        # Each level is cut at the fork point before the nearer one is laid over it: a key the
        # parent committed again after the point must not hide the one it inherited before.
        keys = {
            key: (first, size)
            for level in (inherited, parent.keys)
            for key, (first, size) in level.items()
            if first + size <= point + 1
        }
        kept = {
            seq: event
            for level in (inherited_kept, parent.kept)
            for seq, event in level.items()
            if seq <= point
        }
        return keys, kept

    def _own_copy(self, session: _Session) -> None:
        """Give a sharing fork its own copy of what it shares (before the parent changes):
        events, and the keys and kept events it inherits."""
        if session.shares:
            keys, kept = self._inherited(session)
            session.keys = {**keys, **session.keys}
            session.kept = {**kept, **session.kept}
            session.events = self._view(session, 0)
            session.shares = False

    def _children(self, name: str) -> list[_Session]:
        return [s for s in self._sessions.values() if s.shares and s.parent == name]

    # The Store protocol -----------------------------------------------------------------------

    async def load(self, session_id: str, *, since: int = 0) -> Sequence[Event]:
        """The held events with seq >= ``since``, in seq order."""
        self._check_open()
        check_since(since)
        session = self._sessions.get(session_id)
        if session is None:
            return []
        events = self._view(session, since)
        check_held(session_id, events, count=session.count, horizon=session.horizon, since=since)
        return events

    async def read(self, session_id: str, *, since: int = 0) -> Stored:
        """The session's events from ``since``, its count, horizon, keys and lineage."""
        self._check_open()
        check_since(since)
        session = self._sessions.get(session_id)
        if session is None:
            return Stored((), 0)
        events = self._view(session, since)
        check_held(session_id, events, count=session.count, horizon=session.horizon, since=since)
        inherited, inherited_kept = self._inherited(session)
        every = {**inherited, **session.keys}
        keys = {key: value for key, value in every.items() if value[0] >= since}
        kept = {**inherited_kept, **session.kept}
        return Stored(
            events,
            session.count,
            session.horizon,
            MappingProxyType(keys),
            tuple(kept[seq] for seq in sorted(kept)) if since == 0 else (),
            session.parent,
            session.fork_point,
            session.uid,
        )

    async def _commit(self, commit: Commit) -> str:
        # By name, not by position: a field added to Commit cannot shift what these read.
        session_id, expected_count, events = commit.session_id, commit.expected_count, commit.events
        dropped, kept, keys, commit_id = commit.dropped, commit.kept, commit.keys, commit.commit_id
        horizon, expected_horizon = commit.horizon, commit.expected_horizon
        expected_uid = commit.expected_uid
        session = self._sessions.get(session_id)
        if session is None:
            if expected_count != 0:
                raise ConflictError(
                    f"session {session_id!r} has count 0, expected {expected_count}"
                )
            if expected_uid is not None:
                raise identity_conflict(session_id, expected_uid)
            session = self._sessions[session_id] = _Session()
        elif session.count != expected_count:
            raise ConflictError(
                f"session {session_id!r} has count {session.count}, expected {expected_count}"
            )
        elif expected_uid is not None and session.uid != expected_uid:
            raise identity_conflict(session_id, expected_uid)
        if expected_horizon is not None and session.horizon != expected_horizon:
            raise ConflictError(
                f"session {session_id!r} has horizon {session.horizon}, expected"
                f" {expected_horizon}: another writer took a snapshot"
            )
        if keys:
            taken = [key for key, _, _ in keys if key in session.keys]
            if taken or len({key for key, _, _ in keys}) < len(keys):
                raise ConflictError(
                    f"session {session_id!r}: idempotency key"
                    f" {(taken or [keys[0][0]])[0]!r} is taken"
                )
        if commit_id is not None and commit_id in session.commits:
            raise ConflictError(f"session {session_id!r}: commit {commit_id!r} exists")
        if dropped or horizon is not None:  # (else it has nothing to check: the common commit)
            horizon = check_commit_state(
                session_id,
                session.horizon,
                dropped=dropped,
                horizon=horizon,
                expected_horizon=expected_horizon,
            )
        if dropped:
            self._drop(session_id, session, dropped, kept)
        if horizon is not None:
            session.horizon = horizon
        if events:
            session.events.extend(events)
            session.count = events[-1].seq + 1
        for key, first, size in keys:
            session.keys[key] = (first, size)
        if commit_id is not None:
            session.commits[commit_id] = (events[0].seq if events else expected_count, len(events))
        _touch(session, events)
        return session.uid

    def _drop(
        self, name: str, session: _Session, dropped: Sequence[int], kept: Sequence[int]
    ) -> None:
        lowest = min(dropped)
        for child in self._children(name):
            if child.fork_point is not None and lowest <= child.fork_point:
                self._own_copy(child)
        if session.shares and session.fork_point is not None and lowest <= session.fork_point:
            self._own_copy(session)
        keep_aside = set(kept)
        gone = set(dropped)
        remaining = []
        for event in session.events:
            if event.seq in gone:
                if event.seq in keep_aside:
                    session.kept[event.seq] = event
            else:
                remaining.append(event)
        session.events = remaining

    async def _commit_rebased(self, commit: Commit) -> Rebased:
        session_id, expected_count, events = commit.session_id, commit.expected_count, commit.events
        keys, commit_id = commit.keys, commit.commit_id
        session = self._sessions.get(session_id)
        stored = 0 if session is None else session.count
        if stored < expected_count:
            raise ConflictError(
                f"session {session_id!r} has count {stored}, below the expected {expected_count}"
            )
        expected_uid = commit.expected_uid
        if expected_uid is not None and (session is None or session.uid != expected_uid):
            raise identity_conflict(session_id, expected_uid)
        if session is not None and any(key in session.keys for key, _, _ in keys):
            raise ConflictError(f"session {session_id!r}: an idempotency key is taken")
        if commit_id is not None and session is not None and commit_id in session.commits:
            raise ConflictError(f"session {session_id!r}: commit {commit_id!r} exists")
        others = [] if session is None else self._view(session, expected_count)
        if session is not None:
            # A rebase never writes past a hole: the events would land after rows that are
            # missing, and the session could not be opened again.
            check_held(
                session_id, others, count=stored, horizon=session.horizon, since=expected_count
            )
        else:
            session = self._sessions[session_id] = _Session()
        shift = stored - expected_count
        between = {k: v for k, v in session.keys.items() if v[0] >= expected_count}
        placed = moved(events, shift) if shift else list(events)
        session.events.extend(placed)
        session.count = placed[-1].seq + 1
        for key, first, size in moved_keys(keys, shift):
            session.keys[key] = (first, size)
        if commit_id is not None:
            session.commits[commit_id] = (placed[0].seq, len(placed))
        _touch(session, placed)
        return Rebased(
            shift, others, placed, MappingProxyType(between), session.horizon, session.uid
        )

    async def committed(self, session_id: str, commit_id: str) -> tuple[int, int] | None:
        """Where the commit ``commit_id`` landed, or None."""
        self._check_open()
        session = self._sessions.get(session_id)
        return None if session is None else session.commits.get(commit_id)

    async def _fork(self, session_id: str, new_session_id: str, at: int) -> None:
        parent = fork_parent(self._sessions.get(session_id), session_id, at)
        existing = self._sessions.get(new_session_id)
        if existing is not None and existing.count:
            raise fork_exists(new_session_id)
        metadata, meta_seq = parent.metadata, parent.meta_seq
        if meta_seq is not None and meta_seq > at:  # changed after the fork point
            before = self._view(parent, 0, at)
            metadata = metadata_of(before)
            meta_seq = next((e.seq for e in reversed(before) if e.type is EventType.METADATA), None)
        now = _now()
        self._sessions[new_session_id] = _Session(
            count=at + 1,
            horizon=parent.horizon,
            parent=session_id,
            parent_uid=parent.uid,
            fork_point=at,
            shares=True,
            metadata=metadata,
            meta_seq=meta_seq,
            created=now,
            active=now,
        )

    async def sessions(self) -> list[SessionInfo]:
        """Every session with a nonzero count, sorted by id."""
        self._check_open()
        return [
            SessionInfo(
                sid,
                session.count,
                len(self._view(session, 0)),
                session.horizon,
                session.parent,
                session.fork_point,
            )
            for sid, session in sorted(self._sessions.items())
            if session.count
        ]

    async def _list(self, query: ListQuery) -> list[SessionEntry]:
        """In memory there is no index: each call looks at every session."""
        self._check_open()
        entries = [
            entry
            for entry in (self._entry(sid, s) for sid, s in self._sessions.items() if s.count)
            if query.matches(entry)
        ]
        entries.sort(key=query.sort_key, reverse=query.descending)
        return entries[: query.limit + 1]

    @staticmethod
    def _entry(session_id: str, session: _Session) -> SessionEntry:
        return SessionEntry(
            session_id,
            session.metadata or SessionMetadata(),
            from_micros(session.created),
            from_micros(session.active),
            session.count,
            session.parent,
        )

    async def delete_idle(self, session_id: str, *, count: int, active: datetime) -> bool:
        """Delete the session if its count and last-active time are still these."""
        self._check_open()
        session = self._sessions.get(session_id)
        if session is None or session.count != count or session.active != to_micros(active):
            return False
        return await self.delete(session_id)

    async def delete(self, session_id: str) -> bool:
        """Forget a session (its forks keep their own copy of what they shared); True when it
        existed."""
        self._check_open()
        for child in self._children(session_id):
            self._own_copy(child)
        gone = self._sessions.pop(session_id, None)
        if gone is not None:
            self._relink_forks(gone)
        return gone is not None

    def _relink_forks(self, gone: _Session) -> None:
        """Link a deleted session's forks to the session it was forked from (if that one is
        still the same session), at the lower fork point: what they hold up to it is that
        session's history, and erasing there must reach them."""
        parent = None if gone.parent is None else self._sessions.get(gone.parent)
        if parent is None or parent.uid != gone.parent_uid or gone.fork_point is None:
            return
        for child in self._sessions.values():
            if child.parent_uid == gone.uid and child.fork_point is not None:
                child.parent, child.parent_uid = gone.parent, gone.parent_uid
                child.fork_point = min(child.fork_point, gone.fork_point)

    async def _erase(self, request: ErasureRequest) -> Erasure:
        """In process memory nothing can be proven: the old values are released, not
        overwritten, and any Log value still referencing them keeps them alive."""
        self._check_open()
        done = erase_rows(_MemoryCopies(self), request)
        detail = "in process memory: the old values were released, not overwritten"
        return attrs.evolve(
            done, detail="dry run: nothing was changed" if request.dry_run else detail
        )

    @property
    def url(self) -> str:
        """``memory:``: each MemoryStore is its own private space."""
        return "memory:"

    async def aclose(self) -> None:
        """Close the store; later calls raise StoreError."""
        self._closed = True

    def _before_commit(self) -> None:
        self._check_open()

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError("the store is closed")


@attrs.frozen
class _MemoryCopies:
    """The copies of a session's events in a MemoryStore (see
    :class:`~nous_session.stores._erase.Copies`): a copy is named by its session and whether
    it is a kept one."""

    store: MemoryStore

    def row(self, name: str) -> SessionRow[str] | None:
        found = self.store._sessions.get(name)
        if found is None:
            return None
        return SessionRow(
            name,
            found.count,
            found.horizon,
            found.parent,
            found.fork_point,
            found.shares,
            uid=found.uid,
            parent_uid=found.parent_uid,
        )

    def held(self, row: SessionRow[Any], low: int) -> Iterable[int]:
        session = self.store._sessions[row.key]
        yield from (event.seq for event in self.store._view(session, low))
        yield from (seq for seq in self.store._inherited(session)[1] if seq >= low)
        yield from (seq for seq in session.kept if seq >= low)

    def events(self, name: str, row: SessionRow[Any]) -> list[Event]:
        return self.store._view(self.store._sessions[row.key], 0)

    def children(self, row: SessionRow[Any]) -> list[tuple[str, int | None]]:
        return [
            (child, s.fork_point)
            for child, s in self.store._sessions.items()
            if s.parent_uid is not None and s.parent_uid == row.uid
        ]

    def copies(self, member: str, seq: int) -> list[tuple[tuple[str, bool], Event]]:
        found = self.store._sessions[member]
        copies: list[tuple[tuple[str, bool], Event]] = []
        index = bisect_left(found.events, seq, key=_SEQ)
        if index < len(found.events) and found.events[index].seq == seq:
            copies.append(((member, False), found.events[index]))
        if seq in found.kept:
            copies.append(((member, True), found.kept[seq]))
        return copies

    def write(self, where: tuple[str, bool], event: Event) -> None:
        member, kept = where
        found = self.store._sessions[member]
        if kept:
            found.kept[event.seq] = event
        else:
            found.events[bisect_left(found.events, event.seq, key=_SEQ)] = event

    def forget(self, record: bytes, members: Sequence[str], seq: int) -> None:
        for member in members:
            held = self.store._sessions[member]
            if held.meta_seq == seq:
                held.metadata = SessionMetadata()

    def append(self, row: SessionRow[Any], event: Event) -> None:
        found = self.store._sessions[row.key]
        found.events.append(event)
        found.count = event.seq + 1
