"""Issue 23's measurements of the event stream on the real stack: a Rucio 41.5.1 server with its
own ``rucio-hermes`` (``--sleep-time 1``), ActiveMQ, ``hydrator run`` with ``[sources.events]``
(``interval_s`` = 600 s: only the stream explains a change seen within seconds) and the test
pool. Change-to-ad latency, catalogue load, a chaos run and idle CPU: benchmarks/EVENTS.md says
how each is taken and what it found.

    .venv/bin/python -m benchmarks events --changes 100 --json benchmarks/events_results.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, closing, contextmanager, suppress
from pathlib import Path
from typing import Any

import requests
from rucio.common.exception import RucioException
from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_incrementing

from benchmarks.conditions import machine
from tests.support.activemq import Broker, running_broker
from tests.support.hermes import EventDaemon, Hermes, running_event_daemon, transfer_done
from tests.support.pool import SLOT_SITES, Pool, running_pool
from tests.support.rucio_server import RucioAdmin, make_server, unique
from tests.support.static_inventory import invalidate_site_ads
from tests.support.wait import wait_for

REPLICA_ANSWER_BYTES = 480  # a full read's answers per replica at 1M (benchmarks/RESULTS.md)
SCALE_REPLICAS = 1_000_000
CHURN_PER_HOUR = 0.001
POLL_S = 0.05
IGNORED = (requests.RequestException,)  # the daemon is restarting


# A catalogue call is tried again (5 times at most) when the test server's SQLite database was
# busy: hermes writes beside the API, a harness limit, not Rucio's.
retried = Retrying(
    retry=retry_if_exception_type(RucioException),
    stop=stop_after_attempt(5),
    wait=wait_incrementing(start=0.2, increment=0.2),
    reraise=True,
)


def seconds_until(predicate: Callable[[], bool], timeout_s: float) -> float | None:
    """Seconds until ``predicate()`` held (polled every POLL_S), None after ``timeout_s``."""
    started = time.monotonic()
    try:
        wait_for("a change", predicate, timeout_s=timeout_s, ignore=IGNORED, interval_s=POLL_S)
    except AssertionError:
        return None
    return time.monotonic() - started


def available(daemon: EventDaemon) -> set[str]:
    return set(daemon.get(f"/v1/sites/{daemon.site}")["available"])


def summary(prefix: str, values: list[float]) -> dict[str, float]:
    """``<prefix>_p50_s``, ``<prefix>_p99_s`` (nearest rank) and ``<prefix>_max_s``."""
    ordered = sorted(values)

    def at(share: float) -> float:
        return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]

    return {f"{prefix}_p50_s": at(0.5), f"{prefix}_p99_s": at(0.99), f"{prefix}_max_s": at(1)}


def slot_available(pool: Pool, slot: str = "slot1") -> set[str]:
    """The datasets in ``slot``'s ``AvailableDatasets`` as the collector has them now."""
    ads = [ad for ad in pool.slot_ads(["AvailableDatasets"]) if ad["Name"].startswith(slot + "@")]
    value = ads[0].get("AvailableDatasets") if ads else None
    return {str(d) for d in value} if value is not None else set()


def latency(
    admin: RucioAdmin, daemon: EventDaemon, changes: int, pool: Pool | None
) -> dict[str, Any]:
    """One change at a time, timed from the catalogue change to the HTTP ad and (with a
    pool) to slot1's ad in the collector, both polled every POLL_S."""
    http: list[float] = []
    slots: list[float] = []
    missed = 0
    for i in range(changes):
        name = retried(admin.dataset, daemon.scope, 2, at=[daemon.src])
        retried(admin.rule, daemon.scope, name, daemon.dst, notify="Y")
        files = retried(admin.files, daemon.scope, name)
        did = f"{daemon.scope}:{name}"
        t0 = time.monotonic()
        retried(admin.set_file_states, daemon.dst, daemon.scope, files, "A")
        seen: dict[str, float] = {}

        def both(did: str = did, seen: dict[str, float] = seen, t0: float = t0) -> bool:
            if "http" not in seen and did in available(daemon):
                seen["http"] = time.monotonic() - t0
            if pool is not None and "slot" not in seen and did in slot_available(pool):
                seen["slot"] = time.monotonic() - t0
            return "http" in seen and (pool is None or "slot" in seen)

        if seconds_until(both, 60) is None:
            missed += 1
        http += [seen["http"]] if "http" in seen else []
        slots += [seen["slot"]] if "slot" in seen else []
        if (i + 1) % 10 == 0 and http:
            print(f"  {i + 1}/{changes} changes, HTTP p50 so far {statistics.median(http):.2f} s")
    results: dict[str, Any] = {"changes": changes, "missed": missed}
    results |= summary("http_latency", http) | {"http_latencies_s": http}
    if slots:
        results |= summary("latency", slots) | {"latencies_s": slots}
        results["latency_path"] = "catalogue change to slot1's AvailableDatasets in the collector"
    return results


def load(admin: RucioAdmin, daemon: EventDaemon, changes: int) -> dict[str, Any]:
    """Bytes per hour at SCALE_REPLICAS: polling every 60 s vs events + a 30 min reconcile."""
    name = retried(admin.dataset, daemon.scope, 2, at=[daemon.dst])
    url = f"{admin.server.url}/replicas/{daemon.scope}/{name}/datasets"
    token = admin.client.auth_token
    answer = requests.get(
        url, params={"deep": "True"}, headers={"X-Rucio-Auth-Token": token}, timeout=10
    )
    answer.raise_for_status()
    read_bytes = len(answer.content) + 400  # the answer and about 400 bytes of headers
    reads = daemon.value('hydrator_event_reads_total{source="rucio"}')
    reads_per_change = reads / changes if changes else 1.0
    full_read = SCALE_REPLICAS * REPLICA_ANSWER_BYTES
    polling = 60 * full_read
    events = 2 * full_read + SCALE_REPLICAS * CHURN_PER_HOUR * reads_per_change * read_bytes
    return {
        "targeted_read_bytes": read_bytes,
        "event_reads_per_change": reads_per_change,
        "full_read_bytes_at_1m": full_read,
        "bytes_per_hour_polling_60s": polling,
        "bytes_per_hour_events": events,
        "bytes_ratio": polling / events,
    }


def idle_cpu(daemon: EventDaemon, seconds: float = 30.0) -> float:
    """The daemon's CPU share (of one core) over ``seconds`` with nothing to do."""
    assert daemon.proc is not None
    pid = daemon.proc.pid  # setpriv execs the daemon: the same process
    ticks = os.sysconf("SC_CLK_TCK")

    def cpu() -> float:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / ticks

    before, t0 = cpu(), time.monotonic()
    time.sleep(seconds)
    return (cpu() - before) / (time.monotonic() - t0)


@contextmanager
def watching(daemon: EventDaemon, forged: set[str]) -> Iterator[list[str]]:
    """Polls the site while the block runs; yields the forged datasets ever published."""
    seen: list[str] = []
    done = threading.Event()

    def poll() -> None:
        while not done.is_set():
            with suppress(requests.RequestException):  # the daemon is restarting
                seen.extend(forged & available(daemon))
            done.wait(0.2)

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        done.set()
        thread.join()


def queued_messages(admin: RucioAdmin) -> int:
    """Rows in the server's ``messages`` table (what hermes has not sent yet)."""
    with closing(sqlite3.connect(admin.server.dir / "rucio.db", timeout=30)) as db:
        (count,) = db.execute("SELECT count(*) FROM messages").fetchone()
    return int(count)


def hermes_away(
    admin: RucioAdmin, daemon: EventDaemon, hermes: Hermes, count: int, away_s: float = 20.0
) -> dict[str, Any]:
    """Hermes stopped for ``away_s`` while ``count`` rules go OK: their ``datasetlock_ok`` and
    ``rule_ok`` wait in the server's ``messages`` table; hermes restarts and sends them. Returns
    what was queued and how many reached the HTTP ad by an event cycle (no full read is due:
    interval_s is 600) within 60 s of the restart."""
    hermes.stop()
    stopped = time.monotonic()
    made = {retried(daemon.lock_ok, admin) for _ in range(count)}  # a retry: a new dataset
    time.sleep(max(0.0, away_s - (time.monotonic() - stopped)))
    queued = queued_messages(admin)
    early = made & available(daemon)  # none: nothing told the daemon yet
    full_reads = daemon.value('hydrator_source_fetch_duration_seconds_count{source="rucio"}')
    restarted = time.monotonic()
    hermes.start(sleep_time_s=1)
    took = seconds_until(lambda: made <= available(daemon), 60)
    after = daemon.value('hydrator_source_fetch_duration_seconds_count{source="rucio"}')
    return {
        "chaos_hermes_away_s": restarted - stopped,
        "chaos_hermes_away_changes": count,
        "chaos_hermes_queued_messages": queued,
        "chaos_hermes_published_while_away": len(early),
        "chaos_hermes_delivered": len(made & available(daemon)),
        "chaos_hermes_delivery_s": took,
        "chaos_hermes_full_reads_meanwhile": after - full_reads,
    }


def chaos(
    admin: RucioAdmin,
    daemon: EventDaemon,
    broker: Broker,
    hermes: Hermes,
    count: int,
    rng: random.Random,
) -> dict[str, Any]:
    away = hermes_away(admin, daemon, hermes, max(1, count // 5))
    real = [retried(admin.dataset, daemon.scope, 1, at=[daemon.dst]) for _ in range(count)]
    for name in real:
        retried(admin.rule, daemon.scope, name, daemon.dst)  # complete, no message of its own
    forged_names = [
        retried(admin.dataset, daemon.scope, 1, at=[daemon.src]) for _ in range(count // 5)
    ]
    forged = {f"{daemon.scope}:{n}" for n in forged_names}
    messages = [transfer_done(daemon.scope, n, daemon.dst) for n in real if rng.random() >= 0.10]
    dropped = count - len(messages)
    messages += [transfer_done(daemon.scope, n, daemon.dst) for n in real if rng.random() < 0.20]
    messages += [transfer_done(daemon.scope, n, daemon.dst) for n in forged_names]
    rng.shuffle(messages)
    half = len(messages) // 2
    with watching(daemon, forged) as published_forged:
        broker.publish_as_hermes(messages[: half // 2])
        broker.restart()  # mid-run
        broker.publish_as_hermes(messages[half // 2 : half])
        daemon.stop()  # the rest queue on its durable subscription
        broker.publish_as_hermes(messages[half:])
        before = {f"{daemon.scope}:{n}" for n in real}
        daemon.start()  # start-up full read: the reconcile
        seconds_until(lambda: before <= available(daemon), 60)
        time.sleep(3)  # the queued messages' event cycles
        ours = {d for d in available(daemon) if d.startswith(f"{daemon.scope}:")}
    fresh = fresh_read(daemon)
    divergent = ours ^ fresh
    return away | {
        "chaos_datasets": count,
        "chaos_messages": len(messages),
        "chaos_dropped": dropped,
        "chaos_forged": len(forged),
        "divergent_pairs": len(divergent),
        "confirmed_by_read": not published_forged,
    }


def fresh_read(daemon: EventDaemon) -> set[str]:
    """The site's available datasets by a full read on an empty state (``hydrator once``)."""
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "fresh.toml"
        text = daemon.config.read_text()
        text = text.replace(str(daemon.config.parent / "state.sqlite"), f"{tmp}/state.sqlite")
        config.write_text(text)
        out = subprocess.run(
            [sys.executable, "-m", "hydrator", "once", "--json", "--config", str(config)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    sites = json.loads(out)["sites"]
    return {d for d in sites.get(daemon.site, {}).get("available", [])}


def measure_latency(
    admin: RucioAdmin, broker: Broker, work: Path, changes: int, with_pool: bool
) -> dict[str, Any]:
    """Latency and load with a daemon of its own; with the pool (taken through its lock for
    this phase only, slot1's site) its collector merges are timed too, and invalidated after."""
    with ExitStack() as stack:
        pool: Pool | None = None
        extra, site = "", f"SITE-BENCH-{unique('b')}"
        if with_pool:
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
        daemon.wait_subscribed()
        results = latency(admin, daemon, changes, pool)
        results.update(load(admin, daemon, changes))
        return results


def plot(results: dict[str, Any], path: Path) -> None:
    """The latencies' distribution (cumulative, p50 and p99 dashed) as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    curves = (("latency", "collector slot ad"), ("http_latency", "HTTP ad"))
    for prefix, label in (c for c in curves if f"{c[0]}_p50_s" in results):
        p50, p99 = results[f"{prefix}_p50_s"], results[f"{prefix}_p99_s"]
        lags = results["latencies_s" if prefix == "latency" else "http_latencies_s"]
        ax.ecdf(lags, label=f"{label}: p50 {p50:.2f} s, p99 {p99:.2f} s")
        for at in (p50, p99):
            ax.axvline(at, linestyle="--", color="grey", linewidth=0.8)
    ax.legend(loc="lower right", fontsize=7)
    ax.set_xlabel("catalogue change to the ad (s)")
    ax.set_ylabel("share of changes")
    cpu = results["machine_before"]["cpu"]
    ax.set_title(
        f"{results['changes']} changes, Rucio + hermes + ActiveMQ + hydrator ({cpu})", fontsize=8
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--changes", type=int, default=100)
    parser.add_argument("--chaos", type=int, default=50, help="datasets in the chaos run")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--plot", type=Path, default=None, help="a PNG of the latencies")
    parser.add_argument("--seed", type=int, default=23)
    parser.add_argument(
        "--no-pool", action="store_true", help="latency to the HTTP ad only (no collector)"
    )
    args = parser.parse_args(argv)
    results: dict[str, Any] = {"machine_before": machine(), "started": time.time()}
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
        print(f"latency over {args.changes} changes")
        results.update(measure_latency(admin, broker, work, args.changes, not args.no_pool))
        (work / "chaos").mkdir()
        site = f"SITE-BENCH-{unique('b')}"
        daemon = stack.enter_context(
            running_event_daemon(admin, broker, work / "chaos", site, debounce_s=1.0)
        )
        daemon.wait_subscribed()
        print("idle CPU over 30 s")
        results["idle_cpu_share"] = idle_cpu(daemon)
        print(f"chaos over {args.chaos} datasets")
        results.update(chaos(admin, daemon, broker, hermes, args.chaos, random.Random(args.seed)))
    results["machine_after"] = machine()
    shown = {k: v for k, v in results.items() if not k.endswith("latencies_s")}
    print(json.dumps(shown, indent=2))
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    if args.plot is not None:
        plot(results, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
