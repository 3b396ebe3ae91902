"""Erasure in PostgreSQL: rewriting every stored copy (the steps are
:mod:`nous_session.stores._erase`'s), then scrubbing the tables: the old row versions out of
the pages."""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any, Final

import attrs
import psycopg
from psycopg import sql

from nous_session.codec import decode, encode
from nous_session.erasure import Erasure
from nous_session.event import Event
from nous_session.stores._erase import erase_rows
from nous_session.stores._lineage import SessionRow
from nous_session.stores.base import place
from nous_session.stores.postgres._rows import inherited, row_of, view
from nous_session.stores.postgres._sql import Statements

__all__ = ["erase_in_tables", "scrub_tables"]

# What VACUUM FULL VERBOSE says of the dead row versions it copied (a snapshot may see them).
DEAD_KEPT: Final = re.compile(r"(\d+) dead row versions cannot be removed yet")


@attrs.frozen
class _TableCopies:
    """The copies of a session's events in the tables (see
    :class:`~nous_session.stores._erase.Copies`): a copy is named by its table and session.
    Every session row read is locked against a concurrent snapshot or delete copying it."""

    connection: psycopg.Connection[Any]
    statements: Statements
    where: str

    def row(self, name: str) -> SessionRow[str] | None:
        return row_of(self.connection, self.statements, name, lock="FOR SHARE")

    def held(self, row: SessionRow[Any], low: int) -> Iterable[int]:
        connection, statements = self.connection, self.statements
        yield from (seq for seq, _ in view(connection, statements, row, low))
        yield from (seq for seq, _ in inherited(connection, statements, row, low)[1] if seq >= low)
        yield from (seq for (seq,) in connection.execute(statements.own_kept_seqs, (row.key, low)))

    def children(self, name: str) -> list[tuple[str, int | None]]:
        return self.connection.execute(self.statements.children, (name,)).fetchall()

    def copies(self, member: str, seq: int) -> list[tuple[tuple[str, str], Event]]:
        copies: list[tuple[tuple[str, str], Event]] = []
        for table, query in self.statements.erase_select.items():
            found = self.connection.execute(query, (member, seq)).fetchone()
            if found is not None:
                event = decode(found[0], where=place(member, self.where)(seq))
                copies.append(((table, member), event))
        return copies

    def write(self, where: tuple[str, str], event: Event) -> None:
        table, member = where
        self.connection.execute(
            self.statements.erase_update[table], (encode(event), member, event.seq)
        )

    def forget(self, record: bytes, members: Sequence[str], seq: int) -> None:
        for member in members:
            self.connection.execute(self.statements.forget_metadata, (record.decode(), member, seq))


def erase_in_tables(
    connection: psycopg.Connection[Any],
    statements: Statements,
    where: str,
    session_id: str,
    wanted: Sequence[int] | None,
    inherited: bool | None,
    *,
    reason: str,
    at: datetime,
    dry_run: bool,
) -> tuple[Erasure, str]:
    """Rewrite every stored copy of the events to erase in one transaction (rolled back for
    a dry run); the result, and the transaction's id (for :func:`scrub_tables`)."""
    with connection.transaction(force_rollback=dry_run):
        done = erase_rows(
            _TableCopies(connection, statements, where),
            session_id,
            wanted,
            inherited,
            reason=reason,
            at=at,
            dry_run=dry_run,
        )
        xid = connection.execute("SELECT pg_current_xact_id()::text").fetchone()
    return done, str(int(xid[0]) % 2**32) if xid else "0"


def scrub_tables(
    url: str,
    tables: tuple[sql.Identifier, sql.Identifier],
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
            (blocking,) = connection.execute(older, {"xid": xid}).fetchone()  # type: ignore[misc]
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
        # The server reports through notices: a VACUUM it will not run (a role that does
        # not own the tables) is only a WARNING, and VERBOSE's INFO says what it kept.
        notices: list[tuple[str, str]] = []
        connection.add_notice_handler(
            lambda notice: notices.append(
                (notice.message_primary or "", notice.message_detail or "")
            )
        )
        try:
            connection.execute(sql.SQL(verb + " VERBOSE {}, {}").format(*tables))
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
    if sum(found is not None for found in reports) < 2:
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
        "VACUUM FULL rewrote the events and kept tables (and their TOAST tables),"
        " keeping no dead row version"
    )
    return not blocking, "; ".join(done)
