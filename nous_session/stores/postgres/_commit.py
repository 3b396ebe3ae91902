"""A PostgreSQL commit's parameters and the statements it runs alone (a snapshot's, or any
commit when group commits are off), and a rebasing commit (see the package's doc: a commit
is one statement; a group of them shares one transaction in :mod:`._group`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import orjson
from psycopg_pool import ConnectionPool

from nous_session.codec import encode
from nous_session.errors import ConflictError
from nous_session.event import Event
from nous_session.listing import latest_metadata
from nous_session.stores._common import Commit, identity_conflict
from nous_session.stores.base import check_commit_state, check_held
from nous_session.stores.postgres._errors import commit_errors, errors, pipelined
from nous_session.stores.postgres._rows import release_shared, row_of
from nous_session.stores.postgres._sql import Statements

__all__ = [
    "Unmatched",
    "commit_alone",
    "commit_parameters",
    "conflict",
    "rebase",
    "refused",
    "tail",
]


class Unmatched(Exception):
    """Internal: the commit statement matched no session row (a count or horizon conflict)."""


def commit_parameters(commit: Commit, channel: str) -> dict[str, Any]:
    """The named parameters of a commit statement (see :class:`Statements`)."""
    session_id, expected_count, rows = commit.session_id, commit.expected_count, commit.events
    keys, commit_id, horizon = commit.keys, commit.commit_id, commit.horizon
    count = rows[-1].seq + 1 if rows else expected_count
    metadata = latest_metadata(rows)
    return {
        "name": session_id,
        "expected": expected_count,
        "expected_horizon": commit.expected_horizon,
        "horizon": horizon,
        "count": count,
        "dropped": list(commit.dropped),
        "kept": list(commit.kept),
        "key_names": [key for key, _, _ in keys],
        "key_seqs": [first for _, first, _ in keys],
        "key_sizes": [size for _, _, size in keys],
        "commit_id": commit_id,
        "expected_uid": commit.expected_uid,
        "first": rows[0].seq if rows else expected_count,
        "size": len(rows),
        "channel": channel,
        # orjson: a tenth of json.dumps's time, on every commit's path on the event loop.
        "payload": orjson.dumps({"session": session_id, "head": count}).decode(),
        "meta": None if metadata is None else metadata[1].decode(),
        "meta_seq": None if metadata is None else metadata[0],
        "kid": None,  # the data key the records are sealed under (None: plain records)
        # A new data key for the session, stored by its first commit (see resolve_key).
        "new_kid": None,
        "new_provider": None,
        "new_wrapped": None,
    }


def commit_alone(
    pool: ConnectionPool[Any],
    statements: Statements,
    statement: Any,
    parameters: dict[str, Any],
    rows: Sequence[Event],
    *,
    locked: bool,
    dropped: Sequence[int],
    horizon: int | None,
    expected_horizon: int | None,
    sealer: Callable[[Sequence[Event]], list[bytes]] | None = None,
) -> str:
    """Run one commit's statement in a transaction of its own (in a worker thread). With
    ``locked`` (a snapshot, or a horizon to check against the stored one), under the
    session's row lock, after giving the forks sharing what it drops their copies. With a
    ``sealer``, the records are sealed by it. Returns the session's identity (uid).

    Raises:
        Unmatched: the statement matched no row (a conflict, or another data key).
    """
    session_id, expected_count = parameters["name"], parameters["expected"]
    parameters["seqs"] = [event.seq for event in rows]
    parameters["records"] = [encode(event) for event in rows] if sealer is None else sealer(rows)
    with commit_errors(session_id), pool.connection() as connection:
        if locked:
            with connection.transaction():
                row = row_of(connection, statements, session_id, lock="FOR UPDATE")
                count, stored_horizon = (0, 0) if row is None else (row.count, row.horizon)
                if count == expected_count and expected_horizon in (None, stored_horizon):
                    # A conflict is the statement's to report; only then this.
                    parameters["horizon"] = check_commit_state(
                        session_id,
                        stored_horizon,
                        dropped=dropped,
                        horizon=horizon,
                        expected_horizon=expected_horizon,
                    )
                if row is not None and dropped:
                    release_shared(connection, statements, row, min(dropped))
                done = connection.execute(statement, parameters).fetchone()
                if done is None:
                    raise Unmatched
        else:
            done = connection.execute(statement, parameters).fetchone()
    if done is None:
        raise Unmatched
    uid: str = done[0]
    return uid


def conflict(
    session_id: str,
    expected_count: int,
    expected_horizon: int | None,
    expected_uid: str | None = None,
) -> ConflictError:
    """The error of a commit whose statement matched no row."""
    return ConflictError(
        f"session {session_id!r} does not have count {expected_count}"
        + ("" if expected_horizon is None else f" and horizon {expected_horizon}")
        + (
            ": another writer committed first"
            if expected_uid is None
            else f" (or is not the one of identity {expected_uid!r}: deleted since, and made"
            " again if it exists): another writer committed first, or deleted it;"
            " nothing was written"
        )
    )


def tail(event: Event) -> bytes:
    """The event's record without its ``[1,<seq>`` head, for the database to renumber."""
    record = encode(event)
    head = b"[1,%d" % event.seq
    if not record.startswith(head):  # pragma: no cover - the codec's envelope changed
        raise AssertionError(f"unexpected record envelope {record[:16]!r}")
    return record[len(head) :]


def rebase(
    pool: ConnectionPool[Any],
    statements: Statements,
    parameters: dict[str, Any],
    rows: Sequence[Event],
) -> tuple[Any, list[Any], list[Any]]:
    """A rebasing commit, pipelined into one round trip: the moved count, horizon and the
    session's identity (None when nothing moved), and what other writers stored since the
    caller's count."""
    parameters["tails"] = [tail(event) for event in rows]
    with commit_errors(parameters["name"]), pool.connection() as connection:
        with pipelined(connection, begin="BEGIN"):
            if parameters["expected"] == 0 and parameters["expected_uid"] is None:
                connection.execute(statements.ensure_row, parameters)
            connection.execute(statements.lock_row, parameters)
            counted = connection.execute(statements.rebased, parameters)
            others = connection.execute(statements.others, parameters)
            keyed = connection.execute(statements.others_keys, parameters)
        return counted.fetchone(), others.fetchall(), keyed.fetchall()


def refused(
    pool: ConnectionPool[Any], statements: Statements, parameters: dict[str, Any], where: str
) -> BaseException:
    """Why a rebasing commit moved nothing: a count below the caller's, or rows missing."""
    session_id, expected_count = parameters["name"], parameters["expected"]
    with errors(f"cannot read session {session_id!r}"), pool.connection() as connection:
        found = connection.execute(statements.held_seqs, parameters).fetchall()
        expected_uid = parameters["expected_uid"]
        if expected_uid is not None:
            uid = connection.execute(statements.row_query, (session_id,)).fetchone()
            if uid is None or uid[5] != expected_uid:
                return identity_conflict(session_id, expected_uid)
    if found and found[0][0] >= expected_count:
        count, horizon, low = found[0][0], found[0][1], found[0][2]
        check_held(
            session_id,
            [seq for _, _, _, seq in found if seq is not None],
            count=count,
            horizon=horizon,
            since=low,
            where=where,
            seq=int,
        )
        return ConflictError(
            f"session {session_id!r} changed while committing; nothing was written"
        )
    return ConflictError(
        f"session {session_id!r} has a count below the expected {expected_count}"
        " (deleted, or written by another store?); nothing was written"
    )
