"""Whole-cycle benchmark: from the catalogue's bytes to the published ad.

One cycle exactly as the daemon runs it: :meth:`hydrator.runtime.service.Service.run_cycle` on a
service wired like :func:`hydrator.runtime.wiring.build_service`, whose Rucio source makes its
real ``rucio-clients`` calls against :mod:`benchmarks.replay` (the generated federation in
Rucio's wire format), with a SQLite state file, the collector publisher up to the network call
(:class:`PoolStub`) and the HTTP endpoint's file writes (benchmarks/RESULTS.md describes the
set-up). Phases are the service's own (``CycleReport.phases``); the harness adds ``after`` (the
wall time past the report: log line, metrics, the HTTP files) and ``fetch_cpu_s`` (the daemon's
own CPU in the fetch, whose wall time includes waiting for the replay on the other core). Code
older than that report (``--code`` of an earlier checkout) gets whole-cycle figures only.
As the daemon with its repair watch, code that makes repair looks makes one after each cycle,
timed apart (``delivery_s`` by kind of cycle; its merges in ``collector_sent``'s
``look_merges`` and ``look_bytes``), and code that hands slot merges to the looks does so
(:class:`BenchService`): its cycles send site ads only, and the look after each sends the
merges.

Steps, each in a fresh process so that its peak RSS is its own:

``daemon``   start on an empty state (``startup_empty_s``), the first cycle (every replica new,
             ``first_cycle_s``), then ``--cycles`` cycles after 1 % churn each (the replay
             server churns between cycles, untimed) and ``--cycles`` cycles with no change.
``restart``  start on the saved state as a restarted daemon does (``startup_s``), then one
             cycle after a churn.

The summary (printed; all of it, with each cycle's record, in ``--json``): medians in seconds,
peak RSS in MiB, the machine (CPU, cores, memory, load before and after) and the replay's own
peak RSS and CPU (not in ``peak_rss_mib``). Old and new code in one run: ``--code DIR`` runs
both steps first with the ``hydrator`` package of the checkout ``DIR`` (harness and replay stay
this checkout's; the run stops if a step imported another ``hydrator``), then with this
checkout's, each against a fresh replay of the same federation (:func:`compare`;
benchmarks/README.md gives the command); ``--distances N --against-no-distances`` compares
this checkout with ``[distances]`` off and on (an operator table, :func:`distance_table`) the
same way. A step that dies is recorded, not a crash: ``failed``
names the step and why (the OOM killer, seen in ``/proc/vmstat``, or this harness's watchdog
when the machine's available memory falls under ``--min-available-mib``); its figures are null.
"""

from __future__ import annotations

import argparse
import cProfile
import importlib
import io
import json
import math
import os
import pstats
import random
import resource
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import closing, contextmanager
from datetime import UTC, datetime
from inspect import signature
from pathlib import Path
from statistics import median
from typing import Any

import classad2
from prometheus_client import CollectorRegistry

import hydrator
from benchmarks.conditions import emit, kib, machine
from hydrator.adapters.htcondor.collector import MERGED_ATTRIBUTE, CollectorPublisher
from hydrator.adapters.state.sqlite import SqliteStateStore, StateLock
from hydrator.config import (
    ClassAdConfig,
    CollectorConfig,
    Config,
    DaemonConfig,
    HttpConfig,
    RucioSourceConfig,
)
from hydrator.runtime import wiring
from hydrator.runtime.metrics import Metrics
from hydrator.runtime.service import Service

try:
    from hydrator.runtime.http_endpoint import HttpEndpoint
except ModuleNotFoundError:  # older code (--code): the module was runtime/http.py
    HttpEndpoint = importlib.import_module("hydrator.runtime.http").HttpEndpoint  # type: ignore[misc]

HERE = Path(__file__).resolve().parent
N_SITES, N_SLOTS = 50, 20_000


# -- the collector at the network call -----------------------------------------------------


class PoolStub:
    """Stands in for ``htcondor2.Collector`` where the network begins.

    ``query`` answers from what earlier ``advertise`` calls sent (a pool of ``slots`` whose
    ads carry the merged attributes; site ads with ``LastHeardFrom``); ``advertise`` encodes
    every ad as HTCondor's wire format needs it (``printOld``), which is the last step before
    the bytes go out. Startds re-advertising, which wipes what was merged into their slots
    (docs/platform.md), is modelled only when asked (:meth:`startd_updates`).

    A repair look's query (any slot constraint but ``true``) is answered as the collector
    answers it: the constraint (:func:`hydrator.core.slot_coverage.stale_constraint`) evaluated
    by classad2 against every slot ad. That time is the collector's, not the daemon's, and
    is added up in ``filter_s`` so that the harness can leave it out of the look's time.
    """

    def __init__(self, slots: Mapping[str, str], slot_site_attribute: str) -> None:
        self.slots: dict[str, dict[str, Any]] = {
            name: {"Name": name, slot_site_attribute: s} for name, s in slots.items()
        }
        self.bare = {name: dict(ad) for name, ad in self.slots.items()}
        self._next_update = 0
        self.site_ads: dict[str, dict[str, Any]] = {}
        self.encoded_bytes = 0
        self.merges = 0  # MERGE_STARTD_AD ads sent (slot merges)
        attrs = ClassAdConfig()
        self.near_attribute = getattr(attrs, "near_attribute", "DataLocalityNearSites")
        self.near_ads = 0  # ads advertised carrying the near sites (``[distances]`` on)
        self.kept = ("Name", attrs.digest_attribute, attrs.updated_attribute, MERGED_ATTRIBUTE)
        self.filter_s = 0.0  # seconds spent answering looks' queries (the collector's work)

    def startd_updates(self, fraction: float) -> None:
        """The next ``fraction`` of the slots (in turn, so every slot's startd updates once per
        ``1 / fraction`` calls, as startds do once per ``UPDATE_INTERVAL``) re-advertise: their
        ads lose what was merged into them."""
        names = list(self.bare)
        count = min(len(names), round(len(names) * fraction))
        for i in range(self._next_update, self._next_update + count):
            name = names[i % len(names)]
            self.slots[name] = dict(self.bare[name])
        self._next_update = (self._next_update + count) % max(1, len(names))

    def query(self, ad_type: Any, constraint: str, projection: list[str]) -> list[Any]:
        if constraint.startswith("MyType"):
            return [dict(ad) for ad in self.site_ads.values()]
        if constraint == "true":
            return [dict(ad) for ad in self.slots.values()]
        started = time.perf_counter()
        found = self.uncovered(constraint)
        self.filter_s += time.perf_counter() - started
        return found

    def uncovered(self, constraint: str) -> list[dict[str, Any]]:
        """The slot ads ``constraint`` selects, evaluated by classad2 as the collector would."""
        expr = classad2.ExprTree(constraint)
        return [
            dict(ad)
            for ad in self.slots.values()
            if expr.eval(classad2.ClassAd({k: v for k, v in ad.items() if v is not None})) is True
        ]

    def advertise(self, ads: list[Any], command: str, use_tcp: bool = True) -> None:
        now = int(time.time())
        for ad in ads:
            self.encoded_bytes += len(ad.printOld())
            self.merges += command == "MERGE_STARTD_AD"
            self.near_ads += self.near_attribute in ad
            fields = {key: ad.get(key) for key in self.kept}
            name = str(fields.get("Name"))
            if command == "MERGE_STARTD_AD" and name in self.slots:
                self.slots[name].update(fields)
            elif command == "UPDATE_AD_GENERIC":
                self.site_ads[name] = {**fields, "LastHeardFrom": now}
            elif command == "INVALIDATE_ADS_GENERIC":
                self.site_ads.pop(name, None)


def slot_names(count: int = N_SLOTS, seed: int = 2026) -> dict[str, str]:
    """``count`` glidein slots over the 50 sites, skewed as the federation's site sizes."""
    rng = random.Random(seed)
    weights = [1.0 / (i + 1) ** 0.6 for i in range(N_SITES)]
    picks = rng.choices(range(N_SITES), weights, k=count)
    return {
        f"slot1_{i}@glidein-{i:05d}.srcnet_s{s:02d}": f"SRCNET_S{s:02d}"
        for i, s in enumerate(picks)
    }


# -- the daemon under test -----------------------------------------------------------------


def config(
    url: str, workdir: Path, merge_min_interval_s: float | None = None, distances: int = 0
) -> Config:
    """The daemon's configuration; ``distances`` > 0: ``[distances]`` on with the operator
    table :func:`distance_table` of that many sites (0: off, as the default config)."""
    password = workdir / "password"
    password.write_text("secret\n")
    password.chmod(0o600)
    source = RucioSourceConfig(
        type="rucio",
        rucio_host=url,
        auth_host=url,
        account="root",
        auth_type="userpass",
        username="root",
        password_file=password,
        timeout_s=120.0,
        # the default 30 s abandons a 1M first fetch on a loaded 2-core machine (the cycle
        # then comes out degraded and the step fails): the harness times it, it does not cut it
        deadline_s=600.0,
        # the default 512 MiB is less than this federation's REPLICATING rules listing at 10M
        # replicas (776 MiB; 78 MiB at 1M): the operator raises it at that scale, as here
        max_answer_bytes=2 * 1024**3,
    )
    # a dict, not DistancesConfig: older code (--code) has no such model; given only when on
    near: dict[str, Any] = {}
    if distances:
        near["distances"] = {"enabled": True, "sites": distance_table(distances)}
    return Config(
        daemon=DaemonConfig(state_path=workdir / "state.sqlite"),
        http=HttpConfig(listen="127.0.0.1:0"),
        classad=ClassAdConfig(),
        collector=collector_config(merge_min_interval_s),
        sources=[source],
        **near,
    )


REGION_SITES = 5


def distance_table(count: int) -> dict[str, dict[str, int]]:
    """An operator distance table of the federation's first ``count`` sites (at most
    :data:`N_SITES`), every ordered pair given: 1 within a region of :data:`REGION_SITES`
    consecutive sites, 2 between regions; with ``max_distance`` 1 each site has the other
    sites of its region near it."""
    if not 1 <= count <= N_SITES:
        raise ValueError(f"distances: 1 to {N_SITES} sites, not {count}")
    names = [f"SRCNET_S{i:02d}" for i in range(count)]
    region = [i // REGION_SITES for i in range(count)]
    return {
        a: {b: 1 if region[i] == region[j] else 2 for j, b in enumerate(names) if j != i}
        for i, a in enumerate(names)
    }


def collector_config(merge_min_interval_s: float | None) -> CollectorConfig:
    """``[collector]``, enabled, with ``merge_min_interval_s`` if given (else the default)."""
    given: dict[str, Any] = {}
    if merge_min_interval_s is not None:
        given["merge_min_interval_s"] = merge_min_interval_s
    return CollectorConfig(enabled=True, **given)


LOOK_INTERVAL_S = 0.5
"""The repair watch's interval the looks are made with (``[collector] repair_interval_s``'s
default)."""


class BenchService:
    """A service wired as :func:`hydrator.runtime.wiring.build_service` wires it, with the
    collector at :class:`PoolStub` and the HTTP endpoint writing its files (no server child).
    Nothing of it is wrapped: what is timed is the service's own report and the wall clock.

    As ``hydrator run`` with its repair watch: code that has the hand-over
    (``hand_merges_to_repairs``) hands the slot merges to the looks, and after each cycle one
    look (``repair``) is made and timed apart (:meth:`cycle`), as the watch's next look
    would follow it; code older than the looks has neither."""

    def __init__(self, cfg: Config, pool: PoolStub, looks: bool = True) -> None:
        path = cfg.daemon.state_path
        publisher = CollectorPublisher(cfg.collector, cfg.classad, collector=pool)
        self.pool, self.publisher = pool, publisher
        self.looks = looks
        hand_over = getattr(publisher, "hand_merges_to_repairs", None)  # None: older code
        if hand_over is not None and looks:
            hand_over()
        # wiring.assemble builds the Service where it exists; older code (--code)
        # has the Service build its policies and load the state itself, with the same keys.
        # Newer code's assemble returns the service with its parts (an Assembly), older the
        # service alone; the sources are kept here, as newer code's service does not show them
        build: Callable[..., Any] = getattr(wiring, "assemble", Service)
        metrics = Metrics(CollectorRegistry())
        self.sources = [wiring.build_source(cfg.sources[0], cfg.sites)]
        self.fetches = FetchProfile(self.sources)
        built = build(
            cfg,
            sources=self.sources,
            store=SqliteStateStore(path, lock=StateLock(path)),
            publishers=[publisher],
            metrics=metrics,
        )
        self.service: Service = getattr(built, "service", built)
        # newer code hands the HTTP endpoint its metrics; older code's took the service's
        given = {"metrics": metrics} if "metrics" in signature(HttpEndpoint).parameters else {}
        self.endpoint = HttpEndpoint(self.service, cfg.http, wedged_after_s=600.0, **given)
        self.endpoint.write()  # what HttpEndpoint.start does before the server child starts
        self.service.add_listener(self.endpoint.write)

    def cycle(self) -> dict[str, Any]:
        """One cycle's record: ``whole`` (wall seconds of ``run_cycle``), the report's phases
        (``after``: the wall time past them), the replicas held, the source's calls, RSS."""
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        t0, cpu0 = time.perf_counter(), time.process_time()
        report = self.service.run_cycle()
        whole, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
        if report.outcome != "ok":
            stale = [s.reason for s in report.plan.sources if s.reason] if report.plan else []
            why = report.error or report.publish_errors or stale
            raise RuntimeError(f"cycle {report.outcome}: {why}")
        out: dict[str, Any] = {"whole": whole, "cpu": cpu, "minor_faults": faults}
        phases = getattr(report, "phases", None)  # None: code older than the phase report
        if phases:
            out["phases"] = {name: taken.wall_s for name, taken in phases.items()}
            out["phases"]["after"] = max(0.0, whole - sum(out["phases"].values()))
            out["fetch_cpu"] = phases["fetch"].cpu_s if "fetch" in phases else 0.0
        sources = self.sources
        out["replicas"] = sum(len(s.replicas) for s in self.service.state.sources.values())
        out["calls"] = {
            k: v for s in sources for k, v in getattr(s, "calls_last_fetch", {}).items()
        }
        out["rss_mib"] = kib("self/status")["VmRSS"] / 1024
        out["peak_rss_mib"] = peak_rss_mib()  # the step's so far: which cycle raised it
        return out | self.look()

    def look(self) -> dict[str, Any]:
        """The repair look after a cycle, where the code has looks: ``delivery_s`` (its wall
        seconds, less the stub's answering of its query: the collector's work), the slot
        merges it sent and their encoded bytes (empty for older code)."""
        repair = getattr(self.publisher, "repair", None)
        if repair is None or not self.looks:
            return {}
        pool = self.pool
        merges, sent, filtered = pool.merges, pool.encoded_bytes, pool.filter_s
        t0 = time.perf_counter()
        repair(datetime.now(UTC), LOOK_INTERVAL_S)
        whole = time.perf_counter() - t0
        return {
            "delivery_s": whole - (pool.filter_s - filtered),
            "delivery_merges": pool.merges - merges,
            "delivery_bytes": pool.encoded_bytes - sent,
        }

    def close(self) -> None:
        self.endpoint.stop()
        self.service.close()


def started(args: argparse.Namespace) -> tuple[PoolStub, BenchService, float]:
    """A pool and a service started on what ``--workdir`` holds, and the seconds it took."""
    pool = PoolStub(slot_names(args.slots), CollectorConfig().slot_site_attribute)
    cfg = config(args.url, args.workdir, args.merge_min_interval_s, args.distances)
    t0 = time.perf_counter()
    return pool, BenchService(cfg, pool, looks=not args.no_looks), time.perf_counter() - t0


def churn(url: str) -> None:
    urllib.request.urlopen(urllib.request.Request(f"{url}/_bench/churn", method="POST")).close()


class FetchProfile:
    """The sources' fetches profiled apart: the service runs each fetch in a thread of its
    own, which a cProfile of the main thread sees only as a lock wait. Wraps each source's
    ``fetch`` (on the instance) to run under :attr:`profile` while one is set."""

    def __init__(self, sources: Iterable[Any]) -> None:
        self.profile: cProfile.Profile | None = None
        for source in sources:
            source.fetch = self._wrapped(source.fetch)

    def _wrapped(self, fetch: Callable[..., Any]) -> Callable[..., Any]:
        def profiled_fetch(*args: Any, **kwargs: Any) -> Any:
            profile = self.profile
            if profile is None:
                return fetch(*args, **kwargs)
            with profile:
                return fetch(*args, **kwargs)

        return profiled_fetch


def write_profile(profile: cProfile.Profile, directory: Path, name: str) -> None:
    """``profile`` as ``DIR/<name>.prof`` and a text summary ``.txt`` (by cumulative and by
    own time)."""
    directory.mkdir(parents=True, exist_ok=True)
    profile.dump_stats(directory / f"{name}.prof")
    text = io.StringIO()
    for order in ("cumulative", "tottime"):
        pstats.Stats(profile, stream=text).sort_stats(order).print_stats(30)
    (directory / f"{name}.txt").write_text(text.getvalue())


@contextmanager
def profiled(directory: Path | None, kind: str, fetches: FetchProfile) -> Iterator[None]:
    """With ``--profile DIR``, a cProfile of the block's main thread as ``DIR/<kind>.prof``
    and ``.txt``, and of its fetches (their own thread) as ``DIR/<kind>-fetch.prof``."""
    if directory is None:
        yield
        return
    profile, fetches.profile = cProfile.Profile(), cProfile.Profile()
    try:
        with profile:
            yield
    finally:
        fetch_profile, fetches.profile = fetches.profile, None
    write_profile(profile, directory, kind)
    write_profile(fetch_profile, directory, f"{kind}-fetch")


def step_daemon(args: argparse.Namespace) -> dict[str, Any]:
    pool, daemon, startup_empty = started(args)
    with closing(daemon):  # also when a cycle fails: its files and token directory go
        sent = []  # the collector traffic after each kind of cycle: (ads merged, bytes)
        with profiled(args.profile, "first", daemon.fetches):
            first = daemon.cycle()
        sent.append((pool.merges, pool.encoded_bytes))
        churned, nochange = [], []
        with profiled(args.profile, "churn", daemon.fetches):
            for _ in range(args.cycles):
                churn(args.url)
                pool.startd_updates(args.startd_updates)
                churned.append(daemon.cycle())
        sent.append((pool.merges, pool.encoded_bytes))
        with profiled(args.profile, "nochange", daemon.fetches):
            for _ in range(args.cycles):
                pool.startd_updates(args.startd_updates)
                nochange.append(daemon.cycle())
        sent.append((pool.merges, pool.encoded_bytes))
    return {
        "startup_empty_s": startup_empty,
        "first": first,
        "churn": churned,
        "nochange": nochange,
        "encoded_bytes": pool.encoded_bytes,
        "collector_sent": collector_sent(
            sent, args.cycles, {"first": [first], "churn": churned, "nochange": nochange}
        ),
        "near_ads": pool.near_ads,
        "merge_min_interval_s": daemon.publisher.config.merge_min_interval_s,
        "peak_rss_mib": peak_rss_mib(),
    }


def collector_sent(
    sent: Sequence[tuple[int, int]], cycles: int, records: Mapping[str, Sequence[dict[str, Any]]]
) -> dict[str, dict[str, float]]:
    """Slot merges and encoded bytes (merges and site ads) per cycle of each kind, from the
    running totals after the first cycle, the churn cycles and the no-change cycles; each
    cycle's look included. Where the code makes looks, ``look_merges`` and ``look_bytes``
    say how much of it the look after the cycle sent (the cycle's ``records``)."""
    (m1, b1), (m2, b2), (m3, b3) = sent
    per = max(1, cycles)
    out: dict[str, dict[str, float]] = {
        "first": {"merges": m1, "bytes": b1},
        "churn": {"merges": (m2 - m1) / per, "bytes": (b2 - b1) / per},
        "nochange": {"merges": (m3 - m2) / per, "bytes": (b3 - b2) / per},
    }
    for kind, done in records.items():
        if done and "delivery_merges" in done[0]:
            out[kind]["look_merges"] = sum(r["delivery_merges"] for r in done) / len(done)
            out[kind]["look_bytes"] = sum(r["delivery_bytes"] for r in done) / len(done)
    return out


def step_restart(args: argparse.Namespace) -> dict[str, Any]:
    _, daemon, startup = started(args)
    with closing(daemon):
        rss_after_startup = kib("self/status")["VmRSS"] / 1024
        churn(args.url)
        with profiled(args.profile, "restart", daemon.fetches):
            after = daemon.cycle()
    return {
        "startup_s": startup,
        "rss_after_startup_mib": rss_after_startup,
        "cycle_after_restart": after,
        "peak_rss_mib": peak_rss_mib(),
    }


# -- the orchestrator ----------------------------------------------------------------------


REPLAY_BYTES_PER_REPLICA = 480  # the replay's bodies: 410 MB at 1M, 4.1 GB at 10M


def replay_cache_mib(args: argparse.Namespace) -> int:
    """The replay's cache: ``--replay-cache-mib``, else room for all its answers, so that it
    serves unchanged bytes from memory at every size, as it does at 1M with its own default
    (768 MiB); with that default at 10M it held a fifth and formatted most of 4 GB again
    every cycle, time the daemon spent waiting that a 1M run does not have."""
    if args.replay_cache_mib is not None:
        return int(args.replay_cache_mib)
    return max(768, -(-int(args.replicas) * REPLAY_BYTES_PER_REPLICA // 2**20))


class ReplayServer:
    """:mod:`benchmarks.replay` in a child process (its memory and CPU are not the daemon's)."""

    def __init__(
        self, replicas: int, seed: int, cache_mib: int | None = None, bad_replicas: int = 0
    ) -> None:
        command = [sys.executable, "-m", "benchmarks.replay", "--replicas", str(replicas)]
        command += ["--seed", str(seed), "--bad-replicas", str(bad_replicas)]
        if cache_mib is not None:
            command += ["--cache-mib", str(cache_mib)]
        self.proc = subprocess.Popen(
            command, cwd=HERE.parent, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("port "):
            self.stop()
            raise RuntimeError(f"replay server did not start: {line!r}")
        self.url = f"http://127.0.0.1:{int(line.split()[1])}"

    def stats(self) -> dict[str, float]:
        """The replay's own peak RSS (MiB), CPU seconds and cache use so far."""
        with urllib.request.urlopen(f"{self.url}/_bench/stats", timeout=60) as answer:
            found: dict[str, float] = json.load(answer)
            return found

    def stop(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def run_step(
    step: str, url: str, workdir: Path, args: argparse.Namespace, code: Path | None
) -> dict[str, Any]:
    """One step in a child process with ``code``'s hydrator (None: this checkout's), watched:
    its result, or a record of why it has none (``failed``: killed by the OOM killer or by the
    watchdog, or its error) and the swapping it caused."""
    command = [
        sys.executable, "-m", "benchmarks.cycle", "--step", step, "--url", url,
        "--workdir", str(workdir), "--cycles", str(args.cycles), "--slots", str(args.slots),
    ]  # fmt: skip
    if args.profile is not None:
        command += ["--profile", str(args.profile)]
    if args.merge_min_interval_s is not None:
        command += ["--merge-min-interval-s", str(args.merge_min_interval_s)]
    command += ["--startd-updates", str(args.startd_updates), "--distances", str(args.distances)]
    if args.no_looks:
        command += ["--no-looks"]
    env = dict(os.environ, RUCIO_HOME=str(workdir))  # no stray rucio.cfg from elsewhere
    cwd = HERE.parent  # ``python -m`` puts the working directory first on sys.path
    if code is not None:
        cwd = code_path(code, workdir)
        env["PYTHONPATH"] = str(cwd)
    before = vmstat()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(command, stdout=out, stderr=err, text=True, env=env, cwd=cwd)
        stopped = watch(proc, args.min_available_mib)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    after = vmstat()
    swapped = {k: after.get(k, 0) - before.get(k, 0) for k in ("pswpin", "pswpout")}
    oom_kills = after.get("oom_kill", 0) - before.get("oom_kill", 0)
    if proc.returncode != 0:
        reason = stopped or (
            f"killed by signal {-proc.returncode}"
            + (" (the OOM killer: /proc/vmstat oom_kill rose)" if oom_kills else "")
            if proc.returncode < 0
            else f"exit {proc.returncode}: {stderr.strip().splitlines()[-1:]}"
        )
        print(f"step {step} failed: {reason}", file=sys.stderr)
        return {"failed": reason, "swapped_pages": swapped, "stderr_tail": stderr[-2000:]}
    result: dict[str, Any] = json.loads(stdout.strip().splitlines()[-1])
    result["swapped_pages"] = swapped
    return result


def code_path(code: Path, workdir: Path) -> Path:
    """A directory for ``PYTHONPATH`` whose ``hydrator`` is ``code``'s and whose
    ``benchmarks`` (harness and replay) is this checkout's."""
    links = workdir / "code"
    links.mkdir(exist_ok=True)
    for name, target in (("hydrator", code.resolve() / "hydrator"), ("benchmarks", HERE)):
        if not target.is_dir():
            raise SystemExit(f"--code {code}: no {target}")
        if not (links / name).exists():
            (links / name).symlink_to(target)
    return links


def watch(proc: subprocess.Popen[str], min_available_mib: int) -> str | None:
    """Wait for ``proc``; kill it if the machine's available memory falls under
    ``min_available_mib`` (other work shares the machine) and say so."""
    while proc.poll() is None:
        if kib("meminfo").get("MemAvailable", 1 << 40) / 1024 < min_available_mib:
            proc.kill()
            proc.wait()
            return f"stopped by the watchdog: MemAvailable < {min_available_mib} MiB"
        time.sleep(0.5)
    return None


def peak_rss_mib() -> float:
    """This process's peak RSS so far (the kernel's high-water mark), in MiB."""
    return kib("self/status")["VmHWM"] / 1024


def vmstat() -> dict[str, int]:
    """``/proc/vmstat`` counters (pages swapped in/out, OOM kills)."""
    pairs = (line.split() for line in Path("/proc/vmstat").read_text().splitlines())
    return {key: int(value) for key, value in pairs}


# -- the summary ---------------------------------------------------------------------------


def phase_medians(records: list[dict[str, Any]]) -> dict[str, float]:
    """Each phase's median wall seconds over ``records`` (none: code without the report)."""
    names = sorted({name for r in records for name in r.get("phases", {})})
    return {name: median([r.get("phases", {}).get(name, 0.0) for r in records]) for name in names}


def cycle_figures(daemon: dict[str, Any]) -> dict[str, Any]:
    """Medians of the daemon step's cycles by kind: whole, phases, the fetch's CPU, calls."""
    churned, idle, first = daemon["churn"], daemon["nochange"], daemon["first"]
    out: dict[str, Any] = {
        "replicas_held": churned[-1]["replicas"],
        "whole_cycle_s": median([r["whole"] for r in churned]),
        "nochange_cycle_s": median([r["whole"] for r in idle]),
        "first_cycle_s": first["whole"],
        "startup_empty_s": daemon["startup_empty_s"],
        "phases_s": phase_medians(churned),
        "nochange_phases_s": phase_medians(idle),
        "first_phases_s": phase_medians([first]),
        "cycles": len(churned),
        "calls": {"first": first["calls"], "churn": churned[-1]["calls"]}
        | {"nochange": idle[-1]["calls"]},
    }

    def by_kind(key: str) -> dict[str, float]:
        """The first cycle's ``key`` and the median of the churn and no-change cycles'."""
        return {
            "first": first[key],
            "churn": median([r[key] for r in churned]),
            "nochange": median([r[key] for r in idle]),
        }

    out["cycle_cpu_s"] = by_kind("cpu")
    out["cycle_minor_faults"] = by_kind("minor_faults")  # pages touched anew (heap grown again)
    if "collector_sent" in daemon:
        out["collector_sent"] = daemon["collector_sent"]
    if "delivery_s" in first:  # code with repair looks: the look after each cycle
        out["delivery_s"] = by_kind("delivery_s")
    if "fetch_cpu" in first:
        out["fetch_cpu_s"] = by_kind("fetch_cpu")
    return out


def summarise(replicas: int, daemon: dict[str, Any], restart: dict[str, Any]) -> dict[str, Any]:
    """Medians of both steps' records; a step that failed (``failed``) leaves its figures
    ``None`` and is named in ``failed``."""
    out: dict[str, Any] = {"replicas": replicas}
    steps = {"daemon": daemon, "restart": restart}
    if "failed" not in daemon:
        out |= cycle_figures(daemon)
    if "failed" not in restart:
        out |= {
            "startup_s": restart["startup_s"],
            "cycle_after_restart_s": restart["cycle_after_restart"]["whole"],
            "restart_phases_s": phase_medians([restart["cycle_after_restart"]]),
            "peak_rss_steady_mib": restart["peak_rss_mib"],
        }
    peaks = [r["peak_rss_mib"] for r in steps.values() if "peak_rss_mib" in r]
    out["peak_rss_mib"] = max(peaks) if peaks else None
    for key in ("whole_cycle_s", "nochange_cycle_s", "startup_s", "first_cycle_s"):
        out.setdefault(key, None)
    out["failed"] = {step: r["failed"] for step, r in steps.items() if "failed" in r}
    out["swapped_pages"] = {
        k: sum(r["swapped_pages"][k] for r in steps.values() if "swapped_pages" in r)
        for k in ("pswpin", "pswpout")
    }
    out["hydrator"] = daemon.get("hydrator") or restart.get("hydrator")
    out["near_ads"] = daemon.get("near_ads")  # ads sent carrying near sites, the daemon step
    out["raw"] = steps
    return out


COMPARED = ("whole_cycle_s", "nochange_cycle_s", "startup_s", "first_cycle_s", "peak_rss_mib")
"""The figures a restructuring must keep (old against new code, at 1M replicas)."""


PER_PAIR = ("phases_s", "cycle_cpu_s", "fetch_cpu_s", "cycle_minor_faults")
"""Kept for every pair beside :data:`COMPARED`: the churn cycles' phases, CPU seconds and minor
page faults, to see whether a difference between the sides sits in one phase or in all."""


def median_interval(changes: Sequence[float]) -> dict[str, Any] | None:
    """A distribution-free interval for the median of the pairs' ``changes``: the order
    statistics ``k``-th from each end, with the largest ``k`` whose coverage (the chance that
    the true median lies between them, from the binomial with p = 1/2) is at least 90 %. With
    the pairs' noise it says whether a median near a target is told apart from it: with fewer
    than 5 pairs no interval reaches 90 % (None)."""
    n, ordered = len(changes), sorted(changes)
    best = None
    for k in range(1, n // 2 + 1):
        outside = sum(math.comb(n, i) for i in range(k)) * 2 / 2**n
        if 1 - outside >= 0.9:
            best = {
                "low": ordered[k - 1],
                "high": ordered[n - k],
                "coverage": round(1 - outside, 4),
            }
    return best


def new_vs_old(old: dict[str, Any], new: dict[str, Any]) -> dict[str, float | None]:
    """``new / old - 1`` of each :data:`COMPARED` figure (None where either has none)."""
    return {
        key: round(new[key] / old[key] - 1, 4) if old.get(key) and new.get(key) else None
        for key in COMPARED
    }


def median_of(values: Iterable[float | None]) -> float | None:
    """The median of the values that are not None (None if none is)."""
    found = [v for v in values if v is not None]
    return median(found) if found else None


def revision(code: Path) -> str:
    """``code``'s git commit (and ``+dirty`` when its work tree differs), or ``unknown``."""
    found = subprocess.run(
        ["git", "-C", str(code), "describe", "--always", "--dirty=+dirty", "--abbrev=12"],
        check=False,
        capture_output=True,
        text=True,
    )
    return found.stdout.strip() or "unknown"


# -- the command ---------------------------------------------------------------------------


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    add = parser.add_argument
    add("--replicas", type=int, default=100_000)
    add("--cycles", type=int, default=3, help="churn and no-change cycles each")
    add("--seed", type=int, default=2026)
    add("--slots", type=int, default=N_SLOTS, help="glidein slots in the pool")
    add("--json", type=Path, help="write the summary here")
    add("--profile", type=Path, help="write a cProfile per kind of cycle here")
    add("--code", type=Path, help="also run, first, the hydrator package of this checkout "
        "(the old code, e.g. in a temporary worktree): old and new in one run")  # fmt: skip
    add("--rounds", type=int, default=1, help="with --code: pairs of runs (old first in odd, "
        "new first in even pairs)")  # fmt: skip
    add("--min-available-mib", type=int, default=3072,
        help="stop a step when the machine's available memory falls under this")  # fmt: skip
    add("--replay-cache-mib", type=int, help="the replay's answer cache (default: room for "
        f"every answer, {REPLAY_BYTES_PER_REPLICA} bytes a replica, at least 768 MiB)")  # fmt: skip
    add("--merge-min-interval-s", type=float, help="[collector] merge_min_interval_s "
        f"(default: the config's, {CollectorConfig().merge_min_interval_s:g})")  # fmt: skip
    add("--startd-updates", type=float, default=0.0,
        help="fraction of the slots whose startd re-advertises (wiping merged attributes) "
        "before each churn and no-change cycle, e.g. 0.2 for a 60 s cycle (default 0)")  # fmt: skip
    add("--bad-replicas", type=int, default=0, help="BAD replicas the replay lists")
    add("--distances", type=int, default=0, help="[distances] on, with an operator table of "
        f"the first N sites (1 to {N_SITES}; near: the sites of a region of {REGION_SITES}); "
        "default 0: off")  # fmt: skip
    add("--against-no-distances", action="store_true", help="with --distances: old and new "
        "in one run as with --code, old being this checkout with [distances] off")  # fmt: skip
    add("--no-looks", action="store_true", help="no repair looks: cycles send their slot "
        "merges themselves, as code older than the looks does (to measure what the looks "
        "cost the cycles after them)")  # fmt: skip
    add("--step", choices=["daemon", "restart"], help=argparse.SUPPRESS)
    add("--url", help=argparse.SUPPRESS)
    add("--workdir", type=Path, help=argparse.SUPPRESS)
    return parser


def main() -> None:
    parser = arguments()
    args = parser.parse_args()
    if not 0 <= args.distances <= N_SITES:
        parser.error(f"--distances must be 0 to {N_SITES}")
    if args.step:
        result = step_daemon(args) if args.step == "daemon" else step_restart(args)
        result["hydrator"] = str(Path(hydrator.__file__).resolve().parents[1])
        print(json.dumps(result))
        return
    if args.against_no_distances and not args.distances:
        parser.error("--against-no-distances needs --distances N")
    if args.against_no_distances and args.code is not None:
        parser.error("--against-no-distances compares this checkout with itself: no --code")
    compared = args.code is not None or args.against_no_distances
    summary = compare(args, args.code) if compared else run(args, None)
    emit(summary, args.json, shown=brief(summary))


def compare(args: argparse.Namespace, code: Path | None) -> dict[str, Any]:
    """``--rounds`` pairs of runs of old (``code``; None: this checkout with ``[distances]``
    off, ``--against-no-distances``) and new: the first pair in full (``old``,
    ``new``, ``new_vs_old``), every pair's :data:`COMPARED` figures (``rounds``) and the median
    of each figure's change over the pairs (``new_vs_old_median``: on a shared machine the
    load moves between runs; alternating and taking the median lessens its weight). Old runs
    first in the first pair, new first in the second, and so on: a load that rises (or falls)
    through the run weighs on both sides alike, not always on the side that runs second."""
    old_args = args if code is not None else argparse.Namespace(**{**vars(args), "distances": 0})
    pairs = [pair(args, code, i % 2 == 0, old_args) for i in range(args.rounds)]
    changes = [new_vs_old(old, new) for old, new in pairs]

    def kept(side: dict[str, Any]) -> dict[str, Any]:
        return {key: side.get(key) for key in (*COMPARED, *PER_PAIR)}

    return {
        "old": pairs[0][0],
        "new": pairs[0][1],
        "new_vs_old": changes[0],
        "rounds": [
            {"old": kept(old), "new": kept(new)}
            | {"new_vs_old": change, "load_average": new["machine"]["load_average"]}
            for (old, new), change in zip(pairs, changes, strict=True)
        ],
        "new_vs_old_median": {key: median_of(c[key] for c in changes) for key in COMPARED},
        "new_vs_old_interval": {
            key: median_interval([v for c in changes if (v := c[key]) is not None])
            for key in COMPARED
        },
    }


def pair(
    args: argparse.Namespace, code: Path | None, old_first: bool, old_args: argparse.Namespace
) -> tuple[dict[str, Any], dict[str, Any]]:
    """One run of old (``code`` with ``old_args``) and one of new (this checkout with
    ``args``), in the order asked; returned as (old, new). With ``--profile DIR`` each side's
    profiles go to ``DIR/old`` and ``DIR/new`` (the last pair's are kept)."""
    if args.profile is not None:
        profiles = args.profile
        args = argparse.Namespace(**{**vars(args), "profile": profiles / "new"})
        old_args = argparse.Namespace(**{**vars(old_args), "profile": profiles / "old"})
    if old_first:
        old = run(old_args, code)
        return old, run(args, None)
    new = run(args, None)
    return run(old_args, code), new


def brief(summary: dict[str, Any]) -> dict[str, Any]:
    """The summary without its raw records (what is printed)."""
    if "new_vs_old" in summary:
        return {k: brief(v) if k in ("old", "new") else v for k, v in summary.items()}
    return {k: v for k, v in summary.items() if k != "raw"}


def run(args: argparse.Namespace, code: Path | None) -> dict[str, Any]:
    """The replay server, then both steps against it with ``code``'s hydrator (None: this
    checkout's); the summary with the machine, the code measured and the replay's own cost."""
    before, checkout = machine(), (code or HERE.parent).resolve()
    measured = revision(checkout)  # before the steps: a commit made meanwhile is not theirs
    server = ReplayServer(args.replicas, args.seed, replay_cache_mib(args), args.bad_replicas)
    try:
        replay_start = server.stats()
        with tempfile.TemporaryDirectory(prefix="hydrator-cycle-") as tmp:
            daemon = run_step("daemon", server.url, Path(tmp), args, code)
            restart: dict[str, Any] = {"failed": "not run: the daemon step failed"}
            if "failed" not in daemon:
                restart = run_step("restart", server.url, Path(tmp), args, code)
        replay = server.stats()
    finally:
        server.stop()
    summary = summarise(args.replicas, daemon, restart)
    if summary["hydrator"] not in (None, str(checkout)):
        raise SystemExit(f"the steps ran the hydrator in {summary['hydrator']}, not {checkout}")
    return summary | {
        "code": measured,
        # the window the step's own code ran with (its config's default unless given)
        "merge_min_interval_s": daemon.get("merge_min_interval_s"),
        "startd_updates": args.startd_updates,
        "bad_replicas": args.bad_replicas,
        "distances": args.distances,
        "looks": not args.no_looks,
        "replay": replay | {"cpu_serving_s": replay["cpu_s"] - replay_start["cpu_s"]},
        "replay_peak_rss_mib": replay["peak_rss_mib"],
        "machine": before,
        "machine_after": machine(),
    }


if __name__ == "__main__":
    main()
