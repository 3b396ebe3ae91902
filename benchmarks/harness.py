"""The benchmark harness: measurements, targets, interleaved rounds, machine info, reports.

A *suite* is a module in :mod:`benchmarks.suites` with a ``BENCHMARKS`` list. A *benchmark* is
a plain function ``bench(ctx: Context) -> list[Measurement]``; its name is the suite's name and
the function's name (``log.append``). Each benchmark checks its own results with
:func:`expect`, so a number never comes from a broken run.

Comparisons are measured side by side in one run: :func:`interleave` (or :func:`ainterleave`)
alternates the sides round by round, and :func:`ratio` reports the median of the per-round
paired ratios, which cancels most of the drift of a noisy, shared machine.
"""

from __future__ import annotations

import datetime as dt
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


class BenchmarkError(Exception):
    """A benchmark's own correctness check failed: its numbers must not be used."""


def expect(condition: object, message: str) -> None:
    """Fail the benchmark (not just skip a line) when ``condition`` is false."""
    if not condition:
        raise BenchmarkError(message)


@dataclass(frozen=True)
class Target:
    """A goal for a measurement's median: ``median <op> threshold``."""

    op: str  # "<=" or ">="
    threshold: float
    source: str = ""  # where the goal comes from, e.g. "issue 2"

    def met(self, value: float) -> bool:
        if self.op == "<=":
            return value <= self.threshold
        if self.op == ">=":
            return value >= self.threshold
        raise ValueError(f"unknown target op {self.op!r}")

    def __str__(self) -> str:
        return f"{self.op} {self.threshold:g}"


@dataclass
class Measurement:
    """One reported figure: every round's sample, summarised by median, min and max."""

    name: str
    unit: str
    samples: list[float]
    target: Target | None = None
    informational: bool = False  # a target shown for information, not a goal of this run
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def min(self) -> float:
        return min(self.samples)

    @property
    def max(self) -> float:
        return max(self.samples)

    @property
    def rounds(self) -> int:
        return len(self.samples)

    @property
    def is_ratio(self) -> bool:
        return self.unit == "x"

    @property
    def met(self) -> bool | None:
        return None if self.target is None else self.target.met(self.median)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "unit": self.unit,
            "median": self.median,
            "min": self.min,
            "max": self.max,
            "rounds": self.rounds,
        }
        if self.target is not None:
            out["target"] = {
                "op": self.target.op,
                "threshold": self.target.threshold,
                "source": self.target.source,
                "informational": self.informational,
            }
            out["ratio"] = self.median if self.is_ratio else None
            if not self.is_ratio:
                out["of_target"] = self.median / self.target.threshold
            out["met"] = self.met
        if self.note:
            out["note"] = self.note
        out.update(self.extra)
        out["samples"] = self.samples
        return out


def measure(
    name: str,
    unit: str,
    samples: Sequence[float],
    *,
    target: Target | None = None,
    informational: bool = False,
    note: str = "",
    **extra: Any,
) -> Measurement:
    """A measurement from per-round samples (at least one)."""
    expect(len(samples) > 0, f"{name}: no samples")
    return Measurement(name, unit, list(samples), target, informational, note, dict(extra))


def ratio(
    name: str,
    numerator: Sequence[float],
    denominator: Sequence[float],
    *,
    target: Target | None = None,
    informational: bool = False,
    note: str = "",
) -> Measurement:
    """The per-round paired ratios ``numerator[i] / denominator[i]`` (sides of one round).

    The median of paired ratios is reported; the ratio of the two medians is kept as
    ``ratio_of_medians`` in the JSON for comparison.
    """
    expect(len(numerator) == len(denominator) > 0, f"{name}: unpaired samples")
    expect(all(d > 0 for d in denominator), f"{name}: a zero denominator")
    pairs = [n / d for n, d in zip(numerator, denominator, strict=True)]
    return measure(
        name,
        "x",
        pairs,
        target=target,
        informational=informational,
        note=note,
        ratio_of_medians=statistics.median(numerator) / statistics.median(denominator),
    )


def percentile(sorted_values: Sequence[float], fraction: float) -> float:
    """The nearest-rank percentile of already sorted values (``fraction`` in [0, 1])."""
    expect(len(sorted_values) > 0, "percentile of nothing")
    index = min(len(sorted_values) - 1, max(0, round(fraction * len(sorted_values)) - 1))
    return sorted_values[index]


@dataclass(frozen=True)
class Context:
    """What a benchmark may ask of the run."""

    rounds: int
    quick: bool
    full_load: bool = False  # the load benchmarks (web) at their full size

    def size(self, full: int, quick: int) -> int:
        """A workload size: ``full`` normally, ``quick`` under ``--quick``."""
        return quick if self.quick else full


def _order(names: list[str], round_index: int) -> list[str]:
    # Alternate the order every round, so neither side always runs on a warmer (or colder)
    # machine than the other.
    return names if round_index % 2 == 0 else names[::-1]


def interleave(rounds: int, sides: Mapping[str, Callable[[], float]]) -> dict[str, list[float]]:
    """Run every side once per round, alternating the order; one sample per side per round."""
    names = list(sides)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for round_index in range(rounds):
        for name in _order(names, round_index):
            gc.collect()
            samples[name].append(sides[name]())
    return samples


async def ainterleave(
    rounds: int, sides: Mapping[str, Callable[[], Awaitable[float]]]
) -> dict[str, list[float]]:
    """:func:`interleave` for async sides (run inside one event loop)."""
    names = list(sides)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for round_index in range(rounds):
        for name in _order(names, round_index):
            gc.collect()
            samples[name].append(await sides[name]())
    return samples


@dataclass(frozen=True)
class Side:
    """One side of a sliced comparison.

    ``run()`` returns a generator: it sets up (untimed) and yields ``None`` once, then runs one
    timed slice per ``next()`` and yields that slice's elapsed seconds, ``slices`` times; after
    the last slice it checks its results (``expect``) and returns.
    """

    run: Callable[[], Iterator[float | None]]
    slices: int


@dataclass(frozen=True)
class AsyncSide:
    """:class:`Side` for async generators (run inside one event loop)."""

    run: Callable[[], AsyncIterator[float | None]]
    slices: int


def slice_schedule(slices: Mapping[str, int], round_index: int) -> list[str]:
    """The order of one round's slices: every side spread evenly over the round.

    The next slice is always the side least far along (by the middle of its next slice), so a
    side with 10 short slices runs 5 of them before and 5 after another side's single long one:
    both sample the same stretch of machine speed. Ties alternate with the round.
    """
    names = _order(list(slices), round_index)
    done = dict.fromkeys(names, 0)
    order = []
    for _ in range(sum(slices.values())):
        name = min(
            (n for n in names if done[n] < slices[n]),
            key=lambda n: (done[n] + 0.5) / slices[n],
        )
        done[name] += 1
        order.append(name)
    return order


def interleave_slices(rounds: int, sides: Mapping[str, Side]) -> dict[str, list[float]]:
    """Interleave the sides slice by slice within each round; per round, each side's seconds.

    This machine's speed drifts on a scale of milliseconds, so alternating whole runs is not
    enough: slicing each side into ~1 ms pieces and alternating those makes both sides see the
    same machine.
    """
    samples: dict[str, list[float]] = {name: [] for name in sides}
    for round_index in range(rounds):
        runs = {name: side.run() for name, side in sides.items()}
        for name, generator in runs.items():
            expect(next(generator) is None, f"{name}: the setup must yield None")
        gc.collect()
        totals = dict.fromkeys(sides, 0.0)
        order = slice_schedule({n: s.slices for n, s in sides.items()}, round_index)
        for name in order:
            elapsed = next(runs[name])
            expect(elapsed is not None, f"{name}: a slice must yield its elapsed seconds")
            totals[name] += elapsed  # type: ignore[operator]
        for name, generator in runs.items():
            expect(next(generator, _END) is _END, f"{name}: yielded more than its slices")
            samples[name].append(totals[name])
    return samples


async def ainterleave_slices(rounds: int, sides: Mapping[str, AsyncSide]) -> dict[str, list[float]]:
    """:func:`interleave_slices` for async sides (run inside one event loop)."""
    samples: dict[str, list[float]] = {name: [] for name in sides}
    for round_index in range(rounds):
        runs = {name: side.run() for name, side in sides.items()}
        for name, generator in runs.items():
            expect(await anext(generator) is None, f"{name}: the setup must yield None")
        gc.collect()
        totals = dict.fromkeys(sides, 0.0)
        order = slice_schedule({n: s.slices for n, s in sides.items()}, round_index)
        for name in order:
            elapsed = await anext(runs[name])
            expect(elapsed is not None, f"{name}: a slice must yield its elapsed seconds")
            totals[name] += elapsed  # type: ignore[operator]
        for name, generator in runs.items():
            expect(await anext(generator, _END) is _END, f"{name}: yielded more than its slices")
            samples[name].append(totals[name])
    return samples


_END: Any = object()


# Machine and run information -------------------------------------------------------------------


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _git_commit() -> str | None:
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "nous_session"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return f"{commit}{' (nous_session modified)' if dirty else ''}"


def machine_info() -> dict[str, Any]:
    """What the numbers were measured on."""
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    return {
        "cpu_model": _cpu_model(),
        "cores": os.cpu_count(),
        "usable_cores": usable,
        "python": sys.version.split()[0],
        "python_implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "nous_session_commit": _git_commit(),
    }


# Reports --------------------------------------------------------------------------------------


def format_value(value: float) -> str:
    """A figure with about four significant digits, without scientific notation."""
    magnitude = abs(value)
    if magnitude >= 10_000:
        return f"{value:,.0f}"
    if magnitude >= 100:
        return f"{value:.1f}"
    if magnitude >= 10:
        return f"{value:.2f}"
    if magnitude >= 1:
        return f"{value:.3f}"
    return f"{value:.4f}"


def _verdict(measurement: Measurement) -> str:
    met = measurement.met
    if met is None:
        return ""
    word = "met" if met else "MISSED"
    return f"({word}, info)" if measurement.informational else word


def table_rows(measurements: Sequence[Measurement]) -> list[list[str]]:
    """Header and one row per measurement, as strings."""
    rows = [["benchmark", "median", "min", "max", "unit", "rounds", "target", "result"]]
    for m in measurements:
        rows.append(
            [
                m.name,
                format_value(m.median),
                format_value(m.min),
                format_value(m.max),
                m.unit,
                str(m.rounds),
                "" if m.target is None else str(m.target),
                _verdict(m),
            ]
        )
    return rows


def text_table(measurements: Sequence[Measurement]) -> str:
    """A fixed-width table for the terminal."""
    rows = table_rows(measurements)
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    right = {1, 2, 3, 5}
    lines = []
    for index, row in enumerate(rows):
        cells = [
            cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
            for i, cell in enumerate(row)
        ]
        lines.append("  ".join(cells).rstrip())
        if index == 0:
            lines.append("  ".join("-" * width for width in widths))
    return "\n".join(lines)


def markdown_report(
    measurements: Sequence[Measurement],
    machine: Mapping[str, Any],
    run: Mapping[str, Any],
    errors: Sequence[Mapping[str, str]],
) -> str:
    """The markdown table, with the machine and the command that produced it."""
    rows = table_rows(measurements)
    lines = [
        "# nous_session benchmarks",
        "",
        f"`{run['command']}` on {machine['date']}, {run['duration_s']:.0f} s.",
        "",
        f"Machine: {machine['cpu_model']}, {machine['usable_cores']} usable cores "
        f"({machine['cores']} in total), Python {machine['python']} "
        f"({machine['python_implementation']}), {machine['platform']}; "
        f"nous_session {machine['nous_session_commit']}.",
        "",
        "Each figure is the median of its rounds, with min and max. A ratio (unit `x`) is the "
        "median of per-round ratios of two sides measured alternately in the same run. "
        "`info` marks a target shown for information only.",
        "",
        "| " + " | ".join(rows[0]) + " |",
        "|" + "|".join("---:" if i in (1, 2, 3, 5) else "---" for i in range(len(rows[0]))) + "|",
    ]
    lines.extend("| " + " | ".join(row) + " |" for row in rows[1:])
    notes = [m for m in measurements if m.note]
    if notes:
        lines += ["", "Notes:", ""]
        lines += [f"* `{m.name}`: {m.note}" for m in notes]
    if run.get("quick") or run["rounds"] < 10:
        lines += ["", f"A {run['rounds']}-round run: a smoke test, not figures to quote."]
    if errors:
        lines += ["", "Failed benchmarks (no figures reported for them):", ""]
        lines += [f"* `{e['benchmark']}`: {e['error']}" for e in errors]
    return "\n".join(lines) + "\n"


def write_markdown(path: Path, text: str) -> None:
    """Write a standalone benchmark script's report to ``path`` (its folder made as needed)
    and print it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    print("\n" + text)


def write_reports(
    directory: Path,
    measurements: Sequence[Measurement],
    machine: Mapping[str, Any],
    run: Mapping[str, Any],
    errors: Sequence[Mapping[str, str]],
) -> tuple[Path, Path]:
    """Write ``latest.json`` and ``latest.md`` into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    json_path = directory / "latest.json"
    md_path = directory / "latest.md"
    document = {
        "machine": dict(machine),
        "run": dict(run),
        "measurements": [m.to_json() for m in measurements],
        "errors": list(errors),
    }
    json_path.write_text(json.dumps(document, indent=2) + "\n")
    md_path.write_text(markdown_report(measurements, machine, run, errors))
    return json_path, md_path
