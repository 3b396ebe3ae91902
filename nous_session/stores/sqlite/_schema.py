"""The SQLite store's schema: its migrations, and opening a file for writing (WAL, durability,
whether the file is ours to use)."""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path
from typing import Final
from urllib.parse import quote

import attrs

from nous_session.errors import StoreError
from nous_session.stores._common import check_schema_version, migration_start
from nous_session.stores.sqlite._errors import describe, immediate_transaction, translated_errors
from nous_session.stores.sqlite._feed import beside

SCHEMA_VERSION: Final = 5
"""The schema this version writes; older files are migrated on open, newer ones refused."""


_KEYS_TABLE: Final = """CREATE TABLE nous_keys (
    sid INTEGER NOT NULL, key TEXT NOT NULL, seq INTEGER NOT NULL, n INTEGER NOT NULL,
    PRIMARY KEY (sid, key)
) WITHOUT ROWID"""


_COMMITS_TABLE: Final = """CREATE TABLE nous_commits (
    sid INTEGER NOT NULL, commit_id TEXT NOT NULL, seq INTEGER NOT NULL, n INTEGER NOT NULL,
    PRIMARY KEY (sid, commit_id)
) WITHOUT ROWID"""


_KEPT_TABLE: Final = """CREATE TABLE nous_kept (
    sid INTEGER NOT NULL, seq INTEGER NOT NULL, record BLOB NOT NULL,
    PRIMARY KEY (sid, seq)
) WITHOUT ROWID"""


DATA_KEYS_TABLE: Final = """CREATE TABLE {name} (
    kid BLOB PRIMARY KEY, provider TEXT NOT NULL, wrapped BLOB NOT NULL
) WITHOUT ROWID"""
"""The key table (encryption at rest): each data key, wrapped by the master key ``provider``
names. ``{name}``: the table's name (an erasure rebuilds it under another, then renames it)."""


KEY_HOLDERS_TABLE: Final = """CREATE TABLE nous_key_holders (
    kid BLOB NOT NULL, sid INTEGER NOT NULL, PRIMARY KEY (kid, sid)
) WITHOUT ROWID"""
"""Which sessions hold rows sealed under each data key (encryption at rest): a session's
current key from when it is made, and the keys of the rows a fork's copy brings it. An
erasure scans only these sessions' rows, by session; a delete destroys the keys no other
session holds."""


# MIGRATIONS[v] takes a file from schema version v to v + 1.
MIGRATIONS: Final[dict[int, tuple[str, ...]]] = {
    0: (
        """CREATE TABLE nous_sessions (
               id    INTEGER PRIMARY KEY,
               name  TEXT NOT NULL UNIQUE,
               count INTEGER NOT NULL,
               held  INTEGER NOT NULL
           )""",
        """CREATE TABLE nous_events (
               sid    INTEGER NOT NULL REFERENCES nous_sessions (id),
               seq    INTEGER NOT NULL,
               record BLOB NOT NULL,
               PRIMARY KEY (sid, seq)
           ) WITHOUT ROWID""",
    ),
    1: (
        "ALTER TABLE nous_sessions ADD COLUMN horizon INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE nous_sessions ADD COLUMN parent TEXT",
        "ALTER TABLE nous_sessions ADD COLUMN fork_point INTEGER",
        "ALTER TABLE nous_sessions ADD COLUMN shares INTEGER NOT NULL DEFAULT 0",
        "CREATE INDEX nous_sessions_parent ON nous_sessions (parent) WHERE shares",
        _KEYS_TABLE,
        _COMMITS_TABLE,
        _KEPT_TABLE,
    ),
    2: (
        "ALTER TABLE nous_sessions ADD COLUMN created INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE nous_sessions ADD COLUMN active INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE nous_sessions ADD COLUMN meta TEXT",
        "ALTER TABLE nous_sessions ADD COLUMN meta_seq INTEGER",
        "ALTER TABLE nous_sessions ADD COLUMN owner TEXT"
        " GENERATED ALWAYS AS (json_extract(meta, '$.owner')) VIRTUAL",
        "ALTER TABLE nous_sessions ADD COLUMN app TEXT"
        " GENERATED ALWAYS AS (json_extract(meta, '$.app')) VIRTUAL",
        # Sessions from before get the times of their oldest and newest held event (the
        # migration's time when they hold none of their own).
        """UPDATE nous_sessions SET
               created = coalesce((SELECT json_extract(CAST(record AS TEXT), '$[3]')
                   FROM nous_events WHERE sid = nous_sessions.id ORDER BY seq LIMIT 1),
                   CAST((julianday('now') - 2440587.5) * 86400000000 AS INTEGER)),
               active = coalesce((SELECT json_extract(CAST(record AS TEXT), '$[3]')
                   FROM nous_events WHERE sid = nous_sessions.id ORDER BY seq DESC LIMIT 1),
                   CAST((julianday('now') - 2440587.5) * 86400000000 AS INTEGER))""",
        "CREATE INDEX nous_sessions_owner_active ON nous_sessions (owner, active, name)",
        "CREATE INDEX nous_sessions_owner_created ON nous_sessions (owner, created, name)",
        "CREATE INDEX nous_sessions_active ON nous_sessions (active, name)",
        "CREATE INDEX nous_sessions_created ON nous_sessions (created, name)",
    ),
    3: (
        # A session's identity, made when it is created, and a fork's link to its parent's:
        # a name is reused after a delete, an identity never is.
        "ALTER TABLE nous_sessions ADD COLUMN uid TEXT",
        "ALTER TABLE nous_sessions ADD COLUMN parent_uid TEXT",
        "UPDATE nous_sessions SET uid = lower(hex(randomblob(8)))",
        # A fork from before links to the session of its parent's name only when that one
        # is not younger than the fork (a parent deleted and made again is another session).
        """UPDATE nous_sessions SET parent_uid = (SELECT p.uid FROM nous_sessions AS p
               WHERE p.name = nous_sessions.parent AND p.created <= nous_sessions.created)
           WHERE parent IS NOT NULL""",
        "CREATE INDEX nous_sessions_parent_uid ON nous_sessions (parent_uid)"
        " WHERE parent_uid IS NOT NULL",
    ),
    # Encryption at rest: the data keys, each session's current one, the key each sealed
    # row is sealed under (NULL: a plain record; not indexed: an index on it cost a commit
    # about 2.5 µs per event), and the sessions holding rows under each key, which is how
    # an erasure finds the rows of a key (by session, through the primary key).
    4: (
        DATA_KEYS_TABLE.format(name="nous_data_keys"),
        KEY_HOLDERS_TABLE,
        "CREATE INDEX nous_key_holders_sid ON nous_key_holders (sid)",
        "ALTER TABLE nous_sessions ADD COLUMN kid BLOB",
        "ALTER TABLE nous_events ADD COLUMN kid BLOB",
        "ALTER TABLE nous_kept ADD COLUMN kid BLOB",
        "CREATE INDEX nous_sessions_kid ON nous_sessions (kid) WHERE kid IS NOT NULL",
    ),
}


_OURS: Final = frozenset(
    {
        "nous_schema",
        "nous_sessions",
        "nous_events",
        "nous_keys",
        "nous_commits",
        "nous_kept",
        "nous_data_keys",
        "nous_key_holders",
    }
)


class FileIdentity:
    """The identity (device, inode) of the file a store opened, to notice it being replaced."""

    __slots__ = ("identity", "path")

    def __init__(self, path: str) -> None:
        self.path = path
        self.identity: tuple[int, int] | None = None

    def _stat(self) -> tuple[int, int] | None:
        if self.path == ":memory:":
            return None
        status = os.stat(self.path)
        return (status.st_dev, status.st_ino)

    def opened(self) -> None:
        self.identity = self._stat()

    def check(self) -> None:
        if self.identity is None:
            return
        try:
            now = self._stat()
        except OSError:
            now = None
        if now != self.identity:
            raise StoreError(
                f"the store file {self.path} was deleted or replaced while open; refusing to"
                " write to the orphaned file (reopen the store)"
            )


@attrs.frozen
class Opener:
    """Opens the store's connection for writing: the file, WAL, durability, the schema."""

    path: str
    synchronous: str
    busy_timeout: float
    adopt: bool
    file: FileIdentity

    def __call__(self) -> sqlite3.Connection:
        path = self.path
        try:
            if path != ":memory:":
                Path(path).parent.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise StoreError(f"cannot open {path}: {describe(error)}") from error
        with translated_errors(f"cannot open {path}"):
            connection = sqlite3.connect(
                path,
                timeout=self.busy_timeout,
                isolation_level=None,  # we issue BEGIN/COMMIT ourselves
                check_same_thread=False,  # made on the writer's thread, closed by it
            )
        try:
            # Before anything changes the file (even its journal mode): is it ours to use?
            current = _check_ours(connection, path, adopt=self.adopt)
            with translated_errors(f"cannot open {path}"):
                enable_wal(connection, self.busy_timeout)
                connection.execute(f"PRAGMA synchronous={self.synchronous}")
            if not current:
                _migrate(connection, path)
            self.file.opened()
        except BaseException:
            connection.close()
            raise
        return connection


def enable_wal(connection: sqlite3.Connection, busy_timeout: float) -> None:
    """Put the file in WAL mode, waiting up to ``busy_timeout`` for other processes.

    SQLite answers ``PRAGMA journal_mode=WAL`` with SQLITE_BUSY at once, without calling its
    busy handler, while another process is converting the same new file or opening its
    WAL: several processes opening one new file together hit that. Retry until the deadline,
    as the busy handler would have.
    """
    deadline = time.monotonic() + busy_timeout
    pause = 0.001
    while True:
        try:
            connection.execute("PRAGMA journal_mode=WAL")
        except sqlite3.OperationalError as error:
            if error.sqlite_errorcode & 0xFF != sqlite3.SQLITE_BUSY or time.monotonic() >= deadline:
                raise
        else:
            return
        time.sleep(pause)  # on the writer's own thread, never the event loop
        pause = min(pause * 2, 0.05)


def _check_ours(connection: sqlite3.Connection, path: str, *, adopt: bool) -> bool:
    """Refuse a database that holds other tables and no nous_session schema, unless
    ``adopt``: a mistyped path must not alter another application's database.

    Returns:
        True when the file holds a nous_session store of this schema version already: it
        needs no migration (read without taking the write lock, which another process's
        writer may hold: an open that changes nothing need not wait for it).
    """
    with translated_errors(f"cannot open {path}"):
        tables = {
            name
            for (name,) in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        }
        if "nous_schema" in tables:
            versions = connection.execute("SELECT version FROM nous_schema").fetchall()
            return versions == [(SCHEMA_VERSION,)]
    if tables - _OURS and not adopt:
        raise StoreError(
            f"{path} holds other tables ({', '.join(sorted(tables - _OURS)[:3])}) and no"
            " nous_session store; refusing to add ours (pass adopt=True to share it)"
        )
    return False


def _migrate(connection: sqlite3.Connection, path: str) -> None:
    with (
        translated_errors(f"cannot open {path} as a nous_session store"),
        immediate_transaction(connection),
    ):
        connection.execute("CREATE TABLE IF NOT EXISTS nous_schema (version INTEGER NOT NULL)")
        rows = connection.execute("SELECT version FROM nous_schema").fetchall()
        has = f"{path} has schema version"
        version = migration_start(rows, SCHEMA_VERSION, f"{path}: nous_schema", has)
        for step in range(version, SCHEMA_VERSION):
            for statement in MIGRATIONS[step]:
                connection.execute(statement)
            if step == 1:
                _set_horizons(connection)
        if not rows:
            connection.execute("INSERT INTO nous_schema (version) VALUES (?)", (SCHEMA_VERSION,))
        elif version != SCHEMA_VERSION:
            connection.execute("UPDATE nous_schema SET version = ?", (SCHEMA_VERSION,))


def _set_horizons(connection: sqlite3.Connection) -> None:
    """Version 1 kept no horizon: a snapshotted session (one with gaps) gets the lowest one
    its history allows, one past its highest missing seq (every event after it is held)."""
    for sid, count in connection.execute(
        "SELECT id, count FROM nous_sessions WHERE held < count"
    ).fetchall():
        expected = count - 1
        for (seq,) in connection.execute(
            "SELECT seq FROM nous_events WHERE sid = ? ORDER BY seq DESC", (sid,)
        ):
            if seq != expected:
                break
            expected -= 1
        connection.execute("UPDATE nous_sessions SET horizon = ? WHERE id = ?", (expected + 1, sid))


def open_read_only(path: str, busy_timeout: float) -> tuple[sqlite3.Connection, bool]:
    """Open the store file read-only: the connection, and whether the file is read as
    immutable (no writer had it open: the next read must look again).

    Raises:
        StoreError: no such file, or not a nous_session store of this schema version.
    """
    if path == ":memory:" or not Path(path).is_file():
        raise StoreError(f"no store file at {path}")
    # A WAL database read while no connection has it open would get its -wal and -shm
    # files created (and left behind). With no -wal file there is no writer (the last
    # connection to close removes it), so the file is read as immutable: nothing made.
    immutable = not os.path.exists(beside(path, "-wal"))
    flags = "mode=ro&immutable=1" if immutable else "mode=ro"
    with translated_errors(f"cannot open {path}"):
        connection = sqlite3.connect(
            f"file:{quote(os.path.abspath(path))}?{flags}",
            uri=True,
            timeout=busy_timeout,
            isolation_level=None,
            check_same_thread=False,
        )
    try:
        with translated_errors(f"cannot read {path}"):
            tables = {
                name
                for (name,) in connection.execute(
                    "SELECT name FROM sqlite_master WHERE type = 'table'"
                )
            }
            version = (
                connection.execute("SELECT version FROM nous_schema").fetchone()
                if "nous_schema" in tables
                else None
            )
        check_schema_version(version, SCHEMA_VERSION, path, f"{path} has schema version")
    except BaseException:
        connection.close()
        raise
    return connection, immutable
