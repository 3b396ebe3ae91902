"""Suite "web": many SSE clients following many sessions on one server process
(``benchmarks/sse_clients.py``, which also runs alone).

* ``sse_clients_sqlite`` / ``sse_clients_postgres``: a server process (uvicorn,
  ``nous_session.web``) with a writer appending to every session once a second, and clients
  in another process following the sessions' streams, plus clients that never read. Delivery
  latency from the append to the client (p50, p99), the writer's commit latency (p50, p99),
  and the server's memory per client. PostgreSQL only when ``NOUS_SESSION_TEST_POSTGRES``
  names a server.

By default a small run (100 clients on 20 sessions for 5 s, 10 stuck); ``--full-load`` (on
``benchmarks/run.py``) runs the full size: 1,000 clients on 200 sessions for 20 s, 50 stuck.
One round each: the figures are percentiles over every event of the run.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from benchmarks import sse_clients
from benchmarks.harness import Context, Measurement, expect, measure

URL_ENV = "NOUS_SESSION_TEST_POSTGRES"
QUICK = (100, 20, 5.0, 10)


def _run(ctx: Context, store: str | None, label: str) -> list[Measurement]:
    clients, sessions, seconds, stuck = sse_clients.FULL if ctx.full_load else QUICK
    args = argparse.Namespace(
        store=store, clients=clients, sessions=sessions, seconds=seconds, stuck=stuck, interval=1.0
    )
    result = sse_clients.run(args)
    expect(result["events delivered"] > 0, "no event was delivered")
    size = f"{clients} clients (+{stuck} stuck), {sessions} sessions, {seconds:.0f} s, {label}"
    return [
        measure(f"{label} delivery p50", "ms", [result["p50 ms"]], note=size),
        measure(f"{label} delivery p99", "ms", [result["p99 ms"]], note=size),
        measure(f"{label} commit p50", "ms", [result["commit p50 ms"]], note="the writer's"),
        measure(f"{label} commit p99", "ms", [result["commit p99 ms"]], note="the writer's"),
        measure(f"{label} server memory per client", "KiB", [result["server KiB per client"]]),
    ]


def sse_clients_sqlite(ctx: Context) -> list[Measurement]:
    with tempfile.TemporaryDirectory() as directory:
        return _run(ctx, f"sqlite:///{Path(directory) / 'bench.sqlite3'}", "sqlite")


def sse_clients_postgres(ctx: Context) -> list[Measurement]:
    url = os.environ.get(URL_ENV)
    if not url:
        print(f"   skipped: no PostgreSQL server ({URL_ENV} is not set)")
        return []
    return _run(ctx, url, "postgres")


BENCHMARKS = [sse_clients_sqlite, sse_clients_postgres]
