"""Listing sessions by their metadata: the query every store answers (:class:`ListQuery`), the
entries and pages it gives, and what a store keeps beside a session to answer it.

A session's metadata (:class:`~nous_session.metadata.SessionMetadata`) lives in its log as
``session_metadata`` events; every store also keeps a copy of the current record beside the
session, with its created and last-active times, written in the same transaction as the
event: that copy is what :class:`ListQuery` searches. This module is pure: no I/O. The
stores import it."""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Final, Literal, TypedDict, Unpack

import attrs

from nous_session._json import JSON, dumps, loads
from nous_session.event import Event, EventType
from nous_session.metadata import MAX_TITLE_BYTES, SessionMetadata, check_tags, check_text

__all__ = [
    "ListArguments",
    "ListQuery",
    "SessionEntry",
    "SessionPage",
    "from_micros",
    "latest_metadata",
    "metadata_of",
    "to_micros",
]


_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)


def metadata_of(events: Sequence[Event]) -> SessionMetadata | None:
    """The metadata that ``events`` (a session's, in seq order) leave: the newest
    ``session_metadata`` event's record, or None when there is none. Walks back from the end."""
    for index in range(len(events) - 1, -1, -1):
        event = events[index]
        if event.type is EventType.METADATA:
            return SessionMetadata.from_json(event.data.get("metadata", {}))
    return None


def latest_metadata(events: Sequence[Event]) -> tuple[int, bytes] | None:
    """For a store's commit: the seq and compact JSON record of the newest metadata event
    among ``events``, or None (the common case, one type check per event)."""
    for index in range(len(events) - 1, -1, -1):
        event = events[index]
        if event.type is EventType.METADATA:
            return event.seq, dumps(event.data.get("metadata", {}))
    return None


def to_micros(moment: datetime) -> int:
    """An aware datetime as whole microseconds since the Unix epoch (how stores keep times)."""
    delta = moment - _EPOCH
    return (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds


def from_micros(micros: int) -> datetime:
    """Microseconds since the Unix epoch as an aware UTC datetime."""
    return _EPOCH + timedelta(microseconds=micros)


@attrs.frozen
class SessionEntry:
    """One session in a listing.

    Attributes:
        session_id: its id.
        metadata: its current metadata (empty when it never had any).
        created: when its first commit landed (the store's clock).
        active: when its last commit that appended events landed (the store's clock).
        count: its next seq.
        parent: the session it was forked from, or None.
    """

    session_id: str
    metadata: SessionMetadata
    created: datetime
    active: datetime
    count: int
    parent: str | None = None


@attrs.frozen
class SessionPage:
    """A page of a listing, and where the next one starts.

    Attributes:
        sessions: the page, in the query's order.
        cursor: pass it as ``cursor=`` with the same query for the next page; None when this
            was the last one.
    """

    sessions: tuple[SessionEntry, ...]
    cursor: str | None


def _when(name: str, value: object) -> int | None:
    if value is None:
        return None
    if not isinstance(value, datetime) or value.tzinfo is None:
        raise ValueError(f"{name} must be a timezone-aware datetime or None, got {value!r}")
    return to_micros(value)


def _where(value: object) -> tuple[tuple[str, JSON], ...]:
    if value is None:
        return ()
    if not isinstance(value, Mapping):
        raise ValueError(f"where must be a mapping of field to value, got {value!r}")
    out: list[tuple[str, JSON]] = []
    for key, wanted in value.items():
        if not isinstance(key, str) or not key:
            raise ValueError(f"where keys are field names, got {key!r}")
        if key in ("owner", "app", "title"):
            check_text(key, wanted, MAX_TITLE_BYTES)
        elif key in ("tags", "extra"):
            raise ValueError(f"filter tags with tags=..., not where={{{key!r}: ...}}")
        elif isinstance(wanted, dict | list) or (
            isinstance(wanted, float) and wanted != wanted  # NaN
        ):
            raise ValueError(
                f"where[{key!r}]: an extra field is matched against a string, number, bool or"
                f" None, not {wanted!r}"
            )
        elif wanted is not None and not isinstance(wanted, str | int | float | bool):
            raise ValueError(f"where[{key!r}]: {wanted!r} is not a JSON scalar")
        out.append((key, wanted))
    return tuple(sorted(out, key=lambda item: item[0]))


class ListArguments(TypedDict, total=False):
    """The keyword arguments of a listing, as a store's ``list_sessions`` takes them and
    :meth:`ListQuery.make` checks them (see
    :meth:`~nous_session.stores.base.ListingStore.list_sessions` for each one and its default)."""

    where: Mapping[str, Any] | None
    tags: Iterable[str]
    created_since: datetime | None
    created_before: datetime | None
    active_since: datetime | None
    active_before: datetime | None
    order: str
    descending: bool
    limit: int
    cursor: str | None


@attrs.frozen
class ListQuery:
    """What :meth:`~nous_session.stores.base.ListingStore.list_sessions` was asked (checked).

    ``where`` maps a field to the value it must equal: ``owner``, ``app`` and ``title`` are the
    record's fields; any other key is an ``extra`` field (matched against a JSON scalar).
    ``tags``: the session has every one. Time ranges are half-open: ``since <= t < before``.
    Order ``"active"`` (last activity) or ``"created"``, newest first unless
    ``descending=False``; sessions with equal times come in id order (reversed when
    descending). ``limit`` is 1..1000.

    Raises:
        ValueError: naming the argument that is wrong, or a cursor made for another query.
    """

    where: tuple[tuple[str, JSON], ...] = ()
    tags: frozenset[str] = frozenset()
    created_since: int | None = None
    created_before: int | None = None
    active_since: int | None = None
    active_before: int | None = None
    order: Literal["active", "created"] = "active"
    descending: bool = True
    limit: int = 50
    after: tuple[int, str] | None = None  # the cursor's position: (time, session id)

    @classmethod
    def make(cls, **arguments: Unpack[ListArguments]) -> ListQuery:
        """Check the arguments of a listing and make the query (see the class doc; each
        argument and its default: :meth:`~nous_session.stores.base.ListingStore.list_sessions`).

        Raises:
            TypeError: an argument it does not take (named).
            ValueError: naming what is wrong.
        """
        unknown = arguments.keys() - ListArguments.__annotations__.keys()
        if unknown:  # named as list_sessions' (every store hands its arguments on here)
            raise TypeError(
                f"list_sessions() got unexpected keyword arguments: {', '.join(sorted(unknown))}"
                f" (it takes {', '.join(ListArguments.__annotations__)})"
            )
        order = arguments.get("order", "active")
        descending = arguments.get("descending", True)
        limit = arguments.get("limit", 50)
        if order not in ("active", "created"):
            raise ValueError(f'order must be "active" or "created", got {order!r}')
        if not isinstance(descending, bool):
            raise ValueError(f"descending must be a bool, got {descending!r}")
        if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= 1000:
            raise ValueError(f"limit must be an int from 1 to 1000, got {limit!r}")
        query = cls(
            _where(arguments.get("where")),
            check_tags(arguments.get("tags", ())),
            _when("created_since", arguments.get("created_since")),
            _when("created_before", arguments.get("created_before")),
            _when("active_since", arguments.get("active_since")),
            _when("active_before", arguments.get("active_before")),
            order,  # type: ignore[arg-type]  # a str checked above to be one of the Literal's values
            descending,
            limit,
        )
        cursor = arguments.get("cursor")
        if cursor is None:
            return query
        return attrs.evolve(query, after=query._decode(cursor))

    @property
    def owner(self) -> str | None:
        """The owner the query filters on, if any (served by an index)."""
        return next((str(v) for k, v in self.where if k == "owner"), None)

    def _fingerprint(self) -> str:
        shape = attrs.evolve(self, after=None, limit=1)
        return hashlib.blake2b(repr(shape).encode(), digest_size=6).hexdigest()

    def cursor_after(self, entry: SessionEntry) -> str:
        """The opaque cursor that continues this query after ``entry``."""
        moment = to_micros(entry.active if self.order == "active" else entry.created)
        raw = dumps([self._fingerprint(), moment, entry.session_id])
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    def _decode(self, cursor: object) -> tuple[int, str]:
        if not isinstance(cursor, str) or not cursor:
            raise ValueError(f"a cursor is the string a page returned, got {cursor!r}")
        try:
            raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
            fingerprint, moment, name = loads(raw)
        except (binascii.Error, ValueError, TypeError):
            raise ValueError(f"not a listing cursor: {cursor!r}") from None
        if not isinstance(moment, int) or not isinstance(name, str):
            raise ValueError(f"not a listing cursor: {cursor!r}")
        if fingerprint != self._fingerprint():
            raise ValueError(
                "this cursor continues a different query (filters, order or direction changed)"
            )
        return moment, name

    def matches(self, entry: SessionEntry) -> bool:
        """Whether ``entry`` passes the filters and lies after the cursor (the reference
        semantics, used by MemoryStore)."""
        record = entry.metadata
        for key, wanted in self.where:
            if key in ("owner", "app", "title"):
                if getattr(record, key) != wanted:
                    return False
            elif key not in record.extra or not _same(record.extra[key], wanted):
                return False
        if not self.tags <= record.tags:
            return False
        created, active = to_micros(entry.created), to_micros(entry.active)
        for value, low, high in (
            (created, self.created_since, self.created_before),
            (active, self.active_since, self.active_before),
        ):
            if (low is not None and value < low) or (high is not None and value >= high):
                return False
        if self.after is not None:
            position = (active if self.order == "active" else created, entry.session_id)
            return position < self.after if self.descending else position > self.after
        return True

    def sort_key(self, entry: SessionEntry) -> tuple[int, str]:
        """The key a listing is ordered by: (time, session id)."""
        moment = entry.active if self.order == "active" else entry.created
        return (to_micros(moment), entry.session_id)

    def page(self, entries: Sequence[SessionEntry]) -> SessionPage:
        """A page from up to ``limit + 1`` entries in order: the cursor is set when there were
        more than ``limit``."""
        shown = tuple(entries[: self.limit])
        more = len(entries) > self.limit
        return SessionPage(shown, self.cursor_after(shown[-1]) if more and shown else None)


def _same(stored: object, wanted: object) -> bool:
    """JSON equality as SQL sees it: a bool is not a number, 1 equals 1.0."""
    if isinstance(stored, bool) or isinstance(wanted, bool):
        return type(stored) is type(wanted) and stored == wanted
    return stored == wanted
