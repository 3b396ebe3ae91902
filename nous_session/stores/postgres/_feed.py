"""One LISTEN connection per PostgresStore, shared by every session it watches
(:class:`Listener`), and the store's ``watch`` built on it (:class:`ListenerFeed`).

One daemon thread owns the connection and dispatches each notification to its session's
watches, waking their event loops from the thread; a head a watch's owner holds already wakes
nothing. After a (re)connection every watch is told to read what it may have missed; a
connection that dies silently is found by a ping after ``PING_AFTER`` seconds of silence. Why,
and what it costs: docs/internals.md, "Change feeds".
"""

from __future__ import annotations

import select
import threading
import time
from collections.abc import AsyncGenerator, Callable
from contextlib import suppress
from typing import Any, ClassVar, Final, TypeVar

import orjson
import psycopg
from psycopg import sql

from nous_session._logging import get_logger
from nous_session.stores._watch import (
    ASK_AGAIN,
    GONE,
    HELD,
    HOLD_AT_MOST,
    UNSURE,
    Known,
    Watch,
    Watches,
    closing,
)
from nous_session.stores.postgres._sql import APPLICATION

__all__ = ["KEEPALIVE", "Listener", "ListenerFeed", "ListenerStalled"]

T = TypeVar("T")

_logger = get_logger("nous_session.postgres")

_HAVE_POLL: Final = hasattr(select, "poll")
_FIRST_BACKOFF: Final = 0.05
_MAX_BACKOFF: Final = 2.0
# The liveness check of an idle LISTEN connection (see the module docstring).
PING_AFTER: Final = 2.0
PING_TIMEOUT: Final = 2.0
# libpq's TCP keepalive settings for the LISTEN connection: the kernel probes an idle flow
# after 10 s, every 5 s, and gives up after 3 unanswered probes.
KEEPALIVE: Final[dict[str, Any]] = {
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
}


class ListenerStalled(ConnectionError):
    """The LISTEN connection did not answer a liveness check in time."""


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


class Listener(Watches[tuple[int, float]]):
    """The LISTEN thread of one store's channel, and the watches it serves."""

    def __init__(self, connect: Callable[[], psycopg.Connection[Any]], poll: float) -> None:
        super().__init__()
        self._connect = connect
        self._poll = poll
        self._connected = False
        self._thread: threading.Thread | None = None  # None once it has decided to end
        self.connections = 0  # connections made (for tests)
        # Watches whose owner was committing when a head it did not hold came: the head, to
        # offer again (see _offer) within ASK_AGAIN seconds, until that commit has answered,
        # and when it was first held back (it is pushed after HOLD_AT_MOST in any case).

    def _joined(self, watch: Watch) -> None:
        """The watch gets ``-1`` once listening (and after every reconnection), then the
        session's heads as their notifications arrive."""
        if self._connected:
            watch.heads.append(-1)
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._serve, name="nous_session-postgres-listener", daemon=True
            )
            self._thread.start()

    # The thread's side ---------------------------------------------------------------------

    def _unwatched(self) -> bool:
        """True (and the thread is no longer this listener's) when no watch is left."""
        with self._lock:
            if self._watches:
                return False
            self._thread = None
            self._connected = False
            return True

    def _serve(self) -> None:
        backoff = _FIRST_BACKOFF
        while True:
            if self._unwatched():
                return  # a new watch starts a new thread
            try:
                connection = self._connect()
                self.connections += 1
            except Exception as error:  # a bug too: the watches must not wait forever
                _logger.warning("nous_session.listener_connect_failed", error=_describe(error))
                time.sleep(backoff)  # this thread's own; no event loop waits on it
                backoff = min(backoff * 2, _MAX_BACKOFF)
                continue
            backoff = _FIRST_BACKOFF
            try:
                with self._lock:
                    self._connected = True
                    self._unsure.clear()  # -1 covers every head held back
                    for watches in self._watches.values():
                        for watch in watches:
                            watch.push(-1)  # (re)connected: read what happened meanwhile
                heard = time.monotonic()
                while True:
                    if self._unwatched():
                        return  # closing the connection first
                    if self._dispatch(connection):
                        heard = time.monotonic()
                    elif time.monotonic() - heard >= PING_AFTER:
                        self._ping(connection)
                        heard = time.monotonic()
            except Exception as error:
                _logger.warning("nous_session.listener_lost", error=_describe(error))
                with self._lock:
                    self._connected = False
                    # No one asks again while the connection is down (which may last):
                    # a head held back goes to its watch now.
                    for watch, (head, _) in self._unsure.items():
                        watch.push(head)
                        self.pushes += 1
                    self._unsure.clear()
            finally:
                with suppress(Exception):
                    connection.close()

    def _ping(self, connection: psycopg.Connection[Any]) -> None:
        """Ask the idle connection for ``SELECT 1`` and wait for the answer at most
        ``PING_TIMEOUT`` seconds, on the socket itself: a blocking call would wait as long as
        the dead connection does. Notifications that arrive meanwhile are dispatched.

        Raises:
            ListenerStalled: no answer in time (a silent drop).
        """
        pgconn = connection.pgconn
        deadline = time.monotonic() + PING_TIMEOUT
        pgconn.send_query(b"SELECT 1")
        while pgconn.flush():  # the request may not fit the socket's buffer at once
            if not self._wait_socket(pgconn.socket, deadline, write=True):
                raise ListenerStalled(f"no room to send a liveness check in {PING_TIMEOUT} s")
        while True:
            while not pgconn.is_busy():
                if pgconn.get_result() is None:  # the whole answer is in
                    self._deliver(pgconn)
                    return
            if not self._wait_socket(pgconn.socket, deadline, write=False):
                raise ListenerStalled(f"no answer to a liveness check in {PING_TIMEOUT} s")
            pgconn.consume_input()

    @staticmethod
    def _wait_socket(fd: int, deadline: float, *, write: bool) -> bool:
        """Wait until ``fd`` is ready (or in error: the next read says which) or ``deadline``
        passes; True when ready. With poll(2) where there is one: select(2) refuses a
        descriptor numbered 1024 or more, which a busy process's LISTEN connection may get."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        if not _HAVE_POLL:  # pragma: no cover - Windows
            ready = (
                select.select([], [fd], [], remaining)
                if write
                else select.select([fd], [], [], remaining)
            )
            return bool(ready[1] if write else ready[0])
        poller = select.poll()
        poller.register(fd, select.POLLOUT if write else select.POLLIN)
        return bool(poller.poll(remaining * 1000))

    def _deliver(self, pgconn: Any) -> bool:
        """Dispatch every notification libpq has read off the connection; True if any."""
        heads: list[tuple[str, int]] = []
        heard = False
        while (notification := pgconn.notifies()) is not None:
            heard = True
            head = _head(notification.extra)
            if head is not None:
                heads.append(head)
        self._push(heads)
        return heard

    def _push(self, heads: list[tuple[str, int]]) -> None:
        if heads:
            with self._lock:
                for session_id, head in heads:
                    for watch in self._watches.get(session_id, ()):
                        self._offer(watch, head)

    def _offer(self, watch: Watch, head: int) -> None:
        """Push ``head`` to ``watch`` unless its owner holds it already, or keep it to offer
        again while the owner's own commit is in flight (the lock held).

        A head the watcher holds (its own commit's, once published) would only wake it to
        compare and sleep again: a wake-up of its event loop from this thread for every
        commit it makes. Its own commit's notification mostly comes before the commit has
        answered it, so a head it does not hold yet while it commits is asked about again
        (:meth:`_ask_again`) rather than pushed, for ``HOLD_AT_MOST`` seconds at most (an
        owner whose commits keep failing without reading the store would hold it for as
        long as it tries). A ``known`` that raises counts as none. A session's delete
        notifies ``-1`` (see ``Statements.delete_session``): pushed as it is.
        """
        held_back = self._unsure.pop(watch, None)
        if watch.known is not None and head >= 0:
            if held_back is not None:
                head = max(head, held_back[0])
            verdict = watch.verdict(head)
            if verdict == HELD:
                return
            if verdict == UNSURE:
                now = time.monotonic()
                since = now if held_back is None else held_back[1]
                if now - since < HOLD_AT_MOST:
                    self._unsure[watch] = (head, since)
                    return
            if verdict == GONE:  # deleted and made again empty: read whatever there is
                head = -1
        watch.push(head)  # -1 (read everything) covers a head held back
        self.pushes += 1

    def _ask_again(self) -> None:
        """Offer again the heads that came while their owners were committing."""
        with self._lock:
            for watch, (head, _) in list(self._unsure.items()):
                self._offer(watch, head)

    def _dispatch(self, connection: psycopg.Connection[Any]) -> bool:
        """Hand the notifications of one read (or none, after ``poll`` seconds) to their
        sessions' watches. True when any arrived.

        Through libpq itself, as :meth:`_ping` reads the connection: wait for the socket,
        take in what arrived, then every notification libpq has parsed. psycopg's
        ``notifies()`` generator cost twice as much per notification (11 µs against 6, on
        a 2-core machine), and every process that follows a store hears every commit of
        it: each commit is one notification per listening process.

        Raises:
            psycopg.OperationalError: the connection is lost (the thread reconnects).
        """
        pgconn = connection.pgconn
        wait = ASK_AGAIN if self._unsure else self._poll
        if self._wait_socket(pgconn.socket, time.monotonic() + wait, write=False):
            pgconn.consume_input()
        heard = self._deliver(pgconn)
        if self._unsure:
            self._ask_again()
        return heard


def _head(payload: str | bytes) -> tuple[str, int] | None:
    """The (session, head) a commit's notification carries (a delete's: head ``-1``); None
    for anything else (another application's NOTIFY on the channel, say)."""
    try:
        value = orjson.loads(payload)
        return str(value["session"]), int(value["head"])
    except (ValueError, KeyError, TypeError):  # orjson.JSONDecodeError is a ValueError
        return None


class ListenerFeed:
    """:class:`~nous_session.stores.postgres.PostgresStore`'s change feed: every watch of one
    store shares one :class:`Listener`."""

    url: str
    direct_url: str
    _channel: str
    _connect_timeout: float
    _listener: Listener | None
    _listener_lock: threading.Lock

    async def _run(self, function: Callable[[], T]) -> T:
        raise NotImplementedError

    # The follower passes ``known`` (see nous_session._follower): a head it holds, such as
    # its own commit's, does not wake it.
    watch_takes_known: ClassVar[bool] = True

    async def watch(
        self,
        session_id: str,
        *,
        poll: float = 0.25,
        known: Known | None = None,
    ) -> AsyncGenerator[int, None]:
        """Yield the session's new head whenever a commit (from any process) lands.

        The first value, ``-1``, is yielded as soon as the store is listening, and again
        after every reconnection and when the session is deleted (by any process): the
        caller should read what it has missed then (``load(since=...)``). Each
        notification's head follows; a lost listener reconnects with a backoff. With
        ``known``, a callable that returns what the watcher holds as (count, horizon) and
        whether a commit of its own is in flight, a head at or below that count is not
        yielded, and one that comes while that commit is in flight is asked about again
        every few milliseconds until it has answered: the watcher's own commits do not wake
        it (an identity it returns too is not compared: a delete notifies ``-1`` itself).
        ``known`` is called from the listener's thread, so it must only read.

        Every watch of one store shares one LISTEN connection and one thread (``poll``, the
        seconds that thread waits for notifications before it checks whether any watch is
        left, is the first watch's). Close the generator (``aclosing``) to leave it; the
        thread ends once no watch is left.
        """
        await self._run(lambda: None)  # connect and migrate first
        with self._listener_lock:
            if self._listener is None:
                self._listener = Listener(self._listen, poll)
            listener = self._listener
        async with closing(listener.watch(session_id, known)) as heads:
            async for head in heads:
                yield head

    def _listen(self) -> psycopg.Connection[Any]:
        connection = psycopg.connect(
            self.direct_url,  # LISTEN needs a session of its own: never through a pooler
            autocommit=True,
            application_name=APPLICATION + " listener",
            connect_timeout=max(1, int(self._connect_timeout)),
            **KEEPALIVE,
        )
        try:
            connection.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self._channel)))
        except BaseException:
            connection.close()
            raise
        return connection
