"""Erasure: taking the content of chosen events out of a session for good, provably.

An erased event keeps its place: its ``seq``, its type, its time and its surface operation stay,
so the log's seqs, the fold and every fork stay valid. Its content is replaced by a record of
the erasure, ``data["erased"] = {"at": ISO time, "reason": text}``:

* a message event (a surface type) becomes the placeholder message ``"[erased]"`` (of the same
  role, at the same position), its metadata the erasure record. A tool call keeps its ``id``
  and ``name`` (its arguments become ``{}``) and a tool result its ``tool_call_id`` and
  ``is_error``, so every call still has its result and the surface stays valid for every
  provider. Its ``name``, reasoning, content parts and provider data go.
* a ``replace`` event keeps its range and its messages' roles and times; each message becomes a
  placeholder as above.
* any other event (bookkeeping, operations, custom types) keeps only its surface operation, if
  it has one.

:func:`erase_event` makes that event (pure; an erased event stays as it is);
:func:`select_events` finds the seqs to erase (a person's messages, by role, name or any
predicate); a store that can erase (:class:`~nous_session.stores.base.ErasingStore`)
rewrites the stored rows and scrubs the space the old ones took, and says in an
:class:`Erasure` what it did and whether that is proven.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Final

import attrs

from nous_session._json import JSON
from nous_session.event import (
    SURFACE_TYPES,
    Event,
    EventType,
    make_event,
    replace_entries,
    to_message,
)
from nous_session.message import Role
from nous_session.ops import OP_KEY, Replace

__all__ = [
    "ERASED_CONTENT",
    "ERASED_KEY",
    "Erasure",
    "check_reason",
    "check_seqs",
    "covering",
    "erase_event",
    "erasure_time",
    "erased_record",
    "erasure_data",
    "family",
    "now",
    "select_events",
]

ERASED_KEY: Final = "erased"
"""The data key of an erased event's record: ``{"at": ISO time, "reason": text}``."""

ERASED_CONTENT: Final = "[erased]"
"""The content an erased message shows in place of what it said."""

MAX_REASON_CHARS: Final = 1000
_SURFACE: Final = frozenset(SURFACE_TYPES)


@attrs.frozen
class Erasure:
    """What an erasure did (or, in a dry run, would do).

    Attributes:
        session_id: the session asked for.
        reason: why, as recorded in every erased event.
        at: when, as recorded (UTC).
        erased: the seqs whose content this call erased, in order.
        already: seqs that were erased before (their first record is kept as it was).
        absent: seqs that no session holds any more (a snapshot dropped them before).
        sessions: the other sessions whose history held the same events (forks that share
            them, and the sessions they were forked from) and were erased too, sorted.
        summaries: the seqs of the summaries (replace events) erased with the events they
            cover (a summary may quote what it replaced); they are in ``erased`` or
            ``already`` too.
        proven: the store made sure no byte of the old content remains in its files or
            tables (see ``detail`` for how, or for why not).
        detail: what the store did to make sure (or why it could not).
        dry_run: nothing was changed; the fields say what would be.
    """

    session_id: str
    reason: str
    at: datetime
    erased: tuple[int, ...] = ()
    already: tuple[int, ...] = ()
    absent: tuple[int, ...] = ()
    sessions: tuple[str, ...] = ()
    proven: bool = False
    detail: str = ""
    dry_run: bool = False
    summaries: tuple[int, ...] = attrs.field(default=(), kw_only=True)

    def to_json(self) -> dict[str, JSON]:
        """The erasure as a JSON object (what the command line prints with ``--json``)."""
        return {
            "session": self.session_id,
            "reason": self.reason,
            "at": self.at.isoformat(),
            "erased": list(self.erased),
            "already": list(self.already),
            "absent": list(self.absent),
            "sessions": list(self.sessions),
            "summaries": list(self.summaries),
            "proven": self.proven,
            "detail": self.detail,
            "dry_run": self.dry_run,
        }


def check_reason(reason: object) -> str:
    """Refuse a reason that cannot be recorded: a non-empty string without NUL characters,
    of at most 1,000 characters.

    Raises:
        ValueError: naming what is wrong.
    """
    if not isinstance(reason, str) or not reason.strip():
        raise ValueError(f"an erasure needs a reason, a non-empty string; got {reason!r}")
    if "\x00" in reason or len(reason) > MAX_REASON_CHARS:
        raise ValueError(
            f"an erasure reason is at most {MAX_REASON_CHARS} characters without NUL;"
            f" got {len(reason)} characters"
        )
    try:
        reason.encode()
    except UnicodeEncodeError:
        raise ValueError("an erasure reason must be valid Unicode") from None
    return str.__str__(reason)


def check_seqs(seqs: object, count: int | None = None, *, session_id: str = "") -> tuple[int, ...]:
    """The seqs to erase, sorted and without repeats; each an int >= 0 (and below ``count``
    when given).

    Raises:
        ValueError: naming the first bad seq.
    """
    if isinstance(seqs, str | bytes) or not isinstance(seqs, Iterable):
        raise ValueError(f"seqs to erase must be an iterable of ints, got {seqs!r}")
    found: set[int] = set()
    for seq in seqs:
        if type(seq) is not int or seq < 0:
            raise ValueError(f"a seq to erase is an int >= 0, got {seq!r}")
        if count is not None and seq >= count:
            where = f"session {session_id!r}" if session_id else "the session"
            raise ValueError(
                f"cannot erase seq {seq}: {where} has no such event (its seqs run from 0 to"
                f" {count - 1})"
                if count
                else f"cannot erase seq {seq}: {where} holds no events"
            )
        found.add(seq)
    return tuple(sorted(found))


def erased_record(event: Event) -> tuple[str, str] | None:
    """The ``(at, reason)`` an erased event records, or None for an event not erased."""
    record = event.data.get(ERASED_KEY)
    if type(record) is dict or isinstance(record, Mapping):
        at = record.get("at")
        reason = record.get("reason")
        if type(at) is str and type(reason) is str:
            return at, reason
    return None


def _placeholder(fields: Mapping[str, Any], record: dict[str, JSON]) -> dict[str, JSON]:
    """A message's fields with everything it said taken out: what keeps tool calls paired
    stays (call ids and names, the result's call id and error flag)."""
    data: dict[str, JSON] = {"content": ERASED_CONTENT}
    calls = fields.get("tool_calls")
    if calls:
        kept: list[JSON] = []
        for call in calls:
            function = call.get("function") if isinstance(call, Mapping) else None
            name = function.get("name") if isinstance(function, Mapping) else call.get("name")
            kept.append({"id": call.get("id"), "name": name, "arguments": {}})
        data["tool_calls"] = kept
    for key in ("tool_call_id", "is_error"):
        if fields.get(key) is not None:
            data[key] = fields[key]
    data["metadata"] = {ERASED_KEY: record}
    return data


def erase_event(event: Event, *, reason: str, at: datetime) -> Event:
    """``event`` with its content replaced by the record of its erasure (see the module doc);
    an event that is erased already is returned as it is (its first record stands).

    An event counts as erased only when its data is exactly what erasing it gave, so an
    event that merely carries an ``"erased"`` key of its own is still erased.

    Raises:
        ValueError: the reason is malformed, or ``at`` is not a timezone-aware datetime.
    """
    reason = check_reason(reason)
    if not isinstance(at, datetime) or at.tzinfo is None:
        raise ValueError(f"an erasure time is a timezone-aware datetime, got {at!r}")
    if event.type is EventType.ERASURE:
        return event  # the record of an erasure holds no content of its own
    found = erased_record(event)
    if found is not None:
        earlier: dict[str, JSON] = {"at": found[0], "reason": found[1]}
        if _erased_data(event, earlier) == dict(event.data):
            return event
    record: dict[str, JSON] = {"at": at.astimezone(UTC).isoformat(), "reason": reason}
    return make_event(event.seq, event.type, _erased_data(event, record), event.time)


def _erased_data(event: Event, record: dict[str, JSON]) -> dict[str, JSON]:
    """The data ``event`` has once erased with ``record``."""
    data: dict[str, JSON]
    old = event.data
    if event.type in _SURFACE:
        data = _placeholder(old, record)
        # What made it (a compaction, a pruning) and when its message was written: the
        # library's own marks, no content; history and the surface's times keep them.
        for key in ("source", "created_at"):
            if old.get(key) is not None:
                data[key] = old[key]
    elif event.type is EventType.REPLACE:
        messages: list[JSON] = []
        items: Any = old.get("messages") or ()
        for item in items:
            message = _placeholder(item, record)
            message["role"] = item["role"]
            if item.get("created_at") is not None:
                message["created_at"] = item["created_at"]
            messages.append(message)
        data = {"messages": messages}
    elif event.type is EventType.METADATA:
        data = {"metadata": {}}  # an empty record: still a valid metadata event
    else:
        data = {}
    if old.get(OP_KEY) is not None:
        data[OP_KEY] = old[OP_KEY]
    data[ERASED_KEY] = record
    return data


def select_events(
    events: Iterable[Event],
    *,
    role: Role | str | None = None,
    name: str | None = None,
    where: Callable[[Event], bool] | None = None,
    summaries: bool = True,
) -> tuple[int, ...]:
    """The seqs of the events to erase for one person: the message events whose message has
    this ``role`` and ``name`` (either may be left out), and for which ``where(event)`` is
    true (when given). A ``replace`` event is chosen when one of its messages matches.

    With ``summaries`` (the default), a replace event whose range covered a chosen event
    when it was appended (a compaction summary, which may quote it) is chosen too.

    Raises:
        ValueError: no criterion was given (that would choose every message).
    """
    if role is None and name is None and where is None:
        raise ValueError("select_events needs a role, a name or a predicate")
    wanted = None if role is None else str(getattr(role, "value", role))
    listed = list(events)

    def matches(candidate: Event) -> bool:
        message = to_message(candidate)
        if wanted is not None and message.role.value != wanted:
            return False
        return name is None or message.name == name

    chosen: list[Event] = []
    for event in listed:
        if where is not None and not where(event):
            continue
        if event.type in _SURFACE:
            if matches(event):
                chosen.append(event)
        elif event.type is EventType.REPLACE:
            if any(matches(entry) for entry in replace_entries(event)):
                chosen.append(event)
        elif role is None and name is None:
            chosen.append(event)  # a predicate alone may choose any event
    seqs = {event.seq for event in chosen}
    if summaries and chosen:
        seqs |= covering(listed, seqs)
    return tuple(sorted(seqs))


def covering(events: Iterable[Event], seqs: Iterable[int]) -> set[int]:
    """The seqs of the replace events among ``events`` (a session's held events, in seq order)
    that may be copies of the events at ``seqs``: each whose range covered one of them, or
    covered another such copy, when it was appended (a compaction summary may quote what it
    summarised, and a later summary the earlier one). ``seqs`` themselves are not included.

    An event at ``seqs`` that is no longer held (a snapshot dropped it, with the summaries
    that were shadowed since) may have reached a held summary through a dropped one, which
    the store cannot see any more. So a held replace counts as its copy when its range covers
    it, or when its range starts at or before it and some event between the two is gone (a
    dropped replace that copied it may have been there): the store erases what may hold the
    text rather than keep what may.
    """
    chosen = set(seqs)
    listed = list(events)
    held = sorted(event.seq for event in listed)
    gone = sorted(chosen.difference(held))
    positions: list[int] = []  # the surface positions of the chosen events and their copies
    found: set[int] = set()
    for event in listed:
        if event.seq in chosen:
            positions.append(event.position)
            continue
        op = event.op
        if type(op) is not Replace:
            continue
        if any(op.start <= place <= op.stop for place in positions) or any(
            op.start <= seq and (seq <= op.stop or _dropped_between(held, seq, event.seq))
            for seq in gone
            if seq < event.seq
        ):
            found.add(event.seq)
            positions.append(event.position)
    return found


def _dropped_between(held: Sequence[int], low: int, high: int) -> bool:
    """Whether some seq strictly between ``low`` and ``high`` is not in ``held`` (sorted)."""
    inside = bisect_left(held, high) - bisect_right(held, low)
    return inside < high - low - 1


def erasure_data(seqs: Iterable[int], *, reason: str, at: datetime) -> dict[str, JSON]:
    """The data of the ``erasure`` event a store appends to each session whose content an
    erasure changed: which seqs, when and why (no personal text)."""
    return {
        "seqs": list[JSON](sorted(seqs)),
        "at": at.astimezone(UTC).isoformat(),
        "reason": reason,
    }


def family(
    session_id: str,
    seq: int,
    parent_of: Callable[[str], tuple[str, int] | None],
    children_of: Callable[[str, int], Sequence[str]],
) -> list[str]:
    """Every session whose history holds the event that ``session_id`` holds at ``seq``: the
    oldest ancestor it came from (going up while ``seq`` is at or before the fork point),
    then every fork below that one whose fork point is at or after ``seq``; the first
    session named is that ancestor.

    Args:
        parent_of: a session's existing parent and fork point, or None.
        children_of: the forks of a session with fork point >= ``seq``.
    """
    origin = session_id
    seen = {origin}
    while True:
        parent = parent_of(origin)
        if parent is None or seq > parent[1] or parent[0] in seen:
            break
        origin = parent[0]
        seen.add(origin)
    members = [origin]
    queue = [origin]
    visited = {origin}
    while queue:
        current = queue.pop()
        for child in children_of(current, seq):
            if child not in visited:
                visited.add(child)
                members.append(child)
                queue.append(child)
    return members


def now() -> datetime:
    """The erasure time: now, in UTC."""
    return datetime.now(UTC)


def erasure_time(at: object) -> datetime:
    """``at`` (None: now) as an aware UTC datetime.

    Raises:
        ValueError: ``at`` is not None or a timezone-aware datetime.
    """
    if at is None:
        return now()
    if not isinstance(at, datetime) or at.tzinfo is None:
        raise ValueError(f"an erasure time is a timezone-aware datetime, got {at!r}")
    return at.astimezone(UTC)
