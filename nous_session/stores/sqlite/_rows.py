"""Reading a session's rows in SQLite through its sharing lineage, and giving a fork its
own copy."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Sequence
from operator import itemgetter
from typing import Any, Final

from nous_session.stores._lineage import (
    SessionRow,
    fork_exists,
    fork_parent,
    lineage,
    metadata_at,
    nearest_keys,
    stored,
)
from nous_session.stores._sealed import Keyring, kid_of
from nous_session.stores.base import (
    SessionInfo,
    Stored,
    place,
)
from nous_session.stores.sqlite._keys import copy_holders, fetcher, hold, release_keys
from nous_session.stores.sqlite._sql import FORK, KEPT_OF, KEYS_FROM

ROW_SEQ: Final[Callable[[tuple[int, bytes]], int]] = itemgetter(0)


_ROW_COLUMNS: Final = "id, count, held, horizon, parent, fork_point, shares, uid, parent_uid"


_Row = SessionRow[int]


def now_micros() -> int:
    """The store's clock: microseconds since the epoch."""
    return time.time_ns() // 1000


def _make_row(found: Sequence[Any]) -> _Row:
    sid, count, held, horizon, parent, fork_point, shares, uid, parent_uid = found
    return SessionRow(
        sid, count, horizon, parent, fork_point, bool(shares), held, uid or "", parent_uid
    )


def row_of(connection: sqlite3.Connection, session_id: str) -> _Row | None:
    found = connection.execute(
        f"SELECT {_ROW_COLUMNS} FROM nous_sessions WHERE name = ?", (session_id,)
    ).fetchone()
    return None if found is None else _make_row(found)


def _ranges(connection: sqlite3.Connection, row: _Row) -> list[tuple[int, int, int]]:
    """Where a session's events are: ``(sid, lowest seq, highest seq)`` per session of its
    sharing lineage, oldest ancestor first (see :func:`~nous_session.stores._lineage.lineage`)."""
    return lineage(row, lambda name: row_of(connection, name))


def view(
    connection: sqlite3.Connection, row: _Row, since: int, upto: int | None = None
) -> list[tuple[int, bytes]]:
    """The (seq, record) rows of a session's events with ``since <= seq <= upto``."""
    if not row.shares and upto is None:
        return connection.execute(
            "SELECT seq, record FROM nous_events WHERE sid = ? AND seq >= ? ORDER BY seq",
            (row.key, since),
        ).fetchall()
    rows: list[tuple[int, bytes]] = []
    for sid, low, high in _ranges(connection, row):
        if upto is not None:
            high = min(high, upto)
        if high < max(low, since):
            continue
        rows.extend(
            connection.execute(
                "SELECT seq, record FROM nous_events WHERE sid = ? AND seq >= ? AND seq <= ?"
                " ORDER BY seq",
                (sid, max(low, since), high),
            ).fetchall()
        )
    return rows


def inherited(
    connection: sqlite3.Connection, row: _Row, since: int
) -> tuple[list[tuple[str, int, int]], list[tuple[int, bytes]]]:
    """The idempotency keys (key, first seq, count) with first seq >= ``since``, and the kept
    events, that a sharing fork answers from its lineage: each ancestor's within the range
    of its rows the fork shares (a key only if all its events are). Looked up, not copied."""
    keys: list[tuple[str, int, int]] = []
    kept: list[tuple[int, bytes]] = []
    if not row.shares:
        return keys, kept
    for sid, low, high in _ranges(connection, row)[:-1]:
        keys += connection.execute(
            "SELECT key, seq, n FROM nous_keys WHERE sid = ? AND seq >= ? AND seq + n - 1 <= ?",
            (sid, max(low, since), high),
        ).fetchall()
        kept += connection.execute(
            "SELECT seq, record FROM nous_kept WHERE sid = ? AND seq >= ? AND seq <= ?"
            " ORDER BY seq",
            (sid, low, high),
        ).fetchall()
    return nearest_keys(keys), kept


def _own_copy(connection: sqlite3.Connection, row: _Row) -> None:
    """Give a sharing fork its own copy of the rows it shares, and of the keys and kept
    events it inherits, and stop it sharing. The fork holds rows under the copies' data keys
    from then on: the key holders table says so."""
    copied = 0
    keys, kept = inherited(connection, row, 0)
    connection.executemany(
        "INSERT OR IGNORE INTO nous_keys (sid, key, seq, n) VALUES (?, ?, ?, ?)",
        [(row.key, key, seq, n) for key, seq, n in keys],
    )
    # Byte copies: a sealed record stays sealed under its key, and its kid goes with it.
    kids = [kid_of(record) for _, record in kept]
    connection.executemany(
        "INSERT OR IGNORE INTO nous_kept (sid, seq, record, kid) VALUES (?, ?, ?, ?)",
        [(row.key, seq, record, kid) for (seq, record), kid in zip(kept, kids, strict=True)],
    )
    for sid, low, high in _ranges(connection, row)[:-1]:
        before = connection.total_changes
        connection.execute(
            "INSERT INTO nous_events (sid, seq, record, kid) SELECT ?, seq, record, kid"
            " FROM nous_events WHERE sid = ? AND seq >= ? AND seq <= ?",
            (row.key, sid, low, high),
        )
        copied += connection.total_changes - before
        copy_holders(connection, row.key, sid, low, high)
    hold(connection, row.key, kids)
    connection.execute(
        "UPDATE nous_sessions SET shares = 0, held = held + ? WHERE id = ?", (copied, row.key)
    )


def release_shared(connection: sqlite3.Connection, row: _Row, session_id: str, lowest: int) -> None:
    """Before rows from seq ``lowest`` on are dropped from a session: its forks that share
    any of them, and the session itself if it shares them from its parent, get copies."""
    for (child_name,) in connection.execute(
        "SELECT name FROM nous_sessions WHERE parent = ? AND shares AND fork_point >= ?",
        (session_id, lowest),
    ).fetchall():
        child = row_of(connection, child_name)
        assert child is not None
        _own_copy(connection, child)
    if row.shares and row.fork_point is not None and lowest <= row.fork_point:
        _own_copy(connection, row)


def _count_rows(connection: sqlite3.Connection, row: _Row) -> int:
    total = 0
    for sid, low, high in _ranges(connection, row):
        (number,) = connection.execute(
            "SELECT count(*) FROM nous_events WHERE sid = ? AND seq >= ? AND seq <= ?",
            (sid, low, high),
        ).fetchone()
        total += number
    return total


def read_stored(
    connection: sqlite3.Connection,
    session_id: str,
    since: int,
    where: str,
    *,
    full: bool,
    keyring: Keyring | None = None,
) -> Stored:
    """The session's events from ``since`` (with ``full``, also its keys and kept events), in
    one read transaction: the count and the rows agree. A query that fails leaves the
    transaction to whoever runs reads (the writer thread, or a read-only store's call): they
    roll back what a read left open.

    Raises:
        CorruptRecordError: a row cannot be decoded (the error names session and seq).
    """
    connection.execute("BEGIN")  # one snapshot of the file for every query
    row = row_of(connection, session_id)
    if row is None:
        connection.execute("COMMIT")
        return Stored((), 0) if full else Stored([], 0)
    rows = view(connection, row, since)
    keys: list[tuple[str, int, int]] = []
    kept: list[tuple[int, bytes]] = []
    if full:
        keys = connection.execute(KEYS_FROM, (row.key, since)).fetchall()
        kept = connection.execute(KEPT_OF, (row.key,)).fetchall() if since == 0 else []
        if row.shares:
            inherited_keys, inherited_kept = inherited(connection, row, since)
            keys = inherited_keys + keys  # the fork's own keys come after
            if since == 0:
                kept = sorted(inherited_kept + kept)
    if keyring is not None:  # in the same snapshot: the keys of the rows read are there
        fetch, named = fetcher(connection), place(session_id, where)
        rows = keyring.open_rows(rows, fetch, named)
        kept = keyring.open_rows(kept, fetch, named)
    connection.execute("COMMIT")
    return stored(session_id, row, rows, since, where, keys=keys, kept=kept)


def fork_row(
    connection: sqlite3.Connection,
    session_id: str,
    new_session_id: str,
    at: int,
    where: str,
    keyring: Keyring | None = None,
) -> None:
    """:meth:`SQLiteStore.fork <nous_session.stores.sqlite.SQLiteStore.fork>` in the writer's
    transaction: a session that holds nothing yet under the new id is deleted whole first (its
    commit ids, an empty commit's, go with its row, not left behind for a later session the
    id is given to); one with events is refused.

    Raises:
        ValueError: as ``fork``.
    """
    parent = fork_parent(row_of(connection, session_id), session_id, at)
    existing = row_of(connection, new_session_id)
    if existing is not None:
        if existing.count:
            raise fork_exists(new_session_id)
        delete_row(connection, existing, new_session_id, keyring)
    named = place(session_id, where)
    meta, meta_seq = metadata_at(
        connection.execute(
            "SELECT meta, meta_seq FROM nous_sessions WHERE id = ?", (parent.key,)
        ).fetchone(),
        at,
        lambda: view(connection, parent, 0, at),
        named,
        keyring,
        fetcher(connection),
    )
    now = now_micros()
    connection.execute(
        FORK,
        (
            new_session_id,
            at + 1,
            parent.horizon,
            session_id,
            at,
            now,
            now,
            meta,
            meta_seq,
            parent.uid,
        ),
    )


def sessions_info(connection: sqlite3.Connection) -> list[SessionInfo]:
    """Every session with a nonzero count, by id, a sharing fork's held events counted
    through its lineage."""
    infos = []
    for name, *fields in connection.execute(
        f"SELECT name, {_ROW_COLUMNS} FROM nous_sessions WHERE count > 0 ORDER BY name"
    ).fetchall():
        row = _make_row(fields)
        held = _count_rows(connection, row) if row.shares else row.held
        infos.append(SessionInfo(name, row.count, held, row.horizon, row.parent, row.fork_point))
    return infos


def delete_row(
    connection: sqlite3.Connection, row: _Row, session_id: str, keyring: Keyring | None = None
) -> int:
    """Delete a session and its rows (its forks get their own copy first), in the writer's
    transaction, and destroy the data keys no other session holds rows under (see
    :func:`~nous_session.stores.sqlite._keys.release_keys`). Returns how many keys were
    destroyed."""
    release_shared(connection, row, session_id, 0)
    for table in ("nous_events", "nous_keys", "nous_commits", "nous_kept"):
        connection.execute(f"DELETE FROM {table} WHERE sid = ?", (row.key,))
    connection.execute("DELETE FROM nous_sessions WHERE id = ?", (row.key,))
    # Its forks are linked to the session it was forked from (still that one), at the lower
    # fork point: what they hold up to it is that session's history, and erasing there must
    # reach them.
    parent = None if row.parent is None else row_of(connection, row.parent)
    if parent is not None and parent.uid == row.parent_uid and row.fork_point is not None:
        connection.execute(
            "UPDATE nous_sessions SET parent = ?, parent_uid = ?, fork_point = min(fork_point, ?)"
            " WHERE parent_uid = ?",
            (row.parent, row.parent_uid, row.fork_point, row.uid),
        )
    if keyring is not None:
        keyring.current.pop(session_id, None)
    return release_keys(connection, row.key, keyring)
