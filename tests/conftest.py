"""Shared fixtures: every async test runs on asyncio and on trio."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import suppress
from pathlib import Path
from urllib.parse import quote, unquote, urlsplit, urlunsplit

import pytest
from hypothesis import HealthCheck, settings

from nous_session import Store
from nous_session.stores import MemoryStore
from nous_session.stores.sqlite import SQLiteStore
from tests.support.tallies import Tallies

# The same properties, run deeper or shallower: `ci` on CI's main Python (the model tests run
# longer there), `dev` by default, `quick` on CI's other Pythons (what a version can break
# shows without the depth).
settings.register_profile(
    "ci", max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("dev", max_examples=300, deadline=None)
settings.register_profile("quick", max_examples=50, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))

# A store given none is the one NOUS_SESSION_STORE names: the tests name theirs, and one set in
# the shell that runs them must not send the sessions of tests that name none to it.
os.environ.pop("NOUS_SESSION_STORE", None)


@pytest.fixture(
    params=[
        pytest.param(("asyncio", {"use_uvloop": False}), id="asyncio"),
        pytest.param(("trio", {}), id="trio"),
    ]
)
def anyio_backend(request: pytest.FixtureRequest) -> tuple[str, dict[str, object]]:
    """Run each ``@pytest.mark.anyio`` test once per backend."""
    return request.param  # type: ignore[no-any-return]


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(Tallies(config), Tallies.name)
    _database_per_worker()


def _database_per_worker() -> None:
    """Under pytest-xdist, give each worker a PostgreSQL database of its own.

    Tests that inject faults terminate every nous_session backend of their database; run side
    by side in one database they would cut another worker's connections too. Runs in the
    worker before it collects (the test modules read ``NOUS_SESSION_TEST_POSTGRES`` when they
    are imported), and the processes tests spawn inherit the variable.
    """
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    url = os.environ.get("NOUS_SESSION_TEST_POSTGRES")
    if not worker or not url:
        return
    import psycopg
    from psycopg import sql

    parts = urlsplit(url)
    if parts.scheme not in ("postgresql", "postgres") or "dbname=" in parts.query:
        raise pytest.UsageError(
            "NOUS_SESSION_TEST_POSTGRES: under pytest-xdist the tests need a postgresql:// URL"
            " that names its database in the path (each worker uses a copy of its own);"
            " or run in one process (TEST_WORKERS=0, or pytest without -n)"
        )
    name = f"{unquote(parts.path.lstrip('/')) or 'postgres'}_{worker}"
    try:
        with psycopg.connect(url, autocommit=True) as connection:
            found = connection.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
            if found.fetchone() is None:
                with suppress(psycopg.errors.DuplicateDatabase):
                    connection.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    except psycopg.Error as error:
        raise pytest.UsageError(
            f"NOUS_SESSION_TEST_POSTGRES: cannot create the database {name!r} for xdist"
            f" worker {worker} ({error}); grant the role CREATEDB, or run in one process"
            " (TEST_WORKERS=0, or pytest without -n)"
        ) from None
    os.environ["NOUS_SESSION_TEST_POSTGRES"] = urlunsplit(parts._replace(path=f"/{quote(name)}"))
    # PgBouncer (``NOUS_SESSION_TEST_PGBOUNCER``, in front of the same server) reaches the same
    # database of this worker by name.
    pooled = os.environ.get("NOUS_SESSION_TEST_PGBOUNCER")
    if pooled:
        pooled_parts = urlsplit(pooled)
        os.environ["NOUS_SESSION_TEST_PGBOUNCER"] = urlunsplit(
            pooled_parts._replace(path=f"/{quote(name)}")
        )


@pytest.fixture(scope="session")
def tallies(pytestconfig: pytest.Config) -> Tallies:
    """The session's :class:`Tallies`."""
    plugin = pytestconfig.pluginmanager.get_plugin(Tallies.name)
    assert isinstance(plugin, Tallies)
    return plugin


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], Store]]:
    """A factory of stores that all reach the same sessions (one store per would-be process),
    on every backend: one memory store shared, SQLite files on one path, PostgreSQL in a
    schema of the test's own (dropped after it). A test module may define its own."""
    if request.param == "memory":
        shared = MemoryStore()
        yield lambda: shared
    elif request.param == "sqlite":
        yield lambda: SQLiteStore(tmp_path / "stores.sqlite3")
    else:
        url = os.environ.get("NOUS_SESSION_TEST_POSTGRES")
        if not url:
            pytest.skip("no PostgreSQL server: set NOUS_SESSION_TEST_POSTGRES")
        psycopg = pytest.importorskip("psycopg")
        from nous_session.stores.postgres import PostgresStore

        schema = f"o_{uuid.uuid4().hex[:12]}"
        yield lambda: PostgresStore(url, schema=schema)
        with psycopg.connect(url, autocommit=True) as connection:
            connection.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


@pytest.fixture
async def store(stores: Callable[[], Store]) -> AsyncIterator[Store]:
    """One store of :func:`stores`, closed after the test."""
    store = stores()
    yield store
    await store.aclose()
