"""Compare two source trees (say ``main``'s worktree and a branch's) on the same benchmarks,
side by side in one run: each round runs every benchmark once from each tree, in a process of
its own, the trees taking turns first. Reports each figure's median per tree and the median of
the per-round ratios (B over A).

Usage::

    python benchmarks/trees.py /path/to/tree-a /path/to/tree-b --rounds 5 \\
        --only actor.round_trip registry.per_call_memory

Each tree runs its own ``benchmarks/run.py`` with its own package first on ``sys.path``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def _run(tree: Path, only: list[str]) -> dict[str, tuple[float, str]]:
    """One round of ``only`` from ``tree``: each measurement's median and unit, by name."""
    with tempfile.TemporaryDirectory() as output:
        env = dict(os.environ, PYTHONPATH=str(tree))
        command = [sys.executable, "benchmarks/run.py", "--rounds", "1", "--output", output]
        subprocess.run(
            [*command, "--only", *only],
            cwd=tree,
            env=env,
            check=True,
            stdout=subprocess.DEVNULL,
        )
        report = json.loads((Path(output) / "latest.json").read_text())
    return {m["name"]: (m["median"], m["unit"]) for m in report["measurements"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("a", type=Path, help="tree A (before)")
    parser.add_argument("b", type=Path, help="tree B (after)")
    parser.add_argument("--only", nargs="+", required=True, help="benchmarks, as run.py takes")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    samples: dict[str, dict[str, list[float]]] = {}
    units: dict[str, str] = {}
    for round_index in range(args.rounds):
        trees = [("a", args.a), ("b", args.b)]
        if round_index % 2:
            trees.reverse()
        for side, tree in trees:
            for name, (value, unit) in _run(tree.resolve(), args.only).items():
                samples.setdefault(name, {"a": [], "b": []})[side].append(value)
                units[name] = unit
        print(f"round {round_index + 1} of {args.rounds} done", file=sys.stderr)
    print(f"| measurement | unit | A: {args.a} | B: {args.b} | B / A (per-round ratios) |")
    print("|---|---|---:|---:|---:|")
    for name, sides in samples.items():
        a, b = sides["a"], sides["b"]
        if len(a) != len(b) or not a:
            continue  # measured by one tree only
        ratios = [y / x for x, y in zip(a, b, strict=True) if x]
        ratio = (
            f"{statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})"
            if ratios
            else "-"
        )
        print(
            f"| {name} | {units[name]} | {statistics.median(a):,.4g} | "
            f"{statistics.median(b):,.4g} | {ratio} |"
        )


if __name__ == "__main__":
    main()
