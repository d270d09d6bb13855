"""Demand-driven advertising: ad size and cycle cost with and without it.

For a synthetic federation (``benchmarks/generate.py``) and a synthetic queue (idle jobs each
needing 1-3 datasets, drawn with a Zipf-like skew: a few hot datasets, a long tail), it
measures per advertising mode: the time to narrow and render every site ad (what
``Service._cycle`` adds: ``advertise`` + ``render_ads``), names per ad, ad bytes, and the bytes
the pool carries (each slot's ad holds its site's lists: sum over slots), plus what was cut.

    .venv/bin/python -m benchmarks demand [--replicas 100000 1000000] [--json F]

Prints JSON; ``--json FILE`` writes it (the committed record: ``--json
benchmarks/results/demand.json``, which ``benchmarks/DEMAND.md`` describes).
"""

from __future__ import annotations

import argparse
import random
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks.conditions import emit
from benchmarks.generate import SOURCE, Federation, Scale
from hydrator.config import ClassAdConfig
from hydrator.core.advertise import AdvertisePolicy, advertise
from hydrator.core.plan import GuardPolicy, plan_cycle
from hydrator.domain import DatasetId, State
from hydrator.runtime.outcome import render_ads

ATTRS = ClassAdConfig()
MODES = {
    "all": AdvertisePolicy(),
    "all, budget 500": AdvertisePolicy(max_datasets_per_site=500),
    "demand": AdvertisePolicy(demand_only=True),
    "demand, budget 200": AdvertisePolicy(demand_only=True, max_datasets_per_site=200),
}


def queue_demand(fed: Federation, jobs: int, seed: int = 7) -> Counter[DatasetId]:
    """``jobs`` idle jobs, each needing 1-3 datasets; dataset popularity ~ 1/rank."""
    rng = random.Random(seed)
    universe = fed.scale.dataset_count
    weights = [1.0 / (rank + 1) for rank in range(universe)]
    order = list(range(universe))
    rng.shuffle(order)
    demand: Counter[DatasetId] = Counter()
    picks = rng.choices(order, weights=weights, k=jobs * 2)
    for i in range(jobs):
        for index in picks[2 * i : 2 * i + rng.randint(1, 2)]:
            demand[DatasetId(*fed.dataset_text(index))] += 1
    return demand


def measure(replicas: int, jobs: int) -> dict[str, Any]:
    fed = Federation(Scale(replicas=replicas))
    plan = plan_cycle(
        State(), {SOURCE: fed.snapshot(intern=True)}, datetime.now(UTC), GuardPolicy()
    )
    views = plan.sites
    demand = queue_demand(fed, jobs)
    slots_per_site = Counter(site for _, site in fed.slots)
    out: dict[str, Any] = {
        "replicas": replicas,
        "idle_jobs": jobs,
        "demanded_datasets": len(demand),
    }
    for label, policy in MODES.items():
        t0 = time.perf_counter()
        advertised = {s: advertise(v, demand, policy) for s, v in views.items()}
        ads = render_ads({s: a.view for s, a in advertised.items()}, ATTRS)
        seconds = time.perf_counter() - t0
        sizes = {s: len(ad.body) for s, ad in ads.items()}
        names = [
            len(a.view.available) + len(a.view.partial) + len(a.view.replicating)
            for a in advertised.values()
        ]
        out[label] = {
            "advertise_and_render_s": round(seconds, 3),
            "names_per_ad_mean": round(sum(names) / len(names), 1),
            "names_per_ad_max": max(names),
            "ad_bytes_mean": round(sum(sizes.values()) / len(sizes)),
            "ad_bytes_max": max(sizes.values()),
            "pool_bytes": sum(sizes[s] * slots_per_site.get(s, 0) for s in sizes),
            "not_demanded": sum(a.not_demanded for a in advertised.values()),
            "over_budget": sum(a.over_budget for a in advertised.values()),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--replicas", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--jobs", type=int, default=5_000)
    parser.add_argument("--json", type=Path, help="write the results here (default: print only)")
    args = parser.parse_args()
    results = [measure(n, args.jobs) for n in args.replicas]
    emit(results, args.json)


if __name__ == "__main__":
    main()
