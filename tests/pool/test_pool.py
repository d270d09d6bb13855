"""The test pool itself: slots stand in for sites, and the negotiator honours site requirements."""

from __future__ import annotations

import pytest

from tests.support.pool import COMPLETED, SLOT_SITES, Pool

pytestmark = pytest.mark.pool

JOB = """\
executable = /bin/sleep
arguments = 1
output = /dev/null
error = /dev/null
requirements = {requirements}
queue
"""


def test_each_slot_carries_its_site(condor_pool: Pool) -> None:
    ads = condor_pool.slot_ads(["SlotType"], constraint='SlotType != "Dynamic"')
    sites = {str(ad["Name"]).split("@")[0]: ad["GLIDEIN_Site"] for ad in ads}
    assert sites == SLOT_SITES
    kinds = {str(ad["Name"]).split("@")[0]: ad["SlotType"] for ad in ads}
    assert kinds["slot4"] == "Partitionable" and kinds["slot1"] == "Static"


def test_job_runs_at_the_site_its_requirements_name(condor_pool: Pool) -> None:
    cluster = condor_pool.submit(JOB.format(requirements='TARGET.GLIDEIN_Site == "SITE_B"'))
    ad = condor_pool.wait_for_job_state(cluster, [COMPLETED], timeout_s=60)
    assert condor_pool.job_site(ad) == "SITE_B"


def test_partitionable_slot_runs_jobs_in_dynamic_slots(condor_pool: Pool) -> None:
    requirements = 'TARGET.GLIDEIN_Site == "SITE_C" && TARGET.PartitionableSlot =?= true'
    cluster = condor_pool.submit(JOB.format(requirements=requirements))
    ad = condor_pool.wait_for_job_state(cluster, [COMPLETED], timeout_s=60)
    assert str(ad["LastRemoteHost"]).startswith("slot4_")
