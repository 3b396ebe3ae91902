"""The SQL a :class:`~nous_session.stores.postgres.PostgresStore` sends, built once per
schema: the tables' identifiers and the statements of its commits and reads."""

from __future__ import annotations

import json
from typing import Any, Final

from psycopg import sql

from nous_session.listing import ListQuery, from_micros

__all__ = ["APPLICATION", "Statements", "listing"]

APPLICATION: Final = "nous_session"
"""The ``application_name`` of the store's connections (its LISTEN connection adds
``" listener"``)."""


class _Tables:
    """The tables every group of statements names."""

    events: sql.Identifier
    kept: sql.Identifier
    _tables: dict[str, sql.Identifier]  # by the names the statements' {fields} use

    def _statement(self, text: str) -> sql.Composed:
        """The statement ``text`` with each ``{table}`` field filled in: one of the schema's."""
        return sql.SQL(text).format(**self._tables)

    def _per_copy_table(self, text: str) -> dict[str, sql.Composed]:
        """The statement ``text`` for each table an event's copy is in (``"events"`` and
        ``"kept"``), by that name: its ``{}`` field filled in with the table."""
        return {
            name: sql.SQL(text).format(table)
            for name, table in (("events", self.events), ("kept", self.kept))
        }


class _ErasureStatements(_Tables):
    """Erasure's statements (see :mod:`~nous_session.stores.postgres._erasure`)."""

    def __init__(self) -> None:
        # Erasure: a copy of an event in the events or kept table, read and rewritten; a
        # session's forks (locked against a snapshot copying them meanwhile); its own kept
        # seqs; an erased metadata record's copies.
        self.erase_select = self._per_copy_table(
            "SELECT record FROM {} WHERE session = %s AND seq = %s"
        )
        self.erase_update = self._per_copy_table(
            "UPDATE {} SET record = %s WHERE session = %s AND seq = %s"
        )
        self.children = self._statement(
            "SELECT name, fork_point FROM {sessions} WHERE parent_uid = %s"
            " AND fork_point IS NOT NULL ORDER BY name FOR UPDATE"
        )
        self.own_kept_seqs = self._statement(
            "SELECT seq FROM {kept} WHERE session = %s AND seq >= %s"
        )
        self.relink_forks = self._statement(
            "UPDATE {sessions} SET parent = %s, parent_uid = %s,"
            " fork_point = least(fork_point, %s) WHERE parent_uid = %s"
        )
        # An erasure's record: the session's next event, and a notification of its head.
        self.append_erasure = self._statement(
            """WITH moved AS (
                UPDATE {sessions} SET count = %(seq)s + 1
                WHERE name = %(name)s AND count = %(seq)s RETURNING 1
            ), inserted AS (
                INSERT INTO {events} (session, seq, record, kid)
                SELECT %(name)s, %(seq)s, %(record)s, %(kid)s::bytea FROM moved RETURNING 1
            )
            SELECT pg_notify(%(channel)s, %(payload)s) FROM moved"""
        )
        self.forget_metadata = self._statement(
            "UPDATE {sessions} SET meta = %s::jsonb WHERE name = %s AND meta_seq = %s"
        )


class _KeyStatements(_Tables):
    """The statements of encryption at rest (see :mod:`~nous_session.stores.postgres._keys`)."""

    def __init__(self) -> None:
        # Encryption at rest: data keys, a session's current one, the rows of a key.
        self.data_key = self._statement("SELECT provider, wrapped FROM {data_keys} WHERE kid = %s")
        self.add_data_key = self._statement(
            "INSERT INTO {data_keys} (kid, provider, wrapped) VALUES (%s, %s, %s)"
        )
        self.session_kid = self._statement("SELECT count, kid FROM {sessions} WHERE name = %s")
        # A session's key, set unless it has one (its row made, count 0, if missing): the key
        # it has after this.
        self.set_session_kid = self._statement(
            "INSERT INTO {sessions} AS s (name, count, kid) VALUES (%s, 0, %s)"
            " ON CONFLICT (name) DO UPDATE SET kid = coalesce(s.kid, excluded.kid)"
            " RETURNING kid"
        )
        self.set_kid_locked = self._statement("UPDATE {sessions} SET kid = %s WHERE name = %s")
        # A crypto-erasure: the sessions whose current key is destroyed move to its successor
        # first (taking their row locks: a commit sealed under the old key waits, then moves
        # nothing), then the rows of the old key are read (in the sessions holding it, by
        # session: the primary key's range of each), re-sealed and rewritten, and the holders
        # move to the successor too.
        self.replace_kid = self._statement("UPDATE {sessions} SET kid = %s WHERE kid = %s")
        self.holders_of_key = self._statement(
            'SELECT session FROM {key_holders} WHERE kid = %s ORDER BY session COLLATE "C"'
        )
        self.rows_of_key = self._per_copy_table(
            "SELECT session, seq, record FROM {} WHERE session = ANY(%s::text[])"
            " AND kid = %s FOR UPDATE"
        )
        self.replace_holders = self._statement("UPDATE {key_holders} SET kid = %s WHERE kid = %s")
        # A deleted session's keys: its holder rows go, and the keys no other session holds
        # are destroyed.
        self.release_keys = self._statement(
            "DELETE FROM {key_holders} WHERE session = %s RETURNING kid"
        )
        self.destroy_unheld = self._statement(
            "DELETE FROM {data_keys} AS d WHERE d.kid = ANY(%s::bytea[])"
            " AND NOT EXISTS (SELECT 1 FROM {key_holders} h WHERE h.kid = d.kid) RETURNING d.kid"
        )
        self.add_holder = self._statement(
            "INSERT INTO {key_holders} (kid, session) VALUES (%s, %s) ON CONFLICT DO NOTHING"
        )
        self.reseal = self._per_copy_table(
            "UPDATE {} AS t SET record = r.record, kid = %s"
            " FROM unnest(%s::text[], %s::bigint[], %s::bytea[]) AS r (session, seq, record)"
            " WHERE t.session = r.session AND t.seq = r.seq"
        )
        self.drop_data_key = self._statement("DELETE FROM {data_keys} WHERE kid = %s")
        self.all_data_keys = self._statement(
            "SELECT kid, provider, wrapped FROM {data_keys} ORDER BY kid FOR UPDATE"
        )
        self.rewrap_data_key = self._statement(
            "UPDATE {data_keys} SET provider = %s, wrapped = %s WHERE kid = %s"
        )


class Statements(_ErasureStatements, _KeyStatements):
    """The tables of one schema and the statements a store runs against them.

    Args:
        schema: the schema the tables are in (a plain identifier, checked by the store).
    """

    def __init__(self, schema: str) -> None:
        self.events = sql.Identifier(schema, "nous_events")
        self.sessions = sql.Identifier(schema, "nous_sessions")
        self.keys = sql.Identifier(schema, "nous_keys")
        self.commits = sql.Identifier(schema, "nous_commits")
        self.kept = sql.Identifier(schema, "nous_kept")
        self.data_keys = sql.Identifier(schema, "nous_data_keys")
        self.key_holders = sql.Identifier(schema, "nous_key_holders")
        self._tables = {
            "sessions": self.sessions,
            "events": self.events,
            "keys": self.keys,
            "commits": self.commits,
            "kept": self.kept,
            "data_keys": self.data_keys,
            "key_holders": self.key_holders,
        }
        # A commit is one statement, atomic by itself (the pool's connections autocommit):
        # move the session's count from the expected value (and check its horizon), and only
        # if that matched, keep aside and delete the dropped rows, insert the new ones, record
        # the keys and the commit id, and notify. A concurrent writer's UPDATE waits for the
        # row and then finds the count moved, so it changes nothing: a conflict. The row lock
        # is held for this one statement, never across round trips. A key or commit id that
        # exists already fails the statement as a whole (a unique violation). Nothing to keep
        # or drop is a constant false the planner sees (no scan at all): ``seq = ANY('{}')``
        # alone is a contradiction, which "implies" the predicate of any partial index, and
        # on stale statistics the planner could read all of one for nothing. The session's
        # data key must be the one the records were sealed under (``kid``; NULL for a store
        # without encryption): an erasure replaces it, and then the commit moves nothing. So
        # must the session's identity be ``expected_uid``, when given. The session's identity
        # (uid) comes back in the statement's one row (none: a conflict).
        writes = """
            , kept AS (
                INSERT INTO {kept} (session, seq, record, kid)
                SELECT session, seq, record, kid FROM {events}
                WHERE cardinality(%(kept)s::bigint[]) > 0
                AND session = %(name)s AND seq = ANY(%(kept)s) AND EXISTS (SELECT 1 FROM moved)
                RETURNING 1
            ), dropped AS (
                DELETE FROM {events} WHERE cardinality(%(dropped)s::bigint[]) > 0
                AND session = %(name)s AND seq = ANY(%(dropped)s)
                AND EXISTS (SELECT 1 FROM moved) RETURNING 1
            ), inserted AS (
                INSERT INTO {events} (session, seq, record, kid)
                SELECT %(name)s, seq, record, %(kid)s::bytea
                FROM unnest(%(seqs)s::bigint[], %(records)b::bytea[]) AS rows (seq, record)
                WHERE EXISTS (SELECT 1 FROM moved) RETURNING 1
            ), keyed AS (
                INSERT INTO {keys} (session, key, seq, n)
                SELECT %(name)s, k.key, k.seq, k.n
                FROM unnest(%(key_names)s::text[], %(key_seqs)s::bigint[], %(key_sizes)s::int[])
                    AS k (key, seq, n)
                WHERE EXISTS (SELECT 1 FROM moved) RETURNING 1
            ), named AS (
                INSERT INTO {commits} (session, commit_id, seq, n)
                SELECT %(name)s, %(commit_id)s::text, %(first)s, %(size)s
                WHERE %(commit_id)s::text IS NOT NULL AND EXISTS (SELECT 1 FROM moved)
                RETURNING 1
            )
            SELECT uid, pg_notify(%(channel)s, %(payload)s) FROM moved
        """
        self.commit = self._statement(
            """WITH moved AS (
                UPDATE {sessions} SET count = %(count)s, horizon = coalesce(%(horizon)s, horizon),
                    active = CASE WHEN %(size)s > 0 AND active <= now() - interval '1 second'
                        THEN now() ELSE active END,
                    meta = coalesce(%(meta)s::jsonb, meta),
                    meta_seq = coalesce(%(meta_seq)s::bigint, meta_seq)
                WHERE name = %(name)s AND count = %(expected)s
                AND (%(expected_horizon)s::bigint IS NULL OR horizon = %(expected_horizon)s)
                AND (%(expected_uid)s::text IS NULL OR uid = %(expected_uid)s::text)
                AND kid IS NOT DISTINCT FROM %(kid)s::bytea
                RETURNING name, uid
            )"""
            + writes
        )
        # The first commit of a session creates its row, unless another writer just did (or
        # an empty commit made it: then it moves that row's count, and horizon, alike; one
        # that expects an identity is sent as ``commit``, as the row must exist). A
        # store that encrypts stores the session's new data key with it (``new_kid``, ...),
        # and records the session as holding rows under it.
        self.first_commit = self._statement(
            """WITH moved AS (
                INSERT INTO {sessions} AS s (name, count, horizon, meta, meta_seq, kid)
                VALUES (%(name)s, %(count)s, coalesce(%(horizon)s, 0), %(meta)s::jsonb,
                        %(meta_seq)s::bigint, %(kid)s::bytea)
                ON CONFLICT (name) DO UPDATE SET count = excluded.count,
                    horizon = coalesce(%(horizon)s::bigint, s.horizon),
                    active = greatest(s.active, now()), meta = coalesce(excluded.meta, s.meta),
                    meta_seq = coalesce(excluded.meta_seq, s.meta_seq)
                WHERE s.count = 0
                AND (%(expected_horizon)s::bigint IS NULL OR s.horizon = %(expected_horizon)s)
                AND s.kid IS NOT DISTINCT FROM %(kid)s::bytea
                RETURNING name, s.uid
            ), data_key AS (
                INSERT INTO {data_keys} (kid, provider, wrapped)
                SELECT %(new_kid)s::bytea, %(new_provider)s::text, %(new_wrapped)s::bytea
                WHERE %(new_kid)s::bytea IS NOT NULL AND EXISTS (SELECT 1 FROM moved)
                RETURNING 1
            ), key_holder AS (
                INSERT INTO {key_holders} (kid, session)
                SELECT %(new_kid)s::bytea, %(name)s
                WHERE %(new_kid)s::bytea IS NOT NULL AND EXISTS (SELECT 1 FROM moved)
                ON CONFLICT DO NOTHING RETURNING 1
            )"""
            + writes
        )

        # Many sessions' common commits (each to an existing session, dropping nothing) as one
        # statement: the sessions' rows locked in name order (two groups cannot deadlock), each
        # count moved from its expected value, and only for the sessions that matched, their
        # rows, keys and commit ids inserted and a NOTIFY sent. The names of the sessions that
        # moved come back, with their identities (uid); a session missing from them had a
        # count or horizon conflict.
        self.group_commit = self._statement(
            """WITH v AS (
                SELECT * FROM unnest(%(names)s::text[], %(expected)s::bigint[],
                    %(counts)s::bigint[], %(expected_horizons)s::bigint[], %(payloads)s::text[],
                    %(kids)s::bytea[], %(expected_uids)s::text[])
                    AS v (name, expected, count, expected_horizon, payload, kid, expected_uid)
            ), locked AS (
                SELECT name FROM {sessions} WHERE name = ANY(%(names)s::text[])
                ORDER BY name FOR UPDATE
            ), moved AS (
                UPDATE {sessions} AS s SET count = v.count, active = CASE
                    WHEN v.count > v.expected AND s.active <= now() - interval '1 second'
                    THEN now() ELSE s.active END
                FROM v JOIN locked USING (name)
                WHERE s.name = v.name AND s.count = v.expected
                AND (v.expected_horizon IS NULL OR s.horizon = v.expected_horizon)
                AND (v.expected_uid IS NULL OR s.uid = v.expected_uid)
                AND s.kid IS NOT DISTINCT FROM v.kid
                RETURNING s.name, s.uid, v.payload, v.kid
            ), inserted AS (
                INSERT INTO {events} (session, seq, record, kid)
                SELECT e.session, e.seq, e.record, moved.kid
                FROM unnest(%(event_sessions)s::text[], %(seqs)s::bigint[],
                    %(records)b::bytea[]) AS e (session, seq, record)
                JOIN moved ON moved.name = e.session RETURNING 1
            ), keyed AS (
                INSERT INTO {keys} (session, key, seq, n)
                SELECT k.session, k.key, k.seq, k.n
                FROM unnest(%(key_sessions)s::text[], %(key_names)s::text[],
                    %(key_seqs)s::bigint[], %(key_sizes)s::int[]) AS k (session, key, seq, n)
                WHERE k.session IN (SELECT name FROM moved) RETURNING 1
            ), named AS (
                INSERT INTO {commits} (session, commit_id, seq, n)
                SELECT c.session, c.commit_id, c.seq, c.n
                FROM unnest(%(commit_sessions)s::text[], %(commit_ids)s::text[],
                    %(firsts)s::bigint[], %(sizes)s::int[]) AS c (session, commit_id, seq, n)
                WHERE c.session IN (SELECT name FROM moved) RETURNING 1
            )
            SELECT name, uid, pg_notify(%(channel)s, payload) FROM moved"""
        )

        # A rebasing commit moves the count by the batch's length from wherever it is (taking
        # the row lock), and inserts the batch after the old count; the record is rebuilt
        # around its new seq (the client sends what follows the seq), and the keys and the
        # commit id move with it. Its first commit of a session may create the row. (A store
        # that encrypts seals the records itself, under the row lock: see rebased_sealed.)
        inserted_plain = """
            ), inserted AS (
                INSERT INTO {events} (session, seq, record)
                SELECT %(name)s, moved.base + rows.pos - 1,
                       convert_to('[1,' || (moved.base + rows.pos - 1)::text, 'UTF8') || rows.tail
                FROM moved, unnest(%(tails)b::bytea[]) WITH ORDINALITY AS rows (tail, pos)
                RETURNING 1"""
        inserted_sealed = """
            ), inserted AS (
                INSERT INTO {events} (session, seq, record, kid)
                SELECT %(name)s, moved.base + rows.pos - 1, rows.record, %(kid)s::bytea
                FROM moved, unnest(%(records)b::bytea[]) WITH ORDINALITY AS rows (record, pos)
                RETURNING 1"""
        rebased = """
            ), keyed AS (
                INSERT INTO {keys} (session, key, seq, n)
                SELECT %(name)s, k.key, moved.base + k.seq - %(expected)s, k.n
                FROM moved, unnest(%(key_names)s::text[], %(key_seqs)s::bigint[],
                                   %(key_sizes)s::int[]) AS k (key, seq, n)
                RETURNING 1
            ), named AS (
                INSERT INTO {commits} (session, commit_id, seq, n)
                SELECT %(name)s, %(commit_id)s::text, moved.base, %(n)s FROM moved
                WHERE %(commit_id)s::text IS NOT NULL
                RETURNING 1
            )
            SELECT base, horizon, uid, pg_notify(%(channel)s, json_build_object(
                'session', %(name)s::text, 'head', base + %(n)s)::text) FROM moved
        """
        # It moves nothing when the session is missing a row between its horizon (or the
        # caller's count, or a sharing fork's own first seq) and its count: a rebase never
        # writes past a hole. That count of rows must see what the writers this one waited
        # for committed, so the row lock is taken by an earlier statement (_lock_row): a
        # statement's snapshot is taken when it starts, and a subquery in an UPDATE that
        # waited for the lock would still count with the snapshot from before the wait.
        moving = """WITH moved AS (
                UPDATE {sessions} AS s SET count = s.count + %(n)s,
                    active = CASE WHEN s.active <= now() - interval '1 second' THEN now()
                                  ELSE s.active END,
                    meta = coalesce(%(meta)s::jsonb, s.meta),
                    meta_seq = CASE WHEN %(meta)s::jsonb IS NULL THEN s.meta_seq
                                    ELSE s.count + %(meta_offset)s::bigint END
                WHERE s.name = %(name)s AND s.count >= %(expected)s
                AND (%(expected_uid)s::text IS NULL OR s.uid = %(expected_uid)s::text)
                AND s.kid IS NOT DISTINCT FROM %(kid)s::bytea
                AND (SELECT count(*) FROM {events} e WHERE e.session = s.name
                     AND e.seq >= greatest(%(expected)s, s.horizon,
                                           CASE WHEN s.shares THEN s.fork_point + 1 ELSE 0 END)
                     AND e.seq < s.count)
                    = greatest(0, s.count - greatest(%(expected)s, s.horizon,
                                           CASE WHEN s.shares THEN s.fork_point + 1 ELSE 0 END))
                RETURNING s.count - %(n)s AS base, s.horizon, s.uid"""
        self.rebased = self._statement(moving + inserted_plain + rebased)
        self.rebased_sealed = self._statement(moving + inserted_sealed + rebased)
        # A rebase's first commit of a session makes its row (count 0) if missing, so that
        # _lock_row always has a row to lock: another writer's first commit is waited for
        # (not one that expects an identity: the row must exist).
        self.ensure_row = self._statement(
            "INSERT INTO {sessions} (name, count) VALUES (%(name)s, 0)"
            " ON CONFLICT (name) DO NOTHING"
        )
        self.lock_row = self._statement(
            "SELECT count, kid FROM {sessions} WHERE name = %(name)s FOR UPDATE"
        )
        # Where the rows a refused rebase missed should be: the session's own rows from
        # max(horizon, the caller's count, a sharing fork's first own seq) to its count.
        self.held_seqs = self._statement(
            """WITH s AS (
                SELECT name, count, horizon, greatest(%(expected)s, horizon,
                       CASE WHEN shares THEN fork_point + 1 ELSE 0 END) AS low
                FROM {sessions} WHERE name = %(name)s
            )
            SELECT s.count, s.horizon, s.low, e.seq FROM s
            LEFT JOIN {events} e ON e.session = s.name AND e.seq >= s.low
            ORDER BY e.seq"""
        )
        # Run in the same transaction, after the row lock is taken: a new statement sees what
        # the writers it waited for committed, and (as the transaction's own) the new rows,
        # which the bound excludes.
        self.others = self._statement(
            """SELECT seq, record FROM {events}
               WHERE session = %(name)s AND seq >= %(expected)s
               AND seq < (SELECT count FROM {sessions} WHERE name = %(name)s) - %(n)s
               ORDER BY seq"""
        )
        self.others_keys = self._statement(
            """SELECT key, seq, n FROM {keys}
               WHERE session = %(name)s AND seq >= %(expected)s
               AND seq < (SELECT count FROM {sessions} WHERE name = %(name)s) - %(n)s"""
        )
        self.row_query = self._statement(
            "SELECT count, horizon, parent, fork_point, shares, uid, parent_uid FROM {sessions}"
            " WHERE name = %s"
        )
        self.range_query = self._statement(
            "SELECT seq, record FROM {events} WHERE session = %s AND seq >= %s AND seq <= %s"
            " ORDER BY seq"
        )
        # Reads.
        self.events_from = self._statement(
            "SELECT seq, record FROM {events} WHERE session = %s AND seq >= %s ORDER BY seq"
        )
        self.keys_from = self._statement(
            "SELECT key, seq, n FROM {keys} WHERE session = %s AND seq >= %s"
        )
        self.kept_of = self._statement(
            "SELECT seq, record FROM {kept} WHERE session = %s ORDER BY seq"
        )
        self.committed = self._statement(
            "SELECT seq, n FROM {commits} WHERE session = %s AND commit_id = %s"
        )
        self.metadata = self._statement("SELECT meta, meta_seq FROM {sessions} WHERE name = %s")
        self.sessions_held = self._statement(
            "SELECT s.name, s.count, s.horizon, s.parent, s.fork_point, s.shares,"
            " (SELECT count(*) FROM {events} e WHERE e.session = s.name)"
            ' FROM {sessions} s WHERE s.count > 0 ORDER BY s.name COLLATE "C"'
        )
        self.count_range = self._statement(
            "SELECT count(*) FROM {events} WHERE session = %s AND seq >= %s AND seq <= %s"
        )
        # A sharing fork's lineage, and its own copy.
        self.inherited_keys = self._statement(
            "SELECT key, seq, n FROM {keys} WHERE session = %s AND seq >= %s AND seq + n - 1 <= %s"
        )
        self.inherited_kept = self._statement(
            "SELECT seq, record FROM {kept} WHERE session = %s AND seq >= %s AND seq <= %s"
            " ORDER BY seq"
        )
        self.copy_keys = self._statement(
            "INSERT INTO {keys} (session, key, seq, n) SELECT %s, k.key, k.seq, k.n"
            " FROM unnest(%s::text[], %s::bigint[], %s::int[]) AS k (key, seq, n)"
            " ON CONFLICT DO NOTHING"
        )
        # Byte copies: a sealed record stays sealed under its key, and its kid goes with it.
        self.copy_kept = self._statement(
            "INSERT INTO {kept} (session, seq, record, kid) SELECT %s, k.seq, k.record, k.kid"
            " FROM unnest(%s::bigint[], %s::bytea[], %s::bytea[]) AS k (seq, record, kid)"
            " ON CONFLICT DO NOTHING"
        )
        self.copy_events = self._statement(
            "INSERT INTO {events} (session, seq, record, kid) SELECT %s, seq, record, kid"
            " FROM {events} WHERE session = %s AND seq >= %s AND seq <= %s"
        )
        # The session given copies holds rows under their keys: those of a range of another
        # session's events (read again, through the primary key), or the keys given.
        self.copy_holders = self._statement(
            "INSERT INTO {key_holders} (kid, session) SELECT DISTINCT kid, %s::text"
            " FROM {events} WHERE session = %s AND seq >= %s AND seq <= %s AND kid IS NOT NULL"
            " ON CONFLICT DO NOTHING"
        )
        self.hold = self._statement(
            "INSERT INTO {key_holders} (kid, session) SELECT DISTINCT k, %s::text"
            " FROM unnest(%s::bytea[]) AS k WHERE k IS NOT NULL ON CONFLICT DO NOTHING"
        )
        self.stop_sharing = self._statement("UPDATE {sessions} SET shares = false WHERE name = %s")
        self.sharing_children = self._statement(
            "SELECT name FROM {sessions} WHERE parent = %s AND shares AND fork_point >= %s"
            " ORDER BY name FOR UPDATE"
        )
        # Forks and deletes.
        self.fork = self._statement(
            "INSERT INTO {sessions} (name, count, horizon, parent, fork_point, shares, meta,"
            " meta_seq, parent_uid) VALUES (%s, %s, %s, %s, %s, true, %s::jsonb, %s, %s)"
            " ON CONFLICT (name) DO UPDATE SET count = excluded.count, horizon = excluded.horizon,"
            " parent = excluded.parent, fork_point = excluded.fork_point, shares = true,"
            " parent_uid = excluded.parent_uid,"
            " meta = excluded.meta, meta_seq = excluded.meta_seq, created = now(), active = now()"
            " WHERE {sessions}.count = 0 RETURNING 1"
        )
        self.idle = self._statement(
            "SELECT count, active FROM {sessions} WHERE name = %s FOR UPDATE"
        )
        # A session's rows in every table but the sessions table, then its row there, which
        # tells its followers (in the deleting transaction, as a commit does): the head -1,
        # "read whatever there is", which finds it deleted (a listener of any version pushes
        # -1 as it is).
        self.delete_rows = tuple(
            sql.SQL("DELETE FROM {} WHERE session = %s").format(table)
            for table in (self.events, self.keys, self.commits, self.kept)
        )
        self.delete_session = self._statement(
            """WITH gone AS (DELETE FROM {sessions} WHERE name = %(name)s RETURNING name)
            SELECT pg_notify(%(channel)s, json_build_object('session', name, 'head', -1)::text)
            FROM gone"""
        )
        _ErasureStatements.__init__(self)
        _KeyStatements.__init__(self)


def listing(statements: Statements, query: ListQuery) -> tuple[sql.Composed, list[Any]]:
    """The SELECT (and its parameters) for a listing: one page and one more row, walking
    the index (owner, time, name), or (time, name) with no owner, from the cursor; the
    other filters are checked on the rows it yields."""
    column = sql.Identifier(query.order)
    clauses: list[sql.Composable] = [sql.SQL("count > 0")]
    parameters: list[Any] = []
    extra: dict[str, Any] = {}
    for key, wanted in query.where:
        if key in ("owner", "app"):
            clauses.append(sql.SQL("{} = %s").format(sql.Identifier(key)))
            parameters.append(wanted)
        elif key == "title":
            clauses.append(sql.SQL("meta ->> 'title' = %s"))
            parameters.append(wanted)
        else:
            extra[key] = wanted
    if extra:
        # Containment is JSON equality for scalars (1 matches 1.0; a bool is no number).
        clauses.append(sql.SQL("meta -> 'extra' @> %s::jsonb"))
        parameters.append(json.dumps(extra))
    if query.tags:
        clauses.append(sql.SQL("meta -> 'tags' @> %s::jsonb"))
        parameters.append(json.dumps(sorted(query.tags)))
    for name, low, high in (
        ("created", query.created_since, query.created_before),
        ("active", query.active_since, query.active_before),
    ):
        if low is not None:
            clauses.append(sql.SQL("{} >= %s").format(sql.Identifier(name)))
            parameters.append(from_micros(low))
        if high is not None:
            clauses.append(sql.SQL("{} < %s").format(sql.Identifier(name)))
            parameters.append(from_micros(high))
    direction = sql.SQL("DESC" if query.descending else "ASC")
    if query.after is not None:
        clauses.append(
            sql.SQL("({}, name) " + ("<" if query.descending else ">") + " (%s, %s)").format(column)
        )
        parameters.extend((from_micros(query.after[0]), query.after[1]))
    parameters.append(query.limit + 1)
    statement = sql.SQL(
        "SELECT name, count, parent, meta, created, active FROM {} WHERE {}"
        " ORDER BY {} {}, name {} LIMIT %s"
    ).format(statements.sessions, sql.SQL(" AND ").join(clauses), column, direction, direction)
    return statement, parameters
