"""What a snapshot of a log keeps and what it drops (see :meth:`~nous_session.log.Log.snapshot`
and docs/design.md's compaction rules): a pure rule over the held events and the seqs on the
surface, swept newest to oldest."""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from typing import Final

from nous_session.event import OPERATION_TYPES, SURFACE_TYPES, Event, EventType
from nous_session.ops import Remove, Replace

__all__ = ["Coverage", "partition"]

_SURFACE: Final = frozenset(SURFACE_TYPES)
_OPERATION: Final = frozenset(OPERATION_TYPES)
_BUILT_IN: Final = frozenset(EventType)
_ALWAYS_KEPT: Final = frozenset({EventType.METADATA, EventType.ERASURE})


class Coverage:
    """A union of closed integer intervals, for the backwards sweep of :func:`partition`."""

    __slots__ = ("_starts", "_stops")

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._stops: list[int] = []

    def covers(self, point: int) -> bool:
        index = bisect_right(self._starts, point) - 1
        return index >= 0 and point <= self._stops[index]

    def add(self, start: int, stop: int) -> None:
        starts, stops = self._starts, self._stops
        low = bisect_left(stops, start - 1)  # first interval that could touch or overlap
        high = bisect_right(starts, stop + 1)  # one past the last such interval
        if low < high:
            start = min(start, starts[low])
            stop = max(stop, stops[high - 1])
        starts[low:high] = [start]
        stops[low:high] = [stop]


def partition(
    events: list[Event], held: int, on_surface: set[int]
) -> tuple[list[Event], list[Event]]:
    """(kept, dropped) by a snapshot of a log holding ``events[:held]`` (in seq order: the
    log's own storage, read in place) whose surface entries have the seqs ``on_surface``.

    Kept: every event on the surface now, every custom, metadata and erasure event, and every
    bookkeeping event that no later range operation covers. Dropped: surface events and
    replaces no longer on the surface, the operations that are not (removes, rewinds,
    uncompacts), and bookkeeping events inside a range replaced or removed after them.
    """
    # Sweep newest to oldest, so the coverage holds exactly the range operations appended
    # after the event in hand.
    coverage = Coverage()
    live: list[Event] = []
    dropped: list[Event] = []
    for index in range(held - 1, -1, -1):
        event = events[index]
        op = event.op
        kind = event.type
        if kind in _SURFACE or kind in _OPERATION:
            keep = event.seq in on_surface
        elif (type(kind) is str and kind not in _BUILT_IN) or kind in _ALWAYS_KEPT:
            keep = True  # custom, metadata and erasure events: always kept
        else:
            keep = not coverage.covers(event.seq)
        (live if keep else dropped).append(event)
        if type(op) is Replace or type(op) is Remove:
            coverage.add(op.start, op.stop)
    live.reverse()
    dropped.reverse()
    return live, dropped
