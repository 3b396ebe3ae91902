"""Commit strategies: how the engine puts one applied segment of a batch into the store.

* :func:`commit_plain`: one ``Store.commit`` conditional on the count and horizon the
  published Log was at when the segment was applied.
* :func:`commit_rebased`: a segment of plain appends goes to a
  :class:`~nous_session.stores.base.RebasingStore`, which puts it after whatever the session
  holds, so it never conflicts on the count.

Both return the requests to apply again (empty: every caller is answered). A commit whose
outcome the store could not tell is resolved here before anyone is answered (:func:`settle`).
See docs/internals.md.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final, NamedTuple, TypeVar, cast

import anyio
import anyio.lowlevel

from nous_session._follower import Follower, erases
from nous_session._requests import Append, Request
from nous_session._state import SessionState, store_error
from nous_session.errors import (
    ConflictError,
    CorruptRecordError,
    InvalidEventError,
    OutcomeUnknownError,
    StoreError,
)
from nous_session.event import Event, make_event
from nous_session.log import Log
from nous_session.stores.base import OutcomeStore, Rebased, RebasingStore, supports

__all__ = ["Segment", "commit_plain", "commit_rebased"]

# How long the actor keeps asking a store that lost contact whether a commit landed.
RESOLVE_FOR: Final = 30.0


AnswerT = TypeVar("AnswerT")


class Segment(NamedTuple):
    """A segment of a batch applied to the published log, not yet committed (a tuple: one
    per commit).

    Attributes:
        base: the published Log the segment was applied to.
        log: the Log after it.
        dropped: seqs (below ``base.count``) the store must delete: a snapshot's.
        applied: each applied request with its result.
        rebuilt: whether the surface changed other than by growing at the end.
        keys: idempotency keys this commit records: (key, first seq, size).
        known: requests answered from a key committed before: their answer stands whatever
            happens to the commit.
    """

    base: Log
    log: Log
    dropped: list[int]
    applied: list[tuple[Request[Any], Any]]
    rebuilt: bool
    keys: list[tuple[str, int, int]]
    known: list[tuple[Request[Any], Any]]


class _Outcome(enum.Enum):
    """How a commit with an unknown outcome turned out when not landed (see :func:`settle`)."""

    NOT_LANDED = "neither attempt landed"
    UNKNOWN = "still unknown"


class _LandedBefore(NamedTuple):
    """A commit with an unknown outcome turned out to have landed on its first attempt, at
    the seqs the store recorded for its commit id."""

    first: int
    size: int


def _arguments(state: SessionState, batch: Segment, events: Sequence[Event]) -> dict[str, Any]:
    """The keyword arguments of the store commit for ``batch``."""
    base = batch.base
    horizon, count = base.horizon, base.count
    arguments: dict[str, Any] = {
        "expected_count": count,
        "events": events,
        "dropped": batch.dropped,
        "expected_horizon": horizon,
    }
    if batch.log.horizon != horizon:
        arguments["horizon"] = batch.log.horizon
    if batch.keys:
        arguments["keys"] = batch.keys
    if batch.dropped and state.keys:
        keyed = {seq for first, size in state.keys.values() for seq in range(first, first + size)}
        arguments["kept"] = [seq for seq in batch.dropped if seq in keyed]
    if state.name_commits:
        arguments["commit_id"] = state.commit_ids()
    uid = state.uid
    if uid is not None and count and state.checks_uid:
        arguments["expected_uid"] = uid  # see SessionState.checks_uid
    return arguments


async def commit_plain(
    state: SessionState,
    follower: Follower,
    batch: Segment,
    *,
    may_retry: Callable[[Sequence[Request[Any]]], list[Request[Any]]],
) -> list[Request[Any]]:
    """Commit an applied segment in one store call, then publish and answer its callers.

    Returns the requests to apply again when the commit lost to another writer: those of the
    segment that ``may_retry`` returns (the follower has caught up meanwhile); the others'
    callers get the ConflictError. Empty when every caller is answered.
    """
    if batch.log is not batch.base:
        if state.unfollowable is not None:  # the session was deleted: see Follower.reload
            batch.base.give_back(batch.log)
            state.answer(batch.known)
            state.fail(batch.applied, state.unfollowable, expected_count=batch.base.count)
            return []
        # A tuple, not a view: a failed batch's events leave the log's storage below, and a
        # store may keep what it was given.
        events = tuple(batch.log.since(batch.base.count))
        arguments = _arguments(state, batch, events)
        error: BaseException | None = None
        retry: list[Request[Any]] = []
        if state.abort_requested:  # see SessionState.begin_commit
            await anyio.lowlevel.checkpoint()  # the work scope is cancelled: raises here
        uid: object = None
        state.begin_commit()
        try:
            uid = await state.store.commit(state.session_id, **arguments)
        except OutcomeUnknownError as unknown:
            error, uid = await _resolve(state, arguments, unknown)
        except Exception as failure:
            error = failure
        finally:
            state.end_commit()
        if uid != state.uid and error is None:
            # The store named another identity than the one noted (or the first one).
            elsewhere = state.committed_to(
                uid, batch.base.count, range(batch.base.count, batch.log.count)
            )
            if elsewhere is not None:
                follower.deleted(elsewhere)
                error = elsewhere
        if error is not None:
            # The batch never happened: its events leave the log's shared storage, so
            # catching up (or the next batch) extends it instead of copying it.
            batch.base.give_back(batch.log)
            if isinstance(error, ConflictError):
                # Another writer is ahead: read what it wrote.
                unreadable = await follower.reload(None)
                if unreadable is not None:
                    error = unreadable  # the callers must hear what blocks them
                else:
                    if erases(state.published.log.since(batch.base.count)):
                        batch = _refuse_copies(state, batch)
                    # Every request again, those a key answered too (nothing answered them).
                    again = [request for request, _ in (*batch.known, *batch.applied)]
                    retry = may_retry(again)
                    if len(retry) == len(again):
                        return again
                    if retry:
                        # The others' preconditions failed; these have none of their caller's
                        # (plain appends, a compaction's result) and go again on their own.
                        going = {id(request) for request in retry}
                        batch = batch._replace(
                            known=[pair for pair in batch.known if id(pair[0]) not in going],
                            applied=[pair for pair in batch.applied if id(pair[0]) not in going],
                        )
                    # A key the store had already (an earlier attempt whose outcome was
                    # unknown landed, say) is answered as a lone retry would be: with the
                    # events first committed under it.
                    applied = []
                    for request, result in batch.applied:
                        key = request.key if isinstance(request, Append) else None
                        answer = None if key is None else state.keyed_events(key)
                        if answer is None:
                            applied.append((request, result))
                        else:
                            batch.known.append((request, answer))
                    batch = batch._replace(applied=applied)
            state.answer(batch.known)
            if isinstance(error, OutcomeUnknownError):
                _unknown(state, batch.applied, error)
            else:
                state.fail(batch.applied, error, expected_count=batch.base.count)
            return retry
        for key, first, size in batch.keys:
            state.keys[key] = (first, size)
        for seq in arguments.get("kept", ()):
            state.kept[seq] = batch.base.since(seq)[0]
        state.publish(batch.log, events=len(events), dropped=len(batch.dropped))
    state.acknowledge([*batch.known, *batch.applied], batch.log, rebuilt=batch.rebuilt)
    return []


def _refuse_copies(state: SessionState, batch: Segment) -> Segment:
    """The segment lost to an erasure's commit: its requests whose content their callers
    made from the session as it was (a replace's messages) fail with a ConflictError, and
    only the others go again (on the erased log)."""
    applied = []
    for request, result in batch.applied:
        if request.copies_content():
            request.fail(
                ConflictError(
                    f"session {state.session_id!r}: events were erased since this was planned,"
                    " and it may copy what they said; nothing was written. Read the session"
                    " again and plan it on the erased events"
                )
            )
        else:
            applied.append((request, result))
    return batch._replace(applied=applied)


def _unknown(
    state: SessionState, applied: Sequence[tuple[Request[Any], Any]], error: OutcomeUnknownError
) -> None:
    """The store could not say whether the commit landed: every caller hears exactly that
    (never a StoreError, which would say nothing was appended)."""
    state.logger.debug("nous_session.commit_outcome_unknown", requests=len(applied))
    for request, _ in applied:
        copy = OutcomeUnknownError(*error.args)
        copy.__cause__ = error
        request.fail(copy)


async def _resolve(
    state: SessionState, arguments: dict[str, Any], unknown: OutcomeUnknownError
) -> tuple[BaseException | None, object]:
    """Find out whether a commit whose outcome is unknown landed: no error if it did, else the
    error to give its callers; and the session's identity when the attempt that landed
    returned it (the first attempt's, found by its commit id, is not known: None).

    The commit is sent again, commit id and all, until an answer is definite. The id is
    unique in the session, so of the two attempts exactly one can land: a second attempt that
    lands means the first never will; one that conflicts means the first landed if the store
    has its commit id, else that another writer got there first. After ``RESOLVE_FOR``
    seconds without an answer the callers get the OutcomeUnknownError (not a StoreError:
    they may retry with their idempotency keys).
    """
    landed = await settle(state, arguments, unknown, state.store.commit)
    if landed is _Outcome.NOT_LANDED:
        return ConflictError(
            f"session {state.session_id!r}: the commit did not land; while the store was"
            " out of reach, another writer committed at the same count (nothing of this"
            " call was appended)"
        ), None
    if landed is _Outcome.UNKNOWN:
        return unknown, None
    return None, None if isinstance(landed, _LandedBefore) else landed


async def settle(
    state: SessionState,
    arguments: dict[str, Any],
    unknown: OutcomeUnknownError,
    send: Callable[..., Awaitable[AnswerT]],
) -> AnswerT | _LandedBefore | _Outcome:
    """Send a commit again until its outcome is known: the store's answer if the resend
    landed, :class:`_LandedBefore` (the first attempt did), or ``_Outcome.NOT_LANDED`` or
    ``UNKNOWN``."""
    state.logger.info("nous_session.commit_outcome_unknown", error=str(unknown))
    commit_id = arguments.get("commit_id")
    store = state.store
    if commit_id is None or not supports(store, OutcomeStore):
        return _Outcome.UNKNOWN
    delay = 0.01
    with anyio.move_on_after(RESOLVE_FOR):
        while True:
            try:
                answer = await send(state.session_id, **arguments)
            except ConflictError:
                try:
                    found = await store.committed(state.session_id, commit_id)
                except StoreError as error:
                    state.logger.debug("nous_session.commit_outcome_retry", error=repr(error))
                else:
                    state.logger.info(
                        "nous_session.commit_outcome_resolved", landed=found is not None
                    )
                    if found is None:
                        return _Outcome.NOT_LANDED
                    return _LandedBefore(*found)
            except (OutcomeUnknownError, StoreError) as error:
                state.logger.debug("nous_session.commit_outcome_retry", error=repr(error))
            else:
                state.logger.info("nous_session.commit_outcome_resolved", landed=True)
                return answer
            await anyio.sleep(delay)
            delay = min(delay * 2, 1.0)
    return _Outcome.UNKNOWN


async def commit_rebased(
    state: SessionState, follower: Follower, requests: list[Append], *, final: bool
) -> list[Request[Any]]:
    """Commit a segment of plain appends after whatever the store holds, then publish.

    Returns the requests to apply again when the segment met a conflict (an idempotency key
    another writer had taken, say) and the follower caught up, unless it was the ``final``
    attempt, when its callers get the ConflictError; empty when every caller is answered.

    The events are made for the seqs after the published log but not appended to it: if
    other writers got there first they move, and the log then takes the others' events and
    ours in one extend (appending ours first would leave the log's shared storage holding
    events that never happened, and the extend would have to copy it).
    """
    if state.unfollowable is not None:
        for request in requests:
            request.fail(store_error(state.unfollowable))
        return []
    base = state.published.log
    seq = base.count
    events: list[Event] = []
    known: list[tuple[Request[Any], Any]] = []  # answered from an earlier commit's key
    made_for: list[tuple[Append, int, int]] = []  # (request, offset in events, size)
    repeats: list[tuple[Append, str]] = []  # a key an earlier request of the batch has
    keyed: dict[str, tuple[int, int]] = {}
    for request in requests:
        key = request.key
        if key is not None:
            answer = state.keyed_events(key)
            if answer is not None:
                known.append((request, answer))
                continue
            if key in keyed:
                repeats.append((request, key))
                continue
        try:
            made = [
                make_event(seq + offset, event_type, data, time, decoded=True)
                for offset, (event_type, data, time) in enumerate(request.items)
            ]
        except InvalidEventError as error:
            request.fail(error)
            continue
        if key is not None:
            keyed[key] = (seq, len(made))
        made_for.append((request, len(events), len(made)))
        events.extend(made)
        seq += len(made)
    if not events:
        state.answer(known)
        return []
    arguments: dict[str, Any] = {
        "expected_count": base.count,
        "events": events,
        "keys": [(key, first, size) for key, (first, size) in keyed.items()],
    }
    if state.name_commits:
        arguments["commit_id"] = state.commit_ids()
    uid = state.uid
    if uid is not None and base.count and state.checks_uid:
        arguments["expected_uid"] = uid  # see SessionState.checks_uid
    waiting: list[tuple[Request[Any], Any]] = [(request, None) for request, _, _ in made_for]
    waiting.extend((request, None) for request, _ in repeats)
    if state.abort_requested:  # see SessionState.begin_commit
        await anyio.lowlevel.checkpoint()  # the work scope is cancelled: raises here
    state.begin_commit()
    try:
        rebased = await _send_rebased(state, arguments)
    except Exception as error:
        state.end_commit()
        failure: BaseException = error
        if isinstance(error, ConflictError):
            unreadable = await follower.reload(None)
            if unreadable is None and not final:
                return [*requests]
            failure = unreadable or error
        elif isinstance(error, CorruptRecordError):
            # What the others wrote cannot be read (and our batch may have landed after it):
            # another rebasing commit would meet the same record, so stop writing.
            state.unfollowable = error
        state.answer(known)
        if isinstance(failure, OutcomeUnknownError):
            _unknown(state, waiting, failure)
        else:
            state.fail(waiting, failure, expected_count=base.count)
        return []
    if not isinstance(rebased, _LandedBefore) and rebased.uid != state.uid:
        # The store named another identity than the one noted (or the first one).
        placed = rebased.events
        elsewhere = state.committed_to(
            rebased.uid, base.count, range(placed[0].seq, placed[-1].seq + 1)
        )
        if elsewhere is not None:
            state.end_commit()
            follower.deleted(elsewhere)
            state.answer(known)
            state.fail(waiting, elsewhere, expected_count=base.count)
            return []
    if isinstance(rebased, _LandedBefore):
        # An unknown outcome that turned out to have landed, at the seqs the store recorded
        # for the commit id; the catch-up brought the batch into the log.
        await follower.reload(None)
        log = state.published.log
        stored = list(log.since(rebased.first)[: len(events)])
        rebuilt = False
    elif rebased.horizon != base.horizon or erases(rebased.others):
        # Another writer's snapshot dropped events this log still holds, or an erasure
        # changed some: read it all again (the batch with it) rather than extend a history
        # that no longer is.
        state.batches += 1
        await follower.reload(None)
        log = state.published.log
        stored = list(rebased.events)
        rebuilt = True
    else:
        # Other writers' events (if any) go before ours; every caller hears the seqs its
        # events were stored at.
        log = base.extend([*rebased.others, *rebased.events])
        state.keys.update(rebased.keys)
        for key, (first, size) in keyed.items():
            state.keys[key] = (first + rebased.shift, size)
        state.publish(log, events=len(events), dropped=0, shift=rebased.shift)
        stored = list(rebased.events)
        rebuilt = any(event.op is not None for event in rebased.others)
    # The batch landed: its callers hear so before an abort stops the actor (the catch-ups
    # above are part of learning where it landed).
    state.end_commit()
    answers: dict[int, tuple[Event, ...]] = {}
    results: list[tuple[Request[Any], Any]] = list(known)
    for request, offset, size in made_for:
        answers[id(request)] = tuple(stored[offset : offset + size])
        results.append((request, answers[id(request)]))
    by_key = {request.key: answers[id(request)] for request, _, _ in made_for if request.key}
    results.extend((request, by_key[key]) for request, key in repeats)
    state.acknowledge(results, log, rebuilt=rebuilt)
    return []


async def _send_rebased(state: SessionState, arguments: dict[str, Any]) -> Rebased | _LandedBefore:
    """A rebasing commit, or where it landed when its outcome was unknown at first."""
    # The engine sends a rebasing commit only to a store that supports(.., RebasingStore).
    send = cast(RebasingStore, state.store).commit_rebased
    try:
        return await send(state.session_id, **arguments)
    except OutcomeUnknownError as unknown:
        answer = await settle(state, arguments, unknown, send)
        if answer is _Outcome.NOT_LANDED:
            raise ConflictError(
                f"session {state.session_id!r}: the rebasing commit did not land"
            ) from unknown
        if answer is _Outcome.UNKNOWN:
            raise
        return answer
