"""Erasure in a SQLite file: rewriting every stored copy, then scrubbing the file (or, when
the store encrypts, destroying the old records' data keys: :mod:`._keys`)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Sequence
from typing import Any, Final

import attrs

from nous_session.codec import decode, decode_rows, encode
from nous_session.erasure import (
    Erasure,
)
from nous_session.errors import StoreError
from nous_session.event import Event
from nous_session.stores._erase import Erasing, ErasureRequest, erase_rows
from nous_session.stores._lineage import SessionRow
from nous_session.stores._sealed import CryptoErasure, Keyring, kid_of
from nous_session.stores.base import (
    place,
)
from nous_session.stores.sqlite._errors import translated_errors
from nous_session.stores.sqlite._host import StoreFile
from nous_session.stores.sqlite._keyed import truncated_wal
from nous_session.stores.sqlite._keys import (
    crypto_erase,
    fetcher,
    rebuild_key_table,
    stored_kid,
)
from nous_session.stores.sqlite._rows import inherited, row_of, view
from nous_session.stores.sqlite._sql import CHILDREN, FORGET_METADATA, OWN_KEPT_SEQS

# How a crypto-erasure scrubbed the keys, as its result says.
_KEYS_SCRUBBED: Final = "secure_delete zeroed the key rows and the key table was rebuilt"


@attrs.frozen
class _FileCopies:
    """The copies of a session's events in a SQLite file (see :class:`Copies`): a copy is
    named by its table, its session id and the data key its record is sealed under (None:
    a plain record).

    With a ``keyring`` (the store encrypts), an erased copy is sealed under its old record's
    key, and that key is noted in ``destroyed`` for :func:`crypto_erase`; ``plain`` notes a
    copy read in plain text, whose old bytes only a rewrite of the file removes.
    """

    connection: sqlite3.Connection
    path: str
    keyring: Keyring | None = None
    destroyed: set[bytes] = attrs.field(factory=set)
    plain: list[bool] = attrs.field(factory=list)

    def row(self, name: str) -> SessionRow[int] | None:
        return row_of(self.connection, name)

    def held(self, row: SessionRow[Any], low: int) -> Iterable[int]:
        yield from (seq for seq, _ in view(self.connection, row, low))
        yield from (seq for seq, _ in inherited(self.connection, row, low)[1] if seq >= low)
        yield from (seq for (seq,) in self.connection.execute(OWN_KEPT_SEQS, (row.key, low)))

    def events(self, name: str, row: SessionRow[Any]) -> list[Event]:
        rows, named = view(self.connection, row, 0), place(name, self.path)
        if self.keyring is not None:
            rows = self.keyring.open_rows(rows, fetcher(self.connection), named)
        return decode_rows(rows, named)

    def children(self, row: SessionRow[Any]) -> list[tuple[str, int | None]]:
        return self.connection.execute(CHILDREN, (row.uid,)).fetchall()

    def copies(self, member: str, seq: int) -> list[tuple[_Copy, Event]]:
        found = row_of(self.connection, member)
        assert found is not None
        copies: list[tuple[_Copy, Event]] = []
        for table in ("nous_events", "nous_kept"):
            record = self.connection.execute(
                f"SELECT record FROM {table} WHERE sid = ? AND seq = ?", (found.key, seq)
            ).fetchone()
            if record is not None:
                where = place(member, self.path)(seq)
                kid = kid_of(record[0])
                stored = record[0]
                if kid is None:
                    self.plain.append(True)
                elif self.keyring is not None:
                    stored = self.keyring.open(seq, stored, fetcher(self.connection), where)
                event = decode(stored, where=where)
                copies.append(((table, found.key, kid), event))
        return copies

    def write(self, where: _Copy, event: Event) -> None:
        table, sid, kid = where
        record = encode(event)
        if kid is not None and self.keyring is not None:
            # Sealed under the old key for now: crypto_erase re-seals every row of that key.
            cipher = self.keyring.cipher(kid, fetcher(self.connection))
            record = self.keyring.seal(kid, cipher, event.seq, record)
            self.destroyed.add(kid)
        self.connection.execute(
            f"UPDATE {table} SET record = ? WHERE sid = ? AND seq = ?", (record, sid, event.seq)
        )

    def forget(self, record: bytes, members: Sequence[str], seq: int) -> None:
        self.connection.executemany(FORGET_METADATA, [(record.decode(), m, seq) for m in members])

    def append(self, row: SessionRow[Any], event: Event) -> None:
        record, kid = encode(event), None
        if self.keyring is not None:
            # Sealed under the session's current key, as a commit would (a crypto-erasure
            # that destroys that key next re-seals it with the rest).
            kid = stored_kid(self.connection, row.key)
            if kid is not None:
                cipher = self.keyring.cipher(kid, fetcher(self.connection))
                record = self.keyring.seal(kid, cipher, event.seq, record)
        self.connection.execute(
            "INSERT INTO nous_events (sid, seq, record, kid) VALUES (?, ?, ?, ?)",
            (row.key, event.seq, record, kid),
        )
        self.connection.execute(
            "UPDATE nous_sessions SET count = ?, held = held + 1 WHERE id = ? AND count = ?",
            (event.seq + 1, row.key, event.seq),
        )


_Copy = tuple[str, int, bytes | None]


def _erase_rows(
    connection: sqlite3.Connection,
    request: ErasureRequest,
    path: str,
    keyring: Keyring | None = None,
) -> tuple[Erasure, CryptoErasure | None]:
    """Rewrite every stored copy of the events to erase, in one transaction with
    ``secure_delete`` on (the old records' space is zeroed); ``wanted`` None: the session's
    own events (and, with ``inherited``, those it took from its parent). With a ``keyring``,
    the same transaction then destroys the data keys the old records were sealed under
    (:func:`crypto_erase`); what that did comes back too."""
    dry_run = request.dry_run
    secure = connection.execute("PRAGMA secure_delete").fetchone()[0]
    connection.execute("PRAGMA secure_delete = ON")
    crypto = None
    try:
        connection.execute("BEGIN" if dry_run else "BEGIN IMMEDIATE")
        try:
            copies = _FileCopies(connection, path, keyring)
            done = erase_rows(copies, request)
            if keyring is not None and not dry_run:
                destroyed = sorted(copies.destroyed)
                resealed = crypto_erase(connection, keyring, destroyed)
                rebuild_key_table(connection)
                crypto = CryptoErasure(len(destroyed), resealed, bool(copies.plain))
        except BaseException:
            if connection.in_transaction:
                connection.execute("ROLLBACK")
            raise
        connection.execute("ROLLBACK" if dry_run else "COMMIT")
    finally:
        connection.execute(f"PRAGMA secure_delete = {int(secure)}")
    return done, crypto


def _scrub(connection: sqlite3.Connection, rewrite: bool, path: str) -> tuple[bool, str]:
    """After an erasing commit: rebuild the file (``rewrite``) and checkpoint the WAL into
    it, truncating it. Returns whether no old page can remain, and what was done."""
    done = ["secure_delete zeroed the old records"]
    if rewrite:
        temp_store = connection.execute("PRAGMA temp_store").fetchone()[0]
        connection.execute("PRAGMA temp_store = MEMORY")  # no temporary copy on disk
        try:
            with translated_errors(f"VACUUM of {path} failed"):
                connection.execute("VACUUM")
        finally:
            connection.execute(f"PRAGMA temp_store = {int(temp_store)}")
        done.append("VACUUM rebuilt the file")
    if not truncated_wal(connection, f"the WAL checkpoint of {path}"):
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


def _checkpoint(connection: sqlite3.Connection, path: str) -> tuple[bool, str]:
    """After a crypto-erasure: checkpoint the WAL into the file and truncate it (no file
    rebuild: the old records' keys are gone). Whether that happened, and what was done."""
    if not truncated_wal(connection, f"the WAL checkpoint of {path}"):
        return False, (
            "the WAL could not be checkpointed and truncated: another connection holds an old"
            " snapshot (the WAL may still hold the destroyed keys' rows; erase again once it"
            " is done)"
        )
    return True, "the WAL was checkpointed and truncated (no VACUUM: the file was not rebuilt)"


class FileErasure(Erasing, StoreFile):
    """:class:`~nous_session.stores.sqlite.SQLiteStore`'s erasure and vacuum: rows rewritten
    with ``secure_delete`` on, then the file rebuilt and its WAL truncated (``erase`` and
    ``erase_session`` take ``rewrite``); or, when the store encrypts, the old records' data
    keys destroyed and only the key table rebuilt."""

    erase_options = frozenset({"rewrite"})

    async def vacuum(self) -> None:
        """Give the space of deleted events back to the file system (after a snapshot)."""

        if self.read_only:
            raise StoreError(f"the store {self.url} is open read-only")

        def vacuum(connection: sqlite3.Connection) -> None:
            # Outside any transaction (VACUUM cannot run in one): the writer's read path.
            self._check_file()
            with translated_errors(f"cannot vacuum {self.path}"):
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
        meanwhile: every other commit to this file waits for it.

        A store opened with ``encryption`` crypto-erases instead (``rewrite`` does not apply):
        in the same transaction, the data keys the old records were sealed under are
        destroyed (every other row of those keys sealed again under new ones, the key rows
        deleted with ``secure_delete`` on, the key table rebuilt), then the WAL is checkpointed
        and truncated; no ``VACUUM``. Proven when the checkpoint succeeded. A copy in plain
        text (written before encryption was on) makes it rewrite the file as above too."""
        if type(rewrite) is not bool:
            raise ValueError(f"rewrite is True or False, got {rewrite!r}")
        session_id, dry_run = request.session_id, request.dry_run
        if self.read_only and not dry_run:
            raise StoreError(f"the store {self.url} is open read-only")
        what = f"cannot erase from session {session_id!r} in {self.path}"

        def erase(connection: sqlite3.Connection) -> Erasure:
            if not dry_run:
                self._check_file()
            with translated_errors(what):
                done, crypto = _erase_rows(connection, request, self.path, self._keyring)
            if dry_run:
                return attrs.evolve(done, detail="dry run: nothing was changed")
            try:
                if crypto is not None and not crypto.plain:
                    proven, detail = _checkpoint(connection, self.path)
                    detail = f"{crypto.detail(_KEYS_SCRUBBED)}; {detail}"
                else:
                    proven, detail = _scrub(connection, rewrite, self.path)
                    if crypto is not None:
                        plain = "a copy was in plain text, so"
                        detail = f"{crypto.detail(_KEYS_SCRUBBED)}; {plain}: {detail}"
            except StoreError as error:
                # The rows are erased (that transaction committed): every holder reads the
                # erased form; only the proof is missing.
                proven, detail = False, f"the events were erased, but {error} (not proven)"
            return attrs.evolve(done, proven=proven, detail=detail)

        # On the writer's thread outside its transactions (VACUUM cannot run in one): it runs
        # between two of its commits, so it is serialised with every write to this file.
        return await self._run(erase)
