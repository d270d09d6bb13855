"""Tables and a plot from ``benchmarks/cycle.py`` runs (issue 15).

``python -m benchmarks.cycle_report RUN.json ...`` where each file is a ``--json`` output
named ``<label>-<replicas>.json`` (label ``old`` or ``new``). Writes
``benchmarks/cycle_results.json`` (every run, raw per-cycle records left out),
``benchmarks/cycle.png`` (whole-cycle time and peak RSS against replicas, old and new) and
prints the Markdown tables that ``benchmarks/RESULTS.md`` quotes.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

HERE = Path(__file__).resolve().parent
FIGURES = (
    ("whole_cycle_s", "whole cycle, 1 % churn (s)"),
    ("nochange_cycle_s", "no-change cycle (s)"),
    ("startup_s", "startup with state (s)"),
    ("first_cycle_s", "first cycle from empty (s)"),
    ("peak_rss_mib", "peak RSS (MiB)"),
)
PHASES = ("fetch_parse", "snapshot", "plan", "save", "render", "publish", "other", "gc")


def load(paths: list[Path]) -> dict[str, dict[int, dict[str, Any]]]:
    runs: dict[str, dict[int, dict[str, Any]]] = {}
    for path in paths:
        label = path.stem.split("-")[0]
        data = json.loads(path.read_text())
        data.pop("raw", None)
        runs.setdefault(label, {})[int(data["replicas"])] = data
    return runs


def table(runs: dict[str, dict[int, dict[str, Any]]]) -> str:
    scales = sorted({n for by_scale in runs.values() for n in by_scale})
    columns = [(lb, n) for n in scales for lb in ("old", "new") if n in runs.get(lb, {})]
    head = "| figure | " + " | ".join(f"{lb} {n:,}" for lb, n in columns) + " |"
    lines = [head, "|---" * (1 + len(columns)) + "|"]
    for key, title in FIGURES:
        cells = [f"{runs[lb][n][key]:.2f}" for lb, n in columns]
        lines.append(f"| {title} | " + " | ".join(cells) + " |")
    loads = [f"{runs[lb][n]['load_average'][0]:.2f}" for lb, n in columns]
    lines.append("| load average (1 min) at the end | " + " | ".join(loads) + " |")
    return "\n".join(lines)


def phases(runs: dict[str, dict[int, dict[str, Any]]], key: str) -> str:
    lines = ["| run | " + " | ".join(PHASES) + " |", "|---" * (1 + len(PHASES)) + "|"]
    for label in ("old", "new"):
        for n, run in sorted(runs.get(label, {}).items()):
            cells = " | ".join(f"{run[key].get(p, 0.0):.2f}" for p in PHASES)
            lines.append(f"| {label} {n:,} | {cells} |")
    return "\n".join(lines)


def plot(runs: dict[str, dict[int, dict[str, Any]]], out: Path) -> None:
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for label, style in (("old", "o--"), ("new", "s-")):
        by_scale = runs.get(label, {})
        if not by_scale:
            continue
        xs = sorted(by_scale)
        left.plot(
            xs, [by_scale[x]["whole_cycle_s"] for x in xs], style, label=f"{label}: 1 % churn"
        )
        left.plot(
            xs, [by_scale[x]["nochange_cycle_s"] for x in xs], style, alpha=0.5,
            label=f"{label}: no change",
        )  # fmt: skip
        right.plot(xs, [by_scale[x]["peak_rss_mib"] for x in xs], style, label=label)
    for ax, title in ((left, "whole cycle (s)"), (right, "peak RSS (MiB)")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("dataset replicas")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main() -> None:
    runs = load([Path(p) for p in sys.argv[1:]])
    (HERE / "cycle_results.json").write_text(json.dumps(runs, indent=1) + "\n")
    plot(runs, HERE / "cycle.png")
    print(table(runs))
    print()
    print(phases(runs, "phases_s"))
    print()
    print(phases(runs, "nochange_phases_s"))


if __name__ == "__main__":
    main()
