"""Erasure in a SQLite file: rewriting every stored copy, then scrubbing the file."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from datetime import datetime

from nous_session.codec import decode, encode
from nous_session.erasure import (
    Erasure,
    check_seqs,
    erase_copies,
    family,
    forget_metadata,
)
from nous_session.event import Event
from nous_session.stores.base import (
    place,
)
from nous_session.stores.sqlite._errors import _errors
from nous_session.stores.sqlite._rows import _inherited, _row, _rows


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
            row = _row(connection, session_id)
            if row is None or row.count == 0:
                raise ValueError(f"no session {session_id!r} to erase")
            if wanted is None:
                low = 0 if inherited or row.fork_point is None else row.fork_point + 1
                keys = {seq for seq, _ in _rows(connection, row, low)}
                keys.update(seq for seq, _ in _inherited(connection, row, low)[1] if seq >= low)
                keys.update(
                    seq
                    for (seq,) in connection.execute(
                        "SELECT seq FROM nous_kept WHERE sid = ? AND seq >= ?", (row.id, low)
                    )
                )
                seqs: Sequence[int] = sorted(keys)
            else:
                seqs = check_seqs(wanted, row.count, session_id=session_id)

            def parent_of(name: str) -> tuple[str, int] | None:
                found = _row(connection, name)
                if found is None or found.parent is None or found.fork_point is None:
                    return None
                if _row(connection, found.parent) is None:
                    return None
                return found.parent, found.fork_point

            forks: dict[str, list[tuple[str, int]]] = {}  # read once per session, not per seq

            def children_of(name: str, seq: int) -> list[str]:
                if name not in forks:
                    forks[name] = connection.execute(
                        "SELECT name, fork_point FROM nous_sessions WHERE parent = ?", (name,)
                    ).fetchall()
                return [child for child, point in forks[name] if point is not None and point >= seq]

            def copies_of(members: Sequence[str], seq: int) -> list[tuple[tuple[str, int], Event]]:
                copies: list[tuple[tuple[str, int], Event]] = []
                for member in members:
                    found = _row(connection, member)
                    assert found is not None
                    for table in ("nous_events", "nous_kept"):
                        record = connection.execute(
                            f"SELECT record FROM {table} WHERE sid = ? AND seq = ?",
                            (found.id, seq),
                        ).fetchone()
                        if record is not None:
                            event = decode(record[0], where=place(member, path)(seq))
                            copies.append(((table, found.id), event))
                return copies

            forgotten: dict[int, bytes] = {}  # erased metadata events: seq -> their record

            def write(where: tuple[str, int], event: Event) -> None:
                table, sid = where
                connection.execute(
                    f"UPDATE {table} SET record = ? WHERE sid = ? AND seq = ?",
                    (encode(event), sid, event.seq),
                )
                forget_metadata(event, forgotten)

            erased, already, absent, others = erase_copies(
                session_id,
                seqs,
                reason=reason,
                at=at,
                members_of=lambda seq: family(session_id, seq, parent_of, children_of),
                copies_of=copies_of,
                write=None if dry_run else write,
            )
            # The sessions' copies of an erased metadata record go too (see forget_metadata).
            for seq, record in forgotten.items():
                connection.executemany(
                    "UPDATE nous_sessions SET meta = ? WHERE name = ? AND meta_seq = ?",
                    [
                        (record.decode(), member, seq)
                        for member in family(session_id, seq, parent_of, children_of)
                    ],
                )
        except BaseException:
            if connection.in_transaction:
                connection.execute("ROLLBACK")
            raise
        connection.execute("ROLLBACK" if dry_run else "COMMIT")
    finally:
        connection.execute(f"PRAGMA secure_delete = {int(secure)}")
    return Erasure(
        session_id,
        reason,
        at,
        tuple(erased),
        tuple(already),
        tuple(absent),
        tuple(sorted(others)),
        dry_run=dry_run,
    )


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
