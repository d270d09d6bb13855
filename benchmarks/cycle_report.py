"""Tables and a plot from ``benchmarks/cycle.py`` runs (issue 15).

``python -m benchmarks.cycle_report RUN.json ...`` where each file is a ``--json`` output
named ``<label>-<replicas>.json`` (label ``old``, ``s4``, ``s5``, ``s6`` or ``new``). Writes
``benchmarks/cycle_results.json`` (every run, raw per-cycle records left out),
``benchmarks/cycle.png`` (cycle times and peak RSS against replicas on log axes, old and new:
10k, 100k, 1M, 10M) and prints the Markdown tables that ``benchmarks/RESULTS.md`` quotes,
with the machine each run was measured on. A run whose step failed (killed by the OOM killer,
stopped by the watchdog) shows ``failed`` in the table and no point in the plot.

The runs, old and new from one session (``old`` is the previous commit checked out in a
temporary worktree, its ``hydrator`` measured by this checkout's harness and replay)::

    git worktree add --detach /tmp/old <previous commit>
    for n in 10000 100000 1000000 10000000; do
        python -m benchmarks.cycle --replicas $n --json /tmp/cycle/new-$n.json
        python -m benchmarks.cycle --replicas $n --code /tmp/old --json /tmp/cycle/old-$n.json
    done
    python -m benchmarks.cycle_report /tmp/cycle/*.json
    git worktree remove /tmp/old
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
    ("replay_peak_rss_mib", "replay server's peak RSS (MiB, not counted above)"),
)
SCALES = (10_000, 100_000, 1_000_000, 10_000_000)  # issue 15 item 4
# Code versions in the order they are shown: ``old`` (before the work), optionally ``s4``,
# ``s5`` and ``s6`` (intermediate commits: sessions 4 to 6), ``new``; a file's label is its name
# up to the first ``-``.
LABELS = (
    ("old", "o--", "tab:blue"),
    ("s4", "^:", "tab:green"),
    ("s5", "d-.", "tab:purple"),
    ("s6", "v-.", "tab:red"),
    ("new", "s-", "tab:orange"),
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
    columns = [(lb, n) for n in scales for lb, _, _ in LABELS if n in runs.get(lb, {})]
    head = "| figure | " + " | ".join(f"{lb} {n:,}" for lb, n in columns) + " |"
    lines = [head, "|---" * (1 + len(columns)) + "|"]
    for key, title in FIGURES:
        cells = [cell(runs[lb][n], key) for lb, n in columns]
        lines.append(f"| {title} | " + " | ".join(cells) + " |")
    loads = [f"{runs[lb][n]['load_average'][0]:.2f}" for lb, n in columns]
    lines.append("| load average (1 min) at the end | " + " | ".join(loads) + " |")
    return "\n".join(lines)


def cell(run: dict[str, Any], key: str) -> str:
    value = run.get(key)
    if value is None:
        return "failed" if run.get("failed") else "-"
    return f"{value:.2f}"


def machines(runs: dict[str, dict[int, dict[str, Any]]]) -> str:
    """One line per distinct machine the runs were measured on, and what failed."""
    seen = []
    for label, by_scale in runs.items():
        for n, run in sorted(by_scale.items()):
            m = run.get("machine")
            if m:
                text = (
                    f"{m['cpu']}, {m['cores']} cores, {m['ram_gib']} GiB RAM, "
                    f"{m['swap_gib']} GiB swap, Python {m['python']}"
                )
                if text not in seen:
                    seen.append(text)
            for step, why in (run.get("failed") or {}).items():
                seen.append(f"{label} {n:,}: {step} step failed: {why}")
            if any((run.get("swapped_pages") or {}).values()):
                seen.append(f"{label} {n:,}: swapped {run['swapped_pages']}")
    return "\n".join(f"- {line}" for line in seen)


def phases(runs: dict[str, dict[int, dict[str, Any]]], key: str) -> str:
    lines = ["| run | " + " | ".join(PHASES) + " |", "|---" * (1 + len(PHASES)) + "|"]
    for label, _, _ in LABELS:
        for n, run in sorted(runs.get(label, {}).items()):
            if key not in run:
                continue
            cells = " | ".join(f"{run[key].get(p, 0.0):.2f}" for p in PHASES)
            lines.append(f"| {label} {n:,} | {cells} |")
    return "\n".join(lines)


def fetch_cpu(runs: dict[str, dict[int, dict[str, Any]]]) -> str:
    """fetch_parse's wall time against the daemon's own CPU time in it (the rest is waiting,
    mostly for the replay server generating answers on the other core)."""
    kinds = (("first", "first_phases_s"), ("churn", "phases_s"), ("nochange", "nochange_phases_s"))
    head = " | ".join(f"{k} wall | {k} CPU" for k, _ in kinds)
    lines = [f"| run | {head} |", "|---" * (1 + 2 * len(kinds)) + "|"]
    for label, _, _ in LABELS:
        for n, run in sorted(runs.get(label, {}).items()):
            cpu = run.get("fetch_parse_cpu_s")
            if not cpu:
                continue
            cells = " | ".join(f"{run[key]['fetch_parse']:.2f} | {cpu[k]:.2f}" for k, key in kinds)
            lines.append(f"| {label} {n:,} | {cells} |")
    return "\n".join(lines)


def phase_peaks(runs: dict[str, dict[int, dict[str, Any]]]) -> str:
    """Each phase's own peak RSS (MiB) by kind of cycle, for the runs that recorded it."""
    head = " | ".join(p for p in PHASES if p != "gc")
    lines = [f"| run | cycle | {head} |", "|---" * (len(PHASES) + 1) + "|"]
    for label, _, _ in LABELS:
        for n, run in sorted(runs.get(label, {}).items()):
            for kind, peaks in (run.get("phase_peaks_mib") or {}).items():
                cells = " | ".join(f"{peaks.get(p, 0.0):.0f}" for p in PHASES if p != "gc")
                lines.append(f"| {label} {n:,} | {kind} | {cells} |")
    return "\n".join(lines)


def plot(runs: dict[str, dict[int, dict[str, Any]]], out: Path) -> None:
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for label, style, colour in LABELS:
        by_scale = runs.get(label, {})
        for ax, key, title, alpha in (
            (left, "whole_cycle_s", "1 % churn", 1.0),
            (left, "nochange_cycle_s", "no change", 0.5),
            (right, "peak_rss_mib", "daemon", 1.0),
        ):
            xs = sorted(n for n, run in by_scale.items() if run.get(key) is not None)
            if xs:
                ys = [by_scale[x][key] for x in xs]
                ax.plot(xs, ys, style, color=colour, alpha=alpha, label=f"{label}: {title}")
    for ax, title in ((left, "cycle time (s)"), (right, "peak RSS (MiB)")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xticks(SCALES, [f"{n:,}" for n in SCALES])
        ax.set_xlabel("dataset replicas")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main() -> None:
    """``python -m benchmarks.cycle_report RUN.json ... [--out DIR]`` (default: this
    directory, which ``benchmarks/RESULTS.md`` quotes)."""
    args = sys.argv[1:]
    out = HERE
    if "--out" in args:
        at = args.index("--out")
        out = Path(args[at + 1])
        del args[at : at + 2]
    runs = load([Path(p) for p in args])
    (out / "cycle_results.json").write_text(json.dumps(runs, indent=1) + "\n")
    plot(runs, out / "cycle.png")
    print(table(runs))
    print()
    print(machines(runs))
    print()
    print(phases(runs, "phases_s"))
    print()
    print(phases(runs, "nochange_phases_s"))
    print()
    print(phases(runs, "first_phases_s"))
    print()
    print(fetch_cpu(runs))
    print()
    print(phase_peaks(runs))


if __name__ == "__main__":
    main()
