"""The engine suite's workloads on two copies of the library, side by side (a diagnostic).

Usage::

    python benchmarks/engine_compare.py OLD_ROOT NEW_ROOT [--rounds 5] [--many 10000]

Each measurement runs in a fresh process with ``OLD_ROOT`` or ``NEW_ROOT`` first on
``sys.path`` (so that copy's ``nous_session`` is imported); rounds alternate old/new and
nested/flat. Prints a Markdown table of medians (and min-max) and the new/old ratios of the
round medians.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

SUITE = Path(__file__).resolve().parent / "suites" / "engine.py"

CHILD = """
import importlib.util, json, logging, sys
import anyio, structlog
structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.INFO))
spec = importlib.util.spec_from_file_location("engine_suite", {suite!r})
suite = importlib.util.module_from_spec(spec)
spec.loader.exec_module(suite)
kind, count = {kind!r}, {count}
if kind in ("nested", "flat"):
    cpu, gc = anyio.run(suite._round_trip, count, kind == "flat", backend="asyncio")
    print(json.dumps({{"cpu": cpu, "gc": gc}}))
else:
    import tempfile
    from pathlib import Path
    from nous_session.stores.sqlite import SQLiteStore
    way = suite._through_actors if kind == "actors" else suite._through_registry
    async def one(path):
        async with SQLiteStore(path) as store:
            return await way(store, count, {{"content": suite.content(1)}})
    with tempfile.TemporaryDirectory() as directory:
        print(json.dumps({{"rate": anyio.run(one, Path(directory) / "s.sqlite3")}}))
"""


def _run(root: str, kind: str, count: int) -> dict[str, float]:
    code = CHILD.format(suite=str(SUITE), kind=kind, count=count)
    output = subprocess.run(
        [sys.executable, "-c", code],
        env={"PYTHONPATH": root, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
        cwd=root,
    ).stdout
    return json.loads(output.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("old")
    parser.add_argument("new")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--many", type=int, default=10_000)
    parser.add_argument(
        "--many-rounds", type=int, default=None, help="rounds with --many sessions (default all)"
    )
    args = parser.parse_args()
    cases = [
        ("nested", 200),
        ("flat", 200),
        ("nested", args.many),
        ("flat", args.many),
        ("actors", 200),
        ("registry", 200),
    ]
    samples: dict[tuple[str, str, int, str], list[float]] = {}
    for index in range(args.rounds):
        sides = [("old", args.old), ("new", args.new)]
        for side, root in sides if index % 2 == 0 else sides[::-1]:
            for kind, count in cases if index % 2 == 0 else cases[::-1]:
                if count == args.many and index >= (args.many_rounds or args.rounds):
                    continue
                for key, value in _run(root, kind, count).items():
                    samples.setdefault((side, kind, count, key), []).append(value)
        print(f"round {index + 1} done", file=sys.stderr, flush=True)

    def cell(values: list[float]) -> str:
        return f"{statistics.median(values):,.1f} ({min(values):,.1f}-{max(values):,.1f})"

    print("| workload | measure | old | new | new / old |")
    print("|---|---|---|---|---|")
    for kind, count in cases:
        for key in ("cpu", "gc", "rate"):
            old = samples.get(("old", kind, count, key))
            new = samples.get(("new", kind, count, key))
            if old is None or new is None:
                continue
            unit = {"cpu": "loop CPU us/append", "gc": "of which GC", "rate": "appends/s"}[key]
            change = statistics.median(new) / statistics.median(old) if min(old) else 0.0
            print(f"| {kind} x{count:,} | {unit} | {cell(old)} | {cell(new)} | {change:.2f}x |")
    for side in ("old", "new"):
        for count in (200, args.many):
            nested = samples[(side, "nested", count, "cpu")]
            flat = samples[(side, "flat", count, "cpu")]
            pairs = [n / f for n, f in zip(nested, flat, strict=True)]
            print(f"| {side}: nested / flat x{count:,} | ratio | {statistics.median(pairs):.2f} |")
        few = samples[(side, "nested", 200, "cpu")]
        many = samples[(side, "nested", args.many, "cpu")]
        pairs = [m / f for m, f in zip(many, few[: len(many)], strict=True)]
        median = statistics.median(pairs)
        print(f"| {side}: x{args.many:,} / x200 (nested) | ratio | {median:.2f} |")


if __name__ == "__main__":
    main()
