"""Fixtures the store tests share: the store a module's ``backend`` makes, and a PostgreSQL
backend of its own schema. A module's own fixture of the same name wins."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from nous_session.stores import MemoryStore, Store
from nous_session.stores.sqlite import SQLiteStore


@pytest.fixture
def postgres() -> Iterator[Any]:
    # Imported here, not at the top: this file is loaded before the root conftest gives each
    # xdist worker its own database, and the helpers read the URL when they are imported.
    from tests.support.erasure import postgres_backend

    yield from postgres_backend()


@pytest.fixture
async def store(backend: Any) -> AsyncIterator[Any]:
    """The store the module's ``backend`` fixture makes, closed after the test."""
    made = backend.make()
    yield made
    await made.aclose()


@pytest.fixture(params=["memory", "sqlite", "postgres"])
async def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    """A store of each kind, on its own: memory, a SQLite file, PostgreSQL in a schema of the
    test's own (dropped after it; skipped without a server)."""
    schema = url = None
    if request.param == "memory":
        store: Store = MemoryStore()
    elif request.param == "sqlite":
        store = SQLiteStore(tmp_path / "store.sqlite3")
    else:
        url = os.environ.get("NOUS_SESSION_TEST_POSTGRES")
        if not url:
            pytest.skip("no PostgreSQL server: set NOUS_SESSION_TEST_POSTGRES=postgresql://...")
        from nous_session.stores.postgres import PostgresStore

        schema = f"t_{uuid.uuid4().hex[:16]}"
        store = PostgresStore(url, schema=schema)
    yield store
    await store.aclose()
    if schema is not None:
        import psycopg

        with psycopg.connect(str(url), autocommit=True) as connection:
            connection.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
