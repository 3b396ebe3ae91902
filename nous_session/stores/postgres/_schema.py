"""The PostgreSQL store's schema and its migrations."""

from __future__ import annotations

from typing import Any, Final

import psycopg
from psycopg import sql

from nous_session.stores._common import check_schema_version, migration_start
from nous_session.stores.postgres._errors import errors
from nous_session.stores.postgres._leases import LEASES_TABLE

__all__ = ["SCHEMA_VERSION", "check_schema", "migrate"]

SCHEMA_VERSION: Final = 5


# Any 64-bit key works; it only has to be the same for every process migrating this schema.
_MIGRATION_LOCK: Final = 0x6E6F7573  # "nous"


MIGRATIONS: Final[dict[int, tuple[str, ...]]] = {
    0: (
        """CREATE TABLE {schema}.nous_sessions (
               name  text PRIMARY KEY,
               count bigint NOT NULL
           )""",
        """CREATE TABLE {schema}.nous_events (
               session text NOT NULL,
               seq     bigint NOT NULL,
               record  bytea NOT NULL,
               PRIMARY KEY (session, seq)
           )""",
    ),
    1: (
        "ALTER TABLE {schema}.nous_sessions ADD COLUMN horizon bigint NOT NULL DEFAULT 0",
        "ALTER TABLE {schema}.nous_sessions ADD COLUMN parent text",
        "ALTER TABLE {schema}.nous_sessions ADD COLUMN fork_point bigint",
        "ALTER TABLE {schema}.nous_sessions ADD COLUMN shares boolean NOT NULL DEFAULT false",
        "CREATE INDEX nous_sessions_parent ON {schema}.nous_sessions (parent) WHERE shares",
        """CREATE TABLE {schema}.nous_keys (
               session text NOT NULL, key text NOT NULL, seq bigint NOT NULL, n integer NOT NULL,
               PRIMARY KEY (session, key)
           )""",
        """CREATE TABLE {schema}.nous_commits (
               session text NOT NULL, commit_id text NOT NULL, seq bigint NOT NULL,
               n integer NOT NULL, PRIMARY KEY (session, commit_id)
           )""",
        """CREATE TABLE {schema}.nous_kept (
               session text NOT NULL, seq bigint NOT NULL, record bytea NOT NULL,
               PRIMARY KEY (session, seq)
           )""",
        # Version 1 kept no horizon: a session with gaps gets one past its highest missing
        # seq (every event after it is held).
        """UPDATE {schema}.nous_sessions s SET horizon = coalesce((
               SELECT max(e.next) FROM (
                   SELECT seq, lead(seq) OVER (ORDER BY seq) AS next
                   FROM {schema}.nous_events WHERE session = s.name
               ) e WHERE e.next > e.seq + 1
           ), (SELECT min(seq) FROM {schema}.nous_events WHERE session = s.name), 0)
           WHERE s.count > (
               SELECT count(*) FROM {schema}.nous_events e WHERE e.session = s.name
           )""",
    ),
    2: (
        "ALTER TABLE {schema}.nous_sessions ADD COLUMN created timestamptz NOT NULL DEFAULT now()",
        "ALTER TABLE {schema}.nous_sessions ADD COLUMN active timestamptz NOT NULL DEFAULT now()",
        "ALTER TABLE {schema}.nous_sessions ADD COLUMN meta jsonb",
        "ALTER TABLE {schema}.nous_sessions ADD COLUMN meta_seq bigint",
        "ALTER TABLE {schema}.nous_sessions ADD COLUMN owner text"
        " GENERATED ALWAYS AS (meta ->> 'owner') STORED",
        "ALTER TABLE {schema}.nous_sessions ADD COLUMN app text"
        " GENERATED ALWAYS AS (meta ->> 'app') STORED",
        # Sessions from before get the times of their oldest and newest held event (the
        # migration's time when they hold none of their own).
        """UPDATE {schema}.nous_sessions s SET
               created = coalesce((SELECT to_timestamp(
                   (convert_from(record, 'UTF8')::jsonb ->> 3)::numeric / 1000000)
                   FROM {schema}.nous_events WHERE session = s.name ORDER BY seq LIMIT 1), now()),
               active = coalesce((SELECT to_timestamp(
                   (convert_from(record, 'UTF8')::jsonb ->> 3)::numeric / 1000000)
                   FROM {schema}.nous_events WHERE session = s.name ORDER BY seq DESC LIMIT 1),
                   now())""",
        "CREATE INDEX nous_sessions_owner_active ON {schema}.nous_sessions (owner, active, name)",
        "CREATE INDEX nous_sessions_owner_created ON {schema}.nous_sessions (owner, created, name)",
        "CREATE INDEX nous_sessions_active ON {schema}.nous_sessions (active, name)",
        "CREATE INDEX nous_sessions_created ON {schema}.nous_sessions (created, name)",
    ),
    3: (
        # A session's identity, made when its row is, and a fork's link to its parent's: a
        # name is reused after a delete, an identity never is.
        "ALTER TABLE {schema}.nous_sessions ADD COLUMN uid text NOT NULL"
        " DEFAULT gen_random_uuid()::text",
        "ALTER TABLE {schema}.nous_sessions ADD COLUMN parent_uid text",
        # A fork from before links to the session of its parent's name only when that one is
        # not younger than the fork (a parent deleted and made again is another session).
        """UPDATE {schema}.nous_sessions s SET parent_uid = p.uid
           FROM {schema}.nous_sessions p WHERE p.name = s.parent AND p.created <= s.created""",
        "CREATE INDEX nous_sessions_parent_uid ON {schema}.nous_sessions (parent_uid)"
        " WHERE parent_uid IS NOT NULL",
    ),
    # Encryption at rest: the data keys, each session's current one, the key each sealed
    # row is sealed under (NULL: a plain record; not indexed: an index on it cost every
    # commit), and the sessions holding rows under each key (a session's current key from
    # when it is set, the keys of a fork's copies), which is how an erasure finds the rows
    # of a key (by session, through the primary key) and a delete the keys it may destroy.
    4: (
        """CREATE TABLE {schema}.nous_data_keys (
               kid      bytea PRIMARY KEY,
               provider text NOT NULL,
               wrapped  bytea NOT NULL
           )""",
        """CREATE TABLE {schema}.nous_key_holders (
               kid     bytea NOT NULL,
               session text NOT NULL,
               PRIMARY KEY (kid, session)
           )""",
        "CREATE INDEX nous_key_holders_session ON {schema}.nous_key_holders (session)",
        "ALTER TABLE {schema}.nous_sessions ADD COLUMN kid bytea",
        "ALTER TABLE {schema}.nous_events ADD COLUMN kid bytea",
        "ALTER TABLE {schema}.nous_kept ADD COLUMN kid bytea",
        "CREATE INDEX nous_sessions_kid ON {schema}.nous_sessions (kid) WHERE kid IS NOT NULL",
    ),
}


def migrate(connection: psycopg.Connection[Any], schema_name: str) -> None:
    """Create or migrate the store's tables in ``schema_name`` to :data:`SCHEMA_VERSION`,
    serialised across processes by an advisory lock."""
    schema = sql.Identifier(schema_name)
    with connection.transaction():
        # Serialise migrations across processes; released at the end of the transaction.
        connection.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
        connection.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(schema))
        connection.execute(
            sql.SQL("CREATE TABLE IF NOT EXISTS {}.nous_schema (version integer NOT NULL)").format(
                schema
            )
        )
        rows = connection.execute(
            sql.SQL("SELECT version FROM {}.nous_schema").format(schema)
        ).fetchall()
        table, has = f"{schema_name}.nous_schema", f"schema {schema_name!r} has version"
        version = migration_start(rows, SCHEMA_VERSION, table, has)
        for step in range(version, SCHEMA_VERSION):
            for statement in MIGRATIONS[step]:
                connection.execute(sql.SQL(statement).format(schema=schema))
        # Leases live apart from the sessions' history: a table any version may add.
        connection.execute(sql.SQL(LEASES_TABLE).format(schema=schema))
        if not rows:
            connection.execute(
                sql.SQL("INSERT INTO {}.nous_schema (version) VALUES (%s)").format(schema),
                (SCHEMA_VERSION,),
            )
        elif version != SCHEMA_VERSION:
            connection.execute(
                sql.SQL("UPDATE {}.nous_schema SET version = %s").format(schema),
                (SCHEMA_VERSION,),
            )


def check_schema(connection: psycopg.Connection[Any], schema: str, described: str) -> None:
    """For a read-only store: the schema must hold a current nous_session store
    (``described``: the server, its password redacted, for errors)."""
    with errors(f"cannot read {described}"):
        found = connection.execute(
            "SELECT 1 FROM information_schema.tables"
            " WHERE table_schema = %s AND table_name = 'nous_schema'",
            (schema,),
        ).fetchone()
        version = (
            connection.execute(
                sql.SQL("SELECT version FROM {}.nous_schema").format(sql.Identifier(schema))
            ).fetchone()
            if found
            else None
        )
    store = f"schema {schema!r} of {described}"
    check_schema_version(version, SCHEMA_VERSION, store, f"schema {schema!r} has version")
