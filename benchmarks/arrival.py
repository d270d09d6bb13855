"""Catalogue change to the collector slot ad, and data arrival to job start, on the real stack:
a Rucio 41.5.1 server with its own ``rucio-hermes`` (``--sleep-time 1``), ActiveMQ,
``hydrator run`` with ``[sources.events]`` and the collector path on the test pool (slot1,
SITE_A). ARRIVAL.md says how each figure is taken.

* **Slot ad** (``--changes`` of each kind): datasets complete at a source RSE with a
  ``notify="Y"`` rule to the site (untimed); additions staggered ``--stagger-s`` apart (files
  made AVAILABLE at the site: the clock starts before that call), then deletions in batches
  (rule lifetime 0, judge-cleaner, reaper: the clock starts; hermes' ``deletion-done``, abacus
  inside the window). A thread samples slot1's ad every ``--period-s``; each change is on a
  dataset of its own, so each observation is attributed by name. An addition is seen at the
  first sample listing it in ``AvailableDatasets``; a deletion at the first sample carrying
  the lists (the digest attribute) after which no sample carrying them names it in any list.
* **Arrival to job start** (``--arrivals``): one at a time, a strict job
  (``identicalMember(dataset, TARGET.AvailableDatasets)``) waits for a negotiation cycle to
  reject it (its dataset is complete only at the source RSE, whose site has no slot); its files
  are then made AVAILABLE at the site; the seconds until ``JobCurrentStartDate``. Every other
  arrival the harness calls ``Schedd.reschedule()`` as soon as slot1's ad lists the dataset
  (what a daemon step would do at best), to measure whether it helps.

    .venv/bin/python -m benchmarks arrival --code OLD_CHECKOUT --new-code NEW_CHECKOUT \
        --json benchmarks/results/arrival.json

Needs root (the pool); takes the pool once for both sides. Exits 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack, suppress
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import htcondor2
from tenacity import retry_if_exception_type, stop_after_attempt

from benchmarks import events, events_chaos
from benchmarks.conditions import machine
from benchmarks.coverage import revision, side_env
from tests.support.activemq import Broker, running_broker
from tests.support.hermes import EventDaemon, Hermes, running_event_daemon
from tests.support.pool import SLOT_SITES, SUBMIT_USER, Pool, running_pool
from tests.support.rucio_server import RucioAdmin, make_server
from tests.support.static_inventory import TRANSIENT, invalidate_site_ads
from tests.support.wait import wait_for

HERE = Path(__file__).parent
SLOT = "slot1"
LISTS = ("AvailableDatasets", "PartialDatasets", "ReplicatingDatasets", "StuckDatasets")
DIGEST = "DataLocalityDigest"
NEGOTIATOR_INTERVAL_S = 5.0  # the test pool's (scripts/condor-pool)
ARRIVAL_P99_S = NEGOTIATOR_INTERVAL_S + 5.0  # target: arrival to job start, p99
CHUNK = 20  # datasets per bulk call in prepare()
PATIENT = events.retried.copy(stop=stop_after_attempt(10))
ONCE_MORE = PATIENT.copy(retry=retry_if_exception_type(RuntimeError))  # a Rucio daemon's pass
FRAGMENT = "70-arrival-bench.conf"  # --update-interval-s, in the pool's config dir
JOB = (
    "executable = /bin/true\noutput = /dev/null\nerror = /dev/null\n"
    'requirements = identicalMember("{did}", TARGET.AvailableDatasets)\nqueue\n'
)
Lists = dict[str, frozenset[str]]  # attribute -> the datasets it names
Seen = tuple[float, Lists | None]  # (monotonic s, slot1's lists; None: bare)


def slot_lists(pool: Pool) -> Lists | None:
    """slot1's lists as the collector has them now; None while it carries no digest (bare)."""
    ads = [ad for ad in pool.slot_ads([DIGEST, *LISTS]) if ad["Name"].startswith(SLOT + "@")]
    if not ads or ads[0].get(DIGEST) is None:
        return None
    return {k: frozenset(str(d) for d in ads[0].get(k) or []) for k in LISTS}


class Sampler:
    """slot1's ad every ``period_s`` in a thread of its own (the only htcondor2 caller while
    it runs), stamped with the monotonic time the answer came back."""

    def __init__(self, pool: Pool, period_s: float) -> None:
        self.pool, self.period_s, self.samples = pool, period_s, list[Seen]()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.wait(self.period_s):
            with suppress(*TRANSIENT):
                lists = slot_lists(self.pool)
                self.samples.append((time.monotonic(), lists))

    def __enter__(self) -> Sampler:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join()


def added_at(samples: list[Seen], did: str, t0: float) -> float | None:
    """Seconds from ``t0`` to the first sample listing ``did`` as available."""
    return next((t - t0 for t, lists in samples if t >= t0 and lists
                 and did in lists["AvailableDatasets"]), None)  # fmt: skip


def removed_at(samples: list[Seen], did: str, t0: float) -> float | None:
    """Seconds from ``t0`` to the first sample carrying lists after the last one (from ``t0``)
    naming ``did`` in any list; None when the last carrying sample still names it."""
    carrying = [(t, lists) for t, lists in samples if t >= t0 and lists is not None]
    last = max((i for i, (_, lists) in enumerate(carrying)
                if any(did in names for names in lists.values())), default=-1)  # fmt: skip
    return carrying[last + 1][0] - t0 if last + 1 < len(carrying) else None


def prepare(admin: RucioAdmin, daemon: EventDaemon, count: int) -> list[tuple[str, str]]:
    """``count`` datasets of two files complete at the source (in bulk, with a rule there), each
    with a ``notify="Y"`` rule to the site; (name, rule id) pairs. In chunks of
    :data:`CHUNK`, each call tried up to 10 times: the test server's SQLite database is busy
    while hermes reads it, and a long bulk write fails ("database is locked")."""
    out: list[tuple[str, str]] = []
    for start in range(0, count, CHUNK):
        size = min(CHUNK, count - start)
        names = PATIENT(admin.many_datasets, daemon.scope, size, daemon.src, files=2)
        dids = [{"scope": daemon.scope, "name": n} for n in names]
        rules = PATIENT(admin.client.add_replication_rule, dids, 1, daemon.dst, notify="Y")
        out += zip(names, (str(r) for r in rules), strict=True)
    return out


def slot_changes(
    admin: RucioAdmin, daemon: EventDaemon, broker: Broker, pool: Pool, args: argparse.Namespace
) -> dict[str, Any]:
    """Additions of ``args.changes`` + ``args.keep`` datasets, then deletions of the first
    ``args.changes``, timed to slot1's ad. The kept ones are there because a site that loses
    more than half its datasets at once is held back by ``[safety]`` (its default
    ``site_max_drop_fraction``), as it should be: the last batch would empty the site."""
    made = prepare(admin, daemon, args.changes + args.keep)
    adds: dict[str, float] = {}
    dels: dict[str, float] = {}
    with Sampler(pool, args.period_s) as sampler:
        for name, _ in made:
            adds[name] = time.monotonic()
            files = [f"{name}.f{i:03d}" for i in range(2)]
            PATIENT(admin.set_file_states, daemon.dst, daemon.scope, files, "A")
            time.sleep(max(0.0, adds[name] + args.stagger_s - time.monotonic()))
        settle(sampler, added_at, daemon, adds, args.timeout)
        for i in range(0, args.changes, args.delete_batch):
            batch = made[i : min(i + args.delete_batch, args.changes)]
            delete(admin, daemon, broker, batch, dels)
        settle(sampler, removed_at, daemon, dels, args.timeout)
    samples = sampler.samples

    def within(value: float | None) -> float | None:
        return None if value is None or value > args.timeout else value

    add_s = [within(added_at(samples, did(daemon, n), t)) for n, t in adds.items()]
    # a deletion whose addition was never seen counts as a miss too
    del_s = [None if a is None else within(removed_at(samples, did(daemon, n), t))
             for a, (n, t) in zip(add_s, dels.items(), strict=False)]  # fmt: skip
    bare = sum(lists is None for _, lists in samples)
    return {
        "add_slot": events.summary(add_s, args.timeout) | {"path": "addition to slot1's ad"},
        "del_slot": events.summary(del_s, args.timeout)
        | {"path": "deletion out of every list of slot1's ad"},
        "samples": len(samples), "bare_samples": bare,
        "window_s": round(samples[-1][0] - samples[0][0], 1) if samples else 0.0,
    }  # fmt: skip


def did(daemon: EventDaemon, name: str) -> str:
    return f"{daemon.scope}:{name}"


def settle(
    sampler: Sampler,
    seen: Callable[[list[Seen], str, float], float | None],
    daemon: EventDaemon,
    started: dict[str, float],
    timeout_s: float,
) -> None:
    """Wait until ``seen`` finds every change in ``started`` (name -> its clock's start) in the
    samples, or ``timeout_s`` after the last one started (the rest are misses)."""

    def done() -> bool:
        return all(seen(sampler.samples, did(daemon, n), t) is not None for n, t in started.items())

    left = max(started.values(), default=0.0) + timeout_s - time.monotonic()
    with suppress(AssertionError):
        wait_for("every change seen", done, timeout_s=max(1.0, left), interval_s=0.5)


def delete(
    admin: RucioAdmin,
    daemon: EventDaemon,
    broker: Broker,
    batch: list[tuple[str, str]],
    started: dict[str, float],
) -> None:
    """The batch's rules deleted for real (:func:`benchmarks.events.deletion`, judge-cleaner
    and reaper passes for the whole batch until no file replica of it is left at the site,
    four at most); the clock of each starts then, and only then is its ``deletion-done``
    sent (as real storage would)."""
    for _, rule in batch:
        PATIENT(admin.client.update_replication_rule, rule, {"lifetime": 0})
    files = [{"scope": daemon.scope, "name": f"{n}.f{i:03d}"} for n, _ in batch for i in range(2)]
    for _ in range(4):  # a pass may leave some (expiry within the same second, a busy database)
        ONCE_MORE(admin.server.run_daemon, "rucio-judge-cleaner")
        ONCE_MORE(admin.server.run_daemon, "rucio-reaper", "--greedy", "--rses", daemon.dst)
        if not PATIENT(lambda: list(admin.client.list_replicas(files, rse_expression=daemon.dst))):
            break
    t0 = time.monotonic()
    created = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")
    broker.publish_as_hermes([
        {"event_type": "deletion-done", "created_at": created,
         "payload": {"scope": daemon.scope, "name": f"{name}.f000", "rse": daemon.dst}}
        for name, _ in batch
    ])  # fmt: skip
    for name, _ in batch:
        started[name] = t0
    ONCE_MORE(admin.server.run_abacus)


def arrivals(
    admin: RucioAdmin, daemon: EventDaemon, pool: Pool, args: argparse.Namespace
) -> dict[str, Any]:
    """``args.arrivals`` strict jobs, each started by its dataset's arrival, one at a time (the
    next is submitted while the last one ends); every other one with a reschedule once slot1's
    ad lists the dataset."""
    found: dict[str, list[float | None]] = {"plain": [], "reschedule": []}
    extra: dict[str, list[dict[str, Any]]] = {"plain": [], "reschedule": []}
    waiting = submit(admin, daemon, pool)
    for i in range(args.arrivals):
        kind = "reschedule" if i % 2 else "plain"
        cluster = waiting[1]
        try:
            try:
                start, more = one_arrival(admin, daemon, pool, waiting, kind, args.timeout)
            except (AssertionError, RuntimeError, *TRANSIENT) as exc:  # a miss, said why
                start, more = None, {"error": str(exc)[:300]}
            if i + 1 < args.arrivals:
                waiting = submit(admin, daemon, pool)
            with suppress(AssertionError, *TRANSIENT):
                pool.wait_for_job_state(cluster, [4], timeout_s=30)
        finally:
            pool.run_in_chroot(["condor_rm", str(cluster)], user=SUBMIT_USER, check=False)
        found[kind].append(start)
        extra[kind].append(more)
        print(f"  arrival {i + 1}/{args.arrivals} ({kind}): start {start} {more}", flush=True)
    return {
        "all": events.summary(found["plain"] + found["reschedule"], args.timeout)
        | {"path": "arrival to job start (JobCurrentStartDate)"},
        **{k: events.summary(v, args.timeout) | {"detail": extra[k]} for k, v in found.items()},
        "negotiator_interval_s": NEGOTIATOR_INTERVAL_S,
    }


def submit(admin: RucioAdmin, daemon: EventDaemon, pool: Pool) -> tuple[str, int]:
    """A dataset complete only at the source (no slot's site) with a rule to the site, and a
    strict job needing it; (dataset name, cluster)."""
    ((name, _),) = prepare(admin, daemon, 1)
    return name, pool.submit(JOB.format(did=did(daemon, name)))


def one_arrival(
    admin: RucioAdmin,
    daemon: EventDaemon,
    pool: Pool,
    waiting: tuple[str, int],
    kind: str,
    timeout_s: float,
) -> tuple[float | None, dict[str, Any]]:
    """Once a negotiation cycle has rejected the job, its dataset's files are made AVAILABLE
    at the site. Seconds from that call to the job's ``JobCurrentStartDate`` (whole seconds,
    the schedd's clock; None if not within ``timeout_s``); also when the harness saw slot1's
    ad list the dataset and the job started (its polls, every 0.25 s)."""
    name, cluster = waiting
    wait_for("a rejection", lambda: pool.job_ad(cluster, ["LastRejMatchTime"]),
             done=lambda ad: ad is not None and ad.get("LastRejMatchTime") is not None,
             timeout_s=60, interval_s=0.5, ignore=TRANSIENT)  # fmt: skip
    files = [f"{name}.f{i:03d}" for i in range(2)]
    t0, mono = time.time(), time.monotonic()
    PATIENT(admin.set_file_states, daemon.dst, daemon.scope, files, "A")
    more: dict[str, Any] = {"listed_s": None, "seen_started_s": None, "reschedule": None}
    started = None
    while started is None and time.monotonic() < mono + timeout_s:
        with suppress(*TRANSIENT):
            if more["listed_s"] is None:
                lists = slot_lists(pool)
                if lists and did(daemon, name) in lists["AvailableDatasets"]:
                    more["listed_s"] = round(time.monotonic() - mono, 2)
                    if kind == "reschedule":
                        more["reschedule"] = reschedule(pool)
            ad = pool.job_ad(cluster, ["JobCurrentStartDate"])
            if ad is not None and ad.get("JobCurrentStartDate") is not None:
                started = float(ad["JobCurrentStartDate"]) - t0
                more["seen_started_s"] = round(time.monotonic() - mono, 2)
        time.sleep(0.25)
    return started, more


def reschedule(pool: Pool) -> str:
    """Ask the pool's schedd for a negotiation cycle (``Schedd.reschedule()``, else
    ``condor_reschedule`` as the submitter); which one answered, and its cost in seconds."""
    t0 = time.monotonic()
    try:
        pool.schedd.reschedule()
        how = "htcondor2"
    except htcondor2.HTCondorException:
        pool.run_in_chroot(["condor_reschedule"], user=SUBMIT_USER)
        how = "condor_reschedule"
    return f"{how} {time.monotonic() - t0:.3f} s"


def side(
    label: str,
    code: Path | None,
    admin: RucioAdmin,
    broker: Broker,
    pool: Pool,
    args: argparse.Namespace,
) -> dict[str, Any]:
    """One side: its daemon on ``code``'s package (listener defaults, collector path on with
    its defaults), then the slot-ad changes and the arrivals; its merges invalidated after."""
    with ExitStack() as stack:
        imported = stack.enter_context(side_env(code))
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="hydrator-arrival-")))
        stack.callback(invalidate_site_ads, pool)
        if args.update_interval_s:  # the startds' UPDATE_INTERVAL for this side, then undone
            pool.write_config(FRAGMENT, f"UPDATE_INTERVAL = {args.update_interval_s}\n")
            stack.callback(pool.reconfig)
            stack.callback(pool.remove_config, FRAGMENT)
            pool.reconfig()
        extra = (f'\n[collector]\nenabled = true\npool = "{pool.collector_address}"\n'
                 f'token_dir = "{pool.token_dir}"\n')  # fmt: skip
        if label == "new" and args.new_reschedule_s:  # a key the old code may not know
            extra += f"reschedule_min_interval_s = {args.new_reschedule_s}\n"
        daemon = stack.enter_context(
            running_event_daemon(admin, broker, work, SLOT_SITES[SLOT], extra, debounce_s=1.0)
        )
        events.defaults(daemon)
        wait_for("slot1 carries lists", lambda: slot_lists(pool) is not None,
                 timeout_s=120, interval_s=0.5, ignore=TRANSIENT)  # fmt: skip
        out: dict[str, Any] = {"side": label, "hydrator": imported, "config": extra,
                               "revision": revision(code or HERE.parent)}  # fmt: skip
        t0 = time.monotonic()
        if args.changes:
            print(f"{label}: {args.changes} additions and deletions", flush=True)
            out["slot"] = slot_changes(admin, daemon, broker, pool, args)
        if args.arrivals:
            print(f"{label}: {args.arrivals} arrivals", flush=True)
            out["arrival"] = arrivals(admin, daemon, pool, args)
        out["seconds"] = round(time.monotonic() - t0, 1)
        out["counters"] = events_chaos.counters(daemon)
        lines = daemon.log.read_text(errors="replace").splitlines()
        said = [ln[:300] for ln in lines if " WARNING " in ln or " ERROR " in ln]
        out["daemon_warnings"] = said[-30:]
        return out


def missed(label: str, result: dict[str, Any]) -> list[str]:
    """The targets one side misses, one line each."""
    out = []
    limits = (("add_slot", events.ADDITION_P99_S), ("del_slot", events.DELETION_P99_S))
    for key, limit in limits:
        got = result.get("slot", {}).get(key)
        if got and (got["misses"] or got["p99_s"] > limit):
            out.append(f"{label}: {got['path']}: p99 {got['p99_s']:.2f} s (target {limit} s), "
                       f"{got['misses']} missed of {got['n']}")  # fmt: skip
    got = result.get("arrival", {}).get("all")
    if got and (got["misses"] or got["p99_s"] > ARRIVAL_P99_S):
        out.append(f"{label}: arrival to job start p99 {got['p99_s']:.2f} s "
                   f"(target {ARRIVAL_P99_S} s), {got['misses']} missed of {got['n']}")  # fmt: skip
    return out


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    add = parser.add_argument
    add("--code", type=Path, help="the old checkout: its hydrator package runs first")
    add("--new-code", type=Path, help="the new checkout (default: this one)")
    add("--changes", type=int, default=100, help="additions and deletions, each")
    add("--stagger-s", type=float, default=0.5, help="seconds between additions")
    add("--delete-batch", type=int, default=20, help="rules deleted per reaper pass")
    add("--keep", type=int, default=40, help="datasets added and never deleted ([safety])")
    add("--arrivals", type=int, default=20, help="strict jobs started by an arrival")
    add("--period-s", type=float, default=0.2, help="seconds between samples of slot1's ad")
    add("--timeout", type=float, default=60.0, help="seconds before a miss")
    add("--update-interval-s", type=int, default=0,
        help="the startds' UPDATE_INTERVAL (0: the test pool's own, 5 s)")  # fmt: skip
    add("--new-reschedule-s", type=float, default=0.0,
        help="the new side's [collector] reschedule_min_interval_s (0: its default)")  # fmt: skip
    add("--json", type=Path, default=None)
    return parser.parse_args(argv)


def write(record: dict[str, Any], path: Path | None) -> None:
    if path is not None:
        path.write_text(json.dumps(record, indent=1, default=str) + "\n")


class Supervised:
    """Restarts ``rucio-hermes`` whenever it has exited, as a deployment's supervisor would
    (a dead hermes would turn every later change into a miss); counts the restarts, with the
    exit code and the tail of hermes' log before each."""

    def __init__(self, hermes: Hermes) -> None:
        self.hermes, self.restarts = hermes, list[str]()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(1.0):
            process = self.hermes.process
            if process is not None and process.poll() is not None:
                log = self.hermes.config_path.parent / "hermes.log"
                tail = log.read_text(errors="replace")[-400:] if log.exists() else ""
                self.restarts.append(f"exit {process.returncode} at {time.time():.0f}: {tail}")
                self.hermes.start(sleep_time_s=1)

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        self.hermes.stop()


def real_stack(stack: ExitStack) -> tuple[RucioAdmin, Broker, Supervised]:
    """A broker, a Rucio server and its ``rucio-hermes`` (``--sleep-time 1``, restarted if it
    exits), stopped when ``stack`` closes."""
    broker = stack.enter_context(running_broker())
    server = make_server()
    stack.callback(shutil.rmtree, server.dir, True)
    stack.callback(server.stop)
    server.execute_sql("PRAGMA journal_mode=WAL")  # hermes beside the API (events.py)
    hermes = Hermes(server, broker)
    hermes.start(sleep_time_s=1)
    supervised = Supervised(hermes)
    stack.callback(supervised.close)
    return RucioAdmin(server), broker, supervised


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    sides: list[tuple[str, Path | None]] = [("new", args.new_code)]
    if args.code is not None:
        sides.insert(0, ("old", args.code))
    record: dict[str, Any] = {"machine_before": machine(), "args": vars(args) | {"json": None},
                              "started_utc": datetime.now(UTC).isoformat()}  # fmt: skip
    with ExitStack() as stack:
        admin, broker, hermes = real_stack(stack)
        tokens = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        print("taking the HTCondor test pool (waits for its lock)", flush=True)
        pool = stack.enter_context(running_pool(tokens))
        record["pool_taken_utc"] = datetime.now(UTC).isoformat()
        record["sides"] = []
        for label, code in sides:
            try:
                record["sides"].append(side(label, code, admin, broker, pool, args))
            except Exception as exc:  # the other side's figures are still written
                record["sides"].append({"side": label, "error": repr(exc)[:2000]})
            record["hermes_restarts"] = hermes.restarts
            write(record, args.json)
    record["machine_after"] = machine()
    record["finished_utc"] = datetime.now(UTC).isoformat()
    record["missed"] = [line for s in record["sides"] for line in missed(s["side"], s)]
    record["missed"] += [
        f"{s['side']}: failed: {s['error']}" for s in record["sides"] if "error" in s
    ]
    print(json.dumps(record, indent=1, default=str)[:8000])
    write(record, args.json)
    for line in record["missed"]:
        print(f"TARGET MISSED: {line}")
    return 1 if record["missed"] else 0


if __name__ == "__main__":
    sys.exit(main())
