"""The log: an immutable, append-only sequence of events, and the surface folded from it.

A :class:`Log` is a value. ``append`` returns a new Log and leaves the old one valid and
unchanged, so any Log a caller holds is a consistent snapshot and a fork point. Underneath,
a value and its successor share one append-only list of events: appending to the newest value
costs O(1) amortised; appending to an older value copies its prefix once (a fork).

The fold
--------
* The *position* of an event is ``start`` when it carries ``Replace(start, stop)``, else its seq.
* Event C is *shadowed* when some replace event R (shadowed or not) has ``C.seq < R.seq`` and
  ``R.start <= position(C) <= R.stop``. A replace never shadows events appended after it.
* The *surface* is the surface-typed events that are not shadowed, in order of position.

Because shadowing only ever looks backwards, the fold is incremental in seq order: an ordinary
surface event lands at the end of the surface (its position is the highest so far), and a replace
removes the surface entries whose positions fall in its range and takes their place. The fold is
memoised per value (keyed by the log's count): an ordinary append extends the memo, a replace
rebuilds the surface list once, and every sequence returned is a read-only view over
append-only storage, so it never changes after it is returned.
"""

from __future__ import annotations

import threading
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime
from itertools import islice
from operator import attrgetter
from typing import Any, Final, TypeVar, overload

from nous_session._logging import get_logger
from nous_session._snapshot_rule import partition
from nous_session.errors import InvalidEventError
from nous_session.event import (
    SURFACE_TYPES,
    Event,
    EventType,
    make_event,
    message_event,
    replace_entries,
    to_message,
)
from nous_session.message import Message
from nous_session.ops import Remove, Replace, Rewind, Uncompact

__all__ = ["Log"]

_logger = get_logger()

T = TypeVar("T")
_SEQ: Final = attrgetter("seq")
_SURFACE: Final = frozenset(SURFACE_TYPES)
_POSITION: Final = attrgetter("position")


class _View(Sequence[T]):
    """A read-only window ``items[start:stop]`` over an append-only list.

    The list only ever grows past ``stop`` (forks copy instead of overwriting), so the window's
    contents never change: making one is O(1), whatever the length.
    """

    __slots__ = ("_items", "_start", "_stop")

    def __init__(self, items: list[T], start: int, stop: int) -> None:
        self._items = items
        self._start = start
        self._stop = stop

    def __len__(self) -> int:
        return self._stop - self._start

    @overload
    def __getitem__(self, index: int) -> T: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[T]: ...
    def __getitem__(self, index: int | slice) -> T | Sequence[T]:
        size = self._stop - self._start
        if isinstance(index, slice):
            start, stop, step = index.indices(size)
            if step == 1:
                return _View(self._items, self._start + start, self._start + max(start, stop))
            return [self._items[self._start + i] for i in range(start, stop, step)]
        if index < 0:
            index += size
        if not 0 <= index < size:
            raise IndexError("index out of range")
        return self._items[self._start + index]

    def __iter__(self) -> Iterator[T]:
        if self._start == 0:
            return islice(self._items, self._stop)
        # islice would walk the skipped prefix; a slice copy costs only what is returned.
        return iter(self._items[self._start : self._stop])

    def __reversed__(self) -> Iterator[T]:
        return reversed(self._items[self._start : self._stop])

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str | bytes | bytearray):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=False))

    # Unhashable, as a list is; typeshed's object.__hash__ has no None.
    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(list(self))


class _Surface:
    """Append-only storage shared by the folds of related Log values.

    ``events[i]`` sits at ``positions[i]``; ``messages[i]`` and ``pairs[i]`` are its projection,
    filled in lazily (the lists may be shorter than ``events``). A fold owns the prefix
    ``[:length]``; the lock makes extending in place safe when values are read from threads.
    """

    __slots__ = ("events", "lock", "messages", "pairs", "positions")

    def __init__(
        self,
        events: list[Event],
        positions: list[int],
        messages: list[Message],
        pairs: list[tuple[int, Message]],
    ) -> None:
        self.events = events
        self.positions = positions
        self.messages = messages
        self.pairs = pairs
        self.lock = threading.Lock()

    def fork(self, length: int) -> _Surface:
        """A private copy of the first ``length`` entries (projections included)."""
        projected = min(length, len(self.messages))
        return _Surface(
            self.events[:length],
            self.positions[:length],
            self.messages[:projected],
            self.pairs[:projected],
        )


class _Fold:
    """The surface of every held event with seq < ``count``: ``surface``'s first ``length``."""

    __slots__ = ("count", "length", "surface")

    def __init__(self, count: int, surface: _Surface, length: int) -> None:
        self.count = count
        self.surface = surface
        self.length = length

    @classmethod
    def at_horizon(cls, kept: Iterable[Event], horizon: int) -> _Fold:
        """The surface at a snapshot's ``horizon``, from the ``kept`` events below it: every
        entry-bearing one, by position.

        A snapshot keeps, below its horizon, exactly the events then on the surface (and
        events that never reach it), so no operation before the horizon is replayed.
        """
        entries: list[Event] = []
        for event in kept:
            if event.type in _SURFACE:
                entries.append(event)
            elif event.type is EventType.REPLACE:
                entries.extend(replace_entries(event))
        entries.sort(key=_POSITION)  # stable: a replace's messages keep their order
        positions = [entry.position for entry in entries]
        return cls(horizon, _Surface(entries, positions, [], []), len(entries))

    def extended(self, log: Log, events: Iterable[Event], count: int) -> _Fold:
        """Fold ``events`` (all of ``log``'s, with seq >= self.count, in seq order)."""
        surface, length = self.surface, self.length
        pending: list[Event] = []
        for event in events:
            op = event.op
            if op is None:
                if event.type in _SURFACE:
                    pending.append(event)
                continue
            if pending:
                surface, length = _extend(surface, length, pending)
                pending = []
            # Every operation's effect on the surface, by type (ops.py defines them).
            if isinstance(op, Replace):
                entries = [event] if event.type in _SURFACE else replace_entries(event)
                surface, length = _splice(surface, length, op.start, op.stop, entries)
            elif isinstance(op, Remove):
                surface, length = _splice(surface, length, op.start, op.stop, [])
            elif isinstance(op, Rewind):
                before = _prefix_fold(log, op.to)
                surface, length = before.surface.fork(before.length), before.length
            else:  # Uncompact
                surface, length = _uncompact(log, surface, length, op.seq)
        if pending:
            surface, length = _extend(surface, length, pending)
        return _Fold(count, surface, length)

    def messages(self) -> None:
        """Make sure every surface entry of this fold is projected."""
        surface, length = self.surface, self.length
        if len(surface.messages) < length:
            with surface.lock:
                done = len(surface.messages)
                if done < length:
                    events = surface.events[done:length]
                    new = [to_message(event) for event in events]
                    surface.messages.extend(new)
                    surface.pairs.extend(zip([event.seq for event in events], new, strict=True))


def _extend(surface: _Surface, length: int, new: list[Event]) -> tuple[_Surface, int]:
    # Ordinary events go after everything already on the surface: their positions are their
    # seqs, which are higher than any position so far.
    with surface.lock:
        if len(surface.events) == length:
            surface.events.extend(new)
            surface.positions.extend([event.seq for event in new])
            return surface, length + len(new)
    forked = surface.fork(length)
    forked.events.extend(new)
    forked.positions.extend([event.seq for event in new])
    return forked, length + len(new)


def _splice(
    surface: _Surface, length: int, start: int, stop: int, entries: list[Event]
) -> tuple[_Surface, int]:
    """A new surface: the entries at positions ``start..stop`` give way to ``entries`` (which
    all sit at positions inside the range, in order)."""
    # Positions are sorted, and only the entries of one event share one, so the entries in
    # the range are one contiguous slice.
    with surface.lock:
        positions = surface.positions
        low = bisect_left(positions, start, 0, length)
        high = bisect_right(positions, stop, 0, length)
        events = [*surface.events[:low], *entries, *surface.events[high:length]]
        new_positions = [*positions[:low], *[e.position for e in entries], *positions[high:length]]
        if len(surface.messages) >= length:
            # Keep every projection already made; only the new entries are projected.
            made = [to_message(entry) for entry in entries]
            messages = [*surface.messages[:low], *made, *surface.messages[high:length]]
            pairs = [
                *surface.pairs[:low],
                *[(entry.seq, message) for entry, message in zip(entries, made, strict=True)],
                *surface.pairs[high:length],
            ]
        else:
            kept = min(low, len(surface.messages))
            messages = surface.messages[:kept]
            pairs = surface.pairs[:kept]
    return _Surface(events, new_positions, messages, pairs), len(events)


def _uncompact(log: Log, surface: _Surface, length: int, seq: int) -> tuple[_Surface, int]:
    """Undo the replace at ``seq``: its entries give way to what it replaced, as it was then.

    Applies only while the replace is on the surface with its range intact (nothing else sits
    inside it) and its history is held (at or past the horizon); otherwise it changes nothing
    (``Log.append`` refuses such an uncompact; a stored one is folded the same everywhere).
    """
    target = _uncompact_target(log, surface, length, seq)
    if target is None:
        return surface, length
    op: Any = target.op
    before = _prefix_fold(log, seq - 1)
    low = bisect_left(before.surface.positions, op.start, 0, before.length)
    high = bisect_right(before.surface.positions, op.stop, 0, before.length)
    restored = before.surface.events[low:high]
    return _splice(surface, length, op.start, op.stop, restored)


def _uncompact_target(log: Log, surface: _Surface, length: int, seq: int) -> Event | None:
    """The replace event at ``seq`` if un-compacting it applies to this surface, else None."""
    if seq < log._horizon:
        return None
    index = log._index(seq)
    if index >= log._held or log._events[index].seq != seq:
        return None
    target = log._events[index]
    op = target.op
    if type(op) is not Replace:
        return None
    low = bisect_left(surface.positions, op.start, 0, length)
    high = bisect_right(surface.positions, op.stop, 0, length)
    if low == high or any(entry.seq != seq for entry in surface.events[low:high]):
        return None
    return target


def _why_not_uncompact(log: Log, seq: int) -> str:
    """Why un-compacting the event at ``seq`` does not apply to ``log`` (for its error)."""
    if seq < log._horizon:
        return f"it is before the horizon {log._horizon} (a snapshot dropped its history)"
    index = log._index(seq)
    if index >= log._held or log._events[index].seq != seq:
        return "no such event is held"
    target = log._events[index]
    if type(target.op) is not Replace:
        return f"it is a {target.type} event, not a replace"
    if not any(entry.seq == seq for entry in log.surface()):
        return "it is not on the surface"
    return "the surface inside its range has changed since"


def _prefix_fold(log: Log, seq: int) -> _Fold:
    """The fold of ``log`` as it was when ``seq`` was its newest event (-1: empty): what a
    rewind or an uncompact folds back to."""
    if seq < 0:
        return _empty_fold()
    return log.upto(max(seq, log._horizon - 1))._folded()


def _empty_fold() -> _Fold:
    """A fold of no events, with storage of its own.

    Never a shared module-level value: the first fold built on it extends its lists in place
    (the O(1) append path), so a shared one would keep that session's events alive for the
    life of the process.
    """
    return _Fold(0, _Surface([], [], [], []), 0)


class Log:
    """An immutable, append-only event log with a memoised surface fold.

    ``Log()`` is empty. Every method that "changes" the log returns a new Log; the old value
    stays valid and unchanged. See the module docstring for the fold's rules and costs.
    """

    __slots__ = ("_count", "_events", "_fold", "_held", "_horizon")

    _events: list[Event]  # shared and append-only; this value owns the prefix [:_held]
    _held: int
    _count: int  # the next seq: 1 + the highest seq ever assigned
    _horizon: int  # below it, only what was on the surface at the last snapshot is held
    _fold: _Fold | None  # memo: the fold of a prefix of this value's events (a cache)

    def __init__(self) -> None:
        self._events = []
        self._held = 0
        self._count = 0
        self._horizon = 0
        self._fold = None

    @classmethod
    def _make(
        cls, events: list[Event], held: int, count: int, fold: _Fold | None, horizon: int
    ) -> Log:
        log = object.__new__(cls)
        log._events = events
        log._held = held
        log._count = count
        log._horizon = horizon
        log._fold = fold
        return log

    # Appending ------------------------------------------------------------------------------

    def append(
        self, type: EventType | str, data: Any = None, *, time: datetime | None = None
    ) -> Log:
        """Append an event; it takes seq ``count``.

        Args:
            type: an :class:`EventType`, its string value, or a custom type's name.
            data: a JSON mapping (the log keeps a deep copy); may hold ``surface_op``.
            time: when it happened (aware; stored in UTC); default now. Pass a message's
                ``created_at`` when recording a message that already exists.

        Returns:
            The new log; this one is unchanged.

        Raises:
            InvalidEventError: naming what is wrong; nothing is appended.
        """
        return self._push(self._checked(make_event(self._count, type, data, time)))

    def append_prepared(self, prepared: tuple[EventType | str, dict[str, Any], datetime]) -> Log:
        """Append what :func:`nous_session.event.prepare` validated and copied earlier.

        The prepared data is taken over, not copied again (it must not be used afterwards);
        only what depends on the new seq and on the log (a surface op must start below the
        seq; an uncompact needs its replace on the surface) is checked here.

        Raises:
            InvalidEventError: the surface op does not fit this log at the new seq.
        """
        event_type, data, time = prepared
        event = make_event(self._count, event_type, data, time, decoded=True)
        return self._push(event if event.op is None else self._checked(event))

    def try_append(
        self, type: EventType | str, data: Any = None, *, time: datetime | None = None
    ) -> Log:
        """Append an event, or log a warning and return this same log when it is invalid.

        For call sites where losing one bookkeeping event beats failing the run. The failure
        is never silent: a ``nous_session.event_dropped`` warning names the reason.
        """
        try:
            return self._push(self._checked(make_event(self._count, type, data, time)))
        except InvalidEventError as e:
            _logger.warning("nous_session.event_dropped", reason=str(e), event_type=str(type))
            return self

    def append_at(
        self, seq: int, type: EventType | str, data: Any = None, *, time: datetime
    ) -> Log:
        """Restore an event under the seq it was persisted with.

        Seqs may leap forward (a snapshot leaves gaps) but never go back: restoring behind the
        head would duplicate a seq or reorder history. Validation is as for :meth:`append`.

        Raises:
            InvalidEventError: ``seq`` is not an int at or past ``count``, ``time`` is None,
                or the event is invalid.
        """
        if not isinstance(seq, int) or isinstance(seq, bool):
            raise InvalidEventError(f"append_at needs an int seq, not {seq!r}")
        if seq < self._count:
            raise InvalidEventError(
                f"cannot restore event {seq} behind the head: the log's count is {self._count}"
            )
        if time is None:
            raise InvalidEventError(f"event {seq}: append_at needs the event's time")
        return self._push(self._checked(make_event(seq, type, data, time)))

    def _checked(self, event: Event) -> Event:
        """Refuse an operation that does not fit this log (what make_event cannot know)."""
        op = event.op
        if op is None or type(op) is Replace or type(op) is Remove:
            return event
        if type(op) is Rewind:
            if op.to < self._horizon - 1:
                raise InvalidEventError(
                    f"event {event.seq} ({event.type}): cannot rewind to seq {op.to}, before"
                    f" the horizon {self._horizon} (a snapshot dropped that history)"
                )
            return event
        assert type(op) is Uncompact
        fold = self._folded()
        if _uncompact_target(self, fold.surface, fold.length, op.seq) is None:
            raise InvalidEventError(
                f"event {event.seq} ({event.type}): cannot uncompact seq {op.seq}: "
                + _why_not_uncompact(self, op.seq)
            )
        return event

    def _push(self, event: Event) -> Log:
        events, held = self._events, self._held
        if len(events) == held:
            events.append(event)
            try:
                # Another thread may have appended to this value first: then fork.
                if events[held] is not event:
                    events = [*events[:held], event]
            except IndexError:  # a give-back cut the storage meanwhile (free unless raised)
                events = [*events[:held], event]
        else:  # appending to an older value: fork
            events = [*events[:held], event]
        # Inlined _make: this is the hot path of every append.
        log = object.__new__(Log)
        log._events = events
        log._held = held + 1
        log._count = event.seq + 1
        log._horizon = self._horizon
        log._fold = self._fold
        return log

    def give_back(self, newer: Log) -> None:
        """Internal, for the session actor: let this value's next append reuse the shared
        storage instead of forking.

        For an owner that built ``newer`` from this value by appends alone and discards it
        unseen (the SessionActor after a failed commit): the events ``newer`` added past this
        value are dropped from the storage, if nothing was added after them. The caller
        guarantees that no other value holding those events is alive; this value, and every
        older one, are unchanged.
        """
        events = self._events
        if newer._events is events and len(events) == newer._held >= self._held:
            del events[self._held :]

    @classmethod
    def seed(cls, messages: Iterable[object]) -> Log:
        """A log with one surface event per message, in order, each timed at its ``created_at``.

        Lossless: ``Log.seed(ms).derive_messages() == ms``, timestamps included. A value that
        is not a :class:`Message` (or is one with a role no event type stands for) is dropped
        with a warning and takes no seq.
        """
        log = cls()
        for message in messages:
            try:
                event_type, data = message_event(message)
            except InvalidEventError as error:
                _logger.warning(
                    "nous_session.value_dropped",
                    value_type=type(message).__name__,
                    reason=str(error),
                    seq=log._count,
                )
                continue
            assert isinstance(message, Message)  # message_event refuses anything else
            log = log.append(event_type, data, time=message.created_at)
        return log

    @classmethod
    def restore(cls, events: Iterable[Event], *, count: int | None = None, horizon: int = 0) -> Log:
        """A log holding ``events`` exactly as they were persisted: seqs and gaps verbatim.

        The bulk form of :meth:`append_at`, for rebuilding a session from a store. The events
        must come from a Log or from :func:`nous_session.codec.decode`, which have validated
        them already; only their order is checked here, so restoring costs O(n) with no copy.

        Args:
            events: the held events, in seq order.
            count: the session's count, when a snapshot dropped its newest events (default:
                one past the last event's seq).
            horizon: the count at the session's last snapshot that dropped events (0: none);
                the events below it are what was on the surface then (and what is kept
                regardless: bookkeeping and custom events).

        Raises:
            InvalidEventError: an item is not an Event, the seqs do not increase, or ``count``
                or ``horizon`` do not fit them.
        """
        log = cls().extend(events)
        if count is not None:
            if type(count) is not int or count < log._count:
                raise InvalidEventError(
                    f"restore count {count!r} is below the events' next seq {log._count}"
                )
            log._count = count
        if type(horizon) is not int or not 0 <= horizon <= log._count:
            raise InvalidEventError(f"restore horizon {horizon!r} must be in 0..{log._count}")
        log._horizon = horizon
        return log

    def extend(self, events: Iterable[Event]) -> Log:
        """Append events restored from a store, after this log's head, keeping their seqs.

        The bulk form of :meth:`append_at` for events a Log or the codec has validated already
        (catching up with what other writers committed, say): only their order is checked.

        Raises:
            InvalidEventError: an item is not an Event, or the seqs do not increase from
                ``count``.
        """
        new = list(events)
        if not new:
            return self
        previous = _last_in_order(new, self._count)
        backing, held = self._events, self._held
        if len(backing) == held:
            backing.extend(new)
            # Another thread extended this value first, or a give-back cut the storage.
            if len(backing) <= held or backing[held] is not new[0]:
                backing = [*backing[:held], *new]
        else:
            backing = [*backing[:held], *new]
        return Log._make(backing, held + len(new), previous + 1, self._fold, self._horizon)

    # Reading --------------------------------------------------------------------------------

    @property
    def count(self) -> int:
        """The next seq: 1 + the highest seq ever assigned, 0 when none. Never lowered."""
        return self._count

    @property
    def horizon(self) -> int:
        """The count at the last snapshot that dropped events (0 when none has).

        History is complete from here on: :meth:`upto` and rewinds reach back to
        ``horizon - 1`` at most. Below it the log holds only what was on the surface at that
        snapshot, plus the bookkeeping and custom events it keeps.
        """
        return self._horizon

    @property
    def last(self) -> Event | None:
        """The newest held event, or None."""
        return self._events[self._held - 1] if self._held else None

    def events(self) -> Sequence[Event]:
        """Every held event, oldest first, shadowed ones included."""
        return _View(self._events, 0, self._held)

    def since(self, seq: int) -> Sequence[Event]:
        """The held events with seq >= ``seq``, oldest first; O(log n) plus what is returned.

        Correct across the gaps a snapshot leaves; ``seq`` at or past ``count`` gives ``[]``.

        Raises:
            ValueError: ``seq`` is negative.
            TypeError: ``seq`` is not an int.
        """
        return _View(self._events, self._index(_check_seq(seq)), self._held)

    def _index(self, seq: int) -> int:
        """The index of the first held event with seq >= ``seq``."""
        if self._held == self._count:
            # No gaps: held seqs are exactly 0..count-1, so the seq is the index.
            return min(seq, self._held)
        return bisect_left(self._events, seq, 0, self._held, key=_SEQ)

    def _folded(self) -> _Fold:
        fold = self._fold
        if fold is None:
            fold = (
                _empty_fold()
                if self._horizon == 0
                else _Fold.at_horizon(self._events[: self._index(self._horizon)], self._horizon)
            )
        if fold.count != self._count:
            fold = fold.extended(self, self.since(fold.count), self._count)
            self._fold = fold  # a cache: any thread may fill it; every result is equal
        return fold

    def surface(self) -> Sequence[Event]:
        """The surface entries, in the order the model sees them.

        Each is a surface event, except that a ``replace`` event holding several messages
        stands there as one surface event per message (each with the replace's seq).
        """
        fold = self._folded()
        return _View(fold.surface.events, 0, fold.length)

    def derive_indexed(self) -> Sequence[tuple[int, Message]]:
        """``(seq, Message)`` for each surface entry, in model order.

        The seq is the event's own: a summary appended at seq 8 over 0..5 pairs with 8 (and
        every message of a multi-message replace with its seq). To name a range for a new
        operation, use the surface entries' :attr:`~Event.position`.
        """
        fold = self._folded()
        fold.messages()
        return _View(fold.surface.pairs, 0, fold.length)

    def derive_messages(self) -> Sequence[Message]:
        """The messages the model sees: :meth:`derive_indexed` without the seqs."""
        fold = self._folded()
        fold.messages()
        return _View(fold.surface.messages, 0, fold.length)

    def range(self, start: int, stop: int) -> Sequence[Event]:
        """The surface entries at positions ``start..stop`` (inclusive), in order; O(log n)
        plus what is returned. What a replace or remove over that range would take away."""
        fold = self._folded()
        positions = fold.surface.positions
        low = bisect_left(positions, start, 0, fold.length)
        high = bisect_right(positions, stop, 0, fold.length)
        return _View(fold.surface.events, low, high)

    def shadowed(self) -> Sequence[Event]:
        """The held events that :meth:`snapshot` would drop."""
        return self._partition()[1]

    def _partition(self) -> tuple[list[Event], list[Event]]:
        """(kept, dropped) by a snapshot (see :func:`~nous_session._snapshot_rule.partition`)."""
        return partition(self._events, self._held, {entry.seq for entry in self.surface()})

    # Deriving new values --------------------------------------------------------------------

    def snapshot(self) -> Log:
        """Drop what the surface no longer needs (see :meth:`shadowed`), keeping the survivors'
        seqs and the count; the horizon becomes the count.

        The surface is unchanged, so the memoised fold carries over. After a snapshot, the
        dropped history is gone from this value: :meth:`upto`, rewinds and uncompacts reach
        back only to the new horizon.
        """
        fold = self._folded()
        live, dropped = self._partition()
        if not dropped:
            return self
        return Log._make(live, len(live), self._count, fold, self._count)

    def upto(self, seq: int) -> Log:
        """The log as it was when ``seq`` was its newest event.

        Holds the events with seq <= ``seq``, and its count is ``seq + 1``: time travel and
        audit ("what did the model see at step N").

        Raises:
            ValueError: ``seq`` is not in ``horizon - 1 <= seq < count`` (before the horizon a
                snapshot dropped the history it would need).
        """
        if not isinstance(seq, int) or isinstance(seq, bool) or not 0 <= seq < self._count:
            raise ValueError(f"upto needs 0 <= seq < {self._count}, got {seq!r}")
        if seq < self._horizon - 1:
            raise ValueError(
                f"upto({seq}) is before the horizon {self._horizon}: a snapshot dropped the"
                f" history it needs (the earliest seq is {self._horizon - 1})"
            )
        fold = self._fold
        if fold is not None and fold.count > seq + 1:
            fold = None
        return Log._make(self._events, self._index(seq + 1), seq + 1, fold, self._horizon)

    # Dunder ---------------------------------------------------------------------------------

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Log):
            return NotImplemented
        return (
            self._count == other._count
            and self._horizon == other._horizon
            and self.events() == other.events()
        )

    # Unhashable: equal by value, and a value nobody should key on; typeshed's object.__hash__
    # has no None.
    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        horizon = f" horizon={self._horizon}" if self._horizon else ""
        return f"<Log count={self._count} held={self._held}{horizon}>"


def _last_in_order(events: list[Event], count: int) -> int:
    """The last seq of ``events``, checked to be Events with seqs increasing from ``count``.

    Raises:
        InvalidEventError: they are not.
    """
    previous = count - 1
    for event in events:
        if type(event) is not Event:
            raise InvalidEventError(f"expected Events, got {type(event).__name__}")
        if event.seq <= previous:
            raise InvalidEventError(
                f"events must have increasing seqs from {count}: {event.seq} follows {previous}"
            )
        previous = event.seq
    return previous


def _check_seq(seq: object) -> int:
    if not isinstance(seq, int) or isinstance(seq, bool):
        raise TypeError(f"seq must be an int, not {type(seq).__name__}")
    if seq < 0:
        raise ValueError(f"seq must be >= 0, got {seq}")
    return seq
