"""A session's row as both SQL stores read it, where a sharing fork's events are (see
docs/internals.md, "Stores": a fork that shares reads its parent's rows up to its fork
point instead of holding copies), and what every store checks before it makes a fork."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from operator import itemgetter
from types import MappingProxyType
from typing import Any, Final, Generic, Protocol, TypeVar

import attrs

from nous_session._json import dumps
from nous_session.codec import decode_rows
from nous_session.errors import StoreError
from nous_session.event import EventType
from nous_session.stores._sealed import Fetch, Keyring
from nous_session.stores.base import Stored, check_fork_point, check_held, place

__all__ = [
    "SEQ_MAX",
    "SessionRow",
    "fork_exists",
    "fork_parent",
    "lineage",
    "metadata_at",
    "nearest_keys",
    "stored",
]

SEQ_MAX: Final = 2**63 - 1
"""The highest seq a table can hold: the upper bound of a range that has none."""

Key = TypeVar("Key", int, str)
_SEQ: Final[Callable[[tuple[int, bytes]], int]] = itemgetter(0)


class _Counted(Protocol):
    """A session's row as far as a fork needs it (each store has its own)."""

    @property
    def count(self) -> int: ...

    @property
    def horizon(self) -> int: ...


Row = TypeVar("Row", bound=_Counted)


def fork_parent(parent: Row | None, session_id: str, at: int) -> Row:
    """``parent``, the row of ``session_id`` (None when there is none), checked to be one a
    fork at seq ``at`` can be made from: every store's first step of ``fork``.

    Raises:
        ValueError: no such session (or none with events), or ``at`` outside its history.
    """
    if parent is None or parent.count == 0:
        raise ValueError(f"no session {session_id!r} to fork")
    check_fork_point(session_id, at, parent.count, parent.horizon)
    return parent


def fork_exists(new_session_id: str) -> ValueError:
    """The error of a fork whose new session exists already (with events)."""
    return ValueError(f"session {new_session_id!r} exists already")


def metadata_at(
    current: tuple[str | None, int | None],
    at: int,
    held: Callable[[], Sequence[tuple[int, bytes]]],
    where: Callable[[int], str],
    keyring: Keyring | None,
    fetch: Fetch,
) -> tuple[str | None, int | None]:
    """The metadata record (JSON text) and its seq that a session had at seq ``at``, for a
    fork made there: its ``current`` one unless that changed after ``at``; then the newest
    metadata event among ``held()``, its rows up to ``at``, read back from ``at`` (metadata
    events are rare: the rare, slow case). With a ``keyring`` (the store encrypts), a sealed
    record is opened with the keys ``fetch`` reads; ``where`` names a seq's row in an error.

    Raises:
        CorruptRecordError: a row read back cannot be decoded.
    """
    if current[1] is None or current[1] <= at:
        return current
    for seq, record in reversed(held()):
        if keyring is not None:
            record = keyring.open(seq, record, fetch, where(seq))
        (event,) = decode_rows([(seq, record)], where)
        if event.type is EventType.METADATA:
            return dumps(event.data.get("metadata", {})).decode(), seq
    return None, None


def nearest_keys(keys: Iterable[tuple[str, int, int]]) -> list[tuple[str, int, int]]:
    """The idempotency keys a sharing fork answers, given its lineage's from the root down:
    of two of one name (a fork's own key over one its parent holds too), the nearer holder's,
    as a read gives them."""
    return list({key: (key, seq, n) for key, seq, n in keys}.values())


@attrs.frozen
class SessionRow(Generic[Key]):
    """A session's row of nous_sessions.

    Attributes:
        key: what its rows in the other tables are keyed by (SQLite: the row's integer id;
            PostgreSQL: the session's name).
        count: its next seq.
        horizon: the lowest seq it may still hold.
        parent: the session it was forked from, or None.
        fork_point: the parent's last seq it took, or None.
        shares: it reads its parent's rows up to ``fork_point`` instead of holding copies.
        held: the rows it holds itself (SQLite keeps the number; PostgreSQL does not).
        uid: its identity, made when it was created: a session made later under the same
            name (after a delete) has another.
        parent_uid: the identity of the session it was forked from, or None.
    """

    key: Key
    count: int
    horizon: int
    parent: str | None
    fork_point: int | None
    shares: bool
    held: int = 0
    uid: str = ""
    parent_uid: str | None = None

    def shared_from(self) -> tuple[str, int] | None:
        """The parent and fork point it shares rows from, or None when it shares none."""
        if self.shares and self.parent is not None and self.fork_point is not None:
            return self.parent, self.fork_point
        return None


def lineage(
    row: SessionRow[Key], row_of: Callable[[str], SessionRow[Key] | None]
) -> list[tuple[Key, int, int]]:
    """Where a session's events are: ``(key, lowest seq, highest seq)`` per session of its
    sharing lineage, oldest ancestor first (the ranges are disjoint and ascending; the last
    one, the session's own, ends at :data:`SEQ_MAX`).

    Raises:
        StoreError: a parent is missing (a delete gives its forks their copy first).
    """
    ranges: list[tuple[Key, int, int]] = []
    upto = SEQ_MAX
    shared = row.shared_from()
    while shared is not None:
        parent, fork_point = shared
        ranges.append((row.key, fork_point + 1, upto))
        upto = min(upto, fork_point)
        found = row_of(parent)
        if found is None:  # pragma: no cover - a delete gives its forks their copy first
            raise StoreError(f"the parent {parent!r} of a fork is missing")
        row = found
        shared = row.shared_from()
    ranges.append((row.key, 0, upto))
    ranges.reverse()
    return ranges


def stored(
    session_id: str,
    row: SessionRow[Any],
    rows: Sequence[tuple[int, bytes]],
    since: int,
    where: str,
    *,
    keys: Iterable[tuple[str, int, int]] = (),
    kept: Sequence[tuple[int, bytes]] = (),
) -> Stored:
    """What a read of a session gives: its (seq, record) ``rows`` from ``since`` checked to be
    whole (see :func:`~nous_session.stores.base.check_held`) and decoded, with its row's
    count, horizon and lineage, its idempotency ``keys`` and ``kept`` events.

    Raises:
        CorruptRecordError: a row is missing or cannot be decoded (the error names session,
            seq and ``where``: the file or schema).
    """
    check_held(
        session_id, rows, count=row.count, horizon=row.horizon, since=since, where=where, seq=_SEQ
    )
    named = place(session_id, where)
    return Stored(
        decode_rows(rows, named),
        row.count,
        row.horizon,
        MappingProxyType({key: (seq, n) for key, seq, n in keys}),
        tuple(decode_rows(kept, named)),
        row.parent,
        row.fork_point,
        row.uid,
    )
