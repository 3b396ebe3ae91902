"""SQLiteStore: the embedded default, on the standard library's sqlite3.

A store opened for writing has one long-lived writer thread that owns its connection
(:class:`~nous_session.stores.sqlite._writer.SQLiteWriter`): every write waiting while the previous
transaction is on disk, whichever session sent it, goes into the next transaction, each in its
own savepoint (group commit across sessions: one fsync for all of them); reads run on the same
thread between transactions. A read-only store reads in a worker thread
(``anyio.to_thread.run_sync``) behind a capacity limiter of one. Either way the store works on
asyncio and trio alike and the event loop never blocks on disk. The file is in WAL mode, holds
many sessions, and records its schema version so later versions can migrate it.

Durability: ``synchronous="FULL"`` (the default) makes SQLite fsync the WAL at every commit, so
an acknowledged event survives power loss; ``"NORMAL"`` survives a crash of the process but may
lose the last commits on power loss, and is much faster on slow disks.

Schema (version 5)::

    nous_schema   (version)
    nous_sessions (id INTEGER PRIMARY KEY, name TEXT UNIQUE, count, held, horizon,
                   parent TEXT, fork_point, shares, created, active, meta TEXT, meta_seq,
                   owner, app: generated from meta)
    nous_events   (sid, seq, record BLOB, PRIMARY KEY (sid, seq)) WITHOUT ROWID
    nous_keys     (sid, key, seq, n, PRIMARY KEY (sid, key)) WITHOUT ROWID
    nous_commits  (sid, commit_id, seq, n, PRIMARY KEY (sid, commit_id)) WITHOUT ROWID
    nous_kept     (sid, seq, record BLOB, PRIMARY KEY (sid, seq)) WITHOUT ROWID
    nous_data_keys (kid BLOB PRIMARY KEY, provider TEXT, wrapped BLOB) WITHOUT ROWID
    nous_key_holders (kid BLOB, sid, PRIMARY KEY (kid, sid)) WITHOUT ROWID

(and a ``kid`` column on nous_sessions, nous_events and nous_kept: encryption at rest, see
:mod:`nous_session.encryption`; NULL for plain records; not indexed: the key holders table
says which sessions hold rows under each key)

``held`` counts a session's own rows. A fork that ``shares`` reads its parent's rows up to its
``fork_point`` instead of holding copies; before its parent drops or deletes any of them, it is
given its own copy. ``nous_kept`` holds the events of idempotency keys that a snapshot dropped.
``meta`` is the session's current metadata record (JSON, from its newest metadata event, at
``meta_seq``), ``created`` and ``active`` its first and last appending commit's times
(microseconds since the epoch; ``active`` to the second, see ``_ADVANCE``); ``owner`` and
``app`` are virtual columns read from ``meta``, indexed with the times so that a listing's
filter and order come from an index.
Session ids are always bound as parameters, never formatted into SQL.

Reading never writes: ``read_only=True`` opens the file with SQLite's read-only mode, creating
nothing and migrating nothing, and refuses a file that is missing or is not a nous_session
store. A store opened for writing refuses a database that holds other tables and no nous_session
schema unless ``adopt=True``; and it refuses to commit once its path no longer names the file it
opened (deleted or replaced under it), since the writes would go to an orphaned file.
"""

from __future__ import annotations

from nous_session.stores.sqlite._schema import SCHEMA_VERSION
from nous_session.stores.sqlite._store import SQLiteStore

__all__ = ["SCHEMA_VERSION", "SQLiteStore"]

# The class's public home (where reprs, pickles and telemetry's store kind look), not _store.
SQLiteStore.__module__ = __name__
