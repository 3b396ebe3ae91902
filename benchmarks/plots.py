"""Draw the benchmark PNGs from ``benchmarks/results/peers.json`` (and ``latest.json``).

Usage::

    python benchmarks/plots.py [RESULTS_JSON ...] [--output DIR]

With no file named, both results files that exist are read, ``peers.json`` winning where a
measurement is in both.

Writes into ``benchmarks/results/`` (or ``DIR``):

* ``peers_throughput.png``: one panel per workload, one bar per system (median, min-max
  whiskers, log scale); a peer that lost acknowledged messages is hatched and says how many.
* ``peers_agent_loop.png``: the agent loop's per-iteration time against history length.
* ``scaling_curves.png``: our append / agent-loop / cold-fold costs against log length, log-log.
* ``scaling_fanout.png``: append rate and delivery latency against the number of subscribers.
* ``many_sessions.png``: sessions on one SQLite file, all at once: rate and events per
  transaction against the number of sessions (``make bench``'s suite ``many``), with the
  peers at 200 sessions where ``peers.sessions_at_once`` is in the results.

Needs matplotlib (the ``bench`` extra).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
SYSTEMS = ("ours", "openai-agents", "langgraph", "google-adk", "eventsourcing")
COLORS = {
    "ours": "#1b7837",
    "openai-agents": "#4575b4",
    "langgraph": "#d73027",
    "google-adk": "#fdae61",
    "eventsourcing": "#8073ac",
}


def _by_name(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["name"]: m for m in document["measurements"]}


def _label(value: float) -> str:
    if value >= 10_000:
        return f"{value / 1000:,.0f}k"
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2g}"


def _bars(
    axis: Any,
    data: dict[str, dict[str, Any]],
    prefix: str,
    title: str,
    unit: str,
    *,
    lower_is_better: bool = False,
    suffix: str = "",
) -> None:
    names = [s for s in SYSTEMS if f"{prefix}.{s}{suffix}" in data]
    if not names:
        axis.set_visible(False)
        return
    rows = [data[f"{prefix}.{s}{suffix}"] for s in names]
    medians = [r["median"] for r in rows]
    low = [r["median"] - r["min"] for r in rows]
    high = [r["max"] - r["median"] for r in rows]
    bars = axis.bar(
        range(len(names)),
        medians,
        yerr=[low, high],
        color=[COLORS[s] for s in names],
        capsize=3,
        edgecolor="black",
        linewidth=0.5,
    )
    for bar, name, row in zip(bars, names, rows, strict=True):
        text = _label(row["median"])
        lost = max(row.get("lost", [0]) or [0])
        if lost:
            bar.set_hatch("///")
            text += f"\nlost {lost:,}"
        axis.annotate(
            text,
            (bar.get_x() + bar.get_width() / 2, row["median"]),
            xytext=(0, 3),
            textcoords="offset points",
            ha="center",
            va="bottom",
            fontsize=7,
        )
        del name
    axis.set_yscale("log")
    axis.set_xticks(range(len(names)))
    axis.set_xticklabels(names, rotation=30, ha="right", fontsize=8)
    axis.set_ylabel(unit + ("  (lower is better)" if lower_is_better else "  (higher is better)"))
    axis.set_title(title, fontsize=9)
    top = max(r["max"] for r in rows)
    bottom = min(r["min"] for r in rows)
    axis.set_ylim(bottom / 3, top * 8)
    axis.grid(axis="y", which="major", alpha=0.3)


def throughput(data: dict[str, dict[str, Any]], path: Path) -> None:
    figure, axes = plt.subplots(2, 4, figsize=(17, 8.5))
    last = next((n for n in data if n.startswith("peers.agent_loop.ours.last_")), "_200")
    edge = int(last.rsplit("_", 1)[1])
    loop = f"W2: agent loop, per iteration, last {edge} of {edge * 10:,} (memory)"
    panels = [
        ("peers.sequential_memory", "W1: 10,000 sequential appends, memory", "msg/s", False, ""),
        (
            "peers.sequential_sqlite",
            "W1: 10,000 sequential appends, SQLite file",
            "msg/s",
            False,
            "",
        ),
        (
            "peers.concurrent",
            "W3: 50 producers x 200, one SQLite session",
            "acked msg/s",
            False,
            "",
        ),
        ("peers.many_sessions", "W4: 1,000 sessions x 20, one SQLite file", "msg/s", False, ""),
        ("peers.agent_loop", loop, "us/iter", True, f".last_{edge}"),
        ("peers.tail_memory", "W5: read the last 10 of 10,000, memory", "us/read", True, ""),
        ("peers.tail_sqlite", "W5: read the last 10 of 10,000, SQLite", "us/read", True, ""),
        ("peers.many_sessions", "W4: bytes on disk per message", "B/msg", True, ".bytes"),
    ]
    for axis, (prefix, title, unit, lower, suffix) in zip(axes.flat, panels, strict=True):
        _bars(axis, data, prefix, title, unit, lower_is_better=lower, suffix=suffix)
    figure.suptitle(
        "nous_session vs peers: medians of the rounds, whiskers min-max; hatched = lost "
        "acknowledged messages; peers time-boxed where their cost grows (see peers.md)",
        fontsize=10,
    )
    figure.tight_layout(rect=(0, 0, 1, 0.96))
    figure.savefig(path, dpi=110)
    plt.close(figure)


def agent_loop(data: dict[str, dict[str, Any]], path: Path) -> None:
    figure, axis = plt.subplots(figsize=(9, 5.5))
    for system in SYSTEMS:
        row = next(
            (m for n, m in data.items() if n.startswith(f"peers.agent_loop.{system}.first_")),
            None,
        )
        if row is None or "curve_us" not in row:
            continue
        width = row["curve_bin"]
        # A block a time-boxed peer skipped is NaN: the line breaks there instead of bridging.
        xs = [i * width + width / 2 for i in range(len(row["curve_us"]))]
        ys = [v if v else float("nan") for v in row["curve_us"]]
        axis.plot(xs, ys, marker="o", markersize=3, label=system, color=COLORS[system])
    axis.set_yscale("log")
    axis.set_xlabel("messages in the session (iteration)")
    axis.set_ylabel("us per iteration (append + read the history), log")
    axis.set_title(
        "W2: the agent loop, per-iteration time against history length (in memory)\n"
        "median over rounds of each 50-iteration block; gaps = blocks a time-boxed peer skipped",
        fontsize=10,
    )
    axis.grid(which="both", alpha=0.3)
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _series(data: dict[str, dict[str, Any]], curve: str) -> tuple[list[float], ...]:
    rows = sorted((m for m in data.values() if m.get("curve") == curve), key=lambda m: m["events"])
    scale = 1_000.0 if rows and rows[0]["unit"] == "ms" else 1.0
    xs = [m["events"] for m in rows]
    ys = [m["median"] * scale for m in rows]
    low = [(m["median"] - m["min"]) * scale for m in rows]
    high = [(m["max"] - m["median"]) * scale for m in rows]
    return xs, ys, low, high


def curves(data: dict[str, dict[str, Any]], path: Path) -> None:
    figure, axis = plt.subplots(figsize=(9, 6))
    for curve, label, color in (
        ("log_append", "Log.append", "#1b7837"),
        ("log_loop", "Log.append + derive_messages() (agent loop)", "#4575b4"),
        ("actor_loop", "SessionActor: add_message + messages()", "#8073ac"),
        ("log_fold", "cold fold: first derive_messages() (restore)", "#d73027"),
    ):
        xs, ys, low, high = _series(data, curve)
        if xs:
            axis.errorbar(xs, ys, yerr=[low, high], marker="o", capsize=3, label=label, color=color)
    axis.set_xscale("log")
    axis.set_yscale("log")
    axis.set_xlabel("events in the log")
    axis.set_ylabel("us per operation (log)")
    axis.set_title(
        "Our costs against log length: appends and the agent loop stay flat;\n"
        "only a cold fold (once, on restore) is linear. Median of rounds, whiskers min-max",
        fontsize=10,
    )
    axis.grid(which="both", alpha=0.3)
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def fanout(data: dict[str, dict[str, Any]], path: Path) -> None:
    counts = [n for n in (1, 100, 1_000) if f"scaling.fanout.{n}_subscribers.rate" in data]
    if not counts:
        return
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5))
    for axis, keys, unit in (
        (left, (("rate", "appends/s"), ("deliveries", "deliveries/s")), "per second"),
        (right, (("latency_p50", "p50"), ("latency_p99", "p99")), "ms, commit to receipt"),
    ):
        for key, label in keys:
            rows = [data[f"scaling.fanout.{n}_subscribers.{key}"] for n in counts]
            axis.errorbar(
                counts,
                [r["median"] for r in rows],
                yerr=[
                    [r["median"] - r["min"] for r in rows],
                    [r["max"] - r["median"] for r in rows],
                ],
                marker="o",
                capsize=3,
                label=label,
            )
        axis.set_xscale("log")
        axis.set_yscale("log")
        axis.set_xlabel("subscribers")
        axis.set_ylabel(unit)
        axis.grid(which="both", alpha=0.3)
        axis.legend(fontsize=8)
    left.set_title("fan-out: appends and deliveries per second", fontsize=10)
    right.set_title("fan-out: delivery latency", fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def many_sessions(data: dict[str, dict[str, Any]], path: Path) -> None:
    rows = sorted(
        (
            (int(name.rsplit("_", 1)[1]), m, data.get(name.replace("rate_", "per_transaction_")))
            for name, m in data.items()
            if name.startswith("many.sessions_sqlite.rate_")
        ),
        key=lambda row: row[0],
    )
    if not rows:
        return
    figure, axis = plt.subplots(figsize=(9, 7.5))
    xs = [count for count, _, _ in rows]
    ys = [m["median"] for _, m, _ in rows]
    low = [m["median"] - m["min"] for _, m, _ in rows]
    high = [m["max"] - m["median"] for _, m, _ in rows]
    axis.errorbar(
        xs,
        ys,
        yerr=[low, high],
        marker="o",
        capsize=3,
        color=COLORS["ours"],
        label="appends/s (left)",
    )
    for x, y in zip(xs, ys, strict=True):
        axis.annotate(_label(y), (x, y), textcoords="offset points", xytext=(6, 6), fontsize=8)
    # The peers at 200 sessions (suite peers, workload sessions_at_once), each with its own
    # defaults and durability.
    for offset, system in enumerate(SYSTEMS[1:]):
        peer = data.get(f"peers.sessions_at_once.{system}")
        if peer is None:
            continue
        x = 200 * (1.06 + 0.06 * offset)  # side by side on the log axis, not on top
        axis.errorbar(
            [x],
            [peer["median"]],
            yerr=[[peer["median"] - peer["min"]], [peer["max"] - peer["median"]]],
            marker="D",
            capsize=3,
            linestyle="none",
            color=COLORS[system],
            label=f"{system} at 200 sessions (its defaults)",
        )
        axis.annotate(
            _label(peer["median"]),
            (x, peer["median"]),
            textcoords="offset points",
            xytext=(5, -10),
            fontsize=7,
            color=COLORS[system],
        )
    axis.set_xscale("log")
    axis.set_xlabel("sessions on one SQLite file, each awaiting its own 20 appends, all at once")
    axis.set_ylabel("acknowledged appends per second (ours: synchronous=FULL)")
    axis.set_ylim(bottom=0)
    axis.grid(which="both", alpha=0.3)
    groups = [(count, per["median"]) for count, _, per in rows if per is not None]
    if groups:
        twin = axis.twinx()
        twin.plot(
            [g[0] for g in groups],
            [g[1] for g in groups],
            marker="s",
            linestyle="--",
            color="#777777",  # not a system's color: eventsourcing's purple is on this plot
            label="events per transaction (right)",
        )
        twin.set_yscale("log")
        twin.set_ylabel("events per transaction (one fsync each)")
        handles = axis.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
        # Below the axes: inside, it would hide the peers' points at the bottom left.
        axis.legend(
            handles=handles, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2
        )
    axis.set_title(
        "Group commit across sessions: one fsync serves hundreds of sessions' commits;\n"
        "the rate is bound by the CPU per append. Median of rounds, whiskers min-max",
        fontsize=10,
    )
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("results", nargs="*", type=Path)
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    files = args.results or [
        path for path in (RESULTS / "latest.json", RESULTS / "peers.json") if path.exists()
    ]
    data: dict[str, dict[str, Any]] = {}
    for results in files:  # later files win
        data.update(_by_name(json.loads(results.read_text())))
    args.output.mkdir(parents=True, exist_ok=True)
    written = []
    for name, draw in (
        ("peers_throughput.png", throughput),
        ("peers_agent_loop.png", agent_loop),
        ("scaling_curves.png", curves),
        ("scaling_fanout.png", fanout),
        ("many_sessions.png", many_sessions),
    ):
        target = args.output / name
        draw(data, target)
        if target.exists():
            written.append(target)
    for path in written:
        print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
