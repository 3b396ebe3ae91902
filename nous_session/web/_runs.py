"""What keeps a run's promises across server processes: the thread's run lease, and a request
body read within a limit.

A thread runs one run at a time, whichever worker (process) of the fleet starts it: the worker
takes the store's ``"ag-ui-run"`` lease on the thread (:class:`~nous_session.LeasingStore`)
before it appends anything, renews it while the agent runs, and releases it once the run's
end is recorded. A worker that dies leaves its lease to lapse after ``ttl`` seconds, so the
thread is not blocked for good. A store without leases leaves only the per-process check.
"""

from __future__ import annotations

import hashlib
import logging
from contextlib import aclosing
from typing import Final

import anyio
from starlette.requests import Request

from nous_session.errors import StoreError
from nous_session.stores.base import LeasingStore

__all__ = ["LEASE_NAME", "BodyTooLargeError", "RunLease", "check_positive", "read_body"]

logger = logging.getLogger("nous_session.web")

# The name of the lease a worker holds on a thread while one of its runs goes on.
LEASE_NAME: Final = "ag-ui-run"
# A lease holder's id is at most this long (the store's limit): a longer run id is hashed.
_HOLDER_MAX: Final = 200
# How long releasing a lease may take before it is left to lapse.
_RELEASE_GRACE: Final = 5.0


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

    Args:
        store: a store with leases.
        thread_id: the thread (the session's id).
        worker: this worker's id (one per :class:`SessionStreams`).
        run_id: the run's id.
        ttl: seconds the lease lasts unless renewed; renewed every third of it.
    """

    __slots__ = ("_holder", "_store", "_thread_id", "_ttl", "lost")

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
        self.lost = False  # a renewal found another holder's lease: the thread is not ours

    async def take(self) -> bool:
        """Take the lease: True when this run holds the thread now, False when another run's
        lease (on any worker) has not lapsed.

        Raises:
            StoreError: the store failed; no lease was taken.
        """
        return await self._store.lease(
            self._thread_id, LEASE_NAME, holder=self._holder, ttl=self._ttl
        )

    async def keep(self, finished: anyio.Event) -> None:
        """Renew the lease every third of its ttl until ``finished`` is set.

        A renewal that fails is tried again at the next third (the lease lasts through one
        failure); one that finds another holder's lease (this worker stalled for longer than
        the ttl) is logged: the run goes on, but the thread is no longer kept for it.
        """
        while True:
            with anyio.move_on_after(self._ttl / 3):
                await finished.wait()
                return
            try:
                held = await self.take()
            except StoreError as error:
                logger.warning("could not renew the run lease of %r: %r", self._thread_id, error)
                continue
            if not held and not self.lost:
                self.lost = True
                logger.warning(
                    "the run lease of thread %r lapsed and another run took it", self._thread_id
                )

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
