"""Demand-driven advertising on the real pool: ads carry only what queued jobs need, within a
per-site budget, most-demanded first."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import htcondor2
import pytest

from hydrator.adapters.htcondor.collector import SITE_AD_TYPE
from hydrator.config import parse_config
from hydrator.domain import Site
from hydrator.runtime.metrics import Metrics
from hydrator.runtime.service import Service
from hydrator.runtime.wiring import build_service
from tests.support.pool import IDLE, NEVER_MATCHING, Pool
from tests.support.wait import wait_for

pytestmark = pytest.mark.pool

INVENTORY = """\
[storage.B_DISK]
site = "SITE_B"
available = ["ska:d1", "ska:d2", "ska:d3", "ska:d4"]
partial = { "ska:d5" = 0.5 }
"""


@pytest.fixture
def demand_jobs(condor_pool: Pool) -> Iterator[None]:
    clusters = [
        condor_pool.submit(NEVER_MATCHING.format(required=required, count=count))
        for required, count in [
            ('{"ska:d2"}', 3),
            ('{"ska:d1", "ska:d3"}', 2),
            ('{"ska:d3", "ska:elsewhere"}', 1),
        ]
    ]
    for cluster in clusters:
        condor_pool.wait_for_job_state(cluster, [IDLE])
    yield
    for cluster in clusters:
        condor_pool.run_in_chroot(["condor_rm", str(cluster)], user="submitter", check=False)


@pytest.fixture
def service(condor_pool: Pool, tmp_path: Path, metrics: Metrics) -> Iterator[Service]:
    (tmp_path / "inv.toml").write_text(INVENTORY)
    config = parse_config(
        {
            "daemon": {"state_path": "state.sqlite"},
            "sources": [{"type": "static", "path": "inv.toml", "settle_s": 0}],
            "classad": {"advertise": "demand", "max_datasets_per_site": 2},
            "collector": {
                "enabled": True,
                "pool": condor_pool.collector_address,
                "token_dir": str(condor_pool.token_dir),
                "locality_metrics": False,
            },
        },
        tmp_path,
    )
    built = build_service(config, metrics)
    yield built
    built.close()
    # withdraw the site ad this test made: the publisher invalidates sites that went away
    (tmp_path / "inv.toml").write_text("[storage]\n")
    cleanup = build_service(config)
    cleanup.run_cycle()
    cleanup.close()


def test_ads_carry_the_most_demanded_datasets_within_the_budget(
    metrics: Metrics, condor_pool: Pool, demand_jobs: None, service: Service
) -> None:
    report = service.run_cycle()
    assert report.outcome == "ok"
    # demand: d2 x3, d1 x2, d3 x3 -> budget 2 keeps d3 (3 jobs) and d2 (3 jobs, then by name)
    want = ["ska:d2", "ska:d3"]
    body = service.published.ads[Site("SITE_B")].body.decode()
    assert 'AvailableDatasets = { "ska:d2","ska:d3" }' in body.splitlines()
    assert "PartialDatasets = {  }" in body.splitlines(), "d5 is wanted by no job"

    def site_b() -> list[list[str]]:
        site_ad = condor_pool.collector.query(
            htcondor2.AdType.Any,
            f'MyType == "{SITE_AD_TYPE}" && Name == "SITE_B"',
            ["AvailableDatasets"],
        )
        return [list(ad["AvailableDatasets"]) for ad in site_ad]

    assert wait_for("SITE_B's site ad lists", site_b, done=[want].__eq__, timeout_s=10.0) == [want]

    deadline = time.monotonic() + 30
    while True:  # the startd's own updates wipe merges; each cycle re-merges the wiped slots
        slots = condor_pool.slot_ads(["AvailableDatasets"], 'GLIDEIN_Site == "SITE_B"')
        if slots and all(list(ad.get("AvailableDatasets", [])) == want for ad in slots):
            break
        assert time.monotonic() < deadline, f"slot ads never carried {want}: {slots}"
        service.run_cycle()
        time.sleep(0.5)

    m = metrics.registry.get_sample_value
    assert m("hydrator_datasets_unadvertised", {"site": "SITE_B", "reason": "over_budget"}) == 1
    assert m("hydrator_datasets_unadvertised", {"site": "SITE_B", "reason": "not_demanded"}) == 2
    assert m("hydrator_datasets", {"site": "SITE_B", "state": "available"}) == 4, "the truth"
