"""What an erasure costs the other sessions of a PostgreSQL store: plain rewrite (``VACUUM
FULL`` of the events and kept tables) against crypto-erasure (a data key destroyed, its rows
re-sealed, the key table alone vacuumed), side by side in one run.

The events table is first filled with ``--size`` MB of other sessions' events (bulk SQL:
valid plain records of about 1 kB each). Then, per side, 200 other sessions append
continuously through the store's API (``store.commit``, all at once, one event per commit)
while one event of a target session is erased. Reported per side: the other sessions' append
latency (p50, p99, max) in a baseline window before the erasure and during the erasure, their
ratios, and how long the erasure took.

Usage::

    python benchmarks/erasure_bench.py [URL] [--size MB] [--quick]

URL defaults to ``$NOUS_SESSION_TEST_POSTGRES``. ``--quick``: 20 MB and short windows, a smoke
run. The schema it makes is dropped afterwards. ``make bench`` runs it through the
``erasure`` suite (benchmarks/suites/erasure.py) when PostgreSQL is available.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from nous_session import Encryption, LocalKeyFile  # noqa: E402
from nous_session.event import EventType, make_event  # noqa: E402

URL_ENV = "NOUS_SESSION_TEST_POSTGRES"
APPENDERS = 200
RECORD_BYTES = 1_000  # the bulk rows' content, about what a long chat message holds


def fill(url: str, schema: str, megabytes: int) -> int:
    """Fill the events table with about ``megabytes`` MB of other sessions' events; the
    number of rows."""
    import psycopg

    rows = max(1, megabytes * 1_000_000 // (RECORD_BYTES + 130))  # with row and index overhead
    per_session = 1_000
    sessions = (rows + per_session - 1) // per_session
    micros = int(datetime(2025, 1, 1, tzinfo=UTC).timestamp() * 1_000_000)
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute(
            f"INSERT INTO {schema}.nous_sessions (name, count)"
            f" SELECT 'bulk-' || i, {per_session} FROM generate_series(0, %s::bigint) i",
            (sessions - 1,),
        )
        step = 100_000
        for first in range(0, rows, step):
            connection.execute(
                f"INSERT INTO {schema}.nous_events (session, seq, record)"
                " SELECT 'bulk-' || (g / %(per)s), g %% %(per)s, convert_to('[1,' || (g %% %(per)s)"
                ' || \',"user_message",\' || %(micros)s || \',{"content":"\''
                " || md5(g::text) || repeat('x', %(pad)s::int) || '\"}]', 'UTF8')"
                " FROM generate_series(%(first)s::bigint, %(last)s::bigint) g",
                {
                    "per": per_session,
                    "micros": micros,
                    "pad": RECORD_BYTES - 32,
                    "first": first,
                    "last": min(rows, first + step) - 1,
                },
            )
        connection.execute(f"VACUUM ANALYZE {schema}.nous_events")
    return rows


def _summary(latencies: list[float]) -> dict[str, float]:
    ordered = sorted(latencies)
    if not ordered:
        return {"n": 0, "p50_ms": 0.0, "p99_ms": 0.0, "max_ms": 0.0}

    def at(fraction: float) -> float:
        return ordered[min(len(ordered) - 1, max(0, round(fraction * len(ordered)) - 1))] * 1e3

    return {
        "n": len(ordered),
        "p50_ms": at(0.5),
        "p99_ms": at(0.99),
        "max_ms": ordered[-1] * 1e3,
    }


async def side(store: Any, prefix: str, baseline: float, settle: float) -> dict[str, Any]:
    """One side: 200 appenders on ``store``; a baseline window, then one erasure of the
    target session's event; latencies of the commits in each window."""
    target = f"{prefix}-target"
    now = datetime.now(UTC)
    await store.commit(
        target,
        expected_count=0,
        events=[
            make_event(seq, EventType.USER_MESSAGE, {"content": f"target {seq} SECRET"}, now)
            for seq in range(20)
        ],
    )
    samples: list[tuple[float, float]] = []  # (start, latency)
    stop = anyio.Event()
    counts = [0] * APPENDERS

    async def append(index: int) -> None:
        name = f"{prefix}-other-{index}"
        while not stop.is_set():
            event = make_event(
                counts[index], EventType.USER_MESSAGE, {"content": f"{name} {counts[index]}"}, now
            )
            began = time.perf_counter()
            await store.commit(name, expected_count=counts[index], events=[event])
            samples.append((began, time.perf_counter() - began))
            counts[index] += 1

    async with anyio.create_task_group() as group:
        for index in range(APPENDERS):
            group.start_soon(append, index)
        await anyio.sleep(settle)  # every appender has committed: their rows exist
        base_from = time.perf_counter()
        await anyio.sleep(baseline)
        base_to = erase_from = time.perf_counter()
        result = await store.erase(target, [7], reason="benchmark")
        erase_to = time.perf_counter()
        await anyio.sleep(0.2)
        stop.set()
    if not result.proven:
        raise RuntimeError(f"{prefix}: the erasure was not proven: {result.detail}")
    loaded = await store.load(target)
    if "SECRET" in str(loaded[7].data) or len(loaded) != 20:
        raise RuntimeError(f"{prefix}: the erasure did not happen")
    for index in (0, APPENDERS - 1):
        held = await store.load(f"{prefix}-other-{index}")
        if len(held) != counts[index]:
            raise RuntimeError(f"{prefix}: appender {index} lost commits")

    def within(low: float, high: float) -> list[float]:
        # A commit counts for a window when it was waiting at any moment of it.
        return [latency for began, latency in samples if began < high and began + latency > low]

    baseline_stats = _summary(within(base_from, base_to))
    during = _summary(within(erase_from, erase_to))
    return {
        "erase_seconds": erase_to - erase_from,
        "detail": result.detail,
        "baseline": baseline_stats,
        "during": during,
        "ratios": {
            key: (during[key] / baseline_stats[key] if baseline_stats[key] else float("nan"))
            for key in ("p50_ms", "p99_ms", "max_ms")
        },
        "commits": sum(counts),
    }


async def compare(url: str, megabytes: int, quick: bool = False) -> dict[str, Any]:
    """Fill a fresh schema, run both sides in it, drop it; the figures of both sides."""
    import psycopg

    from nous_session.stores.postgres import PostgresStore

    schema = f"bench_erasure_{uuid.uuid4().hex[:8]}"
    folder = Path(tempfile.mkdtemp(prefix="nous-erasure-"))
    encryption = Encryption(LocalKeyFile.create(folder / "master.key"))
    baseline, settle = (1.0, 1.0) if quick else (5.0, 3.0)
    try:
        async with PostgresStore(url, schema=schema) as plain:
            await plain.sessions()  # creates the schema
            started = time.perf_counter()
            rows = await anyio.to_thread.run_sync(fill, url, schema, megabytes)
            filled = time.perf_counter() - started
            with psycopg.connect(url) as connection:
                found = connection.execute(
                    "SELECT pg_total_relation_size(%s)", (f"{schema}.nous_events",)
                ).fetchone()
            size = int(found[0]) if found else 0
            crypto = None
            async with PostgresStore(url, schema=schema, encryption=encryption) as sealed:
                crypto = await side(sealed, "crypto", baseline, settle)
            rewrite = await side(plain, "plain", baseline, settle)
        return {
            "bulk_rows": rows,
            "events_table_bytes": size,
            "fill_seconds": filled,
            "appenders": APPENDERS,
            "plain_rewrite": rewrite,
            "crypto_erasure": crypto,
        }
    finally:
        with psycopg.connect(url, autocommit=True) as connection:
            connection.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        shutil.rmtree(folder, ignore_errors=True)


def _print(figures: dict[str, Any]) -> None:
    print(
        f"events table: {figures['events_table_bytes'] / 1e9:.2f} GB"
        f" ({figures['bulk_rows']:,} bulk rows, filled in {figures['fill_seconds']:.0f} s);"
        f" {figures['appenders']} appenders"
    )
    header = (
        f"{'':16} {'erase s':>8} {'window':>8} {'n':>7} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>9}"
    )
    print(header)
    for name in ("plain_rewrite", "crypto_erasure"):
        side_figures = figures[name]
        for window in ("baseline", "during"):
            stats = side_figures[window]
            print(
                f"{name if window == 'baseline' else '':16}"
                f" {side_figures['erase_seconds'] if window == 'during' else 0:8.2f}"
                f" {window:>8} {stats['n']:7d} {stats['p50_ms']:8.1f} {stats['p99_ms']:8.1f}"
                f" {stats['max_ms']:9.1f}"
            )
        ratios = side_figures["ratios"]
        print(
            f"{'':16} during/baseline: p50 {ratios['p50_ms']:.2f}x, p99 {ratios['p99_ms']:.2f}x,"
            f" max {ratios['max_ms']:.2f}x"
        )
    for name in ("plain_rewrite", "crypto_erasure"):
        print(f"{name}: {figures[name]['detail']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("url", nargs="?", default=os.environ.get(URL_ENV))
    parser.add_argument("--size", type=int, default=1024, help="MB of other sessions' events")
    parser.add_argument("--quick", action="store_true", help="20 MB, short windows")
    arguments = parser.parse_args(argv)
    if not arguments.url:
        print(f"no PostgreSQL URL: pass one or set {URL_ENV}", file=sys.stderr)
        return 2
    size = 20 if arguments.quick else arguments.size
    figures = anyio.run(compare, arguments.url, size, arguments.quick)
    _print(figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
