"""Stores to erase from, and how to look at their raw bytes (the erasure tests' helpers)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from nous_session.stores import MemoryStore
from nous_session.stores.base import Store
from nous_session.stores.sqlite import SQLiteStore

POSTGRES_URL = os.environ.get("NOUS_SESSION_TEST_POSTGRES")


class Backend:
    """A store under test, and how to look at its raw bytes."""

    def __init__(self, kind: str, make: Callable[[], Store], path: Path | None = None) -> None:
        self.kind = kind
        self.make = make
        self.path = path
        self.schema: str | None = None

    def url(self) -> str:
        """The store's URL, for a process of its own (SQLite and PostgreSQL)."""
        if self.kind == "sqlite":
            return f"sqlite:///{self.path}"
        assert self.kind == "postgres"
        assert POSTGRES_URL is not None
        joiner = "&" if "?" in POSTGRES_URL else "?"
        return f"{POSTGRES_URL}{joiner}schema={self.schema}"

    def hits(self, text: str) -> dict[str, int]:
        """Where the raw bytes hold ``text``: per file (SQLite) or per relation (PostgreSQL)."""
        needle = text.encode()
        if self.kind == "sqlite":
            assert self.path is not None
            found = {}
            for suffix in ("", "-wal", "-shm", "-journal"):
                file = Path(f"{self.path}{suffix}")
                if file.exists():
                    found[file.name] = file.read_bytes().count(needle)
            return found
        if self.kind == "postgres":
            return _pages(self.schema or "", needle)
        return {}


def _pages(schema: str, needle: bytes) -> dict[str, int]:
    """Count ``needle`` in every block of every table of the store's schema (the sessions
    table with its listing copies of metadata too), their TOAST tables and their indexes,
    read with pageinspect's get_raw_page."""
    import psycopg

    assert POSTGRES_URL is not None
    found: dict[str, int] = {}
    with psycopg.connect(POSTGRES_URL, autocommit=True) as connection:
        try:
            connection.execute("CREATE EXTENSION IF NOT EXISTS pageinspect")
        except psycopg.Error as error:  # not a superuser, or the contrib package is missing
            pytest.skip(f"pageinspect is needed to read raw pages: {error}")
        tables = connection.execute(
            "SELECT c.oid::regclass::text, t.oid::regclass::text FROM pg_class c"
            " JOIN pg_namespace n ON n.oid = c.relnamespace"
            " LEFT JOIN pg_class t ON t.oid = c.reltoastrelid"
            " WHERE n.nspname = %s AND c.relkind = 'r'",
            (schema,),
        ).fetchall()
        indexes = connection.execute(
            "SELECT i.indexrelid::regclass::text FROM pg_index i JOIN pg_class c"
            " ON c.oid = i.indrelid JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = %s",
            (schema,),
        ).fetchall()
        assert tables
        for relations in [*tables, *indexes]:
            for relation in relations:
                if relation is None:
                    continue
                (blocks,) = connection.execute(
                    "SELECT pg_relation_size(%s::regclass) / current_setting('block_size')::int",
                    (relation,),
                ).fetchone()  # type: ignore[misc]
                count = 0
                for block in range(blocks):
                    (page,) = connection.execute(
                        "SELECT get_raw_page(%s, %s)", (relation, block)
                    ).fetchone()  # type: ignore[misc]
                    count += bytes(page).count(needle)
                found[relation] = count
    return found


def postgres_backend() -> Iterator[Backend]:
    if not POSTGRES_URL:
        pytest.skip("no PostgreSQL server: set NOUS_SESSION_TEST_POSTGRES")
    psycopg = pytest.importorskip("psycopg")
    from nous_session.stores.postgres import PostgresStore

    schema = f"e_{uuid.uuid4().hex[:12]}"
    made = Backend("postgres", lambda: PostgresStore(POSTGRES_URL, schema=schema, max_size=4))
    made.schema = schema
    yield made
    with psycopg.connect(POSTGRES_URL, autocommit=True) as connection:
        connection.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def make_backend(kind: str, tmp_path: Path) -> Iterator[Backend]:
    """The backend of ``kind`` (memory, sqlite, postgres) for one test."""
    if kind == "memory":
        shared = MemoryStore()
        yield Backend("memory", lambda: shared)
    elif kind == "sqlite":
        path = tmp_path / "erase.sqlite3"
        yield Backend("sqlite", lambda: SQLiteStore(path), path)
    else:
        yield from postgres_backend()


def secret() -> str:
    return f"SECRET-{uuid.uuid4().hex}"


def text_of(session_events: Any) -> str:
    return repr([dict(event.data) for event in session_events])


async def toast_uncompressed(backend: Backend, store: Any) -> None:
    """On PostgreSQL, store long records out of line and uncompressed, so that a text in
    them is in the TOAST table's pages byte for byte (and the scan can see it)."""
    if backend.kind != "postgres":
        return
    import psycopg

    await store.sessions()  # creates the schema
    assert POSTGRES_URL is not None
    with psycopg.connect(POSTGRES_URL, autocommit=True) as connection:
        connection.execute(
            f"ALTER TABLE {backend.schema}.nous_events ALTER COLUMN record SET STORAGE EXTERNAL"
        )
