"""Scrubbing PostgreSQL's tables after an erasure: the old row versions out of the pages."""

from __future__ import annotations

import re
import time
from typing import Final

import psycopg
from psycopg import sql

__all__ = ["scrub_tables"]

# What VACUUM FULL VERBOSE says of the dead row versions it copied (a snapshot may see them).
DEAD_KEPT: Final = re.compile(r"(\d+) dead row versions cannot be removed yet")


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
