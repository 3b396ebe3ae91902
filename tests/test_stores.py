"""The store conformance suite (nous_session.testing) on every built-in backend."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from nous_session.stores import MemoryStore, Store
from nous_session.stores.sqlite import SQLiteStore
from nous_session.testing import StoreConformance


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


class TestSQLiteStoreNormalDurability(TestSQLiteStore):
    @pytest.fixture
    async def store(self, path: Path) -> AsyncIterator[Store]:
        store = SQLiteStore(path, synchronous="NORMAL")
        yield store
        await store.aclose()
