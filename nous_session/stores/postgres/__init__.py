"""PostgresStore: many processes and machines on one session store, with a live change feed.

Needs the ``postgres`` extra (``pip install nous_session[postgres]``: psycopg 3 and its pool).
psycopg's async API runs only on asyncio, so this store drives the synchronous driver in worker
threads, as the SQLite store does; it therefore works on asyncio and trio alike.

Schema (version 5), in the schema given to the store (``public`` by default)::

    nous_schema   (version)
    nous_sessions (name text PRIMARY KEY, count bigint, horizon bigint, parent text,
                   fork_point bigint, shares boolean, created timestamptz,
                   active timestamptz, meta jsonb, meta_seq bigint,
                   owner text, app text: generated from meta)
    nous_events   (session text, seq bigint, record bytea, PRIMARY KEY (session, seq))
    nous_keys     (session text, key text, seq bigint, n integer, PRIMARY KEY (session, key))
    nous_commits  (session text, commit_id text, seq bigint, n integer,
                   PRIMARY KEY (session, commit_id))
    nous_kept     (session text, seq bigint, record bytea, PRIMARY KEY (session, seq))
    nous_data_keys (kid bytea PRIMARY KEY, provider text, wrapped bytea)
    nous_key_holders (kid bytea, session text, PRIMARY KEY (kid, session))

(and a ``kid`` column on nous_sessions, nous_events and nous_kept: encryption at rest, see
:mod:`nous_session.encryption`; NULL for plain records; not indexed: the key holders table
says which sessions hold rows under each key)

``meta`` is the session's current metadata record (its newest metadata event's, at
``meta_seq``); ``created`` and ``active`` are the server's time at its first and its last
appending commit, set by the commit statement itself. ``active`` is written only when it is a
second or more behind: an UPDATE that changes no indexed column stays a HOT update (no index
entries), so at high commit rates a commit costs what it did before. ``owner`` and ``app`` are
stored generated columns, indexed with the times for listings.

The primary key on (session, seq) is what makes the database itself enforce one writer per seq.
A commit is one statement: it moves the session's count from the expected value and, only if
that matched, deletes and inserts rows, records its keys and commit id and sends ``NOTIFY``
with the session and its new head (never the payload); other processes
:meth:`~PostgresStore.watch` that channel and read the rows. A fork that ``shares`` reads its
parent's rows up to its fork point; a snapshot or delete of the parent gives it copies first.

Group commit across sessions: the commits an event loop's tasks send in one round (typically
every session one group's answers just woke) go to the server as one transaction, pipelined in
one round trip, each still that one statement: one WAL flush and one commit for all of them
instead of one each (PostgreSQL serialises the commits of notifying transactions, so separate
commits cannot share a flush). A statement that fails rolls the group back and each of its
commits is sent again alone: one session's failure never fails another's. A snapshot's commit
(one that drops events) runs alone, as before.

A connection lost during a commit (the server restarted, the backend was terminated, the
network dropped the reply) makes its outcome unknown: the commit raises
:class:`~nous_session.errors.OutcomeUnknownError`, never a StoreError. Sending the same commit
again with the same ``commit_id`` is safe, since the id is unique in the session: exactly one of
the two lands, and :meth:`~PostgresStore.committed` tells which seqs it took. The SessionActor
does exactly that. The pool replaces broken connections.
"""

from __future__ import annotations

try:
    import psycopg  # noqa: F401
    import psycopg_pool  # noqa: F401
except ImportError as error:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "the PostgreSQL store needs psycopg 3 and psycopg-pool: "
        "pip install 'nous_session[postgres]'"
    ) from error

from nous_session.stores.postgres._schema import SCHEMA_VERSION
from nous_session.stores.postgres._store import PostgresStore

__all__ = ["SCHEMA_VERSION", "PostgresStore"]

# The class's public home (where reprs, pickles and telemetry's store kind look), not _store.
PostgresStore.__module__ = __name__
