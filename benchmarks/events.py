"""The event path's evidence on the real stack: a Rucio 41.5.1 server with its own
``rucio-hermes`` (``--sleep-time 1``), ActiveMQ, ``hydrator run`` with ``[sources.events]``
(``interval_s`` = 600 s: only the stream explains a change seen within seconds) and, unless
``--no-pool``, the test pool. Additions and deletions timed to the HTTP ad (and slot1's ad in the
collector), a chaos run checked against Rucio itself (:mod:`benchmarks.events_chaos`) and idle
CPU; exits 1 when a target is missed. benchmarks/EVENTS.md says how each is taken.

    .venv/bin/python -m benchmarks events --changes 100 --json benchmarks/results/events.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack, suppress
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import requests
from rucio.common.exception import RucioException
from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_incrementing

from benchmarks import events_chaos
from benchmarks.conditions import machine
from tests.support.activemq import Broker, running_broker
from tests.support.hermes import EventDaemon, Hermes, running_event_daemon
from tests.support.pool import SLOT_SITES, Pool, running_pool
from tests.support.rucio_server import RucioAdmin, make_server, unique
from tests.support.static_inventory import invalidate_site_ads
from tests.support.wait import wait_for

POLL_S = 0.05
IGNORED = (requests.RequestException,)  # the daemon is restarting
ADDITION_P99_S, DELETION_P99_S = 5.0, 15.0  # targets, p99 (the collector slot ad)


# A catalogue call is tried again (5 times at most) when the test server's SQLite database was
# busy: hermes writes beside the API, a harness limit, not Rucio's.
retried = Retrying(
    retry=retry_if_exception_type(RucioException),
    stop=stop_after_attempt(5),
    wait=wait_incrementing(start=0.2, increment=0.2),
    reraise=True,
)


def summary(values: list[float | None], timeout_s: float) -> dict[str, Any]:
    """p50, p99 (nearest rank) and max over every change, a miss (None) counted as
    ``timeout_s``; ``misses`` and the values seen."""
    ordered = sorted(timeout_s if v is None else v for v in values)

    def at(share: float) -> float:
        return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]

    misses = sum(v is None for v in values)
    return {"n": len(values), "misses": misses, "p50_s": at(0.5), "p99_s": at(0.99),
            "max_s": at(1), "seconds": values}  # fmt: skip


def slot_available(pool: Pool, slot: str = "slot1") -> set[str]:
    """The datasets in ``slot``'s ``AvailableDatasets`` as the collector has them now."""
    ads = [ad for ad in pool.slot_ads(["AvailableDatasets"]) if ad["Name"].startswith(slot + "@")]
    value = ads[0].get("AvailableDatasets") if ads else None
    return {str(d) for d in value} if value is not None else set()


def timed(
    done_http: Callable[[], bool], done_slot: Callable[[], bool] | None, timeout_s: float
) -> tuple[float | None, float | None]:
    """Seconds from now until ``done_http()`` and ``done_slot()`` held (polled every POLL_S),
    None for one not seen within ``timeout_s``."""
    t0, seen = time.monotonic(), {}

    def both() -> bool:
        for key, probe in (("http", done_http), ("slot", done_slot)):
            if probe is not None and key not in seen and probe():
                seen[key] = time.monotonic() - t0
        return len(seen) == (2 if done_slot else 1)

    with suppress(AssertionError):  # a miss: None below
        wait_for("a change", both, timeout_s=timeout_s, ignore=IGNORED, interval_s=POLL_S)
    return seen.get("http"), seen.get("slot")


def addition(admin: RucioAdmin, daemon: EventDaemon, pool: Pool | None, timeout_s: float) -> Any:
    """A dataset of two files at the source gets a ``notify="Y"`` rule to the site (untimed);
    its files made AVAILABLE there (the conveyor's part) start the clock. Returns the name,
    the rule and the seconds to the HTTP ad and to slot1's ad."""
    name = retried(admin.dataset, daemon.scope, 2, at=[daemon.src])
    rule = retried(admin.rule, daemon.scope, name, daemon.dst, notify="Y")
    files = retried(admin.files, daemon.scope, name)
    did = f"{daemon.scope}:{name}"
    retried(admin.set_file_states, daemon.dst, daemon.scope, files, "A")
    http, slot = timed(
        lambda: did in events_chaos.lists(daemon)["available"],
        (lambda: did in slot_available(pool)) if pool else None,
        timeout_s,
    )
    return name, rule, files, http, slot


def deletion(
    admin: RucioAdmin,
    daemon: EventDaemon,
    broker: Broker,
    pool: Pool | None,
    made: Any,
    timeout_s: float,
) -> tuple[float | None, float | None]:
    """The rule of an addition deleted for real: lifetime 0, ``rucio-judge-cleaner`` (rule
    and locks go), ``rucio-reaper`` (the replicas at the site go: the clock starts). The test
    server has no storage, so its reaper queues ``deletion-not-found`` (hermes sends it); the
    ``deletion-done`` real storage gives is published in hermes' format. Abacus runs inside
    the window. Timed until the dataset is in none of the site's lists."""
    name, rule, files, _, _ = made
    did = f"{daemon.scope}:{name}"
    retried(admin.client.update_replication_rule, rule, {"lifetime": 0})
    admin.server.run_daemon("rucio-judge-cleaner")
    admin.server.run_daemon("rucio-reaper", "--greedy", "--rses", daemon.dst)
    t0 = time.monotonic()
    created = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")
    payload = {"scope": daemon.scope, "name": files[0], "rse": daemon.dst}
    broker.publish_as_hermes(
        [{"event_type": "deletion-done", "payload": payload, "created_at": created}]
    )
    admin.server.run_abacus()
    left = time.monotonic() - t0
    http, slot = timed(
        lambda: did not in events_chaos.ours(daemon, events_chaos.lists(daemon)),
        (lambda: did not in slot_available(pool)) if pool else None,
        max(0.0, timeout_s - left),
    )
    return tuple(None if v is None else v + left for v in (http, slot))  # type: ignore[return-value]


def latency(
    admin: RucioAdmin,
    daemon: EventDaemon,
    broker: Broker,
    changes: int,
    pool: Pool | None,
    timeout_s: float,
) -> dict[str, Any]:
    """``changes`` additions, each followed by its deletion, one at a time."""
    found: dict[str, list[float | None]] = {k: [] for k in ("add_http", "add_slot", "del_http",
                                                             "del_slot")}  # fmt: skip
    full_reads = {"add": 0.0, "del": 0.0}  # during the changes: the stream did not do those

    def reads() -> float:
        return events_chaos.counters(daemon)["full_reads"]

    for i in range(changes):
        start = reads()
        made = addition(admin, daemon, pool, timeout_s)
        middle = reads()
        gone = deletion(admin, daemon, broker, pool, made, timeout_s)
        full_reads["add"] += middle - start
        full_reads["del"] += reads() - middle
        for key, value in zip(found, (*made[3:], *gone), strict=True):
            found[key].append(value)
        if (i + 1) % 10 == 0:
            seen = [v for v in found["add_http"] if v is not None]
            print(
                f"  {i + 1}/{changes}, additions to HTTP p50 {statistics.median(seen or [0]):.2f} s"
            )
    paths = {"add_http": "addition to the HTTP ad", "add_slot": "addition to slot1's collector ad",
             "del_http": "deletion out of every list of the HTTP ad",
             "del_slot": "deletion out of slot1's collector ad"}  # fmt: skip
    return {
        k: summary(v, timeout_s) | {"path": paths[k]}
        for k, v in found.items()
        if pool is not None or "slot" not in k
    } | {"timeout_s": timeout_s, "full_reads_during": full_reads,
         "counters": events_chaos.counters(daemon),
         "received_by_type": by_type(daemon)}  # fmt: skip


def by_type(daemon: EventDaemon) -> dict[str, float]:
    """The daemon's ``hydrator_events_received_total`` by event type."""
    return {
        dict(labels)["type"]: value
        for (name, labels), value in daemon.process.metrics().items()
        if name == "hydrator_events_received_total"
    }


def tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of ``pid`` and every process descended from it."""
    stats = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            stats[int(entry.name)] = (int(fields[1]), int(fields[11]) + int(fields[12]))
    family, total = {pid}, 0
    for _ in range(5):  # a few generations: the daemon, its HTTP child and theirs
        family |= {p for p, (parent, _) in stats.items() if parent in family}
    total = sum(stats[p][1] for p in family if p in stats)
    return total / os.sysconf("SC_CLK_TCK")


def idle_cpu(daemon: EventDaemon, seconds: float = 30.0) -> dict[str, float]:
    """The CPU share (of one core) of the daemon and every child over ``seconds`` with nothing
    to do."""
    assert daemon.proc is not None
    before, t0 = tree_cpu_s(daemon.proc.pid), time.monotonic()
    time.sleep(seconds)
    return {"seconds": seconds,
            "share": (tree_cpu_s(daemon.proc.pid) - before) / (time.monotonic() - t0)}  # fmt: skip


def missed(results: dict[str, Any]) -> list[str]:
    """Every target missed (one line each)."""
    out = events_chaos.missed(results["chaos"]) if "chaos" in results else []
    for key, limit in (("add", ADDITION_P99_S), ("del", DELETION_P99_S)):
        for ad in ("http", "slot"):
            got = results.get("latency", {}).get(f"{key}_{ad}")
            if got and (got["misses"] or got["p99_s"] > limit):
                out.append(f"{got['path']}: p99 {got['p99_s']:.2f} s (target {limit} s), "
                           f"{got['misses']} missed of {got['n']}")  # fmt: skip
    return out


def commit() -> str:
    """The commit of the hydrator the daemon imports (its checkout, dirty or not)."""
    import hydrator

    where = Path(hydrator.__file__).parents[1]
    run = subprocess.run(["git", "-C", str(where), "describe", "--always", "--dirty"],
                         capture_output=True, text=True, check=False)  # fmt: skip
    return f"{where}: {run.stdout.strip()}"


def measure_latency(
    admin: RucioAdmin, broker: Broker, work: Path, args: argparse.Namespace
) -> dict[str, Any]:
    """Additions and deletions with a daemon of its own; with the pool (taken through its lock
    for this phase only, slot1's site) the collector merges are timed too, invalidated after."""
    with ExitStack() as stack:
        pool: Pool | None = None
        extra, site = "", f"SITE-BENCH-{unique('b')}"
        if not args.no_pool:
            tokens = Path(stack.enter_context(tempfile.TemporaryDirectory()))
            print("taking the HTCondor test pool (waits for its lock)")
            pool = stack.enter_context(running_pool(tokens))
            stack.callback(invalidate_site_ads, pool)  # our merges out
            site = SLOT_SITES["slot1"]
            extra = (
                f'\n[collector]\nenabled = true\npool = "{pool.collector_address}"\n'
                f'token_dir = "{pool.token_dir}"\nrefresh_s = 600\nmerge_min_interval_s = 0\n'
            )
        (work / "latency").mkdir()
        daemon = stack.enter_context(
            running_event_daemon(admin, broker, work / "latency", site, extra, debounce_s=1.0)
        )
        if args.listener_defaults:
            defaults(daemon)
        daemon.wait_subscribed()
        return latency(admin, daemon, broker, args.changes, pool, args.timeout)


def defaults(daemon: EventDaemon) -> None:
    """Restart the daemon with the listener's shipped defaults (heart-beats, reconnect delays)
    instead of the test suite's short ones."""
    daemon.stop()
    keys = ("heartbeat_s", "reconnect_initial_s", "reconnect_max_s")
    text = daemon.config.read_text().splitlines()
    daemon.config.write_text("\n".join(ln for ln in text if not ln.startswith(keys)) + "\n")
    daemon.start()
    daemon.wait_subscribed()


def plot(results: dict[str, Any], path: Path) -> None:
    """Each kind's latencies (cumulative; misses at the timeout) as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    timeout = results["latency"]["timeout_s"]
    for got in results["latency"].values():
        if isinstance(got, dict) and "seconds" in got:
            lags = [timeout if v is None else v for v in got["seconds"]]
            label = f"{got['path']}: p50 {got['p50_s']:.2f} s, p99 {got['p99_s']:.2f} s"
            ax.ecdf(lags, label=label + (f", {got['misses']} missed" if got["misses"] else ""))
    ax.legend(loc="lower right", fontsize=6)
    ax.set_xlabel("catalogue change to the ad (s); a miss at the timeout")
    ax.set_ylabel("share of changes")
    ax.set_title(f"Rucio + hermes + ActiveMQ + hydrator ({results['machine_before']['cpu']})",
                 fontsize=8)  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--changes", type=int, default=100, help="additions, each then deleted")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds before a miss")
    parser.add_argument("--chaos", type=int, default=50, help="datasets in the chaos run")
    parser.add_argument("--no-restart", action="store_true", help="chaos without the restart")
    parser.add_argument("--idle-s", type=float, default=30.0, help="idle CPU window")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--plot", type=Path, default=None, help="a PNG of the latencies")
    parser.add_argument("--seed", type=int, default=23)
    parser.add_argument("--no-pool", action="store_true", help="HTTP ad only (no collector)")
    parser.add_argument(
        "--listener-defaults", action="store_true",
        help="the latency daemon with the shipped heart-beats (else the test suite's 2 s)",
    )  # fmt: skip
    parser.add_argument(
        "--expect-forged", action="store_true",
        help="count one forged dataset as Rucio's (the smoke test: the check must fail)",
    )  # fmt: skip
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    results: dict[str, Any] = {"machine_before": machine(), "args": vars(args) | {"json": None,
        "plot": None}, "code": commit(), "started_utc": datetime.now(UTC).isoformat()}  # fmt: skip
    with ExitStack() as stack:
        broker = stack.enter_context(running_broker())
        server = make_server()
        stack.callback(shutil.rmtree, server.dir, True)
        stack.callback(server.stop)
        # hermes polls the messages table every second beside the API's writes: in SQLite's
        # default journal mode a writer waiting on a reader fails at once ("database is locked")
        server.execute_sql("PRAGMA journal_mode=WAL")
        admin = RucioAdmin(server)
        hermes = Hermes(server, broker)
        hermes.start(sleep_time_s=1)
        stack.callback(hermes.stop)
        work = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        if args.changes:
            print(f"{args.changes} additions and deletions")
            results["latency"] = measure_latency(admin, broker, work, args)
        (work / "chaos").mkdir()
        site = f"SITE-BENCH-{unique('b')}"
        daemon = stack.enter_context(
            running_event_daemon(admin, broker, work / "chaos", site, debounce_s=1.0)
        )
        defaults(daemon)
        if args.idle_s:
            print(f"idle CPU over {args.idle_s} s")
            results["idle_cpu"] = idle_cpu(daemon, args.idle_s)
        print(f"chaos over {args.chaos} datasets")
        rng = random.Random(args.seed)
        results["chaos"] = events_chaos.run(admin, daemon, broker, hermes, args.chaos, rng,
            restart=not args.no_restart, expect_forged=args.expect_forged)  # fmt: skip
        results["chaos"]["counters_at_end"] = events_chaos.counters(daemon)
    results["machine_after"] = machine()
    results["finished_utc"] = datetime.now(UTC).isoformat()
    results["missed"] = missed(results)
    print(json.dumps(results, indent=1, default=str)[:6000])
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    if args.plot is not None and "latency" in results:
        plot(results, args.plot)
    for line in results["missed"]:
        print(f"TARGET MISSED: {line}")
    return 1 if results["missed"] else 0


if __name__ == "__main__":
    sys.exit(main())
