"""Erasure in PostgreSQL: rewriting every stored copy (the steps are
:mod:`nous_session.stores._erase`'s), then scrubbing the tables: the old row versions out of
the pages (or, when the store encrypts, destroying the old records' data keys and scrubbing
only the key table: :mod:`._keys`)."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final, TypeVar

import attrs
import psycopg
from psycopg import sql
from psycopg_pool import ConnectionPool

from nous_session._json import dumps
from nous_session.codec import decode, decode_rows, encode
from nous_session.erasure import Erasure
from nous_session.errors import StoreError
from nous_session.event import Event
from nous_session.stores._erase import Erasing, ErasureRequest, erase_rows
from nous_session.stores._lineage import SessionRow
from nous_session.stores._sealed import CryptoErasure, Keyring, kid_of
from nous_session.stores.base import place
from nous_session.stores.postgres._errors import errors, pooled
from nous_session.stores.postgres._keyed import xid
from nous_session.stores.postgres._keys import crypto_erase, fetcher
from nous_session.stores.postgres._rows import inherited, row_of, view
from nous_session.stores.postgres._sql import APPLICATION, Statements

T = TypeVar("T")
# How a crypto-erasure scrubbed the keys, as its result says.
_RESEALED: Final = "row updates, no table rewrite"

__all__ = ["ErasingTables", "erase_in_tables", "scrub_tables"]

# What VACUUM FULL VERBOSE says of the dead row versions it copied (a snapshot may see them).
DEAD_KEPT: Final = re.compile(r"(\d+) dead row versions cannot be removed yet")


_Copy = tuple[str, str, bytes | None]


@attrs.frozen
class _TableCopies:
    """The copies of a session's events in the tables (see
    :class:`~nous_session.stores._erase.Copies`): a copy is named by its table, its session
    and the data key its record is sealed under (None: a plain record). Every session row
    read is locked against a concurrent snapshot or delete copying it.

    With a ``keyring`` (the store encrypts), an erased copy is sealed under its old record's
    key, and that key is noted in ``destroyed`` for :func:`crypto_erase`; ``plain`` notes a
    copy read in plain text, whose old bytes only a rewrite of the tables removes.
    """

    connection: psycopg.Connection[Any]
    statements: Statements
    where: str
    channel: str
    keyring: Keyring | None = None
    forgotten: list[int] = attrs.field(factory=list)  # erased metadata events' seqs
    destroyed: set[bytes] = attrs.field(factory=set)
    plain: list[bool] = attrs.field(factory=list)

    def row(self, name: str) -> SessionRow[str] | None:
        # FOR UPDATE: a fork (which reads its parent FOR SHARE) waits for the erasure, and
        # then copies the erased metadata; one made before is found among the children.
        return row_of(self.connection, self.statements, name, lock="FOR UPDATE")

    def held(self, row: SessionRow[Any], low: int) -> Iterable[int]:
        connection, statements = self.connection, self.statements
        yield from (seq for seq, _ in view(connection, statements, row, low))
        yield from (seq for seq, _ in inherited(connection, statements, row, low)[1] if seq >= low)
        yield from (seq for (seq,) in connection.execute(statements.own_kept_seqs, (row.key, low)))

    def events(self, name: str, row: SessionRow[Any]) -> list[Event]:
        rows = view(self.connection, self.statements, row, 0)
        named = place(name, self.where)
        if self.keyring is not None:
            rows = self.keyring.open_rows(rows, fetcher(self.connection, self.statements), named)
        return decode_rows(rows, named)

    def children(self, row: SessionRow[Any]) -> list[tuple[str, int | None]]:
        return self.connection.execute(self.statements.children, (row.uid,)).fetchall()

    def copies(self, member: str, seq: int) -> list[tuple[_Copy, Event]]:
        copies: list[tuple[_Copy, Event]] = []
        for table, query in self.statements.erase_select.items():
            found = self.connection.execute(query, (member, seq)).fetchone()
            if found is not None:
                where = place(member, self.where)(seq)
                stored, kid = found[0], kid_of(found[0])
                if kid is None:
                    self.plain.append(True)
                elif self.keyring is not None:
                    fetch = fetcher(self.connection, self.statements)
                    stored = self.keyring.open(seq, stored, fetch, where)
                event = decode(stored, where=where)
                copies.append(((table, member, kid), event))
        return copies

    def write(self, where: _Copy, event: Event) -> None:
        table, member, kid = where
        record = encode(event)
        if kid is not None and self.keyring is not None:
            # Sealed under the old key for now: crypto_erase re-seals every row of that key.
            cipher = self.keyring.cipher(kid, fetcher(self.connection, self.statements))
            record = self.keyring.seal(kid, cipher, event.seq, record)
            self.destroyed.add(kid)
        self.connection.execute(self.statements.erase_update[table], (record, member, event.seq))

    def forget(self, record: bytes, members: Sequence[str], seq: int) -> None:
        self.forgotten.append(seq)
        for member in members:
            self.connection.execute(self.statements.forget_metadata, (record.decode(), member, seq))

    def append(self, row: SessionRow[Any], event: Event) -> None:
        head = event.seq + 1
        record, kid = encode(event), None
        if self.keyring is not None:
            # Sealed under the session's current key, as a commit would (a crypto-erasure
            # that destroys that key next re-seals it with the rest).
            found = self.connection.execute(self.statements.session_kid, (row.key,)).fetchone()
            if found is not None and found[1] is not None:
                kid = bytes(found[1])
                cipher = self.keyring.cipher(kid, fetcher(self.connection, self.statements))
                record = self.keyring.seal(kid, cipher, event.seq, record)
        self.connection.execute(
            self.statements.append_erasure,
            {
                "name": row.key,
                "seq": event.seq,
                "record": record,
                "kid": kid,
                "channel": self.channel,
                "payload": dumps({"session": row.key, "head": head}).decode(),
            },
        )


def erase_in_tables(
    connection: psycopg.Connection[Any],
    statements: Statements,
    where: str,
    channel: str,
    request: ErasureRequest,
    keyring: Keyring | None = None,
) -> tuple[Erasure, str, bool, CryptoErasure | None]:
    """Rewrite every stored copy of the events to erase in one transaction (rolled back for
    a dry run); the result, the transaction's id (for :func:`scrub_tables`), whether an
    erased metadata record's listing copies were replaced (the sessions table too must be
    scrubbed), and with a ``keyring``, what destroying the old records' data keys in the same
    transaction did (:func:`~nous_session.stores.postgres._keys.crypto_erase`)."""
    crypto = None
    with connection.transaction(force_rollback=request.dry_run):
        copies = _TableCopies(connection, statements, where, channel, keyring)
        done = erase_rows(copies, request)
        if keyring is not None and not request.dry_run:
            destroyed = sorted(copies.destroyed)
            resealed = crypto_erase(connection, statements, keyring, destroyed)
            crypto = CryptoErasure(len(destroyed), resealed, bool(copies.plain))
        transaction = xid(connection)  # this transaction's: the scrub waits for older ones
    return done, transaction, bool(copies.forgotten), crypto


def scrub_tables(
    url: str,
    tables: tuple[sql.Identifier, ...],
    xid: str,
    *,
    rewrite: bool,
    lock_timeout: float,
    connect_timeout: float,
    application_name: str,
) -> tuple[bool, str]:
    """After an erasing commit (transaction ``xid``): wait for older transactions to end,
    then rewrite the tables (``VACUUM FULL``) or vacuum them. Returns whether no old row
    version can remain, and what was done.

    A transaction still running that began before the erasure committed, in any database
    of the server, keeps every snapshot's horizon (VACUUM's own included) at or before
    it, so VACUUM FULL would copy the erased rows' old versions as "recently dead". So
    the server's own report decides: VACUUM FULL VERBOSE says how many dead row versions
    it could not remove yet, and any makes the result unproven.
    """
    older = sql.SQL(
        "SELECT (SELECT count(*) FROM pg_stat_activity WHERE pid <> pg_backend_pid()"
        " AND ((backend_xid IS NOT NULL AND age(backend_xid) >= age(%(xid)s::xid))"
        " OR (datname = current_database() AND backend_xmin IS NOT NULL"
        " AND age(backend_xmin) >= age(%(xid)s::xid))))"
        " + (SELECT count(*) FROM pg_prepared_xacts"
        " WHERE age(transaction) >= age(%(xid)s::xid))"
        " + (SELECT count(*) FROM pg_replication_slots WHERE (xmin IS NOT NULL"
        " AND age(xmin) >= age(%(xid)s::xid)) OR (catalog_xmin IS NOT NULL"
        " AND age(catalog_xmin) >= age(%(xid)s::xid)))"
    )
    done: list[str] = []
    with psycopg.connect(
        url,
        autocommit=True,
        application_name=application_name,
        connect_timeout=max(1, int(connect_timeout)),
    ) as connection:
        deadline = time.monotonic() + lock_timeout
        pause = 0.01
        while True:
            found = connection.execute(older, {"xid": xid}).fetchone()
            blocking = 0 if found is None else found[0]  # one row of counts: never None
            if not blocking or time.monotonic() >= deadline:
                break
            time.sleep(pause)  # in a worker thread, never the event loop
            pause = min(pause * 2, 0.5)
        if blocking:
            done.append(
                f"{blocking} transaction(s) or slot(s) older than the erasure were still"
                " open: the old row versions may survive the vacuum"
            )
        connection.execute(
            sql.SQL("SET lock_timeout = {}").format(sql.Literal(f"{int(lock_timeout * 1000)}ms"))
        )
        verb = "VACUUM FULL" if rewrite else "VACUUM"
        names = " and ".join(table.as_string(connection) for table in tables)
        # The server reports through notices: a VACUUM it will not run (a role that does
        # not own the tables) is only a WARNING, and VERBOSE's INFO says what it kept.
        notices: list[tuple[str, str]] = []
        connection.add_notice_handler(
            lambda notice: notices.append(
                (notice.message_primary or "", notice.message_detail or "")
            )
        )
        try:
            connection.execute(sql.SQL(verb + " VERBOSE {}").format(sql.SQL(", ").join(tables)))
        except psycopg.errors.LockNotAvailable:
            done.append(
                f"{verb} did not get its lock within {lock_timeout} s: the old row versions"
                " remain in the tables' pages (erase again when the tables are quieter)"
            )
            return False, "; ".join(done)
    skipped = [primary for primary, _ in notices if primary.startswith("skipping")]
    if skipped:
        done.append(f"{verb} did not run: {'; '.join(skipped)}")
        return False, "; ".join(done)
    if not rewrite:
        done.append(
            "VACUUM freed the old row versions, but their bytes stay in the pages'"
            " free space until overwritten (not proven)"
        )
        return False, "; ".join(done)
    reports = [DEAD_KEPT.search(detail) for _, detail in notices]
    kept = sum(int(found.group(1)) for found in reports if found is not None)
    if sum(found is not None for found in reports) < len(tables):
        done.append(
            "VACUUM FULL rewrote the tables, but its report could not be read (is"
            " lc_messages English?): not proven"
        )
        return False, "; ".join(done)
    if kept:
        done.append(
            f"VACUUM FULL rewrote the tables but had to keep {kept} dead row version(s)"
            " that a transaction older than the erasure might still see: not proven"
            " (erase again once long transactions, in any database of the server, end)"
        )
        return False, "; ".join(done)
    done.append(
        f"VACUUM FULL rewrote {names} (their TOAST tables and indexes too), keeping no dead"
        " row version"
    )
    return not blocking, "; ".join(done)


class ErasingTables(Erasing):
    """:class:`~nous_session.stores.postgres.PostgresStore`'s erasure: the rows rewritten in
    one transaction, then the tables scrubbed (``erase`` and ``erase_session`` take
    ``rewrite`` and ``lock_timeout``)."""

    erase_options = frozenset({"rewrite", "lock_timeout"})

    url: str
    direct_url: str
    _sql: Statements
    _where: str
    _channel: str
    _pool: ConnectionPool[psycopg.Connection[tuple[Any, ...]]]
    _connect_timeout: float
    _keyring: Keyring | None

    async def _run(self, function: Callable[[], T]) -> T:
        raise NotImplementedError

    def _check_writable(self) -> None:
        raise NotImplementedError

    async def _erase(
        self, request: ErasureRequest, *, rewrite: bool = True, lock_timeout: float = 60.0
    ) -> Erasure:
        """Update the rows in one transaction (the sessions involved are locked against a
        concurrent snapshot, delete or fork copying them meanwhile; commits to them wait for
        it). An UPDATE leaves the old row version in its page, and a plain ``VACUUM`` only
        marks it free: its bytes stay in the page's free space until something is written
        over them. So, with ``rewrite`` (the default), ``VACUUM FULL`` then rewrites the
        events and kept tables (and their TOAST tables) into new files (and the sessions
        table, after a metadata erasure): it takes an ACCESS EXCLUSIVE lock on each, so every
        read and commit of every session in this schema waits for it, and it costs time and
        disk in proportion to the table. It waits at most ``lock_timeout`` seconds for its
        lock. It copies a dead row version that some transaction's snapshot may still see:
        the result is proven only when no snapshot older than the erasure was open (checked
        for up to ``lock_timeout`` seconds, in ``pg_stat_activity``, prepared transactions
        and replication slots) and the ``VACUUM FULL`` ran. Without ``rewrite``, a plain
        ``VACUUM`` runs and the result is not proven.

        A store opened with ``encryption`` crypto-erases instead (``rewrite`` does not apply):
        in the same transaction, the data keys the old records were sealed under are
        destroyed (every other row of those keys sealed again under new ones: row updates,
        the sessions of those keys moved to the new ones, the key rows deleted), then
        ``VACUUM FULL`` runs on the key table alone, as above (its lock lasts a small table's
        rewrite; the events and kept tables are not rewritten; the sessions table still is
        after a metadata erasure). A copy in plain text (written before encryption was on)
        makes it rewrite the events and kept tables as above too."""
        if type(rewrite) is not bool:
            raise ValueError(f"rewrite is True or False, got {rewrite!r}")
        dry_run = request.dry_run
        if not dry_run:
            self._check_writable()
        if isinstance(lock_timeout, bool) or not isinstance(lock_timeout, int | float):
            raise ValueError(f"lock_timeout is a number of seconds, got {lock_timeout!r}")

        def erase() -> tuple[Erasure, str, bool, CryptoErasure | None]:
            what = f"cannot erase from session {request.session_id!r}"
            with pooled(self._pool, what) as connection:
                return erase_in_tables(
                    connection, self._sql, self._where, self._channel, request, self._keyring
                )

        done, xid, listing, crypto = await self._run(erase)
        if dry_run:
            return attrs.evolve(done, detail="dry run: nothing was changed")
        if crypto is not None and not crypto.plain:
            # Only the key table: the old records stay, sealed under keys that are gone.
            proven, detail = await self._run(
                lambda: self._scrub(xid, True, lock_timeout, listing, keys_only=True)
            )
            return attrs.evolve(
                done,
                proven=proven,
                detail=f"{crypto.detail(_RESEALED)}; {detail}",
            )
        proven, detail = await self._run(lambda: self._scrub(xid, rewrite, lock_timeout, listing))
        if crypto is not None:
            detail = f"{crypto.detail(_RESEALED)}; a copy was in plain text, so: {detail}"
        return attrs.evolve(done, proven=proven, detail=detail)

    def _scrub(
        self,
        xid: str,
        rewrite: bool,
        lock_timeout: float,
        listing: bool,
        *,
        keys_only: bool = False,
    ) -> tuple[bool, str]:
        """After an erasing commit (transaction ``xid``), the tables scrubbed (see
        :func:`~nous_session.stores.postgres._erasure.scrub_tables`): the events and kept
        tables (``keys_only``, after a crypto-erasure: the key table alone instead), then,
        when an erased metadata record's listing copies were replaced (``listing``), the
        sessions table, whose old row versions and owner indexes hold them.
        Apart: every commit updates a session's row, so the sessions table nearly always has
        recently dead row versions under load, and those (which hold no erased text, when
        made after the erasure) must not cost the events' proof."""
        first = (self._sql.data_keys,) if keys_only else (self._sql.events, self._sql.kept)
        tables: list[tuple[sql.Identifier, ...]] = [first]
        if listing:
            tables.append((self._sql.sessions,))
        proven = True
        details = []
        for group in tables:
            try:
                with errors("scrubbing the tables failed"):
                    done, detail = scrub_tables(
                        self.direct_url,  # a session of its own (lock_timeout, VACUUM): no pooler
                        group,
                        xid,
                        rewrite=rewrite,
                        lock_timeout=lock_timeout,
                        connect_timeout=self._connect_timeout,
                        application_name=APPLICATION,
                    )
            except StoreError as error:
                # The rows are erased (that transaction committed): every holder reads the
                # erased form; only the proof is missing.
                return False, f"the events were erased, but {error} (not proven)"
            proven = proven and done
            details.append(detail)
        return proven, "; ".join(details)
