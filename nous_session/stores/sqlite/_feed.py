"""The SQLite store's change feed: one ``PRAGMA data_version`` poller per store, shared by its
watches (:class:`ChangeMonitor`), and solo mode, in which it reads nothing while the store's
own writer is the only connection that commits (:class:`OwnCommits`).

SQLite has no LISTEN/NOTIFY; ``data_version`` changes for one connection whenever another
commits to the file, and costs microseconds to read. One thread per store polls it, reads the
watched sessions' heads only when it moved, backs off while every change it reads is its own
watchers' commits, and watches for a writer to appear on a file that has none. The design and
its measurements: docs/internals.md, "Change feeds".

Solo mode. A writable store's writer keeps an account (:class:`OwnCommits`, armed by the first
watch): after each write group it peeks at the WAL-index header (H), *then* reads
``data_version`` on its own connection (V), which moves only when another connection has
committed since the writer last read it; it keeps H, and is ``shared`` for good once V moved.
Temporary triggers on its connection note each session row its commits change (count,
horizon). Around each batch of jobs it bumps an epoch (odd while a batch runs). The feed's
thread, while solo, peeks at the header each poll and reads the epoch before and after:

* no commit of another connection goes unseen. One that lands before the writer's V read moves
  V (every V read since the connection was armed is compared with the one before, so the reads
  chain back to the arming). One that lands after it changes the header past H: the feed,
  seeing a header other than H while the epoch was the same even number before and after its
  peek (no batch of ours ran meanwhile, so the header can only be another's), leaves solo mode;
  and if our writer commits first, its next V has moved. A commit landing between our peek and
  our V read moves V: peek first, then V, so the header kept never hides another's commit;
* what our own commits change reaches the watches that do not hold it (another actor of the
  session, a direct store call such as an erasure): the feed takes the triggers' notes each
  poll and offers each watched session's new head. Notes are handed over only after the
  commit, and only while a feed thread listens; a watch that comes later reads its session's
  head itself (after the commit, so nothing falls between). A group with a failed job (its
  savepoint rolled back, or the whole group) hands over names only: the feed reads those heads;
  so does a batch's read job that writes in a transaction of its own (an erasure), which may
  have rolled back what it noted;
* the arming reads H then V the same way, from the writer's thread between its jobs; a session
  an actor loaded before it was read after any commit the arming's V does not cover, and a
  connection the writer opens again (after an error) cannot vouch for the gap: it ends solo.

Leaving solo mode is for good (for this store object): the thread lists every watched session
with the head it last saw, and from then on checks ``data_version`` and reads what moved, as
before; only the heads that moved meanwhile are pushed. The writer's notes go on: each read
first offers the heads our commits made (and lists them as last seen), so a session one of
them moved and another connection deleted before the read does not read as unmoved.

Deletes. A head is (count, horizon, identity: the row's ``uid``). A watched session whose count
went down (a row that is gone reads as count 0), whose identity changed (deleted and made
again, as long as it was), or that our writer's notes say it deleted (its trigger notes the
delete apart from the head a remake overwrites) gets ``-1``, whatever its watchers hold: they
read, and an actor finds its session deleted. So does a watcher that holds events of a session
with another identity than the one it names, or read as count 0, or, in a watch's first head,
below what it holds (:data:`~nous_session.stores._watch.GONE`): a new watch has no head of the
feed's to compare with.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Set
from contextlib import suppress
from typing import Final, TypeAlias
from urllib.parse import quote

from nous_session._logging import get_logger
from nous_session.stores._watch import GONE, HELD, HOLD_AT_MOST, UNSURE, WAKE, Watch, Watches

__all__ = ["BACK_OFF_AT_MOST", "DEFAULT_POLL", "ChangeMonitor", "OwnCommits", "beside"]

DEFAULT_POLL: Final = 0.005
"""Seconds between two change checks (``PRAGMA data_version``) of a watched SQLite store."""

BACK_OFF_AT_MOST: Final = 8
"""The longest wait between two change checks, in polls, while every change read is one the
watchers hold already: another writer's commit is then seen within this many polls."""

_logger = get_logger("nous_session.sqlite")

Head: TypeAlias = tuple[int, int, str | None]
"""A session's head as the feed reads it: its count, its horizon, and its identity (its row's
``uid``; None while it has no row). Another identity is another session: the one watched was
deleted, even if the new one has as many events."""


class ChangeMonitor(Watches[tuple[int, Head, float]]):
    """The change-check thread of one SQLite file, and the watches it serves.

    Args:
        path: the database file.
        poll: seconds between two change checks.
        own: the store writer's account of its commits (armed), for solo mode; None for a
            store that does not write (the feed then reads every change).
    """

    def __init__(self, path: str, poll: float, own: OwnCommits | None = None) -> None:
        super().__init__()
        self._path = path
        self._poll = poll
        self._own = own
        # Solo mode: no other connection has committed to the file since our writer was
        # armed, so only the changes its commits made are looked at (see the module doc).
        self._solo = own is not None and own.armed and not own.shared
        self._fresh: set[str] = set()  # sessions with a watch that has not had its head yet
        self._heads: dict[str, Head] = {}  # the heads the thread last saw
        # Watches whose owner was committing when a head it did not hold came: what to push
        # (and the head it stands for), asked again every poll until the commit has answered.
        # With when it was first held back: it is pushed after HOLD_AT_MOST in any case (an
        # owner whose commits keep failing without reading the store is always committing).
        self._thread: threading.Thread | None = None  # None once it has decided to end
        self._stopped = False  # the store is closing: the thread ends, none starts
        # Set by stop() and by a new watch: the thread's sleep ends at once.
        self._wake = threading.Event()
        self._membership = False  # a session was first watched or left: relist them
        self.checks = 0  # change checks made (for tests)
        self.reads = 0  # head reads made after a change (for tests)
        self.lookups = 0  # solo mode's reads of some sessions' heads (for tests)

    def _joined(self, watch: Watch) -> None:
        """The watch gets the session's head as the thread first sees it, then each new head
        (and ``-1`` after the thread had to reopen its connection, or when the session was
        deleted: see the module doc); ``known`` says what the watcher holds as (count,
        horizon)."""
        self._fresh.add(watch.session_id)
        self._membership = True
        if self._thread is None and not self._stopped:
            if self._own is not None:
                # Our writer's changes are kept for the thread from now on (it reads the
                # new watch's head itself, so a commit made before is not missed either).
                self._own.listening = True
            self._thread = threading.Thread(
                target=self._serve, name="nous_session-sqlite-feed", daemon=True
            )
            self._thread.start()
        elif not self._solo:
            self._wake.set()  # a thread that backed off gives the new watch its head now

    def _left(self, session_id: str) -> None:
        self._heads.pop(session_id, None)
        self._fresh.discard(session_id)
        self._membership = True

    def stop(self) -> None:
        """End the thread and wait (at most :data:`_STOP_WAIT` seconds, usually far less: it
        is woken from its sleep) until it has closed its connection. The store calls it
        before closing its writer, so that the writer's connection is the file's last and
        checkpoints and removes the WAL, leaving the file as a store that nobody followed
        leaves it. Called on the event loop's thread: no hop to a worker thread, so a close
        in a cancelled scope or at a loop's end still finishes."""
        with self._lock:
            self._stopped = True
            thread = self._thread
        self._wake.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join(_STOP_WAIT)

    # The thread's side ---------------------------------------------------------------------

    def _serve(self) -> None:
        # A daemon thread: it only reads, so being stopped at interpreter exit loses nothing.
        connection: sqlite3.Connection | None = None
        version: int | None = None
        listed: set[str] = set()  # the names in the connection's table of watched sessions
        shm: int | None = None  # the -shm file, to peek at its header
        header = b""  # the header as last peeked at
        quiet = 0  # polls since the last data_version check
        wait = self._poll  # until the next check: longer while the reads wake nobody
        unwritten = _Unwritten()  # the file as last read while it had no writer
        lost = False  # the connection failed: the next one's first read wakes every watch
        last: dict[str, Head] = {}  # heads solo mode saw, for the first listing
        try:
            while True:
                with self._lock:
                    if not self._watches or self._stopped:
                        self._thread = None  # a new watch starts a new thread
                        if self._own is not None:
                            self._own.listening = False
                        return
                    fresh, self._fresh = self._fresh, set()
                    names = set(self._watches) if self._membership or connection is None else None
                    self._membership = False
                try:
                    if connection is None:
                        connection = self._open()
                        if connection is None:  # no writer now (no -wal)
                            self._poll_unwritten(unwritten, fresh, names or set())
                            self._sleep(self._poll)
                            continue
                        version, listed = None, set()
                        shm, header = _open_shm(self._path), b""
                        if lost or shm is None:
                            self._leave_solo()  # the -shm file may not be the one it was
                    if self._solo:
                        assert shm is not None
                        solo_wait = self._solo_poll(connection, shm, fresh, wait)
                        if solo_wait is not None:
                            wait = solo_wait
                            if self._unsure:
                                self._ask_again()
                                wait = self._poll
                            self._sleep(wait)
                            continue
                        # Another writer: list every watched session, with the head solo
                        # mode last saw (only what moved since is read, and pushed).
                        with self._lock:
                            names = set(self._watches)
                            self._membership = False
                            last = dict(self._heads)
                    if names is not None:
                        _list(connection, listed, names, last)
                        last = {}
                    if shm is not None:
                        peeked = os.pread(shm, _HEADER, 0)
                        if peeked == header and not fresh and quiet < _CHECK_EVERY:
                            quiet += 1
                            wait = self._poll  # a quiet file: a commit now is seen in a poll
                            self._sleep(wait)
                            continue
                        header, quiet = peeked, 0
                    current = connection.execute("PRAGMA data_version").fetchone()[0]
                    self.checks += 1
                    if current != version or fresh:
                        reopened = version is None and lost and bool(self._heads)
                        lost = False
                        version = current
                        if self._read_heads(connection, fresh, reopened):
                            wait = self._poll
                        else:  # every change read was one the watchers hold: back off
                            wait = min(wait * 2, self._poll * BACK_OFF_AT_MOST)
                except sqlite3.Error as error:
                    _logger.debug("nous_session.sqlite_feed_lost", error=repr(error))
                    if connection is not None:
                        lost = True
                        with suppress(sqlite3.Error):
                            connection.close()
                    connection = None
                    _close_shm(shm)
                    shm = None
                    wait = self._poll
                    last = {}  # the next connection's first read wakes every watch
                    with self._lock:
                        self._fresh |= fresh  # they still need their heads
                if self._unsure:
                    self._ask_again()
                    wait = self._poll  # an owner's commit in flight answers within a poll
                self._sleep(wait)
        finally:
            _close_shm(shm)
            if connection is not None:
                with suppress(sqlite3.Error):
                    connection.close()

    def _sleep(self, seconds: float) -> None:
        """Wait ``seconds``, or until stop() or a new watch wakes the thread (this thread's
        own event; no event loop waits on it)."""
        self._wake.wait(seconds)
        if not self._stopped:  # stop()'s wake-up stays set: every later sleep ends at once
            self._wake.clear()

    def _open(self) -> sqlite3.Connection | None:
        """A read-only connection to the file, or None while no writer has made its WAL."""
        if not os.path.exists(beside(self._path, "-wal")):
            return None
        connection = _connect(self._path, "mode=ro")
        try:
            connection.execute("SELECT 1 FROM nous_sessions LIMIT 1").fetchall()
        except BaseException:
            connection.close()
            raise
        return connection

    def _poll_unwritten(self, unwritten: _Unwritten, fresh: set[str], names: set[str]) -> None:
        """One poll while the file has no writer (no -wal). One may have come and gone since
        the last poll (opened, committed, closed: its WAL checkpointed into the file and
        removed), so the file itself is read when :meth:`_Unwritten.due` says so; and the
        heads held back for an owner's commit in flight are asked about again, as every poll
        does."""
        now = _stamp(self._path)
        if fresh or unwritten.due(now):
            began = time.time_ns()
            self._read_file(fresh, names)
            unwritten.stamp, unwritten.read_at, unwritten.quiet = now, began, 0  # it succeeded
        else:
            unwritten.quiet += 1
        if self._unsure:
            self._ask_again()

    def _read_file(self, fresh: set[str], names: set[str]) -> None:
        """Read the watched sessions' heads from the file while no writer has it open (no
        -wal), through a connection of its own that opens it as immutable: such a connection
        creates no -wal or -shm file (reading never writes), and it is closed at once, as it
        would never see a later change. A writer that starts meanwhile makes its -wal first,
        and the next poll follows it through the feed's own connection."""
        connection = _connect(self._path, "mode=ro&immutable=1")
        try:
            # Listed with the heads last read: only what moved since is pushed (a name never
            # read has _UNREAD, so it is read in any case).
            with self._lock:
                last = [(name, *self._heads.get(name, _UNREAD)) for name in names]
            connection.execute(_WATCHED)
            connection.executemany(_LISTED, last)
            self._read_heads(connection, fresh, False)
        finally:
            connection.close()

    def _solo_poll(
        self, connection: sqlite3.Connection, shm: int, fresh: set[str], wait: float
    ) -> float | None:
        """One poll in solo mode; returns the wait until the next, or None once it has left
        solo mode. It leaves when
        another connection has committed: the writer saw its ``data_version`` move, or the
        WAL-index header is not the one our writer's last commit left while the writer is
        not running a batch (it reads the epoch before and after the peek). Otherwise it
        pushes what our writer's commits changed in watched sessions (the trigger's notes;
        a session whose note is unknown, as after a failed job, is read), and the heads of
        new watches (read): no ``data_version``, no list of the watched sessions."""
        own = self._own
        assert own is not None
        epoch, mine, shared = own.look()
        peeked = os.pread(shm, _HEADER, 0)
        if shared or (not epoch & 1 and own.epoch == epoch and peeked != mine):
            self._leave_solo()
            return None
        changed, gone = own.take()
        if not changed and not fresh:
            return self._poll  # a quiet file: a commit now is seen within a poll
        pushed_before = self.pushes
        with self._lock:
            heads: dict[str, Head] = {}
            unknown = set(fresh)
            for name, head in changed.items():
                if name not in self._watches:
                    continue
                if head is None:
                    unknown.add(name)
                elif name in gone or _news(head, self._heads.get(name)):
                    # A session deleted is offered even when its head reads as the feed
                    # last saw it (never seen between the two).
                    heads[name] = head
        if unknown:
            read = _heads_of(connection, unknown)
            self.lookups += 1
            with self._lock:  # a new watch gets its head in any case, others what moved
                heads.update(
                    (name, head)
                    for name, head in read.items()
                    if name in fresh or name in gone or _news(head, self._heads.get(name))
                )
        self._dispatch([(name, *head) for name, head in heads.items()], fresh, False, gone)
        if self.pushes != pushed_before:
            return self._poll
        return min(wait * 2, self._poll * BACK_OFF_AT_MOST)  # only our watchers' own commits

    def _leave_solo(self) -> None:
        """Another connection has committed (or may have): from now on, for good, the thread
        checks ``data_version`` and reads every watched session's head, as a store that does
        not write does; the first read wakes every watch whose owner is not up to date."""
        with self._lock:
            if not self._solo:
                return
            self._solo = False
        _logger.debug("nous_session.sqlite_feed_shared", path=self._path)

    def _read_heads(self, connection: sqlite3.Connection, fresh: set[str], reopened: bool) -> bool:
        """Read the heads of the watched sessions that moved since the last read, and push
        them (and, to fresh watches, their session's head in any case). True when a watch was
        woken: the poll keeps its pace (a head held back resets it too, in the loop).
        ``reopened``: the connection was lost, every watch gets ``-1``.

        The connection's temporary table lists the watched sessions with the head last read;
        one join finds the rows that differ, inside SQLite, so a read costs Python work only
        for the sessions that moved: with 200 sessions watched, the whole list read into
        Python took 0.75 ms, every poll of a busy file.
        """
        pushed_before = self.pushes
        gone = self._take_own(connection)
        moved = connection.execute(_MOVED).fetchall()
        if moved:
            noted = [(count, horizon, uid, name) for name, count, horizon, uid in moved]
            connection.executemany(_NOTED, noted)
        self.reads += 1
        self._dispatch(moved, fresh, reopened, gone)
        return self.pushes != pushed_before

    def _take_own(self, connection: sqlite3.Connection) -> set[str]:
        """Out of solo mode, our writer's notes (when it keeps them) are offered before the
        file is read, and listed as the heads last seen: a session one of its commits moved
        and that another connection deleted (maybe made it again) before this read would
        otherwise read as the feed last saw it, the deleted session's head never read at
        all. Returns the sessions our writer deleted whose heads are not known (a failed
        job's): the read that follows finds them, and pushes them ``-1``."""
        if self._own is None:
            return set()
        changed, gone = self._own.take()
        if not changed:
            return gone
        with self._lock:
            noted = [
                (name, *head)
                for name, head in changed.items()
                if head is not None
                and name in self._watches
                and (name in gone or _news(head, self._heads.get(name)))
            ]
        if noted:
            connection.executemany(
                _NOTED, [(count, horizon, uid, name) for name, count, horizon, uid in noted]
            )
            self._dispatch(noted, set(), False, gone)
        return gone - {name for name, *_ in noted}

    def _dispatch(
        self,
        moved: list[tuple[str, int, int, str | None]],
        fresh: set[str],
        reopened: bool,
        gone: Set[str] = frozenset(),
    ) -> None:
        """Offer the heads ``moved`` (name, count, horizon, uid) to their sessions' watches, and
        to ``fresh`` watches of a session that did not move their head as last seen; the
        watches of a session in ``gone`` (deleted since: our writer's notes say so) get
        ``-1``."""
        with self._lock:
            for name, count, horizon, uid in moved:
                watches = self._watches.get(name)
                if watches is None:
                    continue  # left meanwhile
                head = (count, horizon, uid)
                before = self._heads.get(name)
                self._heads[name] = head
                # -1 (read everything): a reopened connection, another writer's snapshot, or
                # a session deleted (maybe made again since): our writer deleted it, or its
                # count went down (by nothing but a delete, after which a row that is gone
                # reads as count 0), or its identity changed; every watcher reads, whatever
                # it holds, and an actor finds it deleted.
                deleted = name in gone or (
                    before is not None
                    and (count < before[0] or (before[2] is not None and uid != before[2]))
                )
                moved_on = before is None or horizon == before[1]
                pushed = count if moved_on and not reopened and not deleted else -1
                for watch in watches:
                    self._offer(watch, pushed, head, reopened or deleted)
                fresh.discard(name)
            # A new watch of a session whose head did not move: it still gets that head.
            for name in fresh:
                watches = self._watches.get(name)
                current = self._heads.get(name)
                if watches is None or current is None:
                    continue
                for watch in watches:
                    self._offer(watch, current[0], current, False)

    def _offer(self, watch: Watch, pushed: int, head: Head, always: bool) -> None:
        """Push ``pushed`` (standing for ``head``) to ``watch`` unless its owner holds it, or
        keep it to ask again while the owner's own commit is in flight (lock held), for
        ``HOLD_AT_MOST`` seconds at most."""
        held = self._unsure.pop(watch, None)
        first = watch.first  # its first head: the feed's first read of it
        if first:
            watch.first = False
        verdict = WAKE if always else watch.verdict(head[0], head[1], head[2], first=first)
        if verdict == UNSURE:
            now = time.monotonic()
            since = now if held is None else held[2]
            if now - since < HOLD_AT_MOST:
                self._unsure[watch] = (pushed, head, since)
                return
        if verdict != HELD:
            # GONE: no event stored where the owner holds some (deleted, as the first read
            # of a watch may find): it reads whatever there is.
            watch.push(-1 if verdict == GONE else pushed)
            self.pushes += 1

    def _ask_again(self) -> None:
        """Offer again the heads that came while their owners were committing."""
        with self._lock:
            for watch, (pushed, head, _) in list(self._unsure.items()):
                self._offer(watch, pushed, head, False)


class OwnCommits:
    """The store writer's account of its commits, for the feed's solo mode (the module doc
    says why it is sound): after each write group, the WAL-index header as it left it,
    whether another connection has committed since the writer's connection was armed
    (``shared``, for good), and what its commits changed in each session (count, horizon),
    noted by temporary triggers on the writer's connection.

    The writer's thread calls :meth:`arm` (as a read job) and the :class:`Fence` methods;
    the feed's thread calls :meth:`look` and :meth:`take`.
    """

    def __init__(self, path: str) -> None:
        self._path = path
        self._lock = threading.Lock()
        self.epoch = 0  # odd while the writer runs a batch of jobs
        self.shared = False  # another connection committed (or may have): no solo mode
        self.listening = False  # a feed thread takes the changes (the feed's)
        self._connection: sqlite3.Connection | None = None  # the connection armed
        self._shm: int | None = None
        self._version = 0  # its data_version after its last write group
        self._header = b""  # the WAL-index header after its last write group
        self._group: dict[str, Head] = {}  # the triggers' notes, this group
        self._group_gone: set[str] = set()  # the sessions this group deleted (or renamed)
        self._changed: dict[str, Head | None] = {}  # for the feed; None: unknown
        # For the feed: the sessions deleted since it last took the notes. Apart from their
        # heads, which a later commit (the session made again) overwrites.
        self._gone: set[str] = set()

    @property
    def armed(self) -> bool:
        return self._connection is not None

    # The writer's thread -------------------------------------------------------------------

    def arm(self, connection: sqlite3.Connection) -> None:
        """Start keeping account on the writer's ``connection`` (once): its triggers, and the
        header and data_version every later commit is compared with. The header is peeked
        first: another commit between the two reads moves the header past what we keep, and
        the feed's first look sees it as another writer's."""
        if self._connection is not None or self.shared:
            return
        shm = _open_shm(self._path)
        if shm is None:
            self.shared = True  # nothing to peek at: the feed reads every change
            return
        try:
            connection.create_function("nous_session_changed", 4, self._note)
            for statement in _TRIGGERS:
                connection.execute(statement)
            header = os.pread(shm, _HEADER, 0)
            version = connection.execute("PRAGMA data_version").fetchone()[0]
        except (OSError, sqlite3.Error) as error:
            _logger.debug("nous_session.sqlite_solo_failed", error=repr(error))
            _close_shm(shm)
            self.shared = True
            return
        with self._lock:
            self._shm, self._header, self._version = shm, header, version
            self._connection = connection

    def _note(self, name: str, count: int, horizon: int, uid: str | None) -> None:
        """The triggers' function (a row of nous_sessions was written; a count of -1: the
        row was deleted, or renamed away): on the writer's thread, inside the job's
        statement; it must not raise."""
        if count < 0:
            self._group_gone.add(name)
            count = horizon = 0
        self._group[name] = (count, horizon, uid)

    def begin(self) -> None:
        self.epoch += 1

    def end(self) -> None:
        """The batch ended. What its triggers noted since its write group's commit was noted
        by a read job that writes in a transaction of its own (an erasure): one that failed
        rolled back what was noted, so the feed reads those heads (names only)."""
        if self._group:
            group, self._group = self._group, {}
            gone, self._group_gone = self._group_gone, set()
            with self._lock:
                if self.listening:
                    self._changed.update(dict.fromkeys(group))
                    self._gone |= gone
        self.epoch += 1

    def opened(self, connection: sqlite3.Connection) -> None:
        """The writer opened a connection: one that replaces the armed one cannot vouch for
        what was committed between the two."""
        if self._connection is not None and connection is not self._connection:
            self._share()

    def committed(self, connection: sqlite3.Connection | None, failed: bool) -> None:
        """A write group ended (committed, or ``failed`` in part or as a whole): while solo,
        peek at the header, then read data_version (in this order: a commit of another
        connection in between moves the version); and hand what the group changed to the
        feed (solo or not: out of solo mode, the feed offers our commits' heads before it
        reads the file, so that a delete made right after one of them is not missed)."""
        group, self._group = self._group, {}
        gone, self._group_gone = self._group_gone, set()
        if self._connection is None:
            return
        if connection is not self._connection:
            self._share()  # its triggers are not on that connection: it noted nothing
            return
        header = None
        if not self.shared:
            assert self._shm is not None
            try:
                header = os.pread(self._shm, _HEADER, 0)
                version = connection.execute("PRAGMA data_version").fetchone()[0]
            except (OSError, sqlite3.Error) as error:
                _logger.debug("nous_session.sqlite_solo_failed", error=repr(error))
                self._share()
            else:
                if version != self._version:
                    self._share()
        with self._lock:
            if header is not None and not self.shared:
                self._header = header
            if self.listening:
                # A failed job's notes may be of changes rolled back: the feed reads those.
                for name, head in group.items():
                    self._changed[name] = None if failed else head
                self._gone |= gone  # rolled back, maybe: then it costs a read

    def _share(self) -> None:
        """Another connection has committed, or may have: no solo mode from now on. The
        notes go on (they are our commits' heads, which a feed out of solo mode offers)."""
        with self._lock:
            self.shared = True

    def close(self) -> None:
        """Close the -shm descriptor (the store is closed, its writer first)."""
        with self._lock:
            shm, self._shm = self._shm, None
            self._connection = None
        _close_shm(shm)

    # The feed's thread ---------------------------------------------------------------------

    def look(self) -> tuple[int, bytes, bool]:
        """The writer's epoch, the header after its last write group, and ``shared``."""
        with self._lock:
            return self.epoch, self._header, self.shared

    def take(self) -> tuple[dict[str, Head | None], set[str]]:
        """What our writer's commits changed since the last take: the head by session, or
        None where it is not known; and the sessions they deleted (each among the
        former)."""
        with self._lock:
            changed, self._changed = self._changed, {}
            gone, self._gone = self._gone, set()
            return changed, gone


# The first copy of the WAL index header at the start of the -shm file (SQLite's WAL format,
# "the wal-index header"): every commit changes it (its frame count, its change counter, or on
# a WAL restart its salts), so while it reads the same no other connection has committed.
_HEADER: Final = 48
# How long closing the store waits for the thread to end (it ends within a query's time).
_STOP_WAIT: Final = 1.0
# The feed connection's busy timeout: a read that meets a lock (a writer's WAL recovery, say)
# gives up soon and is tried again at the next poll, so the thread never stalls for long.
_BUSY_TIMEOUT: Final = 0.1
# Polls between two data_version checks while the header reads the same: a safety net (the
# header peek is this module's reading of SQLite's format, data_version is SQLite's API).
_CHECK_EVERY: Final = 100


def _connect(path: str, flags: str) -> sqlite3.Connection:
    """The feed's kind of connection to ``path`` (its URI ``flags``: read-only, and maybe
    immutable), for the feed's thread alone."""
    return sqlite3.connect(
        f"file:{quote(os.path.abspath(path))}?{flags}",
        uri=True,
        isolation_level=None,
        check_same_thread=False,
        timeout=_BUSY_TIMEOUT,
    )


_Stamp: TypeAlias = tuple[int, int, int, int]
"""A file's inode, size, and modification and change times (ns)."""


class _Unwritten:
    """The file as last read while it had no writer, and when to read it again: when its stat
    changed; while that stat is too recent to prove nothing changed since (:func:`_racy`);
    and every :data:`_CHECK_EVERY` polls in any case."""

    __slots__ = ("quiet", "read_at", "stamp")

    def __init__(self) -> None:
        self.stamp: _Stamp | None = None  # None: never read (or the file could not be stat'ed)
        self.read_at = 0  # when that read began (time.time_ns(), the clock of a file's times)
        self.quiet = 0  # polls since

    def due(self, now: _Stamp | None) -> bool:
        return now != self.stamp or _racy(now, self.read_at) or self.quiet >= _CHECK_EVERY


def _stamp(path: str) -> _Stamp | None:
    """What a writer that came and went changes in the file itself (its WAL checkpointed into
    it): identity, size and times; None when it cannot be read."""
    try:
        status = os.stat(path)
    except OSError:
        return None
    return (status.st_ino, status.st_size, status.st_mtime_ns, status.st_ctime_ns)


def _racy(stamp: _Stamp | None, read_at: int) -> bool:
    """Whether the file's last change (``stamp``'s times) is too close to the last read (which
    began at ``read_at``) for an unchanged stamp to prove nothing changed since: a file's times
    have the granularity of its filesystem and of the kernel's clock tick, as git's index
    treats a "racily clean" entry. Two seconds covers the coarsest in use. (A time far in the
    future, a file copied from a machine with another clock, is not racy: any change moves
    it back to now.)"""
    if stamp is None:
        return False
    return abs(read_at - max(stamp[2], stamp[3])) < _RACY_NS


_RACY_NS: Final = 2_000_000_000


def _open_shm(path: str) -> int | None:
    """A descriptor of the file's -shm (the WAL index), or None (peeking is then skipped and
    every poll asks SQLite). Opened after the feed's connection, which keeps it in use, so
    it is the file SQLite uses, not one a last connection removed."""
    try:
        return os.open(beside(path, "-shm"), os.O_RDONLY)
    except OSError:
        return None


def beside(path: str, suffix: str) -> str:
    """The name of the database file's ``-wal`` or ``-shm`` (``suffix``) file: next to the file
    ``path`` names, as SQLite makes them, symbolic links resolved (a store opened through a
    link to its file has them next to the file, not next to the link)."""
    return os.path.realpath(path) + suffix


def _close_shm(shm: int | None) -> None:
    if shm is not None:
        with suppress(OSError):
            os.close(shm)


# The watched sessions whose head differs from the one last read (a session not stored reads
# as (0, 0, NULL); a name just listed has (-1, -1), so it is read once in any case): its
# count, its horizon, or its identity (a session deleted and made again, as long as it was).
_MOVED: Final = (
    "SELECT w.name, coalesce(s.count, 0), coalesce(s.horizon, 0), s.uid"
    " FROM temp.nous_watched AS w LEFT JOIN main.nous_sessions AS s ON s.name = w.name"
    " WHERE coalesce(s.count, 0) != w.count OR coalesce(s.horizon, 0) != w.horizon"
    " OR s.uid IS NOT w.uid"
)
_NOTED: Final = "UPDATE temp.nous_watched SET count = ?, horizon = ?, uid = ? WHERE name = ?"
_WATCHED: Final = (
    "CREATE TEMP TABLE IF NOT EXISTS nous_watched"
    " (name TEXT PRIMARY KEY, count INTEGER, horizon INTEGER, uid TEXT) WITHOUT ROWID"
)
_LISTED: Final = "INSERT INTO temp.nous_watched (name, count, horizon, uid) VALUES (?, ?, ?, ?)"
_UNREAD: Final = (-1, -1, None)  # the head of a name never read: read it in any case


# The writer connection's temporary triggers: every change of a session's count or horizon
# (a commit, a snapshot, an erasure, a fork, a deletion) is noted by OwnCommits._note.
_NEW: Final = "SELECT nous_session_changed(NEW.name, NEW.count, coalesce(NEW.horizon, 0), NEW.uid);"
_OLD: Final = "SELECT nous_session_changed(OLD.name, -1, 0, NULL);"  # -1: the row is gone
_TRIGGERS: Final = tuple(
    f"CREATE TEMP TRIGGER IF NOT EXISTS nous_session_{name} AFTER {event}"
    f" ON main.nous_sessions BEGIN {body} END"
    for name, event, body in (
        ("inserted", "INSERT", _NEW),
        ("updated", "UPDATE OF count, horizon", _NEW),
        ("renamed", "UPDATE OF name", _OLD + " " + _NEW),
        ("deleted", "DELETE", _OLD),
    )
)

# Solo mode's read of some sessions' heads, at most this many names a statement.
_LOOKUP_AT_MOST: Final = 500


def _heads_of(connection: sqlite3.Connection, names: set[str]) -> dict[str, Head]:
    """The head of each of ``names``; (0, 0, None) for a session not stored."""
    heads: dict[str, Head] = dict.fromkeys(names, (0, 0, None))
    ordered = sorted(names)
    for start in range(0, len(ordered), _LOOKUP_AT_MOST):
        chunk = ordered[start : start + _LOOKUP_AT_MOST]
        marks = ", ".join("?" * len(chunk))
        rows = connection.execute(
            "SELECT name, coalesce(count, 0), coalesce(horizon, 0), uid"
            f" FROM main.nous_sessions WHERE name IN ({marks})",
            chunk,
        ).fetchall()
        for name, count, horizon, uid in rows:
            heads[name] = (count, horizon, uid)
    return heads


def _news(head: Head, before: Head | None) -> bool:
    """Whether ``head`` (a note of our writer's) tells the feed something it has not seen
    (``before``: the head it last saw): not that head, nor an older one of the same session
    (a note taken after the feed read past it)."""
    if before is None:
        return True
    if head[2] == before[2] and head[2] is not None:
        return head[0] > before[0] or (head[0] == before[0] and head[1] != before[1])
    return head != before


def _list(
    connection: sqlite3.Connection,
    listed: set[str],
    names: set[str],
    last: dict[str, Head],
) -> None:
    """Make the connection's table of watched sessions list exactly ``names`` (``listed``:
    what it lists now, updated), a new name with its head as ``last`` read (solo mode's),
    else :data:`_UNREAD`: read once in any case."""
    if not listed:
        connection.execute(_WATCHED)
    gone = listed - names
    new = names - listed
    if gone:
        connection.executemany("DELETE FROM temp.nous_watched WHERE name = ?", [(n,) for n in gone])
    if new:
        connection.executemany(_LISTED, [(n, *last.get(n, _UNREAD)) for n in new])
    listed -= gone
    listed |= new
