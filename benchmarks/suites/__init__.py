"""Benchmark suites: one module per area, each exposing ``BENCHMARKS``, a list of functions.

A benchmark is ``bench(ctx: Context) -> list[Measurement]``, named ``<suite>.<function>``.
To add a suite (stores, peers, ...), write ``benchmarks/suites/<name>.py`` with a
``BENCHMARKS`` list and add its name to :data:`SUITES`, in the order the run should take.
"""

from __future__ import annotations

SUITES: tuple[str, ...] = (
    "log",
    "actor",
    "telemetry",
    "stores",
    "history",
    "many",
    "engine",
    "registry",
    "server",
    "postgres",
    "encryption",
    "erasure",
    "listing",
    "followers",
    "scaling",
    "peers",
    "fleet",
    "web",
)
