"""Encryption at rest in a SQLite file: the key table, a session's current data key, the
sessions holding rows under each key, crypto-erasure (re-sealing the rows of destroyed keys),
a deleted session's keys destroyed, and re-wrapping (see :mod:`nous_session.stores._sealed`)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable

from nous_session.encryption import KeyProvider
from nous_session.errors import StoreError
from nous_session.stores._sealed import Fetch, Keyring
from nous_session.stores.sqlite._schema import DATA_KEYS_TABLE

__all__ = [
    "copy_holders",
    "crypto_erase",
    "fetcher",
    "hold",
    "rebuild_key_table",
    "release_keys",
    "refuse_sealed_session",
    "rewrap_keys",
    "session_key",
    "stored_kid",
]


def fetcher(connection: sqlite3.Connection) -> Fetch:
    """Reads a data key's row in ``connection``'s current transaction (or snapshot)."""

    def fetch(kid: bytes) -> tuple[str, bytes] | None:
        found = connection.execute(
            "SELECT provider, wrapped FROM nous_data_keys WHERE kid = ?", (kid,)
        ).fetchone()
        return None if found is None else (found[0], found[1])

    return fetch


def stored_kid(connection: sqlite3.Connection, sid: int) -> bytes | None:
    """The session's current data key's kid (None: it has none)."""
    found = connection.execute("SELECT kid FROM nous_sessions WHERE id = ?", (sid,)).fetchone()
    return None if found is None or found[0] is None else bytes(found[0])


def session_key(
    connection: sqlite3.Connection, keyring: Keyring, sid: int, session_id: str
) -> bytes:
    """The kid a commit to the session seals under, in the writer's transaction: its
    current key, or a new one made its current key (a session's first encrypted commit)."""
    kid = stored_kid(connection, sid)
    if kid is None:
        kid, provider, wrapped = keyring.new_key()
        connection.execute(
            "INSERT INTO nous_data_keys (kid, provider, wrapped) VALUES (?, ?, ?)",
            (kid, provider, wrapped),
        )
        connection.execute("UPDATE nous_sessions SET kid = ? WHERE id = ?", (kid, sid))
        connection.execute("INSERT INTO nous_key_holders (kid, sid) VALUES (?, ?)", (kid, sid))
    keyring.current[session_id] = kid
    return kid


def copy_holders(
    connection: sqlite3.Connection, sid: int, source: int, low: int, high: int
) -> None:
    """Record that session ``sid`` holds rows under the keys of session ``source``'s events
    with ``low <= seq <= high``, which it was just given copies of (a range of the primary
    key, read again)."""
    connection.execute(
        "INSERT OR IGNORE INTO nous_key_holders (kid, sid) SELECT DISTINCT kid, ?"
        " FROM nous_events WHERE sid = ? AND seq >= ? AND seq <= ? AND kid IS NOT NULL",
        (sid, source, low, high),
    )


def hold(connection: sqlite3.Connection, sid: int, kids: Iterable[bytes | None]) -> None:
    """Record that session ``sid`` holds rows under the keys ``kids`` (None: a plain row)."""
    connection.executemany(
        "INSERT OR IGNORE INTO nous_key_holders (kid, sid) VALUES (?, ?)",
        [(kid, sid) for kid in set(kids) if kid is not None],
    )


def refuse_sealed_session(connection: sqlite3.Connection, sid: int, session_id: str) -> None:
    """A store without encryption does not write plain records into an encrypted session.

    Raises:
        StoreError: the session has a data key.
    """
    if stored_kid(connection, sid) is not None:
        raise StoreError(
            f"session {session_id!r} is encrypted; this store was opened without encryption"
            " (pass encryption=Encryption(provider)): refusing to write it in plain text"
        )


def crypto_erase(
    connection: sqlite3.Connection, keyring: Keyring, destroyed: Iterable[bytes]
) -> int:
    """Destroy the data keys ``destroyed``, in the caller's (erasing) transaction: each gets a
    successor, every row sealed under it (events and kept, in the sessions the key holders
    table names: each read by session, through the primary key) is re-sealed under that, the
    holders and the sessions whose current key it was move to it, and its key row is deleted
    (with ``secure_delete`` on, as the caller sets it: its bytes are zeroed). Returns how
    many rows were re-sealed.

    Raises:
        StoreError: a key cannot be unwrapped, or a new one cannot be wrapped.
        CorruptRecordError: a row under a destroyed key does not open.
    """
    fetch = fetcher(connection)
    resealed = 0
    for old in sorted(set(destroyed)):
        keyring.cipher(old, fetch)  # unwrapped before anything changes, or a clear error
        kid, provider, wrapped = keyring.new_key()
        connection.execute(
            "INSERT INTO nous_data_keys (kid, provider, wrapped) VALUES (?, ?, ?)",
            (kid, provider, wrapped),
        )
        new_cipher = keyring.cipher(kid, fetch)
        holders = [
            sid
            for (sid,) in connection.execute(
                "SELECT sid FROM nous_key_holders WHERE kid = ? ORDER BY sid", (old,)
            ).fetchall()
        ]
        for table in ("nous_events", "nous_kept"):
            updates = []
            for sid in holders:
                rows = connection.execute(
                    f"SELECT seq, record FROM {table} WHERE sid = ? AND kid = ?", (sid, old)
                ).fetchall()
                for seq, record in rows:
                    plain = keyring.open(seq, record, fetch, f"{table} row ({sid}, {seq})")
                    updates.append((keyring.seal(kid, new_cipher, seq, plain), kid, sid, seq))
            connection.executemany(
                f"UPDATE {table} SET record = ?, kid = ? WHERE sid = ? AND seq = ?", updates
            )
            resealed += len(updates)
        connection.execute("UPDATE nous_key_holders SET kid = ? WHERE kid = ?", (kid, old))
        connection.execute("UPDATE nous_sessions SET kid = ? WHERE kid = ?", (kid, old))
        connection.execute("DELETE FROM nous_data_keys WHERE kid = ?", (old,))
        keyring.forget(old)
        for name, current in list(keyring.current.items()):
            if current == old:
                keyring.current[name] = kid
    return resealed


def release_keys(connection: sqlite3.Connection, sid: int, keyring: Keyring | None = None) -> int:
    """A deleted session (its rows gone, in the caller's transaction) holds no key any more:
    the keys no other session holds are destroyed, their rows deleted with ``secure_delete``
    on and the key table rebuilt, as an erasure does (so no page keeps them; the caller
    checkpoints the WAL after the commit). Returns how many keys were destroyed."""
    held = [
        kid
        for (kid,) in connection.execute(
            "SELECT kid FROM nous_key_holders WHERE sid = ?", (sid,)
        ).fetchall()
    ]
    if not held:
        return 0
    connection.execute("DELETE FROM nous_key_holders WHERE sid = ?", (sid,))
    gone = [
        kid
        for kid in held
        if connection.execute(
            "SELECT 1 FROM nous_key_holders WHERE kid = ? LIMIT 1", (kid,)
        ).fetchone()
        is None
    ]
    if not gone:
        return 0
    secure = connection.execute("PRAGMA secure_delete").fetchone()[0]
    connection.execute("PRAGMA secure_delete = ON")
    try:
        connection.executemany("DELETE FROM nous_data_keys WHERE kid = ?", [(k,) for k in gone])
        rebuild_key_table(connection)
    finally:
        connection.execute(f"PRAGMA secure_delete = {int(secure)}")
    if keyring is not None:
        keyring.destroyed(gone)
    return len(gone)


def rebuild_key_table(connection: sqlite3.Connection) -> None:
    """Copy the key table into a new one and drop the old, in the caller's transaction with
    ``secure_delete`` on: SQLite zeroes every page the old table held, so no stale copy of a
    deleted or re-wrapped key survives in its pages or their free space (a small table: a
    few pages, whatever the size of the file)."""
    connection.execute(DATA_KEYS_TABLE.format(name="nous_data_keys_new"))
    connection.execute(
        "INSERT INTO nous_data_keys_new SELECT kid, provider, wrapped FROM nous_data_keys"
    )
    connection.execute("DROP TABLE nous_data_keys")
    connection.execute("ALTER TABLE nous_data_keys_new RENAME TO nous_data_keys")


def rewrap_keys(connection: sqlite3.Connection, keyring: Keyring, provider: KeyProvider) -> int:
    """Re-wrap every data key under ``provider`` and rebuild the key table, in the caller's
    transaction (``secure_delete`` on). Returns how many keys there are."""
    rows = connection.execute("SELECT kid, provider, wrapped FROM nous_data_keys").fetchall()
    done = keyring.rewrapped(rows, provider)
    connection.executemany(
        "UPDATE nous_data_keys SET provider = ?, wrapped = ? WHERE kid = ?",
        [(name, wrapped, kid) for kid, name, wrapped in done],
    )
    rebuild_key_table(connection)
    return len(done)
