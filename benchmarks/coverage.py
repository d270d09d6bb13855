"""The coverage scenario: how much of the time the pool's slot ads carry the current
lists, seen from the pool, not from the daemon. ``hydrator run`` with the default ``interval_s``
and merge settings on the test pool (real collector and startds) over a real Rucio server;
every slot ad sampled every ``--period-s`` and compared with the truth read from Rucio with
rucio-clients; glidein-like startds join and leave and a dataset comes and goes meanwhile.
Two publication paths: the daemon's collector merges (``collector``), or its HTTP endpoint read
by the execute-node hook as STARTD_CRON jobs of every startd (``hook``, new code only).
COVERAGE.md says what each figure is.

    .venv/bin/python -m benchmarks coverage --code OLD_CHECKOUT --new-code NEW_CHECKOUT \
        --paths collector hook --duration-s 600 --json benchmarks/results/coverage.json

Needs root; takes the pool for one segment (one condition, one side) at a time and releases
it between segments; the record is rewritten after each segment (``complete`` false until the
last). Exits 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from unittest import mock

import htcondor2

from benchmarks.conditions import machine
from tests.support.daemon import Daemon
from tests.support.pool import SLOT_SITES, Pool, running_pool
from tests.support.pool_hook import HOOK_IN_CHROOT, copy_hook
from tests.support.rucio_server import RucioAdmin, RucioServer, make_server, unique
from tests.support.static_inventory import TRANSIENT
from tests.support.wait import wait_for

HERE = Path(__file__).parent
SITES = ("SITE_A", "SITE_B", "SITE_C")
CHURN_SITE = "SITE_B"  # where a dataset comes and goes
TARGETS = {300: 0.995, 30: 0.98}  # UPDATE_INTERVAL s -> least coverage
NEW_STARTD_TARGET_S = 5.0
FRAGMENT = "70-coverage-bench.conf"  # the condition's pool settings, in the pool's config dir
HOOK_FRAGMENT = "71-coverage-hook.conf"  # the hook path's STARTD_CRON jobs (deploy file + sites)
DEPLOY = HERE.parent / "deploy" / "condor"
HOOK_CACHE = "$(SPOOL)/hydrator-hook"  # the deploy file's HYDRATOR_HOOK_CACHE
LAG_S = 65.0  # the default interval_s plus jitter_s: how long the catalogue may lead the ads
Lists = Mapping[str, frozenset[str]]  # site -> datasets complete there
Sample = dict[str, tuple[str, frozenset[str] | None]]  # slot name -> (site, lists or bare)
PROJECTION = ["Name", "GLIDEIN_Site", "AvailableDatasets", "DataLocalityDigest", "LastHeardFrom"]
LOAD_ATTRS = (
    "UpdatesTotal",
    "UpdatesTotal_Slot",
    "UpdatesLost",
    "ForkQueriesFromTOOL",
    "InProcQueriesFromTOOL",
    "StatsLastUpdateTime",
)
# the daemon's counters of its collector load, and of its HTTP answers (the hook path's load)
LOAD_METRICS = ("hydrator_collector", "hydrator_slot_repair", "hydrator_http_requests")


class Catalogue:
    """Three RSEs (one per site) on the Rucio server, two datasets each, and the truth read
    back with rucio-clients (``list_dataset_replicas(deep=True)``, never the hydrator)."""

    def __init__(self, server: RucioServer) -> None:
        self.server, self.admin = server, RucioAdmin(server)
        self.tag = unique("cov").lower()
        self.rses = {self.admin.rse(s, attributes={"fed": self.tag}): s for s in SITES}
        self.scope = self.admin.scope()
        self.datasets: list[str] = []
        for rse in self.rses:
            for _ in range(2):
                self.datasets.append(self.admin.dataset(self.scope, 2, at=[rse]))
                self.admin.rule(self.scope, self.datasets[-1], rse)
        server.run_abacus()
        self.moving: tuple[str, str] | None = None  # (dataset, rule id) while present
        self.timeline: list[tuple[float, float, Lists]] = [(0.0, 0.0, self.read())]

    def read(self) -> Lists:
        """Site -> the datasets whose every file is AVAILABLE at one of its RSEs, now."""
        held: dict[str, set[str]] = {s: set() for s in SITES}
        for name in self.datasets:
            for row in self.admin.client.list_dataset_replicas(self.scope, name, deep=True):
                if row["rse"] in self.rses and row["state"] == "AVAILABLE":
                    held[self.rses[row["rse"]]].add(f"{self.scope}:{name}")
        return {s: frozenset(d) for s, d in held.items()}

    def toggle(self) -> None:
        """Add a new dataset at CHURN_SITE (files, rule, abacus), or remove the one added
        (rule lifetime 0, judge-cleaner, reaper, abacus); the truth read after it."""
        rse = next(r for r, s in self.rses.items() if s == CHURN_SITE)
        started = time.time()
        if self.moving is None:
            name = self.admin.dataset(self.scope, 2, at=[rse])
            self.datasets.append(name)
            self.moving = (name, self.admin.rule(self.scope, name, rse))
            self.server.run_abacus()
        else:
            self.admin.remove_rule_now(self.moving[1], rse)
            self.moving = None
        self.timeline.append((started, time.time(), self.read()))

    def accepted(self, t: float, lag_s: float) -> list[Lists]:
        """Every truth a slot may show at ``t``: the current one, one being changed, and the
        one before the last change for ``lag_s`` after it ended."""
        out = [lists for start, end, lists in self.timeline if start <= t < end]
        done = [i for i, (_, end, _) in enumerate(self.timeline) if end <= t]
        if done:
            i = done[-1]
            out.append(self.timeline[i][2])
            if i > 0 and t < self.timeline[i][1] + lag_s:
                out.append(self.timeline[i - 1][2])
        return out


class Glideins:
    """Startds beside the pool's own, each ``condor_startd -f -local-name GLIDEIN`` in the
    chroot with its own ``STARTD_NAME``, log and address file, and one partitionable slot
    whose ``GLIDEIN_Site`` is its site; stopped with SIGTERM (they withdraw their ads)."""

    def __init__(self, pool: Pool, tag: str, hook: bool = False) -> None:
        self.pool, self.tag, self.count, self.hook = pool, tag, 0, hook
        self.running: list[subprocess.Popen[bytes]] = []

    def start(self) -> None:
        self.count += 1
        name, site = f"{self.tag}g{self.count}", SITES[self.count % len(SITES)]
        settings = {
            "STARTD_NAME": name, "STARTD_LOG": f"$(LOG)/StartLog.{name}",
            "STARTD_ADDRESS_FILE": f"$(LOG)/.startd_address.{name}",
            "STARTD_DAEMON_AD_FILE": f"$(LOG)/.startd_classad.{name}", "NUM_CPUS": "1",
            "MEMORY": "512", "NUM_SLOTS_TYPE_1": "0", "NUM_SLOTS_TYPE_2": "1",
            "SLOT1_GLIDEIN_Site": f'"{site}"',
            # not the master's child: a family session of its own is refused by the collector,
            # which drops the first update and leaves the glidein unseen for UPDATE_INTERVAL
            "SEC_USE_FAMILY_SESSION": "false",
        }  # fmt: skip
        if self.hook:
            settings |= glidein_hook_settings(name, site)
        env = [
            "PATH=/usr/sbin:/usr/bin:/sbin:/bin",
            *(f"_CONDOR_{k}={v}" for k, v in settings.items()),
        ]
        command = ["chroot", str(self.pool.root), "/usr/bin/env", "-i", *env]
        self.running.append(
            subprocess.Popen(
                [*command, "condor_startd", "-f", "-local-name", "GLIDEIN"],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )

    def stop_oldest(self) -> None:
        if self.running:
            proc = self.running.pop(0)
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def stop_all(self) -> None:
        while self.running:
            self.stop_oldest()


def shipped_period() -> int:
    """``STARTD_CRON_HYDRATOR_PERIOD`` as deploy/condor/50-hydrator.conf ships it."""
    text = (DEPLOY / "50-hydrator.conf").read_text(encoding="utf-8")
    found = re.search(r"^STARTD_CRON_HYDRATOR_PERIOD\s*=\s*(\d+)\s*$", text, re.MULTILINE)
    if found is None:
        raise ValueError("deploy/condor/50-hydrator.conf sets no STARTD_CRON_HYDRATOR_PERIOD")
    return int(found.group(1))


def hook_config(deploy: str, url: str, period_s: int, sites: Iterable[str]) -> str:
    """The pool's startd's hook config: ``deploy`` (deploy/condor/50-hydrator.conf) with this
    pool's values (the hook's path in the chroot, the daemon's URL, the period) and, as this
    one startd stands for several sites, its job ``HYDRATOR`` copied once per site with
    ``--site S --slot-attribute GLIDEIN_Site`` (each site's ad merged only into its slots).
    ``STARTD_CRON_AUTOPUBLISH`` back to HTCondor's default (``Never``; the test pool sets
    ``If_Changed``): only the hook's own ``- update:true`` sends an update at once."""
    jobs = [f"HYDRATOR_{site}" for site in sorted(set(sites))]
    lines = [
        deploy.rstrip("\n"),
        "",
        "# the coverage scenario's values",
        f"HYDRATOR_HOOK = {HOOK_IN_CHROOT}",
        f"HYDRATOR_URL = {url}",
        f"STARTD_CRON_HYDRATOR_PERIOD = {period_s}",
        "STARTD_CRON_AUTOPUBLISH = Never",
        f"STARTD_CRON_JOBLIST = {' '.join(jobs)}",
    ]
    for job, site in zip(jobs, sorted(set(sites)), strict=True):
        for key in ("EXECUTABLE", "MODE", "PERIOD", "KILL", "PREFIX"):
            lines.append(f"STARTD_CRON_{job}_{key} = $(STARTD_CRON_HYDRATOR_{key})")
        lines.append(
            f"STARTD_CRON_{job}_ARGS = $(STARTD_CRON_HYDRATOR_ARGS)"
            f" --site {site} --slot-attribute GLIDEIN_Site"
        )
    return "\n".join(lines) + "\n"


def glidein_hook_settings(name: str, site: str) -> dict[str, str]:
    """A glidein's own settings on top of :func:`hook_config` (as ``_CONDOR_`` variables, the
    way pyglidein configures its startd): the deploy file's one job ``HYDRATOR``, the site in
    ``GLIDEIN_Site`` where the hook reads it, and a cache of its own (a glidein's directory)."""
    return {
        "STARTD_CRON_JOBLIST": "HYDRATOR",
        "GLIDEIN_Site": f'"{site}"',
        "HYDRATOR_HOOK_CACHE": f"{HOOK_CACHE}-{name}",
    }


def glidein_churn(stop: threading.Event, glideins: Glideins, every_s: float) -> None:
    """A glidein joins every ``every_s``; at most two run (the oldest leaves first)."""
    while not stop.wait(every_s):
        if len(glideins.running) >= 2:
            glideins.stop_oldest()
        glideins.start()


def data_churn(stop: threading.Event, catalogue: Catalogue, every_s: float) -> None:
    """The churn dataset comes or goes every ``every_s`` (0: never)."""
    while every_s and not stop.wait(every_s):
        catalogue.toggle()


def sample(pool: Pool) -> Sample:
    ads = pool.collector.query(htcondor2.AdType.Slot, projection=PROJECTION)
    out: Sample = {}
    for ad in ads:
        lists = ad.get("AvailableDatasets")
        out[str(ad["Name"])] = (
            str(ad.get("GLIDEIN_Site")),
            None if lists is None else frozenset(str(d) for d in lists),
        )
    return out


@dataclass
class Score:
    """Slot-seconds judged sample by sample (COVERAGE.md)."""

    period_s: float
    total: int = 0
    ok: int = 0
    ok_strict: int = 0
    bare: int = 0
    longest_bad_s: float = 0.0
    runs: dict[str, list[float]] = field(default_factory=dict)  # slot -> [first bad t, last]
    first_seen: dict[str, float] = field(default_factory=dict)
    waits_s: dict[str, float | None] = field(default_factory=dict)  # new slots: seen -> ok

    def add(self, t: float, slots: Sample, catalogue: Catalogue, new: bool) -> None:
        lag, strict = catalogue.accepted(t, LAG_S), catalogue.accepted(t, 0.0)
        for name, (site, lists) in slots.items():
            self.total += 1
            if name not in self.first_seen:
                self.first_seen[name] = t
                if new:
                    self.waits_s[name] = None
            good = lists is not None and any(lists == truth.get(site) for truth in lag)
            self.ok_strict += lists is not None and any(
                lists == truth.get(site) for truth in strict
            )
            self.ok += good
            self.bare += lists is None
            if good:
                self.close(name)
                if self.waits_s.get(name, 0.0) is None:
                    self.waits_s[name] = t - self.first_seen[name]
            else:
                self.runs.setdefault(name, [t, t])[1] = t
        for name in set(self.runs) - set(slots):  # gone: its stretch ends with it
            self.close(name)

    def close(self, name: str) -> None:
        run = self.runs.pop(name, None)
        if run is not None:
            self.longest_bad_s = max(self.longest_bad_s, run[1] - run[0] + self.period_s)

    def result(self) -> dict[str, Any]:
        for name in list(self.runs):
            self.close(name)
        waits = sorted(w for w in self.waits_s.values() if w is not None)
        return {
            "slot_samples": self.total,
            "coverage": self.ok / self.total if self.total else None,
            "coverage_strict": self.ok_strict / self.total if self.total else None,
            "bare_fraction": self.bare / self.total if self.total else None,
            "longest_bad_s": round(self.longest_bad_s, 1),
            "new_slots": len(self.waits_s),
            "new_slot_never_carried": sum(w is None for w in self.waits_s.values()),
            "new_slot_wait_p50_s": statistics.median(waits) if waits else None,
            "new_slot_wait_max_s": waits[-1] if waits else None,
            "new_slot_waits_s": {
                n: w if w is None else round(w, 1) for n, w in self.waits_s.items()
            },
        }


def config(daemon: Daemon, pool: Pool, server: RucioServer, tag: str, path: str) -> Path:
    """The daemon's config: defaults but for the Rucio source, files and the ``path``: the
    collector path on, or (``hook``) off, the hook reading the HTTP endpoint instead."""
    collector = (
        f'\n[collector]\nenabled = true\npool = "{pool.collector_address}"\n'
        f'token_dir = "{pool.token_dir}"\n'
    )
    out = daemon.directory / "hydrator.toml"
    out.write_text(
        f'[daemon]\nstate_path = "state.sqlite"\n\n[http]\nlisten = "{daemon.target}"\n\n'
        f'[[sources]]\ntype = "rucio"\nname = "rucio"\nrucio_host = "{server.url}"\n'
        f'auth_host = "{server.url}"\naccount = "root"\nauth_type = "userpass"\n'
        f'username = "{server.username}"\npassword_file = "{server.password_file}"\n'
        f'rse_expression = "fed={tag}"\n' + (collector if path == "collector" else ""),
        encoding="utf-8",
    )
    return out


def load(pool: Pool, daemon: Daemon) -> dict[str, float]:
    """The collector's own counters (its ad, refreshed every COLLECTOR_UPDATE_INTERVAL) and
    the daemon's collector, repair and HTTP counters (``*_total``, summed over sites), now."""
    (ad,) = pool.collector.query(htcondor2.AdType.Collector, projection=list(LOAD_ATTRS))
    out = {f"collector_{k}": float(ad[k]) for k in LOAD_ATTRS if k in ad}
    out["daemon_time"] = time.time()
    for (name, labels), value in daemon.metrics().items():
        if name.startswith(LOAD_METRICS) and name.endswith("_total"):  # summed over sites
            key = name + "".join(f",{k}={v}" for k, v in sorted(labels) if k != "site")
            out[key] = out.get(key, 0.0) + value
    return out


def per_minute(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    """Each counter's rise per minute: the collector's over its own stats clock, the
    daemon's over the harness's."""
    clock = "collector_StatsLastUpdateTime"
    spans = {
        True: after[clock] - before[clock],
        False: after["daemon_time"] - before["daemon_time"],
    }
    out = {}
    for key, value in after.items():
        span = spans[key.startswith("collector_")]
        if not key.endswith(("Time", "_time")) and span > 0:
            out[key] = round(60 * (value - before.get(key, 0.0)) / span, 2)
    return out


@contextmanager
def side_env(code: Path | None) -> Iterator[str]:
    """``PYTHONPATH`` naming ``code``'s checkout (None: this one's) while the block runs; yields
    the ``hydrator`` package the daemon will import."""
    env = {} if code is None else {"PYTHONPATH": str(code.resolve())}
    with mock.patch.dict(os.environ, env):
        where = [sys.executable, "-c", "import hydrator; print(hydrator.__file__)"]
        yield subprocess.run(
            where, capture_output=True, text=True, check=True, cwd="/"
        ).stdout.strip()


@dataclass(frozen=True)
class Step:
    """One segment of a run: a publication path, a startd ``UPDATE_INTERVAL``, a side and its
    checkout (None: this one), and the hook's period (None on the collector path)."""

    path: str
    update_s: int
    side: str
    code: Path | None
    hook_period_s: int | None = None


def plan(
    update_intervals: Sequence[int],
    sides: Sequence[tuple[str, Path | None]],
    paths: Sequence[str],
    hook_period_s: int,
    hook_extra_periods_s: Sequence[int] = (),
) -> list[Step]:
    """The segments in the order run: the collector path on every side at each interval, the
    sides alternating (the first side first at the first interval); then the hook path on
    the last side (the new code) at each interval with ``hook_period_s``; then each extra
    period at the first interval (run last, so the first to go when time runs short)."""
    steps: list[Step] = []
    if "collector" in paths:
        for i, update_s in enumerate(update_intervals):
            for side, code in sides if i % 2 == 0 else sides[::-1]:
                steps.append(Step("collector", update_s, side, code))
    if "hook" in paths:
        side, code = sides[-1]
        for update_s in update_intervals:
            steps.append(Step("hook", update_s, side, code, hook_period_s))
        for period in hook_extra_periods_s:
            steps.append(Step("hook", update_intervals[0], side, code, period))
    return steps


def install_hook(pool: Pool, stack: ExitStack, url: str, period_s: int) -> None:
    """The hook in the chroot and :func:`hook_config` in the pool's config (reconfig); the
    caches of the hook removed after the segment (a next segment starts without a copy)."""
    copy_hook(pool)
    spool = pool.root / pool.run_in_chroot(["condor_config_val", "SPOOL"]).stdout.strip("/\n")

    def clean() -> None:
        for cache in spool.glob("hydrator-hook*"):
            shutil.rmtree(cache, ignore_errors=True)

    clean()
    stack.callback(clean)
    deploy = (DEPLOY / "50-hydrator.conf").read_text(encoding="utf-8")
    pool.write_config(HOOK_FRAGMENT, hook_config(deploy, url, period_s, SLOT_SITES.values()))
    stack.callback(pool.remove_config, HOOK_FRAGMENT)
    pool.reconfig()


def segment(
    args: argparse.Namespace, catalogue: Catalogue, pool: Pool, step: Step
) -> dict[str, Any]:
    """One step on a running pool: startds at its ``UPDATE_INTERVAL`` (a config fragment and a
    reconfig), the daemon up on its checkout's package publishing by its path (the hook's
    STARTD_CRON jobs installed for the hook path), every slot current, then :func:`window`;
    the daemon, the glideins and the fragments gone after."""
    with ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="hydrator-coverage-")))
        pool.write_config(
            FRAGMENT, f"UPDATE_INTERVAL = {step.update_s}\nCOLLECTOR_UPDATE_INTERVAL = 10\n"
        )
        stack.callback(pool.reconfig)
        stack.callback(pool.remove_config, FRAGMENT)
        pool.reconfig()
        imported = stack.enter_context(side_env(step.code))
        daemon = stack.enter_context(Daemon(work))
        settings = config(daemon, pool, catalogue.server, catalogue.tag, step.path)
        daemon.start(settings, ready_timeout_s=120)
        hook = step.hook_period_s is not None
        if hook:
            install_hook(pool, stack, daemon.url, step.hook_period_s or 0)
        truth = catalogue.timeline[-1][2]

        def current() -> bool:
            return all(lists == truth.get(site) for site, lists in sample(pool).values())

        wait = 180 + (step.hook_period_s or 0)
        wait_for("every slot current", current, timeout_s=wait, interval_s=1.0, ignore=TRANSIENT)
        glideins = Glideins(pool, unique("s").lower(), hook=hook)
        stack.callback(glideins.stop_all)
        head = {
            "path": step.path,
            "hook_period_s": step.hook_period_s,
            "update_interval_s": step.update_s,
            "hydrator": imported,
            "revision": revision(step.code or HERE.parent),
        }
        return head | window(args, pool, daemon, catalogue, glideins)


def window(
    args: argparse.Namespace, pool: Pool, daemon: Daemon, catalogue: Catalogue, glideins: Glideins
) -> dict[str, Any]:
    """``--duration-s`` of sampling every ``--period-s`` while :func:`churn` runs; the score,
    the churn done, the collector load and the daemon's own coverage figures, if any."""
    stop = threading.Event()
    threads = [
        threading.Thread(target=glidein_churn, args=(stop, glideins, args.glidein_every_s)),
        threading.Thread(target=data_churn, args=(stop, catalogue, args.data_every_s)),
    ]
    score, before, t0 = Score(args.period_s), load(pool, daemon), time.time()
    for thread in threads:
        thread.start()
    try:
        while (now := time.time()) < t0 + args.duration_s:
            score.add(now, sample(pool), catalogue, new=score.total > 0)
            time.sleep(max(0.0, now + args.period_s - time.time()))
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    own = {
        n + "".join(f",{k}={v}" for k, v in sorted(labels)): v
        for (n, labels), v in daemon.metrics().items()
        if "coverage" in n
    }
    return {
        "window_s": round(time.time() - t0, 1),
        "glideins_started": glideins.count,
        "data_changes": sum(start >= t0 for start, _, _ in catalogue.timeline),
        **score.result(),
        "load_per_minute": per_minute(before, load(pool, daemon)),
        "harness_queries_per_minute": 60 / args.period_s,
        "daemon_coverage_metrics": own,
    }


def revision(code: Path) -> str:
    git = ["git", "-C", str(code), "describe", "--always", "--dirty=+dirty", "--abbrev=12"]
    return subprocess.run(git, capture_output=True, text=True, check=False).stdout.strip()


def misses(result: Mapping[str, Any]) -> list[str]:
    """The targets ``result`` (one segment) misses, in words."""
    out, want = [], TARGETS.get(result["update_interval_s"])
    if want is not None and (result["coverage"] or 0.0) < want:
        out.append(f"coverage {result['coverage']:.4f} < {want}")
    if (
        result["new_slot_never_carried"]
        or (result["new_slot_wait_max_s"] or 0.0) > NEW_STARTD_TARGET_S
    ):
        never = result["new_slot_never_carried"]
        out.append(f"a new startd waited {result['new_slot_wait_max_s']} s (never: {never})")
    return out


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    add = parser.add_argument
    add("--code", type=Path, help="the old checkout: also run its hydrator package, alternating")
    add("--new-code", type=Path, help="the new checkout (default: this one)")
    add(
        "--update-intervals",
        type=int,
        nargs="+",
        default=[300, 30],
        help="startd UPDATE_INTERVAL s",
    )
    add(
        "--paths",
        nargs="+",
        choices=["collector", "hook"],
        default=["collector"],
        help="publication paths (hook: the new code only)",
    )
    add(
        "--hook-period-s",
        type=int,
        default=shipped_period(),
        help="the hook's STARTD_CRON period (default: deploy/condor/50-hydrator.conf's)",
    )
    add(
        "--hook-extra-periods-s",
        type=int,
        nargs="*",
        default=[],
        help="one more hook segment per period, at the first UPDATE_INTERVAL, run last",
    )
    add("--duration-s", type=float, default=600.0, help="sampling window per condition and side")
    add("--period-s", type=float, default=1.0, help="seconds between samples")
    add("--glidein-every-s", type=float, default=60.0, help="a glidein joins this often")
    add(
        "--data-every-s",
        type=float,
        default=150.0,
        help="a dataset comes or goes this often (0: never)",
    )
    add("--json", type=Path, help="write the record here (default: print only)")
    return parser.parse_args()


def write(args: argparse.Namespace, record: dict[str, Any]) -> None:
    if args.json:
        args.json.write_text(json.dumps(record, indent=1, default=str) + "\n", encoding="utf-8")


def main() -> None:
    args = arguments()
    sides: list[tuple[str, Path | None]] = [("new", args.new_code)]
    if args.code is not None:
        sides.insert(0, ("old", args.code))
    steps = plan(
        args.update_intervals, sides, args.paths, args.hook_period_s, args.hook_extra_periods_s
    )
    meta = {**machine(), "utc_start": datetime.now(UTC).isoformat(timespec="seconds")}
    record: dict[str, Any] = {
        "meta": meta,
        "parameters": {**vars(args), "lag_s": LAG_S},
        "segments": [],
        "missed": [],
        "complete": False,
    }
    server = make_server()
    try:
        catalogue = Catalogue(server)
        for step in steps:
            period = "" if step.hook_period_s is None else f", hook period {step.hook_period_s} s"
            label = f"{step.side} {step.path} at {step.update_s} s{period}"
            print(f"UPDATE_INTERVAL {step.update_s} s, {label}", flush=True)
            with tempfile.TemporaryDirectory() as tmp, running_pool(Path(tmp)) as pool:
                result = {"side": step.side, **segment(args, catalogue, pool, step)}
            record["segments"].append(result)
            print(
                json.dumps({k: v for k, v in result.items() if k != "new_slot_waits_s"}), flush=True
            )
            record["missed"] += [f"{label}: {m}" for m in misses(result)]
            meta |= {"utc_last_segment_end": datetime.now(UTC).isoformat(timespec="seconds")}
            write(args, record)
    finally:
        server.stop()
        shutil.rmtree(server.dir, ignore_errors=True)
    meta |= {
        "utc_end": datetime.now(UTC).isoformat(timespec="seconds"),
        "load_average_end": os.getloadavg(),
    }
    record["complete"] = True
    write(args, record)
    print("\n".join(record["missed"]) or "every target met", flush=True)
    raise SystemExit(1 if record["missed"] else 0)


if __name__ == "__main__":
    main()
