"""A job written by ``hydrator expr --near`` matches only once the daemon has annotated it
(``DataLocalitySites``), but ``condor_submit`` asks for a negotiation cycle at once, before the
annotation: that cycle rejects the job. The daemon (``[jobs] annotate``, its
``reschedule_min_interval_s`` default) then asks the schedd for another cycle after annotating,
so the job runs without waiting for ``NEGOTIATOR_INTERVAL``, here an hour.

Order on the real pool: the job is submitted with no daemon running and rejected by the cycle
its submission triggered; then the daemon starts and annotates it; then it runs at its data's
site. Without the step it would sit idle for the hour.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from hydrator.core.expr import near_expressions, near_submit_lines
from tests.support.daemon import Daemon
from tests.support.pool import EDITOR_IDENTITY, IDLE, RUNNING, SUBMIT_USER, Pool
from tests.support.static_inventory import INVENTORY, TRANSIENT, start_static, write_inventory
from tests.support.wait import wait_for

pytestmark = [pytest.mark.pool, pytest.mark.slow]

LONG_INTERVAL = "NEGOTIATOR_INTERVAL = 3600\n"  # no periodic cycle during the test
# INVENTORY: ska:obs_1 at SITE_A only (slot1)
JOB = """\
executable = /bin/sleep
arguments = 600
output = /dev/null
error = /dev/null
My.RequiredDatasets = {{"ska:obs_1"}}
{lines}queue
"""


@pytest.fixture
def slow_negotiator(condor_pool: Pool) -> Iterator[Pool]:
    condor_pool.write_config("62-slow-negotiator.conf", LONG_INTERVAL)
    condor_pool.reconfig()
    yield condor_pool
    condor_pool.remove_all_jobs()
    condor_pool.remove_config("62-slow-negotiator.conf")
    condor_pool.reconfig()


@pytest.fixture
def annotating(slow_negotiator: Pool, tmp_path: Path) -> Iterator[Daemon]:
    """A daemon annotating jobs as the pool's editor identity; started by the test."""
    daemon = Daemon(tmp_path)
    write_inventory(daemon.directory, INVENTORY)
    yield daemon
    daemon.stop()


def test_a_near_job_rejected_before_its_annotation_runs_once_annotated(
    slow_negotiator: Pool, annotating: Daemon
) -> None:
    pool = slow_negotiator
    cluster = pool.submit(JOB.format(lines=near_submit_lines(near_expressions())))
    rejected = wait_for(
        "the cycle condor_submit asked for to reject the unannotated job",
        lambda: pool.job_ad(cluster, ["LastRejMatchTime", "DataLocalitySites"]),
        done=lambda ad: ad is not None and ad.get("LastRejMatchTime") is not None,
        timeout_s=60.0,
        ignore=TRANSIENT,
    )
    assert rejected is not None and rejected["JobStatus"] == IDLE
    assert rejected.get("DataLocalitySites") is None

    tokens = pool.token_dir_for(EDITOR_IDENTITY, annotating.directory / "editor")
    start_static(
        annotating,
        f'[collector]\nenabled = false\npool = "{pool.collector_address}"\n'
        f'token_dir = "{tokens}"\n\n[jobs]\nannotate = true\n',
    )
    ran = pool.wait_for_job_state(cluster, [RUNNING], timeout_s=120.0)
    assert pool.job_site(ran) == "SITE_A"
    ad = pool.job_ad(cluster, ["DataLocalitySites"])
    assert ad is not None and list(ad["DataLocalitySites"]) == ["SITE_A"]
    pool.run_in_chroot(["condor_rm", str(cluster)], user=SUBMIT_USER, check=False)
