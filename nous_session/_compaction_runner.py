"""The compaction runner: one session's compactions, run in the background by the policy
(:mod:`nous_session.compaction` plans them) and posted back to the actor through its queue as
a :class:`Compaction` request, which applies a replacement only if it still applies.
"""

from __future__ import annotations

import secrets
import weakref
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar, cast

import anyio
import anyio.abc
import anyio.lowlevel
import attrs

from nous_session._json import JSON
from nous_session._logging import Throttle
from nous_session._requests import Applied, Call, Reload, Request
from nous_session.compaction import (
    CHUNK,
    CompactionPolicy,
    Replacement,
    TokenMeter,
    plan_pruning,
    plan_summary,
    still_applies,
    summarisable,
    summary_replacement,
)
from nous_session.errors import SessionClosedError, StoreError
from nous_session.event import EventType, message_event, to_message
from nous_session.log import Log
from nous_session.message import Message
from nous_session.transcript import SUMMARY_METADATA, SummaryBuilder, summary_covers

if TYPE_CHECKING:
    from nous_session._state import SessionState
    from nous_session.stores.base import LeasingStore
    from nous_session.telemetry import SessionTelemetry

__all__ = ["Compaction", "CompactionRunner", "CompactionTurn"]

T = TypeVar("T")
U = TypeVar("U")


@attrs.define(eq=False, weakref_slot=False)
class Compaction(Request[list[bool]]):
    """Apply planned replacements that still apply; the result says, per replacement, whether
    it was applied (False: the surface in its range changed since the plan, so it is stale)."""

    replacements: Sequence[Replacement]
    logger: Any

    # Each replacement is checked again on whatever log it is applied to: a compaction that
    # lost to another writer's commit is applied again after catching up, never refused.
    checks_itself = True

    def apply(self, log: Log, committed: int) -> Applied:
        """Append one replace event per replacement that still applies, dated when it is
        applied: a session's history reads forward in time, compactions included (the
        message it puts on the surface keeps its own date: see :meth:`Replacement.data`)."""
        outcome = []
        now = datetime.now(UTC)
        for replacement in self.replacements:
            if not still_applies(log, replacement):
                self.logger.info(
                    "nous_session.compaction_stale",
                    source=replacement.source,
                    start=replacement.start,
                    stop=replacement.stop,
                )
                outcome.append(False)
                continue
            event_type, _ = message_event(replacement.message)
            log = log.append(event_type, replacement.data(), time=now)
            outcome.append(True)
        return Applied(log, outcome, rebuilt=any(outcome))


class CompactionTurn:
    """One holder's claim to compact a session, through the store's ``"compaction"`` lease.

    Every actor that holds the session (in this process or another) has one, under a holder
    id of its own; the store gives the lease to one at a time, and it lapses ``ttl`` seconds
    after its last renewal, so a holder that dies gives the turn up by itself.

    Args:
        store: a store with leases.
        session_id: the session.
        ttl: seconds a turn lasts unless renewed (see ``CompactionPolicy.turn_ttl``).
        logger: the session's bound logger.
    """

    __slots__ = ("_holder", "_logger", "_session_id", "_store", "_ttl")

    def __init__(self, store: LeasingStore, session_id: str, ttl: float, logger: Any) -> None:
        self._store = store
        self._session_id = session_id
        self._ttl = ttl
        self._holder = secrets.token_hex(8)
        self._logger = logger

    async def take(self) -> bool:
        """True when this holder has the turn now (a failing store counts as no)."""
        try:
            return await self._store.lease(
                self._session_id, "compaction", holder=self._holder, ttl=self._ttl
            )
        except StoreError as error:
            self._logger.debug("nous_session.compaction_turn_failed", error=repr(error))
            return False

    async def keep(self, finished: anyio.Event) -> None:
        """Renew the turn every third of its ttl until ``finished`` is set."""
        while True:
            with anyio.move_on_after(self._ttl / 3):
                await finished.wait()
                return
            await self.take()

    async def give_up(self) -> None:
        """Release the turn (shielded: a cancelled compaction gives it up too; bounded: a
        store that does not answer leaves it to lapse)."""
        with anyio.CancelScope(shield=True), anyio.move_on_after(5):
            try:
                await self._store.release(self._session_id, "compaction", holder=self._holder)
            except StoreError as error:
                self._logger.debug("nous_session.compaction_turn_failed", error=repr(error))


class CompactionRunner:
    """Runs one session's compactions in the background, one at a time.

    The actor tells it about every commit (:meth:`committed`); when the policy triggers, it
    starts a child task in the session's task group that plans on the committed Log value,
    summarises, and posts the result back through ``post`` (the actor's queue). It keeps the
    session's compaction counters.

    Args:
        policy: when and how to compact.
        post: sends a request to the actor and returns its result (raises
            :class:`SessionClosedError` once the session is closing).
        state: the session's state: its latest committed Log, the task group the compaction
            task runs in, and its bound logger (the session id is on it).
        telemetry: the session's telemetry (a span per compaction), or None when it is off.
        turn: whose turn it is to compact, across every holder of the session (None: the
            store has no leases, and this runner compacts whenever the policy says).
    """

    __slots__ = (
        "_closing",
        "_done",
        "_logger",
        "_looked",
        "_meter",
        "_policy",
        "_post",
        "_retry_at",
        "_scope",
        "_state",
        "_telemetry",
        "_turn",
        "_warnings",
        "deferred",
        "failed",
        "in_flight",
        "run",
        "stale",
    )

    def __init__(
        self,
        policy: CompactionPolicy,
        state: SessionState,
        *,
        post: Call,
        telemetry: SessionTelemetry | None = None,
        turn: CompactionTurn | None = None,
    ) -> None:
        self._policy = policy
        self._meter = TokenMeter(policy.token_counter)
        # The state holds this runner: holding the state only weakly (and, once closed, not
        # the actor's queue either) leaves no reference cycle for the collector.
        self._state: SessionState = cast("SessionState", weakref.proxy(state))
        self._logger = state.logger
        self._post = post
        self._telemetry = telemetry
        self._turn = turn
        self._warnings = Throttle()
        self._closing = False
        self._scope: anyio.CancelScope | None = None
        self._done = anyio.Event()
        self._done.set()
        self._retry_at = 0  # compaction waits for the surface to reach this size
        self._looked = 0  # the count of the last Log seen
        self.run = 0
        self.stale = 0
        self.failed = 0
        self.deferred = 0  # compactions left to another holder whose turn it was
        self.in_flight = False

    def committed(self, log: Log, *, rebuilt: bool) -> None:
        """See a new committed Log; start a compaction when the policy says so.

        ``rebuilt`` says whether the surface changed other than by growing at the end.
        """
        policy, meter = self._policy, self._meter
        surface = log.surface()  # the memoised fold; nothing is projected here
        tokens = 0
        if policy.counts_tokens:
            # An erasure rewrote events in place, whatever their seqs' remembered counts say.
            if any(event.type is EventType.ERASURE for event in log.since(self._looked)):
                meter.forget()
            # The meter must see every commit, or an unseen replace would corrupt its sum.
            tokens = meter.update(surface, rebuilt=rebuilt)
        self._looked = log.count
        if self.in_flight or self._closing or len(surface) < self._retry_at:
            return
        if policy.triggered(len(surface), tokens):
            self.in_flight = True
            self._done = anyio.Event()
            # The scope exists from now on, so a close before the task first runs cancels it.
            self._scope = anyio.CancelScope()
            self._state.task_group.start_soon(self._compact, self._scope, log, len(surface), tokens)

    def close(self) -> None:
        """Start no more compactions, and cancel the running one (its posts are refused, as
        the closing actor would)."""
        self._closing = True
        self._post = _refused
        if self._scope is not None:
            self._scope.cancel()

    async def wait(self) -> None:
        """Wait until no compaction is running (including one that starts as the last ends:
        a compaction that lands over the trigger starts the next before it ends)."""
        while self.in_flight:
            await self._done.wait()

    async def _compact(self, scope: anyio.CancelScope, log: Log, size: int, tokens: int) -> None:
        policy = self._policy
        logger = self._logger.bind(count=log.count, surface=size, tokens=tokens)
        logger.info("nous_session.compaction_started")
        telemetry = self._telemetry  # telemetry hook: a span over the whole compaction
        traced = None if telemetry is None else telemetry.compaction_started(size, tokens)
        outcome = "failed"
        try:
            with scope:
                outcome = await self._compaction(log)
            if scope.cancelled_caught:
                outcome = "cancelled"
        except SessionClosedError:
            outcome = "cancelled"
        except Exception as error:
            # Nobody awaits a compaction: warn, but once a minute at most, with the count.
            count = self._warnings.due()
            if count is None:
                logger.debug("nous_session.compaction_failed", error=repr(error))
            else:
                logger.warning("nous_session.compaction_failed", error=repr(error), failures=count)
        finally:
            self._scope = None
            self.in_flight = False
            self._done.set()
            if telemetry is not None and traced is not None:  # telemetry hook
                telemetry.compaction_finished(traced, outcome)
        if outcome in ("applied", "pruned, summary stale"):
            self.run += 1
            logger.info(
                "nous_session.compaction_finished", new_count=self._state.published.log.count
            )
        if outcome in ("stale", "pruned, summary stale"):
            self.stale += 1
        elif outcome == "failed":
            self.failed += 1
        elif outcome == "deferred":
            self.deferred += 1
        surface = self._state.published.log.surface()
        if outcome in ("failed", "nothing"):
            # Do not retry on every commit: wait until the surface has grown.
            self._retry_at = size + 1
        elif outcome == "deferred":
            # Another holder is compacting: its result reaches this log through the store.
            # Look again once the surface has grown by half the kept tail (its holder may have
            # died: its turn then lapses within turn_ttl).
            self._retry_at = len(surface) + max(1, policy.keep_last // 2)
        elif outcome not in ("stale", "cancelled") and policy.triggered(
            len(surface), self._meter.total
        ):
            # Still over the trigger: messages appended while this one ran (a slow summarizer
            # falls behind a busy session) are summarised by the next one, started at once. But
            # what remains may be only the kept tail, which no compaction can shrink: then wait
            # until enough has scrolled out of it to be worth a compaction.
            worth = max(1, policy.keep_last // 2)
            missing = worth - summarisable(surface, policy.keep_last)
            if missing > 0:
                self._retry_at = len(surface) + missing
                logger.info("nous_session.compaction_insufficient", retry_at=self._retry_at)
            else:
                self._retry_at = 0  # an earlier wait for the tail to scroll is over
        if outcome != "cancelled":
            self.committed(self._state.published.log, rebuilt=False)

    async def _compaction(self, log: Log) -> str:
        """Take the session's turn to compact (when the store keeps turns), then prune and
        summarise."""
        turn = self._turn
        if turn is None:
            return await self._prune_and_summarise(log)
        if not await turn.take():
            return "deferred"
        failure: Exception | None = None
        outcome = "failed"
        finished = anyio.Event()
        try:
            async with anyio.create_task_group() as renewing:
                renewing.start_soon(turn.keep, finished)
                # The work's own error leaves the task group as itself, not wrapped in an
                # exception group (the caller tells a closing session from a failure by type).
                try:
                    outcome = await self._turn_taken()
                except Exception as error:
                    failure = error
                finally:
                    # The renewal ends by itself, not by a cancellation (a cancelled task
                    # leaves its exception in a reference cycle on asyncio).
                    finished.set()
        finally:
            await turn.give_up()
        if failure is not None:
            raise failure
        return outcome

    async def _turn_taken(self) -> str:
        """With the turn: read what other holders committed while this one waited (their
        summary, most likely) before planning, so no range is summarised twice."""
        log = await self._post(Reload())
        if self._policy.triggered(len(log.surface()), self._meter.total):
            return await self._prune_and_summarise(log)
        return "nothing"

    async def _prune_and_summarise(self, log: Log) -> str:
        """Prune, then summarise; every long loop yields to the event loop as it goes."""
        policy = self._policy
        pruned = False
        if policy.prune_tool_results is not None:
            replacements = await plan_pruning(log, policy.prune_tool_results)
            if replacements:
                outcome: list[bool] = await self._post(Compaction(replacements, self._logger))
                pruned = any(outcome)
                log = self._state.published.log
                # The commit above brought the meter up to date.
                if pruned and not policy.triggered(len(log.surface()), self._meter.total):
                    return "applied"  # pruning was enough
        events = await plan_summary(log, policy.keep_last)
        if events is None:
            return "applied" if pruned else "nothing"
        old = await _cooperatively(to_message, events)
        if policy.summarizer is None:
            summary = await _structural_summary(old, _summary_bytes(policy))
        else:
            timeout = policy.summarizer_timeout
            with anyio.fail_after(timeout) if timeout is not None else nullcontext():
                text = await policy.summarizer(old)
            if not isinstance(text, str) or not text.strip():
                raise ValueError(f"the summarizer returned an empty summary: {text!r}")
            info: dict[str, JSON] = {"messages": summary_covers(old), "summarizer": "custom"}
            summary = Message.system(
                text, metadata={SUMMARY_METADATA: info}, created_at=old[0].created_at
            )
        replacement = summary_replacement(log, events, summary)
        (applied,) = await self._post(Compaction([replacement], self._logger))
        if applied:
            return "applied"
        return "pruned, summary stale" if pruned else "stale"


async def _refused(request: Request[Any]) -> Any:
    """What posting to the actor does once the session is closing."""
    raise SessionClosedError("the session is closed")


def _summary_bytes(policy: CompactionPolicy) -> int | None:
    """The most UTF-8 bytes a structural summary may take: under a token budget, half of what
    triggers (so that the summary and the kept tail fit under the trigger), else no limit."""
    if policy.token_budget is None:
        return None
    return int(policy.token_budget * policy.threshold * 4 / 2)


async def _structural_summary(old: Sequence[Message], max_bytes: int | None) -> Message:
    """:func:`~nous_session.transcript.summarize` of ``old`` (within ``max_bytes``), built a
    chunk at a time so that a long summary never holds the event loop."""
    builder = SummaryBuilder(max_bytes=max_bytes)
    for stop in range(len(old), 0, -CHUNK):
        for message in reversed(old[max(0, stop - CHUNK) : stop]):
            builder.add(message)
        await anyio.lowlevel.checkpoint()
    return builder.message(old[0].created_at)


async def _cooperatively(function: Callable[[T], U], items: Sequence[T]) -> list[U]:
    """``[function(item) for item in items]``, yielding to the event loop every ``CHUNK``
    items, so a compaction of a long session never holds the loop for more than a moment."""
    out: list[U] = []
    for start in range(0, len(items), CHUNK):
        out.extend([function(item) for item in items[start : start + CHUNK]])
        await anyio.lowlevel.checkpoint()
    return out
