"""What keeps a run's promises across server processes: the thread's run lease, and a request
body read within a limit.

A thread runs one run at a time, whichever worker (process) of the fleet starts it: the worker
takes the store's ``"ag-ui-run"`` lease on the thread (:class:`~nous_session.LeasingStore`)
before it appends anything, renews it while the agent runs, and releases it once the run's
end is recorded. A worker that dies leaves its lease to lapse after ``ttl`` seconds, so the
thread is not blocked for good; a worker that stalls that long stops its run when it resumes
(:class:`RunLease`). A store without leases leaves only the per-process check.
"""

from __future__ import annotations

import hashlib
import logging
import math
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from typing import Final

import anyio
import anyio.abc
from starlette.requests import Request

from nous_session.errors import SessionClosedError, StoreError
from nous_session.stores.base import LeasingStore

__all__ = [
    "CLAIM_TAKEN",
    "CLAIM_UNCONFIRMED",
    "LEASE_NAME",
    "BodyTooLargeError",
    "RunLease",
    "check_positive",
    "read_body",
]

logger = logging.getLogger("nous_session.web")

# The name of the lease a worker holds on a thread while one of its runs goes on.
LEASE_NAME: Final = "ag-ui-run"
# A lease holder's id is at most this long (the store's limit): a longer run id is hashed.
_HOLDER_MAX: Final = 200
# How long releasing a lease may take before it is left to lapse.
_RELEASE_GRACE: Final = 5.0
# Why a run stopped, as its RUN_ERROR says: a renewal found another run's lease (or the lease
# re-taken, the log showed another run had the thread meanwhile).
CLAIM_TAKEN: Final = (
    "the thread's claim lapsed (this worker did not renew it within run_lease_ttl) and another"
    " run took it"
)
# ... or no renewal confirmed the claim before it may have lapsed.
CLAIM_UNCONFIRMED: Final = (
    "the thread's claim could not be renewed within run_lease_ttl (the store failed or did not"
    " answer): another run may have taken it"
)


def check_positive(name: str, value: object, *, most: float | None = None) -> float:
    """``value`` as a float, when it is a positive number (at most ``most``).

    Raises:
        ValueError: naming ``name`` and the value.
    """
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not value > 0
        or (most is not None and value > most)
    ):
        bound = "" if most is None else f" of at most {most:g}"
        raise ValueError(f"{name} must be a positive number{bound}, got {value!r}")
    return float(value)


class RunLease:
    """One run's claim to its thread, through the store's ``"ag-ui-run"`` lease.

    The holder is the worker's id and the run's id: a retry of the run on the worker that runs
    it is told apart by the worker (it never takes the lease twice), and a run on another
    worker is another holder, refused while this one's lease lasts.

    The claim is *confirmed* until ``ttl`` seconds after the last renewal that held was sent
    (the store's lease lasts at least that long). Past that it may have lapsed, and another run
    may have the thread: the run stops (:attr:`stopped` says why) when a renewal finds another
    holder's lease, when no renewal confirms the claim before it may lapse (the store failed,
    or did not answer), or when the lease, re-taken after it may have lapsed, finds that
    another run had the thread meanwhile (the log no longer shows this run going on).

    Args:
        store: a store with leases.
        thread_id: the thread (the session's id).
        worker: this worker's id (one per :class:`~nous_session.web._run_host.RunHost`).
        run_id: the run's id.
        ttl: seconds the lease lasts unless renewed; renewed every third of it.
    """

    __slots__ = (
        "_confirmed",
        "_holder",
        "_on_stop",
        "_store",
        "_thread_id",
        "_ttl",
        "_unchecked",
        "holds",
        "stopped",
    )

    def __init__(
        self, store: LeasingStore, thread_id: str, worker: str, run_id: str, ttl: float
    ) -> None:
        self._store = store
        self._thread_id = thread_id
        self._ttl = ttl
        holder = f"{worker}:{run_id}"
        if len(holder) > _HOLDER_MAX:
            holder = f"{worker}:sha256:{hashlib.sha256(run_id.encode()).hexdigest()}"
        self._holder = holder
        # Until when (the event loop's clock) the claim surely holds: ttl after the last
        # renewal that held was sent (the store counts its ttl from a later moment).
        self._confirmed = -math.inf
        # The lease was re-taken after it may have lapsed, and the log not read since.
        self._unchecked = False
        self._on_stop: Callable[[], object] | None = None
        # The store's last word: this run holds the lease (then it is released at the end).
        self.holds = False
        self.stopped: str | None = None  # why the run must stop: its claim lapsed

    async def take(self) -> bool:
        """Take the lease (or renew it): True when this run holds the thread now, False when
        another run's lease (on any worker) has not lapsed.

        Raises:
            StoreError: the store failed; no lease was taken.
        """
        sent = anyio.current_time()
        held = await self._store.lease(
            self._thread_id, LEASE_NAME, holder=self._holder, ttl=self._ttl
        )
        self.holds = held
        if held:
            self._confirmed = max(self._confirmed, sent + self._ttl)
        return held

    async def keep(
        self,
        finished: anyio.Event,
        stop: Callable[[], object],
        still_running: Callable[[], Awaitable[bool]],
    ) -> None:
        """Renew the lease every third of its ttl until ``finished`` is set, or until the run
        must stop: then :attr:`stopped` says why, and ``stop()`` is called (it cancels the
        agent).

        A renewal that fails is tried again at the next third (the lease lasts through one
        failure); the run stops when no renewal has confirmed the claim before it may lapse
        (failing, or not answering: one is waited for until then, or for a third of the ttl
        when it was sent later, after a stall). ``still_running()`` reads the log: whether it
        shows the run going on (not ended by another worker); it is asked once the lease was
        re-taken past the moment it may have lapsed.
        """
        self._on_stop = stop
        # Each renewal is sent in a task of this group, and waited for no longer than the
        # claim lasts: a store call that does not answer (and cannot be cancelled: a thread)
        # does not keep the run going past its claim. Leaving the group waits for it.
        async with anyio.create_task_group() as calls:
            while self.stopped is None:
                with anyio.move_on_after(self._ttl / 3):
                    await finished.wait()
                    break
                await self._check(calls, still_running)
            calls.cancel_scope.cancel()

    async def settle(self, still_running: Callable[[], Awaitable[bool]]) -> str | None:
        """Before the run's end is recorded: why the run stopped, or None when it holds the
        thread. A claim no longer confirmed (the worker stalled since the last renewal) is
        re-taken first (and the log read, as :meth:`keep` does)."""
        if self.stopped is None and (self._unchecked or anyio.current_time() >= self._confirmed):
            async with anyio.create_task_group() as calls:
                await self._check(calls, still_running)
                calls.cancel_scope.cancel()
        return self.stopped

    async def _check(
        self, calls: anyio.abc.TaskGroup, still_running: Callable[[], Awaitable[bool]]
    ) -> None:
        """Renew the lease once; set :attr:`stopped` when the run must stop."""
        lapsing = self._confirmed  # the claim may lapse from then on
        held = await self._renew(calls)
        if held is False:
            self._stop(CLAIM_TAKEN)
            return
        if held is None:
            if anyio.current_time() >= self._confirmed:
                # Lapsed by now, as far as this worker can tell: not released, then.
                self.holds = False
                self._stop(CLAIM_UNCONFIRMED)
            return
        if anyio.current_time() >= lapsing or self._unchecked:
            # Re-taken after it may have lapsed: another run may have had the thread meanwhile
            # and ended (its worker recorded this run's end, as a dead worker's, first).
            self._unchecked = True
            try:
                running = await still_running()
            except (StoreError, SessionClosedError) as error:
                logger.warning(
                    "could not read thread %r after re-taking its run lease: %r",
                    self._thread_id,
                    error,
                )
                return  # read again after the next renewal
            self._unchecked = False
            if not running:
                self._stop(CLAIM_TAKEN)  # the lease is this run's again: it is released

    async def _renew(self, calls: anyio.abc.TaskGroup) -> bool | None:
        """Renew the lease in a task of ``calls``: True held, False another's, None not
        confirmed (the store failed, or did not answer while the claim lasted, or within a
        third of the ttl when it may have lapsed already)."""
        answers: list[bool | None] = []
        answered = anyio.Event()

        async def renew() -> None:
            try:
                answers.append(await self.take())
            except StoreError as error:
                logger.warning("could not renew the run lease of %r: %r", self._thread_id, error)
                answers.append(None)
            finally:
                answered.set()

        wait = max(self._confirmed - anyio.current_time(), self._ttl / 3)
        calls.start_soon(renew)
        with anyio.move_on_after(wait):
            await answered.wait()
        if not answers:
            logger.warning(
                "the store did not answer the renewal of the run lease of %r within %.3g s",
                self._thread_id,
                wait,
            )
            return None
        return answers[0]

    def _stop(self, why: str) -> None:
        if self.stopped is not None:
            return
        self.stopped = why
        logger.warning("the run on thread %r stops: %s", self._thread_id, why)
        if self._on_stop is not None:
            self._on_stop()

    async def release(self) -> None:
        """Give the lease up (shielded: a cancelled run releases it too; bounded: a store that
        does not answer leaves it to lapse)."""
        with anyio.CancelScope(shield=True), anyio.move_on_after(_RELEASE_GRACE):
            try:
                await self._store.release(self._thread_id, LEASE_NAME, holder=self._holder)
            except StoreError as error:
                logger.warning("could not release the run lease of %r: %r", self._thread_id, error)


class BodyTooLargeError(ValueError):
    """A request's body is larger than the server takes."""


async def read_body(request: Request, limit: int) -> bytes:
    """The request's body, read no further than ``limit`` bytes.

    Raises:
        BodyTooLargeError: its ``Content-Length`` says more than ``limit`` (nothing is read),
            or more than ``limit`` bytes came (the rest is not read).
    """
    declared = request.headers.get("content-length", "").strip()
    # A length too long to convert cheaply is over any limit.
    if declared.isascii() and declared.isdigit() and (len(declared) > 18 or int(declared) > limit):
        raise BodyTooLargeError(
            f"the request body is over {limit} bytes (its Content-Length), the most this"
            f" server takes"
        )
    chunks: list[bytes] = []
    size = 0
    # Closed at once when it stops early: an async generator left to the collector warns.
    async with aclosing(request.stream()) as stream:
        async for chunk in stream:
            size += len(chunk)
            if size > limit:
                raise BodyTooLargeError(
                    f"the request body is over {limit} bytes, the most this server takes"
                )
            chunks.append(chunk)
    return b"".join(chunks)
