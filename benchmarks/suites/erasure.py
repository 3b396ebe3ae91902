"""Suite "erasure": what erasing one event costs the other sessions of a PostgreSQL store,
plain rewrite (``VACUUM FULL``) against crypto-erasure, side by side in one run (see
benchmarks/erasure_bench.py; runs only when ``NOUS_SESSION_TEST_POSTGRES`` names a server).

Full run: a 1 GB events table of other sessions' events (``--quick``: 20 MB), 200 sessions
appending all the while. Reported per side: the erasure's duration, and the other sessions'
append latency during it against a baseline window before it (p50, p99, max, as ratios).
"""

from __future__ import annotations

import os

import anyio

from benchmarks.erasure_bench import URL_ENV, compare
from benchmarks.harness import Context, Measurement, expect, measure


def vacuum_full_vs_crypto(ctx: Context) -> list[Measurement]:
    """One erasure per side, 200 appenders on a 1 GB table (20 MB with --quick)."""
    url = os.environ.get(URL_ENV)
    if not url:
        print(f"   skipped: no PostgreSQL server (set {URL_ENV}; `. .ci/postgres`)", flush=True)
        return []
    try:
        import psycopg  # noqa: F401
    except ImportError:
        print("   skipped: psycopg is not installed (pip install 'nous_session[postgres]')")
        return []
    megabytes = ctx.size(1024, 20)
    figures = anyio.run(compare, url, megabytes, ctx.quick)
    size = figures["events_table_bytes"]
    out: list[Measurement] = []
    for name in ("plain_rewrite", "crypto_erasure"):
        side = figures[name]
        expect(side["during"]["n"] > 0, f"{name}: no commit overlapped the erasure")
        note = f"events table {size / 1e9:.2f} GB, {figures['appenders']} appenders"
        out.append(measure(f"erasure.{name}.seconds", "s", [side["erase_seconds"]], note=note))
        for key in ("p50_ms", "p99_ms", "max_ms"):
            out.append(measure(f"erasure.{name}.baseline_{key}", "ms", [side["baseline"][key]]))
            out.append(measure(f"erasure.{name}.during_{key}", "ms", [side["during"][key]]))
            out.append(
                measure(
                    f"erasure.{name}.{key.removesuffix('_ms')}_during_vs_baseline",
                    "x",
                    [side["ratios"][key]],
                )
            )
    return out


BENCHMARKS = [vacuum_full_vs_crypto]
