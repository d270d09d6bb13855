"""Pure parts of the locality experiment (``benchmarks/locality.py``): where the data was when,
how a scenario's jobs are scored, and a GlideinWMS-style frontend that turns idle jobs into
glidein requests per site. No pool, no clock: the runner feeds observations in, tests feed
made-up ones (``tests/benchmarks/test_locality_model.py``).

Scoring (per scenario):

* a job **ran data-local** when the site of the slot it started on held every dataset it
  declares in ``RequiredDatasets`` completely at its start second (the catalogue's truth, i.e.
  the inventory the runner wrote, not what the slot ads said);
* a job is **stranded** when it is still idle at the scenario's end while every dataset it needs
  is complete at some site of the pool;
* **wait** is start minus queue time in seconds; a job that never started counts with the time
  up to the end of the scenario (a lower bound), and the summary says how many did.

The frontend follows glideinWMS ``glideinFrontendLib.countMatch``: ``match_expr`` is Python
evaluated with the dicts ``job`` (the job's attributes as the Python bindings return them: ClassAd
lists become lists) and ``glidein`` (entry attributes under ``glidein["attrs"]``); an exception
counts as "no match" (the frontend logs it at debug level); a job matching n entries adds 1/n
to each (the proportional count the frontend requests glideins from).
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

Inventory = Mapping[str, frozenset[str]]  # site -> datasets complete there
MatchExpr = Callable[[Mapping[str, Any], Mapping[str, Any]], bool]

MATCH_EXPR_FENCE = "```python match_expr"


# -- where the data was ----------------------------------------------------------------------


@dataclass
class Timeline:
    """The data catalogue's truth over time: ``(epoch seconds, inventory)`` in time order."""

    points: list[tuple[float, Inventory]] = field(default_factory=list)

    def record(self, at: float, inventory: Inventory) -> None:
        if self.points and at < self.points[-1][0]:
            raise ValueError("timeline points must be recorded in time order")
        self.points.append((at, {s: frozenset(d) for s, d in inventory.items()}))

    def at(self, when: float) -> Inventory:
        """The inventory in force at ``when`` (the last one recorded at or before it)."""
        current: Inventory = {}
        for t, inventory in self.points:
            if t > when:
                break
            current = inventory
        return current

    def holders(self, required: frozenset[str], when: float) -> frozenset[str]:
        """Sites holding every dataset in ``required`` completely at ``when``."""
        return frozenset(s for s, held in self.at(when).items() if required <= held)


# -- scoring a scenario ----------------------------------------------------------------------


@dataclass(frozen=True)
class JobRecord:
    """One data-bound job as the schedd reported it (epoch seconds; site of its first slot)."""

    proc: int
    required: frozenset[str]
    queued: float
    started: float | None = None
    site: str | None = None
    matched: float | None = None  # LastMatchTime: when the negotiator matched it


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0-100), linear between closest ranks; None for no values."""
    if not values:
        return None
    if len(values) == 1:
        return float(values[0])
    return statistics.quantiles(values, n=100, method="inclusive")[round(q) - 1]


def _share(numerator: int, denominator: int) -> float | None:
    return numerator / denominator if denominator else None


def is_local(job: JobRecord, timeline: Timeline) -> bool:
    """True when the job started on a site holding all its data at its start second."""
    if job.started is None or job.site is None:
        return False
    return job.site in timeline.holders(job.required, job.started)


def score(
    jobs: Sequence[JobRecord], timeline: Timeline, ended: float, moved: float | None = None
) -> dict[str, Any]:
    """The per-scenario numbers (see the module docstring); ``moved`` splits before/after the
    data move by start time."""
    started = [j for j in jobs if j.started is not None]
    local = [j for j in started if is_local(j, timeline)]
    idle = [j for j in jobs if j.started is None]
    stranded = [j for j in idle if timeline.holders(j.required, ended)]
    waits = [(j.started if j.started is not None else ended) - j.queued for j in jobs]
    out: dict[str, Any] = {
        "jobs": len(jobs),
        "started": len(started),
        "local": len(local),
        "local_fraction": _share(len(local), len(started)),
        "stranded": len(stranded),
        "never_started": len(idle),
        "wait_median_s": percentile(waits, 50),
        "wait_p95_s": percentile(waits, 95),
        "wait_censored": len(idle),
    }
    if moved is not None:
        before = [j for j in started if j.started is not None and j.started < moved]
        after = [j for j in started if j.started is not None and j.started >= moved]
        out["local_fraction_before_move"] = _share(
            sum(is_local(j, timeline) for j in before), len(before)
        )
        out["local_fraction_after_move"] = _share(
            sum(is_local(j, timeline) for j in after), len(after)
        )
        out["started_after_move"] = len(after)
    return out


# -- the rank-only ceiling -------------------------------------------------------------------

Round = tuple[Mapping[str, int], Inventory]  # free slots per site, data per site, at one round


def _local_capacity(started: Mapping[str, int], free: Mapping[str, int], data: Inventory) -> int:
    """Most of ``started`` (jobs per dataset, each needing that one dataset) that the ``free``
    slots can hold data-local: a max flow dataset -> site holding it -> its slots, computed as
    its min cut (min over sets T of datasets of: jobs outside T + slots at sites holding some
    dataset in T)."""
    names = sorted(started)
    best = sum(started.values())
    for mask in range(1, 1 << len(names)):
        inside = {d for i, d in enumerate(names) if mask >> i & 1}
        sites = {s for s, held in data.items() if held & inside}
        cut = sum(n for d, n in started.items() if d not in inside)
        best = min(best, cut + sum(free.get(s, 0) for s in sites))
    return best


def _splits(queued: tuple[int, ...], n: int) -> Iterable[tuple[int, ...]]:
    """Every way to take ``n`` jobs from the per-dataset counts ``queued``."""
    if not queued:
        if n == 0:
            yield ()
        return
    for k in range(min(queued[0], n) + 1):
        for rest in _splits(queued[1:], n - k):
            yield (k, *rest)


def work_conserving_ceiling(queued: Mapping[str, int], rounds: Sequence[Round]) -> int:
    """The most data-local starts any policy can reach that never leaves a free slot idle
    while a job is queued (as rank-only matching does): each round starts
    ``min(jobs queued, free slots)`` jobs, chosen and placed as well as possible; exact over
    all choices (dynamic programming over the jobs left per dataset)."""
    names = sorted(queued)
    best: dict[tuple[int, ...], int] = {tuple(queued[d] for d in names): 0}
    for free, data in rounds:
        after: dict[tuple[int, ...], int] = {}
        for left, local in best.items():
            n = min(sum(left), sum(free.values()))
            for take in _splits(left, n):
                gain = _local_capacity(dict(zip(names, take, strict=True)), free, data)
                key = tuple(a - b for a, b in zip(left, take, strict=True))
                after[key] = max(after.get(key, -1), local + gain)
        best = after
    return max(best.values())


# -- the frontend ----------------------------------------------------------------------------


def match_expr_from_doc(text: str) -> str:
    """The ``match_expr`` of docs/provisioning.md: the body of the one fenced block whose
    opening line is exactly ``\u0060\u0060\u0060python match_expr``."""
    blocks = re.findall(
        r"^" + re.escape(MATCH_EXPR_FENCE) + r"[ \t]*\n(.*?)^```[ \t]*$", text, re.M | re.S
    )
    if len(blocks) != 1:
        raise ValueError(f"expected one '{MATCH_EXPR_FENCE}' block, found {len(blocks)}")
    return str(blocks[0]).strip()


def compile_match_expr(source: str) -> MatchExpr:
    """``match_expr`` as a callable ``(job, glidein) -> bool``, evaluated the way the frontend
    does (``eval`` of the compiled text with ``job`` and ``glidein`` in scope)."""
    code = compile(source, "<match_expr>", "eval")

    def match(job: Mapping[str, Any], glidein: Mapping[str, Any]) -> bool:
        try:
            return bool(eval(code, {}, {"job": job, "glidein": glidein}))
        except Exception:  # the frontend: an error in match_expr means "does not match"
            return False

    return match


def entry(site: str) -> dict[str, Any]:
    """A factory entry at ``site`` as match_expr sees it."""
    return {"attrs": {"GLIDEIN_Site": site}}


@dataclass(frozen=True)
class Requests:
    """One frontend cycle: proportional idle-job counts per site and how much of that weight
    fell on sites holding the jobs' data."""

    by_site: Mapping[str, float]
    at_data_sites: float
    total: float
    unmatched_jobs: int

    @property
    def share_at_data_sites(self) -> float | None:
        return self.at_data_sites / self.total if self.total else None


def count_requests(
    jobs: Iterable[Mapping[str, Any]],
    sites: Sequence[str],
    match: MatchExpr,
    holders: Callable[[Mapping[str, Any]], frozenset[str]],
) -> Requests:
    """Each idle job adds 1/n to each of the n sites whose entry it matches; ``holders(job)``
    names the sites that hold the job's data now (for the share at data sites)."""
    by_site = dict.fromkeys(sites, 0.0)
    at_data = total = 0.0
    unmatched = 0
    for job in jobs:
        matched = [s for s in sites if match(job, entry(s))]
        if not matched:
            unmatched += 1
            continue
        weight = 1.0 / len(matched)
        data_sites = holders(job)
        for site in matched:
            by_site[site] += weight
            at_data += weight if site in data_sites else 0.0
        total += 1.0
    return Requests(by_site, at_data, total, unmatched)


def allocate(demand: Mapping[str, float], budget: int, cap: int) -> dict[str, int]:
    """Glideins per site: ``budget`` split in proportion to ``demand`` (largest remainder),
    never more than ``ceil(demand)`` nor ``cap`` at a site; sites without demand get none."""
    wanted = {s: min(cap, math.ceil(d - 1e-9)) for s, d in demand.items() if d > 0}
    total = sum(demand[s] for s in wanted)
    if not wanted or budget <= 0:
        return dict.fromkeys(demand, 0)
    if sum(wanted.values()) <= budget:
        return {s: wanted.get(s, 0) for s in demand}
    quota = {s: budget * demand[s] / total for s in wanted}
    out = {s: min(wanted[s], math.floor(q)) for s, q in quota.items()}
    by_remainder = sorted(wanted, key=lambda s: (-(quota[s] - math.floor(quota[s])), s))
    while sum(out.values()) < budget:
        grew = False
        for s in by_remainder:
            if sum(out.values()) < budget and out[s] < wanted[s]:
                out[s] += 1
                grew = True
        if not grew:
            break
    return {s: out.get(s, 0) for s in demand}


def glideins(targets: Mapping[str, int], busy: Mapping[str, int], cap: int) -> dict[str, int]:
    """Glideins running per site: what the frontend asks for, but a glidein busy with a job
    stays until the job ends."""
    return {s: min(cap, max(targets.get(s, 0), busy.get(s, 0))) for s in {*targets, *busy}}
