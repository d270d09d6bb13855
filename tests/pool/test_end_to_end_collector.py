"""End to end with the merge path: ``hydrator run`` with ``[collector]`` enabled publishes site
ads and merges into slot ads; the attributes follow a data change within a cycle; a collector
outage does not stop the daemon, which publishes again once the collector is back.

A separate module from test_end_to_end.py so that the execute-node hook (a module fixture
there) is gone: here the slot attributes can only come from the collector merges.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import htcondor2
import pytest
import requests

from tests.support.daemon import Daemon
from tests.support.pool import SLOT_SITES, Pool
from tests.support.static_inventory import (
    CYCLE_S,
    INVENTORY,
    TRANSIENT,
    invalidate_site_ads,
    start_publishing,
    write_inventory,
)
from tests.support.wait import wait_for

pytestmark = [pytest.mark.pool, pytest.mark.slow]

SITE_ADS = 'MyType == "DataLocality"'


@pytest.fixture
def publishing_daemon(condor_pool: Pool, tmp_path: Path) -> Iterator[Daemon]:
    d = Daemon(tmp_path)
    write_inventory(d.directory, INVENTORY)
    start_publishing(d, condor_pool)
    yield d
    d.stop()
    invalidate_site_ads(condor_pool)


def site_ads(pool: Pool) -> set[str]:
    return {
        str(ad["Name"]) for ad in pool.collector.query(htcondor2.AdType.Any, SITE_ADS, ["Name"])
    }


def slot1_available(pool: Pool) -> list[str] | None:
    ads = [ad for ad in pool.slot_ads(["AvailableDatasets"]) if ad["Name"].startswith("slot1@")]
    value = ads[0].get("AvailableDatasets") if ads else None
    return list(value) if value is not None else None


def test_merged_attributes_follow_a_data_change_within_a_cycle(
    condor_pool: Pool, publishing_daemon: Daemon
) -> None:
    pool = condor_pool
    assert SLOT_SITES["slot1"] == "SITE_A"
    wait_for(
        "site ads",
        lambda: site_ads(pool),
        done=lambda got: got == {"SITE_A", "SITE_B", "SITE_C"},
        timeout_s=30.0,
        ignore=TRANSIENT,
    )
    wait_for(
        "merged lists",
        lambda: slot1_available(pool),
        done=lambda got: got == ["ska:obs_1"],
        timeout_s=30.0,
        ignore=TRANSIENT,
    )
    write_inventory(
        publishing_daemon.directory, dict(INVENTORY, A_DISK=["ska:obs_1", "ska:obs_new"])
    )
    started = time.monotonic()
    wait_for(
        "changed lists",
        lambda: slot1_available(pool),
        done=lambda got: got == ["ska:obs_1", "ska:obs_new"],
        timeout_s=30.0,
        ignore=TRANSIENT,
    )
    took = time.monotonic() - started
    print(f"data change merged into the slot ad in {took:.1f}s")
    assert took < 2 * CYCLE_S + 3
    # the daemon runs its repair watch: the looks sent every slot merge, the cycles none
    assert sample(publishing_daemon.url, 'hydrator_collector_updates_total{kind="merge"') == 0
    assert sample(publishing_daemon.url, "hydrator_slot_repairs_total{") > 0


def sample(url: str, prefix: str) -> float:
    """The sum of the samples whose line starts with ``prefix`` in the daemon's /metrics."""
    lines = requests.get(f"{url}/metrics", timeout=5).text.splitlines()
    return sum(float(line.split()[-1]) for line in lines if line.startswith(prefix))


def test_with_the_default_interval_a_change_reaches_the_slot_with_its_startds_update(
    condor_pool: Pool, tmp_path: Path
) -> None:
    """merge_min_interval_s = 300 (a production UPDATE_INTERVAL) and the pool's UPDATE_INTERVAL
    of 5 s: slot1 is not re-merged for the change, but its startd's next update wipes it and
    it is merged at once, so the change arrives within UPDATE_INTERVAL and a cycle."""
    pool = condor_pool
    d = Daemon(tmp_path)
    write_inventory(d.directory, INVENTORY)
    start_publishing(d, pool, merge_min_interval_s=300)
    try:
        wait_for(
            "merged lists",
            lambda: slot1_available(pool),
            done=lambda got: got == ["ska:obs_1"],
            timeout_s=30.0,
            ignore=TRANSIENT,
        )
        write_inventory(d.directory, dict(INVENTORY, A_DISK=["ska:obs_1", "ska:obs_new"]))
        seen_deferred: list[float] = []

        def changed() -> bool:
            seen_deferred.append(deferred_merges(d.url))
            return slot1_available(pool) == ["ska:obs_1", "ska:obs_new"]

        started = time.monotonic()
        wait_for("changed lists", changed, timeout_s=30.0, ignore=TRANSIENT)
        took = time.monotonic() - started
        print(f"data change merged into the slot ad in {took:.1f}s")
        assert took < 5 + 2 * CYCLE_S + 3
        # while SITE_A's slots waited for their startd's update, the daemon said so
        assert max(seen_deferred) >= 1
    finally:
        d.stop()
        invalidate_site_ads(pool)


def deferred_merges(url: str) -> float:
    """``hydrator_collector_merges_deferred`` as the daemon's /metrics serves it."""
    for line in requests.get(f"{url}/metrics", timeout=5).text.splitlines():
        if line.startswith("hydrator_collector_merges_deferred "):
            return float(line.split()[1])
    raise AssertionError("hydrator_collector_merges_deferred not exported")


def test_collector_outage_does_not_stop_the_daemon(
    condor_pool: Pool, publishing_daemon: Daemon
) -> None:
    pool, d = condor_pool, publishing_daemon
    wait_for(
        "site ads",
        lambda: site_ads(pool),
        done=lambda got: got == {"SITE_A", "SITE_B", "SITE_C"},
        timeout_s=30.0,
        ignore=TRANSIENT,
    )
    pool.daemon_off("collector")
    try:
        time.sleep(3 * CYCLE_S + 1)  # a few cycles fail to publish
        assert d.running()
        assert requests.get(f"{d.url}/healthz", timeout=5).ok
        assert requests.get(f"{d.url}/v1/sites/SITE_A/classad", timeout=5).ok
    finally:
        pool.daemon_on("collector")
    wait_for(
        "site ads again",
        lambda: site_ads(pool),
        done=lambda got: got == {"SITE_A", "SITE_B", "SITE_C"},
        timeout_s=60.0,
        ignore=TRANSIENT,
    )
    pool.wait_for_slots("true", count=4, timeout_s=60)
    wait_for(
        "merged again",
        lambda: slot1_available(pool),
        done=lambda got: got == ["ska:obs_1"],
        timeout_s=30.0,
        ignore=TRANSIENT,
    )
