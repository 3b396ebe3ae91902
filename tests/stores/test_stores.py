"""The store conformance suite (nous_session.testing) on every built-in backend."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from nous_session.encryption import Encryption, LocalKeyFile
from nous_session.stores import MemoryStore, Store
from nous_session.stores.sqlite import SQLiteStore
from nous_session.testing import StoreConformance

psycopg = pytest.importorskip("psycopg")
from nous_session.stores.postgres import PostgresStore  # noqa: E402


class TestMemoryStore(StoreConformance):
    @pytest.fixture
    async def store(self) -> AsyncIterator[Store]:
        store = MemoryStore()
        yield store
        await store.aclose()


class TestSQLiteStore(StoreConformance):
    @pytest.fixture
    def path(self, tmp_path: Path) -> Path:
        return tmp_path / "sessions.sqlite3"

    @pytest.fixture
    async def store(self, path: Path) -> AsyncIterator[Store]:
        store = SQLiteStore(path)
        yield store
        await store.aclose()

    @pytest.fixture
    def reopen(self, path: Path) -> Callable[[], Store]:
        return lambda: SQLiteStore(path)


class TestSQLiteStoreEncrypted(TestSQLiteStore):
    """The suite with every record sealed (encryption at rest)."""

    @pytest.fixture
    def encryption(self, tmp_path: Path) -> Encryption:
        return Encryption(LocalKeyFile.create(tmp_path / "master.key"))

    @pytest.fixture
    async def store(self, path: Path, encryption: Encryption) -> AsyncIterator[Store]:
        store = SQLiteStore(path, encryption=encryption)
        yield store
        await store.aclose()

    @pytest.fixture
    def reopen(self, path: Path, encryption: Encryption) -> Callable[[], Store]:
        return lambda: SQLiteStore(path, encryption=encryption)


class TestSQLiteStoreNormalDurability(TestSQLiteStore):
    @pytest.fixture
    async def store(self, path: Path) -> AsyncIterator[Store]:
        store = SQLiteStore(path, synchronous="NORMAL")
        yield store
        await store.aclose()


POSTGRES_URL = os.environ.get("NOUS_SESSION_TEST_POSTGRES")
needs_postgres = pytest.mark.skipif(
    not POSTGRES_URL,
    reason="no PostgreSQL server: set NOUS_SESSION_TEST_POSTGRES=postgresql://... "
    "(`. .ci/postgres` starts one on loopback and sets it)",
)


@needs_postgres
class TestPostgresStore(StoreConformance):
    """The same suite on PostgreSQL, each test in a schema of its own."""

    @pytest.fixture
    def schema(self) -> Iterator[str]:
        name = f"t_{uuid.uuid4().hex[:16]}"
        yield name
        with psycopg.connect(POSTGRES_URL, autocommit=True) as connection:  # type: ignore[arg-type]
            connection.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")

    @pytest.fixture
    async def store(self, schema: str) -> AsyncIterator[Store]:
        store = PostgresStore(POSTGRES_URL, schema=schema)  # type: ignore[arg-type]
        yield store
        await store.aclose()

    @pytest.fixture
    def reopen(self, schema: str) -> Callable[[], Store]:
        return lambda: PostgresStore(POSTGRES_URL, schema=schema)  # type: ignore[arg-type]


@needs_postgres
class TestPostgresStoreEncrypted(TestPostgresStore):
    """The suite on PostgreSQL with every record sealed (encryption at rest)."""

    @pytest.fixture
    def encryption(self, tmp_path: Path) -> Encryption:
        return Encryption(LocalKeyFile.create(tmp_path / "master.key"))

    @pytest.fixture
    async def store(self, schema: str, encryption: Encryption) -> AsyncIterator[Store]:
        store = PostgresStore(POSTGRES_URL, schema=schema, encryption=encryption)  # type: ignore[arg-type]
        yield store
        await store.aclose()

    @pytest.fixture
    def reopen(self, schema: str, encryption: Encryption) -> Callable[[], Store]:
        return lambda: PostgresStore(POSTGRES_URL, schema=schema, encryption=encryption)  # type: ignore[arg-type]
