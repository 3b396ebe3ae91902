"""The fault-injection suite (``-m faults``; .ci/run runs it): faults of every kind, and after
each run the same four checks.

* zero acknowledged events lost: every acknowledged append's idempotency key is in the store,
  its events held or kept aside;
* zero duplicated: no key's content appears twice among the held and kept events;
* each producer's order kept: its keys' seqs increase with its own count;
* every surface a fresh fold: what each actor shows once caught up is what folding the stored
  session from scratch gives.

Faults: random cancellations of callers and of owners (the ``async with`` block), a proxy that
drops PostgreSQL's reply after commits (both conflict modes), ``pg_terminate_backend`` and a
server restart under running producers, SIGKILL during compactions and snapshots on SQLite and
PostgreSQL, and four processes doing mixed operations on one session. With
``NOUS_FAULT_FIGURES=path`` each test appends a line of figures (runs, events, faults) there.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import pytest

from nous_session import (
    CompactionPolicy,
    ConflictError,
    Log,
    Message,
    OutcomeUnknownError,
    SessionActor,
    SessionClosedError,
    Store,
    StoreError,
)
from nous_session.stores import MemoryStore, open_store
from nous_session.stores.sqlite import SQLiteStore
from tests.support.processes import Lines

pytestmark = [pytest.mark.faults]
POSTGRES_URL = os.environ.get("NOUS_SESSION_TEST_POSTGRES")
WORKER = Path(__file__).parent.parent / "support" / "fault_worker.py"
needs_postgres = pytest.mark.skipif(not POSTGRES_URL, reason="no PostgreSQL server")


def figures(test: str, **values: Any) -> None:
    target = os.environ.get("NOUS_FAULT_FIGURES")
    if target:
        with open(target, "a") as out:
            out.write(json.dumps({"test": test, **values}) + "\n")


async def check(
    store: Store, session_id: str, acked: dict[str, int], actors: list[SessionActor] = ()
) -> dict[str, int]:
    """The four checks; returns figures about what is stored."""
    stored = await store.read(session_id)
    events = {e.seq: e for e in [*stored.events, *stored.kept]}
    for key, seq in acked.items():
        assert key in stored.keys, f"acknowledged {key} (seq {seq}) is lost"
        assert stored.keys[key][0] == seq, (
            f"{key} acknowledged at {seq}, stored at {stored.keys[key]}"
        )
        assert seq in events, f"acknowledged {key} has no event at seq {seq}"
    contents = [e.data.get("content") for e in events.values() if e.type == "user_message"]
    keyed = [c for c in contents if isinstance(c, str) and " " in c and c.split()[-1].isdigit()]
    assert len(keyed) == len(set(keyed)), "an event was stored twice"
    order: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for key, (seq, _) in stored.keys.items():
        producer, _, index = key.rpartition("-")
        order[producer].append((int(index), seq))
    for producer, pairs in order.items():
        seqs = [seq for _, seq in sorted(pairs)]
        assert seqs == sorted(seqs), f"{producer}'s order was not kept"
    fresh = Log.restore(stored.events, count=stored.count, horizon=stored.horizon)
    surface = [(e.seq, e.position) for e in fresh.surface()]
    for actor in actors:
        await actor.reload()
        assert [(e.seq, e.position) for e in actor.log.surface()] == surface, f"{actor!r}"
    return {"events": stored.count, "keys": len(stored.keys), "held": len(stored.events)}


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], Store]]:
    if request.param == "memory":
        shared = MemoryStore()
        yield lambda: shared
    elif request.param == "sqlite":
        yield lambda: SQLiteStore(tmp_path / "faults.sqlite3")
    else:
        if not POSTGRES_URL:
            pytest.skip("no PostgreSQL server")
        psycopg = pytest.importorskip("psycopg")
        from nous_session.stores.postgres import PostgresStore

        schema = f"f_{uuid.uuid4().hex[:12]}"
        yield lambda: PostgresStore(POSTGRES_URL, schema=schema)
        with psycopg.connect(POSTGRES_URL, autocommit=True) as connection:
            connection.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


async def produce(
    session: SessionActor, name: str, count: int, acked: dict[str, int], retry: bool = True
) -> int:
    """Keyed appends; any failure is retried with the same key. Returns the retries."""
    retries = 0
    for index in range(count):
        key = f"{name}-{index}"
        while True:
            try:
                event = await session.add_message(Message.user(f"{name} {index}"), key=key)
                acked[key] = event.seq
                break
            except (ConflictError, StoreError, OutcomeUnknownError):
                retries += 1
                if not retry:
                    raise
                await anyio.sleep(0.005)
    return retries


# Cancellations -----------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_random_cancellations_of_callers_and_owners(stores: Callable[[], Store]) -> None:
    """Callers are cancelled at random moments and owners' blocks torn down at random; a
    caller that was cancelled retries with its key, which tells it what happened."""
    rng = random.Random(9)
    acked: dict[str, int] = {}
    cancelled = owners = 0
    store = stores()
    try:
        for round_ in range(6):
            with anyio.move_on_after(rng.uniform(0.05, 0.3)) as owner:
                async with SessionActor.open(
                    session_id="s",
                    store=store,
                    queue_size=4,
                    compaction=CompactionPolicy(every=40, keep_last=10),
                ) as session:

                    async def caller(name: str) -> None:
                        nonlocal cancelled
                        for index in range(40):
                            key = f"{name}-{index}"
                            while key not in acked:
                                with anyio.move_on_after(rng.uniform(0, 0.004)) as scope:
                                    try:
                                        event = await session.add_message(
                                            Message.user(f"{name} {index}"), key=key
                                        )
                                        acked[key] = event.seq
                                    except SessionClosedError:
                                        return
                                if scope.cancelled_caught:
                                    cancelled += 1

                    async with anyio.create_task_group() as tg:
                        for producer in range(4):
                            tg.start_soon(caller, f"r{round_}p{producer}")
            owners += int(owner.cancelled_caught)
        async with SessionActor.open(session_id="s", store=store) as session:
            stats = await check(store, "s", acked, [session])
    finally:
        await store.aclose()
    figures(
        "cancellations",
        runs=6,
        acknowledged=len(acked),
        callers_cancelled=cancelled,
        owners_cancelled=owners,
        **stats,
    )


# PostgreSQL: lost replies, killed backends, a restarted server ---------------------------------


@needs_postgres
@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["raise", "rebase"])
async def test_lost_commit_replies_are_resolved_to_the_truth(mode: str) -> None:
    from nous_session.stores.postgres import PostgresStore
    from tests.support.faultkit import ReplyDroppingProxy

    schema = f"f_{uuid.uuid4().hex[:12]}"
    acked: dict[str, int] = {}
    with ReplyDroppingProxy(POSTGRES_URL) as proxy:  # type: ignore[arg-type]
        faulty = PostgresStore(f"{proxy.url}?schema={schema}", max_size=2)
        straight = PostgresStore(POSTGRES_URL, schema=schema)  # type: ignore[arg-type]
        try:
            await faulty.read("s")  # connect and migrate before arming
            async with SessionActor.open(
                session_id="s", store=faulty, on_conflict=mode, follow=False
            ) as session:

                async def saboteur() -> None:
                    for _ in range(12):
                        proxy.drop_after_write()
                        # The proxy runs in its own thread: poll it, there is no event to await.
                        while proxy.armed:  # noqa: ASYNC110
                            await anyio.sleep(0.002)

                async with anyio.create_task_group() as tg:
                    tg.start_soon(saboteur)
                    for producer in range(3):
                        tg.start_soon(produce, session, f"p{producer}", 60, acked)
                stats = await check(straight, "s", acked, [session])
            assert proxy.dropped >= 1
        finally:
            await faulty.aclose()
            await straight.aclose()
            import psycopg

            with psycopg.connect(POSTGRES_URL, autocommit=True) as connection:  # type: ignore[arg-type]
                connection.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    figures(
        f"lost replies ({mode})", replies_dropped=proxy.dropped, acknowledged=len(acked), **stats
    )


@needs_postgres
@pytest.mark.anyio
async def test_terminated_backends_lose_and_duplicate_nothing(
    stores: Callable[[], Store], request: pytest.FixtureRequest
) -> None:
    if "postgres" not in request.node.callspec.id:
        pytest.skip("a PostgreSQL fault")
    from tests.support.faultkit import terminate_backends

    store = stores()
    acked: dict[str, int] = {}
    killed = 0
    try:
        async with SessionActor.open(session_id="s", store=store, on_conflict="rebase") as session:
            done = anyio.Event()

            async def killer() -> None:
                nonlocal killed
                while not done.is_set():
                    await anyio.sleep(0.03)
                    killed += await anyio.to_thread.run_sync(
                        partial(terminate_backends, POSTGRES_URL, "nous_session", slow_ok=True)
                    )

            async with anyio.create_task_group() as tg:
                tg.start_soon(killer)
                async with anyio.create_task_group() as producers:
                    for producer in range(4):
                        producers.start_soon(produce, session, f"p{producer}", 50, acked)
                done.set()
            stats = await check(store, "s", acked, [session])
    finally:
        await store.aclose()
    assert killed >= 1
    figures("pg_terminate_backend", backends_terminated=killed, acknowledged=len(acked), **stats)


@pytest.mark.anyio
async def test_a_restarted_server_loses_and_duplicates_nothing() -> None:
    from tests.support.faultkit import PostgresServer, postgres_unavailable

    reason = postgres_unavailable()
    if reason is not None:
        pytest.skip(reason)
    from nous_session.stores.postgres import PostgresStore

    acked: dict[str, int] = {}
    with PostgresServer() as server:
        store = PostgresStore(server.url, connect_timeout=5)
        try:
            async with SessionActor.open(session_id="s", store=store, follow=False) as session:
                halfway = anyio.Event()

                async def restart() -> None:
                    await halfway.wait()
                    await anyio.to_thread.run_sync(server.restart)

                async def producer(name: str) -> None:
                    await produce(session, name, 30, acked)
                    halfway.set()
                    await produce(session, name + "b", 30, acked)

                async with anyio.create_task_group() as tg:
                    tg.start_soon(restart)
                    for index in range(3):
                        tg.start_soon(producer, f"p{index}")
                stats = await check(store, "s", acked, [session])
        finally:
            await store.aclose()
    figures("server restart", restarts=1, acknowledged=len(acked), **stats)


# SIGKILL during compaction and snapshot ----------------------------------------------------------


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'killed.sqlite3'}"
        return
    if not POSTGRES_URL:
        pytest.skip("no PostgreSQL server")
    psycopg = pytest.importorskip("psycopg")
    schema = f"f_{uuid.uuid4().hex[:12]}"
    yield f"{POSTGRES_URL}?schema={schema}"
    with psycopg.connect(POSTGRES_URL, autocommit=True) as connection:
        connection.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def test_sigkill_during_compactions_and_snapshots(url: str) -> None:
    rng = random.Random(3)
    acked: dict[str, int] = {}
    kills = 0
    for round_ in range(4):
        child = subprocess.Popen(
            [sys.executable, str(WORKER), "crash", url, "s", str(round_)],
            stdout=subprocess.PIPE,
            text=True,
        )
        lines = Lines(child)
        assert lines.next().strip() == "ready"
        target = rng.randint(40, 160)
        seen = 0
        while seen < target:
            line = lines.next()
            assert line, "the worker ended early"
            if line.startswith("ack "):
                _, index, seq = line.split()
                acked[f"c-{index}"] = int(seq)
                seen += 1
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
        assert child.stdout is not None
        child.stdout.close()
        kills += 1

    async def verify() -> dict[str, int]:
        store = open_store(url)
        try:
            async with SessionActor.open(session_id="s", store=store) as session:
                return await check(store, "s", acked, [session])
        finally:
            await store.aclose()

    stats = anyio.run(verify)
    figures(f"SIGKILL ({url.split(':')[0]})", kills=kills, acknowledged=len(acked), **stats)


# Four processes, mixed operations ----------------------------------------------------------------


def test_four_processes_with_mixed_operations(url: str) -> None:
    children = [
        subprocess.Popen(
            [sys.executable, str(WORKER), "mixed", url, "s", f"w{index}", str(index), "60"],
            stdout=subprocess.PIPE,
            text=True,
        )
        for index in range(4)
    ]
    acked: dict[str, int] = {}
    try:
        for child in children:
            lines = Lines(child)
            while line := lines.next(timeout=180):
                assert not line.startswith("diverged"), line
                if line.startswith("ack "):
                    _, name, index, seq = line.split()
                    acked[f"{name}-{index}"] = int(seq)
    finally:
        for child in children:
            child.wait(timeout=180)
            assert child.stdout is not None
            child.stdout.close()
    assert [child.returncode for child in children] == [0, 0, 0, 0]

    async def verify() -> dict[str, int]:
        store = open_store(url)
        try:
            async with SessionActor.open(session_id="s", store=store) as session:
                return await check(store, "s", acked, [session])
        finally:
            await store.aclose()

    stats = anyio.run(verify)
    figures(f"four processes ({url.split(':')[0]})", processes=4, acknowledged=len(acked), **stats)
