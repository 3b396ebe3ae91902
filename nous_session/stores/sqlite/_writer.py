"""SQLiteWriter: one thread owns a SQLite connection and group-commits the writes sent to it.

Every write job waiting while the previous transaction is on disk runs in one transaction (each
in a savepoint of its own), and one ``COMMIT`` makes them durable with one fsync; reads run on
the same thread between transactions; answers wake each caller's event loop from the thread
(``_loops.set_futures`` / ``set_events``). Why it is built this way, the rounds in which calls
reach the thread, and why the thread is not a daemon: docs/internals.md, "SQLite: one writer
thread, group commit".
"""

from __future__ import annotations

import asyncio
import itertools
import queue
import sqlite3
import threading
import warnings
from collections.abc import Awaitable, Callable, Coroutine
from operator import attrgetter
from typing import TYPE_CHECKING, Any, Final, Generic, Protocol, TypeVar, cast

import anyio
import anyio.lowlevel
import attrs

from nous_session._logging import get_logger
from nous_session._loops import current_library, set_events, set_futures
from nous_session.errors import StoreError

if TYPE_CHECKING:
    import trio

__all__ = ["DEFAULT_GROUP_CAP", "SQLiteWriter", "WriterStatistics", "instrument"]

T = TypeVar("T")

DEFAULT_GROUP_CAP: Final = 512
"""The most jobs the writer takes from its queue at once (so the most writes per transaction)."""

_logger = get_logger("nous_session.sqlite")

# How long the idle thread sleeps before it checks whether the interpreter is shutting down.
# It is a non-daemon thread, so a writer nobody closed (a module global, say) would otherwise
# keep the process from ever exiting.
_IDLE_POLL: Final = 1.0

# One name for every job's savepoint: they never nest, and a job's own savepoints (if it takes
# any) are unlikely to collide with a name this specific.
_SAVEPOINT: Final = "SAVEPOINT nous_writer_job"
_RELEASE: Final = "RELEASE nous_writer_job"
_ROLLBACK_TO: Final = "ROLLBACK TO nous_writer_job"

_WRITE: Final = 0
_READ: Final = 1
_CLOSE: Final = 2

_thread_numbers = itertools.count(1)


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


def _store_error(message: str, cause: BaseException) -> StoreError:
    """A StoreError chained to ``cause`` exactly as ``raise ... from cause`` would chain it."""
    error = StoreError(message)
    error.__cause__ = cause
    error.__suppress_context__ = True
    return error


@attrs.frozen
class WriterStatistics:
    """What a :class:`SQLiteWriter` has done so far (for tests and benchmarks).

    Attributes:
        transactions: write transactions committed.
        failed_transactions: write groups that failed as a whole (BEGIN, COMMIT or a savepoint
            failed); none of their writes were committed.
        writes: write jobs run, whatever their outcome.
        reads: read jobs run (a read whose caller was cancelled before it ran is skipped).
        max_group: the most write jobs one transaction held.
        wakeups: wake-ups sent to event loops (one per group of answers per event loop).
    """

    transactions: int
    failed_transactions: int
    writes: int
    reads: int
    max_group: int
    wakeups: int

    @property
    def jobs(self) -> int:
        """Write and read jobs run."""
        return self.writes + self.reads


# The committer keeps a counter by each name of WriterStatistics' fields.
_counters: Final = attrgetter(*(field.name for field in attrs.fields(WriterStatistics)))

BENCHMARKED_STEPS: Final = ("flush", "write_group", "run_write", "execute", "deliver")
"""The steps of the writer's thread that :func:`instrument` wraps (and ``"set_futures"``)."""


def instrument(wrap: Callable[[str, Callable[..., Any]], Callable[..., Any]]) -> None:
    """A hook for benchmarks only (benchmarks/one_session_chain.py, many_breakdown.py): replace
    each step of the group committer (:data:`BENCHMARKED_STEPS`) and the asyncio wake-up
    (``"set_futures"``) by ``wrap(step, function)``, to time them. ``execute`` is a static
    method: ``wrap`` gets and returns a plain function. Call it before the first writer is
    made (a loop's wake-up is bound then); it cannot be undone."""
    global set_futures
    for step in BENCHMARKED_STEPS:
        wrapped = wrap(step, getattr(_GroupCommitter, step))
        setattr(_GroupCommitter, step, staticmethod(wrapped) if step == "execute" else wrapped)
    set_futures = wrap("set_futures", set_futures)


class _Waker:
    """How the writer's thread wakes one event loop (or trio run), and how a round of calls is
    handed over there; one per loop, shared by its calls (see :meth:`_GroupCommitter.waker`).

    The thread wakes the loop with ``schedule(setter, [signal, ...])``. On asyncio ``defer`` is
    ``loop.call_soon``: it runs the round's hand-over after the tasks ready now, without
    resuming the caller's task (and its chain of coroutines) just for that; on trio (no
    in-thread call_soon) the round's first caller yields once (``pause``), then hands it over.
    """

    __slots__ = ("defer", "key", "pause", "schedule", "setter")

    def __init__(
        self,
        key: object,
        schedule: Callable[..., object],
        setter: Callable[[Any], None],
        defer: Callable[..., object] | None,
        pause: Callable[[], Awaitable[None]] | None,
    ) -> None:
        self.key = key  # the asyncio loop or the trio run's token
        self.schedule = schedule
        self.setter = setter
        self.defer = defer
        self.pause = pause


class _Call(Generic[T]):
    """One job and its answer, shared by the awaiting task and the writer thread.

    The thread fills in ``result`` or ``error`` before it wakes the task (the wake-up's lock
    publishes them); the task sets ``abandoned`` when it is cancelled while it waits. A call
    holds as few objects as it can: hundreds of sessions' calls are in flight at once, and every
    object alive then is one more for the garbage collector to look at.
    """

    __slots__ = ("abandoned", "error", "job", "kind", "result", "signal", "waker")

    def __init__(self, kind: int, job: Callable[[sqlite3.Connection], T] | None) -> None:
        self.kind = kind
        self.job = job
        self.result: T | None = None
        self.error: BaseException | None = None
        self.abandoned = False
        # How to wake the caller from the thread. None for a close nobody awaits (a writer
        # garbage-collected or the interpreter exiting).
        self.waker: _Waker | None = None
        self.signal: asyncio.Future[None] | trio.Event | None = None

    def arm(self, committer: _GroupCommitter) -> None:
        """Capture the calling task's event loop, so the thread can wake this task on it.

        Raises:
            RuntimeError: no asyncio loop or trio run is running in this thread.
        """
        library = current_library()
        if library == "trio":
            import trio

            self.waker = committer.waker(trio.lowlevel.current_trio_token())
            self.signal = trio.Event()
        elif library == "asyncio":
            loop = asyncio.get_running_loop()
            self.waker = committer.waker(loop)
            self.signal = loop.create_future()
        else:
            raise RuntimeError(f"SQLiteWriter runs on asyncio or trio, not {library}")

    async def call(self, committer: _GroupCommitter) -> T:
        """Hand the call to ``committer`` with the calls other tasks send in this same round, wait
        for the thread's answer, and return it (or raise its error).

        The round's hand-over waits until every task its event loop has ready now (typically
        all the tasks one commit just woke) has sent its call too, then gives them all to the
        thread as one list: they become one transaction instead of one small one for the first
        caller and a big one for the rest. A call is handed over even if its caller is
        cancelled meanwhile; a caller cancelled while it waits marks its call abandoned.

        Raises:
            StoreError: the writer is closed.
        """
        waker = self.waker
        assert waker is not None
        if committer.submit(self):  # this call opened the round: hand it over
            if waker.defer is not None:
                waker.defer(committer.flush, waker)
            else:
                assert waker.pause is not None
                try:
                    await waker.pause()
                except BaseException:
                    self.abandoned = True
                    raise
                finally:
                    committer.flush(waker)
        await self.wait()
        return self.outcome()

    async def wait(self) -> None:
        """Wait until the thread has answered; on cancellation mark the call abandoned."""
        signal = self.signal
        assert signal is not None
        try:
            if isinstance(signal, asyncio.Future):
                await signal
            else:
                await signal.wait()
        except BaseException:
            self.abandoned = True
            raise

    def outcome(self) -> T:
        """The job's result, or raise its error."""
        error = self.error
        if error is not None:
            self.error = None  # the caller's traceback now holds it; break the cycle
            raise error
        return cast(T, self.result)


class Fence(Protocol):
    """What the writer's thread tells an observer of its commits (the SQLite feed's solo
    mode, ``stores/sqlite/_feed.py``): a batch begins and ends, a write group was committed
    (or failed: ``failed``), and the thread opened a connection."""

    def begin(self) -> None: ...

    def opened(self, connection: sqlite3.Connection) -> None: ...

    def committed(self, connection: sqlite3.Connection | None, failed: bool) -> None: ...

    def end(self) -> None: ...


class _NoFence:
    """The fence of a writer nobody observes: told everything, does nothing."""

    def begin(self) -> None:
        pass

    def opened(self, connection: sqlite3.Connection) -> None:
        pass

    def committed(self, connection: sqlite3.Connection | None, failed: bool) -> None:
        pass

    def end(self) -> None:
        pass


_NO_FENCE: Final = _NoFence()


class _GroupFailed(Exception):
    """A write group failed as a whole: every write in it that had not raised gets StoreError."""

    def __init__(self, message: str, cause: BaseException) -> None:
        super().__init__(message)
        self.message = message
        self.cause = cause


class _GroupCommitter:
    """Group commit: the writer's state and its thread's loop, which takes every write waiting
    into one transaction. The thread references this, not the :class:`SQLiteWriter`, so an
    unclosed writer can be garbage collected (and warn) while its thread still runs."""

    def __init__(
        self,
        connect: Callable[[], sqlite3.Connection],
        group_cap: int,
        check: Callable[[], None] | None = None,
        fence: Fence | None = None,
    ) -> None:
        self.connect = connect
        self.group_cap = group_cap
        self.check = check
        self.fence: Fence = fence or _NO_FENCE
        # Lists of calls, in the order they were sent; a close is a list of its own.
        self.queue: queue.SimpleQueue[list[_Call[Any]]] = queue.SimpleQueue()
        # The waker of the loop that sent the last call, with that loop: a one-entry cache
        # (one loop sends nearly every call), replaced as one tuple for other threads.
        self.last_waker: tuple[object, _Waker] | None = None
        # Each loop's current round of calls (by its waker), handed to the thread together
        # (see _Call.call): tasks woken by one commit reach it as one group, not trickling in
        # while it runs the next transaction with the first few.
        self.pending: dict[_Waker, list[_Call[Any]]] = {}
        # What the thread took from the queue beyond ``group_cap``: the next batch starts there.
        self.leftover: list[_Call[Any]] = []
        # Guards closed/finished/thread/pending against submit, flush and close racing.
        self.lock = threading.Lock()
        self.closed = False  # no job is accepted any more (a close is queued or done)
        self.finished = False  # the thread has closed the connection and is exiting
        self.thread: threading.Thread | None = None
        self.connection: sqlite3.Connection | None = None
        # One cursor for the writer's statements: cheaper than execute's fresh one per call.
        self.cursor: sqlite3.Cursor | None = None
        # Statistics: written by the thread only, before it wakes the callers they describe.
        self.transactions = 0
        self.failed_transactions = 0
        self.writes = 0
        self.reads = 0
        self.max_group = 0
        self.wakeups = 0

    # The event loop's side ---------------------------------------------------------------------

    def waker(self, key: object) -> _Waker:
        """The waker of the asyncio loop or trio token ``key`` (see :class:`_Waker`)."""
        last = self.last_waker
        if last is not None and last[0] is key:
            return last[1]
        if isinstance(key, asyncio.AbstractEventLoop):
            waker = _Waker(key, key.call_soon_threadsafe, set_futures, key.call_soon, None)
        else:
            import trio

            token = cast(trio.lowlevel.TrioToken, key)
            waker = _Waker(key, token.run_sync_soon, set_events, None, trio.lowlevel.checkpoint)
        self.last_waker = (key, waker)
        return waker

    def submit(self, call: _Call[Any]) -> bool:
        """Add ``call`` to its event loop's round, starting the thread on first use.

        Returns:
            True when ``call`` opened the round: its caller must :meth:`flush` it.

        Raises:
            StoreError: the writer is closed.
        """
        waker = call.waker
        assert waker is not None
        with self.lock:
            if self.closed:
                raise StoreError("the SQLite writer is closed")
            if self.thread is None:
                self.thread = threading.Thread(
                    target=self.serve,
                    name=f"nous_session-sqlite-writer-{next(_thread_numbers)}",
                    daemon=False,
                )
                self.thread.start()
            calls = self.pending.get(waker)
            if calls is not None:
                calls.append(call)
                return False
            self.pending[waker] = [call]
            return True

    def flush(self, waker: _Waker) -> None:
        """Hand the round of the event loop of ``waker`` over to the thread."""
        with self.lock:
            calls = self.pending.pop(waker, None)  # a close may have handed them over
            if calls is not None:
                self.queue.put(calls)

    def request_close(self, call: _Call[None]) -> threading.Thread | None:
        """Queue a close behind every job already sent.

        Returns:
            The thread to join once ``call`` is answered, or None when there is no thread (it
            never started). When the thread is already finishing, ``call`` is not queued and
            its ``waker`` is cleared: there is only the join to wait for.
        """
        with self.lock:
            self.closed = True
            thread = self.thread
            if thread is None:
                return None
            if self.finished:
                call.waker = None
                return thread
            # Calls still waiting for their loop's flush go first: they were sent before this.
            for calls in self.pending.values():
                self.queue.put(calls)
            self.pending.clear()
            self.queue.put([call])
            return thread

    # The thread's side ----------------------------------------------------------------------------

    def serve(self) -> None:
        """The thread's loop: take a batch, run it, answer it, until a close is taken."""
        batch: list[_Call[Any]] = []
        try:
            while True:
                batch = self.take()
                closes = [call for call in batch if call.kind == _CLOSE]
                jobs = [call for call in batch if call.kind != _CLOSE]
                if jobs:
                    self.fence.begin()
                    try:
                        self.run(jobs)
                    finally:
                        self.fence.end()
                if closes:
                    self.finish(closes)
                    return
        except BaseException as error:  # a bug here must not leave callers waiting forever
            _logger.debug("nous_session.writer_crashed", error=_describe(error))
            self.crash(batch, error)

    def take(self) -> list[_Call[Any]]:
        """Block for the next calls, then take whatever else is already waiting (to the cap)."""
        batch, self.leftover = self.leftover, []
        if not batch:
            while True:
                try:
                    batch = self.queue.get(timeout=_IDLE_POLL)
                    break
                except queue.Empty:
                    if not threading.main_thread().is_alive():
                        # The interpreter is shutting down and waits for this non-daemon
                        # thread: close (after anything sent meanwhile), as nobody did.
                        self.request_close(_Call(_CLOSE, None))
        cap = self.group_cap
        get = self.queue.get_nowait
        try:
            while len(batch) < cap:
                batch = batch + get()
        except queue.Empty:
            pass
        if len(batch) > cap:
            batch, self.leftover = batch[:cap], batch[cap:]
        return batch

    def run(self, jobs: list[_Call[Any]]) -> None:
        """Run a batch: its writes in one transaction (answered first), then its reads."""
        writes = [call for call in jobs if call.kind == _WRITE]
        reads = [call for call in jobs if call.kind == _READ] if len(writes) < len(jobs) else []
        if writes:
            connection = self.connection or self.open(writes)
            if connection is not None:
                self.write_group(connection, writes)
            # Before the callers can take their errors away; told after they are answered.
            failed = any(call.error is not None for call in writes)
            self.deliver(writes)
            self.fence.committed(self.connection, failed)
        if reads:
            # A read whose caller was cancelled before its turn is dropped unrun.
            wanted = [call for call in reads if not call.abandoned]
            for call in wanted:
                # The connection may be gone: a failed rollback (above or in a read) drops it.
                connection = self.connection or self.open([call])
                if connection is not None:
                    self.read(connection, call)
            self.reads += len(wanted)
            self.deliver(reads)

    def open(self, jobs: list[_Call[Any]]) -> sqlite3.Connection | None:
        """Open the connection; on failure each of ``jobs`` gets StoreError (and None returns)."""
        try:
            connection = self.connect()
            # The writer issues BEGIN/COMMIT itself; the sqlite3 module's implicit BEGIN before
            # DML would otherwise open transactions in reads, unseen.
            connection.isolation_level = None
        except BaseException as error:
            _logger.debug("nous_session.writer_connect_failed", error=_describe(error))
            for call in jobs:
                call.error = _store_error(f"cannot open the database: {_describe(error)}", error)
            return None
        _logger.debug("nous_session.writer_connected")
        self.connection = connection
        self.cursor = connection.cursor()
        self.fence.opened(connection)
        return connection

    def write_group(self, connection: sqlite3.Connection, calls: list[_Call[Any]]) -> None:
        """Run ``calls`` in one transaction; each job's error stays its own.

        If the transaction as a whole fails, every job that had not raised gets StoreError
        and nothing is committed.
        """
        size = len(calls)
        self.writes += size
        if self.check is not None:
            try:
                self.check()
            except BaseException as error:  # no write of this group may run: none does
                message = str(error) if isinstance(error, StoreError) else _describe(error)
                for call in calls:
                    call.job = None
                    call.error = _store_error(message, error)
                return
        cursor = self.cursor
        assert cursor is not None
        execute = self.execute
        try:
            execute(cursor, "BEGIN IMMEDIATE", "cannot begin the transaction")
            if size == 1:
                # Alone in its transaction a job needs no savepoint: ROLLBACK undoes just it.
                call = calls[0]
                self.run_write(connection, call)
                if call.error is not None:
                    execute(cursor, "ROLLBACK", "cannot roll back the transaction")
                    return
            else:
                for call in calls:
                    execute(cursor, _SAVEPOINT, "cannot take a savepoint")
                    self.run_write(connection, call)
                    if call.error is not None:
                        execute(cursor, _ROLLBACK_TO, "cannot roll back to a job's savepoint")
                    execute(cursor, _RELEASE, "cannot release a savepoint")
            execute(cursor, "COMMIT", "cannot commit the transaction")
        except _GroupFailed as failure:
            self.failed_transactions += 1
            self.rollback(connection)
            _logger.debug(
                "nous_session.writer_group_failed", size=size, error=_describe(failure.cause)
            )
            message = f"{failure.message} ({_describe(failure.cause)}); "
            message += (
                f"none of the {size} writes of its group were committed"
                if size > 1
                else "the write was not committed"
            )
            for call in calls:
                if call.error is None:  # it succeeded or never ran: its writes are not stored
                    call.error = _store_error(message, failure.cause)
            return
        self.transactions += 1
        self.max_group = max(self.max_group, size)

    def run_write(self, connection: sqlite3.Connection, call: _Call[Any]) -> None:
        """Run one write job inside the transaction, keeping its result or error.

        Raises:
            _GroupFailed: the transaction is gone after the job (SQLite rolls back on its own
                after some errors, such as a full disk; or the job ended it itself).
        """
        job, call.job = call.job, None  # the thread keeps no job (nor what it holds) once run
        assert job is not None
        try:
            call.result = job(connection)
        except BaseException as error:  # even SystemExit: it is the job's, not the thread's
            call.error = error
        del job
        if connection.in_transaction:
            return
        if call.error is not None:
            raise _GroupFailed("SQLite rolled the transaction back after a job failed", call.error)
        cause = sqlite3.ProgrammingError("a write job ended the writer's transaction")
        call.error = _store_error(
            "a write job must not COMMIT or ROLLBACK: the writer owns the transaction", cause
        )
        raise _GroupFailed(
            "a job of this group ended the transaction itself (what ran before it may have been"
            " committed by it)",
            cause,
        )

    def read(self, connection: sqlite3.Connection, call: _Call[Any]) -> None:
        """Run one read job outside any transaction, keeping its result or error."""
        job, call.job = call.job, None  # the thread keeps no job (nor what it holds) once run
        assert job is not None
        try:
            call.result = job(connection)
        except BaseException as error:
            call.error = error
        del job
        if connection.in_transaction:
            # Left open, it would hold a read snapshot (or the write lock) for ever after.
            self.rollback(connection)
            if call.error is None:
                call.error = StoreError("a read job left a transaction open; it was rolled back")

    @staticmethod
    def execute(cursor: sqlite3.Cursor, sql: str, what: str) -> None:
        """One of the writer's own statements; its failure fails the whole group."""
        try:
            cursor.execute(sql)
        except BaseException as error:
            raise _GroupFailed(what, error) from error

    def rollback(self, connection: sqlite3.Connection) -> None:
        """End a failed transaction; a connection that cannot even roll back is replaced."""
        try:
            if connection.in_transaction:
                connection.execute("ROLLBACK")
        except BaseException as error:
            _logger.debug("nous_session.writer_rollback_failed", error=_describe(error))
            self.connection = self.cursor = None  # the next batch opens a fresh connection
            try:
                connection.close()
            except BaseException as close_error:
                _logger.debug("nous_session.writer_close_failed", error=_describe(close_error))

    def deliver(self, calls: list[_Call[Any]]) -> None:
        """Wake the callers of ``calls``: one wake-up per event loop, carrying all its waiters."""
        groups: dict[Callable[..., object], tuple[Callable[[Any], None], list[Any]]] = {}
        for call in calls:
            waker = call.waker
            if waker is None:
                continue
            schedule = waker.schedule
            if call.abandoned and call.error is not None:
                _logger.debug(
                    "nous_session.writer_answer_dropped",
                    kind=call.kind,
                    error=_describe(call.error),
                )
            # Bound methods of one loop (or token) are equal and hash alike: one key per loop.
            group = groups.get(schedule)
            if group is None:
                groups[schedule] = (waker.setter, [call.signal])
            else:
                group[1].append(call.signal)
        self.wakeups += len(groups)
        for schedule, (setter, signals) in groups.items():
            try:
                schedule(setter, signals)
            except RuntimeError as error:  # that loop (or trio run) is gone, and its callers
                _logger.debug("nous_session.writer_loop_gone", error=_describe(error))

    def finish(self, closes: list[_Call[Any]]) -> None:
        """Close the connection, then answer every close queued, and let the thread end."""
        connection, self.connection, self.cursor = self.connection, None, None
        if connection is not None:
            try:
                connection.close()  # may checkpoint the WAL: disk, so here and not in aclose
            except BaseException as error:
                _logger.debug("nous_session.writer_close_failed", error=_describe(error))
        with self.lock:
            self.finished = True
            # Only closes come after the first close (submit refuses jobs once closed).
            closes += self.leftover
            self.leftover = []
            try:
                while True:
                    closes += self.queue.get_nowait()
            except queue.Empty:
                pass
        _logger.debug("nous_session.writer_closed")
        self.deliver(closes)

    def crash(self, batch: list[_Call[Any]], error: BaseException) -> None:
        """After a bug in the thread: refuse everything and answer every caller waiting."""
        with self.lock:
            self.closed = True
            self.finished = True
            batch += self.leftover
            self.leftover = []
            for calls in self.pending.values():
                batch += calls
            self.pending.clear()
            try:
                while True:
                    batch += self.queue.get_nowait()
            except queue.Empty:
                pass
        for call in batch:
            if call.kind != _CLOSE and call.error is None:
                call.error = _store_error(f"the SQLite writer failed: {_describe(error)}", error)
        connection, self.connection, self.cursor = self.connection, None, None
        if connection is not None:
            try:
                connection.close()
            except BaseException as close_error:
                _logger.debug("nous_session.writer_close_failed", error=_describe(close_error))
        self.deliver(batch)


def _check_group_cap(instance: object, attribute: object, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"group_cap must be an int >= 1, got {value!r}")


@attrs.define(eq=False)
class SQLiteWriter:
    """One thread that owns a SQLite connection, group-commits writes and runs reads.

    Args:
        connect: opens the connection; called on the writer's thread at first use (and again
            after a failure to open, or after a connection broke). The writer sets its
            ``isolation_level`` to None and issues BEGIN/COMMIT itself; the factory sets the
            pragmas (WAL, synchronous, busy timeout).
        group_cap: the most jobs taken from the queue at once, so the most writes that share a
            transaction.
        check: called on the writer's thread before each write transaction; if it raises, none
            of that group's writes runs and each gets a :class:`StoreError` with its message
            (the store checks once per group that its file is still the one it opened, instead
            of once per write).
        fence: told, on the writer's thread, when each batch of jobs begins and ends, when a
            write group was committed and when a connection was opened (:class:`Fence`).

    The thread starts on the first :meth:`write` or :meth:`read` and stops in :meth:`aclose`
    (or ``async with``). Calls may come from any task of any asyncio loop or trio run, in
    any thread. A writer garbage-collected while its thread runs warns with
    :class:`ResourceWarning` (and then stops its thread after the jobs queued).

    Jobs are plain functions of the connection; they run on the writer's thread, one at a time,
    so they must not block on the event loop, and write jobs must not COMMIT or ROLLBACK.
    """

    _connect: Callable[[], sqlite3.Connection] = attrs.field(alias="connect")
    _group_cap: int = attrs.field(
        default=DEFAULT_GROUP_CAP, kw_only=True, alias="group_cap", validator=_check_group_cap
    )
    _check: Callable[[], None] | None = attrs.field(default=None, kw_only=True, alias="check")
    _fence: Fence | None = attrs.field(default=None, kw_only=True, alias="fence")
    _committer: _GroupCommitter = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._committer = _GroupCommitter(self._connect, self._group_cap, self._check, self._fence)

    def write(self, job: Callable[[sqlite3.Connection], T]) -> Coroutine[Any, Any, T]:
        """Run ``job(connection)`` in a write transaction shared with other waiting writes.

        The job runs inside its own savepoint, so if it raises, only its own changes are undone
        and its exception is raised here; the group's other writes still commit. The call
        returns once the group's COMMIT is durable.

        Cancellation does not take a write back: once this is called the job is queued and
        will run and commit even if the awaiting task is cancelled meanwhile (its result is then
        dropped). Callers that must know the outcome shield the await.

        Args:
            job: a function of the connection; its return value is returned here.

        Returns:
            What ``job`` returned.

        Raises:
            StoreError: the writer is closed; or the database could not be opened; or the
                group's transaction failed as a whole (BEGIN or COMMIT failed, or another job's
                error made SQLite roll it back, as a full disk does): none of its writes were
                committed; or the job ended the transaction itself.
            Exception: whatever ``job`` raised (its changes were rolled back).
        """
        # Not a coroutine function itself: one coroutine object per write in flight, not two.
        return self._send(_WRITE, job)

    def read(self, job: Callable[[sqlite3.Connection], T]) -> Coroutine[Any, Any, T]:
        """Run ``job(connection)`` on the writer's thread, outside any write transaction.

        Reads taken from the queue together with writes run after those writes have
        committed (so a task sees what it wrote), each in SQLite's autocommit mode; a job that
        needs one snapshot for several statements opens and ends its own transaction. If the
        awaiting task is cancelled while it waits, the job may still run (its result is then
        dropped); a task cancelled before the call sends nothing.

        Args:
            job: a function of the connection; its return value is returned here.

        Returns:
            What ``job`` returned.

        Raises:
            StoreError: the writer is closed; or the database could not be opened; or the job
                left a transaction open (it was rolled back).
            Exception: whatever ``job`` raised.
        """
        return self._send(_READ, job)

    async def _send(self, kind: int, job: Callable[[sqlite3.Connection], T]) -> T:
        """Send a write or a read (``kind``) and return its job's result (see those)."""
        if kind == _READ:
            # A caller cancelled already sends nothing (on trio its wait would raise only after
            # the thread may have taken the job: too late to skip it).
            await anyio.lowlevel.checkpoint_if_cancelled()
        committer = self._committer
        call: _Call[T] = _Call(kind, job)
        call.arm(committer)
        waker = call.waker
        assert waker is not None
        if waker.defer is None:
            return await call.call(committer)
        # Every commit's and read's path on asyncio: _Call.call and _Call.wait written out, two
        # coroutine objects fewer alive per call in flight (a store's tail read is mostly this
        # round trip, and two coroutine frames fewer is a measurable part of it).
        if committer.submit(call):
            waker.defer(committer.flush, waker)
        try:
            await cast("asyncio.Future[None]", call.signal)
        except BaseException:
            call.abandoned = True
            raise
        return call.outcome()

    def statistics(self) -> WriterStatistics:
        """What the writer has done so far.

        Returns:
            A snapshot; it already counts the transaction of every call that has returned.
        """
        return WriterStatistics(*_counters(self._committer))

    @property
    def closed(self) -> bool:
        """True once :meth:`aclose` was called: no job is accepted any more."""
        return self._committer.closed

    async def aclose(self) -> None:
        """Run every job already queued, close the connection and stop the thread. Idempotent.

        Waits without blocking the event loop, shielded from cancellation (the jobs queued run
        either way). Jobs sent after this is called are refused with :class:`StoreError`.
        """
        call: _Call[None] = _Call(_CLOSE, None)
        call.arm(self._committer)
        thread = self._committer.request_close(call)
        if thread is None:
            return
        if call.waker is not None:
            with anyio.CancelScope(shield=True):
                await call.wait()
        # The thread's last act was to wake us: this join returns at once.
        thread.join()

    async def __aenter__(self) -> SQLiteWriter:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def abandon(self) -> bool:
        """Close without waiting, for an owner that is being garbage-collected unclosed (it
        warns for itself). True when a thread was running.

        The writes already sent are still committed, then the thread ends.
        """
        committer: _GroupCommitter | None = getattr(self, "_committer", None)
        if committer is None or committer.thread is None or committer.closed:
            return False
        committer.request_close(_Call(_CLOSE, None))
        return True

    def __del__(self) -> None:
        committer: _GroupCommitter | None = getattr(self, "_committer", None)
        if committer is None or committer.thread is None or committer.closed:
            return
        warnings.warn(
            "SQLiteWriter was not closed; call aclose()",
            ResourceWarning,
            stacklevel=2,
            source=self,
        )
        # Never join here: this may run on any thread, even the writer's own.
        committer.request_close(_Call(_CLOSE, None))
