"""Issue 23's measurements of the event stream on the real stack: a Rucio 41.5.1 server with its
own ``rucio-hermes`` daemon (``--sleep-time 1``), Debian's ActiveMQ, and ``hydrator run`` with
``[sources.events]`` (default ``event_debounce_s`` = 1 s, ``interval_s`` = 600 s, so only the
stream explains a change seen within seconds).

    .venv/bin/python -m benchmarks.events --changes 100 --json benchmarks/events_results.json

* **Latency**: ``--changes`` times, a dataset whose rule has ``notify = "Y"`` gets its files
  AVAILABLE through the public API (the conveyor's part: the server queues ``datasetlock_ok``
  and ``rule_ok``); timed from just before that call to the dataset in the daemon's
  ``/v1/sites/<site>`` (polled every 50 ms). The collector path is measured by
  ``tests/events/test_events_pool.py`` (the pool is shared); here ``latency_*`` is the HTTP ad.
* **Catalogue load**: bytes a targeted read costs (the exact listing ``read_datasets`` makes,
  measured here) and event reads per change (``hydrator_event_reads_total``), against a full
  read at 1M replicas (480 bytes a replica of answers, benchmarks/RESULTS.md), at 0.1 %
  churn an hour: polling every 60 s vs events with a full read every 30 min.
* **Chaos**: datasets completed at the site with no message of the server's own; the benchmark
  publishes ``transfer-done`` for them in hermes' format with 10 % dropped, 20 % duplicated,
  all shuffled, plus forged ones naming datasets that are not there, restarts the broker
  half way, and stops the daemon while the rest queue on its durable subscription. After the
  restart (its start-up full read is the reconcile) the published site is compared with a
  fresh full read (``hydrator once --json`` on an empty state): ``divergent_pairs``.
  ``confirmed_by_read``: no forged dataset was ever published (polled throughout).
* **Idle CPU** of the daemon over 30 s with no change.

The machine is shared with other engineers this session: figures carry the CPU and load.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import requests
from rucio.common.exception import RucioException

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.activemq import Broker, running_broker  # noqa: E402
from tests.support.hermes import EventDaemon, Hermes, running_event_daemon  # noqa: E402
from tests.support.rucio_server import RucioAdmin, make_server, unique  # noqa: E402

REPLICA_ANSWER_BYTES = 480  # a full read's answers per replica at 1M (benchmarks/RESULTS.md)
SCALE_REPLICAS = 1_000_000
CHURN_PER_HOUR = 0.001
POLL_S = 0.05
T = TypeVar("T")


def machine() -> dict[str, Any]:
    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        "unknown",
    )
    return {
        "cpu_model": model,
        "nproc": os.cpu_count(),
        "load_average": os.getloadavg(),
        "python": platform.python_version(),
        "note": "a machine shared with other engineers during the run",
    }


def wait(predicate: Callable[[], bool], timeout_s: float) -> float | None:
    """Seconds until ``predicate()`` held (polled every POLL_S), None after ``timeout_s``."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        try:
            if predicate():
                return time.monotonic() - started
        except requests.RequestException:
            pass
        time.sleep(POLL_S)
    return None


def retried(call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``call(*args, **kwargs)``, tried again (5 times at most) when the test server's SQLite
    database was busy (hermes writes beside the API: a harness limit, not Rucio's)."""
    for attempt in range(5):
        try:
            return call(*args, **kwargs)
        except RucioException:
            if attempt == 4:
                raise
            time.sleep(0.2 * (attempt + 1))
    raise AssertionError("unreachable")


def available(daemon: EventDaemon) -> set[str]:
    return set(daemon.get(f"/v1/sites/{daemon.site}")["available"])


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def latency(admin: RucioAdmin, daemon: EventDaemon, changes: int) -> dict[str, Any]:
    """One change at a time, timed from the catalogue change to the HTTP ad."""
    lags: list[float] = []
    missed = 0
    for i in range(changes):
        name = retried(admin.dataset, daemon.scope, 2, at=[daemon.src])
        retried(admin.rule, daemon.scope, name, daemon.dst, notify="Y")
        files = retried(admin.files, daemon.scope, name)
        did = f"{daemon.scope}:{name}"
        t0 = time.monotonic()
        retried(admin.set_file_states, daemon.dst, daemon.scope, files, "A")

        def seen(did: str = did) -> bool:
            return did in available(daemon)

        if wait(seen, 60) is None:
            missed += 1
        else:
            lags.append(time.monotonic() - t0)
        if (i + 1) % 10 == 0:
            print(f"  {i + 1}/{changes} changes, p50 so far {statistics.median(lags):.2f} s")
    return {
        "changes": changes,
        "missed": missed,
        "latency_p50_s": percentile(lags, 0.5),
        "latency_p99_s": percentile(lags, 0.99),
        "latency_max_s": max(lags),
        "http_latency_p50_s": percentile(lags, 0.5),
        "http_latency_p99_s": percentile(lags, 0.99),
        "latencies_s": lags,
    }


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


def transfer_done(daemon: EventDaemon, name: str) -> dict[str, Any]:
    """A ``transfer-done`` as hermes sends it (the fields the hydrator reads, abridged)."""
    return {
        "event_type": "transfer-done",
        "payload": {
            "scope": daemon.scope,
            "name": f"{name}.f000",
            "dataset": name,
            "datasetScope": daemon.scope,
            "dst-rse": daemon.dst,
            "tool-id": "rucio-conveyor",
        },
        "created_at": datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S.%f"),
    }


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


def chaos(
    admin: RucioAdmin, daemon: EventDaemon, broker: Broker, count: int, rng: random.Random
) -> dict[str, Any]:
    real = [retried(admin.dataset, daemon.scope, 1, at=[daemon.dst]) for _ in range(count)]
    for name in real:
        retried(admin.rule, daemon.scope, name, daemon.dst)  # complete, no message of its own
    forged_names = [
        retried(admin.dataset, daemon.scope, 1, at=[daemon.src]) for _ in range(count // 5)
    ]
    forged = {f"{daemon.scope}:{n}" for n in forged_names}
    messages = [transfer_done(daemon, n) for n in real if rng.random() >= 0.10]
    dropped = count - len(messages)
    messages += [transfer_done(daemon, n) for n in real if rng.random() < 0.20]
    messages += [transfer_done(daemon, n) for n in forged_names]
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
        wait(lambda: before <= available(daemon), 60)
        time.sleep(3)  # the queued messages' event cycles
        ours = {d for d in available(daemon) if d.startswith(f"{daemon.scope}:")}
    fresh = fresh_read(daemon)
    divergent = ours ^ fresh
    return {
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


def plot(results: dict[str, Any], path: Path) -> None:
    """The latencies' distribution (sorted, with p50 and p99) as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lags = sorted(results["latencies_s"])
    shares = [(i + 1) / len(lags) for i in range(len(lags))]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(lags, shares, drawstyle="steps-post")
    for key, label in (("latency_p50_s", "p50"), ("latency_p99_s", "p99")):
        ax.axvline(results[key], linestyle="--", color="grey")
        ax.annotate(
            f" {label} {results[key]:.2f} s",
            (results[key], 0.5),
            xycoords=("data", "axes fraction"),
            rotation=90,
        )
    ax.set_xlabel("catalogue change to the HTTP ad (s)")
    ax.set_ylabel("share of changes")
    cpu = results["machine_before"]["cpu_model"]
    ax.set_title(f"{len(lags)} changes, Rucio + hermes + ActiveMQ + hydrator ({cpu})", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--changes", type=int, default=100)
    parser.add_argument("--chaos", type=int, default=50, help="datasets in the chaos run")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--plot", type=Path, default=None, help="a PNG of the latencies")
    parser.add_argument("--from-json", type=Path, default=None, help="only plot that result")
    parser.add_argument("--seed", type=int, default=23)
    args = parser.parse_args(argv)
    if args.from_json is not None:
        if args.plot is not None:
            plot(json.loads(args.from_json.read_text()), args.plot)
        return 0
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
        site = f"SITE-BENCH-{unique('b')}"
        daemon = stack.enter_context(
            running_event_daemon(admin, broker, work, site, debounce_s=1.0)
        )
        wait(lambda: daemon.metric('hydrator_events_listener_connected{source="rucio"} 1.0'), 30)
        print(f"latency over {args.changes} changes")
        results.update(latency(admin, daemon, args.changes))
        results.update(load(admin, daemon, args.changes))
        print("idle CPU over 30 s")
        results["idle_cpu_share"] = idle_cpu(daemon)
        print(f"chaos over {args.chaos} datasets")
        results.update(chaos(admin, daemon, broker, args.chaos, random.Random(args.seed)))
    results["machine_after"] = machine()
    shown = {k: v for k, v in results.items() if k != "latencies_s"}
    print(json.dumps(shown, indent=2))
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    if args.plot is not None:
        plot(results, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
