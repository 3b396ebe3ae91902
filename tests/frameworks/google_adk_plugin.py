"""A pytest plugin that runs Google ADK's own session service tests against NousSessionService.

Loaded with ``-p google_adk_plugin`` (``.ci/google_adk``) on ADK's
``tests/unittests/sessions/test_session_service.py``, unmodified. ADK keeps its session service
contract in that file: every test that takes the ``session_service`` fixture states a
behaviour every ``BaseSessionService`` owes its callers, and the fixture
(``tests/unittests/sessions/_conformance.py``) runs each such test once per backend listed in
its ``BACKENDS``, each ``_Backend`` with the contract tests it is known to fail
(``divergences``, turned into strict xfails by the fixture itself).

This plugin puts nous_session's backends in place of ADK's in that list and in the fixture's
parameters, before the tests are parametrised: ``NousSessionService`` on a memory store, on a
SQLite file, and on PostgreSQL when ``NOUS_SESSION_TEST_POSTGRES`` names a server. ADK's
fixture body runs as written. The file's other tests exercise ADK's own services by name
(``DatabaseSessionService``'s SQLAlchemy internals, ``SqliteSessionService``,
``InMemorySessionService``, ``VertexAiSessionService``) and are deselected, each with its
reason in :func:`_excluded`.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import os
import pathlib
import sys
import types
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

from nous_session.integrations.google_adk import NousSessionService

# Our contract divergences: contract test name -> why NousSessionService fails it. Empty: it
# passes every contract test. (ADK's own meta-test checks each name here is a contract test.)
DIVERGENCES: dict[str, str] = {}

# Why a test of ADK's file is not run against NousSessionService.
_OWN_SERVICE = (
    "does not take the session_service contract fixture: it tests one of ADK's own services "
    "by name (DatabaseSessionService, SqliteSessionService, InMemorySessionService, "
    "VertexAiSessionService) or their SQLAlchemy schema"
)
_DIRECT_IN_MEMORY = (
    "parametrises session_service directly with ADK's InMemorySessionService(), overriding "
    "the contract fixture: it tests that class, not the registered backends"
)


@contextlib.asynccontextmanager
async def _make_memory(tmp_path: pathlib.Path) -> AsyncIterator[NousSessionService]:
    del tmp_path
    async with NousSessionService("memory:") as service:
        yield service


@contextlib.asynccontextmanager
async def _make_sqlite(tmp_path: pathlib.Path) -> AsyncIterator[NousSessionService]:
    async with NousSessionService(f"sqlite:///{tmp_path / 'nous.sqlite3'}") as service:
        yield service


@contextlib.asynccontextmanager
async def _make_postgres(tmp_path: pathlib.Path) -> AsyncIterator[NousSessionService]:
    del tmp_path
    import psycopg

    server = os.environ["NOUS_SESSION_TEST_POSTGRES"]
    schema = f"adk_{uuid.uuid4().hex[:16]}"  # a fresh schema per test, dropped after it
    try:
        async with NousSessionService(f"{server}?schema={schema}") as service:
            yield service
    finally:
        async with await psycopg.AsyncConnection.connect(server, autocommit=True) as connection:
            await connection.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def _backends(backend_class: Any) -> list[Any]:
    found = [
        backend_class("nous_session_memory", _make_memory, DIVERGENCES),
        backend_class("nous_session_sqlite", _make_sqlite, DIVERGENCES),
    ]
    if os.environ.get("NOUS_SESSION_TEST_POSTGRES"):
        found.append(backend_class("nous_session_postgres", _make_postgres, DIVERGENCES))
    return found


_swapped: dict[int, list[Any]] = {}


@pytest.hookimpl(tryfirst=True)
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Put our backends in ADK's ``session_service`` fixture before pytest parametrises it."""
    for fixturedef in metafunc._arg2fixturedefs.get("session_service", ()):
        module = sys.modules.get(fixturedef.func.__module__)
        backends = getattr(module, "BACKENDS", None)
        if module is None or backends is None or not hasattr(module, "_Backend"):
            continue
        ours = _swapped.get(id(module))
        if ours is None:
            ours = _swapped[id(module)] = _backends(module._Backend)
            backends[:] = ours  # what ADK's own checks of the registry read
        fixturedef.params = tuple(ours)
        fixturedef.ids = tuple(backend.name for backend in ours)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect every test that does not run against one of our backends."""
    kept, deselected = [], []
    for item in items:
        (deselected if _excluded(item) is not None else kept).append(item)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = kept
    config.stash[_REASONS] = [(item.nodeid, _excluded(item) or "") for item in deselected]


_REASONS = pytest.StashKey[Sequence[tuple[str, str]]]()


def _excluded(item: pytest.Item) -> str | None:
    name = getattr(item, "originalname", item.name)
    if name == "test_recorded_divergences_name_a_contract_test":
        return None  # checks the divergences registered: ours
    callspec = getattr(item, "callspec", None)
    service = callspec.params.get("session_service") if callspec is not None else None
    if service is None:
        return _OWN_SERVICE
    if getattr(service, "name", "").startswith("nous_session_"):
        return None
    return _DIRECT_IN_MEMORY


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """List the deselected tests with their reasons (the report's record of every exclusion)."""
    reasons = config.stash.get(_REASONS, ())
    if not reasons:
        return
    terminalreporter.section("deselected for nous_session, with reasons")
    by_reason: dict[str, list[str]] = {}
    for nodeid, reason in reasons:
        by_reason.setdefault(reason, []).append(nodeid.split("::", 1)[-1])
    for reason, names in by_reason.items():
        terminalreporter.write_line(f"{len(names)}: {reason}")
        for name in names:
            terminalreporter.write_line(f"    {name}")


class _FakeRedisFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Provides ``tests.unittests.integrations.redis._fake_redis`` only where ADK's test tree
    lacks it: ``_conformance.py`` imports it for ADK's Redis backend, which this plugin takes
    out of ``BACKENDS`` and never builds."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname.endswith("integrations.redis._fake_redis"):
            return importlib.machinery.ModuleSpec(fullname, self)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        class FakeRedisAsync:
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                raise RuntimeError("ADK's Redis backend is not run against nous_session")

        module.FakeRedisAsync = FakeRedisAsync  # type: ignore[attr-defined]


sys.meta_path.append(_FakeRedisFinder())  # consulted last: the real module wins if present
