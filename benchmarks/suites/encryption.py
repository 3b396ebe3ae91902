"""Suite "encryption": what sealing every record costs (encryption at rest), against the same
work in plain text, side by side in one run (the sides alternate round by round).

* ``sequential_sqlite``: workload W1 on a SQLite file (the peers suite's
  ``sequential_sqlite``): 10,000 chat messages appended to one session through a
  ``SessionActor``, each awaited, default durability (``synchronous=FULL``).
* ``producers_sqlite``: workload W3 (the peers suite's ``concurrent``): 50 producers x 200
  messages on one SQLite session, all at once (group commits: the sealing of a whole batch
  runs on the writer's thread).
* ``sequential_postgres``: W1 on PostgreSQL (2,000 appends), when ``NOUS_SESSION_TEST_POSTGRES``
  names a server.

Each ratio is encrypted time / plain time (the target: at most 1.10). Every round checks that
everything appended reads back, in order, and (encrypted side) that the stored records are
sealed.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio

from benchmarks.harness import Context, Measurement, Target, ainterleave, expect, measure, ratio
from benchmarks.workloads import chat_messages
from nous_session import Encryption, LocalKeyFile, SessionActor
from nous_session.stores.sqlite import SQLiteStore

TARGET = Target("<=", 1.10, "encryption at rest")
URL_ENV = "NOUS_SESSION_TEST_POSTGRES"
PRODUCERS, EACH = 50, 200


def _sealed(store: Any, session_id: str) -> bool:
    """Whether the session's stored records are sealed (first byte 0x01), read raw."""
    if isinstance(store, SQLiteStore):
        import sqlite3
        from contextlib import closing

        with closing(sqlite3.connect(store.path)) as connection:
            rows = connection.execute(
                "SELECT e.record FROM nous_events e JOIN nous_sessions s ON s.id = e.sid"
                " WHERE s.name = ? LIMIT 5",
                (session_id,),
            ).fetchall()
    else:
        import psycopg

        with psycopg.connect(os.environ[URL_ENV]) as connection:
            rows = connection.execute(
                f"SELECT record FROM {store.schema}.nous_events WHERE session = %s LIMIT 5",
                (session_id,),
            ).fetchall()
    return bool(rows) and all(bytes(row[0])[0] == 1 for row in rows)


async def _run_sides(
    ctx: Context,
    make: Callable[[Encryption | None, str], Any],
    work: Callable[[Any], Awaitable[int]],
    encryption: Encryption,
) -> dict[str, list[float]]:
    """Per round, each side's seconds for ``work`` on a fresh store (``make``)."""

    def side(chosen: Encryption | None) -> Callable[[], Awaitable[float]]:
        async def run() -> float:
            store = make(chosen, uuid.uuid4().hex[:10])
            async with store:
                started = time.perf_counter()
                done = await work(store)
                elapsed = time.perf_counter() - started
                expect(done > 0, "nothing was appended")
                if chosen is not None:
                    expect(_sealed(store, "s"), "the encrypted side stored plain records")
            return elapsed

        return run

    return await ainterleave(
        min(ctx.rounds, 5), {"plain": side(None), "encrypted": side(encryption)}
    )


def _sequential(count: int) -> Callable[[Any], Awaitable[int]]:
    messages = chat_messages(count)

    async def work(store: Any) -> int:
        async with SessionActor.open(session_id="s", store=store) as session:
            for message in messages:
                await session.add_message(message)
        events = await store.load("s")
        expect(len(events) == count, f"read back {len(events)} of {count}")
        expect(events[-1].data.get("content") == messages[-1].content, "the last one differs")
        return count

    return work


async def _producers(store: Any) -> int:
    async with SessionActor.open(session_id="s", store=store) as session:

        async def produce(k: int) -> None:
            for j in range(EACH):
                await session.append("user_message", {"content": f"producer {k} message {j}"})

        async with anyio.create_task_group() as group:
            for k in range(PRODUCERS):
                group.start_soon(produce, k)
    events = await store.load("s")
    expect(len(events) == PRODUCERS * EACH, f"read back {len(events)}")
    for k in range(PRODUCERS):
        mine = [e.data["content"] for e in events if e.data["content"].startswith(f"producer {k} ")]
        expect(mine == [f"producer {k} message {j}" for j in range(EACH)], f"producer {k} order")
    return PRODUCERS * EACH


def _report(
    name: str, unit_count: int, samples: dict[str, list[float]], note: str
) -> list[Measurement]:
    plain, sealed = samples["plain"], samples["encrypted"]
    return [
        measure(f"encryption.{name}.plain", "msg/s", [unit_count / s for s in plain]),
        measure(f"encryption.{name}.encrypted", "msg/s", [unit_count / s for s in sealed]),
        ratio(f"encryption.{name}.time_ratio", sealed, plain, target=TARGET, note=note),
    ]


def _sqlite(folder: Path) -> Callable[[Encryption | None, str], Any]:
    def make(encryption: Encryption | None, name: str) -> Any:
        return SQLiteStore(folder / f"{name}.sqlite3", encryption=encryption)

    return make


def _in_scratch(body: Callable[[Path, Encryption], list[Measurement]]) -> list[Measurement]:
    folder = Path(tempfile.mkdtemp(prefix="nous-enc-"))
    try:
        encryption = Encryption(LocalKeyFile.create(folder / "master.key"))
        return body(folder, encryption)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def sequential_sqlite(ctx: Context) -> list[Measurement]:
    """W1 on SQLite: encrypted vs plain."""
    count = ctx.size(10_000, 1_000)

    def body(folder: Path, encryption: Encryption) -> list[Measurement]:
        samples = anyio.run(_run_sides, ctx, _sqlite(folder), _sequential(count), encryption)
        return _report(
            "sequential_sqlite",
            count,
            samples,
            f"W1: {count:,} awaited appends to one session, SQLite, synchronous=FULL",
        )

    return _in_scratch(body)


def producers_sqlite(ctx: Context) -> list[Measurement]:
    """W3 on SQLite: 50 producers x 200 on one session, encrypted vs plain."""

    def body(folder: Path, encryption: Encryption) -> list[Measurement]:
        samples = anyio.run(_run_sides, ctx, _sqlite(folder), _producers, encryption)
        return _report(
            "producers_sqlite",
            PRODUCERS * EACH,
            samples,
            f"W3: {PRODUCERS} producers x {EACH} on one SQLite session, group commits",
        )

    return _in_scratch(body)


def sequential_postgres(ctx: Context) -> list[Measurement]:
    """W1 on PostgreSQL (fewer appends: each is a round trip): encrypted vs plain."""
    url = os.environ.get(URL_ENV)
    if not url:
        print(f"   skipped: no PostgreSQL server (set {URL_ENV})", flush=True)
        return []
    import psycopg

    from nous_session.stores.postgres import PostgresStore

    count = ctx.size(2_000, 300)
    schemas: list[str] = []

    def make(encryption: Encryption | None, name: str) -> Any:
        schemas.append(f"bench_enc_{name}")
        return PostgresStore(url, schema=schemas[-1], encryption=encryption)

    def body(folder: Path, encryption: Encryption) -> list[Measurement]:
        try:
            samples = anyio.run(_run_sides, ctx, make, _sequential(count), encryption)
        finally:
            with psycopg.connect(url, autocommit=True) as connection:
                for schema in schemas:
                    connection.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        return _report(
            "sequential_postgres",
            count,
            samples,
            f"W1 on PostgreSQL: {count:,} awaited appends to one session",
        )

    return _in_scratch(body)


BENCHMARKS = [sequential_sqlite, producers_sqlite, sequential_postgres]
