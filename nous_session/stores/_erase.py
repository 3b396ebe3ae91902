"""The erase steps every store takes, over what it stores (see
:class:`~nous_session.stores.base.ErasingStore` and docs/internals.md, "Stores"): which seqs,
which sessions hold a copy of each (a fork and the session it was forked from share their
history up to the fork point), rewriting every copy, and forgetting an erased metadata
record. Each store says how to read and write its copies through a :class:`Copies`."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any, Generic, Protocol, TypeVar

import attrs

from nous_session.erasure import (
    Erasure,
    check_reason,
    check_seqs,
    erase_copies,
    erasure_time,
    family,
    forget_metadata,
)
from nous_session.event import Event
from nous_session.stores._lineage import SessionRow

__all__ = ["Copies", "ErasureRequest", "erase_rows"]

Where = TypeVar("Where")


@attrs.frozen
class ErasureRequest:
    """What an ``erase`` or ``erase_session`` call asks, checked as far as it can be before
    the session is read: the events at ``wanted`` (None: every event the session wrote itself,
    and with ``inherited`` also those it took from its parent), why, when, and whether only to
    say what would be erased."""

    session_id: str
    wanted: Sequence[int] | None
    inherited: bool | None
    reason: str
    at: datetime
    dry_run: bool

    @classmethod
    def events(
        cls, session_id: str, seqs: Iterable[int], reason: str, at: datetime | None, dry_run: bool
    ) -> ErasureRequest:
        """What ``erase`` asks (raises ValueError on a bad reason, time or seq)."""
        reason = check_reason(reason)
        when = erasure_time(at)
        return cls(session_id, check_seqs(seqs), None, reason, when, dry_run)

    @classmethod
    def session(
        cls, session_id: str, reason: str, inherited: bool, dry_run: bool
    ) -> ErasureRequest:
        """What ``erase_session`` asks (raises ValueError on a bad reason)."""
        return cls(session_id, None, inherited, check_reason(reason), erasure_time(None), dry_run)


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

    def children(self, name: str) -> Sequence[tuple[str, int | None]]:
        """The sessions forked from ``name``, with their fork points."""
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


def erase_rows(store: Copies[Where], request: ErasureRequest) -> Erasure:
    """Erase every stored copy of the events ``request`` names.

    Raises:
        ValueError: no such session, or a seq it does not have; nothing was changed.
    """
    session_id, wanted, reason, at = request.session_id, request.wanted, request.reason, request.at
    row = store.row(session_id)
    if row is None or row.count == 0:
        raise ValueError(f"no session {session_id!r} to erase")
    if wanted is None:
        low = 0 if request.inherited or row.fork_point is None else row.fork_point + 1
        seqs: Sequence[int] = sorted(set(store.held(row, low)))
    else:
        seqs = check_seqs(wanted, row.count, session_id=session_id)

    def parent_of(name: str) -> tuple[str, int] | None:
        found = store.row(name)
        if found is None or found.parent is None or found.fork_point is None:
            return None
        if store.row(found.parent) is None:
            return None
        return found.parent, found.fork_point

    forks: dict[str, Sequence[tuple[str, int | None]]] = {}  # read once per session

    def children_of(name: str, seq: int) -> list[str]:
        if name not in forks:
            forks[name] = store.children(name)
        return [child for child, point in forks[name] if point is not None and point >= seq]

    def copies_of(members: Sequence[str], seq: int) -> list[tuple[Where, Event]]:
        return [copy for member in members for copy in store.copies(member, seq)]

    forgotten: dict[int, bytes] = {}  # erased metadata events: seq -> their record

    def write(where: Where, event: Event) -> None:
        store.write(where, event)
        forget_metadata(event, forgotten)

    erased, already, absent, others = erase_copies(
        session_id,
        seqs,
        reason=reason,
        at=at,
        members_of=lambda seq: family(session_id, seq, parent_of, children_of),
        copies_of=copies_of,
        write=None if request.dry_run else write,
    )
    # The sessions' copies of an erased metadata record go too (see forget_metadata).
    for seq, record in forgotten.items():
        store.forget(record, family(session_id, seq, parent_of, children_of), seq)
    return Erasure(
        session_id,
        reason,
        at,
        tuple(erased),
        tuple(already),
        tuple(absent),
        tuple(sorted(others)),
        dry_run=request.dry_run,
    )
