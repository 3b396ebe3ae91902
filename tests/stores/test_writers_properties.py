"""Property test: several writers on one store, every actor's surface a fresh fold of the log.

Hypothesis draws a sequence of operations (appends, replaces, removes, rewinds, snapshots,
compactions, reloads), each by one of three actors with a store object of its own over the same
data (the same MemoryStore; one SQLite file; one PostgreSQL schema). Conflicts are expected and
retried as an application would. After every operation, any actor whose log has caught up with
the store (same count) must show exactly the surface a fresh fold of the stored session gives;
at the end every actor reloads and must. This is what another writer's snapshot used to break
(issue 9, item 9): a reader kept events the snapshot dropped, and showed shadowed messages again.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nous_session import (
    CompactionPolicy,
    ConflictError,
    InvalidEventError,
    Log,
    Message,
    SessionActor,
    Store,
)
from nous_session.stores import MemoryStore
from nous_session.stores.sqlite import SQLiteStore

POSTGRES_URL = os.environ.get("NOUS_SESSION_TEST_POSTGRES")

operations = st.lists(
    st.tuples(
        st.integers(0, 2),  # which writer
        st.sampled_from(
            ["append", "append", "append", "replace", "remove", "rewind", "snapshot", "reload"]
        ),
        st.integers(0, 1000),  # where
    ),
    min_size=5,
    max_size=40,
)


async def _fresh(store: Store) -> tuple[int, list[tuple[int, str]]]:
    stored = await store.read("s")
    log = Log.restore(stored.events, count=stored.count, horizon=stored.horizon)
    return log.count, [
        (e.seq, m.text) for e, m in zip(log.surface(), log.derive_messages(), strict=True)
    ]


def _surface(session: SessionActor) -> list[tuple[int, str]]:
    log = session.log
    return [(e.seq, m.text) for e, m in zip(log.surface(), log.derive_messages(), strict=True)]


async def _check(session: SessionActor, probe: Store) -> None:
    count, surface = await _fresh(probe)
    if session.log.count == count:
        assert _surface(session) == surface, f"{session!r} diverged from the store"


async def _run(make: Callable[[], Store], steps: list[tuple[int, str, int]]) -> None:
    stores = [make() for _ in range(3)]
    probe = make()
    policy = CompactionPolicy(every=12, keep_last=4)
    try:
        async with (
            SessionActor.open(session_id="s", store=stores[0], follow=False) as a,
            SessionActor.open(
                session_id="s", store=stores[1], follow=False, on_conflict="rebase"
            ) as b,
            SessionActor.open(
                session_id="s", store=stores[2], follow=False, compaction=policy
            ) as c,
        ):
            actors = [a, b, c]
            for step, (who, kind, where) in enumerate(steps):
                actor = actors[who]
                for _attempt in range(3):  # a conflict means another writer was first: retry
                    try:
                        await _apply(actor, kind, where, step)
                        break
                    except ConflictError:
                        continue
                    except InvalidEventError:
                        break  # a range or target the caught-up log no longer allows
                await c.wait_for_compaction()
                for each in actors:
                    await _check(each, probe)
            for each in actors:
                await each.reload()
            await c.wait_for_compaction()  # a reload may have started one
            for each in actors:
                await each.reload()
                await _check(each, probe)
                assert each.log.count == (await _fresh(probe))[0]
    finally:
        for store in {id(s): s for s in [*stores, probe]}.values():
            await store.aclose()


async def _apply(actor: SessionActor, kind: str, where: int, step: int) -> None:
    surface = actor.log.surface()
    if kind == "append" or not surface:
        await actor.add_message(Message.user(f"m{step}"), key=f"k{step}")
        return
    entry = surface[where % len(surface)]
    last = surface[min(len(surface) - 1, where % len(surface) + where % 3)]
    if kind == "replace":
        expect = [e.seq for e in actor.log.range(entry.position, last.position)]
        await actor.replace(
            entry.position,
            last.position,
            Message.system(f"r{step}"),
            expect=sorted(set(expect), key=expect.index),
        )
    elif kind == "remove":
        await actor.remove(entry.position, last.position)
    elif kind == "rewind":
        low = max(actor.log.horizon - 1, 0)
        await actor.rewind(low + where % max(actor.log.count - low, 1))
    elif kind == "snapshot":
        await actor.snapshot()
    else:
        await actor.reload()


_SETTINGS: Any = settings(
    max_examples=int(os.environ.get("NOUS_WRITERS_EXAMPLES", "60")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@_SETTINGS
@given(steps=operations)
def test_writers_on_a_memory_store_keep_fresh_surfaces(
    backend: str, steps: list[tuple[int, str, int]]
) -> None:
    shared = MemoryStore()
    anyio.run(_run, lambda: shared, steps, backend=backend)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@settings(parent=_SETTINGS, max_examples=max(5, _SETTINGS.max_examples // 4))
@given(steps=operations)
def test_writers_on_a_sqlite_file_keep_fresh_surfaces(
    backend: str, steps: list[tuple[int, str, int]], tmp_path_factory: pytest.TempPathFactory
) -> None:
    path = tmp_path_factory.mktemp("writers") / "s.sqlite3"
    anyio.run(_run, lambda: SQLiteStore(Path(path)), steps, backend=backend)


@pytest.mark.skipif(not POSTGRES_URL, reason="no PostgreSQL server")
@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@settings(parent=_SETTINGS, max_examples=max(3, _SETTINGS.max_examples // 6))
@given(steps=operations)
def test_writers_on_postgresql_keep_fresh_surfaces(
    backend: str, steps: list[tuple[int, str, int]]
) -> None:
    psycopg = pytest.importorskip("psycopg")
    from nous_session.stores.postgres import PostgresStore

    schema = f"w_{uuid.uuid4().hex[:12]}"
    try:
        anyio.run(
            _run,
            lambda: PostgresStore(POSTGRES_URL, schema=schema),  # type: ignore[arg-type]
            steps,
            backend=backend,
        )
    finally:
        with psycopg.connect(POSTGRES_URL, autocommit=True) as connection:  # type: ignore[arg-type]
            connection.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
