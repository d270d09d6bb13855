"""Reading the queues at 10,000 idle jobs: three reads per cycle (old) against one (new).

Before issue 22 a cycle read the schedds up to three times: the demand (idle jobs'
``RequiredDatasets``), the matchmaking probe (idle and running data-bound jobs, plus the slots)
and job annotation (idle jobs matching ``[jobs] constraint`` with the attributes it owns). Now
one query per schedd serves all three (:mod:`hydrator.core.queue`).

On the real test pool, with ``--jobs`` idle data-bound jobs (as :mod:`benchmarks.annotate`
submits them) and all three consumers on (``advertise = "demand"``, ``locality_metrics``,
``[jobs] annotate``), this runs, alternately, a worker on the old code (``--old``, a commit
exported with ``git archive``) and one on this tree, each in a process of its own: after one
warm-up cycle (which annotates the jobs), each worker times ``--rounds`` times what a cycle
spends reading the queue (old: ``demand()`` + ``probe.jobs_and_slots()`` +
``annotator.adapter.read()``; new: ``queue.read()`` and the three consumers' parts of it, the
probe's slot query included in both), with the garbage collector paused as in a cycle, and a
whole no-change ``run_cycle``.

    .venv/bin/python -m benchmarks.queue_read [--jobs 10000] [--old dfbc5c3] [--rounds 5]

Needs root and the test pool; holds the pool lock throughout. Writes
``benchmarks/queue_read_results.json`` and prints the paragraph for ``ANNOTATE.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def config_text(collector: str, token_dir: str) -> str:
    return (
        '[daemon]\nstate_path = "state.sqlite"\n\n[http]\nenabled = false\n\n'
        '[[sources]]\ntype = "static"\nname = "inventory"\npath = "inventory.toml"\n\n'
        '[classad]\nadvertise = "demand"\n\n'
        f'[collector]\nenabled = true\npool = "{collector}"\ntoken_dir = "{token_dir}"\n'
        "refresh_s = 600\nlocality_metrics = true\n\n[jobs]\nannotate = true\n"
    )


def timed(call: Any) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = call()
    return out, time.perf_counter() - t0


def read_old(svc: Any) -> dict[str, float]:
    """The three reads of a cycle before issue 22 (the code under ``--old``)."""
    _, demand_s = timed(svc.demand)
    _, probe_s = timed(svc.probe.jobs_and_slots)
    _, annotate_s = timed(svc.annotator.adapter.read)
    return {"demand_s": demand_s, "probe_s": probe_s, "annotation_s": annotate_s}


def read_new(svc: Any) -> dict[str, float]:
    """The one read of a cycle and each consumer's part of it (this tree)."""
    from hydrator.core.jobs import annotation_reads
    from hydrator.core.queue import idle_demand

    queue, read_s = timed(svc.queue.read)
    _, demand_s = timed(lambda: idle_demand(queue))
    _, probe_s = timed(lambda: svc.probe.jobs_and_slots(queue))
    _, annotate_s = timed(lambda: annotation_reads(queue))
    return {"read_s": read_s, "demand_s": demand_s, "probe_s": probe_s, "annotation_s": annotate_s}


def worker(config: Path, rounds: int) -> dict[str, Any]:
    """Runs in the old or the new tree (whichever ``hydrator`` PYTHONPATH gives)."""
    import hydrator  # imported here: the worker runs the tree its PYTHONPATH names
    from hydrator.config import load_config
    from hydrator.runtime.memory import collector_paused
    from hydrator.runtime.wiring import build_service

    svc = build_service(load_config(config))
    try:
        warm = svc.run_cycle()  # annotates the jobs; later cycles change nothing
        new = hasattr(svc, "queue") and svc.queue is not None
        reads = []
        for _ in range(rounds):
            with collector_paused():  # as in a cycle: no garbage-collector passes
                reads.append((read_new if new else read_old)(svc))
        cycles = [svc.run_cycle().duration_s for _ in range(rounds)]
    finally:
        svc.close()
    return {
        "code": "new" if new else "old",
        "hydrator": str(Path(hydrator.__file__).parent),
        "warm_up_cycle_s": round(warm.duration_s, 3),
        "jobs_seen": warm.jobs.seen if warm.jobs else None,
        "reads": reads,
        "cycle_s": cycles,
    }


def run_worker(tree: Path, config: Path, rounds: int) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run(
        [sys.executable, __file__, "--worker", str(config), "--rounds", str(rounds)],
        env=env,
        cwd=config.parent,
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"worker in {tree} failed:\n{out.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(out.stdout.splitlines()[-1])
    return result


def summary(result: dict[str, Any]) -> dict[str, float]:
    """Medians (seconds) of the read's parts, their total, and the whole cycle."""
    reads = result["reads"]
    keys = reads[0].keys()
    out = {k: round(statistics.median(r[k] for r in reads), 4) for k in keys}
    out["total_s"] = round(statistics.median(sum(r.values()) for r in reads), 4)
    out["cycle_s"] = round(statistics.median(result["cycle_s"]), 4)
    return out


def measure(jobs: int, values: int, old: str, rounds: int, pairs: int) -> dict[str, Any]:
    from benchmarks.annotate import inventory, machine, submit_all
    from tests.support.pool import running_pool

    with tempfile.TemporaryDirectory() as tmp, running_pool(Path(tmp) / "condor") as pool:
        work = Path(tmp)
        old_tree = work / "old"
        old_tree.mkdir()
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", old, "hydrator"], capture_output=True, check=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(old_tree)], input=archive, check=True)
        pool.remove_all_jobs()
        try:
            submit_s = submit_all(pool, values, jobs // values)
            runs = []
            for tree, label in [(old_tree, "old"), (ROOT, "new")] * pairs:
                directory = work / f"{label}-{len(runs)}"
                directory.mkdir()
                (directory / "inventory.toml").write_text(inventory(values, frozenset()))
                config = directory / "hydrator.toml"
                config.write_text(config_text(pool.collector_address, str(pool.token_dir)))
                runs.append(run_worker(tree, config, rounds))
                print(json.dumps(summary(runs[-1]) | {"code": label}), flush=True)
        finally:
            pool.remove_all_jobs()
    return {
        "generated": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "conditions": "machine shared with other engineers' builds and tests; one schedd",
        "jobs": jobs // values * values,
        "values": values,
        "submit_s": round(submit_s, 1),
        "old_commit": old,
        "rounds_per_worker": rounds,
        "runs": runs,
        "old": _pooled([r for r in runs if r["code"] == "old"]),
        "new": _pooled([r for r in runs if r["code"] == "new"]),
    }


def _pooled(runs: list[dict[str, Any]]) -> dict[str, float]:
    """The medians over every round of every worker of one kind."""
    return summary({"reads": [x for r in runs for x in r["reads"]], "cycle_s": _cycles(runs)})


def _cycles(runs: list[dict[str, Any]]) -> list[float]:
    return [c for r in runs for c in r["cycle_s"]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--values", type=int, default=200)
    parser.add_argument("--old", default="dfbc5c3", help="the commit before the shared read")
    parser.add_argument("--rounds", type=int, default=5, help="timed reads per worker")
    parser.add_argument("--pairs", type=int, default=2, help="old/new workers, alternated")
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        print(json.dumps(worker(args.worker, args.rounds)))
        return
    result = measure(args.jobs, args.values, args.old, args.rounds, args.pairs)
    (HERE / "queue_read_results.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({"old": result["old"], "new": result["new"]}, indent=1))


if __name__ == "__main__":
    main()
