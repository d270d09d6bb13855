"""Reading the real pool: idle jobs' RequiredDatasets per dataset, and where data-bound jobs run."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from hydrator.adapters.htcondor.condor_queue import CondorPoolProbe, CondorQueue, JobQuery
from hydrator.core.locality import PoolJob
from hydrator.core.queue import idle_demand
from hydrator.domain import DatasetId, Site
from tests.support.pool import IDLE, NEVER_MATCHING, RUNNING, SLOT_SITES, Pool

pytestmark = pytest.mark.pool


@pytest.fixture
def idle_jobs(condor_pool: Pool) -> Iterator[list[int]]:
    clusters: list[int] = []
    yield clusters
    for cluster in clusters:
        condor_pool.run_in_chroot(["condor_rm", str(cluster)], user="submitter", check=False)


def test_idle_jobs_required_datasets_are_counted(condor_pool: Pool, idle_jobs: list[int]) -> None:
    for required, count in [
        ('{"ska:obs_1", "ska:obs_2"}', 2),
        ('{"ska:obs_1"}', 1),
        ('"ska:obs_3, ska:obs_1"', 1),  # a string, as some submit tools can only set strings
        ('{"ska:ok", "bad name", "noscope"}', 1),
    ]:
        idle_jobs.append(condor_pool.submit(NEVER_MATCHING.format(required=required, count=count)))
    for cluster in idle_jobs:
        condor_pool.wait_for_job_state(cluster, [IDLE])

    # the demand's part of one queue read, as a cycle takes it
    demand = idle_demand(CondorQueue(condor_pool.collector, JobQuery(True, False, None)).read())

    ds = DatasetId.parse
    assert demand.counts == {
        ds("ska:obs_1"): 4,
        ds("ska:obs_2"): 2,
        ds("ska:obs_3"): 1,
        ds("ska:ok"): 1,
    }
    assert demand.invalid == 2
    assert demand.jobs == 5
    assert demand.failed_schedds == 0


def test_probe_reports_data_bound_jobs_with_their_sites_and_all_slots(
    condor_pool: Pool, idle_jobs: list[int]
) -> None:
    idle_jobs.append(condor_pool.submit(NEVER_MATCHING.format(required='{"ska:a"}', count=1)))
    idle_jobs.append(
        condor_pool.submit(
            "executable = /bin/sleep\narguments = 300\noutput = /dev/null\nerror = /dev/null\n"
            'requirements = TARGET.GLIDEIN_Site == "SITE_B"\n'
            '+RequiredDatasets = {"ska:b", "not valid"}\nqueue\n'
        )
    )
    condor_pool.wait_for_job_state(idle_jobs[0], [IDLE])
    condor_pool.wait_for_job_state(idle_jobs[1], [RUNNING])
    condor_pool.wait_for_slots('GLIDEIN_Site == "SITE_B" && State == "Claimed"', count=1)

    jobs, slots = CondorPoolProbe(condor_pool.collector, "GLIDEIN_Site").jobs_and_slots()

    ds = DatasetId.parse
    assert PoolJob(frozenset({ds("ska:a")}), running=False) in jobs
    assert PoolJob(frozenset({ds("ska:b")}), running=True, site=Site("SITE_B")) in jobs
    assert {s.site for s in slots} == set(SLOT_SITES.values())
    assert not any(s.unclaimed for s in slots if s.site == "SITE_B")  # slot2 runs the job
    assert any(s.unclaimed for s in slots if s.site == "SITE_A")
