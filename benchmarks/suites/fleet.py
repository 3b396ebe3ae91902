"""Suite "fleet": the fleet soak (issue 33, :mod:`benchmarks.fleet`) for 1 and 4 worker processes.

Each round runs the soak once with 1 worker and once with 4 (the order alternating), every run
on a fresh store: 200 sessions, 2,000 turns (``--quick``: 20 and 200), each turn a user message
appended through a worker's ``Sessions`` registry with compaction on and a counting summarizer,
one worker killed with SIGKILL about 40% through and started again. A run whose checks fail
(an acknowledged turn lost or doubled, a worker holding other events than the store, a session
that does not open, more than 1.1 summarizer calls per summary) fails the benchmark.

* ``sqlite``: one SQLite file.
* ``postgres``: one PostgreSQL schema, when ``NOUS_SESSION_TEST_POSTGRES`` names a server (any
  URL: PgBouncer's too); the server is also restarted about 60% through when
  ``NOUS_SESSION_TEST_PG_RESTART`` holds a shell command that does so.

Reported per worker count: turns acknowledged per second (first send to last ack, the kill and
restart included), the p50 and p99 append latency inside the workers, and summarizer calls per
committed summary.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from benchmarks.fleet import MAX_CALLS_PER_SUMMARY, FleetOptions, FleetResult, run_fleet
from benchmarks.fleet_worker import EVERY
from benchmarks.harness import Context, Measurement, Target, expect, measure

ISSUE = "issue 33"
URL_ENV = "NOUS_SESSION_TEST_POSTGRES"
RESTART_ENV = "NOUS_SESSION_TEST_PG_RESTART"
WORKER_COUNTS = (1, 4)
MAX_ROUNDS = 3  # a run of 2,000 turns takes seconds to tens of seconds on a busy machine


def _options(ctx: Context) -> FleetOptions:
    return FleetOptions(
        sessions=ctx.size(200, 20),
        turns=ctx.size(2_000, 200),
        kill=True,
        restart=os.environ.get(RESTART_ENV) or None,
    )


def _rounds(ctx: Context, store_url: Callable[[], Iterator[str]], label: str) -> list[Measurement]:
    """Every round's runs, checked, as measurements named ``fleet.<label>.*``."""
    options = _options(ctx)
    samples: dict[str, list[float]] = defaultdict(list)
    for round_index in range(min(ctx.rounds, MAX_ROUNDS)):
        order = WORKER_COUNTS if round_index % 2 == 0 else WORKER_COUNTS[::-1]
        for workers in order:
            with contextmanager(store_url)() as url:
                result = run_fleet(url, options, workers=workers)
            _check(result)
            samples[f"rate_{workers}"].append(result.throughput)
            samples[f"p50_{workers}"].append(result.p50_ms)
            samples[f"p99_{workers}"].append(result.p99_ms)
            samples[f"calls_{workers}"].append(result.calls_per_summary)
    what = (
        f"{options.sessions} sessions, {options.turns} turns each routed to a random worker "
        f"process (up to {options.depth} in flight per worker), compaction every "
        f"{EVERY} messages with a {options.summary_delay * 1e3:g} ms counting summarizer, one "
        "worker SIGKILLed at 40% and restarted"
        + (", the server restarted at 60%" if options.restart else "")
    )
    measurements = []
    for workers in WORKER_COUNTS:
        name = f"fleet.{label}.{workers}_worker{'s' if workers > 1 else ''}"
        measurements += [
            measure(
                f"{name}.rate",
                "turns/s",
                samples[f"rate_{workers}"],
                note=f"{what}; acknowledged turns / (last ack - first send)",
            ),
            measure(
                f"{name}.latency_p50",
                "ms",
                samples[f"p50_{workers}"],
                note="append latency inside the worker: from reading the turn to its commit",
            ),
            measure(f"{name}.latency_p99", "ms", samples[f"p99_{workers}"]),
            measure(
                f"{name}.calls_per_summary",
                "calls/summary",
                samples[f"calls_{workers}"],
                target=Target("<=", MAX_CALLS_PER_SUMMARY, ISSUE),
                note="summarizer calls (the killed worker's included) / summaries committed",
            ),
        ]
    return measurements


def _check(result: FleetResult) -> None:
    failures = "\n".join(result.failures)
    expect(
        not result.failures,
        f"the fleet soak's checks failed ({result.workers} workers):\n{failures}",
    )
    expect(result.summaries > 0, "no session was compacted: the soak did not test compaction")


def sqlite(ctx: Context) -> list[Measurement]:
    """The soak on one SQLite file, for 1 and 4 workers."""

    def fresh_file() -> Iterator[str]:
        with tempfile.TemporaryDirectory(prefix="bench-fleet-") as scratch:
            yield f"sqlite:///{Path(scratch) / 'fleet.sqlite3'}"

    return _rounds(ctx, fresh_file, "sqlite")


def postgres(ctx: Context) -> list[Measurement]:
    """The soak on one PostgreSQL schema, for 1 and 4 workers (when a server is given)."""
    url = os.environ.get(URL_ENV)
    if not url:
        print(f"   skipped: no PostgreSQL server. Set {URL_ENV}=postgresql://...", flush=True)
        return []
    try:
        import psycopg
    except ImportError:
        print("   skipped: psycopg is not installed (pip install 'nous_session[postgres]')")
        return []

    def fresh_schema() -> Iterator[str]:
        schema = f"bench_fleet_{uuid.uuid4().hex[:10]}"
        separator = "&" if "?" in url else "?"
        try:
            yield f"{url}{separator}schema={schema}"
        finally:
            with psycopg.connect(url, autocommit=True) as connection:
                connection.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")

    return _rounds(ctx, fresh_schema, "postgres")


BENCHMARKS = [sqlite, postgres]
