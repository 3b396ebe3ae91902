"""Copying sessions from one store to another as they are (see :func:`copy_sessions`)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime

import anyio
import attrs

from nous_session.errors import NousSessionError
from nous_session.event import Event, make_event
from nous_session.stores.base import (
    ForkingStore,
    ListingStore,
    SessionInfo,
    Store,
    Stored,
    supports,
)

__all__ = ["CopyError", "CopyReport", "copy_sessions"]


@attrs.frozen
class CopyReport:
    """What :func:`copy_sessions` did.

    Attributes:
        copied: the sessions copied, in the order they were (a parent before its forks).
        forked: those of ``copied`` made as forks of their parent's copy, sharing its rows
            up to their fork point as in the source.
        unlinked: those of ``copied`` that were forks in the source but are whole sessions in
            the target, each with why: their parent is not in the target, or no longer holds
            what they took from it (a snapshot dropped it, or it is another session by now).
        skipped: the sessions not copied, each with why (the target holds one of that id
            already).
    """

    copied: tuple[str, ...] = ()
    forked: tuple[str, ...] = ()
    unlinked: tuple[tuple[str, str], ...] = ()
    skipped: tuple[tuple[str, str], ...] = ()


class CopyError(NousSessionError):
    """A session read back from the target is not what the source holds (the target changed
    it): the copy stops there, that session deleted from the target again."""


async def copy_sessions(
    source: Store, target: Store, session_ids: Iterable[str] | None = None
) -> CopyReport:
    """Copy sessions from ``source`` to ``target`` as they are: every held event with its seq,
    time and data (erased ones erased), the horizon a snapshot left, the idempotency keys (a
    retry in the target of a call made before the copy appends nothing) with the events a
    snapshot kept aside for them, and a fork's link to its parent when the parent is copied too
    or was before (made with the target's ``fork``, sharing the parent's rows). A session's
    metadata comes with its events. Not copied: the sessions' created and last-active times
    (the target's clock dates them to the copy) and commit ids (which only answer a commit in
    flight).

    Never over a session the target holds (it is skipped, and said so), and each session is
    read back from the target and compared with the source before the next is copied.
    Sessions are copied one at a time, each in one or two commits (and a fork): a session
    whose copy fails part way is deleted from the target again, so a copy that stops leaves
    whole sessions behind it, and running it again skips those and copies the rest.

    Args:
        source: the store to read (only read: a read-only store will do).
        target: the store to write.
        session_ids: the sessions to copy; None (the default) for every session of the
            source.

    Raises:
        ValueError: a session named is not in ``source``.
        CopyError: a session does not read back from the target as the source holds it.
        StoreError, OutcomeUnknownError: either store failed. The sessions copied before are
            whole in the target; the one being copied is not there (an error note says so
            when deleting it failed too).
    """
    infos = {info.session_id: info for info in await source.sessions()}
    if session_ids is None:
        chosen = list(infos)
    else:
        chosen = list(dict.fromkeys(session_ids))
        missing = [session_id for session_id in chosen if session_id not in infos]
        if missing:
            raise ValueError(f"no such session in the source: {', '.join(map(repr, missing))}")
    created = await _created(source) if any(infos[s].parent for s in chosen) else {}
    copied: list[str] = []
    forked: list[str] = []
    unlinked: list[tuple[str, str]] = []
    skipped: list[tuple[str, str]] = []
    for session_id in _parents_first(chosen, infos):
        stored = await source.read(session_id)
        if (await target.read(session_id)).count:
            skipped.append((session_id, "the target holds a session of that id"))
            continue
        try:
            why = _another_parent(session_id, stored, created) or await _fork_in_target(
                target, session_id, stored
            )
            if why is not None:
                await commit_whole(target, session_id, stored)
            await _check(target, session_id, stored, linked=why is None)
        except BaseException as error:
            await undo(target, session_id, stored, error)
            raise
        if why is None:
            forked.append(session_id)
        elif stored.parent is not None:
            unlinked.append((session_id, why))
        copied.append(session_id)
    return CopyReport(tuple(copied), tuple(forked), tuple(unlinked), tuple(skipped))


async def _created(source: Store) -> dict[str, datetime]:
    """When each session of ``source`` was made, when it can say (a ListingStore)."""
    created: dict[str, datetime] = {}
    if not supports(source, ListingStore):
        return created
    cursor = None
    while True:
        page = await source.list_sessions(order="created", limit=1000, cursor=cursor)
        created.update((entry.session_id, entry.created) for entry in page.sessions)
        if page.cursor is None:
            return created
        cursor = page.cursor


def _another_parent(session_id: str, stored: Stored, created: dict[str, datetime]) -> str | None:
    """Why the fork is not to be linked to the session its parent's name names now: that one
    was made after the fork (its parent was deleted and the name used again), so the fork
    took nothing from it, however alike their events are; None when that cannot be told."""
    parent = stored.parent
    if parent is None or parent not in created or session_id not in created:
        return None
    if created[parent] > created[session_id]:
        return f"its parent {parent!r} is another session by now"
    return None


def _parents_first(chosen: Sequence[str], infos: dict[str, SessionInfo]) -> list[str]:
    """``chosen`` with each session after its parent (when the parent is chosen too), the
    order kept otherwise."""
    wanted = set(chosen)
    out: list[str] = []
    placed: set[str] = set()

    def place(session_id: str, path: set[str]) -> None:
        if session_id in placed:
            return
        parent = infos[session_id].parent
        if parent is not None and parent in wanted and parent not in path:
            place(parent, path | {session_id})
        placed.add(session_id)
        out.append(session_id)

    for session_id in chosen:
        place(session_id, set())
    return out


async def _fork_in_target(target: Store, session_id: str, stored: Stored) -> str | None:
    """Make the session a fork of its parent's copy in ``target`` (copied now or before) and
    commit what it holds after its fork point; None once done, else why it is to be copied
    whole (nothing written then)."""
    parent, at = stored.parent, stored.fork_point
    if parent is None or at is None:
        return "it is no fork"
    if not supports(target, ForkingStore):
        return "the target cannot fork"
    if stored.horizon > at + 1:
        return "a snapshot of its own dropped what it took from its parent"
    held = await target.read(parent)
    if not held.count:
        return f"its parent {parent!r} is not in the target"
    shared = [event for event in stored.events if event.seq <= at]
    if [event for event in held.events if event.seq <= at] != shared or held.horizon > at + 1:
        return f"its parent {parent!r} no longer holds what it took from it"
    own = [event for event in stored.events if event.seq > at]
    own_keys = [(key, first, size) for key, (first, size) in stored.keys.items() if first > at]
    await target.fork(parent, session_id, at=at)
    if own:
        await target.commit(session_id, expected_count=at + 1, events=own, keys=own_keys)
    return None


async def commit_whole(target: Store, session_id: str, stored: Stored) -> None:
    """Write the session as one whole session: its events (and the kept ones, dropped again
    by a second commit that keeps them aside), its count, its horizon and its keys."""
    kept = [event for event in stored.kept if event.seq < stored.horizon]
    keys = [(key, first, size) for key, (first, size) in stored.keys.items()]
    merged = sorted([*stored.events, *kept], key=lambda event: event.seq)
    # A snapshot may have dropped the newest events: the count is then past every held seq
    # (and the horizon is the count). A commit's count is one past its last event, so a
    # stand-in at seq count - 1 is written with the rest and dropped again, as they were.
    # A snapshot that dropped every event leaves nothing but the count: the stand-in is all
    # that is written.
    tail = []
    if (merged[-1].seq + 1 if merged else 0) < stored.count:
        time = merged[-1].time if merged else datetime.now(UTC)
        tail = [make_event(stored.count - 1, _STAND_IN, {}, time)]
    if not kept and not tail:
        await target.commit(
            session_id,
            expected_count=0,
            events=stored.events,
            horizon=stored.horizon or None,
            keys=keys,
        )
        return
    # A key's events that a snapshot dropped are kept aside: written first with the rest,
    # then dropped by a commit that keeps them, as the snapshot did.
    written = [*merged, *tail]
    first_horizon = _gap_horizon(written)
    await target.commit(
        session_id,
        expected_count=0,
        events=written,
        horizon=first_horizon or None,
        keys=keys,
    )
    seqs = [event.seq for event in kept]
    await target.commit(
        session_id,
        expected_count=written[-1].seq + 1,
        events=(),
        dropped=[*seqs, *(event.seq for event in tail)],
        kept=seqs,
        horizon=stored.horizon,
        expected_horizon=first_horizon,
    )


_STAND_IN = "x.nous_session.dropped"
"""The type of the event that stands, for one commit, at the seq before a copy's count."""


def _gap_horizon(events: Sequence[Event]) -> int:
    """One past the highest gap in ``events``' seqs (0 when none): the lowest horizon under
    which a commit may write them."""
    for index in range(len(events) - 1, 0, -1):
        if events[index].seq != events[index - 1].seq + 1:
            return events[index].seq
    return events[0].seq if events else 0


async def undo(target: Store, session_id: str, stored: Stored, error: BaseException) -> None:
    """After a failed copy of a session: delete what the target holds of it when all of that
    is the copy's (every event it holds is the source's at that seq, kept ones too), so that
    no part-written session is left for a second run to skip; one someone else wrote stays."""
    source_events = {event.seq: event for event in (*stored.events, *stored.kept)}
    with anyio.CancelScope(shield=True):
        try:
            held = await target.read(session_id)
            if held.count and all(source_events.get(e.seq) == e for e in held.events):
                await target.delete(session_id)
        except Exception as failure:
            error.add_note(
                f"session {session_id!r} may be left part-written in the target: deleting it"
                f" failed ({type(failure).__name__}: {failure})"
            )


async def _check(target: Store, session_id: str, stored: Stored, *, linked: bool) -> None:
    """Refuse a copy that does not read back as the source holds it (a fork made whole
    reads back with no parent)."""
    back = await target.read(session_id)
    expected = (
        list(stored.events),
        stored.count,
        stored.horizon,
        dict(stored.keys),
        list(stored.kept),
        stored.parent if linked else None,
        stored.fork_point if linked else None,
    )
    got = (
        list(back.events),
        back.count,
        back.horizon,
        dict(back.keys),
        list(back.kept),
        back.parent,
        back.fork_point,
    )
    if got != expected:
        names = ("events", "count", "horizon", "keys", "kept", "parent", "fork_point")
        differs = [name for name, a, b in zip(names, got, expected, strict=True) if a != b]
        raise CopyError(
            f"session {session_id!r} does not read back from the target as the source holds it"
            f" ({', '.join(differs)} differ): the target changed it"
        )
