"""The erase steps every store takes, over what it stores (see
:class:`~nous_session.stores.base.ErasingStore` and docs/internals.md, "Stores"): which seqs,
which sessions hold a copy of each (a fork and the session it was forked from share their
history up to the fork point: linked by the sessions' identities, never by a name that a new
session may take again), the summaries that copy an erased event, rewriting every copy,
forgetting an erased metadata record, and an ``erasure`` event appended to every session
whose content changed, so every holder of it (in any process) hears of it the way it hears of
a commit, and a commit planned on the session as it was conflicts on the count. Each store
says how to read and write its copies through a :class:`Copies`."""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from datetime import datetime
from typing import Any, ClassVar, Generic, Protocol, TypeVar

import attrs

from nous_session._json import dumps
from nous_session.erasure import (
    Erasure,
    check_reason,
    check_seqs,
    covering,
    erase_event,
    erasure_data,
    erasure_time,
    family,
)
from nous_session.event import Event, EventType, make_event
from nous_session.stores._lineage import SessionRow

__all__ = ["Copies", "Erasing", "ErasureRequest", "erase_rows"]

Where = TypeVar("Where")


@attrs.frozen
class ErasureRequest:
    """What an ``erase`` or ``erase_session`` call asks, checked as far as it can be before
    the session is read: the events at ``wanted`` (None: every event the session wrote itself,
    and with ``inherited`` also those it took from its parent), why, when, whether the
    summaries that copy them go too, and whether only to say what would be erased."""

    session_id: str
    wanted: Sequence[int] | None
    inherited: bool | None
    reason: str
    at: datetime
    dry_run: bool
    summaries: bool = True

    @classmethod
    def events(
        cls,
        session_id: str,
        seqs: Iterable[int],
        reason: str,
        at: datetime | None,
        dry_run: bool,
        summaries: bool = True,
    ) -> ErasureRequest:
        """What ``erase`` asks (raises ValueError on a bad reason, time or seq)."""
        reason = check_reason(reason)
        when = erasure_time(at)
        return cls(session_id, check_seqs(seqs), None, reason, when, dry_run, _flag(summaries))

    @classmethod
    def session(
        cls, session_id: str, reason: str, inherited: bool, dry_run: bool, summaries: bool = True
    ) -> ErasureRequest:
        """What ``erase_session`` asks (raises ValueError on a bad reason)."""
        reason = check_reason(reason)
        return cls(
            session_id, None, inherited, reason, erasure_time(None), dry_run, _flag(summaries)
        )


def _flag(summaries: object) -> bool:
    if type(summaries) is not bool:
        raise ValueError(f"summaries is True or False, got {summaries!r}")
    return summaries


class Erasing:
    """``erase`` and ``erase_session`` (the
    :class:`~nous_session.stores.base.ErasingStore` methods) for a store, written once: the
    store runs the checked request in its ``_erase``, which takes the store's own options by
    keyword (``erase_options`` names them)."""

    erase_options: ClassVar[frozenset[str]] = frozenset()
    # The store's own: ``async def _erase(self, request, *, <its options>) -> Erasure``.
    _erase: Callable[..., Awaitable[Erasure]]

    async def erase(
        self,
        session_id: str,
        seqs: Iterable[int],
        *,
        reason: str,
        at: datetime | None = None,
        dry_run: bool = False,
        summaries: bool = True,
        **options: Any,
    ) -> Erasure:
        """Erase the events at ``seqs`` wherever the store holds them, and the summaries that
        copy them, then scrub (see :meth:`ErasingStore.erase
        <nous_session.stores.base.ErasingStore.erase>` and docs/erasure.md, "How each store
        makes sure").

        Args:
            options: the store's own: ``rewrite`` (SQLite and PostgreSQL: rebuild the file or
                rewrite the tables, for a proven result; default True) and ``lock_timeout``
                (PostgreSQL: seconds to wait for the rewrite's lock; default 60).

        Raises:
            ValueError: a bad seq, reason or option value, or no such session; nothing was
                changed.
            TypeError: an option this store does not take.
            StoreError: the store failed; nothing was changed. (When only the scrub fails,
                the rows are erased: the result says it is not proven, and why.)
        """
        request = ErasureRequest.events(session_id, seqs, reason, at, dry_run, summaries)
        return await self._erase(request, **self._erase_options(options))

    async def erase_session(
        self,
        session_id: str,
        *,
        reason: str,
        inherited: bool = False,
        dry_run: bool = False,
        summaries: bool = True,
        **options: Any,
    ) -> Erasure:
        """Erase every event the session wrote wherever it is still held (with
        ``inherited``, also what it took from its parent), then scrub as :meth:`erase` does
        (see :meth:`ErasingStore.erase_session
        <nous_session.stores.base.ErasingStore.erase_session>`).

        Raises:
            ValueError: a bad reason or option value, or no such session; nothing was changed.
            TypeError: an option this store does not take.
            StoreError: the store failed; nothing was changed.
        """
        request = ErasureRequest.session(session_id, reason, inherited, dry_run, summaries)
        return await self._erase(request, **self._erase_options(options))

    def _erase_options(self, options: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(options) - self.erase_options)
        if unknown:
            raise TypeError(
                f"{type(self).__name__}.erase got an unexpected keyword argument {unknown[0]!r}"
                f" (its options: {', '.join(sorted(self.erase_options)) or 'none'})"
            )
        return options


class Copies(Protocol, Generic[Where]):
    """How one store reads and rewrites the stored copies of a session's events (within
    the caller's transaction); ``Where`` names one copy (a table and a session, say)."""

    def row(self, name: str) -> SessionRow[Any] | None:
        """The session's row, or None."""
        ...

    def held(self, row: SessionRow[Any], low: int) -> Iterable[int]:
        """The seqs from ``low`` on of every event the session holds or kept aside, its
        parent's shared ones included."""
        ...

    def events(self, name: str, row: SessionRow[Any]) -> Sequence[Event]:
        """The events the session ``name`` holds (its parent's shared ones included), in seq
        order."""
        ...

    def children(self, row: SessionRow[Any]) -> Sequence[tuple[str, int | None]]:
        """The sessions forked from this one (by identity: ``parent_uid`` is its ``uid``),
        with their fork points."""
        ...

    def copies(self, member: str, seq: int) -> Sequence[tuple[Where, Event]]:
        """The copies of the event at ``seq`` that ``member`` itself stores."""
        ...

    def write(self, where: Where, event: Event) -> None:
        """Store ``event`` (erased) in place of the copy at ``where``."""
        ...

    def forget(self, record: bytes, members: Sequence[str], seq: int) -> None:
        """Give the sessions whose current metadata is the one at ``seq`` its erased
        ``record`` instead."""
        ...

    def append(self, row: SessionRow[Any], event: Event) -> None:
        """Store ``event`` (made by the store, at the session's count) as the session's next
        event, and tell the session's followers (as a commit does)."""
        ...


@attrs.define
class _Run(Generic[Where]):
    """One erasure's progress over the sessions it reaches."""

    store: Copies[Where]
    request: ErasureRequest
    rows: dict[str, SessionRow[Any] | None] = attrs.Factory(dict)
    events: dict[str, Sequence[Event]] = attrs.Factory(dict)
    forks: dict[str, Sequence[tuple[str, int | None]]] = attrs.Factory(dict)
    done: set[tuple[str, int]] = attrs.Factory(set)  # (session, seq) handled
    changed: dict[str, set[int]] = attrs.Factory(dict)  # session -> seqs whose content changed

    def row(self, name: str) -> SessionRow[Any] | None:
        if name not in self.rows:
            self.rows[name] = self.store.row(name)
        return self.rows[name]

    def parent_of(self, name: str) -> tuple[str, int] | None:
        """The session's parent and fork point, when the session it names is still the one
        it was forked from (a new session under a deleted parent's name is not)."""
        found = self.row(name)
        if found is None or found.parent is None or found.fork_point is None:
            return None
        parent = self.row(found.parent)
        if parent is None or parent.uid != found.parent_uid:
            return None
        return found.parent, found.fork_point

    def children_of(self, name: str, seq: int) -> list[str]:
        if name not in self.forks:
            found = self.row(name)
            self.forks[name] = () if found is None else self.store.children(found)
        return [child for child, point in self.forks[name] if point is not None and point >= seq]

    def members(self, name: str, seq: int) -> list[str]:
        return family(name, seq, self.parent_of, self.children_of)

    def events_of(self, name: str) -> Sequence[Event]:
        if name not in self.events:
            found = self.row(name)
            self.events[name] = () if found is None else self.store.events(name, found)
        return self.events[name]

    def erase(self, members: Sequence[str], seq: int) -> bool | None:
        """Erase every copy of the event at ``seq`` that ``members`` (its family) store: True
        when one changed, False when all were erased already, None when none is stored."""
        request = self.request
        copies = [
            copy
            for member in members
            for copy in self.store.copies(member, seq)
            if copy[1].type is not EventType.ERASURE  # the record of an erasure stays
        ]
        if not copies:
            return None
        changed = False
        record: bytes | None = None
        for where, event in copies:
            new = erase_event(event, reason=request.reason, at=request.at)
            if new is event:
                continue
            changed = True
            if not request.dry_run:
                self.store.write(where, new)
            if new.type is EventType.METADATA:
                record = dumps(new.data.get("metadata", {}))
        if changed:
            for member in members:
                self.changed.setdefault(member, set()).add(seq)
            if record is not None and not request.dry_run:
                # The sessions' listing copies of an erased metadata record go too.
                self.store.forget(record, members, seq)
        return changed


def erase_rows(store: Copies[Where], request: ErasureRequest) -> Erasure:
    """Erase every stored copy of the events ``request`` names, and (with
    ``request.summaries``) of the replace events that copy them, in every session that holds
    them; then append an ``erasure`` event to each session whose content changed.

    Raises:
        ValueError: no such session, or a seq it does not have; nothing was changed.
    """
    session_id = request.session_id
    run = _Run(store, request)
    row = run.row(session_id)
    if row is None or row.count == 0:
        raise ValueError(f"no session {session_id!r} to erase")
    if request.wanted is None:
        wanted, absent = _written(run, session_id, row, request.inherited)
    else:
        wanted, absent = list(check_seqs(request.wanted, row.count, session_id=session_id)), []
    erased: list[int] = []
    already: list[int] = []
    summaries: set[int] = set()
    others: set[str] = set()
    # (session, seqs of the same events as the session sees them): a fork that holds an
    # erased event may hold summaries of its own that copy it.
    queue: deque[tuple[str, set[int]]] = deque([(session_id, set(wanted))])
    first = True
    while queue:
        name, seqs = queue.popleft()
        copies = covering(run.events_of(name), seqs) if request.summaries else set()
        reached: dict[str, set[int]] = {}
        for seq in sorted(seqs | copies):
            if (name, seq) in run.done:
                continue
            members = run.members(name, seq)
            run.done.update((member, seq) for member in members)
            outcome = run.erase(members, seq)
            if outcome is None:
                if first:
                    absent.append(seq)
                continue
            for member in members:
                if member != name:
                    reached.setdefault(member, set()).add(seq)
            others.update(member for member in members if member != session_id)
            if first:
                (erased if outcome else already).append(seq)
                if seq in copies:
                    summaries.add(seq)
        queue.extend(reached.items())
        first = False
    if request.wanted is not None and absent:
        # No row holds them any more (a snapshot dropped them), but a holder that has not
        # read the session since may: the erasure's record names them too, so it reads again.
        run.changed.setdefault(session_id, set()).update(absent)
    if not request.dry_run:
        for member, seqs in run.changed.items():
            found = store.row(member)  # read again: counts as of now, in this transaction
            if found is None:  # pragma: no cover - every member was read in this transaction
                continue
            data = erasure_data(seqs, reason=request.reason, at=request.at)
            store.append(found, make_event(found.count, EventType.ERASURE, data, request.at))
    return Erasure(
        session_id,
        request.reason,
        request.at,
        tuple(erased),
        tuple(already),
        tuple(sorted(absent)),
        tuple(sorted(others)),
        dry_run=request.dry_run,
        summaries=tuple(sorted(summaries)),
    )


def _written(
    run: _Run[Any], session_id: str, row: SessionRow[Any], inherited: bool | None
) -> tuple[list[int], list[int]]:
    """For ``erase_session``: the seqs of every event the session wrote (with ``inherited``,
    also those it took from its parent) that some session still holds (its own rows, its kept
    events, its parent's shared rows, its forks' copies: a fork may keep what the session's
    own snapshot dropped), and those no session holds any more."""
    low = 0 if inherited or row.fork_point is None else row.fork_point + 1
    found = {seq for seq in run.store.held(row, low) if seq < row.count}
    # Forks hold the session's events up to their fork points (above: their own).
    stack = [(row, row.count - 1)]
    while stack:
        current, upto = stack.pop()
        for child, point in run.store.children(current):
            child_row = run.row(child)
            if child_row is None or point is None or point < low:
                continue
            bound = min(upto, point)
            found.update(seq for seq in run.store.held(child_row, low) if seq <= bound)
            stack.append((child_row, bound))
    # An erasure event holds no content: nothing to erase, and nothing missing.
    records = {event.seq for event in run.events_of(session_id) if event.type is EventType.ERASURE}
    found -= records
    missing = [seq for seq in range(low, row.count) if seq not in found and seq not in records]
    return sorted(found), missing
