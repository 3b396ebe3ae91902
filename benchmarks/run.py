"""Run the nous_session benchmarks and write benchmarks/results/latest.{json,md}.

Usage::

    python benchmarks/run.py [--quick] [--only NAME ...] [--rounds N] [--strict] [--full-load]

``NAME`` is a suite (``log``, ``actor``), a benchmark (``log.append``), or a prefix of either.
``--quick`` shrinks workloads and rounds for a smoke run (well under a minute); its figures are
not for quoting. Figures to quote come from a full run (10 rounds by default).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import structlog

# The library logs every commit at debug level; filter at info, as a deployment would, before
# anything is imported that could log.
structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.INFO))

ROOT = Path(__file__).resolve().parent.parent
# Run as a script, sys.path[0] is benchmarks/ itself: import the harness as the package it is.
if sys.path and Path(sys.path[0]).resolve() == ROOT / "benchmarks":
    sys.path[0] = str(ROOT)
elif str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import argparse  # noqa: E402
import gc  # noqa: E402
import importlib  # noqa: E402
import shlex  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402

from benchmarks.harness import (  # noqa: E402
    BenchmarkError,
    Context,
    Measurement,
    machine_info,
    text_table,
    write_reports,
)
from benchmarks.suites import SUITES  # noqa: E402

Benchmark = Callable[[Context], list[Measurement]]
RESULTS = ROOT / "benchmarks" / "results"


def discover(only: Sequence[str] = ()) -> list[tuple[str, Benchmark]]:
    """The benchmarks of every suite ``only`` may name, in run order, with their full names."""
    wanted = {pattern.split(".", 1)[0] for pattern in only}
    found = []
    for suite in SUITES:
        if wanted and suite not in wanted:
            continue  # importing a suite builds nothing, but may need its optional extras
        module = importlib.import_module(f"benchmarks.suites.{suite}")
        found.extend((f"{suite}.{bench.__name__}", bench) for bench in module.BENCHMARKS)
    return found


def select(
    benchmarks: list[tuple[str, Benchmark]], only: Sequence[str]
) -> list[tuple[str, Benchmark]]:
    """The benchmarks named by ``--only`` (a suite, a benchmark, or a dotted prefix)."""
    if not only:
        return benchmarks

    def matches(name: str, pattern: str) -> bool:
        return name == pattern or name.startswith(pattern + ".") or pattern.startswith(name + ".")

    unknown = [p for p in only if not any(matches(name, p) for name, _ in benchmarks)]
    if unknown:
        names = ", ".join(SUITES)
        raise SystemExit(f"no benchmark matches {', '.join(unknown)}; known: {names}")
    return [(name, bench) for name, bench in benchmarks if any(matches(name, p) for p in only)]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="smaller workloads, 3 rounds")
    parser.add_argument("--only", nargs="+", default=[], metavar="NAME", help="suites/benchmarks")
    parser.add_argument("--rounds", type=int, help="rounds per measurement (default 10, quick 3)")
    parser.add_argument(
        "--strict", action="store_true", help="exit with status 2 when a target is missed"
    )
    parser.add_argument(
        "--full-load",
        action="store_true",
        help="the load benchmarks at full size (web: 1,000 SSE clients on 200 sessions)",
    )
    parser.add_argument(
        "--output", type=Path, default=RESULTS, help="directory for latest.json and latest.md"
    )
    args = parser.parse_args(argv)
    rounds = args.rounds if args.rounds is not None else (3 if args.quick else 10)
    if rounds < 1:
        parser.error("--rounds must be >= 1")
    ctx = Context(rounds=rounds, quick=args.quick, full_load=args.full_load)
    chosen = select(discover(args.only), args.only)

    machine = machine_info()
    print(
        f"nous_session benchmarks: {len(chosen)} benchmarks, {rounds} rounds"
        f"{' (quick)' if args.quick else ''}; {machine['cpu_model']}, "
        f"{machine['usable_cores']} cores, Python {machine['python']}",
        flush=True,
    )
    measurements: list[Measurement] = []
    errors: list[dict[str, str]] = []
    started = time.perf_counter()
    for name, bench in chosen:
        print(f"\n== {name}", flush=True)
        began = time.perf_counter()
        try:
            results = bench(ctx)
        except BenchmarkError as error:
            errors.append({"benchmark": name, "error": f"check failed: {error}"})
            print(f"   FAILED its own check: {error}", flush=True)
            continue
        except Exception as error:  # report and go on: one broken benchmark is not the run
            errors.append({"benchmark": name, "error": repr(error)})
            traceback.print_exc()
            continue
        finally:
            gc.collect()
        measurements.extend(results)
        print(text_table(results), flush=True)
        print(f"   ({time.perf_counter() - began:.1f} s)", flush=True)

    run = {
        "command": "python benchmarks/run.py"
        + ("" if argv is None and len(sys.argv) < 2 else " ")
        + shlex.join(sys.argv[1:] if argv is None else list(argv)),
        "quick": args.quick,
        "rounds": rounds,
        "duration_s": time.perf_counter() - started,
        "benchmarks": [name for name, _ in chosen],
    }
    run["command"] = run["command"].rstrip()
    json_path, md_path = write_reports(args.output, measurements, machine, run, errors)
    print(f"\n== all ({run['duration_s']:.0f} s)")
    print(text_table(measurements))
    for error in errors:
        print(f"FAILED {error['benchmark']}: {error['error']}")
    print(
        f"\nwrote {json_path.relative_to(ROOT) if json_path.is_relative_to(ROOT) else json_path}"
        f" and {md_path.name}"
    )
    if errors:
        return 1
    if args.strict and any(m.met is False and not m.informational for m in measurements):
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
