"""The remote-read budget on the real pool: jobs written by ``hydrator expr --near`` run where
their data is without limit, and at most the budget of them read remotely from one data site
at once, with the negotiator configuration of deploy/condor/60-hydrator-near.conf.

The pool's slots stand for sites (slot1 SITE_A, slot2 SITE_B, slot3 and slot4 SITE_C). Here
the data is at SITE_C; SITE_A and SITE_B are near it (their slots carry
``DataLocalityNearSites = {"SITE_C"}``, as the daemon's ads would); the budget is 1. A first
remote reader, pinned to SITE_A, holds the budget while six more jobs are queued: the two
SITE_C slots must run them two at a time (local jobs are not held back by the full budget),
and never two jobs read remotely at once. The job annotation (``DataLocalitySites``) is
written at submit, as the annotator would.
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path

import pytest

from hydrator.core.expr import near_submit_lines
from tests.support.near import default_near_expressions
from tests.support.pool import COMPLETED, RUNNING, SLOT_SITES, Pool
from tests.support.wait import wait_for

pytestmark = [pytest.mark.pool, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
DEPLOYED = REPO / "deploy" / "condor" / "60-hydrator-near.conf"
BUDGET = 1
TEST_CONFIG = f"""
CONCURRENCY_LIMIT_DEFAULT_REMOTE = {BUDGET}
STARTD_ATTRS = $(STARTD_ATTRS) DataLocalityNearSites
SLOT1_DataLocalityNearSites = {{"SITE_C"}}
SLOT2_DataLocalityNearSites = {{"SITE_C"}}
"""
JOB = """\
executable = /bin/sleep
arguments = {seconds}
output = /dev/null
error = /dev/null
+DataLocalitySites = {{"SITE_C"}}
{lines}queue {count}
"""


@pytest.fixture
def budget_pool(condor_pool: Pool) -> Iterator[Pool]:
    condor_pool.write_config("60-hydrator-near.conf", DEPLOYED.read_text())
    condor_pool.write_config("61-near-test.conf", TEST_CONFIG)
    condor_pool.reconfig()
    condor_pool.wait_for_slots("DataLocalityNearSites isnt undefined", count=2)
    yield condor_pool
    condor_pool.remove_all_jobs()
    condor_pool.remove_config("61-near-test.conf")
    condor_pool.remove_config("60-hydrator-near.conf")
    condor_pool.reconfig()


def site_of(host: object) -> str:
    return SLOT_SITES[str(host).split("@")[0].split("_")[0]]


def test_remote_readers_of_a_site_never_exceed_the_budget_and_local_jobs_are_not_held(
    budget_pool: Pool,
) -> None:
    pool = budget_pool
    lines = near_submit_lines(default_near_expressions())
    pinned = lines.replace("requirements = ", 'requirements = TARGET.GLIDEIN_Site == "SITE_A" && ')
    blocker = pool.submit(JOB.format(seconds=20, lines=pinned, count=1))
    pool.wait_for_job_state(blocker, [RUNNING])
    cluster = pool.submit(JOB.format(seconds=5, lines=lines, count=6))

    most_remote = most_local_while_full = 0

    def sample() -> list[object]:
        nonlocal most_remote, most_local_while_full
        ads = pool.schedd.query(
            constraint=f"ClusterId == {blocker} || ClusterId == {cluster}",
            projection=["JobStatus", "RemoteHost"],
        )
        sites = [site_of(a["RemoteHost"]) for a in ads if a.get("JobStatus") == RUNNING]
        remote = sum(s != "SITE_C" for s in sites)
        most_remote = max(most_remote, remote)
        if remote >= BUDGET:
            most_local_while_full = max(most_local_while_full, len(sites) - remote)
        assert remote <= BUDGET, f"{remote} remote readers of SITE_C at once: {sites}"
        return list(ads)

    wait_for("every job done", sample, done=lambda ads: not ads, timeout_s=240, interval_s=0.3)
    history = list(
        pool.schedd.history(
            constraint=f"ClusterId == {cluster} || ClusterId == {blocker}",
            projection=["JobStatus", "LastRemoteHost", "JobCurrentStartDate", "CompletionDate"],
            match=7,
        )
    )
    assert len(history) == 7 and all(h["JobStatus"] == COMPLETED for h in history)
    remote = sorted(
        (int(h["JobCurrentStartDate"]), int(h["CompletionDate"]))
        for h in history
        if site_of(h["LastRemoteHost"]) != "SITE_C"
    )
    assert all(end <= start for (_, end), (start, _) in pairwise(remote))
    assert most_remote == BUDGET
    assert most_local_while_full == 2  # both SITE_C slots ran while the budget was full
