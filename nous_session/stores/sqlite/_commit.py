"""One commit in the SQLite writer's transaction."""

from __future__ import annotations

import secrets
import sqlite3
from collections.abc import Callable
from types import MappingProxyType
from typing import Final

from nous_session.codec import decode_rows, encode
from nous_session.errors import ConflictError
from nous_session.event import Event
from nous_session.listing import latest_metadata
from nous_session.stores._common import Commit, identity_conflict
from nous_session.stores._sealed import Keyring
from nous_session.stores.base import (
    Rebased,
    check_commit_state,
    check_held,
    moved,
    moved_keys,
    place,
)
from nous_session.stores.sqlite._errors import translated_error
from nous_session.stores.sqlite._keys import fetcher, refuse_sealed_session, session_key
from nous_session.stores.sqlite._rows import ROW_SEQ, now_micros, release_shared, row_of, view
from nous_session.stores.sqlite._sql import (
    ADVANCE,
    ADVANCE_AT_HORIZON,
    ADVANCE_KNOWN,
    ADVANCE_KNOWN_AT_HORIZON,
    TOUCH,
)


class CommitJob:
    """A commit's write job: one object where a closure would hold a cell per argument.

    Hundreds of sessions' commits wait in the writer at once, and every object alive then is
    one more for the garbage collector to look at. It translates sqlite3's errors itself (what
    :meth:`SQLiteStore._write` wraps around other jobs), naming the commit only on error.
    """

    __slots__ = ("commit", "ids", "keyring", "metadata", "path", "records")

    def __init__(
        self,
        path: str,
        commit: Commit,
        records: list[tuple[int, bytes]],
        metadata: tuple[int, bytes] | None,
        ids: dict[str, tuple[int, str]] | None,
        keyring: Keyring | None = None,
    ) -> None:
        self.path = path
        self.commit = commit
        self.records = records  # the commit's events, encoded
        self.metadata = metadata
        self.ids = ids
        self.keyring = keyring

    def __call__(self, connection: sqlite3.Connection) -> str:
        commit = self.commit
        try:
            return write_commit(
                connection, commit, self.records, self.metadata, self.ids, self.keyring
            )
        except sqlite3.Error as error:
            what = f"commit to session {commit.session_id!r} in {self.path}"
            raise translated_error(error, what) from error


_ACTIVE_STEP: Final = 1_000_000  # microseconds: how far behind the last-active time may lag


_IDS_AT_MOST: Final = 65_536  # session ids a store keeps for its commits (then it starts over)


def _keep_id(ids: dict[str, tuple[int, str]] | None, session_id: str, sid: int, uid: str) -> None:
    """Remember ``sid`` and ``uid`` as the id and identity of ``session_id`` (a bounded memory:
    full, it starts over)."""
    if ids is None:
        return
    if len(ids) >= _IDS_AT_MOST and session_id not in ids:
        ids.clear()
    ids[session_id] = (sid, uid)


def write_commit(
    connection: sqlite3.Connection,
    commit: Commit,
    records: list[tuple[int, bytes]],
    metadata: tuple[int, bytes] | None = None,
    ids: dict[str, tuple[int, str]] | None = None,
    keyring: Keyring | None = None,
) -> str:
    """Write one commit in the caller's transaction; returns the session's identity (uid).

    Args:
        ids: the ids and identities of sessions this store has written, by name (read and
            filled here, on the writer's thread only); a stale one is harmless, as the row it
            names must still have the session's name and identity.
        keyring: the store's data keys when it encrypts: the plain ``records`` are sealed
            under the session's current key (made at its first encrypted commit).

    Raises:
        ConflictError: the stored count (or horizon) is not the expected one.
        StoreError: a store without encryption was to write into an encrypted session, or a
            data key could not be made or unwrapped.
        sqlite3.Error: SQLite failed.
    """
    session_id, expected_count, dropped = commit.session_id, commit.expected_count, commit.dropped
    expected_horizon, horizon = commit.expected_horizon, commit.horizon
    keys, kept, commit_id = commit.keys, commit.kept, commit.commit_id
    if (
        records
        and expected_count
        and not (dropped or keys or kept)
        and commit_id is None
        and horizon is None
        and metadata is None
    ):
        # The common commit (new events to an existing session): the conditional UPDATE is
        # the conflict check.
        count = records[-1][0] + 1
        known = None if ids is None else ids.get(session_id)
        # The key the session seals with, as this store last saw it (checked by the UPDATE).
        kid = None if keyring is None else keyring.current.get(session_id)
        moved = False
        sid, uid = 0, ""  # set when a row moved
        if keyring is not None and kid is None:
            pass  # the session's key is not known here yet: the full path reads it
        elif known is not None:
            sid, uid = known
            if commit.expected_uid is not None:
                uid = commit.expected_uid  # the row must have it (else: the full path says)
            moved = (
                connection.execute(
                    ADVANCE_KNOWN if expected_horizon is None else ADVANCE_KNOWN_AT_HORIZON,
                    (count, len(records), sid, session_id, uid, expected_count, kid)
                    if expected_horizon is None
                    else (
                        count,
                        len(records),
                        sid,
                        session_id,
                        uid,
                        expected_count,
                        expected_horizon,
                        kid,
                    ),
                ).rowcount
                == 1
            )
        else:
            expected_uid = commit.expected_uid
            found = connection.execute(
                ADVANCE if expected_horizon is None else ADVANCE_AT_HORIZON,
                (count, len(records), session_id, expected_count, kid, expected_uid)
                if expected_horizon is None
                else (
                    count,
                    len(records),
                    session_id,
                    expected_count,
                    expected_horizon,
                    kid,
                    expected_uid,
                ),
            ).fetchone()
            if found is not None:
                moved = True
                sid, uid = found
                _keep_id(ids, session_id, sid, uid)
        if moved:
            now = now_micros()
            connection.execute(TOUCH, (now, sid, now - _ACTIVE_STEP))
            if keyring is not None and kid is not None:
                _insert_sealed(connection, keyring, sid, kid, records)
            elif len(records) == 1:
                connection.execute(
                    "INSERT INTO nous_events (sid, seq, record) VALUES (?, ?, ?)",
                    (sid, *records[0]),
                )
            else:
                connection.executemany(
                    "INSERT INTO nous_events (sid, seq, record) VALUES (?, ?, ?)",
                    [(sid, seq, record) for seq, record in records],
                )
            return uid
        # No row moved: the full path below says what the conflict is (or reads the key).
    row = row_of(connection, session_id)
    stored = 0 if row is None else row.count
    if stored != expected_count:
        raise ConflictError(
            f"session {session_id!r} has count {stored}, expected {expected_count}:"
            " another writer committed first"
        )
    if commit.expected_uid is not None and (row is None or row.uid != commit.expected_uid):
        raise identity_conflict(session_id, commit.expected_uid)
    stored_horizon = 0 if row is None else row.horizon
    if expected_horizon is not None and stored_horizon != expected_horizon:
        raise ConflictError(
            f"session {session_id!r} has horizon {stored_horizon}, expected {expected_horizon}:"
            " another writer took a snapshot"
        )
    horizon = check_commit_state(
        session_id,
        stored_horizon,
        dropped=dropped,
        horizon=horizon,
        expected_horizon=expected_horizon,
    )
    now = now_micros()
    if row is None:
        uid = secrets.token_hex(8)  # as a fork's, lower(hex(randomblob(8))): 16 hex digits
        made = connection.execute(
            "INSERT INTO nous_sessions (name, count, held, created, active, uid)"
            " VALUES (?, 0, 0, ?, ?, ?)",
            (session_id, now, now, uid),
        ).lastrowid
        assert made is not None
        sid = made
    else:
        sid, uid = row.key, row.uid
    _keep_id(ids, session_id, sid, uid)
    kid = None
    if records and keyring is not None:
        kid = session_key(connection, keyring, sid, session_id)
    elif records and row is not None:
        refuse_sealed_session(connection, sid, session_id)
    deleted = 0
    if dropped:
        if row is not None:
            release_shared(connection, row, session_id, min(dropped))
        if kept:
            connection.executemany(
                "INSERT INTO nous_kept (sid, seq, record, kid) SELECT sid, seq, record, kid"
                " FROM nous_events WHERE sid = ? AND seq = ?",
                [(sid, seq) for seq in kept],
            )
        before = connection.total_changes
        connection.executemany(
            "DELETE FROM nous_events WHERE sid = ? AND seq = ?", [(sid, seq) for seq in dropped]
        )
        deleted = connection.total_changes - before
    if records and keyring is not None and kid is not None:
        _insert_sealed(connection, keyring, sid, kid, records)
    elif records:
        connection.executemany(
            "INSERT INTO nous_events (sid, seq, record) VALUES (?, ?, ?)",
            [(sid, seq, record) for seq, record in records],
        )
    if keys:
        connection.executemany(
            "INSERT INTO nous_keys (sid, key, seq, n) VALUES (?, ?, ?, ?)",
            [(sid, key, first, size) for key, first, size in keys],
        )
    if commit_id is not None:
        connection.execute(
            "INSERT INTO nous_commits (sid, commit_id, seq, n) VALUES (?, ?, ?, ?)",
            (sid, commit_id, records[0][0] if records else expected_count, len(records)),
        )
    count = records[-1][0] + 1 if records else stored
    connection.execute(
        "UPDATE nous_sessions SET count = ?, held = held + ?, horizon = coalesce(?, horizon),"
        " active = max(active, coalesce(?, active)), meta = coalesce(?, meta),"
        " meta_seq = coalesce(?, meta_seq) WHERE id = ?",
        (
            count,
            len(records) - deleted,
            horizon,
            now if records else None,
            None if metadata is None else metadata[1].decode(),
            None if metadata is None else metadata[0],
            sid,
        ),
    )
    return uid


def _insert_sealed(
    connection: sqlite3.Connection,
    keyring: Keyring,
    sid: int,
    kid: bytes,
    records: list[tuple[int, bytes]],
) -> None:
    """Insert the plain ``records`` sealed under the data key ``kid``."""
    cipher = keyring.cipher(kid, fetcher(connection))
    sealed = keyring.seal_rows(kid, cipher, records)
    connection.executemany(
        "INSERT INTO nous_events (sid, seq, record, kid) VALUES (?, ?, ?, ?)",
        [(sid, seq, record, kid) for seq, record in sealed],
    )


def instrument(wrap: Callable[[str, Callable[..., str]], Callable[..., str]]) -> None:
    """A hook for benchmarks only (benchmarks/one_session_chain.py): replace the statements of
    every commit job (``"statements"``) by ``wrap("statements", function)``, to time them."""
    global write_commit
    write_commit = wrap("statements", write_commit)


def rebase_in(
    connection: sqlite3.Connection,
    commit: Commit,
    ids: dict[str, tuple[int, str]],
    path: str,
    keyring: Keyring | None = None,
) -> Rebased:
    """A rebasing commit in the writer's transaction: read the count and what other writers
    stored since the caller's count, then write the events after it."""
    session_id, expected_count, listed = commit.session_id, commit.expected_count, commit.events
    keys, commit_id = commit.keys, commit.commit_id
    row = row_of(connection, session_id)
    stored = 0 if row is None else row.count
    if stored < expected_count:
        raise ConflictError(
            f"session {session_id!r} has count {stored}, below the expected {expected_count}"
        )
    if commit.expected_uid is not None and (row is None or row.uid != commit.expected_uid):
        raise identity_conflict(session_id, commit.expected_uid)
    shift = stored - expected_count
    others: list[Event] = []
    between: dict[str, tuple[int, int]] = {}
    if shift and row is not None:
        found = view(connection, row, expected_count)
        # A rebase never writes past a hole: the batch would land after rows that
        # are missing, and the session could not be opened again.
        check_held(
            session_id,
            found,
            count=stored,
            horizon=row.horizon,
            since=expected_count,
            where=path,
            seq=ROW_SEQ,
        )
        named = place(session_id, path)
        if keyring is not None:
            found = keyring.open_rows(found, fetcher(connection), named)
        others = decode_rows(found, named)
        between = {
            key: (seq, n)
            for key, seq, n in connection.execute(
                "SELECT key, seq, n FROM nous_keys WHERE sid = ? AND seq >= ?",
                (row.key, expected_count),
            )
        }
    placed = moved(listed, shift) if shift else listed
    records = [(event.seq, encode(event)) for event in placed]
    rebased = Commit(session_id, stored, placed, keys=moved_keys(keys, shift), commit_id=commit_id)
    uid = write_commit(connection, rebased, records, latest_metadata(placed), ids, keyring)
    return Rebased(
        shift, others, placed, MappingProxyType(between), 0 if row is None else row.horizon, uid
    )
