"""The SQL text of the SQLite store."""

from __future__ import annotations

from typing import Any, Final

from nous_session.listing import ListQuery

# What a listing's order is on: the column, and the index that serves it with an owner.
_ORDER_COLUMNS: Final = {"active": "active", "created": "created"}


def listing(query: ListQuery) -> tuple[str, list[Any]]:
    """The SELECT (and its parameters) for a listing: one page and one more row.

    The owner filter and the order are the leading columns of an index (owner, time, name),
    or (time, name) with no owner: the query walks that index from the cursor and stops after
    ``limit + 1`` matches. Other filters are checked on the rows the index yields.
    """
    column = _ORDER_COLUMNS[query.order]
    clauses = ["count > 0"]
    parameters: list[Any] = []
    for key, wanted in query.where:
        if key in ("owner", "app"):
            clauses.append(f"{key} = ?")
            parameters.append(wanted)
        elif key == "title":
            clauses.append("json_extract(meta, '$.title') = ?")
            parameters.append(wanted)
        else:
            clauses.append(
                "EXISTS (SELECT 1 FROM json_each(meta, '$.extra') WHERE key = ? AND "
                + _json_match(wanted)
                + ")"
            )
            parameters.append(key)
            if wanted is not None and not isinstance(wanted, bool):
                parameters.append(wanted)
    for tag in sorted(query.tags):
        clauses.append("EXISTS (SELECT 1 FROM json_each(meta, '$.tags') WHERE value = ?)")
        parameters.append(tag)
    for name, low, high in (
        ("created", query.created_since, query.created_before),
        ("active", query.active_since, query.active_before),
    ):
        if low is not None:
            clauses.append(f"{name} >= ?")
            parameters.append(low)
        if high is not None:
            clauses.append(f"{name} < ?")
            parameters.append(high)
    direction = "DESC" if query.descending else "ASC"
    if query.after is not None:
        clauses.append(f"({column}, name) {'<' if query.descending else '>'} (?, ?)")
        parameters.extend(query.after)
    parameters.append(query.limit + 1)
    statement = (
        "SELECT name, count, parent, meta, created, active FROM nous_sessions"
        f" WHERE {' AND '.join(clauses)} ORDER BY {column} {direction}, name {direction} LIMIT ?"
    )
    return statement, parameters


def _json_match(wanted: object) -> str:
    """The condition on json_each's ``type`` and ``value`` for an extra field to equal
    ``wanted`` (a bool is no number; 1 equals 1.0)."""
    if wanted is None:
        return "type = 'null'"
    if isinstance(wanted, bool):
        return "type = 'true'" if wanted else "type = 'false'"
    if isinstance(wanted, str):
        return "type = 'text' AND value = ?"
    return "type IN ('integer', 'real') AND value = ?"


# The common commit's conflict check is the count's conditional UPDATE. The last-active time
# is written (a second statement) only when it is a second or more behind: writing it in every
# commit would update two indexes per commit (SQLite maintains an index whenever the UPDATE
# names one of its columns, whether the value changes or not), and the time is kept to the
# second, by a conditional UPDATE. The first commit of a session through a store reads its id
# and identity (uid) back (RETURNING); later ones name the row by the id the store keeps, its
# name and its uid, so that a row deleted meanwhile is never the one moved: not when its id is
# taken by another session, nor when the session is made again under its name and SQLite gives
# the new row the same id (the highest id + 1, as the deleted row's was). So the uid a commit
# returns is the one the store keeps, with no reading back. A commit that expects an identity
# (``expected_uid``) names it instead (the row must have it, or nothing moves). RETURNING
# costs more than the second UPDATE: one commit's statements alone in their transaction took
# 26-51 µs reading the id and the last-active time back at every commit, against 16-32 by the
# kept id, and 28-32 against 24-29 per commit in a transaction of 200 (medians of rounds in
# three runs).
# Each also checks the session's data key (``kid IS ?``): the one the commit sealed its
# records under, or NULL for a store without encryption. An erasure replaces a session's key:
# a commit sealed under the old one (or in plain text into an encrypted session) moves nothing
# and takes the full path, which reads the stored key.
ADVANCE: Final = (
    "UPDATE nous_sessions SET count = ?, held = held + ?"
    " WHERE name = ? AND count = ? AND kid IS ? AND uid = coalesce(?, uid) RETURNING id, uid"
)


ADVANCE_AT_HORIZON: Final = (
    "UPDATE nous_sessions SET count = ?, held = held + ?"
    " WHERE name = ? AND count = ? AND horizon = ? AND kid IS ? AND uid = coalesce(?, uid)"
    " RETURNING id, uid"
)


ADVANCE_KNOWN: Final = (
    "UPDATE nous_sessions SET count = ?, held = held + ?"
    " WHERE id = ? AND name = ? AND uid = ? AND count = ? AND kid IS ?"
)


ADVANCE_KNOWN_AT_HORIZON: Final = (
    "UPDATE nous_sessions SET count = ?, held = held + ?"
    " WHERE id = ? AND name = ? AND uid = ? AND count = ? AND horizon = ? AND kid IS ?"
)


TOUCH: Final = "UPDATE nous_sessions SET active = ? WHERE id = ? AND active <= ?"


# Erasure: a session's own kept seqs, its forks, and an erased metadata record's copies.
OWN_KEPT_SEQS: Final = "SELECT seq FROM nous_kept WHERE sid = ? AND seq >= ?"
CHILDREN: Final = "SELECT name, fork_point FROM nous_sessions WHERE parent_uid = ?"
FORGET_METADATA: Final = "UPDATE nous_sessions SET meta = ? WHERE name = ? AND meta_seq = ?"

# Reads and forks.
KEYS_FROM: Final = "SELECT key, seq, n FROM nous_keys WHERE sid = ? AND seq >= ?"
KEPT_OF: Final = "SELECT seq, record FROM nous_kept WHERE sid = ? ORDER BY seq"
FORK: Final = (
    "INSERT INTO nous_sessions (name, count, held, horizon, parent, fork_point,"
    " shares, created, active, meta, meta_seq, uid, parent_uid)"
    " VALUES (?, ?, 0, ?, ?, ?, 1, ?, ?, ?, ?, lower(hex(randomblob(8))), ?)"
)
