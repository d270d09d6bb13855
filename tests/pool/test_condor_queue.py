"""Demand from the real queue: idle jobs' RequiredDatasets, counted per dataset."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from hydrator.domain import DatasetId
from hydrator.publishers.condor_queue import query_demand
from tests.support.pool import IDLE, Pool

pytestmark = pytest.mark.pool

NEVER_MATCHING = """\
executable = /bin/true
output = /dev/null
error = /dev/null
requirements = False
+RequiredDatasets = {required}
queue {count}
"""


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

    demand = query_demand(condor_pool.collector)

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
