"""The locality experiment: do data-bound jobs and glideins go where the data is?
Eight ways, on the real test pool, with the daemon and its execute-node hook running.

    .venv/bin/python -m benchmarks locality [--scenarios c d d2 near]
        [--workload short|busy|contended] [--budget N] [--repeat N] [--json PATH] [--dry-run]

Needs root; holds the pool lock throughout (~6 min for all, ~3 min for c d d2 near with the
default workload; ``--workload busy`` and ``contended``: LOCALITY.md; ``--dry-run``: no
pool, prints the constants and submit files); prints the
table of LOCALITY.md (design and scoring); ``--json PATH`` writes the record (committed:
``benchmarks/results/locality.json``, ``benchmarks/results/locality_near.json``), after each
scenario as it goes. ``--repeat N`` runs the scenarios N times in rotated orders and records
every run and the median per scenario. Exits 1 when the ``near`` scenario's median misses a
target (:func:`near_targets`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any
from unittest import mock

from benchmarks.conditions import machine
from hydrator.config import ClassAdConfig, CollectorConfig, JobsConfig
from hydrator.core.expr import job_expressions, near_expressions
from hydrator.domain import DatasetId
from tests.support.daemon import Daemon
from tests.support.pool import EDITOR_IDENTITY, IDLE, RUNNING, SUBMIT_USER, Pool, running_pool
from tests.support.pool_hook import HOOK_PERIOD_S, install_hook, remove_hook  # noqa: F401
from tests.support.static_inventory import CYCLE_S, TRANSIENT, start_static  # noqa: F401
from tests.support.wait import wait_for

REPO = Path(__file__).resolve().parents[1]
NEAR_CONF = REPO / "deploy" / "condor" / "60-hydrator-near.conf"
HERE = Path(__file__).parent
PROVISIONING = HERE.parent / "docs" / "provisioning.md"
Inventory = Mapping[str, frozenset[str]]  # site -> datasets complete there
SITES, PER_SITE = ("SITE_A", "SITE_B", "SITE_C", "SITE_D"), 3
SLOTS = {f"slot{i + 1}": SITES[i // PER_SITE] for i in range(len(SITES) * PER_SITE)}
DATASETS = ("ska:exp_a", "ska:exp_b", "ska:exp_c")
INITIAL: Inventory = {site: frozenset(DATASETS[i : i + 1]) for i, site in enumerate(SITES)}
MOVING, MOVE_FROM, MOVE_TO, OVERLAP_S = "ska:exp_a", "SITE_A", "SITE_D", 5.0
# SLEEPS_S: the jobs' sleeps, cycled over the submit rows (one value: every job alike)
JOBS_PER_DATASET, SLEEPS_S, DEADLINE_S, POLL_S = 16, (2,), 150.0, 0.5
TOTAL = JOBS_PER_DATASET * len(DATASETS)
# (d2): 2/3 of the strict drain (16 jobs on 3 slots: 6 negotiation cycles of 5 s), above the
# usual wait for a local slot (~10 s median in (c)).
FALLBACK_AFTER_S = 20
# glideins: half the pool, at most PER_SITE at a site; GLIDEINS: the config fragment toggling them
FRONTEND_PERIOD_S, BUDGET, GLIDEINS = 5.0, 6, "61-locality-glideins"
# near: SITE_D (no data at first) is near each data site, the data sites are far from each other;
# the daemon's [distances] operator table. REMOTE_BUDGET: --budget's default.
DISTANCES = {s: {o: 1 if "SITE_D" in (s, o) else 2 for o in SITES if o != s} for s in SITES}
MAX_DISTANCE, REMOTE_BUDGET, NEAR_ATTRIBUTE = 1, 2, "DataLocalityNearSites"
NEAR = {s: frozenset(o for o, d in DISTANCES[s].items() if d <= MAX_DISTANCE) for s in SITES}
# --workload busy: jobs long enough that a 5 s negotiation cycle is noise (sleeps 15-24 s, out
# of step so slots free one by one), the site emptied by the move (SITE_A) near the other data
# sites too (so after the move the near sites are idle while the data sites are busy), and a
# budget of 1 that the near slots' demand exceeds. FALLBACK_AFTER_S: 2/3 of the strict drain.
BUSY_DISTANCES = {
    s: {o: 1 if "SITE_D" in (s, o) or "SITE_A" in (s, o) else 2 for o in SITES if o != s}
    for s in SITES
}
# BACKGROUND: slots per site held by other users' long jobs, submitted (BACKGROUND_SLEEP_S, far
# beyond any scenario) before the measured jobs and removed after them; none by default.
BACKGROUND: dict[str, int] = {}
BACKGROUND_SLEEP_S = 3600
WORKLOADS: dict[str, dict[str, Any]] = {
    "short": {},  # the module's values above: the 2026-11-28 04:31 record
    "busy": {
        "SLEEPS_S": (15, 18, 21, 24),
        "DEADLINE_S": 420.0,
        "FALLBACK_AFTER_S": 80,
        "DISTANCES": BUSY_DISTANCES,
        "REMOTE_BUDGET": 1,
    },
    # busy, with other users' long jobs holding 2 of the 3 slots at every site holding data at
    # the start (the near site SITE_D idle); 8 jobs per dataset, four times the 6 slots left
    # free; FALLBACK_AFTER_S 2/3 of the strict drain (8 jobs on 1 slot: 8 rounds of ~20 s).
    "contended": {
        "SLEEPS_S": (15, 18, 21, 24),
        "DEADLINE_S": 420.0,
        "FALLBACK_AFTER_S": 107,
        "DISTANCES": BUSY_DISTANCES,
        "REMOTE_BUDGET": 1,
        "JOBS_PER_DATASET": 8,
        "BACKGROUND": {"SITE_A": 2, "SITE_B": 2, "SITE_C": 2},
    },
}
JOB_ATTRS = ["ProcId", "JobStatus", "QDate", "JobStartDate", "RemoteHost", "RequiredDatasets"]
JOB_ATTRS += ["MATCH_EXP_JOB_GLIDEIN_Site", "DataLocalitySites", "CompletionDate"]
# CLAIM_WORKLIFE = 0: every start goes through the negotiator (no claim reused against an older
# slot ad); START by GlideinOn: a slot takes jobs only while its "glidein" runs (scenario e).
LAYOUT = f"""NUM_CPUS = {len(SLOTS)}
MEMORY = {256 * len(SLOTS)}
SLOT_TYPE_1 = cpus=1, memory=256
SLOT_TYPE_1_PARTITIONABLE = false
NUM_SLOTS_TYPE_1 = {len(SLOTS)}
NUM_SLOTS_TYPE_2 = 0
STARTD_ATTRS = GLIDEIN_Site GlideinOn
GlideinOn = True
START = GlideinOn =?= True
CLAIM_WORKLIFE = 0
""" + "".join(f'{slot.upper()}_GLIDEIN_Site = "{site}"\n' for slot, site in SLOTS.items())


@dataclass(frozen=True)
class Scenario:
    key: str
    title: str
    lines: tuple[str, ...]  # submit lines besides RequiredDatasets
    match_expr: str | None = None  # slots run jobs only when the model frontend starts them
    annotate: bool = False  # the daemon runs with [jobs] annotate = true

    def submit(self) -> str:
        """One cluster, datasets interleaved; ``$(Sites)``: the dataset's site at submit."""
        pairs = [(d, SITES[i]) for _ in range(JOBS_PER_DATASET) for i, d in enumerate(DATASETS)]
        rows = [f"{d} {s} {SLEEPS_S[n % len(SLEEPS_S)]}" for n, (d, s) in enumerate(pairs)]
        head = "universe = vanilla\nexecutable = /bin/sleep\noutput = /dev/null\nerror = /dev/null"
        glidein_site = '+JOB_GLIDEIN_Site = "$$(GLIDEIN_Site:Unknown)"'
        required = f"My.RequiredDatasets = {_expr('required')}"
        body = [head, "arguments = $(Sleep)", glidein_site, required, *self.lines]
        return "\n".join([*body, "queue Dataset, Sites, Sleep from (", *rows, ")", ""])


def background_submit(held: Mapping[str, int], sleep_s: int) -> str:
    """Other users' long jobs, one cluster: ``held[site]`` jobs sleeping ``sleep_s`` seconds
    pinned to that site's slots (``GLIDEIN_Site``); they declare no data and name no limit."""
    rows = [site for site, count in held.items() for _ in range(count)]
    head = "universe = vanilla\nexecutable = /bin/sleep\noutput = /dev/null\nerror = /dev/null"
    pin = 'requirements = TARGET.GLIDEIN_Site =?= "$(Site)"'
    return "\n".join([head, f"arguments = {sleep_s}", pin, "queue Site from (", *rows, ")", ""])


def _expr(attribute: str, fallback_after_s: int | None = None) -> str:
    """One line of ``hydrator expr`` for one dataset, its name the submit macro ``$(Dataset)``."""
    e = job_expressions([DatasetId.parse("ska:x")], ClassAdConfig(), False, fallback_after_s)
    return str(getattr(e, attribute)).replace('"ska:x"', '"$(Dataset)"')


def scenarios() -> list[Scenario]:
    """(e1)/(e2): a match_expr blind to data; docs/provisioning.md's, over annotated jobs."""
    rank, strict = f"rank = {_expr('rank')}", f"requirements = {_expr('requirements')}"
    fallback = f"requirements = {_expr('requirements', FALLBACK_AFTER_S)}"
    desired = 'My.DESIRED_Sites = "$(Sites)"'
    by_list = "requirements = stringListMember(TARGET.GLIDEIN_Site, MY.DESIRED_Sites)"
    near = near_expressions(
        ClassAdConfig(),
        sites_attribute=JobsConfig().sites_attribute,
        slot_site_attribute=CollectorConfig().slot_site_attribute,
    )
    limits = f"concurrency_limits_expr = {near.concurrency_limits_expr}"
    near_lines = (f"requirements = {near.requirements}", f"rank = {near.rank}", limits)
    fence = r"^```python match_expr[ \t]*\n(.*?)^```[ \t]*$"
    (documented,) = re.findall(fence, PROVISIONING.read_text(encoding="utf-8"), re.M | re.S)
    return [
        Scenario("a", "no locality", ()),
        Scenario("b", "site list fixed at submit (DESIRED_Sites)", (desired, by_list)),
        Scenario("c", "hydrator, strict requirements", (strict, rank)),
        Scenario("d", "hydrator, rank only", (rank,)),
        Scenario("d2", f"rank, local first, fallback after {FALLBACK_AFTER_S} s", (fallback, rank)),
        Scenario("e1", "provisioning, no annotation", (strict, rank), "True"),
        Scenario("e2", "provisioning, annotation", (strict, rank), documented.strip(), True),
        Scenario("near", "local or near, remote-read budget", near_lines, None, True),
    ]


def select_workload(name: str) -> None:
    """Rebind the module's workload constants to :data:`WORKLOADS` ``[name]`` (``NEAR`` and
    ``TOTAL`` follow), before any scenario is built; the record's ``parameters`` show them."""
    module = globals()
    module.update(WORKLOADS[name], WORKLOAD=name)
    module["TOTAL"] = JOBS_PER_DATASET * len(DATASETS)
    module["NEAR"] = {
        s: frozenset(o for o, d in DISTANCES[s].items() if d <= MAX_DISTANCE) for s in SITES
    }


WORKLOAD = "short"


def count_requests(
    idle: Sequence[Mapping[str, Any]], match_expr: str, holders: Callable[[Any], frozenset[str]]
) -> tuple[dict[str, float], float, float]:
    """Each idle job adds 1/n to each of the n sites whose entry ``match_expr`` (``eval`` with
    ``job`` and ``glidein`` dicts; an exception: no match) accepts. Returns (per site, weight at
    sites holding the job's data, jobs matched)."""
    code = compile(match_expr, "<match_expr>", "eval")

    def matches(job: Mapping[str, Any], site: str) -> bool:
        try:
            return bool(eval(code, {}, {"job": job, "glidein": {"attrs": {"GLIDEIN_Site": site}}}))
        except Exception:
            return False

    by_site, at_data, total = dict.fromkeys(SITES, 0.0), 0.0, 0.0
    for job in idle:
        matched = [s for s in SITES if matches(job, s)]
        data_sites = holders(frozenset(job.get("RequiredDatasets") or []))
        for site in matched:
            by_site[site] += 1 / len(matched)
            at_data += 1 / len(matched) if site in data_sites else 0.0
        total += 1.0 if matched else 0.0
    return by_site, at_data, total


def allocate(demand: Mapping[str, float]) -> dict[str, int]:
    """BUDGET glideins in proportion to ``demand`` (largest remainder, ties to the site named
    first), never more than ``ceil(demand)`` nor PER_SITE at a site."""
    wanted = {s: min(PER_SITE, math.ceil(d - 1e-9)) for s, d in demand.items()}
    if sum(wanted.values()) <= BUDGET:
        return wanted
    quota = {s: BUDGET * d / sum(demand.values()) for s, d in demand.items()}
    out = {s: min(wanted[s], math.floor(q)) for s, q in quota.items()}
    order = sorted(SITES, key=lambda s: (math.floor(quota[s]) - quota[s], SITES.index(s)))
    while sum(out.values()) < BUDGET:
        for s in order:
            if sum(out.values()) < BUDGET and out[s] < wanted[s]:
                out[s] += 1
    return out


def distances_config(budget: int) -> str:
    """The daemon's ``[distances]``: the operator table :data:`DISTANCES`, ``budget``."""
    rows = "".join(f"{s} = {json.dumps(r).replace(':', ' =')}\n" for s, r in DISTANCES.items())
    rows = rows.replace('"', "")  # site names are bare TOML keys
    head = f"[distances]\nenabled = true\nmax_distance = {MAX_DISTANCE}\n"
    return f"{head}remote_budget = {budget}\n\n[distances.sites]\n{rows}\n"


def _slot(host: object) -> str:
    return str(host).split("@")[0].split("_")[0]  # slot4_1@vm -> slot4


class Experiment:
    """The pool, the daemon and the data timeline for one run of the scenarios."""

    def __init__(self, pool: Pool, daemon: Daemon, budget: int = REMOTE_BUDGET) -> None:
        self.pool, self.daemon, self.budget = pool, daemon, budget
        self.readers: dict[str, int] = {}  # the current scenario's most remote readers per site
        self.timeline: list[tuple[float, Inventory]] = []
        self.on: frozenset[str] | None = None  # slots running a glidein; None: all
        self.annotating = False
        self.at: dict[str, float] = {}  # the current scenario's events, epoch seconds
        self.passes: list[dict[str, Any]] = []  # the current scenario's frontend passes
        self.annotated: dict[int, float] = {}  # ProcId -> first poll seeing DataLocalitySites
        self.held: list[float] = []  # polls at which the budget held a job back (see held_back)
        self.background: dict[str, Any] = {}  # the current scenario's background (end_background)

    def holders(self, required: frozenset[str], when: float) -> frozenset[str]:
        """Sites holding all of ``required`` at ``when`` by the inventory written."""
        held = next((inv for t, inv in reversed(self.timeline) if t <= when), {})
        return frozenset(site for site, names in held.items() if required <= names)

    def set_data(self, inventory: Inventory) -> None:
        """Rewrite the daemon's inventory (renamed into place) and record it as the truth."""
        path = self.daemon.directory / "inventory.toml"
        entry = '[storage.{}_DISK]\nsite = "{}"\navailable = {}\n\n'
        text = "".join(entry.format(s[-1], s, json.dumps(sorted(h))) for s, h in inventory.items())
        path.with_suffix(".tmp").write_text(text, encoding="utf-8")
        path.with_suffix(".tmp").replace(path)
        self.timeline.append((time.time(), inventory))

    def prepare(self, scenario: Scenario) -> None:
        """The daemon as the scenario needs; slots idle, with the initial data, glideins set."""
        if scenario.annotate != self.annotating:  # repeats alternate: both ways
            extra = ""
            if scenario.annotate:
                tokens = self.pool.token_dir_for(EDITOR_IDENTITY, self.daemon.directory / "editor")
                extra = f'[collector]\nenabled = false\npool = "{self.pool.collector_address}"\n'
                extra += f'token_dir = "{tokens}"\n\n[jobs]\nannotate = true\n'
            self.daemon.stop()
            start_static(self.daemon, extra + self.distances())
            self.annotating = scenario.annotate
        self.set_data(INITIAL)
        self.set_glideins(None if scenario.match_expr is None else frozenset())
        want = {(s, INITIAL[SLOTS[s]], NEAR[SLOTS[s]], self.on is None or s in self.on, "Unclaimed")
                for s in SLOTS}  # fmt: skip

        def seen() -> set[tuple[str, frozenset[str], frozenset[str], bool, str]]:
            ads = self.pool.slot_ads(["AvailableDatasets", NEAR_ATTRIBUTE, "State", "GlideinOn"])
            return {(_slot(a["Name"]), frozenset(a.get("AvailableDatasets", [])),
                     frozenset(a.get(NEAR_ATTRIBUTE, [])), a.get("GlideinOn") is True,
                     a.get("State")) for a in ads}  # fmt: skip

        wait_for("slots as set", seen, done=want.__eq__, timeout_s=60.0, ignore=TRANSIENT)
        self.at, self.passes, self.readers = {}, [], dict.fromkeys(SITES, 0)
        self.annotated, self.held = {}, []

    def distances(self) -> str:
        """The daemon's ``[distances]`` (:func:`distances_config`) with this run's budget."""
        return distances_config(self.budget)

    def remote_readers(self, ads: Sequence[Any]) -> dict[str, int]:
        """Running jobs not at a site holding their data at their start, per site they read
        from (every site then holding all their data, as the budget counts them)."""
        count = dict.fromkeys(SITES, 0)
        for ad in ads:
            if ad["JobStatus"] != RUNNING or ad.get("JobStartDate") is None:
                continue
            required = frozenset(str(d) for d in ad.get("RequiredDatasets") or [])
            holders = self.holders(required, float(ad["JobStartDate"]))
            if SLOTS.get(_slot(ad.get("RemoteHost"))) not in holders:
                for site in holders:
                    count[site] += 1
        return count

    def held_back(self, ads: Sequence[Any], readers: Mapping[str, int], now: float) -> bool:
        """The budget binds: an idle job whose data sites are all at the budget, while a slot
        at a site near one of them (holding none of its data) is unclaimed."""
        unclaimed = {SLOTS[_slot(a["Name"])] for a in self.pool.slot_ads(["State"])
                     if a.get("State") == "Unclaimed"}  # fmt: skip
        for ad in ads:
            if ad["JobStatus"] != IDLE:
                continue
            holders = self.holders(frozenset(str(d) for d in ad.get("RequiredDatasets") or []), now)
            near = {n for h in holders for n in NEAR[h]} - holders
            if holders and all(readers[h] >= self.budget for h in holders) and near & unclaimed:
                return True
        return False

    def set_glideins(self, on: frozenset[str] | None) -> None:
        """Glideins on exactly these slots (None: all): ``SLOTn_GlideinOn`` + startd reconfig."""
        if on == self.on:
            return
        self.pool.remove_config(GLIDEINS)
        if on is not None:
            text = "".join(f"{s.upper()}_GlideinOn = {s in on}\n" for s in SLOTS)
            self.pool.write_config(GLIDEINS, text)
        self.pool.run_in_chroot(["condor_reconfig", "-daemon", "startd"])
        self.on = on

    def start_background(self) -> int | None:
        """Submit :data:`BACKGROUND` (None when empty) and wait until each of its jobs runs on
        a slot of its site."""
        if not BACKGROUND:
            return None
        cluster = self.pool.submit(background_submit(BACKGROUND, BACKGROUND_SLEEP_S))
        want = {s: n for s, n in BACKGROUND.items() if n}

        def running() -> dict[str, int]:
            ads = self.pool.schedd.query(f"ClusterId == {cluster}", ["JobStatus", "RemoteHost"])
            on = [SLOTS.get(_slot(a.get("RemoteHost"))) for a in ads if a["JobStatus"] == RUNNING]
            return {s: on.count(s) for s in SITES if s in on}

        wait_for("background running", running, done=want.__eq__, timeout_s=60.0, ignore=TRANSIENT)
        return cluster

    def end_background(self, cluster: int | None) -> dict[str, Any]:
        """Check that the background held its slots from before the submission to now (each job
        running, started once, before the measured submit), then remove it."""
        if cluster is None:
            return {}
        attrs = ["JobStatus", "JobStartDate", "NumJobStarts", "RemoteHost"]
        ads = self.pool.schedd.query(f"ClusterId == {cluster}", attrs)
        self.pool.run_in_chroot(["condor_rm", str(cluster)], user=SUBMIT_USER, check=False)
        held = [a["JobStatus"] == RUNNING and a.get("NumJobStarts") == 1
                and float(a["JobStartDate"]) <= self.at["submitted"] for a in ads]  # fmt: skip
        sites = [SLOTS.get(_slot(a.get("RemoteHost"))) for a in ads]
        return {
            "background_jobs": len(ads),
            "background_by_site": {s: sites.count(s) for s in SITES if s in sites},
            "background_held_throughout": len(ads) == sum(BACKGROUND.values()) and all(held),
        }

    def run(self, scenario: Scenario) -> dict[str, Any]:
        """Prepare, start the background, submit, poll every POLL_S until the cluster is gone
        or DEADLINE_S, score (the background is not scored)."""
        self.prepare(scenario)
        began, load = datetime.now(UTC), os.getloadavg()[0]
        background = self.start_background()
        self.at["submitted"] = float(int(time.time()))  # QDate has whole seconds
        cluster, schedd = self.pool.submit(scenario.submit()), self.pool.schedd
        next_pass = self.at["submitted"] + FRONTEND_PERIOD_S / 2  # a periodic frontend's phase
        while True:
            now = time.time()
            ads = schedd.query(constraint=f"ClusterId == {cluster}", projection=JOB_ATTRS)
            if not ads or now - self.at["submitted"] > DEADLINE_S:
                self.at["ended"] = now
                self.background = self.end_background(background)
                window = [t.isoformat(timespec="seconds") for t in (began, datetime.now(UTC))]
                conditions = {
                    "utc_window": window,
                    "load_1m": [round(load, 2), round(os.getloadavg()[0], 2)],
                }
                return {**self.score(scenario, self.records(cluster)), **conditions}
            self.move_data(TOTAL - sum(ad["JobStatus"] == IDLE for ad in ads), now)
            readers = self.remote_readers(ads)
            for site, n in readers.items():
                self.readers[site] = max(self.readers[site], n)
            for ad in ads:
                if ad.get("DataLocalitySites") is not None:
                    self.annotated.setdefault(int(ad["ProcId"]), now)
            if scenario.key == "near" and self.held_back(ads, readers, now):
                self.held.append(round(now - self.at["submitted"], 1))
            if scenario.match_expr is not None and now >= next_pass:
                self.passes.append(self.frontend_pass(scenario.match_expr, ads))
                next_pass = now + FRONTEND_PERIOD_S
            time.sleep(POLL_S)

    def move_data(self, started: int, now: float) -> None:
        """Half the jobs started: replicate MOVING to MOVE_TO, OVERLAP_S later remove it from
        MOVE_FROM; note the first poll at which the collector's slot ads followed each step."""
        inv, at = dict(self.timeline[-1][1]), self.at
        if "replicated" not in at and 2 * started >= TOTAL:
            self.set_data({**inv, MOVE_TO: inv[MOVE_TO] | {MOVING}})
            at["replicated"] = now
        elif "moved" not in at and now - at.get("replicated", math.inf) >= OVERLAP_S:
            self.set_data({**inv, MOVE_FROM: inv[MOVE_FROM] - {MOVING}})
            at["moved"] = time.time()
        if "replicated" not in at or "ads_moved" in at:
            return
        ads = self.pool.slot_ads(["AvailableDatasets"])
        held = {(SLOTS[_slot(a["Name"])], MOVING in a.get("AvailableDatasets", [])) for a in ads}
        if (MOVE_TO, False) not in held:
            at.setdefault("ads_replicated", now)
        if "moved" in at and (MOVE_FROM, True) not in held:
            at["ads_moved"] = now

    def frontend_pass(self, match_expr: str, ads: Sequence[Any]) -> dict[str, Any]:
        """Requests from the idle jobs' ads (lists stay lists, as with the bindings), glideins
        per site (a busy one stays until its job ends), slots switched on."""
        now = time.time()
        idle = [{k: ad.eval(k) for k in ad} for ad in ads if ad["JobStatus"] == IDLE]
        by_site, at_data, total = count_requests(idle, match_expr, lambda r: self.holders(r, now))
        target, slots = allocate(by_site), self.pool.slot_ads(["State"])
        busy = {_slot(ad["RemoteHost"]) for ad in ads if ad["JobStatus"] == RUNNING}
        busy |= {_slot(a["Name"]) for a in slots if a.get("State") == "Claimed"}
        per_site = {s: max(target[s], [SLOTS[b] for b in busy].count(s)) for s in SITES}
        on: set[str] = set()
        for site, count in per_site.items():
            mine = [s for s in SLOTS if SLOTS[s] == site]
            on.update(sorted(mine, key=lambda s: (s not in busy, int(s[4:])))[:count])
        self.set_glideins(frozenset(on))
        return {"t_s": round(now - self.at["submitted"], 1), "idle": len(idle), "total": total,
                "requests": {s: round(v, 3) for s, v in by_site.items()}, "glideins": per_site,
                "at_data_sites": round(at_data, 3)}  # fmt: skip

    def records(self, cluster: int) -> list[Any]:
        """Remove what is left, then every job of the cluster from the history."""
        self.pool.run_in_chroot(["condor_rm", str(cluster)], user=SUBMIT_USER, check=False)
        query = partial(self.pool.schedd.history, f"ClusterId == {cluster}", JOB_ATTRS, TOTAL)
        what, complete = f"cluster {cluster} in the history", lambda ads: len(ads) >= TOTAL
        return wait_for(what, query, done=complete, timeout_s=60.0, ignore=TRANSIENT)

    def job(self, ad: Any) -> list[Any]:
        """[proc, required, site, started_s, wait_s, local, ended_s, kind, annotated_s]:
        ``annotated_s`` the first poll (every POLL_S) seeing the job's DataLocalitySites, from
        its QDate (None: never seen, e.g. the daemon does not annotate); ``kind`` "local",
        "near" (a site near the job's holds its data, by :data:`NEAR`), "far" or None (not
        started); ``ended_s`` None for a job that did not complete."""
        site, start = ad.get("MATCH_EXP_JOB_GLIDEIN_Site"), ad.get("JobStartDate")
        required = frozenset(str(d) for d in ad.get("RequiredDatasets") or [])
        holders = self.holders(required, float(start)) if start is not None else frozenset()
        local = start is not None and site in holders
        kind = None if start is None else "local" if local else "far"
        kind = "near" if kind == "far" and holders & NEAR.get(str(site), frozenset()) else kind
        wait = (self.at["ended"] if start is None else float(start)) - float(ad["QDate"])
        started = None if start is None else round(float(start) - self.at["submitted"], 1)
        end = ad.get("CompletionDate") or None  # 0 or missing: not completed
        ended = None if end is None else round(float(end) - self.at["submitted"], 1)
        seen = self.annotated.get(int(ad["ProcId"]))
        annotated = None if seen is None else round(seen - float(ad["QDate"]), 1)
        return [int(ad["ProcId"]), sorted(required), site, started, round(wait, 1), local,
                ended, kind, annotated]  # fmt: skip

    def lent_while_waiting(self, jobs: Sequence[Sequence[Any]]) -> dict[str, float]:
        """Per site: slot-seconds (from the jobs' start and end seconds, every POLL_S) in which
        a slot there ran a job whose data the site did not hold while a job whose data it held
        was still queued: the site's slots lent to other data while its own jobs waited."""
        done = [j for j in jobs if j[3] is not None and j[6] is not None]
        out, end = dict.fromkeys(SITES, 0.0), max((j[6] for j in done), default=0.0)
        for step in range(int(end / POLL_S)):
            t = step * POLL_S
            when = self.at["submitted"] + t
            queued = [j for j in jobs if j[3] is None or j[3] > t]
            wanted = {h for j in queued for h in self.holders(frozenset(j[1]), when)}
            for j in done:
                mine = j[2] in self.holders(frozenset(j[1]), when)
                if j[3] <= t < j[6] and not mine and j[2] in wanted:
                    out[j[2]] += POLL_S
        return out

    def score(self, scenario: Scenario, ads: Sequence[Any]) -> dict[str, Any]:
        """The scenario's numbers (LOCALITY.md says what each is) and every job."""
        jobs = sorted(self.job(ad) for ad in ads)
        started = [j for j in jobs if j[3] is not None]
        moved = self.at.get("moved", math.inf) - self.at["submitted"]
        local = {"": [j[5] for j in started]}
        local["_before_move"] = [j[5] for j in started if j[3] < moved]
        local["_after_move"] = [j[5] for j in started if j[3] >= moved]
        stranded = [j for j in jobs if j[3] is None and self.holders(frozenset(j[1]), math.inf)]
        waits, passes, ends = [j[4] for j in jobs], self.passes, [j[6] for j in jobs]
        kinds, marks = [j[7] for j in started], [j[8] for j in jobs if j[8] is not None]
        last_end = self.at["ended"] - self.at["submitted"] if None in ends else max(ends)
        requested = sum(p["total"] for p in passes)
        at_data = sum(p["at_data_sites"] for p in passes) / requested if requested else None
        return {
            **asdict(scenario),
            "started": len(started),
            "local": sum(local[""]),
            **{f"local_fraction{k}": sum(v) / len(v) if v else None for k, v in local.items()},
            **{
                f"{k}_fraction": kinds.count(k) / len(kinds) if kinds else None
                for k in ("near", "far")
            },
            "makespan_s": round(last_end, 1),
            "max_remote_readers": max(self.readers.values()),
            "remote_readers_by_site": self.readers,
            **({"budget": self.budget} if scenario.key == "near" else {}),
            "started_after_move": len(local["_after_move"]),
            "stranded": len(stranded),
            "wait_median_s": statistics.median(waits),
            "wait_p95_s": statistics.quantiles(waits, n=20, method="inclusive")[-1],
            "last_start_s": max((j[3] for j in started), default=None),
            "first_start_s": min((j[3] for j in started), default=None),
            "annotated_median_s": statistics.median(marks) if marks else None,
            "annotated_max_s": max(marks, default=None),
            "budget_held_polls": len(self.held),
            "budget_held_at_s": self.held[:50],
            "lent_while_waiting_s": self.lent_while_waiting(jobs),
            "total": TOTAL,
            **self.background,
            **{f"{k}_at_s": round(t - self.at["submitted"], 1) for k, t in self.at.items()},
            "request_share_at_data_sites": at_data,
            "frontend_passes": passes,
            "jobs": jobs,
        }


def negotiator_config(budget: int) -> str:
    """deploy/condor/60-hydrator-near.conf with ``budget`` remote readers per site."""
    text = NEAR_CONF.read_text(encoding="utf-8")
    line = re.compile(r"^CONCURRENCY_LIMIT_DEFAULT_REMOTE = \d+$", re.M)
    if not line.search(text):
        raise SystemExit(f"{NEAR_CONF}: no CONCURRENCY_LIMIT_DEFAULT_REMOTE line")
    return line.sub(f"CONCURRENCY_LIMIT_DEFAULT_REMOTE = {budget}", text)


def orders(keys: Sequence[str], repeats: int) -> list[list[str]]:
    """The scenario order of each repeat: ``keys`` rotated by the repeat's index, so that with
    as many repeats as scenarios each runs once in every position (none always first)."""
    return [[*keys[i % len(keys) :], *keys[: i % len(keys)]] for i in range(repeats)]


def run_all(
    only: Sequence[str],
    budget: int = REMOTE_BUDGET,
    repeats: int = 1,
    save: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """The scenarios (all, or those in ``only``) on the real pool, ``repeats`` times in the
    :func:`orders`; stopped and unmounted after. The daemon runs with the near table
    throughout, the negotiator with the remote budget. ``save`` gets the record so far after
    each scenario (``complete`` false until the last)."""
    keys = [s.key for s in scenarios() if not only or s.key in only]
    by_key = {s.key: s for s in scenarios()}
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="hydrator-locality-") as tmp:
        work = Path(tmp)
        layout = LAYOUT + negotiator_config(budget)
        (work / "layout.conf").write_text(layout, encoding="utf-8")
        extra = {"HYDRATOR_POOL_EXTRA_CONFIG": str(work / "layout.conf")}
        with mock.patch.dict(os.environ, extra), running_pool(work / "token") as pool:
            began = _began(pool.run_in_chroot(["condor_version"]).stdout.splitlines()[0])
            experiment = Experiment(pool, Daemon(work), budget)
            experiment.set_data(INITIAL)

            def record(complete: bool) -> dict[str, Any]:
                return _record(runs, began, layout, budget, complete)

            try:
                start_static(experiment.daemon, experiment.distances())
                install_hook(pool, experiment.daemon.url, SITES)
                for repeat, order in enumerate(orders(keys, repeats)):
                    runs.append({"repeat": repeat, "order": order, "scenarios": []})
                    for key in order:
                        print(f"repeat {repeat} scenario {key}: {by_key[key].title}", flush=True)
                        result = experiment.run(by_key[key])
                        runs[-1]["scenarios"].append(result)
                        print(row(result), flush=True)
                        if save is not None:
                            save(record(False))
            finally:
                pool.remove_all_jobs()
                experiment.daemon.stop()
                pool.remove_config(GLIDEINS)
                remove_hook(pool)
    return record(True)


def _began(version: str) -> dict[str, Any]:
    """What the record says of its start: the pool is ours from here (load, UTC, commit)."""
    git = ["git", "-C", str(HERE), "log", "-1", "--format=%h %s"]
    return {
        "load_avg_start": [round(x, 2) for x in os.getloadavg()],
        "utc_start": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": subprocess.run(git, capture_output=True, text=True, check=False).stdout.strip(),
        "condor_version": version,
    }


def _record(
    runs: Sequence[Mapping[str, Any]],
    began: Mapping[str, Any],
    layout: str,
    budget: int,
    complete: bool,
) -> dict[str, Any]:
    """The record: ``meta`` (:func:`_began`'s, and the end so far), ``parameters``;
    ``scenarios`` every scenario of every repeat; ``runs`` each repeat's order and targets;
    ``median`` per scenario key, and its targets."""
    meta = {
        **machine(),
        "load_avg_start_end": [began["load_avg_start"], [round(x, 2) for x in os.getloadavg()]],
        "utc_window": [began["utc_start"], datetime.now(UTC).isoformat(timespec="seconds")],
        "commit": began["commit"],
        "condor_version": began["condor_version"],
        "complete": complete,
    }
    plain = (int, float, str, tuple, list, dict)  # with CYCLE_S, HOOK_PERIOD_S from tests/support
    constants = {k: v for k, v in globals().items() if k.isupper() and isinstance(v, plain)}
    constants.pop("TRANSIENT")  # exception types
    constants.update(LAYOUT=layout, REMOTE_BUDGET=budget)
    flat = [{**s, "repeat": run["repeat"]} for run in runs for s in run["scenarios"]]
    summary = [
        {"repeat": r["repeat"], "order": r["order"], "near_targets": _targets(r["scenarios"])}
        for r in runs
    ]
    median = medians(flat)
    out = {"meta": meta, "parameters": constants, "scenarios": flat, "runs": summary}
    return out | {"median": median, "median_near_targets": _targets(list(median.values()))}


def _targets(scenarios: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    return [{"target": t, "measured": m, "met": ok} for t, m, ok in near_targets(scenarios)]


MEDIAN_KEYS: tuple[str, ...] = ("makespan_s", "wait_median_s", "wait_p95_s", "last_start_s")
MEDIAN_KEYS += ("local_fraction", "near_fraction", "far_fraction")


def _median(values: Sequence[float | None]) -> float | None:
    numbers = [v for v in values if v is not None]
    return statistics.median(numbers) if numbers and len(numbers) == len(values) else None


def medians(flat: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per scenario key over its runs: the median of each of :data:`MEDIAN_KEYS` (None when a
    run lacks it), ``max_remote_readers`` the most in any run, ``started`` the fewest,
    ``runs`` how many, ``budget`` (near) as run."""
    out: dict[str, dict[str, Any]] = {}
    for key in dict.fromkeys(s["key"] for s in flat):
        mine = [s for s in flat if s["key"] == key]
        values: dict[str, list[float | None]] = {k: [s.get(k) for s in mine] for k in MEDIAN_KEYS}
        out[key] = {
            "key": key,
            "runs": len(mine),
            **{k: _median(v) for k, v in values.items()},
            "max_remote_readers": max(s["max_remote_readers"] for s in mine),
            "started": min(s["started"] for s in mine),
            "total": mine[0].get("total", TOTAL),
            **({"budget": mine[0]["budget"]} if "budget" in mine[0] else {}),
        }
    return out


def near_targets(scenarios: Sequence[Mapping[str, Any]]) -> list[tuple[str, str, bool | None]]:
    """The near scenario's targets: (target, measured, met; None: a scenario it compares with
    did not run)."""
    by_key = {s["key"]: s for s in scenarios}
    near, rank, strict = by_key.get("near"), by_key.get("d"), by_key.get("c")
    if near is None:
        return []
    shares = (near["local_fraction"] or 0) + (near["near_fraction"] or 0)
    total = near.get("total", TOTAL)
    done = near["started"] == total
    readers, budget, span = near["max_remote_readers"], near["budget"], near["makespan_s"]
    out = [
        ("100 % of jobs local or near", f"{100 * shares:.0f} % of {near['started']}/{total}",
         done and shares == 1.0),
        ("remote readers per site <= budget", f"{readers} (budget {budget})", readers <= budget),
    ]  # fmt: skip
    ceiling = None if rank is None else rank["makespan_s"]
    met = None if ceiling is None else span <= ceiling
    out.append(("makespan <= rank-only's", f"{span} s vs {ceiling} s", met))
    ceiling = None if strict is None else round(0.7 * strict["makespan_s"], 1)
    met = None if ceiling is None else span <= ceiling
    out.append(("makespan >= 30 % shorter than strict's", f"{span} s vs <= {ceiling} s", met))
    return out


def _fmt(value: float | None, percent: bool = True) -> str:
    return "-" if value is None else f"{100 * value:.0f} %" if percent else f"{value:.0f}"


HEADER = (
    "| scenario | data-local | near | far | before move | after move | stranded | wait median s"
    " | wait p95 s | last start s | makespan s | max remote readers | requests at data sites |\n"
    + "|---"
    + "|---:" * 12
    + "|"
)


def row(s: Mapping[str, Any]) -> str:
    """One line of the table of LOCALITY.md (columns as in :data:`HEADER`)."""
    local = f"{_fmt(s['local_fraction'])} ({s['local']}/{s['started']})"
    cells = [f"({s['key']}) {s['title']}", local, _fmt(s["near_fraction"]), _fmt(s["far_fraction"])]
    cells += [_fmt(s[f"local_fraction_{k}_move"]) for k in ("before", "after")]
    cells += [s["stranded"], *(_fmt(s[k], False) for k in ("wait_median_s", "wait_p95_s"))]
    cells += [_fmt(s["last_start_s"], False), s["makespan_s"], s["max_remote_readers"]]
    return "| " + " | ".join(map(str, [*cells, _fmt(s["request_share_at_data_sites"])])) + " |"


def dry_run(only: Sequence[str], budget: int, repeats: int = 1) -> str:
    """What a run would do, without the pool: the workload's constants, the daemon's
    ``[distances]``, the negotiator's limits, the background's and each scenario's submit."""
    constants = "WORKLOAD JOBS_PER_DATASET TOTAL SLEEPS_S DEADLINE_S POLL_S FALLBACK_AFTER_S"
    constants += " MAX_DISTANCE BACKGROUND BACKGROUND_SLEEP_S"
    out = [f"{name} = {globals()[name]!r}" for name in constants.split()]
    near = {s: sorted(n) for s, n in NEAR.items()}
    out += [f"REMOTE_BUDGET = {budget}", f"NEAR = {near}"]
    keys = [s.key for s in scenarios() if not only or s.key in only]
    out += [
        f"REPEAT {i} ORDER = {' '.join(order)}" for i, order in enumerate(orders(keys, repeats))
    ]
    out += ["", distances_config(budget), negotiator_config(budget)]
    if BACKGROUND:
        out += ["# background", background_submit(BACKGROUND, BACKGROUND_SLEEP_S)]
    for scenario in (s for s in scenarios() if not only or s.key in only):
        out += [f"# scenario {scenario.key}: {scenario.title}", scenario.submit()]
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    keys = [s.key for s in scenarios()]
    parser.add_argument(
        "--scenarios", "--only", nargs="*", default=(), choices=keys, metavar="KEY",
        help=f"run only these ({' '.join(keys)}; default all)",
    )  # fmt: skip
    parser.add_argument(
        "--workload", choices=sorted(WORKLOADS), default="short",
        help="short: 2 s jobs (the first near record); busy: 15-24 s jobs, budget 1; "
        "contended: busy with other users' long jobs holding 2 of 3 slots at the data sites",
    )  # fmt: skip
    parser.add_argument("--budget", type=int, help="remote readers per site (default: workload's)")
    parser.add_argument("--json", type=Path, help="write the record here (default: print only)")
    parser.add_argument("--dry-run", action="store_true", help="print what would run; no pool")
    parser.add_argument(
        "--repeat", type=int, default=1, metavar="N",
        help="run the scenarios N times, each repeat in another order (rotated); the record "
        "keeps every run and the median per scenario",
    )  # fmt: skip
    args = parser.parse_args()
    if args.budget is not None and args.budget < 1:
        parser.error("--budget must be at least 1")
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    select_workload(args.workload)
    if BACKGROUND and {"e1", "e2"} & set(args.scenarios or keys):
        parser.error(f"--workload {args.workload}: e1 and e2 switch slots off, which the "
                     "background needs: choose --scenarios among a b c d d2 near")  # fmt: skip
    budget = REMOTE_BUDGET if args.budget is None else args.budget
    if args.dry_run:
        print(dry_run(args.scenarios, budget, args.repeat))
        return
    results = run_all(args.scenarios, budget, args.repeat, partial(_write, args.json))
    _write(args.json, results)
    print(HEADER + "\n" + "\n".join(row(s) for s in results["scenarios"]))
    for run in results["runs"]:
        for t in run["near_targets"]:
            print(f"repeat {run['repeat']} near target: {t['target']}: {t['measured']}: "
                  f"{_verdict(t['met'])}")  # fmt: skip
    for key, m in results["median"].items():
        most = m["max_remote_readers"]
        print(f"median of {m['runs']} ({key}): makespan {m['makespan_s']} s, "
              f"wait p95 {m['wait_p95_s']} s, max remote readers {most}")  # fmt: skip
    for t in results["median_near_targets"]:
        print(f"median near target: {t['target']}: {t['measured']}: {_verdict(t['met'])}")
    if any(t["met"] is False for t in results["median_near_targets"]):
        sys.exit(1)


def _write(path: Path | None, record: Mapping[str, Any]) -> None:
    """The record as JSON at ``path`` (None: nowhere)."""
    if path is not None:
        path.write_text(json.dumps(record, indent=1, default=sorted) + "\n", "utf-8")


def _verdict(met: bool | None) -> str:
    return (
        "not checked (a scenario compared did not run)"
        if met is None
        else "met"
        if met
        else "MISSED"
    )


if __name__ == "__main__":
    main()
