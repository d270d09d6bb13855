"""The locality experiment (issue 11): do data-bound jobs run where their data is, and does
provisioning follow the data? On the real test pool, with the hydrator daemon running.

    .venv/bin/python -m benchmarks.locality run       # ~5 min, holds the pool lock; root
    .venv/bin/python -m benchmarks.locality report    # table and plot again from the JSON

``run`` writes ``benchmarks/locality.json`` and ``benchmarks/locality.png`` and prints the
Markdown table of ``benchmarks/LOCALITY.md``.

Setup. The test pool (``tests/support/pool.py``) starts with this run's own slot layout, given
through ``HYDRATOR_POOL_EXTRA_CONFIG`` (appended to the pool config for this start only; the
next ``scripts/condor-pool start`` writes the default 4-slot layout again): 12 static slots,
3 per site SITE_A..SITE_D (``SLOTn_GLIDEIN_Site``), ``CLAIM_WORKLIFE = 0`` (every job goes
through the negotiator, so no job reuses a claim matched against an older slot ad), and
``START = GlideinOn =?= True`` with a per-slot ``GlideinOn``. ``hydrator run`` serves a static
inventory (A_DISK..D_DISK); the execute-node hook runs as one STARTD_CRON job per site (every
2 s) and puts each site's lists into its slots, as on real execute nodes.

Data: ska:exp_a at SITE_A, ska:exp_b at SITE_B, ska:exp_c at SITE_C, nothing at SITE_D. Each
scenario submits one cluster of 48 jobs (16 per dataset, interleaved, ``sleep 2``) at once: a
workflow larger than the pool (2 s: a slot is free again well before the negotiator's next
5 s cycle; a job length close to the cycle made rounds 5 or 10 s long by chance). When half of
them have started, ska:exp_a is replicated to SITE_D and, 5 s later, removed from SITE_A (the
inventory file is rewritten; the daemon's next cycle follows). Scenarios, one after another,
each from the initial data:

(a) no locality: ``RequiredDatasets`` only;
(b) site list fixed at submit (CMS): ``DESIRED_Sites`` = the dataset's sites at submit time and
    ``requirements = stringListMember(TARGET.GLIDEIN_Site, MY.DESIRED_Sites)``;
(c) hydrator, strict: the ``hydrator expr`` lines (requirements and rank);
(d) hydrator, rank only: the ``hydrator expr`` rank, no requirements;
(d2) rank, local first with a bounded wait: ``hydrator expr --fallback-after 20`` (the strict
    requirements OR queued longer than 20 s, and the rank; see ``FALLBACK_AFTER_S``);
(e) provisioning: the jobs of (c), but a slot may only take jobs while a "glidein" runs on it
    (``GlideinOn``). A simulated GlideinWMS frontend (``benchmarks/locality_model.py``) every 5 s
    (first 2.5 s after the submission: half a period, the expected phase of a periodic frontend)
    evaluates ``match_expr`` over the idle jobs' ads read from the schedd and one entry per site,
    counts each job 1/n at each of its n matching entries, and splits a budget of 6 glideins
    (half the pool; at most 3 per site) in proportion; a busy glidein stays until its job ends.
    Starting a glidein = setting ``SLOTn_GlideinOn`` in a config fragment + ``condor_reconfig``
    of the startd. (e1) without annotation: a frontend that knows nothing about data
    (``match_expr`` ``True``: requests spread by idle-job count); (e2) with the hydrator's job
    annotation (``[jobs] annotate = true``) and the ``match_expr`` from docs/provisioning.md.

Scoring (``locality_model.score``): data-local = the slot's site (``MATCH_EXP_JOB_GLIDEIN_Site``,
GlideinWMS's ``$$(GLIDEIN_Site)`` convention) held all the job's data at its start second
(``JobStartDate``); stranded = idle at the scenario's end (all done, or 150 s) while its data
is complete somewhere; wait = ``JobStartDate - QDate``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.locality_model import (
    Inventory,
    JobRecord,
    Timeline,
    allocate,
    compile_match_expr,
    count_requests,
    glideins,
    is_local,
    match_expr_from_doc,
    score,
)
from benchmarks.run import machine
from hydrator.config import ClassAdConfig
from hydrator.core.expr import job_expressions
from hydrator.domain import DatasetId
from tests.support.daemon import Daemon
from tests.support.pool import (
    EDITOR_IDENTITY,
    IDLE,
    RUNNING,
    SUBMIT_USER,
    Pool,
    running_pool,
)
from tests.support.pool_hook import install_hook, remove_hook
from tests.support.static_inventory import TRANSIENT, start_static
from tests.support.wait import wait_for

HERE = Path(__file__).parent
REPO = HERE.parent
PROVISIONING_DOC = REPO / "docs" / "provisioning.md"

SITES = ("SITE_A", "SITE_B", "SITE_C", "SITE_D")
SLOTS_PER_SITE = 3
SLOT_SITES = {f"slot{i + 1}": SITES[i // SLOTS_PER_SITE] for i in range(12)}
STORAGE = {site: f"{site[-1]}_DISK" for site in SITES}
DATASETS = ("ska:exp_a", "ska:exp_b", "ska:exp_c")
INITIAL: Inventory = {
    "SITE_A": frozenset({"ska:exp_a"}),
    "SITE_B": frozenset({"ska:exp_b"}),
    "SITE_C": frozenset({"ska:exp_c"}),
    "SITE_D": frozenset(),
}
MOVING, MOVE_FROM, MOVE_TO = "ska:exp_a", "SITE_A", "SITE_D"
JOBS_PER_DATASET = 16
# (d2): a job waits for a slot at its data's site this long, then takes any slot. About two
# thirds of the strict drain (16 jobs per dataset on its site's 3 slots: 6 rounds of the 5 s
# negotiation cycle, ~30 s): long enough for the normal wait for a local slot (median 11 s in
# (c)), short enough to bound the tail.
FALLBACK_AFTER_S = 20
SLEEP_S = 2
DEADLINE_S = 150.0
MOVE_OVERLAP_S = 5.0
POLL_S = 1.0
FRONTEND_PERIOD_S = 5.0
GLIDEIN_BUDGET = 6
GLIDEIN_FRAGMENT = "61-locality-glideins"
NO_DATA_MATCH_EXPR = "True"  # a frontend that knows nothing about data: every entry matches
JOB_ATTRS = [
    "ClusterId",
    "ProcId",
    "JobStatus",
    "QDate",
    "JobStartDate",
    "LastMatchTime",
    "RemoteHost",
    "LastRemoteHost",
    "MATCH_EXP_JOB_GLIDEIN_Site",
    "RequiredDatasets",
    "DataLocalitySites",
    "DataLocalityPartialSites",
    "DataLocalitySitesUpdated",
    "DESIRED_Sites",
]


# -- the jobs --------------------------------------------------------------------------------


def _hydrator_lines() -> dict[str, str]:
    """``hydrator expr`` output for one dataset, with the name as the submit macro
    ``$(Dataset)`` so one cluster can hold jobs for different datasets."""
    expr = job_expressions([DatasetId.parse("ska:placeholder")], ClassAdConfig())

    def templated(text: str) -> str:
        return text.replace('"ska:placeholder"', '"$(Dataset)"')

    fallback = job_expressions(
        [DatasetId.parse("ska:placeholder")], ClassAdConfig(), fallback_after_s=FALLBACK_AFTER_S
    )
    return {
        "required": "My.RequiredDatasets = " + templated(expr.required),
        "requirements": "requirements = " + templated(expr.requirements),
        "rank": "rank = " + templated(expr.rank),
        "fallback": "requirements = " + templated(fallback.requirements),
    }


def job_lines(kind: str) -> list[str]:
    """Submit lines for a scenario's jobs: ``none``, ``desired``, ``strict``, ``rank`` or
    ``fallback`` (``hydrator expr --fallback-after FALLBACK_AFTER_S``)."""
    h = _hydrator_lines()
    return {
        "none": [h["required"]],
        "desired": [
            h["required"],
            'My.DESIRED_Sites = "$(Sites)"',
            "requirements = stringListMember(TARGET.GLIDEIN_Site, MY.DESIRED_Sites)",
        ],
        "strict": [h["required"], h["requirements"], h["rank"]],
        "rank": [h["required"], h["rank"]],
        "fallback": [h["required"], h["fallback"], h["rank"]],
    }[kind]


def submit_description(key: str, kind: str, inventory: Inventory) -> str:
    """One cluster: ``JOBS_PER_DATASET`` jobs per dataset, interleaved; ``$(Sites)`` is where
    the dataset is at submit time (what a CMS-style submitter would fix)."""
    rows = []
    for _ in range(JOBS_PER_DATASET):
        for dataset in DATASETS:
            sites = sorted(s for s, held in inventory.items() if dataset in held)
            if len(sites) != 1:
                raise ValueError(f"{dataset}: expected one site at submit, got {sites}")
            rows.append(f"{dataset} {sites[0]}")
    return "\n".join(
        [
            "universe = vanilla",
            "executable = /bin/sleep",
            f"arguments = {SLEEP_S}",
            "output = /dev/null",
            "error = /dev/null",
            '+JOB_GLIDEIN_Site = "$$(GLIDEIN_Site:Unknown)"',
            f'+LocalityScenario = "{key}"',
            *job_lines(kind),
            "queue Dataset, Sites from (",
            *rows,
            ")",
            "",
        ]
    )


@dataclass(frozen=True)
class Scenario:
    key: str
    title: str
    kind: str  # job_lines kind
    match_expr: str | None = None  # provisioned by the frontend with this match_expr
    annotate: bool = False  # the daemon annotates idle jobs ([jobs] annotate)


def scenarios(annotated_match_expr: str) -> list[Scenario]:
    return [
        Scenario("a", "no locality", "none"),
        Scenario("b", "site list fixed at submit (DESIRED_Sites)", "desired"),
        Scenario("c", "hydrator, strict requirements", "strict"),
        Scenario("d", "hydrator, rank only", "rank"),
        Scenario("d2", f"rank, local first, fallback after {FALLBACK_AFTER_S} s", "fallback"),
        Scenario("e1", "provisioning, no annotation", "strict", NO_DATA_MATCH_EXPR),
        Scenario("e2", "provisioning, annotation", "strict", annotated_match_expr, True),
    ]


# -- the pool layout -------------------------------------------------------------------------


def layout_config() -> str:
    """Appended to the pool config at start (see the module docstring)."""
    lines = [
        "# benchmarks/locality.py: 4 sites x 3 static slots",
        f"NUM_CPUS = {len(SLOT_SITES)}",
        f"MEMORY = {256 * len(SLOT_SITES)}",
        "SLOT_TYPE_1 = cpus=1, memory=256",
        "SLOT_TYPE_1_PARTITIONABLE = false",
        f"NUM_SLOTS_TYPE_1 = {len(SLOT_SITES)}",
        "NUM_SLOTS_TYPE_2 = 0",
        "STARTD_ATTRS = GLIDEIN_Site GlideinOn",
        "GlideinOn = True",
        "START = GlideinOn =?= True",
        "CLAIM_WORKLIFE = 0",
    ]
    lines += [f'{slot.upper()}_GLIDEIN_Site = "{site}"' for slot, site in SLOT_SITES.items()]
    return "\n".join(lines) + "\n"


def inventory_toml(inventory: Inventory) -> str:
    return "".join(
        f"[storage.{STORAGE[site]}]\nsite = {json.dumps(site)}\n"
        f"available = {json.dumps(sorted(held))}\n\n"
        for site, held in inventory.items()
    )


def moved(inventory: Inventory, *, keep_old: bool) -> dict[str, frozenset[str]]:
    """``inventory`` with MOVING replicated to MOVE_TO (and, unless ``keep_old``, gone from
    MOVE_FROM)."""
    out = dict(inventory)
    out[MOVE_TO] = out[MOVE_TO] | {MOVING}
    if not keep_old:
        out[MOVE_FROM] = out[MOVE_FROM] - {MOVING}
    return out


def slot_site(host: object) -> str | None:
    """``slot7@host`` -> its site in this layout."""
    if not host:
        return None
    return SLOT_SITES.get(str(host).split("@")[0].split("_")[0])


def choose_slots(per_site: Mapping[str, int], busy: frozenset[str]) -> frozenset[str]:
    """Slots to run glideins on: ``per_site[site]`` of that site's slots, busy ones first."""
    chosen: set[str] = set()
    for site, count in per_site.items():
        slots = sorted(
            (s for s, where in SLOT_SITES.items() if where == site),
            key=lambda s: (s not in busy, int(s[4:])),
        )
        chosen.update(slots[:count])
    return frozenset(chosen)


def job_dict(ad: Any) -> dict[str, Any]:
    """A job ad as the frontend sees it (the Python bindings' values: lists stay lists)."""
    out = {}
    for key in ad:
        value = ad.eval(key)
        if isinstance(value, str | int | float | bool | list):
            out[key] = value
    return out


def required_of(job: Mapping[str, Any]) -> frozenset[str]:
    value = job.get("RequiredDatasets") or []
    return frozenset(str(v) for v in value)


def annotated_match_expr() -> str:
    """The GlideinWMS ``match_expr`` docs/provisioning.md gives, exactly as written there."""
    return match_expr_from_doc(PROVISIONING_DOC.read_text(encoding="utf-8"))


def annotation_config(pool: Pool, token_dir: Path) -> str:
    """Daemon config added for (e2): the job annotation of issue 11, as the pool's dedicated
    editor identity (``token_dir`` holds its IDTOKEN); no slot merging (the hook does that)."""
    return (
        f'[collector]\nenabled = false\npool = "{pool.collector_address}"\n'
        f'token_dir = "{token_dir}"\n\n[jobs]\nannotate = true\n'
    )


# -- one run ---------------------------------------------------------------------------------


@dataclass
class Run:
    """What one scenario's monitoring loop saw (epoch seconds)."""

    cluster: int
    submitted: float
    ended: float = 0.0
    replicated: float | None = None
    moved: float | None = None
    frontend: list[dict[str, Any]] | None = None
    ads_replicated: float | None = None  # first poll: every MOVE_TO slot ad lists MOVING
    ads_moved: float | None = None  # first poll: no MOVE_FROM slot ad lists MOVING


class Experiment:
    """The pool, the daemon and the data timeline for one run of all scenarios."""

    def __init__(self, pool: Pool, daemon: Daemon) -> None:
        self.pool = pool
        self.daemon = daemon
        self.timeline = Timeline()
        self.inventory: Inventory = INITIAL
        self.on: frozenset[str] | None = None  # slots running a glidein; None: all (layout)
        self.annotating = False

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """Daemon and hooks up, initial data in every slot ad; everything undone afterwards."""
        self.set_data(INITIAL)
        try:
            start_static(self.daemon)
            install_hook(self.pool, self.daemon.url, SITES)
            self.wait_for_ads()
            yield
        finally:
            self.pool.remove_all_jobs()
            self.daemon.stop()
            self.pool.remove_config(GLIDEIN_FRAGMENT)
            remove_hook(self.pool)

    def set_data(self, inventory: Inventory) -> None:
        """Rewrite the daemon's inventory (atomically) and record it as the truth from now."""
        path = self.daemon.directory / "inventory.toml"
        path.with_suffix(".tmp").write_text(inventory_toml(inventory), encoding="utf-8")
        path.with_suffix(".tmp").replace(path)
        self.inventory = inventory
        self.timeline.record(time.time(), inventory)

    def wait_for_ads(self, timeout_s: float = 60.0) -> None:
        """Until every slot advertises exactly its site's datasets."""

        def current() -> bool:
            ads = self.pool.slot_ads(["AvailableDatasets"])
            seen = {
                str(ad["Name"]).split("@")[0]: frozenset(ad.get("AvailableDatasets") or [])
                for ad in ads
            }
            return all(seen.get(slot) == self.inventory[site] for slot, site in SLOT_SITES.items())

        wait_for("slot ads show the inventory", current, timeout_s=timeout_s, ignore=TRANSIENT)

    def set_glideins(self, on: frozenset[str] | None) -> None:
        """Glideins on exactly these slots (None: all): ``SLOTn_GlideinOn`` + startd reconfig."""
        if on == self.on:
            return
        if on is None:
            self.pool.remove_config(GLIDEIN_FRAGMENT)
        else:
            text = "".join(f"{slot.upper()}_GlideinOn = {slot in on}\n" for slot in SLOT_SITES)
            self.pool.write_config(GLIDEIN_FRAGMENT, text)
        self.pool.run_in_chroot(["condor_reconfig", "-daemon", "startd"])
        self.on = on

    def wait_until_quiet(self, timeout_s: float = 60.0) -> None:
        """Until every slot is unclaimed and shows the wanted ``GlideinOn``."""
        want = set(SLOT_SITES) if self.on is None else set(self.on)

        def quiet() -> bool:
            ads = self.pool.slot_ads(["State", "GlideinOn"])
            on = {str(ad["Name"]).split("@")[0] for ad in ads if ad.get("GlideinOn") is True}
            free = all(ad.get("State") == "Unclaimed" for ad in ads)
            return free and len(ads) == len(SLOT_SITES) and on == want

        wait_for("slots unclaimed, glideins as set", quiet, timeout_s=timeout_s, ignore=TRANSIENT)

    def restart_daemon(self, annotate: bool) -> None:
        extra = ""
        if annotate:
            tokens = self.pool.token_dir_for(EDITOR_IDENTITY, self.daemon.directory / "editor")
            extra = annotation_config(self.pool, tokens)
        self.daemon.stop()
        start_static(self.daemon, extra)
        self.annotating = annotate

    def run(self, scenario: Scenario) -> dict[str, Any]:
        """Prepare, submit, drive until done or the deadline, score."""
        if scenario.annotate != self.annotating:
            self.restart_daemon(scenario.annotate)
        self.set_data(INITIAL)
        self.set_glideins(frozenset() if scenario.match_expr is not None else None)
        self.wait_for_ads()
        self.wait_until_quiet()
        description = submit_description(scenario.key, scenario.kind, self.inventory)
        submitted = float(int(time.time()))  # QDate has whole seconds
        run = Run(cluster=self.pool.submit(description), submitted=submitted)
        self.drive(run, scenario)
        records = self.records(run)
        result = score(records, self.timeline, run.ended, run.moved)
        return {
            "key": scenario.key,
            "title": scenario.title,
            "kind": scenario.kind,
            "match_expr": scenario.match_expr,
            **result,
            **self.times(run),
            "frontend": _frontend_summary(run.frontend),
            "job_records": [self.detail(j, run) for j in records],
        }

    def drive(self, run: Run, scenario: Scenario) -> None:
        """Poll the queue every POLL_S: move the data half-way, run the frontend if any; stop
        when the cluster has left the queue or at DEADLINE_S."""
        schedd = self.pool.schedd
        match = compile_match_expr(scenario.match_expr) if scenario.match_expr else None
        run.frontend = [] if match is not None else None
        # a periodic frontend's expected phase relative to a submission: half its period
        next_frontend = run.submitted + FRONTEND_PERIOD_S / 2
        total = JOBS_PER_DATASET * len(DATASETS)
        while True:
            now = time.time()
            ads = schedd.query(constraint=f"ClusterId == {run.cluster}", projection=JOB_ATTRS)
            idle = sum(1 for ad in ads if ad["JobStatus"] == IDLE)
            if not ads or now - run.submitted > DEADLINE_S:
                run.ended = now
                return
            self.move_data(run, started=total - idle, total=total, now=now)
            self.watch_ads(run, now)
            if match is not None and run.frontend is not None and now >= next_frontend:
                run.frontend.append(self.frontend_cycle(ads, match, run.submitted))
                next_frontend = now + FRONTEND_PERIOD_S
            time.sleep(POLL_S)

    def move_data(self, run: Run, started: int, total: int, now: float) -> None:
        """Half the jobs started: replicate MOVING to MOVE_TO; MOVE_OVERLAP_S later remove it
        from MOVE_FROM."""
        if run.replicated is None and started * 2 >= total:
            self.set_data(moved(self.inventory, keep_old=True))
            run.replicated = now
        elif (
            run.replicated is not None
            and run.moved is None
            and now - run.replicated >= MOVE_OVERLAP_S
        ):
            self.set_data(moved(self.inventory, keep_old=False))
            run.moved = time.time()

    def watch_ads(self, run: Run, now: float) -> None:
        """When the collector's slot ads followed the data move (to the poll's second)."""
        if run.replicated is None or run.ads_moved is not None:
            return
        ads = self.pool.slot_ads(["AvailableDatasets"])
        lists = {
            SLOT_SITES.get(str(ad["Name"]).split("@")[0]): ad.get("AvailableDatasets") for ad in ads
        }
        held = [(site, MOVING in (held or [])) for site, held in lists.items()]
        if run.ads_replicated is None and all(h for site, h in held if site == MOVE_TO):
            run.ads_replicated = now
        if run.moved is not None and not any(h for site, h in held if site == MOVE_FROM):
            run.ads_moved = now

    def frontend_cycle(self, ads: Sequence[Any], match: Any, submitted: float) -> dict[str, Any]:
        """One frontend pass over the idle jobs: requests, glideins per site, slots toggled.
        Whether a site holds a job's data is judged now (after a data move in this poll)."""
        now = time.time()
        idle = [job_dict(ad) for ad in ads if ad["JobStatus"] == IDLE]
        requests = count_requests(
            idle, SITES, match, lambda job: self.timeline.holders(required_of(job), now)
        )
        targets = allocate(requests.by_site, GLIDEIN_BUDGET, SLOTS_PER_SITE)
        busy = self.busy_slots(ads)
        per_site = glideins(
            targets,
            {site: sum(SLOT_SITES[s] == site for s in busy) for site in SITES},
            SLOTS_PER_SITE,
        )
        self.set_glideins(choose_slots(per_site, busy))
        return {
            "t_s": round(now - submitted, 1),
            "idle": len(idle),
            "requests": {s: round(v, 3) for s, v in requests.by_site.items()},
            "at_data_sites": requests.at_data_sites,
            "total": requests.total,
            "unmatched": requests.unmatched_jobs,
            "glideins": per_site,
        }

    def busy_slots(self, ads: Sequence[Any]) -> frozenset[str]:
        """Slots running one of the jobs, or claimed (a job about to start)."""
        running = {
            str(ad.get("RemoteHost")).split("@")[0]
            for ad in ads
            if ad["JobStatus"] == RUNNING and ad.get("RemoteHost")
        }
        claimed = {
            str(ad["Name"]).split("@")[0]
            for ad in self.pool.slot_ads(["State"])
            if ad.get("State") == "Claimed"
        }
        return frozenset(running | claimed)

    def records(self, run: Run) -> list[JobRecord]:
        """Remove what is left, then read every job of the cluster from the history."""
        self.pool.run_in_chroot(["condor_rm", str(run.cluster)], user=SUBMIT_USER, check=False)
        total = JOBS_PER_DATASET * len(DATASETS)
        constraint = f"ClusterId == {run.cluster}"
        ads: list[Any] = []

        def complete() -> bool:
            ads[:] = list(
                self.pool.schedd.history(constraint=constraint, projection=JOB_ATTRS, match=total)
            )
            return len(ads) >= total

        what = f"cluster {run.cluster} in the history"
        wait_for(what, complete, timeout_s=60.0, ignore=TRANSIENT)
        return sorted((_record(ad) for ad in ads), key=lambda j: j.proc)

    def times(self, run: Run) -> dict[str, Any]:
        def rel(t: float | None) -> float | None:
            return None if t is None else round(t - run.submitted, 1)

        return {
            "duration_s": rel(run.ended),
            "replicated_at_s": rel(run.replicated),
            "moved_at_s": rel(run.moved),
            "ads_replicated_at_s": rel(run.ads_replicated),
            "ads_moved_at_s": rel(run.ads_moved),
        }

    def detail(self, job: JobRecord, run: Run) -> dict[str, Any]:
        return {
            "proc": job.proc,
            "required": sorted(job.required),
            "queued_s": round(job.queued - run.submitted, 1),
            "started_s": None if job.started is None else round(job.started - run.submitted, 1),
            "matched_s": None if job.matched is None else round(job.matched - run.submitted, 1),
            "site": job.site,
            "local": is_local(job, self.timeline),
        }


def _record(ad: Any) -> JobRecord:
    site = ad.get("MATCH_EXP_JOB_GLIDEIN_Site")
    if not site or site == "Unknown":
        site = slot_site(ad.get("LastRemoteHost") or ad.get("RemoteHost"))
    started, matched = ad.get("JobStartDate"), ad.get("LastMatchTime")
    return JobRecord(
        proc=int(ad["ProcId"]),
        required=frozenset(str(d) for d in ad.get("RequiredDatasets") or []),
        queued=float(ad["QDate"]),
        started=None if started is None else float(started),
        site=None if site is None else str(site),
        matched=None if matched is None else float(matched),
    )


def _frontend_summary(cycles: list[dict[str, Any]] | None) -> dict[str, Any] | None:
    """Share of all frontend requests (proportional idle-job counts, summed over cycles) that
    fell on sites holding the requesting job's data."""
    if cycles is None:
        return None
    total = sum(c["total"] for c in cycles)
    at_data = sum(c["at_data_sites"] for c in cycles)
    return {
        "cycles": cycles,
        "request_share_at_data_sites": at_data / total if total else None,
    }


# -- the whole run ---------------------------------------------------------------------------


@contextlib.contextmanager
def pool_layout(path: Path) -> Iterator[None]:
    """This run's slot layout, appended to the pool config by ``scripts/condor-pool start``
    (only while this process starts the pool; the next start writes the default again)."""
    path.write_text(layout_config(), encoding="utf-8")
    os.environ["HYDRATOR_POOL_EXTRA_CONFIG"] = str(path)
    try:
        yield
    finally:
        os.environ.pop("HYDRATOR_POOL_EXTRA_CONFIG", None)


def parameters(annotated_expr: str) -> dict[str, Any]:
    return {
        "sites": list(SITES),
        "slots_per_site": SLOTS_PER_SITE,
        "initial_data": {s: sorted(d) for s, d in INITIAL.items()},
        "move": {"dataset": MOVING, "from": MOVE_FROM, "to": MOVE_TO},
        "move_overlap_s": MOVE_OVERLAP_S,
        "jobs_per_scenario": JOBS_PER_DATASET * len(DATASETS),
        "job_sleep_s": SLEEP_S,
        "deadline_s": DEADLINE_S,
        "frontend_period_s": FRONTEND_PERIOD_S,
        "glidein_budget": GLIDEIN_BUDGET,
        "no_data_match_expr": NO_DATA_MATCH_EXPR,
        "annotated_match_expr": annotated_expr,
        "annotated_match_expr_from": str(PROVISIONING_DOC.relative_to(REPO)),
        "hydrator_interval_s": 1,
        "hook_period_s": 2,
    }


def run_experiment(only: Sequence[str] = ()) -> dict[str, Any]:
    """Every scenario (or those named in ``only``) on the real pool; the pool is stopped and
    unmounted afterwards."""
    expr = annotated_match_expr()
    meta = machine()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="hydrator-locality-") as tmp:
        work = Path(tmp)
        with pool_layout(work / "layout.conf"), running_pool(work / "token") as pool:
            version = pool.run_in_chroot(["condor_version"]).stdout.splitlines()[0]
            experiment = Experiment(pool, Daemon(work))
            with experiment.running():
                results = []
                for scenario in scenarios(expr):
                    if only and scenario.key not in only:
                        continue
                    print(f"scenario {scenario.key}: {scenario.title}", flush=True)
                    results.append(experiment.run(scenario))
                    print(_row(results[-1]), flush=True)
    meta.update(
        condor_version=version,
        load_avg_at_end=os.getloadavg(),
        wall_s=round(time.monotonic() - started, 1),
    )
    return {"meta": meta, "parameters": parameters(expr), "scenarios": results}


# -- the report ------------------------------------------------------------------------------

HEADER = (
    "| scenario | data-local | before move | after move | stranded | wait median s "
    "| wait p95 s | requests at data sites |\n|---|---:|---:|---:|---:|---:|---:|---:|"
)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f} %"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def _row(s: Mapping[str, Any]) -> str:
    frontend = s.get("frontend") or {}
    waits = f"{_num(s['wait_median_s'])} | {_num(s['wait_p95_s'])}"
    if s["wait_censored"]:
        waits += f" (>=, {s['wait_censored']} never ran)"
    return (
        f"| ({s['key']}) {s['title']} | {_pct(s['local_fraction'])} ({s['local']}/{s['started']})"
        f" | {_pct(s.get('local_fraction_before_move'))}"
        f" | {_pct(s.get('local_fraction_after_move'))} | {s['stranded']} | {waits}"
        f" | {_pct(frontend.get('request_share_at_data_sites'))} |"
    )


def table(results: Mapping[str, Any]) -> str:
    return "\n".join([HEADER, *(_row(s) for s in results["scenarios"])]) + "\n"


def plot(results: Mapping[str, Any], path: Path) -> None:
    """Three panels: data-local share, waits (stranded noted), the frontend's requests."""
    import matplotlib  # the test extra; only for the report

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = results["scenarios"]
    labels = [f"({s['key']})" for s in runs]
    x = range(len(runs))
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(16, 4.8))
    for offset, key, name in (
        (-0.27, "local_fraction", "all jobs"),
        (0.0, "local_fraction_before_move", "started before the move"),
        (0.27, "local_fraction_after_move", "started after the move"),
    ):
        ax1.bar([i + offset for i in x], [100 * (s.get(key) or 0) for s in runs], 0.27, label=name)
    ax1.set(title="jobs that ran data-local", ylabel="%", ylim=(0, 110))
    ax1.set_xticks(list(x), labels)
    ax1.legend(fontsize=8, loc="lower right")
    ax2.bar([i - 0.2 for i in x], [s["wait_median_s"] or 0 for s in runs], 0.4, label="median")
    ax2.bar([i + 0.2 for i in x], [s["wait_p95_s"] or 0 for s in runs], 0.4, label="p95")
    for i, s in enumerate(runs):
        if s["stranded"]:
            ax2.annotate(f"{s['stranded']} stranded", (i, (s["wait_p95_s"] or 0) + 2), ha="center")
    ax2.set(title="wait (start - queue time)", ylabel="s")
    ax2.set_xticks(list(x), labels)
    ax2.legend(fontsize=8)
    _plot_frontend(ax3, [s for s in runs if s.get("frontend")])
    fig.suptitle(
        "Locality experiment: " + ", ".join(f"({s['key']}) {s['title']}" for s in runs),
        fontsize=8,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_frontend(ax: Any, runs: Sequence[Mapping[str, Any]]) -> None:
    for s in runs:
        cycles = [c for c in s["frontend"]["cycles"] if c["total"]]
        share = [100 * c["at_data_sites"] / c["total"] for c in cycles]
        (line,) = ax.plot([c["t_s"] for c in cycles], share, marker="o", label=f"({s['key']})")
        if s.get("moved_at_s") is not None:
            ax.axvline(s["moved_at_s"], color=line.get_color(), linestyle=":", linewidth=1)
    ax.set(
        title="(e) frontend requests at sites holding the data\n(dotted: data moved)",
        xlabel="s since submit",
        ylabel="% of requests",
        ylim=(0, 110),
    )
    ax.legend(fontsize=8)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["run", "report"])
    parser.add_argument("--json", type=Path, default=HERE / "locality.json")
    parser.add_argument("--png", type=Path, default=HERE / "locality.png")
    parser.add_argument("--only", nargs="*", default=(), help="scenario keys (a b c d d2 e1 e2)")
    args = parser.parse_args(argv)
    if args.command == "run":
        results = run_experiment(args.only)
        args.json.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    else:
        results = json.loads(args.json.read_text(encoding="utf-8"))
    plot(results, args.png)
    print(table(results), end="")


if __name__ == "__main__":
    main()
