"""Job annotation at 10,000 idle jobs on the real test pool: what it adds to a cycle.

Submits ``--jobs`` idle jobs as the pool's ordinary user, one cluster per distinct
``RequiredDatasets`` value (``--values`` of them, each ``{"ska:bench_NNNN", "ska:calib"}``),
then runs ``hydrator`` cycles (the real :class:`~hydrator.runtime.service.Service` on a static
inventory, annotating as the dedicated identity ``hydrator@<UID_DOMAIN>``):

1. **first**: every job is annotated (one edit per distinct value, 3 edit calls each);
2. **no change**: nothing changed, so no edit;
3. **1 % churn**: the data of 1 % of the jobs moves (that many distinct values' datasets go to
   another site); the edits must not exceed the distinct values whose sites changed.

For each it records the cycle's duration and, from the cycle's own report
(``CycleReport.phases``), its ``jobs`` phase: reading the queues (``Schedd.query`` of every
idle data-bound job), deciding (pure) and editing (``Schedd.edit`` calls). Then it checks
every job's ``DataLocalitySites`` against the inventory, removes the jobs and stops the pool.

    .venv/bin/python -m benchmarks annotation [--jobs 10000] [--values 200] [--json F]

Needs root and the test pool (``scripts/condor-pool build``); holds the pool lock throughout
(about 2-4 minutes). Prints the result; ``--json FILE`` writes it (the committed record:
``--json benchmarks/results/annotation.json``, which ``benchmarks/ANNOTATE.md`` describes).
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks.conditions import emit, machine
from hydrator.config import load_config
from hydrator.runtime.wiring import build_service
from tests.support.pool import EDITOR_IDENTITY, NEVER_MATCHING, SLOT_SITES, Pool, running_pool

SITES = sorted(set(SLOT_SITES.values()))
ELEMENTS = {site: f"{site}_DISK" for site in SITES}


def site_of(value: int, moved: frozenset[int]) -> str:
    """Where bench value ``value`` is complete (``moved`` ones one site further)."""
    return SITES[(value + (1 if value in moved else 0)) % len(SITES)]


def inventory(values: int, moved: frozenset[int]) -> str:
    """Each site holds ska:calib; value i's dataset is complete at one site, partial at the
    next, so every job gets one complete and one partial site."""
    held: dict[str, list[str]] = {s: ["ska:calib"] for s in SITES}
    partial: dict[str, list[str]] = {s: [] for s in SITES}
    for i in range(values):
        site = site_of(i, moved)
        held[site].append(f"ska:bench_{i:04d}")
        partial[SITES[(SITES.index(site) + 1) % len(SITES)]].append(f"ska:bench_{i:04d}")
    out = []
    for site in SITES:
        fractions = ", ".join(f'"{d}" = 0.5' for d in partial[site])
        out.append(
            f'[storage.{ELEMENTS[site]}]\nsite = "{site}"\navailable = {json.dumps(held[site])}\n'
            f"partial = {{ {fractions} }}\n"
        )
    return "\n".join(out)


def submit_all(pool: Pool, values: int, per_value: int) -> float:
    """One cluster of ``per_value`` idle jobs per value, 4 submits at a time; seconds taken."""

    def one(i: int) -> int:
        required = f'{{"ska:bench_{i:04d}", "ska:calib"}}'
        return pool.submit(NEVER_MATCHING.format(required=required, count=per_value))

    t0 = time.perf_counter()
    with ThreadPoolExecutor(4) as executor:
        list(executor.map(one, range(values)))
    return time.perf_counter() - t0


def write_config(directory: Path, pool: Pool, token_dir: Path) -> Path:
    path = directory / "hydrator.toml"
    path.write_text(
        '[daemon]\nstate_path = "state.sqlite"\n\n[http]\nenabled = false\n\n'
        '[[sources]]\ntype = "static"\nname = "inventory"\npath = "inventory.toml"\n'
        "settle_s = 0\n\n"  # the script alone writes it, just before a cycle: no settle wait
        f'[collector]\nenabled = false\npool = "{pool.collector_address}"\n'
        f'token_dir = "{token_dir}"\n\n[jobs]\nannotate = true\n'
    )
    return path


def check_jobs(pool: Pool, moved: frozenset[int]) -> int:
    """Jobs whose DataLocalitySites is not the inventory's answer (should be 0)."""
    ads = pool.schedd.query(
        constraint="JobStatus == 1", projection=["RequiredDatasets", "DataLocalitySites"]
    )
    wrong = 0
    for ad in ads:
        name = next(n for n in ad["RequiredDatasets"] if n.startswith("ska:bench_"))
        want = [site_of(int(name.rsplit("_", 1)[1]), moved)]
        wrong += list(ad.get("DataLocalitySites") or []) != want
    return wrong


def run(jobs: int, values: int) -> dict[str, Any]:
    per_value = jobs // values
    churned = frozenset(range(math.ceil(values * 0.01)))  # 1 % of the jobs: equal clusters
    with tempfile.TemporaryDirectory() as tmp, running_pool(Path(tmp) / "condor") as pool:
        work = Path(tmp)
        pool.remove_all_jobs()
        token = pool.token_dir_for(EDITOR_IDENTITY, work / "editor")
        (work / "inventory.toml").write_text(inventory(values, frozenset()))
        submit_s = submit_all(pool, values, per_value)
        service = build_service(load_config(write_config(work, pool, token)))
        cycles: list[dict[str, Any]] = []
        try:
            for name, moved in (
                ("first", frozenset()),
                ("no change", frozenset()),
                ("1 % churn", churned),
            ):
                (work / "inventory.toml").write_text(inventory(values, moved))
                report = service.run_cycle()
                assert report.jobs is not None
                j = report.jobs
                cycles.append(
                    {
                        "cycle": name,
                        "cycle_s": round(report.duration_s, 3),
                        "jobs_s": round(report.phases["jobs"].wall_s, 3),
                        "seen": j.seen,
                        "edits": j.edits,
                        "edit_calls": j.edit_calls,
                        "jobs_edited": j.jobs_edited,
                        "failed_schedds": len(j.failed_schedds),
                        "changed_values": len(moved) if name == "1 % churn" else None,
                    }
                )
                print(json.dumps(cycles[-1]), flush=True)
            wrong = check_jobs(pool, churned)
        finally:
            service.close()
            pool.remove_all_jobs()
    return {
        "generated": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "jobs": per_value * values,
        "values": values,
        "submit_s": round(submit_s, 1),
        "cycles": cycles,
        "jobs_with_wrong_sites_after": wrong,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--values", type=int, default=200)
    parser.add_argument("--json", type=Path, help="write the result here (default: print only)")
    args = parser.parse_args()
    result = run(args.jobs, args.values)
    emit(result, args.json)


if __name__ == "__main__":
    main()
