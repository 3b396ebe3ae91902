"""A pytest plugin that runs the openai-agents SDK's own tests against NousSession, unmodified.

Loaded with ``-p openai_agents_plugin`` from the SDK's source tree (``.ci/openai_agents``):
before any test module is imported, it puts :class:`SQLiteSession` below, NousSession with the
SDK SQLiteSession's constructor, in place of the two public names the tests import it by
(``agents.SQLiteSession``, ``agents.memory.SQLiteSession``), so every test that builds a
``SQLiteSession`` (the session tests, the runner's, the encrypted session's over it) runs
against nous_session. Nothing else in the SDK is touched: its own modules (EncryptedSession's
among them) keep the real class, so what they do with the session they are given is what they
would do with a NousSession in an application. The tests that look inside the SDK's own
implementation are deselected, each with its reason in :data:`EXCLUDED`.

The run's summary also says how many of the tests it ran built a NousSession (one of the
tests' ``SQLiteSession`` objects, or a NousSession the test made itself): the rest test the
SDK's runner without a session, and pass whatever the adapter does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nous_session.integrations.openai_agents import NousSession

# The node id of the test running now (set by the runtest hooks below), and the tests that
# built a NousSession, counted by NousSession.__init__ while they ran (setup and teardown
# included: a fixture that builds the session counts for its test).
_current: str | None = None
_built: set[str] = set()
_ran: set[str] = set()


def _counting_init(original: Any) -> Any:
    def __init__(self: NousSession, *args: Any, **kwargs: Any) -> None:
        if _current is not None:
            _built.add(_current)
        original(self, *args, **kwargs)

    return __init__


NousSession.__init__ = _counting_init(NousSession.__init__)  # type: ignore[method-assign]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    """Name the test running now, for the count of tests that built a NousSession."""
    global _current
    _current = item.nodeid
    try:
        return (yield)
    finally:
        _current = None


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Count a test as run once its call phase ran (a skip in setup is not a run)."""
    if report.when == "call":
        _ran.add(report.nodeid)


class SQLiteSession(NousSession):
    """NousSession built the way the SDK builds a SQLiteSession: ``":memory:"`` (the default)
    is a private in-memory session, a file path a nous_session SQLite store in that file."""

    def __init__(
        self,
        session_id: str,
        db_path: str | Path = ":memory:",
        sessions_table: str = "agent_sessions",
        messages_table: str = "agent_messages",
        session_settings: Any = None,
    ) -> None:
        store = None if str(db_path) == ":memory:" else f"sqlite:///{Path(db_path).resolve()}"
        super().__init__(session_id, store, session_settings=session_settings)
        self.db_path = db_path


def _swap() -> None:
    """Bind the two public names the SDK's tests import SQLiteSession by, and nothing else."""
    import agents
    import agents.memory

    for module in (agents, agents.memory):
        module.SQLiteSession = SQLiteSession  # type: ignore[attr-defined]


_swap()

# Why a test of the SDK's cannot apply to another implementation of its Session protocol.
_CONNECTIONS = (
    "reads SQLiteSession's private connection bookkeeping "
    "(_connections, _connections_lock, _locked_connection, _lock)"
)
_RAW_TABLES = "reads or writes SQLiteSession's raw tables (agent_sessions, agent_messages)"
# failed_add_items_releases_write_lock also checks the TypeError a non-JSON item raises;
# tests/integrations/test_openai_agents.py checks that NousSession raises one too.
_CORRUPT_ROWS = "plants corrupt JSON rows through SQLiteSession's private _locked_connection"
_FILE_LOCKS = "reads SQLiteSession's private class-level file locks (_file_lock_counts)"
_INSERT_HOOK = (
    "patches SQLiteSession's private _insert_items (the insert its worker thread runs) "
    "to hold or fail a commit"
)
_TRIGGER = "makes SQLiteSession's inserts fail with a trigger on its raw agent_messages table"

_SESSION = "memory/test_session.py::test_sqlite_session_"
_ENCRYPT = "extensions/memory/test_encrypt_session.py::test_encrypted_pop_"
_COMPACTION = (
    "memory/test_openai_responses_compaction_session.py::TestOpenAIResponsesCompactionSession::"
)
# Parametrised over the SDK's SQLiteSession and its AsyncSQLiteSession: only the first
# ("[sqlite") is ours to run; the AsyncSQLiteSession variants run and pass.
_SUFFIX = "memory/test_compaction_suffix.py::test_"
_SQLITE = "[sqlite"

EXCLUDED: dict[str, str] = {
    # Node ids (relative to the SDK's tests/, without parameters, or ending in a parameter
    # prefix) and the reason.
    _SESSION + "close_closes_worker_thread_connections": _CONNECTIONS,
    _SESSION + "reaps_connections_from_exited_worker_threads": _CONNECTIONS,
    _SESSION + "closes_retired_connections_before_the_next_allocation": _CONNECTIONS,
    _SESSION + "keeps_connections_of_live_worker_threads": _CONNECTIONS,
    _SESSION + "rollback_failure_evicts_connection": _CONNECTIONS,
    _SESSION + "close_retries_quarantined_connection": _CONNECTIONS,
    _SESSION + "post_commit_cancellation_propagates_after_known_outcome": _CONNECTIONS,
    _SESSION + "pop_item_skips_corrupt_most_recent": _CORRUPT_ROWS,
    _SESSION + "pop_item_returns_none_after_dropping_only_corrupt_rows": _CORRUPT_ROWS,
    _SESSION + "get_items_limit_skips_corrupt_newest_rows": _CORRUPT_ROWS,
    _SESSION + "get_items_session_settings_limit_skips_corrupt_rows": _CORRUPT_ROWS,
    _SESSION + "file_lock_is_shared_across_instances": _FILE_LOCKS,
    _SESSION + "failed_add_items_releases_write_lock": _RAW_TABLES,
    _SESSION + "failed_clear_session_rolls_back": _RAW_TABLES,
    _SESSION + "failed_pop_item_releases_write_lock": _RAW_TABLES,
    _ENCRYPT + "authentication_is_atomic_with_concurrent_mutations": _RAW_TABLES,
    _ENCRYPT + "wrong_key_preserves_row_identity": _RAW_TABLES,
    _COMPACTION + "test_settled_pop_failure_invalidates_response_chain": _CONNECTIONS,
    _COMPACTION + "test_settled_clear_failure_invalidates_response_chain": _CONNECTIONS,
    _SUFFIX + "suffix_transaction_rolls_back_failed_insert" + _SQLITE: _TRIGGER,
    _SUFFIX + "failed_encrypted_suffix_transaction_preserves_original_tokens" + _SQLITE: _TRIGGER,
    _SUFFIX + "cancelled_suffix_transaction_settles_before_newer_append" + _SQLITE: _INSERT_HOOK,
    "test_run_impl_resume_paths.py::test_handoff_resume_after_cancelled_compaction_commits": (
        _INSERT_HOOK
    ),
}


_DESELECTED: dict[str, list[str]] = {}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    deselected = []
    for item in items:
        reason = _excluded(item.nodeid)
        if reason is not None:
            deselected.append(item)
            _DESELECTED.setdefault(reason, []).append(item.nodeid)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = [item for item in items if _excluded(item.nodeid) is None]


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Say how many tests built a NousSession, and what was deselected and why, so every
    run's log carries its coverage and its exclusions."""
    terminalreporter.section("openai_agents_plugin")
    built = len(_built & _ran)
    terminalreporter.write_line(f"NousSession built by {built} of {len(_ran)} tests run")
    files: dict[str, list[int]] = {}
    for nodeid in _ran:
        counts = files.setdefault(nodeid.split("::", 1)[0], [0, 0])
        counts[0] += nodeid in _built
        counts[1] += 1
    for path, (with_session, run) in sorted(files.items()):
        terminalreporter.write_line(f"    {path}: {with_session} of {run}")
    if not _DESELECTED:
        return
    terminalreporter.section("deselected by openai_agents_plugin, with reasons")
    for reason, nodeids in _DESELECTED.items():
        terminalreporter.write_line(f"{len(nodeids)}: {reason}")
        for nodeid in nodeids:
            terminalreporter.write_line(f"    {nodeid}")


def _excluded(nodeid: str) -> str | None:
    """The reason ``nodeid`` is left out, or None. A key names a test (every parameter set)
    or, ending in a parameter prefix (``...[sqlite``), the parameter sets starting so."""
    base = nodeid.split("[", 1)[0]
    for key, reason in EXCLUDED.items():
        if "[" in key:
            if nodeid.startswith(key) or ("/" + key) in nodeid:
                return reason
        elif base == key or base.endswith("/" + key) or nodeid == key:
            return reason
    return None
