"""Retention: delete or snapshot sessions by age or inactivity.

:func:`apply` selects the sessions of a :class:`~nous_session.stores.base.ListingStore` idle for
longer than ``idle_for`` (no commit appended events since) and/or created longer ago than
``older_than``, and, unless it is a dry run (the default), acts on each:

* ``action="delete"`` deletes it with :meth:`~nous_session.stores.base.ListingStore.delete_idle`,
  which checks, in the deleting transaction, that the session's count and last-active time
  are still what the selection saw: a session written to by another process since is kept.
* ``action="snapshot"`` opens it and drops what its surface no longer needs
  (:meth:`~nous_session.actor.SessionActor.snapshot`), unless it was written to since the
  selection; the snapshot's commit is itself conditional on the count it read. A snapshot
  appends no event, so it does not make the session active.

A dry run reads only: it creates and changes nothing, and reports what would be done.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import attrs

from nous_session.errors import ConflictError
from nous_session.listing import SessionEntry
from nous_session.stores.base import ListingStore, Store, supports

__all__ = ["RetentionReport", "apply", "parse_duration"]

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(text: str) -> timedelta:
    """``"90d"``, ``"12h"``, ``"30m"``, ``"45s"`` or ``"2w"`` as a timedelta.

    Raises:
        ValueError: naming the text and the units understood.
    """
    if not isinstance(text, str) or len(text) < 2 or text[-1] not in _UNITS:
        raise ValueError(
            f"a duration is a whole number and a unit (s, m, h, d, w), like 90d; got {text!r}"
        )
    number = text[:-1]
    if not number.isdigit() or not number.isascii():
        raise ValueError(f"a duration is a whole number and a unit, like 90d; got {text!r}")
    try:
        return timedelta(seconds=int(number) * _UNITS[text[-1]])
    except OverflowError:
        raise ValueError(f"a duration is at most {timedelta.max.days} days; got {text!r}") from None


@attrs.frozen
class RetentionReport:
    """What :func:`apply` found and did.

    Attributes:
        action: ``"delete"`` or ``"snapshot"``.
        dry_run: True when nothing was done.
        selected: the sessions the policy selected, oldest activity first.
        done: how many were deleted or snapshotted (0 on a dry run).
        kept: how many were kept because they were written to after the selection, or were
            gone by the time their turn came.
        dropped_events: events a snapshot dropped, in total (0 for deletes).
    """

    action: str
    dry_run: bool
    selected: tuple[SessionEntry, ...]
    done: int = 0
    kept: int = 0
    dropped_events: int = 0


def _cut_off(name: str, value: timedelta | None, now: datetime) -> datetime | None:
    """``now - value``, or a ValueError naming ``name`` when that is before year 1."""
    if value is None:
        return None
    try:
        return now - value
    except OverflowError:
        raise ValueError(
            f"{name} is too long: {now.isoformat()} minus {value.days} days is before year 1"
        ) from None


def _duration(name: str, value: object) -> timedelta | None:
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = parse_duration(value)
        except ValueError as error:
            raise ValueError(f"{name}: {error}") from None
    if not isinstance(value, timedelta) or value <= timedelta(0):
        raise ValueError(
            f"{name} must be a positive timedelta or a duration like 90d, got {value!r}"
        )
    return value


async def apply(
    store: Store,
    *,
    idle_for: timedelta | str | None = None,
    older_than: timedelta | str | None = None,
    action: Literal["delete", "snapshot"] = "delete",
    dry_run: bool = True,
    where: Mapping[str, Any] | None = None,
    tags: Iterable[str] = (),
    now: datetime | None = None,
    progress: Callable[[int, int], Awaitable[None] | None] | None = None,
) -> RetentionReport:
    """Apply a retention policy to ``store``: select, then (unless ``dry_run``) act.

    Args:
        store: a :class:`~nous_session.stores.base.ListingStore` (every built-in store).
        idle_for: select sessions whose last appending commit is older than this.
        older_than: select sessions created longer ago than this. With both, a session must
            match both; at least one is required.
        action: ``"delete"`` the session, or ``"snapshot"`` it (drop what its surface no
            longer needs; the session stays).
        dry_run: only report what would be done (the default): nothing is written.
        where, tags: narrow the selection as :meth:`ListingStore.list_sessions` does.
        now: the policy's clock (default: now); the cut-offs are ``now - idle_for`` and
            ``now - older_than``.
        progress: called with (done, total) after each session acted on (sync or async).

    Returns:
        A :class:`RetentionReport`.

    Raises:
        ValueError: a bad argument (nothing was done).
        StoreError: the store failed; the sessions acted on before stay done, and a note on
            the error (as on a cancellation) says how many were done and kept.
    """
    idle = _duration("idle_for", idle_for)
    old = _duration("older_than", older_than)
    if idle is None and old is None:
        raise ValueError("a retention policy needs idle_for, older_than or both")
    if action not in ("delete", "snapshot"):
        raise ValueError(f'action must be "delete" or "snapshot", got {action!r}')
    if not isinstance(dry_run, bool):
        raise ValueError(f"dry_run must be a bool, got {dry_run!r}")
    if now is None:
        now = datetime.now(UTC)
    elif not isinstance(now, datetime) or now.tzinfo is None:
        raise ValueError(f"now must be a timezone-aware datetime, got {now!r}")
    if progress is not None and not callable(progress):
        raise ValueError(f"progress must be a function or None, got {progress!r}")
    active_before = _cut_off("idle_for", idle, now)
    created_before = _cut_off("older_than", old, now)
    if not supports(store, ListingStore):
        raise ValueError(f"retention needs a store that lists sessions by time; {store!r} does not")
    listing = store
    selected: list[SessionEntry] = []
    cursor: str | None = None
    while True:
        page = await listing.list_sessions(
            where=where,
            tags=tags,
            active_before=active_before,
            created_before=created_before,
            order="active",
            descending=False,
            limit=1000,
            cursor=cursor,
        )
        selected.extend(page.sessions)
        cursor = page.cursor
        if cursor is None:
            break
    if dry_run:
        return RetentionReport(action, True, tuple(selected))
    done = kept = dropped = 0
    try:
        for index, entry in enumerate(selected, 1):
            if action == "delete":
                acted = await listing.delete_idle(
                    entry.session_id, count=entry.count, active=entry.active
                )
            else:
                acted, gone = await _snapshot(store, entry)
                dropped += gone
            if acted:
                done += 1
            else:
                kept += 1
            if progress is not None:
                result = progress(index, len(selected))
                if inspect.isawaitable(result):  # a plain function's value is not ours to await
                    await result
    except BaseException as error:
        # A store error, a cancellation: what was done stays done; say how far it got.
        verb = "deleted" if action == "delete" else "snapshotted"
        error.add_note(
            f"retention stopped with {done + kept} of the {len(selected)} selected sessions"
            f" handled: it had {verb} {done} and kept {kept}; a second run does the rest"
        )
        raise
    return RetentionReport(action, False, tuple(selected), done, kept, dropped)


async def _snapshot(store: Store, entry: SessionEntry) -> tuple[bool, int]:
    """Snapshot one selected session unless it was written to since: (done, events dropped)."""
    from nous_session.actor import SessionActor  # the actor sits above the stores

    async with SessionActor.open(session_id=entry.session_id, store=store, follow=False) as session:
        before = session.log
        if before.count != entry.count:
            return False, 0  # written to (or deleted) since the selection: kept as it is
        try:
            after = await session.snapshot()
        except ConflictError:
            return False, 0  # written to between the check and the snapshot's commit
    return True, len(before.events()) - len(after.events())
