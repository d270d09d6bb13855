"""One queue read per cycle on the real pool: the demand (``advertise = "demand"``), the
matchmaking probe and job annotation all take their jobs from one query per schedd, counted by
the reader itself (:attr:`~hydrator.adapters.htcondor.condor_queue.CondorQueue.queries`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from hydrator.adapters.htcondor.condor_queue import CondorQueue
from hydrator.config import load_config
from hydrator.domain import DatasetId, Site
from hydrator.runtime.wiring import Assembly, build_assembly
from tests.pool.annotating import INVENTORY, annotated, demand_config, jobs_of, submit_idle
from tests.support.pool import IDLE, Pool

pytestmark = pytest.mark.pool

COMPLETE_AT_A = '{"ska:obs_1", "ska:sky"}'  # INVENTORY: complete at SITE_A, partly at SITE_B


@pytest.fixture
def built(condor_pool: Pool, tmp_path: Path) -> Iterator[Assembly]:
    """Demand-driven ads, matchmaking metrics and annotation, all on, in process, with the
    parts the service was built over (its queue reader and probe, its metrics)."""
    condor_pool.remove_all_jobs()
    (tmp_path / "inventory.toml").write_text(INVENTORY)
    path = tmp_path / "hydrator.toml"
    path.write_text(demand_config(condor_pool))
    made = build_assembly(load_config(path))
    yield made
    made.service.close()
    condor_pool.remove_all_jobs()


def test_a_cycle_reads_each_schedd_once_for_demand_probe_and_annotation(
    condor_pool: Pool, built: Assembly
) -> None:
    cluster = submit_idle(condor_pool, COMPLETE_AT_A, count=3)
    condor_pool.wait_for_job_state(cluster, [IDLE])
    schedd = condor_pool.schedd_name()
    service, reader = built.service, built.pool.queue
    assert isinstance(reader, CondorQueue) and built.pool.probe is not None

    report = service.run_cycle()

    assert dict(reader.queries) == {schedd: 1}, "one query per schedd for all three"
    # each consumer got its part of that one read:
    ad = service.published.ads[Site("SITE_A")]  # the demand: only demanded datasets advertised
    assert set(ad.view.available) == {DatasetId("ska", "obs_1"), DatasetId("ska", "sky")}
    idle = (
        built.instruments.metrics.registry.get_sample_value
    )  # the probe: 3 idle jobs, data at SITE_A
    assert idle("hydrator_jobs_idle_data_bound", {"reason": "missed_locality"}) == 3
    assert report.jobs is not None and report.jobs.seen == 3  # annotation
    assert report.jobs.failed_schedds == ()
    assert [annotated(a) for a in jobs_of(condor_pool, [cluster])] == [(["SITE_A"], ["SITE_B"])] * 3

    service.run_cycle()
    assert dict(reader.queries) == {schedd: 2}
