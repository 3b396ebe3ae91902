"""Suite "listing": one user's 20 newest sessions, among 1,000 and among 100,000 sessions.

The store's ``list_sessions(where={"owner": ...}, limit=20)`` (newest activity first) is
answered from an index on (owner, last-active time, id), so its cost should not grow with the
sessions that do not match: the target is the 100,000-session store within 2x of the
1,000-session one. In both stores the user has the same 100 sessions among everyone else's
(owners drawn from 1,000 others).

The stores are built by a bulk path (rows inserted directly, one statement per table, then
``ANALYZE``), so that setup takes seconds: each session has one event and a metadata record,
its times spread over a year. Each round times a batch of queries on each store, the order
alternating, through the public API on asyncio: wall and CPU time (all threads) per query.

* ``sqlite``: SQLiteStore (synchronous=FULL, the default), on a temporary file.
* ``postgres``: PostgresStore, in fresh schemas, when ``NOUS_SESSION_TEST_POSTGRES`` names a
  server (skipped with a note otherwise).
"""

from __future__ import annotations

import os
import random
import sqlite3
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from contextlib import closing
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import orjson

from benchmarks.harness import Context, Measurement, Target, ainterleave, expect, measure, ratio
from nous_session import Event, EventType
from nous_session.codec import encode

SOURCE = "issue 21"
MS = 1e3
OWNED = 100  # the user's own sessions, in either store
PAGE = 20
YEAR_US = 365 * 86400 * 1_000_000
URL_ENV = "NOUS_SESSION_TEST_POSTGRES"


def _rows(total: int, seed: int) -> list[tuple[str, str, int, int]]:
    """(session id, owner, created, active) for ``total`` sessions, ``OWNED`` of them "u0"'s."""
    rng = random.Random(seed)
    start = 1_700_000_000_000_000
    mine = set(rng.sample(range(total), OWNED))
    rows = []
    for index in range(total):
        owner = "u0" if index in mine else f"u{rng.randrange(1, 1001)}"
        created = start + rng.randrange(YEAR_US)
        rows.append((f"s{index:06}", owner, created, created + rng.randrange(YEAR_US // 12)))
    return rows


def _build_sqlite(path: Path, total: int) -> None:
    """A SQLite store of ``total`` sessions, made by the store (schema) then bulk inserts."""
    from nous_session.stores.sqlite import SQLiteStore

    async def schema() -> None:
        async with SQLiteStore(path) as store:
            await store.list_sessions(limit=1)  # opens for writing: creates the schema

    anyio.run(schema)
    rows = _rows(total, seed=total)
    event = encode(Event(0, EventType.USER_MESSAGE, {"content": "hello"}, datetime.now(UTC)))
    with closing(sqlite3.connect(path)) as connection:
        connection.execute("PRAGMA synchronous=OFF")
        connection.executemany(
            "INSERT INTO nous_sessions (id, name, count, held, created, active, meta)"
            " VALUES (?, ?, 1, 1, ?, ?, ?)",
            [
                (index + 1, name, created, active, orjson.dumps({"owner": owner}).decode())
                for index, (name, owner, created, active) in enumerate(rows)
            ],
        )
        connection.executemany(
            "INSERT INTO nous_events (sid, seq, record) VALUES (?, 0, ?)",
            [(index + 1, event) for index in range(total)],
        )
        connection.commit()
        connection.execute("ANALYZE")


def _build_postgres(url: str, schema: str, total: int) -> None:
    """A PostgreSQL store of ``total`` sessions in ``schema``: the store makes the schema, one
    INSERT ... SELECT per table fills it."""
    import psycopg

    from nous_session.stores.postgres import PostgresStore

    async def make() -> None:
        async with PostgresStore(url, schema=schema) as store:
            await store.list_sessions(limit=1)

    anyio.run(make)
    rows = _rows(total, seed=total)
    event = encode(Event(0, EventType.USER_MESSAGE, {"content": "hello"}, datetime.now(UTC)))
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute(
            f"""INSERT INTO {schema}.nous_sessions (name, count, created, active, meta)
                SELECT name, 1, to_timestamp(created / 1e6), to_timestamp(active / 1e6),
                       jsonb_build_object('owner', owner)
                FROM unnest(%s::text[], %s::text[], %s::bigint[], %s::bigint[])
                     AS r (name, owner, created, active)""",
            (
                [row[0] for row in rows],
                [row[1] for row in rows],
                [row[2] for row in rows],
                [row[3] for row in rows],
            ),
        )
        connection.execute(
            f"INSERT INTO {schema}.nous_events (session, seq, record)"
            f" SELECT name, 0, %s FROM {schema}.nous_sessions",
            (event,),
        )
        connection.execute(f"ANALYZE {schema}.nous_sessions")


async def _timed(store: Any, queries: int) -> tuple[float, float]:
    """Wall and CPU milliseconds per query of the user's first page, checked."""
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(queries):
        page = await store.list_sessions(where={"owner": "u0"}, limit=PAGE)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    expect(len(page.sessions) == PAGE, f"a page of {len(page.sessions)}, not {PAGE}")
    expect(all(e.metadata.owner == "u0" for e in page.sessions), "another user's session")
    actives = [e.active for e in page.sessions]
    expect(actives == sorted(actives, reverse=True), "not newest first")
    return wall / queries * MS, cpu / queries * MS


async def _compare(
    ctx: Context, stores: dict[str, Any], label: str, note: str
) -> list[Measurement]:
    queries = ctx.size(200, 20)
    walls: dict[str, list[float]] = {name: [] for name in stores}
    cpus: dict[str, list[float]] = {name: [] for name in stores}

    def side(name: str) -> Callable[[], Awaitable[float]]:
        async def run() -> float:
            wall, cpu = await _timed(stores[name], queries)
            cpus[name].append(cpu)
            walls[name].append(wall)
            return wall

        return run

    for store in stores.values():  # warm: connections, caches, the statement cache
        await _timed(store, 5)
    await ainterleave(ctx.rounds, {name: side(name) for name in stores})
    small, large = list(stores)
    return [
        measure(f"{label}.first_page_{small}", "ms", walls[small], cpu_ms=cpus[small], note=note),
        measure(f"{label}.first_page_{large}", "ms", walls[large], cpu_ms=cpus[large], note=note),
        ratio(
            f"{label}.ratio_{large}_to_{small}",
            walls[large],
            walls[small],
            target=Target("<=", 2.0, SOURCE),
            note="wall time, paired by round; the CPU-time ratio is in the JSON",
        ),
        ratio(f"{label}.cpu_ratio_{large}_to_{small}", cpus[large], cpus[small]),
    ]


def sqlite(ctx: Context) -> list[Measurement]:
    """First page of one user's 20 newest sessions, 100,000 vs 1,000 sessions, SQLite."""
    from nous_session.stores.sqlite import SQLiteStore

    sizes = {"1k": 1_000, "100k": ctx.size(100_000, 20_000)}
    with tempfile.TemporaryDirectory() as directory:
        paths = {name: Path(directory) / f"{name}.sqlite3" for name in sizes}
        started = time.perf_counter()
        for name, total in sizes.items():
            _build_sqlite(paths[name], total)
        built = time.perf_counter() - started

        async def run() -> list[Measurement]:
            stores = {name: SQLiteStore(paths[name]) for name in sizes}
            try:
                return await _compare(ctx, stores, "sqlite", f"setup {built:.1f} s (bulk)")
            finally:
                for store in stores.values():
                    await store.aclose()

        return anyio.run(run)


def postgres(ctx: Context) -> list[Measurement]:
    """The same on PostgreSQL, when a server is configured."""
    url = os.environ.get(URL_ENV)
    if not url:
        print(
            f"   skipped: no PostgreSQL server. Set {URL_ENV}=postgresql://... "
            "(`. .ci/postgres` starts one on 127.0.0.1:54329 and sets it)",
            flush=True,
        )
        return []
    import psycopg

    from nous_session.stores.postgres import PostgresStore

    sizes = {"1k": 1_000, "100k": ctx.size(100_000, 20_000)}
    schemas = {name: f"bench_listing_{name}_{uuid.uuid4().hex[:8]}" for name in sizes}
    try:
        started = time.perf_counter()
        for name, total in sizes.items():
            _build_postgres(url, schemas[name], total)
        built = time.perf_counter() - started

        async def run() -> list[Measurement]:
            stores = {name: PostgresStore(url, schema=schemas[name]) for name in sizes}
            try:
                return await _compare(ctx, stores, "postgres", f"setup {built:.1f} s (bulk)")
            finally:
                for store in stores.values():
                    await store.aclose()

        return anyio.run(run)
    finally:
        with psycopg.connect(url, autocommit=True) as connection:
            for schema in schemas.values():
                connection.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


BENCHMARKS = [sqlite, postgres]
