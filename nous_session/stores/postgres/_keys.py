"""Encryption at rest in PostgreSQL: the key table, a session's current data key, sealed
commits and rebases, the sessions holding rows under each key, crypto-erasure (re-sealing
the rows of destroyed keys), a deleted session's keys destroyed, and re-wrapping (see
:mod:`nous_session.stores._sealed`)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg_pool import ConnectionPool

from nous_session.codec import encode
from nous_session.encryption import KeyProvider
from nous_session.event import Event
from nous_session.stores._sealed import Fetch, Keyring, NewKey
from nous_session.stores.base import moved, place
from nous_session.stores.postgres._errors import commit_errors, errors
from nous_session.stores.postgres._sql import Statements

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

__all__ = [
    "crypto_erase",
    "fetcher",
    "key_moved",
    "rebase_sealed",
    "release_keys",
    "resolve_key",
    "rewrap_keys",
    "seal_events",
]

Connection = psycopg.Connection[Any]


def fetcher(connection: Connection, statements: Statements) -> Fetch:
    """Reads a data key's row through ``connection``."""

    def fetch(kid: bytes) -> tuple[str, bytes] | None:
        found = connection.execute(statements.data_key, (kid,)).fetchone()
        return None if found is None else (found[0], bytes(found[1]))

    return fetch


def _adopt(connection: Connection, statements: Statements, keyring: Keyring, kid: bytes) -> None:
    keyring.cipher(kid, fetcher(connection, statements))


def resolve_key(
    pool: ConnectionPool[Any], statements: Statements, keyring: Keyring, session_id: str
) -> tuple[bytes, AESGCM, NewKey | None]:
    """The data key a commit to the session seals under (in a worker thread), its cipher
    cached: the session's current key; or, for a session with no key yet, a new one, set as
    its key (and stored); or, for a session with no row yet, a new one that its first commit
    stores with the row (returned as the third item; then the key is no session's yet).

    Raises:
        StoreError: the key cannot be read, made or unwrapped.
    """
    with errors(f"cannot read the data key of session {session_id!r}"), pool.connection() as c:
        found = c.execute(statements.session_kid, (session_id,)).fetchone()
        if found is None:
            new = keyring.new_key()
            return new[0], keyring.cipher(new[0], fetcher(c, statements)), new
        if found[1] is not None:
            kid = bytes(found[1])
        else:
            made, provider, wrapped = keyring.new_key()
            with c.transaction():  # the key, the session's, and the session its holder
                c.execute(statements.add_data_key, (made, provider, wrapped))
                row = c.execute(statements.set_session_kid, (session_id, made)).fetchone()
                assert row is not None  # an upsert's RETURNING always has its row
                kid = bytes(row[0])
                if kid != made:  # another writer set the session's key first: ours is unused
                    c.execute(statements.drop_data_key, (made,))
                else:
                    c.execute(statements.add_holder, (made, session_id))
            if kid != made:
                keyring.forget(made)
        cipher = keyring.cipher(kid, fetcher(c, statements))
    keyring.current[session_id] = kid
    return kid, cipher, None


def key_moved(
    pool: ConnectionPool[Any], statements: Statements, keyring: Keyring, session_id: str, kid: bytes
) -> bool:
    """After a sealed commit moved nothing: whether the session's key is no longer ``kid``
    (an erasure replaced it; the commit is worth sending again under the new one). Forgets
    the session's current key then."""
    with errors(f"cannot read the data key of session {session_id!r}"), pool.connection() as c:
        found = c.execute(statements.session_kid, (session_id,)).fetchone()
    stored = None if found is None or found[1] is None else bytes(found[1])
    if stored == kid:
        return False
    keyring.current.pop(session_id, None)
    return True


def seal_events(keyring: Keyring, kid: bytes, cipher: AESGCM, rows: Sequence[Event]) -> list[bytes]:
    """The records of ``rows`` sealed under the data key ``kid``."""
    return [
        record for _, record in keyring.seal_rows(kid, cipher, [(e.seq, encode(e)) for e in rows])
    ]


def rebase_sealed(
    pool: ConnectionPool[Any],
    statements: Statements,
    parameters: dict[str, Any],
    rows: Sequence[Event],
    keyring: Keyring,
    where: str,
) -> tuple[Any, list[Any], list[Any]]:
    """A rebasing commit of a store that encrypts: under the session's row lock, its count
    and key read, the batch sealed at the seqs it lands at, and inserted (two round trips:
    the database cannot renumber a sealed record as it does a plain one). Returns what
    :func:`~nous_session.stores.postgres._commit.rebase` does, the other writers' records
    opened."""
    name, expected = parameters["name"], parameters["expected"]
    with commit_errors(name), pool.connection() as connection, connection.transaction():
        if expected == 0 and parameters["expected_uid"] is None:
            connection.execute(statements.ensure_row, parameters)
        locked = connection.execute(statements.lock_row, parameters).fetchone()
        if locked is None:  # no such session (deleted?): refused, as the count says
            return None, [], []
        count, stored = locked
        fetch = fetcher(connection, statements)
        if stored is None:
            kid, provider, wrapped = keyring.new_key()
            connection.execute(statements.add_data_key, (kid, provider, wrapped))
            connection.execute(statements.set_kid_locked, (kid, name))
            connection.execute(statements.add_holder, (kid, name))
        else:
            kid = bytes(stored)
        cipher = keyring.cipher(kid, fetch)
        keyring.current[name] = kid
        placed = moved(rows, count - expected) if count > expected else rows
        parameters["records"] = seal_events(keyring, kid, cipher, placed)
        parameters["kid"] = kid
        counted = connection.execute(statements.rebased_sealed, parameters).fetchone()
        others = connection.execute(statements.others, parameters).fetchall()
        keyed = connection.execute(statements.others_keys, parameters).fetchall()
        opened = keyring.open_rows(others, fetch, place(name, where)) if counted else others
    return counted, opened, keyed


def crypto_erase(
    connection: Connection, statements: Statements, keyring: Keyring, destroyed: Iterable[bytes]
) -> int:
    """Destroy the data keys ``destroyed``, in the caller's (erasing) transaction: each gets a
    successor, the sessions whose current key it was move to that first (their row locks
    taken: a commit sealed under the old key waits, then moves nothing and is sent again),
    every row sealed under it (events and kept, in the sessions the key holders table names,
    read by session through the primary key) is re-sealed under the successor, the holders
    move to it, and its key row is deleted. Returns how many rows were re-sealed.

    Raises:
        StoreError: a key cannot be unwrapped, or a new one cannot be wrapped.
        CorruptRecordError: a row under a destroyed key does not open.
    """
    fetch = fetcher(connection, statements)
    resealed = 0
    for old in sorted(set(destroyed)):
        keyring.cipher(old, fetch)  # unwrapped before anything changes, or a clear error
        kid, provider, wrapped = keyring.new_key()
        connection.execute(statements.add_data_key, (kid, provider, wrapped))
        cipher = keyring.cipher(kid, fetch)
        connection.execute(statements.replace_kid, (kid, old))
        holders = [name for (name,) in connection.execute(statements.holders_of_key, (old,))]
        for table in ("events", "kept"):
            if not holders:
                break
            found = connection.execute(statements.rows_of_key[table], (holders, old)).fetchall()
            if not found:
                continue
            sessions, seqs, records = [], [], []
            for session, seq, record in found:
                plain = keyring.open(seq, record, fetch, f"nous_{table} row ({session!r}, {seq})")
                sessions.append(session)
                seqs.append(seq)
                records.append(keyring.seal(kid, cipher, seq, plain))
            connection.execute(statements.reseal[table], (kid, sessions, seqs, records))
            resealed += len(found)
        connection.execute(statements.replace_holders, (kid, old))
        connection.execute(statements.drop_data_key, (old,))
        keyring.forget(old)
        for session_id, current in list(keyring.current.items()):
            if current == old:
                keyring.current[session_id] = kid
    return resealed


def release_keys(
    connection: Connection, statements: Statements, session_id: str, keyring: Keyring | None
) -> int:
    """A deleted session (its rows gone, in the caller's transaction) holds no key any more:
    the keys no other session holds are destroyed (their rows deleted; the caller scrubs the
    key table after the commit). Returns how many keys were destroyed."""
    held = [bytes(kid) for (kid,) in connection.execute(statements.release_keys, (session_id,))]
    if keyring is not None:
        keyring.current.pop(session_id, None)
    if not held:
        return 0
    gone = [bytes(kid) for (kid,) in connection.execute(statements.destroy_unheld, (held,))]
    if keyring is not None:
        keyring.destroyed(gone)
    return len(gone)


def rewrap_keys(
    connection: Connection, statements: Statements, keyring: Keyring, provider: KeyProvider
) -> int:
    """Re-wrap every data key under ``provider``, in the caller's transaction (the key rows
    locked). Returns how many keys there are."""
    rows = [
        (bytes(kid), name, bytes(wrapped))
        for kid, name, wrapped in connection.execute(statements.all_data_keys).fetchall()
    ]
    done = keyring.rewrapped(rows, provider)
    for kid, name, wrapped in done:
        connection.execute(statements.rewrap_data_key, (name, wrapped, kid))
    return len(done)
