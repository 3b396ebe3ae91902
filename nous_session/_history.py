"""The surface and history operations of a session handle: replace, remove, rewind,
uncompact, recover, snapshot and fork.

A base class of :class:`~nous_session.actor.SessionActor`, apart only so that neither class
grows past what a reader takes in at once; every method is the handle's own (it validates and
copies its arguments in the caller, queues one request and awaits its answer).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from nous_session._requests import Append, Call, Edit, Erase, Recover, Snapshot
from nous_session._state import SessionState
from nous_session.erasure import Erasure, check_reason, check_seqs, now
from nous_session.errors import InvalidEventError
from nous_session.event import (
    Event,
    EventType,
    check_size,
    message_event,
    prepare,
    replace_data,
)
from nous_session.log import Log
from nous_session.message import Message
from nous_session.ops import Remove, Replace, Rewind, Uncompact
from nous_session.stores.base import ForkingStore, check_session_id, supports

__all__ = ["HistoryOperations"]


class HistoryOperations:
    """Operations that change the surface or the history rather than add to it."""

    __slots__ = ()

    _call: Call
    _state: SessionState
    _max_event_size: int | None

    async def replace(
        self,
        start: int,
        stop: int,
        message: Message | Sequence[Message],
        *,
        expect: int | Sequence[int] | None = None,
    ) -> Event:
        """Put ``message`` (or several messages, k >= 0) on the surface in place of the
        positions ``start..stop``, in one event.

        Name positions with the surface entries' :attr:`~Event.position` (``log.range``
        shows what a range holds). One message is recorded as its own surface event, timed at
        its ``created_at``; a sequence as one ``replace`` event holding them all (a summary
        plus a kept tail, an edit), timed now. Every replaced event stays in the log.

        Args:
            expect: a condition: the range must still hold this many surface entries, or
                entries of exactly these event seqs (in order; a replace's messages count
                once). If the surface changed, :class:`ConflictError` and nothing is applied;
                with other writers, this is checked against the store's latest state.

        Outcome: as for :meth:`~nous_session.actor.SessionActor.append`; a cancelled caller
        whose request was queued does not undo it (a surface operation has no key: check the
        surface, or use ``expect``, before trying again).

        Raises:
            InvalidEventError: a malformed range, a range not below the new event's seq, a
                value that is not a Message, or an event larger than ``max_event_size``.
            ConflictError: ``expect`` does not hold.
            StoreError, OutcomeUnknownError, SessionClosedError: as
                :meth:`~nous_session.actor.SessionActor.append`.
        """
        _range(Replace, start, stop)  # a malformed range fails now, in the caller
        if isinstance(message, Message):
            event_type, data = message_event(message)
            data["surface_op"] = ["replace", start, stop]  # checked when applied (make_event)
            item: tuple[EventType | str, dict[str, Any], datetime] = (
                event_type,
                data,
                message.created_at,
            )
        else:
            if not isinstance(message, list | tuple):
                raise InvalidEventError(
                    f"replace takes a Message or a sequence of Messages, not {message!r}"
                )
            item = prepare(EventType.REPLACE, replace_data(start, stop, list(message)))
        check_size(item[0], item[1], self._max_event_size)
        events = await self._call(Edit(item, start, stop, _expectation(expect)))
        return events[0]

    async def remove(
        self, start: int, stop: int, *, expect: int | Sequence[int] | None = None
    ) -> Event:
        """Take the positions ``start..stop`` off the surface; nothing takes their place.

        The removed events stay in the log (a ``remove`` event records the operation), so a
        rewind can bring them back. ``expect`` and the outcome: as for :meth:`replace`.

        Raises:
            InvalidEventError: a malformed range, or one not below the new event's seq.
            ConflictError: ``expect`` does not hold.
            StoreError, OutcomeUnknownError, SessionClosedError: as
                :meth:`~nous_session.actor.SessionActor.append`.
        """
        op = _range(Remove, start, stop)
        item = prepare(EventType.REMOVE, {"surface_op": op.to_json()})
        events = await self._call(Edit(item, start, stop, _expectation(expect)))
        return events[0]

    async def rewind(self, to: int) -> Event:
        """Make the surface what it was when seq ``to`` was the newest event (-1: empty).

        An event records it; later history stays in the log, and another rewind (to the seq
        just before this one, say) brings it back. Outcome: as for :meth:`replace`.

        Raises:
            InvalidEventError: ``to`` is not below the new event's seq, or is before the
                horizon (a snapshot dropped that history).
            StoreError, OutcomeUnknownError, SessionClosedError: as
                :meth:`~nous_session.actor.SessionActor.append`.
        """
        return await self._append_op(EventType.REWIND, Rewind, to)

    async def uncompact(self, summary_seq: int) -> Event:
        """Undo the replace at ``summary_seq`` (a compaction's summary, say): the range it
        replaced is visible again, as it was then. Outcome: as for :meth:`replace`.

        Raises:
            InvalidEventError: that event is not a replace on the surface with its range
                intact, or its history is before the horizon.
            StoreError, OutcomeUnknownError, SessionClosedError: as
                :meth:`~nous_session.actor.SessionActor.append`.
        """
        return await self._append_op(EventType.UNCOMPACT, Uncompact, summary_seq)

    async def _append_op(
        self, event_type: EventType, kind: type[Rewind] | type[Uncompact], seq: int
    ) -> Event:
        """Append the event of a surface operation on one seq, checked in the caller (its
        error is an InvalidEventError)."""
        try:
            op = kind(seq)
        except ValueError as error:
            raise InvalidEventError(f"{kind.name}: {error}") from None
        events = await self._call(Append((prepare(event_type, {"surface_op": op.to_json()}),)))
        return events[0]

    async def recover_open_turn(self) -> tuple[Event, ...]:
        """Close every tool call left open (an assistant's call with no result, after a crash
        or a cancelled turn): each gets a tool result saying "Tool call was interrupted and
        not executed. Please retry if needed.", placed right after its call, so the next model
        call is valid for every provider. ``SessionActor.open(..., recover=True)`` does this
        on open.

        Returns:
            The events added (empty when no call was open).

        Raises:
            StoreError, OutcomeUnknownError, SessionClosedError: as
                :meth:`~nous_session.actor.SessionActor.append`.
        """
        return await self._call(Recover())

    async def fork(self, new_session_id: str, *, at: int | None = None) -> None:
        """Make ``new_session_id`` a new, independent session of this store whose history is
        this one's up to seq ``at`` (default: everything committed so far).

        The new session records its parent and fork point. A store that can fork (every
        built-in one) shares the history instead of copying it, so this costs the same at any
        length; another store gets a copy of the events. Open the fork with
        ``SessionActor.open(session_id=new_session_id, store=session.store)``.

        Raises:
            ValueError: ``new_session_id`` is bad or exists, or ``at`` is outside
                ``horizon - 1 .. count - 1``.
            StoreError: the store failed (nothing was made).
        """
        try:
            check_session_id(new_session_id)
        except ValueError as error:
            raise ValueError(f"bad new_session_id: {error}") from None
        log = self._state.published.log
        point = log.count - 1 if at is None else at
        if supports(self._state.store, ForkingStore):
            await self._state.store.fork(self._state.session_id, new_session_id, at=point)
            return
        history = log.upto(point)  # raises ValueError outside the held history
        if await self._state.store.load(new_session_id):
            raise ValueError(f"session {new_session_id!r} exists already")
        # Below a snapshot's horizon the history has gaps: the store is told the horizon,
        # so it takes them (and the fork opens as the parent would).
        await self._state.store.commit(
            new_session_id,
            expected_count=0,
            events=tuple(history.events()),
            horizon=history.horizon or None,
        )

    async def snapshot(self) -> Log:
        """Drop what the surface no longer needs (see :meth:`Log.shadowed`), in memory and in
        the store, in one commit; the horizon moves to the count.

        Returns:
            The log right after the snapshot.

        Raises:
            StoreError, OutcomeUnknownError, SessionClosedError: as
                :meth:`~nous_session.actor.SessionActor.append`.
        """
        return await self._call(Snapshot())

    async def erase(self, seqs: Iterable[int], *, reason: str, summaries: bool = True) -> Erasure:
        """Erase the content of the events at ``seqs`` for good: in the store (and in every
        session there that holds the same events: forks, and the session this one was forked
        from when it shares them), and in this session's Log; with ``summaries`` (the
        default), also the summaries (replace events) that copy them (the result lists them).
        The store records the erasure as the session's next event (an ``erasure`` event:
        which seqs, when and why), so every other holder of the session, in this process or
        another, reads the erased events again, and a compaction of this actor that was
        planned before is refused as stale.

        Each event keeps its seq, type, time and surface operation, and records when and why
        it was erased; an erased message stays on the surface as the placeholder
        ``"[erased]"`` (tool calls keep their ids, so every call still has its result). See
        :mod:`nous_session.erasure`, and :func:`~nous_session.erasure.select_events` to find
        a person's messages. It runs between two commits of this actor (the requests queued
        before it are committed first) and is answered once the store has scrubbed the old
        bytes, which may take a while (the result's ``proven`` and ``detail`` say how it went).
        Log values taken before it still hold the old content: drop them.

        Returns:
            What the store erased (:class:`~nous_session.erasure.Erasure`).

        Raises:
            ValueError: a seq is not an int in ``0 .. count - 1``, or the reason is empty;
                nothing was changed.
            TypeError: the store cannot erase.
            StoreError, SessionClosedError: as
                :meth:`~nous_session.actor.SessionActor.append`.
        """
        if type(summaries) is not bool:
            raise ValueError(f"summaries is True or False, got {summaries!r}")
        request = Erase(check_seqs(seqs), check_reason(reason), now(), summaries)
        return await self._call(request)


def _range(kind: type[Replace] | type[Remove], start: int, stop: int) -> Replace | Remove:
    """A range operation checked in the caller: its error is an InvalidEventError."""
    try:
        return kind(start, stop)  # the validators check what a caller passed
    except ValueError as error:
        raise InvalidEventError(f"{kind.name}: {error}") from None


def _expectation(expect: object) -> int | tuple[int, ...] | None:
    """A conditional write's ``expect``, checked and copied in the caller."""
    if expect is None:
        return None
    if type(expect) is int and expect >= 0:
        return expect
    if isinstance(expect, Sequence) and not isinstance(expect, str | bytes):
        seqs = tuple(expect)
        if all(type(seq) is int and seq >= 0 for seq in seqs):
            return seqs
    raise InvalidEventError(
        f"expect is a count (an int >= 0) or a sequence of seqs, not {expect!r}"
    )
