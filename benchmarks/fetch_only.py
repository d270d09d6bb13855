"""The Rucio source's fetch alone, old code against new: what the cycle benchmark's ``fetch``
phase holds without the rest of the daemon beside it.

The cycle benchmark (:mod:`benchmarks.cycle`) charges a fetch with the CPU of every thread of
the daemon's process while it runs; this scenario builds the source alone
(``wiring.build_source``, the configuration of :func:`benchmarks.cycle.config`) and calls its
``fetch`` in the main thread against a fresh :mod:`benchmarks.replay` of the same federation:
the first fetch, then ``--cycles`` fetches after 1 % churn each and ``--cycles`` with no
change. Each side runs in a process of its own with its checkout's ``hydrator`` (``--code
DIR`` is the old side, this checkout the new), in ``--rounds`` pairs, old first in odd pairs
and new first in even ones. The figures are the process's CPU seconds in each fetch (the
source's read-ahead thread included) and the wall seconds; the summary gives the medians
over all fetches of a kind and new against old in per cent.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from statistics import median
from typing import Any

from benchmarks.conditions import emit, machine

HERE = Path(__file__).resolve().parent


def step(url: str, workdir: Path, cycles: int) -> dict[str, Any]:
    """One side's fetches (in the child process: ``hydrator`` is that side's)."""
    from benchmarks.cycle import churn, config
    from hydrator.core.ports import FetchContext
    from hydrator.runtime import wiring

    cfg = config(url, workdir)
    source = wiring.build_source(cfg.sources[0], cfg.sites)
    previous: dict[str, Any] = {}

    def fetch() -> list[float]:
        context = FetchContext(now=datetime.now(UTC), previous=previous)
        cpu, wall = time.process_time(), time.perf_counter()
        snapshot = source.fetch(context)
        taken = [time.process_time() - cpu, time.perf_counter() - wall]
        previous[source.name] = snapshot.replicas
        return taken

    out: dict[str, Any] = {"first": fetch(), "churn": [], "nochange": []}
    for _ in range(cycles):
        churn(url)
        out["churn"].append(fetch())
    for _ in range(cycles):
        out["nochange"].append(fetch())
    return out


def run_side(code: Path | None, args: argparse.Namespace) -> dict[str, Any]:
    """One side in a child process against a fresh replay: its fetches' figures."""
    from benchmarks.cycle import ReplayServer, code_path

    with tempfile.TemporaryDirectory() as name:
        workdir = Path(name)
        replay = ReplayServer(args.replicas, args.seed, args.replay_cache_mib)
        try:
            cwd = HERE.parent if code is None else code_path(code, workdir)
            env = dict(os.environ, RUCIO_HOME=str(workdir), PYTHONPATH=str(cwd))
            command = [sys.executable, "-m", "benchmarks.fetch_only", "--step"]
            command += ["--url", replay.url, "--workdir", str(workdir)]
            command += ["--cycles", str(args.cycles)]
            done = subprocess.run(
                command, check=False, cwd=cwd, env=env, capture_output=True, text=True
            )
        finally:
            replay.stop()
    if done.returncode != 0:
        raise SystemExit(f"a fetch step failed: {done.stderr.strip().splitlines()[-1:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    result["load_average"] = os.getloadavg()
    return result


def medians(runs: list[dict[str, Any]]) -> dict[str, float]:
    """CPU and wall medians over every fetch of each kind in ``runs``."""
    out: dict[str, float] = {}
    for kind in ("first", "churn", "nochange"):
        taken = [f for run in runs for f in ([run[kind]] if kind == "first" else run[kind])]
        out[f"{kind}_cpu_s"] = median(f[0] for f in taken)
        out[f"{kind}_wall_s"] = median(f[1] for f in taken)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    add = parser.add_argument
    add("--replicas", type=int, default=1_000_000)
    add("--cycles", type=int, default=3, help="churn and no-change fetches each")
    add("--seed", type=int, default=2026)
    add("--rounds", type=int, default=2, help="pairs of runs, old first in odd pairs")
    add("--code", type=Path, help="the old side's checkout (required)")
    add("--replay-cache-mib", type=int, default=768)
    add("--json", type=Path, help="write the result here")
    add("--step", action="store_true", help=argparse.SUPPRESS)
    add("--url", help=argparse.SUPPRESS)
    add("--workdir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.step:
        print(json.dumps(step(args.url, args.workdir, args.cycles)))
        return
    if args.code is None:
        parser.error("--code DIR (the old side) is required")
    from benchmarks.cycle import revision

    before = machine()
    sides: dict[str, list[dict[str, Any]]] = {"old": [], "new": []}
    for i in range(args.rounds):
        for side in ("old", "new") if i % 2 == 0 else ("new", "old"):
            sides[side].append(run_side(args.code if side == "old" else None, args))
            churned = [round(f[0], 3) for f in sides[side][-1]["churn"]]
            print(f"pair {i + 1} {side}: churn CPU {churned}", file=sys.stderr)
    old, new = medians(sides["old"]), medians(sides["new"])
    summary = {
        "replicas": args.replicas,
        "cycles": args.cycles,
        "rounds": args.rounds,
        "code": {"old": revision(args.code), "new": revision(HERE.parent)},
        "old": old,
        "new": new,
        "new_vs_old_pct": {k: round(100 * (new[k] - old[k]) / old[k], 2) for k in old},
        "runs": sides,
        "machine": before,
        "machine_after": machine(),
    }
    emit(summary, args.json, shown={k: summary[k] for k in ("old", "new", "new_vs_old_pct")})


if __name__ == "__main__":
    main()
