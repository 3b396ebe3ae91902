"""Erasure in a SQLite file: rewriting every stored copy, then scrubbing the file."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

import attrs

from nous_session.codec import decode, encode
from nous_session.erasure import (
    Erasure,
)
from nous_session.event import Event
from nous_session.stores._erase import erase_rows
from nous_session.stores._lineage import SessionRow
from nous_session.stores.base import (
    place,
)
from nous_session.stores.sqlite._errors import _errors
from nous_session.stores.sqlite._rows import _inherited, _row, _rows
from nous_session.stores.sqlite._sql import CHILDREN, FORGET_METADATA, OWN_KEPT_SEQS


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

    def children(self, name: str) -> list[tuple[str, int | None]]:
        return self.connection.execute(CHILDREN, (name,)).fetchall()

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


def _erase_rows(
    connection: sqlite3.Connection,
    session_id: str,
    wanted: Sequence[int] | None,
    inherited: bool | None,
    reason: str,
    at: datetime,
    dry_run: bool,
    path: str,
) -> Erasure:
    """Rewrite every stored copy of the events to erase, in one transaction with
    ``secure_delete`` on (the old records' space is zeroed); ``wanted`` None: the session's
    own events (and, with ``inherited``, those it took from its parent)."""
    secure = connection.execute("PRAGMA secure_delete").fetchone()[0]
    connection.execute("PRAGMA secure_delete = ON")
    try:
        connection.execute("BEGIN" if dry_run else "BEGIN IMMEDIATE")
        try:
            done = erase_rows(
                _FileCopies(connection, path),
                session_id,
                wanted,
                inherited,
                reason=reason,
                at=at,
                dry_run=dry_run,
            )
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
            with _errors(f"erased, but VACUUM of {path} failed"):
                connection.execute("VACUUM")
        finally:
            connection.execute(f"PRAGMA temp_store = {int(temp_store)}")
        done.append("VACUUM rebuilt the file")
    with _errors(f"erased, but the WAL checkpoint of {path} failed"):
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
