"""The store contract: how a SessionActor persists its log.

A store holds many sessions. Each session is its held events, in seq order; its count (1 + the
highest seq ever committed, never lowered); its horizon (the count at its last snapshot that
dropped events, 0 when none); the idempotency keys its callers committed with; and, for a fork,
its parent and fork point. The actor is the only thing that calls ``commit`` for a session in a
process; the ``expected_count`` check is what stops two actors (in one process or many) from
both extending a session.

``Store`` is what every store implements. The optional capabilities are Protocols of their own,
found on a store's class with :func:`supports`: :class:`RebasingStore` (append after whatever
the session holds), :class:`ForkingStore` (fork without copying), :class:`OutcomeStore` (find
out whether a commit with an unknown outcome landed), :class:`ChangeFeedStore` and
:class:`FollowingStore` (other processes' commits, live), :class:`VacuumingStore`,
:class:`ListingStore` (sessions by metadata and time, a page at a time), :class:`ErasingStore`
(erase events' content provably).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import AsyncGenerator, Callable, Iterable, Mapping, Sequence
from datetime import datetime
from operator import attrgetter
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final, Protocol, TypeGuard, TypeVar, runtime_checkable

import attrs

from nous_session.errors import CorruptRecordError
from nous_session.event import Event
from nous_session.listing import SessionPage
from nous_session.metadata import bounded_text

if TYPE_CHECKING:
    from nous_session.erasure import Erasure

__all__ = [
    "MAX_KEY_BYTES",
    "MAX_SESSION_ID_BYTES",
    "ChangeFeedStore",
    "ErasingStore",
    "FollowingStore",
    "ForkingStore",
    "LeasingStore",
    "ListingStore",
    "OutcomeStore",
    "Rebased",
    "RebasingStore",
    "SessionInfo",
    "Store",
    "Stored",
    "VacuumingStore",
    "check_commit_arguments",
    "check_commit_state",
    "check_fork_point",
    "check_held",
    "check_key",
    "check_lease",
    "check_rebase_arguments",
    "check_session_id",
    "check_since",
    "moved",
    "moved_keys",
    "place",
    "supports",
]

MAX_SESSION_ID_BYTES: Final = 256
"""The longest session id, in UTF-8 bytes, that every store takes."""

MAX_KEY_BYTES: Final = 256
"""The longest idempotency key, in UTF-8 bytes."""

_NO_KEYS: Final[Mapping[str, tuple[int, int]]] = MappingProxyType({})
_SEQ: Final[Callable[[Any], int]] = attrgetter("seq")
T = TypeVar("T")


@attrs.frozen
class SessionInfo:
    """One stored session.

    Attributes:
        session_id: its id.
        count: the next seq.
        held: how many events it holds (a fork's included: those it shares with its parent).
        horizon: the count at its last snapshot that dropped events (0: none did).
        parent: the session it was forked from, or None.
        fork_point: the last seq of the parent's history it took, or None.
    """

    session_id: str
    count: int
    held: int
    horizon: int = 0
    parent: str | None = None
    fork_point: int | None = None


@attrs.frozen
class Stored:
    """What a store holds of one session, read in one consistent step (:meth:`Store.read`).

    Attributes:
        events: the held events with seq >= the ``since`` asked for, in seq order.
        count: the session's count (0 for an unknown session).
        horizon: its horizon.
        keys: the idempotency keys committed with events at seq >= ``since``: each key's first
            seq and how many events its call appended. A fork's include its parent's (and
            theirs) whose events are all at or before the fork point.
        kept: events of idempotency keys that a snapshot dropped, kept aside so a retry with
            the key still gets them (read with ``since=0`` only; empty otherwise); a fork's
            include its parent's up to the fork point.
        parent: the session it was forked from, or None.
        fork_point: the last seq of the parent's history it took, or None.
        uid: the session's identity, made when it was created: a session deleted and made
            again under the same id has another. None for an unknown session, or from a store
            that keeps none. Not compared by ``==`` (two stores holding the same session give
            it different ones).
    """

    events: Sequence[Event]
    count: int
    horizon: int = 0
    keys: Mapping[str, tuple[int, int]] = _NO_KEYS
    kept: Sequence[Event] = ()
    parent: str | None = None
    fork_point: int | None = None
    uid: str | None = attrs.field(default=None, eq=False)


@runtime_checkable
class Store(Protocol):
    """What a SessionActor needs from persistence.

    Every method may be called from any task; implementations serialise what needs it.

    A store whose class sets ``checks_uid = True`` (every built-in one) takes one more
    keyword argument in :meth:`commit` and :meth:`RebasingStore.commit_rebased`,
    ``expected_uid``: when it is given (a str), the commit happens only if the session
    exists and its identity (:attr:`Stored.uid`) is that one; a session deleted since, made
    again under its id or not, is a conflict (ConflictError; nothing was written). The
    SessionActor sends it once it has seen events of the session, so that its commits never
    go into a session another holder deleted and made again. A store without the attribute is
    never sent it (the contract's earlier versions have no such argument).
    """

    async def load(self, session_id: str, *, since: int = 0) -> Sequence[Event]:
        """The session's held events with seq >= ``since``, in seq order.

        An unknown session is empty (``[]``), not an error.

        Raises:
            ValueError: ``since`` is not an int >= 0.
            StoreError: the store could not be read.
            CorruptRecordError: a stored record could not be decoded (it names the record),
                or a row from ``max(since, horizon)`` up to ``count - 1`` is missing, or one
                lies at or past the count (it names the seqs; see :func:`check_held`).
        """
        ...

    async def read(self, session_id: str, *, since: int = 0) -> Stored:
        """Everything :class:`Stored` names, for the events with seq >= ``since``, as of one
        moment (another process's commit is wholly in it or wholly out).

        An unknown session reads as empty with count 0.

        Raises:
            ValueError: ``since`` is not an int >= 0.
            StoreError: the store could not be read.
            CorruptRecordError: a stored record could not be decoded (it names the record),
                or rows are missing or misplaced (as for :meth:`load`).
        """
        ...

    async def commit(
        self,
        session_id: str,
        *,
        expected_count: int,
        events: Sequence[Event],
        dropped: Sequence[int] = (),
        expected_horizon: int | None = None,
        horizon: int | None = None,
        keys: Sequence[tuple[str, int, int]] = (),
        kept: Sequence[int] = (),
        commit_id: str | None = None,
    ) -> str | None:
        """Write ``events`` and delete the ``dropped`` seqs in one atomic, durable step.

        Returns only once the step is durable (as durable as the store promises), with the
        identity of the session it committed to: the :attr:`Stored.uid` a read of the session
        gives right after (the one the commit made, when it created the session), or None
        from a store that keeps none (as a store written for an earlier contract does). A
        SessionActor that created its session learns its identity so, with no read; from then
        on it tells a session deleted and made again under the same id (by another holder)
        from its own (see ``expected_uid`` in the class's doc).

        A store never holds a session it could not open again: every held event from the
        horizon up to ``count - 1`` is there. So a commit must leave it that way, and one
        that would not is malformed (a ValueError, before anything is written):

        * ``events`` have strictly increasing seqs, contiguous from ``expected_count``: the
          session's count becomes ``expected_count + len(events)`` (unchanged when
          ``events`` is empty). Only a commit that sets a ``horizon`` may leave gaps (an
          import of a snapshotted history), and only below that horizon: the count is then
          1 + the highest seq written.
        * ``horizon``, when given, is at least the session's horizon (``expected_horizon``
          when given, else the stored one) and at most the new count.
        * ``dropped`` seqs are below ``expected_count`` and below the session's horizon after
          the commit (the new ``horizon``, else the stored one); ``kept`` is a subset of
          ``dropped``. (A commit that drops seqs and names neither ``horizon`` nor
          ``expected_horizon``, as a caller of the first Store contract does, moves the
          horizon to one past the highest seq it drops, if it is not there already.)
        * every key names at least one event, and all its seqs ``first .. first + size - 1``
          are among ``events``.

        Args:
            session_id: the session.
            expected_count: the count the caller's log has; the commit happens only if the
                stored count is this.
            events: the new events.
            dropped: seqs (below ``expected_count``) to delete: a snapshot's.
            expected_horizon: when given, the commit happens only if the stored horizon is
                this (another writer's snapshot since makes it a conflict).
            horizon: the session's new horizon (a snapshot's), when it changes.
            keys: idempotency keys committed with this step: ``(key, first seq, count of
                events)``; a key the session already has is a conflict.
            kept: the dropped seqs whose events belong to a key: kept aside (see
                :attr:`Stored.kept`) instead of deleted outright.
            commit_id: a name for this step, unique in the session, recorded with it so that
                :meth:`OutcomeStore.committed` can tell afterwards whether it landed.

        Raises:
            ValueError: the arguments are malformed, or would leave a session that cannot be
                opened (see above); nothing was written. A conflict is reported first: a
                check that needs the stored horizon is made only once the count (and
                horizon) matched.
            ConflictError: the session's stored count (or horizon) is not the expected one
                (another writer got there first), or a key is already taken; nothing was
                written.
            OutcomeUnknownError: the store lost contact during the step, so it may or may not
                have landed (a store that can raise this should be an :class:`OutcomeStore`).
            StoreError: any other failure; nothing was written.
        """
        ...

    async def sessions(self) -> list[SessionInfo]:
        """Every session with a nonzero count, sorted by id.

        Raises:
            StoreError: the store could not be read.
        """
        ...

    async def delete(self, session_id: str) -> bool:
        """Delete a session and all its events at once; True when it existed.

        Forks of it keep their history (they are given their own copy of what they share).

        Raises:
            StoreError: the store could not be written.
        """
        ...

    async def aclose(self) -> None:
        """Release the store's resources. Idempotent; later calls raise StoreError."""
        ...


@attrs.frozen
class Rebased:
    """What :meth:`RebasingStore.commit_rebased` did.

    Attributes:
        shift: how far the events moved: each was stored at its seq + ``shift`` (0 when no
            other writer had committed since ``expected_count``).
        others: the events other writers had stored from ``expected_count`` up to where
            these landed, in seq order (fewer than ``shift`` when a snapshot dropped some).
        events: the events as stored, at their new seqs.
        keys: the idempotency keys the other writers committed in between.
        horizon: the session's horizon: when another writer's snapshot moved it, the caller's
            copy of the history may hold events that are gone, and must be read again.
        uid: the identity of the session the events went into, as :meth:`Store.commit`
            returns it (None: the store keeps none). Not compared by ``==``.
    """

    shift: int
    others: Sequence[Event]
    events: Sequence[Event]
    keys: Mapping[str, tuple[int, int]] = _NO_KEYS
    horizon: int = 0
    uid: str | None = attrs.field(default=None, eq=False)


@runtime_checkable
class RebasingStore(Store, Protocol):
    """A store that can append a batch after whatever the session holds, in one step.

    Optimistic concurrency (``commit`` with ``expected_count``) makes the loser of a race
    redo its work; when many processes append to one session most of that work is thrown
    away. A rebasing commit lets the store serialise the writers instead: it takes the
    session's current count under its own lock, stores the batch right after it and returns
    what the other writers had stored in between, so nothing is retried. The actor uses it
    with ``on_conflict="rebase"`` for batches whose meaning does not depend on their seqs
    (plain appends: no surface op, no snapshot).
    """

    async def commit_rebased(
        self,
        session_id: str,
        *,
        expected_count: int,
        events: Sequence[Event],
        keys: Sequence[tuple[str, int, int]] = (),
        commit_id: str | None = None,
    ) -> Rebased:
        """Append ``events`` after the session's current count in one atomic, durable step.

        ``events`` are non-empty with contiguous seqs from ``expected_count``. With the
        stored count ``c >= expected_count``, each is stored at its seq + ``c -
        expected_count`` and the count becomes ``c + len(events)``; ``keys`` and ``commit_id``
        are as for :meth:`Store.commit` (every key within ``events``), their seqs moved with
        the events. The :class:`Rebased` it returns names the session's identity as
        :meth:`Store.commit` does.

        A rebase never writes past a hole: when the session is missing a row between its
        horizon and its count ``c`` (the count moved with no row written, a row deleted by
        hand), appending at ``c`` would bury the hole in the middle of the history, so the
        commit is refused.

        Raises:
            ValueError: the arguments are malformed (as for ``commit``, and the seqs must be
                contiguous); nothing was written.
            ConflictError: the stored count is below ``expected_count`` (the session was
                deleted, or the caller is ahead of this store), or a key is already taken;
                nothing was written.
            CorruptRecordError: the session is missing rows between its horizon and its
                count (the error names them); nothing was written. Or a record stored in
                between cannot be decoded. A store may
                read those records after its commit (PostgresStore does, so as not to hold
                the session's lock while decoding); its message then says the batch was
                committed, and where. A SessionActor stops writing after this error.
            StoreError: any other failure; nothing was written.
        """
        ...


@runtime_checkable
class ForkingStore(Store, Protocol):
    """A store that forks a session without copying its history."""

    async def fork(self, session_id: str, new_session_id: str, *, at: int) -> None:
        """Make ``new_session_id`` a new session whose history is ``session_id``'s up to and
        including seq ``at``, sharing it instead of copying it (the cost does not grow with
        the history). The new session records its parent and fork point; later commits to
        either never show in the other; a snapshot or delete of the parent leaves it whole.
        It answers the parent's idempotency keys whose events are all at or before ``at``
        (and their kept events), shared as the history is: a retry in the fork of a call made
        in the parent before the fork appends nothing.

        Raises:
            ValueError: ``at`` is not in ``horizon - 1 .. count - 1`` of the parent, the
                parent does not exist, or ``new_session_id`` already does.
            StoreError: the store could not be written.
        """
        ...


@runtime_checkable
class OutcomeStore(Store, Protocol):
    """A store that can tell whether a commit whose outcome was unknown landed after all.

    A store whose class sets ``outcome_may_be_unknown = True`` (it can lose a commit's reply:
    PostgreSQL over a network) is sent a commit id with every commit by the SessionActor, which
    then resolves an unknown outcome itself. Other stores may record commit ids they are given,
    but are not sent one (it would cost a row per commit for nothing).
    """

    outcome_may_be_unknown: bool

    async def committed(self, session_id: str, commit_id: str) -> tuple[int, int] | None:
        """Where the commit named ``commit_id`` landed: its first seq and how many events it
        wrote, or None when it did not land and never will (a commit still in flight is
        waited for).

        Raises:
            StoreError: the store could not be read (the outcome is still unknown).
        """
        ...


@runtime_checkable
class ChangeFeedStore(Store, Protocol):
    """A store that tells when a session's head moves, whichever process committed."""

    def watch(self, session_id: str) -> AsyncGenerator[int, None]:
        """Yield the session's new head whenever a commit lands, and ``-1`` when the feed
        (re)connects or the session is deleted (whatever happened meanwhile must be read
        then: a reader finds the session's count went down, or its identity changed). A
        delete of the session by any process is yielded as promptly as a commit. Runs until
        closed.

        Raises:
            StoreError: the feed cannot be set up at all.
        """
        ...


@runtime_checkable
class FollowingStore(Store, Protocol):
    """A store that streams a session's committed events natively (a change feed)."""

    def follow(self, session_id: str, *, since: int = 0) -> AsyncGenerator[Event, None]:
        """Yield the session's events from ``since`` on, then each one committed later by any
        process, in seq order and at most once. Runs until closed.

        Raises:
            SessionDeletedError: the session was deleted, or deleted and made again under its
                id (another identity, :attr:`Stored.uid`), while it was followed: the stream
                ends there, and never yields the new session's events as the old one's.
        """
        ...


@runtime_checkable
class ListingStore(Store, Protocol):
    """A store that lists sessions by their metadata and times, a page at a time.

    Each session's current metadata (the newest ``session_metadata`` event's record), its
    created time (its first commit) and its last-active time (its last commit that appended
    events; a snapshot that only drops events does not count) are kept beside it, written in
    the same transaction as the commit, by the store's clock. A store may keep the last-active
    time to the second (moving it only once it is a second behind), so that a busy session's
    commits do not each rewrite an index. A fork starts with its parent's
    metadata as of the fork point, and its own times.
    """

    async def list_sessions(
        self,
        *,
        where: Mapping[str, Any] | None = None,
        tags: Iterable[str] = (),
        created_since: datetime | None = None,
        created_before: datetime | None = None,
        active_since: datetime | None = None,
        active_before: datetime | None = None,
        order: str = "active",
        descending: bool = True,
        limit: int = 50,
        cursor: str | None = None,
    ) -> SessionPage:
        """One page of the sessions (with a nonzero count) that match, in order.

        Pagination is by key (the time ordered by, then the session id), never by offset: a
        page costs the same however deep it is, and sessions committed to between pages are
        neither skipped nor repeated unless their time moved across the cursor. SQLite and
        PostgreSQL answer an ``owner`` filter (with any order) and an unfiltered listing from
        an index, so the cost does not grow with the sessions that do not match; other
        filters narrow what that index yields. Reading never writes.

        Args:
            where: field -> value that must be equal: ``owner``, ``app``, ``title``, or any
                other key for a field of ``extra`` (a JSON scalar).
            tags: tags the session must all have.
            created_since, created_before, active_since, active_before: half-open time
                ranges (``since <= t < before``), timezone-aware.
            order: ``"active"`` (last activity) or ``"created"``.
            descending: newest first (the default).
            limit: the page size, 1..1000.
            cursor: the previous page's :attr:`~nous_session.listing.SessionPage.cursor`,
                with the same query.

        Raises:
            ValueError: an argument is bad, or the cursor belongs to another query.
            StoreError: the store could not be read.
        """
        ...

    async def delete_idle(self, session_id: str, *, count: int, active: datetime) -> bool:
        """Delete the session only if it is still as a listing saw it: its count is ``count``
        and its last-active time ``active``, checked in the deleting transaction (a session
        written to since is kept). Forks keep their history, as for :meth:`Store.delete`.

        Returns:
            True when it was deleted; False when it is gone or was written to.

        Raises:
            StoreError: the store could not be written.
        """
        ...


@runtime_checkable
class VacuumingStore(Store, Protocol):
    """A store that can give the space of deleted events back to the file system."""

    async def vacuum(self) -> None:
        """Reclaim the space deleted events took (after a snapshot).

        Raises:
            StoreError: the store could not do it.
        """
        ...


@runtime_checkable
class ErasingStore(Store, Protocol):
    """A store that can erase the content of stored events so that none of it remains."""

    async def erase(
        self,
        session_id: str,
        seqs: Iterable[int],
        *,
        reason: str,
        at: datetime | None = None,
        dry_run: bool = False,
        summaries: bool = True,
    ) -> Erasure:
        """Replace the events at ``seqs`` of the session by their erased form
        (:func:`~nous_session.erasure.erase_event`) wherever they are stored: in the session,
        in the session it was forked from when it shares them, and in every fork that holds
        them (the result names those sessions), including the copies kept aside for
        idempotency keys; and, with ``summaries``, the replace events that copy them (see
        :func:`~nous_session.erasure.covering`; the result lists them). Forks are found by
        the sessions' identities: a session made under a deleted parent's name shares
        nothing with the parent's forks.

        Each session whose content changed gets an ``erasure`` event (which seqs, when and
        why) at its count, in the same transaction: every holder of the session hears of it
        as of a commit (and reads the erased events again), and a commit planned on the
        session as it was before conflicts on the count. The horizon, the keys and every
        other event stay. Then scrub the space the old records took, and say in the result
        whether no copy can remain (``proven``).

        Args:
            session_id: the session.
            seqs: the events to erase (any order; repeats are ignored).
            reason: why, recorded in every erased event (not personal text).
            at: when, recorded (default: now).
            dry_run: change nothing; the result says what would be erased.
            summaries: erase the replace events that copy the erased events too (the
                default); False keeps them as they are.

        Raises:
            ValueError: a seq is not an int in ``0 .. count - 1``, the session does not
                exist, or the reason is malformed; nothing was changed.
            StoreError: the store failed; nothing was changed.
        """
        ...

    async def erase_session(
        self,
        session_id: str,
        *,
        reason: str,
        inherited: bool = False,
        dry_run: bool = False,
        summaries: bool = True,
    ) -> Erasure:
        """Erase every event the session wrote itself (for a fork: the events after its fork
        point) wherever it is still held: its own rows and kept events, and the copies its
        forks hold (a fork keeps what the session's own snapshot dropped). With
        ``inherited=True`` also those it took from the session it was forked from (which
        erases them there, and in that session's other forks). The seqs no session holds any
        more are listed under ``absent``; ``summaries`` as for :meth:`erase`.

        Raises:
            ValueError: the session does not exist, or the reason is malformed.
            StoreError: the store failed; nothing was changed.
        """
        ...


@runtime_checkable
class LeasingStore(Store, Protocol):
    """A store that can hand one holder at a time a named, expiring lease on a session.

    What one actor does for a session, with the session open in other actors and processes,
    takes turns through it: the compaction runner takes the ``"compaction"`` lease before it
    plans and calls the summarizer, so a fleet pays for each summary once. A lease is kept
    apart from the events (it is no part of the session's history) and expires by itself, so a
    holder that dies gives the turn up after ``ttl`` seconds at most.
    """

    async def lease(self, session_id: str, name: str, *, holder: str, ttl: float) -> bool:
        """Take the lease ``name`` on the session for ``holder`` for ``ttl`` seconds, or renew
        it when ``holder`` has it already.

        Returns:
            True when ``holder`` holds it now; False when another holder's lease has not
            expired.

        Raises:
            ValueError: a malformed session id, name or holder, or a ``ttl`` that is not a
                positive number.
            StoreError: the store failed; no lease was taken.
        """
        ...

    async def release(self, session_id: str, name: str, *, holder: str) -> None:
        """Give the lease up, when ``holder`` holds it (otherwise do nothing).

        Raises:
            StoreError: the store failed (the lease then expires by itself).
        """
        ...


def check_lease(session_id: str, name: str, holder: str, ttl: float = 1.0) -> float:
    """Check a lease call's arguments; returns ``ttl`` as a float.

    Raises:
        ValueError: naming the argument that is wrong.
    """
    check_session_id(session_id)
    for what, value in (("name", name), ("holder", holder)):
        if not isinstance(value, str) or not value or len(value) > 200:
            raise ValueError(f"a lease {what} must be a non-empty str of at most 200 characters")
    if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not 0 < ttl <= 86_400:
        raise ValueError(f"a lease ttl must be a number of seconds in (0, 86400], got {ttl!r}")
    return float(ttl)


def supports(store: object, capability: Callable[..., T]) -> TypeGuard[T]:
    """Whether ``store``'s class has every method the capability Protocol itself declares.

    Looked up on the class, not the instance: a wrapper store that passes unknown attributes
    through to another store (``__getattr__``) must not have its own ``commit`` bypassed by a
    capability the inner store has.

    A ``TypeGuard``: after ``if supports(store, ErasingStore):`` a type checker knows
    ``store.erase``. The capability is typed as a callable returning it, not ``type[...]``:
    mypy refuses a Protocol where a ``type[...]`` is expected.
    """
    key = (type(store), capability)
    found = _SUPPORTED.get(key)
    if found is None:  # answered once per class and capability: every actor asks a few times
        names = [
            name
            for name, value in vars(capability).items()
            if callable(value) and not name.startswith("_")
        ]
        found = _SUPPORTED[key] = bool(names) and all(
            callable(getattr(key[0], name, None)) for name in names
        )
    return found


_SUPPORTED: dict[tuple[type, object], bool] = {}


def moved(events: Sequence[Event], shift: int) -> list[Event]:
    """``events`` at their seq + ``shift`` (the same data, shared, and times)."""
    return [Event(e.seq + shift, e.type, e.data, e.time, e.op) for e in events]


def moved_keys(keys: Sequence[tuple[str, int, int]], shift: int) -> list[tuple[str, int, int]]:
    """``keys`` with their first seqs moved by ``shift`` (as their events were)."""
    return [(key, first + shift, size) for key, first, size in keys]


def check_since(since: object) -> None:
    """Refuse a ``since`` that is not an int >= 0 (a bool is no int here)."""
    if not isinstance(since, int) or isinstance(since, bool) or since < 0:
        raise ValueError(f"since must be an int >= 0, got {since!r}")


def place(session_id: str, where: str) -> Callable[[int], str]:
    """How a load names a stored record in an error: session, seq and file or schema."""
    return lambda seq: f"session {session_id!r} seq {seq} in {where}"


def check_session_id(session_id: object) -> str:
    """Refuse what cannot be a session id in every store.

    A session id is a non-empty string of valid Unicode (no lone surrogates: it must encode
    as UTF-8), without NUL characters (PostgreSQL text cannot hold one), of at most
    :data:`MAX_SESSION_ID_BYTES` UTF-8 bytes (what every store can index and notify).

    Raises:
        ValueError: naming what is wrong.
    """
    return bounded_text(session_id, "a session id", MAX_SESSION_ID_BYTES)


def check_key(key: object) -> str:
    """Refuse what cannot be an idempotency key: a non-empty string of valid Unicode, without
    NUL characters, of at most :data:`MAX_KEY_BYTES` UTF-8 bytes.

    Raises:
        ValueError: naming what is wrong.
    """
    return bounded_text(key, "an idempotency key", MAX_KEY_BYTES)


def check_fork_point(session_id: str, at: object, count: int, horizon: int) -> int:
    """Refuse a fork point outside what the parent's history can give: ``horizon - 1 <= at <
    count`` (and ``at >= 0``).

    Raises:
        ValueError: naming the range the parent's history covers.
    """
    if not isinstance(at, int) or isinstance(at, bool):
        raise ValueError(f"a fork point is an int seq, not {at!r}")
    low = max(0, horizon - 1)
    if not low <= at < count:
        raise ValueError(
            f"cannot fork {session_id!r} at seq {at}: its history reaches from {low} to"
            f" {count - 1}" + (f" (a snapshot set its horizon to {horizon})" if horizon else "")
        )
    return at


def _event_list(events: Iterable[Event]) -> list[Event]:
    """``events`` as a list (read once, so a generator works), each checked to be an Event."""
    listed = list(events)
    for index, event in enumerate(listed):
        if type(event) is not Event and not isinstance(event, Event):
            raise ValueError(f"commit events must be Events; item {index} is {event!r}")
    return listed


def check_commit_arguments(
    session_id: str,
    expected_count: int,
    events: Iterable[Event],
    dropped: Sequence[int],
    *,
    keys: Sequence[tuple[str, int, int]] = (),
    kept: Sequence[int] = (),
    commit_id: str | None = None,
    horizon: int | None = None,
    expected_horizon: int | None = None,
    expected_uid: str | None = None,
) -> list[Event]:
    """Refuse a commit that is malformed, or that would leave a session no store could open,
    before anything is written (shared by every backend; see :meth:`Store.commit`).

    What needs the stored horizon (when ``expected_horizon`` is not given) is left to
    :func:`check_commit_state`, which a store calls once it has read the session.

    Returns:
        ``events`` as a list, to write (an iterator is read once, here).

    Raises:
        ValueError: the session id is bad, an event is not an Event, the events' seqs are not
            increasing and contiguous from ``expected_count`` (a gap is allowed only below a
            ``horizon`` the commit sets), a horizon is malformed or outside ``old horizon ..
            new count``, a dropped seq is not below ``expected_count`` and the new horizon,
            a kept seq is not dropped, a key is malformed or its seqs are not among the
            events, or the commit id or the expected identity is malformed. The message
            names what is wrong.
    """
    check_session_id(session_id)
    if type(expected_count) is not int or expected_count < 0:
        raise ValueError(f"expected_count must be an int >= 0, got {expected_count!r}")
    if expected_uid is not None and (type(expected_uid) is not str or not expected_uid):
        _check_uid(expected_uid)  # raises
    if expected_horizon is not None and (type(expected_horizon) is not int or expected_horizon < 0):
        raise ValueError(f"expected_horizon must be None or an int >= 0, got {expected_horizon!r}")
    if horizon is not None and (type(horizon) is not int or horizon < 0):
        raise ValueError(f"horizon must be None or an int >= 0, got {horizon!r}")
    listed = _event_list(events)
    # Rows from the horizon to the count must all be there once the commit lands: a gap in
    # the new events may only lie below a horizon this commit sets.
    gaps_below = 0 if horizon is None else horizon
    previous = expected_count - 1
    for event in listed:
        seq = event.seq
        if seq != previous + 1:
            if seq <= previous:
                raise ValueError(
                    f"commit events must have increasing seqs from {expected_count};"
                    f" got {seq} after {previous}"
                )
            if seq > gaps_below:
                raise ValueError(
                    f"commit events must be contiguous from {expected_count}: seqs"
                    f" {_span(previous + 1, seq - 1)} are missing"
                    + (
                        " (only a commit that sets a horizon may leave gaps, below it)"
                        if horizon is None
                        else f" at or above the new horizon {horizon}"
                    )
                )
        previous = seq
    count = previous + 1 if listed else expected_count
    if expected_horizon is not None and expected_horizon > expected_count:
        raise ValueError(
            f"expected_horizon {expected_horizon} is past expected_count {expected_count}:"
            " no session has a horizon past its count"
        )
    if not (dropped or keys or kept or commit_id is not None or horizon is not None):
        return listed  # the common commit: only new events
    if horizon is not None:
        if horizon > count:
            raise ValueError(
                f"horizon {horizon} is past the count {count} this commit leaves: the session"
                " could not be opened again"
            )
        if expected_horizon is not None and horizon < expected_horizon:
            raise ValueError(
                f"horizon {horizon} would move the session's horizon back from {expected_horizon}"
            )
    # With neither horizon known here, check_commit_state checks the drops against the
    # stored one.
    below = horizon if horizon is not None else expected_horizon
    for seq in dropped:
        if type(seq) is not int or not 0 <= seq < expected_count:
            raise ValueError(f"a dropped seq must be an int below {expected_count}, got {seq!r}")
        if below is not None and seq >= below:
            raise ValueError(_hole(seq, below))
    if kept and not set(kept) <= set(dropped):
        raise ValueError(
            f"every kept seq must also be dropped; {sorted(set(kept) - set(dropped))} are not"
        )
    if keys:
        _check_keys(keys, listed)
    if commit_id is not None:
        _check_commit_id(commit_id)
    return listed


def check_commit_state(
    session_id: str,
    stored_horizon: int,
    *,
    dropped: Sequence[int] = (),
    horizon: int | None = None,
    expected_horizon: int | None = None,
) -> int | None:
    """Refuse what :func:`check_commit_arguments` could not judge without the stored horizon:
    a ``horizon`` that moves back, or a dropped seq at or above the horizon the session
    will have. A store calls it after its count (and horizon) checks passed, before writing.

    Returns:
        The horizon to store (None: unchanged). A commit that drops seqs naming neither
        horizon (the first Store contract's snapshot) gets the lowest horizon that explains
        its gaps, one past the highest seq it drops (what the schema migration from
        version 1 gives such a session).

    Raises:
        ValueError: naming the horizon and the seq.
    """
    if horizon is not None and horizon < stored_horizon:
        raise ValueError(
            f"session {session_id!r}: horizon {horizon} would move its horizon back from"
            f" {stored_horizon}"
        )
    if not dropped:
        return horizon
    highest = max(dropped)
    if horizon is None and expected_horizon is None:
        return max(stored_horizon, highest + 1)
    below = stored_horizon if horizon is None else horizon
    if highest >= below:
        raise ValueError(f"session {session_id!r}: {_hole(highest, below)}")
    return horizon


def _hole(seq: int, horizon: int) -> str:
    return (
        f"dropping seq {seq}, at or above the horizon {horizon}, would leave a hole the"
        " session could not be opened with (a snapshot drops only below its new horizon)"
    )


def _span(first: int, last: int) -> str:
    return str(first) if first == last else f"{first}..{last}"


def check_held(
    session_id: str,
    held: Sequence[T],
    *,
    count: int,
    horizon: int,
    since: int = 0,
    where: str = "",
    seq: Callable[[T], int] = _SEQ,
) -> None:
    """Refuse a read whose rows do not make a session: every seq from ``max(since,
    horizon)`` to ``count - 1`` must be held (a snapshot explains only the gaps below the
    horizon), and none at or past the count.

    Args:
        session_id: the session, for the message.
        held: what a load read with seq >= ``since``, in increasing seq order: Events, or
            a store's raw rows with ``seq`` saying how to find each one's seq (checked before
            decoding, so a broken session costs no decoding).
        count: the session's count.
        horizon: the session's horizon.
        since: where the load started.
        where: the file or schema, for the message.
        seq: the seq of an item of ``held`` (an Event's by default).

    O(log n) when the rows are whole: only a failing read looks at every seq.

    Raises:
        CorruptRecordError: naming the session, where it is and the missing (or stray) seqs.
    """
    low = max(since, horizon)
    start = bisect_left(held, low, key=seq)
    if len(held) - start == max(0, count - low) and (not held or seq(held[-1]) < count):
        return  # increasing, unique, within low..count-1 and as many as that range: whole
    at = f" in {where}" if where else ""
    seqs = [seq(item) for item in held]
    stray = [number for number in seqs if number >= count]
    if stray:
        raise CorruptRecordError(
            f"session {session_id!r}{at} holds rows past its count {count} (seqs"
            f" {_spans(stray)}): the count does not fit the rows"
        )
    present = set(seqs[start:])
    missing = [number for number in range(low, count) if number not in present]
    newest = f"its held events end at seq {seqs[-1]}" if seqs else "it holds no events"
    raise CorruptRecordError(
        f"session {session_id!r}{at}: its count is {count} and {newest}, but rows are missing:"
        f" seqs {_spans(missing)}"
        + (
            f" (its horizon is {horizon}: every seq from it up to the count must be held)"
            if horizon
            else " (no snapshot dropped any: every seq below the count must be held)"
        )
    )


def _spans(seqs: Sequence[int], *, most: int = 8) -> str:
    """Sorted seqs as ``1, 4..6``: a few runs, then how many more."""
    runs: list[tuple[int, int]] = []
    for seq in seqs:
        if runs and seq == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], seq)
        else:
            runs.append((seq, seq))
    shown = ", ".join(_span(first, last) for first, last in runs[:most])
    return shown + (f" and {len(runs) - most} more runs" if len(runs) > most else "")


def _check_keys(keys: Sequence[tuple[str, int, int]], events: Sequence[Event]) -> None:
    seqs = {event.seq for event in events}
    for item in keys:
        if not isinstance(item, tuple) or len(item) != 3:
            raise ValueError(f"a key is (key, first seq, count), got {item!r}")
        key, first, size = item
        check_key(key)
        if type(size) is not int or size < 1 or type(first) is not int:
            raise ValueError(
                f"key {key!r}: first seq and count must be ints, the count >= 1; got {item!r}"
            )
        if any(seq not in seqs for seq in range(first, first + size)):
            raise ValueError(
                f"key {key!r}: its seqs {_span(first, first + size - 1)} are not all among"
                " this commit's events"
            )


def _check_commit_id(commit_id: object) -> None:
    if commit_id is not None and (
        not isinstance(commit_id, str) or not 0 < len(commit_id) <= 64 or not commit_id.isascii()
    ):
        raise ValueError(f"a commit id is None or 1 to 64 ASCII characters, got {commit_id!r}")


def _check_uid(expected_uid: object) -> None:
    if type(expected_uid) is not str or not expected_uid:
        raise ValueError(f"expected_uid must be None or a non-empty str, got {expected_uid!r}")


def check_rebase_arguments(
    session_id: str,
    expected_count: int,
    events: Iterable[Event],
    *,
    keys: Sequence[tuple[str, int, int]] = (),
    commit_id: str | None = None,
    expected_uid: str | None = None,
) -> list[Event]:
    """Refuse a malformed rebasing commit before anything is written.

    Returns:
        ``events`` as a list, to write (an iterator is read once, here).

    Raises:
        ValueError: the session id is bad, an event is not an Event, ``events`` is empty,
            their seqs are not ``expected_count, expected_count + 1, ...``, or the expected
            identity is malformed.
    """
    check_session_id(session_id)
    if type(expected_count) is not int or expected_count < 0:
        raise ValueError(f"expected_count must be an int >= 0, got {expected_count!r}")
    if expected_uid is not None:
        _check_uid(expected_uid)
    listed = _event_list(events)
    if not listed:
        raise ValueError("a rebasing commit needs at least one event")
    for offset, event in enumerate(listed):
        if event.seq != expected_count + offset:
            raise ValueError(
                f"rebasing commit events must have contiguous seqs from {expected_count};"
                f" event {offset} has seq {event.seq}"
            )
    _check_keys(keys, listed)
    _check_commit_id(commit_id)
    return listed
