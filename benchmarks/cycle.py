"""Whole-cycle benchmark (issue 15): from the catalogue's bytes to the published ad.

One cycle exactly as the daemon runs it: :meth:`hydrator.runtime.service.Service.run_cycle` on a
service wired like :func:`hydrator.runtime.wiring.build_service`, whose Rucio source makes its real
``rucio-clients`` calls against :mod:`benchmarks.replay` (a loopback server answering in
Rucio's wire format for a generated federation: 50 sites, 200 RSEs, 20k slots), with a
SQLite state file, the collector publisher (its htcondor2 ``Collector`` replaced at the
network call by :class:`PoolStub`, which encodes every ad it is given as the wire needs) and
the HTTP endpoint's file writes (the files the aiohttp child serves; the child itself is not
started: serving is measured by ``benchmarks/http_bench.py``).

Phases, timed by wrapping the service's own callees (the code under test is unchanged):

``fetch_parse``  the source's calls, reading and validating the answers (fetch minus snapshot);
                 wall time, which includes waiting for the replay server (on 2 cores, busy
                 generating answers at 10M): ``fetch_parse_cpu_s`` is the daemon's own CPU
``snapshot``     :meth:`hydrator.domain.Snapshot.of` (merge and freeze the replicas)
``plan``         :func:`hydrator.core.plan.plan_cycle`
``save``         :meth:`hydrator.adapters.state.sqlite.SqliteStateStore.save`
``render``       :func:`hydrator.runtime.service.render_ads` (the hook's ClassAds)
``publish``      the collector publisher (queries answered by the stub, ads built and encoded)
                 plus the HTTP endpoint's file writes
``other``        the rest of ``run_cycle`` (advertise policy, metrics, logging)

Steps, each in a fresh process so that its peak RSS is its own:

``daemon``   start on an empty state (``startup_empty_s``), the first cycle (every replica new,
             ``first_cycle_s``), then ``--cycles`` cycles after 1 % churn each (the replay
             server churns between cycles, untimed) and ``--cycles`` cycles with no change.
``restart``  start on the saved state as a restarted daemon does (load, views, render, the
             HTTP files: ``startup_s``), then one cycle after a churn.

``python -m benchmarks.cycle --replicas 1000000 --json out.json [--profile DIR]`` prints and
writes medians (seconds), peak RSS (MiB), the machine (CPU model, cores, RAM, swap, load
before and after) and the replay server's own peak RSS and CPU seconds (``replay``,
``replay_peak_rss_mib``: not part of ``peak_rss_mib``). ``--profile DIR`` writes a cProfile per
phase and step (``DIR/<step>-<phase>.prof`` and a ``.txt`` summary). Each cycle's record
also holds each phase's own peak RSS (``<phase>_peak_mib``; summarised as ``phase_peaks_mib``
by kind of cycle), so the phase a peak is in is known.
``--merge-min-interval-s S`` sets ``[collector] merge_min_interval_s`` (default: the config's;
recorded as ``merge_min_interval_s``): the churn cycles follow each other within seconds and
the stub wipes merged attributes only with ``--startd-updates F`` (that fraction of the slots'
startds re-advertise before each cycle: ``interval_s / UPDATE_INTERVAL``, 0.2 for 60 s and
HTCondor's default 300 s); without it, with ``S`` above a few minutes no slot is re-merged
after the first cycle, with 0 every slot is, each churn cycle.

``--bad-replicas N`` has the replay list N BAD replicas (files of complete holdings) and
answer their parents: the cost of the checks they force (issue 24 item 2); each cycle's
record holds the source's calls by method (``calls``, summarised for the last cycle of each
kind).

Old and new code in one session (issue 15 item 4): ``--code DIR`` runs both steps with the
``hydrator`` package of the checkout ``DIR`` while the harness and the replay stay this
checkout's (the run stops if a step imported another ``hydrator``; ``code`` in the JSON is
``DIR``'s commit)::

    git worktree add --detach /tmp/old <previous commit>
    python -m benchmarks.cycle --replicas 1000000 --code /tmp/old --json old-1000000.json
    python -m benchmarks.cycle --replicas 1000000 --json new-1000000.json
    git worktree remove /tmp/old

``benchmarks/cycle_report.py`` turns such files (10k to 10M) into the tables and the plot.

At 10M replicas (issue 15 item 3) the replay generates its answers on the fly and caches
them (room for every answer by default, as at 1M: about 4.6 GiB at 10M; ``--replay-cache-mib``
less, and it formats most of them again every cycle on the other core; see
:mod:`benchmarks.replay`). A step that dies is recorded, not a crash: ``failed`` names the
step and why (killed by the OOM killer, seen as a signal and a rise of ``oom_kill`` in
``/proc/vmstat``; or stopped by this harness's watchdog when the machine's available memory
falls under ``--min-available-mib``, default 3 GiB, to spare whatever else runs on the
machine), its figures are ``null``; ``swapped_pages`` counts pages swapped in and out
during the steps.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

import hydrator.runtime.service as service_module
from benchmarks.core_bench import GcClock
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
from hydrator.domain import Snapshot
from hydrator.runtime.http import HttpEndpoint
from hydrator.runtime.metrics import Metrics
from hydrator.runtime.service import Service
from hydrator.runtime.wiring import build_source

HERE = Path(__file__).resolve().parent
PHASES = ("fetch_parse", "snapshot", "plan", "save", "render", "publish", "other")
N_SITES, N_SLOTS = 50, 20_000


# -- the collector at the network call -----------------------------------------------------


class PoolStub:
    """Stands in for ``htcondor2.Collector`` where the network begins.

    ``query`` answers from what earlier ``advertise`` calls sent (a pool of ``slots`` whose
    ads carry the merged attributes; site ads with ``LastHeardFrom``); ``advertise`` encodes
    every ad as HTCondor's wire format needs it (``printOld``), which is the last step before
    the bytes go out. Startds re-advertising, which wipes what was merged into their slots
    (FACTS.md), is modelled only when asked (:meth:`startd_updates`).
    """

    def __init__(self, slots: Mapping[str, str], slot_site_attribute: str) -> None:
        self.slots = {name: {"Name": name, slot_site_attribute: s} for name, s in slots.items()}
        self.bare = {name: dict(ad) for name, ad in self.slots.items()}
        self._next_update = 0
        self.site_ads: dict[str, dict[str, Any]] = {}
        self.encoded_bytes = 0
        attrs = ClassAdConfig()
        self.kept = ("Name", attrs.digest_attribute, attrs.updated_attribute, MERGED_ATTRIBUTE)

    def startd_updates(self, fraction: float) -> int:
        """The next ``fraction`` of the slots (in turn, so every slot's startd updates once per
        ``1 / fraction`` calls, as startds do once per ``UPDATE_INTERVAL``) re-advertise: their
        ads lose what was merged into them. Returns how many."""
        names = list(self.bare)
        count = min(len(names), round(len(names) * fraction))
        for i in range(self._next_update, self._next_update + count):
            name = names[i % len(names)]
            self.slots[name] = dict(self.bare[name])
        self._next_update = (self._next_update + count) % max(1, len(names))
        return count

    def query(self, ad_type: Any, constraint: str, projection: list[str]) -> list[Any]:
        ads = self.site_ads if constraint.startswith("MyType") else self.slots
        return [dict(ad) for ad in ads.values()]

    def advertise(self, ads: list[Any], command: str, use_tcp: bool = True) -> None:
        now = int(time.time())
        for ad in ads:
            self.encoded_bytes += len(ad.printOld())
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


# -- phase clocks --------------------------------------------------------------------------


class Clock:
    """Seconds per phase for the current cycle, and optional cProfiles per phase.

    Phases nest (``snapshot`` inside the source's fetch): the inner one's time is taken off the
    outer one, and only one profiler runs at a time (the outer is paused). Each phase's CPU
    seconds of this process (``<phase>_cpu``; all its threads) are kept too: ``fetch_parse``'s
    wall time includes waiting for the replay server, its CPU time does not. And each phase's
    own peak RSS (``<phase>_peak_mib``): the kernel's high-water mark is read and reset at
    every phase boundary (:class:`HighWater`), so it says which phase a cycle's peak is in;
    what runs outside every phase counts as ``other``.
    """

    def __init__(self, profile: bool) -> None:
        self.profile = profile
        self.seconds: dict[str, float] = defaultdict(float)
        self.cpu: dict[str, float] = defaultdict(float)  # the daemon process's CPU seconds
        self.profiles: dict[str, cProfile.Profile] = {}
        self._stack: list[tuple[str, float, float]] = []
        self.gc = GcClock()
        self.peaks: dict[str, float] = defaultdict(float)  # MiB, per phase, this cycle

    def take(self) -> dict[str, float]:
        self._peak_of(self._stack[-1][0] if self._stack else "other")
        out = dict(self.seconds)
        out["gc"] = self.gc.seconds
        out |= {f"{name}_cpu": s for name, s in self.cpu.items()}
        out |= {f"{name}_peak_mib": mib for name, mib in self.peaks.items()}
        self.seconds.clear()
        self.cpu.clear()
        self.peaks.clear()
        self.gc.seconds = 0.0
        return out

    def _peak_of(self, name: str) -> None:
        """The high-water mark since the last boundary goes to ``name``; then reset."""
        self.peaks[name] = max(self.peaks[name], HIGH_WATER.take())

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        self._peak_of(self._stack[-1][0] if self._stack else "other")
        now, cpu = time.perf_counter(), time.process_time()
        if self._stack:
            outer, since, cpu_since = self._stack[-1]
            self.seconds[outer] += now - since
            self.cpu[outer] += cpu - cpu_since
            self._pause(outer)
        self._stack.append((name, now, cpu))
        self._resume(name)
        try:
            yield
        finally:
            self._pause(name)
            self._peak_of(name)
            name, since, cpu_since = self._stack.pop()
            now, cpu = time.perf_counter(), time.process_time()
            self.seconds[name] += now - since
            self.cpu[name] += cpu - cpu_since
            if self._stack:
                outer, _, _ = self._stack.pop()
                self._stack.append((outer, now, cpu))
                self._resume(outer)

    def _resume(self, name: str) -> None:
        if self.profile:
            self.profiles.setdefault(name, cProfile.Profile()).enable()

    def _pause(self, name: str) -> None:
        if self.profile and name in self.profiles:
            self.profiles[name].disable()

    def write_profiles(self, directory: Path, step: str) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        for name, prof in self.profiles.items():
            prof.dump_stats(directory / f"{step}-{name}.prof")
            text = io.StringIO()
            pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(30)
            pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(30)
            (directory / f"{step}-{name}.txt").write_text(text.getvalue())
        self.profiles.clear()


def timed(clock: Clock, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with clock.phase(name):
            return fn(*args, **kwargs)

    return wrapper


def instrument(clock: Clock) -> None:
    """Time the service's module-level callees and :meth:`Snapshot.of` (this process only)."""
    service_module.plan_cycle = timed(clock, "plan", service_module.plan_cycle)  # type: ignore[assignment]
    service_module.render_ads = timed(clock, "render", service_module.render_ads)  # type: ignore[assignment]
    of = Snapshot.__dict__["of"].__func__

    def snapshot_of(cls: type[Snapshot], *args: Any, **kwargs: Any) -> Snapshot:
        with clock.phase("snapshot"):
            return of(cls, *args, **kwargs)  # type: ignore[no-any-return]

    Snapshot.of = classmethod(snapshot_of)  # type: ignore[method-assign, assignment]


# -- the daemon under test -----------------------------------------------------------------


def config(url: str, workdir: Path, merge_min_interval_s: float | None = None) -> Config:
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
    )
    return Config(
        daemon=DaemonConfig(state_path=workdir / "state.sqlite"),
        http=HttpConfig(listen="127.0.0.1:0"),
        classad=ClassAdConfig(),
        collector=CollectorConfig(enabled=True, **collector_options(merge_min_interval_s)),
        sources=[source],
    )


def collector_options(merge_min_interval_s: float | None) -> dict[str, Any]:
    """``[collector]`` keys given on the command line (none: the config's defaults)."""
    if merge_min_interval_s is None:
        return {}
    return {"merge_min_interval_s": merge_min_interval_s}


class TimedService:
    """A service wired as :func:`hydrator.runtime.wiring.build_service` wires it, with the collector
    at :class:`PoolStub` and the HTTP endpoint writing its files (no server child)."""

    def __init__(self, cfg: Config, clock: Clock, pool: PoolStub) -> None:
        path = cfg.daemon.state_path
        self.lock = StateLock(path)
        store = SqliteStateStore(path, lock=self.lock)
        store.save = timed(clock, "save", store.save)  # type: ignore[method-assign]
        source = build_source(cfg.sources[0], cfg.sites)
        source.fetch = timed(clock, "fetch_parse", source.fetch)  # type: ignore[method-assign]
        publisher = CollectorPublisher(cfg.collector, cfg.classad, collector=pool)  # type: ignore[arg-type]
        publisher.publish = timed(clock, "publish", publisher.publish)  # type: ignore[method-assign]
        self.service = Service(
            cfg,
            sources=[source],
            store=store,
            publishers=[publisher],
            metrics=Metrics(CollectorRegistry()),
        )
        self.endpoint = HttpEndpoint(self.service, cfg.http, wedged_after_s=600.0)
        self.endpoint.write()  # what HttpEndpoint.start does before the server child starts
        self.service.add_listener(timed(clock, "publish", self.endpoint.write))

    def cycle(self) -> float:
        t0 = time.perf_counter()
        report = self.service.run_cycle()
        elapsed = time.perf_counter() - t0
        if report.outcome != "ok":
            raise RuntimeError(f"cycle {report.outcome}: {report.error or report.publish_errors}")
        return elapsed

    def close(self) -> None:
        self.endpoint.stop()
        self.service.close()


def record(clock: Clock, whole_s: float, service: Service) -> dict[str, Any]:
    phases = clock.take()
    out: dict[str, Any] = {p: phases.get(p, 0.0) for p in PHASES if p != "other"}
    out["other"] = max(0.0, whole_s - sum(out.values()))
    out["whole"] = whole_s
    out["gc"] = phases["gc"]
    out["fetch_parse_cpu"] = phases.get("fetch_parse_cpu", 0.0)
    out |= {k: v for k, v in phases.items() if k.endswith("_peak_mib")}  # each phase's own
    out["replicas"] = sum(len(s.replicas) for s in service.state.sources.values())
    out["calls"] = {
        k: v for s in service.sources for k, v in getattr(s, "calls_last_fetch", {}).items()
    }
    out["rss_mib"] = rss_mib()
    out["peak_rss_mib"] = peak_rss_mib()  # the step's so far: which cycle raised it
    return out


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


class HighWater:
    """This process's peak RSS, readable per stretch of time: :meth:`take` returns the kernel's
    high-water mark (``VmHWM``) and resets it to the current RSS (``/proc/self/clear_refs``,
    ``5``), keeping the highest value it has seen, so :meth:`peak` is still the process's
    peak (``ru_maxrss`` is that same mark, and would only say "since the last reset")."""

    def __init__(self) -> None:
        self.seen = 0.0

    @staticmethod
    def _mark() -> float:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB

    def take(self) -> float:
        mark = self._mark()
        self.seen = max(self.seen, mark)
        with suppress(OSError):  # not resettable here: marks only grow
            Path("/proc/self/clear_refs").write_text("5")
        return mark

    def peak(self) -> float:
        return max(self.seen, self._mark())


HIGH_WATER = HighWater()


def peak_rss_mib() -> float:
    return HIGH_WATER.peak()


def churn(url: str) -> dict[str, int]:
    with urllib.request.urlopen(urllib.request.Request(f"{url}/_bench/churn", method="POST")) as r:
        answer: dict[str, int] = json.load(r)
        return answer


def _instrumented(args: argparse.Namespace) -> tuple[Clock, PoolStub, Config]:
    """A phase clock hooked into the daemon's code, the collector stub and the configuration
    every step runs with."""
    clock = Clock(args.profile is not None)
    instrument(clock)
    pool = PoolStub(slot_names(args.slots), CollectorConfig().slot_site_attribute)
    return clock, pool, config(args.url, args.workdir, args.merge_min_interval_s)


def step_daemon(args: argparse.Namespace) -> dict[str, Any]:
    clock, pool, cfg = _instrumented(args)
    t0 = time.perf_counter()
    daemon = TimedService(cfg, clock, pool)
    startup_empty = time.perf_counter() - t0
    clock.take()
    first = record(clock, daemon.cycle(), daemon.service)
    if args.profile:
        clock.write_profiles(args.profile, "first")
    churned, nochange = [], []
    for _ in range(args.cycles):
        churn(args.url)
        pool.startd_updates(args.startd_updates)
        clock.take()
        churned.append(record(clock, daemon.cycle(), daemon.service))
    if args.profile:
        clock.write_profiles(args.profile, "churn")
    for _ in range(args.cycles):
        pool.startd_updates(args.startd_updates)
        clock.take()
        nochange.append(record(clock, daemon.cycle(), daemon.service))
    if args.profile:
        clock.write_profiles(args.profile, "nochange")
    daemon.close()
    return {
        "startup_empty_s": startup_empty,
        "first": first,
        "churn": churned,
        "nochange": nochange,
        "encoded_bytes": pool.encoded_bytes,
        "peak_rss_mib": peak_rss_mib(),
    }


def step_restart(args: argparse.Namespace) -> dict[str, Any]:
    clock, pool, cfg = _instrumented(args)
    with clock.phase("startup"):
        t0 = time.perf_counter()
        daemon = TimedService(cfg, clock, pool)
        startup = time.perf_counter() - t0
    rss_after_startup = rss_mib()
    clock.take()
    churn(args.url)
    after = record(clock, daemon.cycle(), daemon.service)
    if args.profile:
        clock.write_profiles(args.profile, "restart")
    daemon.close()
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
    return max(768, -(-args.replicas * REPLAY_BYTES_PER_REPLICA // 2**20))


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
            command,
            cwd=HERE.parent,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
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


def run_step(step: str, url: str, workdir: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One step in a child process, watched: its result, or a record of why it has none
    (``failed``: killed by the OOM killer or by the watchdog when the machine's available
    memory fell under ``--min-available-mib``, or its error) and the swapping it caused."""
    command = [
        sys.executable, "-m", "benchmarks.cycle", "--step", step, "--url", url,
        "--workdir", str(workdir), "--cycles", str(args.cycles), "--slots", str(args.slots),
    ]  # fmt: skip
    if args.profile is not None:
        command += ["--profile", str(args.profile)]
    if args.merge_min_interval_s is not None:
        command += ["--merge-min-interval-s", str(args.merge_min_interval_s)]
    command += ["--startd-updates", str(args.startd_updates)]
    env = dict(os.environ, RUCIO_HOME=str(workdir))  # no stray rucio.cfg from elsewhere
    cwd = HERE.parent  # ``python -m`` puts the working directory first on sys.path
    if args.code is not None:
        cwd = code_path(args.code, workdir)
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
        if meminfo().get("MemAvailable", 1 << 40) / 1024 < min_available_mib:
            proc.kill()
            proc.wait()
            return f"stopped by the watchdog: MemAvailable < {min_available_mib} MiB"
        time.sleep(0.5)
    return None


def meminfo() -> dict[str, int]:
    """``/proc/meminfo`` in KiB."""
    out = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        key, _, value = line.partition(":")
        out[key] = int(value.split()[0])
    return out


def vmstat() -> dict[str, int]:
    """``/proc/vmstat`` counters (pages swapped in/out, OOM kills)."""
    pairs = (line.split() for line in Path("/proc/vmstat").read_text().splitlines())
    return {key: int(value) for key, value in pairs}


def machine() -> dict[str, Any]:
    """The machine a run was measured on: CPU model, cores, memory, swap, load."""
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        "unknown",
    )
    memory = meminfo()
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "ram_gib": round(memory["MemTotal"] / 2**20, 1),
        "available_gib": round(memory["MemAvailable"] / 2**20, 1),
        "swap_gib": round(memory["SwapTotal"] / 2**20, 1),
        "swap_used_gib": round((memory["SwapTotal"] - memory["SwapFree"]) / 2**20, 1),
        "load_average": os.getloadavg(),
        "python": sys.version.split()[0],
    }


def median(rows: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def phase_peaks(daemon: dict[str, Any], restart: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Each phase's own peak RSS (MiB) by kind of cycle: ``first``, ``churn`` and
    ``nochange`` (the highest over those cycles) and ``restart`` (the cycle after it)."""
    kinds: dict[str, list[dict[str, Any]]] = {}
    if "failed" not in daemon:
        kinds |= {"first": [daemon["first"]], "churn": daemon["churn"]}
        kinds["nochange"] = daemon["nochange"]
    if "failed" not in restart:
        kinds["restart"] = [restart["cycle_after_restart"]]
    return {
        kind: {
            p: max(r.get(f"{p}_peak_mib", 0.0) for r in records)
            for p in PHASES
            if any(f"{p}_peak_mib" in r for r in records)
        }
        for kind, records in kinds.items()
    }


def summarise(replicas: int, daemon: dict[str, Any], restart: dict[str, Any]) -> dict[str, Any]:
    """Medians of both steps' records; a step that failed (``failed``) leaves its figures
    ``None`` and is named in ``failed``."""
    out: dict[str, Any] = {"replicas": replicas}
    failed = {
        step: r["failed"] for step, r in (("daemon", daemon), ("restart", restart)) if "failed" in r
    }
    if "failed" not in daemon:
        churned, idle = daemon["churn"], daemon["nochange"]
        out |= {
            "replicas_held": churned[-1]["replicas"],
            "whole_cycle_s": median(churned, "whole"),
            "nochange_cycle_s": median(idle, "whole"),
            "first_cycle_s": daemon["first"]["whole"],
            "phases_s": {p: median(churned, p) for p in (*PHASES, "gc")},
            "nochange_phases_s": {p: median(idle, p) for p in (*PHASES, "gc")},
            "first_phases_s": {p: daemon["first"][p] for p in (*PHASES, "gc")},
            "fetch_parse_cpu_s": {
                "first": daemon["first"]["fetch_parse_cpu"],
                "churn": median(churned, "fetch_parse_cpu"),
                "nochange": median(idle, "fetch_parse_cpu"),
            },
            "cycles": len(churned),
            "calls": {
                "first": daemon["first"]["calls"],
                "churn": churned[-1]["calls"],
                "nochange": idle[-1]["calls"],
            },
        }
    out["phase_peaks_mib"] = phase_peaks(daemon, restart)
    if "failed" not in restart:
        out |= {
            "startup_s": restart["startup_s"],
            "cycle_after_restart_s": restart["cycle_after_restart"]["whole"],
            "peak_rss_steady_mib": restart["peak_rss_mib"],
        }
    peaks = [r["peak_rss_mib"] for r in (daemon, restart) if "peak_rss_mib" in r]
    out["peak_rss_mib"] = max(peaks) if peaks else None
    for key in ("whole_cycle_s", "nochange_cycle_s", "startup_s", "first_cycle_s"):
        out.setdefault(key, None)
    out["failed"] = failed
    out["swapped_pages"] = {
        k: sum(r["swapped_pages"][k] for r in (daemon, restart) if "swapped_pages" in r)
        for k in ("pswpin", "pswpout")
    }
    out["hydrator"] = daemon.get("hydrator") or restart.get("hydrator")
    out["load_average"] = os.getloadavg()
    out["cpus"] = os.cpu_count()
    out["python"] = sys.version.split()[0]
    out["raw"] = {"daemon": daemon, "restart": restart}
    return out


def revision(code: Path) -> str:
    """``code``'s git commit (and ``+dirty`` when its work tree differs), or ``unknown``."""
    found = subprocess.run(
        ["git", "-C", str(code), "describe", "--always", "--dirty=+dirty", "--abbrev=12"],
        check=False,
        capture_output=True,
        text=True,
    )
    return found.stdout.strip() or "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--replicas", type=int, default=100_000)
    parser.add_argument("--cycles", type=int, default=3, help="churn and no-change cycles each")
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--slots", type=int, default=N_SLOTS, help="glidein slots in the pool")
    parser.add_argument("--json", type=Path, help="write the summary here")
    parser.add_argument("--profile", type=Path, help="write a cProfile per phase here")
    parser.add_argument(
        "--code", type=Path,
        help="run the daemon steps with the hydrator package of this checkout (e.g. the "
        "previous commit in a temporary worktree); the harness and replay stay this one's",
    )  # fmt: skip
    parser.add_argument(
        "--min-available-mib", type=int, default=3072,
        help="stop a step when the machine's available memory falls under this",
    )  # fmt: skip
    parser.add_argument(
        "--replay-cache-mib", type=int,
        help="the replay's answer cache (default: room for every answer, about "
        f"{REPLAY_BYTES_PER_REPLICA} bytes a replica, at least 768 MiB)",
    )  # fmt: skip
    parser.add_argument(
        "--merge-min-interval-s", type=float,
        help="[collector] merge_min_interval_s (default: the config's, "
        f"{CollectorConfig().merge_min_interval_s:g})",
    )  # fmt: skip
    parser.add_argument(
        "--startd-updates", type=float, default=0.0,
        help="fraction of the slots whose startd re-advertises (wiping merged attributes) "
        "before each churn and no-change cycle: interval_s / UPDATE_INTERVAL, e.g. 0.2 for a "
        "60 s cycle and HTCondor's default 300 s (default 0: not modelled)",
    )  # fmt: skip
    parser.add_argument(
        "--bad-replicas", type=int, default=0,
        help="BAD replicas the replay lists (issue 24 item 2: the checks they force)",
    )  # fmt: skip
    parser.add_argument("--step", choices=["daemon", "restart"], help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--workdir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.step:
        result = step_daemon(args) if args.step == "daemon" else step_restart(args)
        result["hydrator"] = str(Path(service_module.__file__).resolve().parents[2])
        print(json.dumps(result))
        return
    summary = run(args)
    text = json.dumps(summary, indent=1)
    if args.json:
        args.json.write_text(text + "\n")
    brief = {k: v for k, v in summary.items() if k != "raw"}
    print(json.dumps(brief, indent=1))


def run(args: argparse.Namespace) -> dict[str, Any]:
    """The replay server, then both steps against it; the summary with the machine, the code
    measured and the replay's own cost (not part of ``peak_rss_mib``)."""
    before = machine()
    server = ReplayServer(args.replicas, args.seed, replay_cache_mib(args), args.bad_replicas)
    try:
        replay_start = server.stats()
        with tempfile.TemporaryDirectory(prefix="hydrator-cycle-") as tmp:
            daemon = run_step("daemon", server.url, Path(tmp), args)
            restart: dict[str, Any] = {"failed": "not run: the daemon step failed"}
            if "failed" not in daemon:
                restart = run_step("restart", server.url, Path(tmp), args)
        replay = server.stats()
    finally:
        server.stop()
    summary = summarise(args.replicas, daemon, restart)
    code = (args.code or HERE.parent).resolve()
    if summary["hydrator"] not in (None, str(code)):
        raise SystemExit(f"the steps ran the hydrator in {summary['hydrator']}, not {code}")
    summary["code"] = revision(code)
    summary["merge_min_interval_s"] = CollectorConfig(
        **collector_options(args.merge_min_interval_s)
    ).merge_min_interval_s
    summary["startd_updates"] = args.startd_updates
    summary["bad_replicas"] = args.bad_replicas
    summary["replay"] = replay | {"cpu_serving_s": replay["cpu_s"] - replay_start["cpu_s"]}
    summary["replay_peak_rss_mib"] = replay["peak_rss_mib"]
    summary["machine"] = before
    summary["machine_after"] = machine()
    summary["load_average_before"] = before["load_average"]
    return summary


if __name__ == "__main__":
    main()
