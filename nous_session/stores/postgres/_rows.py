"""Reading a session's rows in PostgreSQL through its sharing lineage, and giving a fork its
own copy (the typed row and the lineage are :mod:`nous_session.stores._lineage`'s)."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Sequence
from operator import itemgetter
from typing import Any, Final, ParamSpec, TypeVar

import psycopg
from psycopg import sql

from nous_session.codec import decode_rows
from nous_session.stores._lineage import (
    SessionRow,
    fork_exists,
    fork_parent,
    lineage,
    metadata_at,
    nearest_keys,
    stored,
)
from nous_session.stores._sealed import KeyGone, Keyring, kid_of
from nous_session.stores.base import SessionInfo, Stored, place
from nous_session.stores.postgres._errors import pipelined
from nous_session.stores.postgres._keys import fetcher, release_keys
from nous_session.stores.postgres._sql import Statements

__all__ = [
    "delete_row",
    "fork_row",
    "inherited",
    "make_row",
    "ranges",
    "read_stored",
    "release_shared",
    "row_of",
    "sessions_info",
    "view",
]

Connection = psycopg.Connection[Any]
P = ParamSpec("P")
R = TypeVar("R")
_SEQ: Final[Callable[[Any], int]] = itemgetter(0)


def make_row(name: str, found: Sequence[Any]) -> SessionRow[str]:
    """The typed row of ``found``, a result of :attr:`Statements.row_query`."""
    count, horizon, parent, fork_point, shares, uid, parent_uid = found
    return SessionRow(
        name, count, horizon, parent, fork_point, bool(shares), uid=uid, parent_uid=parent_uid
    )


def row_of(
    connection: Connection, statements: Statements, name: str, *, lock: str = ""
) -> SessionRow[str] | None:
    """The session's row (``lock``: a locking clause such as ``FOR UPDATE``), or None."""
    query = statements.row_query if not lock else statements.row_query + sql.SQL(" " + lock)
    found = connection.execute(query, (name,)).fetchone()
    return None if found is None else make_row(name, found)


def ranges(
    connection: Connection, statements: Statements, row: SessionRow[str]
) -> list[tuple[str, int, int]]:
    """Where a session's events are: ``(session, lowest, highest seq)`` per session of its
    sharing lineage, oldest first (disjoint, ascending)."""
    return lineage(row, lambda name: row_of(connection, statements, name))


def view(
    connection: Connection, statements: Statements, row: SessionRow[str], since: int
) -> list[Any]:
    """The (seq, record) rows of a session's events from ``since`` on, through its lineage."""
    rows: list[Any] = []
    for name, low, high in ranges(connection, statements, row):
        if high >= max(low, since):
            rows.extend(connection.execute(statements.range_query, (name, max(low, since), high)))
    return rows


def inherited(
    connection: Connection, statements: Statements, row: SessionRow[str], since: int
) -> tuple[list[Any], list[Any]]:
    """The idempotency keys (key, first seq, count) with first seq >= ``since``, and the
    kept events, that a sharing fork answers from its lineage: each ancestor's within the
    range of its rows the fork shares (a key only if all its events are). Looked up, not
    copied."""
    keys: list[Any] = []
    kept: list[Any] = []
    if not row.shares:
        return keys, kept
    for name, low, high in ranges(connection, statements, row)[:-1]:
        keys += connection.execute(statements.inherited_keys, (name, max(low, since), high))
        kept += connection.execute(statements.inherited_kept, (name, low, high))
    return nearest_keys(keys), kept


def _own_copy(connection: Connection, statements: Statements, name: str) -> None:
    """Give a sharing fork its own copy of the rows it shares, and of the keys and kept
    events it inherits, and stop it sharing. The fork holds rows under the copies' data keys
    from then on: the key holders table says so."""
    row = row_of(connection, statements, name, lock="FOR UPDATE")
    if row is None or not row.shares:
        return
    keys, kept = inherited(connection, statements, row, 0)
    if keys:
        connection.execute(
            statements.copy_keys,
            (name, [key for key, _, _ in keys], [seq for _, seq, _ in keys], [n for *_, n in keys]),
        )
    if kept:
        kids = [kid_of(record) for _, record in kept]
        connection.execute(
            statements.copy_kept,
            (name, [seq for seq, _ in kept], [record for _, record in kept], kids),
        )
        if any(kid is not None for kid in kids):
            connection.execute(statements.hold, (name, kids))
    for source, low, high in ranges(connection, statements, row)[:-1]:
        connection.execute(statements.copy_events, (name, source, low, high))
        connection.execute(statements.copy_holders, (name, source, low, high))
    connection.execute(statements.stop_sharing, (name,))


def release_shared(
    connection: Connection, statements: Statements, row: SessionRow[str], lowest: int
) -> None:
    """Before rows from seq ``lowest`` on are dropped: the forks sharing any of them, and
    the session itself if it shares them from its parent, get copies."""
    children = connection.execute(statements.sharing_children, (row.key, lowest)).fetchall()
    for (child,) in children:
        _own_copy(connection, statements, child)
    if row.shares and row.fork_point is not None and lowest <= row.fork_point:
        _own_copy(connection, statements, row.key)


def _again_if_key_gone(read: Callable[P, R]) -> Callable[P, R]:
    """``read``, run once more when a row it read was sealed under a key an erasure destroyed
    meanwhile (the erasure re-sealed the row under a new key first)."""

    @functools.wraps(read)
    def again(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return read(*args, **kwargs)
        except KeyGone:  # raised only with a keyring
            return read(*args, **kwargs)

    return again


@_again_if_key_gone
def read_stored(
    connection: Connection,
    statements: Statements,
    where: str,
    session_id: str,
    since: int,
    *,
    full: bool,
    keyring: Keyring | None = None,
) -> Stored:
    """The session's events from ``since`` (with ``full``, also its keys and kept events), in
    one repeatable-read transaction: one round trip unless the session is a sharing fork.
    Read committed would let a commit land between the statements, and the rows would not
    fit the count. With a ``keyring`` (the store encrypts), sealed records are opened; a
    read that raced an erasure destroying their key reads again (they are re-sealed).

    Raises:
        CorruptRecordError: a row cannot be decoded (the error names session and seq).
    """
    with pipelined(connection, begin="BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY"):
        found = connection.execute(statements.row_query, (session_id,))
        own = connection.execute(statements.events_from, (session_id, since))
        keyed = connection.execute(statements.keys_from, (session_id, since)) if full else None
        aside = (
            connection.execute(statements.kept_of, (session_id,)) if full and not since else None
        )
        fetched = found.fetchone()
        row = None if fetched is None else make_row(session_id, fetched)
        inherited_keys: list[Any] = []
        inherited_kept: list[Any] = []
        if row is not None and row.shares:  # a sharing fork: read through its parent
            rows = view(connection, statements, row, since)
            if full:
                inherited_keys, inherited_kept = inherited(connection, statements, row, since)
        else:
            rows = own.fetchall()
        keys = inherited_keys + ([] if keyed is None else keyed.fetchall())  # the fork's after
        kept = [] if aside is None else sorted(inherited_kept + aside.fetchall())
    if keyring is not None:
        fetch, named = fetcher(connection, statements), place(session_id, where)
        rows = keyring.open_rows(rows, fetch, named)
        kept = keyring.open_rows(kept, fetch, named)
    if row is None:
        return Stored((), 0) if full else Stored(decode_rows(rows, place(session_id, where)), 0)
    return stored(session_id, row, rows, since, where, keys=keys, kept=kept)


def fork_row(
    connection: Connection,
    statements: Statements,
    where: str,
    session_id: str,
    new_session_id: str,
    at: int,
    keyring: Keyring | None = None,
) -> None:
    """:meth:`PostgresStore.fork <nous_session.stores.postgres.PostgresStore.fork>` in the
    caller's transaction: one INSERT, which takes over the row of a session that holds
    nothing yet (ON CONFLICT) and refuses one with events (it returns no row).

    Raises:
        ValueError: as ``fork``.
    """
    # FOR SHARE: a snapshot of the parent (which locks its row to give its forks copies)
    # waits for this fork, and then sees it.
    parent = fork_parent(
        row_of(connection, statements, session_id, lock="FOR SHARE"), session_id, at
    )
    found = connection.execute(statements.metadata, (parent.key,)).fetchone()
    assert found is not None
    named = place(parent.key, where)
    meta, meta_seq = metadata_at(
        (None if found[0] is None else json.dumps(found[0]), found[1]),
        at,
        lambda: [item for item in view(connection, statements, parent, 0) if item[0] <= at],
        named,
        keyring,
        fetcher(connection, statements),
    )
    made = connection.execute(
        statements.fork,
        (new_session_id, at + 1, parent.horizon, session_id, at, meta, meta_seq, parent.uid),
    ).fetchone()
    if made is None:
        raise fork_exists(new_session_id)
    # It may have replaced a session that held nothing yet: its commit ids (an empty
    # commit's) are not the fork's. (A fork has no rows of its own to lose.)
    for statement in statements.delete_rows:
        connection.execute(statement, (new_session_id,))


def sessions_info(connection: Connection, statements: Statements) -> list[SessionInfo]:
    """Every session with a nonzero count, by id, its held events counted (a sharing fork's
    through its lineage)."""
    infos = []
    for name, count, horizon, parent, fork_point, shares, held in connection.execute(
        statements.sessions_held
    ).fetchall():
        if shares:
            row = SessionRow(name, count, horizon, parent, fork_point, True)
            held = 0
            for part in ranges(connection, statements, row):
                (number,) = connection.execute(statements.count_range, part).fetchone() or (0,)
                held += number
        infos.append(SessionInfo(name, count, held, horizon, parent, fork_point))
    return infos


def delete_row(
    connection: Connection,
    statements: Statements,
    channel: str,
    row: SessionRow[str],
    keyring: Keyring | None = None,
) -> int:
    """Delete a session and its rows (its forks get their own copy first), in the caller's
    transaction, notify its followers on ``channel`` (they read it, and find it deleted),
    and destroy the data keys no other session holds rows under (see
    :func:`~nous_session.stores.postgres._keys.release_keys`). Returns how many keys were
    destroyed."""
    release_shared(connection, statements, row, 0)
    for statement in statements.delete_rows:
        connection.execute(statement, (row.key,))
    connection.execute(statements.delete_session, {"name": row.key, "channel": channel})
    # Its forks are linked to the session it was forked from (still that one), at the lower
    # fork point: what they hold up to it is that session's history, and erasing there must
    # reach them.
    parent = None if row.parent is None else row_of(connection, statements, row.parent)
    if parent is not None and parent.uid == row.parent_uid and row.fork_point is not None:
        connection.execute(
            statements.relink_forks, (row.parent, row.parent_uid, row.fork_point, row.uid)
        )
    return release_keys(connection, statements, row.key, keyring)
