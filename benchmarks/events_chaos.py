"""The event path under faults, checked against Rucio itself: the chaos part of the
``events`` scenario, importable alone for the smoke test.

Three phases on a running ``hydrator run`` with events on:

* ``hermes away``: the server's own ``rucio-hermes`` stopped while rules go OK; restarted, its
  backlog must reach the ad by event cycles, with no full read.
* ``stream faults`` (hermes stopped, only the scenario's messages flow): for complete
  datasets the server announced nothing of, ``transfer-done`` and ``datasetlock_ok`` in
  hermes' format, some dropped (never both of one dataset), some duplicated byte for byte,
  all shuffled, plus forged ones naming datasets held elsewhere or nowhere. No full read may
  run; the daemon's counters must show every message received, every duplicate recognised and
  every other message applied; the published lists must equal Rucio's own answer.
* ``broker restart``: datasets made complete while no message can announce them (lost), then
  the broker restarted: a full read after the reconnect is the right answer; it must run
  and publish them.

Truth is read from Rucio through rucio-clients (``list_datasets_per_rse`` and
``list_dataset_replicas(deep=True)``), never through the hydrator.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from datetime import UTC, datetime
from typing import Any

import requests

from tests.support.activemq import Broker
from tests.support.hermes import EventDaemon, Hermes, transfer_done
from tests.support.rucio_server import RucioAdmin, unique
from tests.support.wait import wait_for

IGNORED = (requests.RequestException,)  # the daemon or the broker is restarting
FULL_READS = "hydrator_source_fetch_duration_seconds_count"


def counters(daemon: EventDaemon) -> dict[str, float]:
    """The daemon's own event counters of source ``rucio`` (summed over types) and its full
    reads, from ``GET /metrics``."""
    sums = {"received": 0.0, "applied": 0.0, "duplicates": 0.0, "ignored": 0.0}
    names = {
        "hydrator_events_received_total": "received",
        "hydrator_events_applied_total": "applied",
        "hydrator_events_ignored_total": "ignored",
    }
    full_reads = connected = 0.0
    for (name, labels), value in daemon.process.metrics().items():
        tags = dict(labels)
        if tags.get("source") != "rucio":
            continue
        if name in names:
            sums[names[name]] += value
            if tags.get("reason") == "duplicate":
                sums["duplicates"] += value
        full_reads = value if name == FULL_READS else full_reads
        connected = value if name == "hydrator_events_listener_connected" else connected
    return sums | {"full_reads": full_reads, "connected": connected}


def lists(daemon: EventDaemon) -> dict[str, set[str]]:
    """Every dataset list of the site in ``/v1/sites/<site>``, by name."""
    site = daemon.get(f"/v1/sites/{daemon.site}")
    kinds = ("available", "partial", "replicating", "stuck", "incoming")
    return {k: {e if isinstance(e, str) else e["dataset"] for e in site.get(k, [])} for k in kinds}


def rucio_truth(admin: RucioAdmin, daemon: EventDaemon, names: set[str]) -> set[str]:
    """The datasets of the daemon's scope complete at its site's RSE, as Rucio answers:
    candidates from ``list_datasets_per_rse`` plus ``names``, each confirmed by
    ``list_dataset_replicas(deep=True)`` (exact, from the file replicas)."""
    client, scope = admin.client, daemon.scope
    listed = {r["name"] for r in client.list_datasets_per_rse(daemon.dst) if r["scope"] == scope}
    complete = set()
    for name in listed | names:
        with suppress(Exception):  # a forged name Rucio does not know: held nowhere
            rows = client.list_dataset_replicas(scope, name, deep=True)
            if any(r["rse"] == daemon.dst and r["state"] == "AVAILABLE" for r in rows):
                complete.add(f"{scope}:{name}")
    return complete


def ours(daemon: EventDaemon, found: dict[str, set[str]]) -> set[str]:
    """Every dataset of the daemon's scope in any of the site's lists."""
    return {d for names in found.values() for d in names if d.startswith(daemon.scope + ":")}


def divergence(admin: RucioAdmin, daemon: EventDaemon, names: set[str]) -> dict[str, Any]:
    """Published vs Rucio: the datasets complete at the site that are not ``available``, and
    the datasets listed anywhere that Rucio does not hold complete there."""
    truth = rucio_truth(admin, daemon, names)
    found = lists(daemon)
    missing, extra = truth - found["available"], ours(daemon, found) - truth
    return {"truth": len(truth), "missing": sorted(missing), "extra": sorted(extra)}


@contextmanager
def watching(daemon: EventDaemon, forged: set[str]) -> Iterator[set[str]]:
    """Polls every list of the site every 0.2 s while the block runs; yields the forged
    datasets ever seen in one."""
    seen: set[str] = set()
    done = threading.Event()

    def poll() -> None:
        while not done.is_set():
            with suppress(*IGNORED):
                seen.update(forged & ours(daemon, lists(daemon)))
            done.wait(0.2)

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        done.set()
        thread.join()


def settled(probe: Callable[[], bool], timeout_s: float) -> float | None:
    """Seconds until ``probe()`` held (polled every 0.1 s), None after ``timeout_s``."""
    t0 = time.monotonic()
    try:
        wait_for("settled", probe, timeout_s=timeout_s, ignore=IGNORED, interval_s=0.1)
    except AssertionError:
        return None
    return time.monotonic() - t0


def quiet(daemon: EventDaemon, for_s: float = 3.0) -> dict[str, float]:
    """The counters once no message arrived for ``for_s`` seconds (60 s at most)."""
    last, since, t0 = counters(daemon), time.monotonic(), time.monotonic()
    while time.monotonic() - since < for_s and time.monotonic() - t0 < 60:
        time.sleep(0.5)
        now = counters(daemon)
        if now["received"] != last["received"]:
            last, since = now, time.monotonic()
    return last


def lock_ok(scope: str, name: str, rse: str) -> dict[str, Any]:
    """A ``datasetlock_ok`` as hermes sends it (the fields the hydrator reads)."""
    created = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")
    payload = {"scope": scope, "name": name, "rse": rse, "rule_id": unique("r")}
    return {"event_type": "datasetlock_ok", "payload": payload, "created_at": created}


def hermes_away(
    admin: RucioAdmin, daemon: EventDaemon, hermes: Hermes, count: int, away_s: float = 10.0
) -> dict[str, Any]:
    """Hermes stopped while ``count`` rules go OK (``notify="Y"``); restarted, its backlog must
    reach the HTTP ad within 60 s by event cycles alone."""
    hermes.stop()
    before = counters(daemon)
    made = {daemon.lock_ok(admin) for _ in range(count)}
    time.sleep(away_s)
    early = made & lists(daemon)["available"]
    hermes.start(sleep_time_s=1)
    took = settled(lambda: made <= lists(daemon)["available"], 60)
    after = counters(daemon)
    return {
        "changes": count,
        "published_while_away": len(early),
        "delivered": len(made & lists(daemon)["available"]),
        "delivery_s": took,
        "received": after["received"] - before["received"],
        "full_reads_meanwhile": after["full_reads"] - before["full_reads"],
    }


def faults(
    admin: RucioAdmin,
    daemon: EventDaemon,
    broker: Broker,
    count: int,
    rng: random.Random,
    expect_forged: bool = False,
) -> dict[str, Any]:
    """The stream-faults phase (hermes must be stopped: only these messages flow). With
    ``expect_forged``, one forged dataset is wrongly counted as Rucio's truth: the check must
    then fail (the smoke test's proof that it can)."""
    scope, dst = daemon.scope, daemon.dst
    real = admin.many_datasets(scope, count, dst)
    elsewhere = admin.many_datasets(scope, max(1, count // 5), daemon.src)
    nowhere = [unique("forged") for _ in range(max(1, count // 5))]
    forged = {f"{scope}:{n}" for n in elsewhere + nowhere}
    messages, dropped = [], 0
    for name in real:
        pair = [transfer_done(scope, name, dst), lock_ok(scope, name, dst)]
        if rng.random() < 0.2:  # one of the two lost: the other still names the dataset
            pair.pop(rng.randrange(2))
            dropped += 1
        messages += pair
    messages += [m(scope, n, dst) for n in elsewhere + nowhere for m in (transfer_done, lock_ok)]
    copies = [dict(m) for m in messages if rng.random() < 0.2]  # byte-identical bodies
    messages += copies
    rng.shuffle(messages)
    before = quiet(daemon)
    with watching(daemon, forged) as published_forged:
        for start in range(0, len(messages), max(1, len(messages) // 4)):
            broker.publish_as_hermes(messages[start : start + max(1, len(messages) // 4)])
            time.sleep(rng.uniform(0.0, 1.5))  # batches land in different event cycles
        names = set(real) | set(elsewhere) | set(nowhere)
        goal = {f"{scope}:{n}" for n in real} | ({sorted(forged)[0]} if expect_forged else set())
        took = settled(lambda: goal <= lists(daemon)["available"], 60)
        after = quiet(daemon)
    diff = divergence(admin, daemon, names)
    if expect_forged:
        diff["missing"] = sorted(set(diff["missing"]) | (goal - lists(daemon)["available"]))
    delta = {k: after[k] - before[k] for k in after}
    return {
        "datasets": count,
        "messages": len(messages),
        "dropped": dropped,
        "duplicated": len(copies),
        "forged_datasets": len(forged),
        "settled_s": took,
        "daemon_counters": delta,
        "forged_published": sorted(published_forged),
        "divergent": diff["missing"] + diff["extra"],
        "rucio_complete_at_site": diff["truth"],
    }


def broker_restart(
    admin: RucioAdmin, daemon: EventDaemon, broker: Broker, down_s: float = 5.0
) -> dict[str, Any]:
    """Datasets made complete while no message announces them (lost), then the broker down
    for ``down_s``: the reconnect's full read must run and publish them. The listener gauge
    is sampled every 0.2 s throughout (when ``/metrics`` showed the outage and the
    subscription back). The gauge aside, a ``probe`` dataset (complete, unannounced) gets its
    ``datasetlock_ok`` the moment the broker is up again: the time it reaches the ad bounds
    the re-subscription from above (plus the debounce and one event cycle)."""
    scope, dst = daemon.scope, daemon.dst
    lost = {f"{scope}:{n}" for n in admin.many_datasets(scope, 5, dst)}
    (probe,) = admin.many_datasets(scope, 1, dst)
    before = counters(daemon)
    samples: list[tuple[float, float]] = []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            with suppress(*IGNORED):
                samples.append((time.monotonic(), counters(daemon)["connected"]))
            done.wait(0.2)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    stopped = time.monotonic()
    broker.stop()
    time.sleep(down_s)
    broker.start()
    up = time.monotonic()
    broker.publish_as_hermes([lock_ok(scope, probe, dst)])
    probed = settled(lambda: f"{scope}:{probe}" in lists(daemon)["available"], 120)
    reread = settled(lambda: counters(daemon)["full_reads"] > before["full_reads"], 120)
    reread_at = time.monotonic() - up
    took = settled(lambda: lost <= lists(daemon)["available"], 30)
    settled(lambda: counters(daemon)["connected"] == 1, 30)
    done.set()
    thread.join()
    shown = next((t - stopped for t, c in samples if c == 0), None)
    back = next((t - up for t, c in samples if t >= up and c == 1), None) if shown else None
    return {
        "lost_datasets": len(lost),
        "broker_down_s": up - stopped,
        "outage_shown_in_metrics_s": shown,
        "gauge_back_after_broker_up_s": back,
        "probe_published_after_broker_up_s": probed,
        "full_read_after_reconnect_s": None if reread is None else reread_at,
        "full_reads": counters(daemon)["full_reads"] - before["full_reads"],
        "lost_published": len(lost & lists(daemon)["available"]),
        "lost_published_s": took,
    }


def run(
    admin: RucioAdmin,
    daemon: EventDaemon,
    broker: Broker,
    hermes: Hermes,
    count: int,
    rng: random.Random,
    *,
    restart: bool = True,
    expect_forged: bool = False,
) -> dict[str, Any]:
    """The three phases in order (hermes running at the start, stopped at the end)."""
    results: dict[str, Any] = {
        "hermes_away": hermes_away(admin, daemon, hermes, max(1, count // 5))
    }
    hermes.stop()  # from here, only the scenario's messages
    results["faults"] = faults(admin, daemon, broker, count, rng, expect_forged)
    if restart:
        results["broker_restart"] = broker_restart(admin, daemon, broker)
    return results


def missed(chaos: dict[str, Any]) -> list[str]:
    """The chaos targets missed, one line each (empty: all met)."""
    out = []
    away, f = chaos["hermes_away"], chaos["faults"]
    c = f["daemon_counters"]
    if away["delivered"] != away["changes"] or away["full_reads_meanwhile"]:
        out.append(f"hermes away: {away['delivered']}/{away['changes']} delivered, "
                   f"{away['full_reads_meanwhile']:.0f} full reads")  # fmt: skip
    if c["full_reads"]:
        out.append(f"faults: {c['full_reads']:.0f} full reads between the faults and the check")
    if c["received"] != f["messages"]:
        out.append(f"faults: {c['received']:.0f} of {f['messages']} messages received")
    if c["duplicates"] < f["duplicated"]:
        out.append(f"faults: {c['duplicates']:.0f} of {f['duplicated']} duplicates recognised")
    if c["applied"] + c["ignored"] != c["received"] or c["ignored"] != c["duplicates"]:
        applied, ignored, dups = c["applied"], c["ignored"], c["duplicates"]
        out.append(f"faults: applied {applied:.0f} + ignored {ignored:.0f} "
                   f"(duplicates {dups:.0f}) of {c['received']:.0f} received")  # fmt: skip
    if f["divergent"]:
        out.append(f"faults: {len(f['divergent'])} divergent datasets against Rucio")
    if f["forged_published"]:
        out.append(f"faults: {len(f['forged_published'])} forged datasets published")
    b = chaos.get("broker_restart")
    if b is not None:
        if b["full_read_after_reconnect_s"] is None or b["lost_published"] != b["lost_datasets"]:
            out.append(f"broker restart: no full read after the reconnect published the lost "
                       f"({b['lost_published']}/{b['lost_datasets']})")  # fmt: skip
        if (b["probe_published_after_broker_up_s"] or 1e9) > 10:
            out.append(f"broker restart: a message sent as the broker came up was published "
                       f"{b['probe_published_after_broker_up_s']} s later (re-subscribed "
                       "within 10 s is the target)")  # fmt: skip
        if (b["outage_shown_in_metrics_s"] or 1e9) > 5:
            out.append(f"broker restart: /metrics showed the outage after "
                       f"{b['outage_shown_in_metrics_s']} s (target 5 s)")  # fmt: skip
    return out
