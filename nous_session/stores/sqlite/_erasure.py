"""Erasure in a SQLite file: rewriting every stored copy, then scrubbing the file."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import attrs

from nous_session.codec import decode, decode_rows, encode
from nous_session.erasure import (
    Erasure,
)
from nous_session.errors import StoreError
from nous_session.event import Event
from nous_session.stores._erase import Erasing, ErasureRequest, erase_rows
from nous_session.stores._lineage import SessionRow
from nous_session.stores.base import (
    place,
)
from nous_session.stores.sqlite._errors import _errors
from nous_session.stores.sqlite._rows import _inherited, _row, _rows
from nous_session.stores.sqlite._sql import CHILDREN, FORGET_METADATA, OWN_KEPT_SEQS

T = TypeVar("T")


@attrs.frozen
class _FileCopies:
    """The copies of a session's events in a SQLite file (see :class:`Copies`): a copy is
    named by its table and session id."""

    connection: sqlite3.Connection
    path: str

    def row(self, name: str) -> SessionRow[int] | None:
        return _row(self.connection, name)

    def held(self, row: SessionRow[Any], low: int) -> Iterable[int]:
        yield from (seq for seq, _ in _rows(self.connection, row, low))
        yield from (seq for seq, _ in _inherited(self.connection, row, low)[1] if seq >= low)
        yield from (seq for (seq,) in self.connection.execute(OWN_KEPT_SEQS, (row.key, low)))

    def events(self, name: str, row: SessionRow[Any]) -> list[Event]:
        return decode_rows(_rows(self.connection, row, 0), place(name, self.path))

    def children(self, row: SessionRow[Any]) -> list[tuple[str, int | None]]:
        return self.connection.execute(CHILDREN, (row.uid,)).fetchall()

    def copies(self, member: str, seq: int) -> list[tuple[tuple[str, int], Event]]:
        found = _row(self.connection, member)
        assert found is not None
        copies: list[tuple[tuple[str, int], Event]] = []
        for table in ("nous_events", "nous_kept"):
            record = self.connection.execute(
                f"SELECT record FROM {table} WHERE sid = ? AND seq = ?", (found.key, seq)
            ).fetchone()
            if record is not None:
                event = decode(record[0], where=place(member, self.path)(seq))
                copies.append(((table, found.key), event))
        return copies

    def write(self, where: tuple[str, int], event: Event) -> None:
        table, sid = where
        self.connection.execute(
            f"UPDATE {table} SET record = ? WHERE sid = ? AND seq = ?",
            (encode(event), sid, event.seq),
        )

    def forget(self, record: bytes, members: Sequence[str], seq: int) -> None:
        self.connection.executemany(FORGET_METADATA, [(record.decode(), m, seq) for m in members])

    def append(self, row: SessionRow[Any], event: Event) -> None:
        self.connection.execute(
            "INSERT INTO nous_events (sid, seq, record) VALUES (?, ?, ?)",
            (row.key, event.seq, encode(event)),
        )
        self.connection.execute(
            "UPDATE nous_sessions SET count = ?, held = held + 1 WHERE id = ? AND count = ?",
            (event.seq + 1, row.key, event.seq),
        )


def _erase_rows(connection: sqlite3.Connection, request: ErasureRequest, path: str) -> Erasure:
    """Rewrite every stored copy of the events to erase, in one transaction with
    ``secure_delete`` on (the old records' space is zeroed); ``wanted`` None: the session's
    own events (and, with ``inherited``, those it took from its parent)."""
    dry_run = request.dry_run
    secure = connection.execute("PRAGMA secure_delete").fetchone()[0]
    connection.execute("PRAGMA secure_delete = ON")
    try:
        connection.execute("BEGIN" if dry_run else "BEGIN IMMEDIATE")
        try:
            done = erase_rows(_FileCopies(connection, path), request)
        except BaseException:
            if connection.in_transaction:
                connection.execute("ROLLBACK")
            raise
        connection.execute("ROLLBACK" if dry_run else "COMMIT")
    finally:
        connection.execute(f"PRAGMA secure_delete = {int(secure)}")
    return done


def _scrub(connection: sqlite3.Connection, rewrite: bool, path: str) -> tuple[bool, str]:
    """After an erasing commit: rebuild the file (``rewrite``) and checkpoint the WAL into
    it, truncating it. Returns whether no old page can remain, and what was done."""
    done = ["secure_delete zeroed the old records"]
    if rewrite:
        temp_store = connection.execute("PRAGMA temp_store").fetchone()[0]
        connection.execute("PRAGMA temp_store = MEMORY")  # no temporary copy on disk
        try:
            with _errors(f"VACUUM of {path} failed"):
                connection.execute("VACUUM")
        finally:
            connection.execute(f"PRAGMA temp_store = {int(temp_store)}")
        done.append("VACUUM rebuilt the file")
    with _errors(f"the WAL checkpoint of {path} failed"):
        busy, _, _ = connection.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    if busy:
        done.append(
            "the WAL could not be checkpointed and truncated: another connection holds an old"
            " snapshot (the WAL may still hold old pages; erase again once it is done)"
        )
        return False, "; ".join(done)
    done.append("the WAL was checkpointed and truncated")
    if not rewrite:
        done.append(
            "no VACUUM: free pages and stale copies from earlier writes may remain (not proven)"
        )
    return rewrite, "; ".join(done)


class FileErasure(Erasing):
    """:class:`~nous_session.stores.sqlite.SQLiteStore`'s erasure and vacuum: rows rewritten
    with ``secure_delete`` on, then the file rebuilt and its WAL truncated (``erase`` and
    ``erase_session`` take ``rewrite``)."""

    erase_options = frozenset({"rewrite"})

    path: str
    read_only: bool

    @property
    def url(self) -> str:
        raise NotImplementedError

    async def _run(self, function: Callable[[sqlite3.Connection], T]) -> T:
        raise NotImplementedError

    def _check_file(self) -> None:
        raise NotImplementedError

    async def vacuum(self) -> None:
        """Give the space of deleted events back to the file system (after a snapshot)."""

        if self.read_only:
            raise StoreError(f"the store {self.url} is open read-only")

        def vacuum(connection: sqlite3.Connection) -> None:
            # Outside any transaction (VACUUM cannot run in one): the writer's read path.
            self._check_file()
            with _errors(f"cannot vacuum {self.path}"):
                connection.execute("VACUUM")
                connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")

        await self._run(vacuum)

    async def _erase(self, request: ErasureRequest, *, rewrite: bool = True) -> Erasure:
        """Rewrite the rows in one transaction with ``PRAGMA secure_delete`` on, so SQLite
        zeroes the space the old records took. Then, with ``rewrite`` (the default),
        ``VACUUM`` rebuilds the whole file (temporary data in memory), so no free page and no
        stale copy an earlier page split or snapshot left behind survives; and a ``TRUNCATE``
        checkpoint copies the WAL into the file and empties it. The result is proven only
        when both happened: a reader in another connection holding an old snapshot makes the
        checkpoint give up after ``busy_timeout`` (the WAL may then still hold old pages;
        erase again, with the same seqs, once it is done). Without ``rewrite`` the result is
        not proven. ``VACUUM`` costs time in proportion to the file and holds the write lock
        meanwhile: every other commit to this file waits for it."""
        if type(rewrite) is not bool:
            raise ValueError(f"rewrite is True or False, got {rewrite!r}")
        session_id, dry_run = request.session_id, request.dry_run
        if self.read_only and not dry_run:
            raise StoreError(f"the store {self.url} is open read-only")
        what = f"cannot erase from session {session_id!r} in {self.path}"

        def erase(connection: sqlite3.Connection) -> Erasure:
            if not dry_run:
                self._check_file()
            with _errors(what):
                done = _erase_rows(connection, request, self.path)
            if dry_run:
                return attrs.evolve(done, detail="dry run: nothing was changed")
            try:
                proven, detail = _scrub(connection, rewrite, self.path)
            except StoreError as error:
                # The rows are erased (that transaction committed): every holder reads the
                # erased form; only the proof is missing.
                proven, detail = False, f"the events were erased, but {error} (not proven)"
            return attrs.evolve(done, proven=proven, detail=detail)

        # On the writer's thread outside its transactions (VACUUM cannot run in one): it runs
        # between two of its commits, so it is serialised with every write to this file.
        return await self._run(erase)
