"""DMAPI locates what queued jobs declare: ``datasets_from_queue`` over the real pool's schedd."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from hydrator.config import parse_config
from hydrator.domain import Site
from hydrator.runtime.wiring import build_service
from tests.support.fake_dmapi import FakeSrcnet
from tests.support.pool import IDLE, NEVER_MATCHING, Pool

pytestmark = pytest.mark.pool


@pytest.fixture
def fake() -> Iterator[FakeSrcnet]:
    server = FakeSrcnet()
    with server.running():
        yield server


def test_datasets_declared_by_queued_jobs_are_located(
    condor_pool: Pool, fake: FakeSrcnet, tmp_path: Path
) -> None:
    fake.add_dataset("ska", "queued_x", ("RSE_B", None))
    fake.add_dataset("ska", "not_queued", ("RSE_B", None))
    fake.add_dataset("ska", "configured", ("RSE_B", None))
    (tmp_path / "token").write_text(
        fake.issue_token("data-management-api", "data-management-api-service")
    )
    config = parse_config(
        {
            "daemon": {"state_path": "state.sqlite"},
            "sources": [
                {
                    "type": "dmapi",
                    "base_url": fake.base_url,
                    "token_file": "token",
                    "datasets": ["ska:configured"],
                    "datasets_from_queue": True,
                    "backoff_s": 0.05,
                }
            ],
            "sites": {"RSE_B": "SITE_B"},
            "collector": {
                "enabled": True,
                "pool": condor_pool.collector_address,
                "token_dir": str(condor_pool.token_dir),
                "merge_slots": False,
                "site_ads": False,
                "locality_metrics": False,
            },
        },
        tmp_path,
    )
    cluster = condor_pool.submit(NEVER_MATCHING.format(required='{"ska:queued_x"}', count=1))
    try:
        condor_pool.wait_for_job_state(cluster, [IDLE])
        service = build_service(config)
        report = service.run_cycle()
        service.close()
    finally:
        condor_pool.run_in_chroot(["condor_rm", str(cluster)], user="submitter", check=False)
    assert report.outcome == "ok" and report.plan is not None
    available = [str(d) for d in report.plan.sites[Site("SITE_B")].available]
    assert available == ["ska:configured", "ska:queued_x"]
    assert ("ska", "not_queued") not in fake.located
