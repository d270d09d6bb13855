"""A job written by ``hydrator expr --near`` runs where its data is before the daemon has
annotated it. ``condor_submit`` asks for a negotiation cycle at once, before the annotation
(``DataLocalitySites``) can be written; a form that matched only through the annotation lost
that cycle and waited a whole ``NEGOTIATOR_INTERVAL``. Until annotated, the job is local where
the slot's ``AvailableDatasets`` lists all its ``RequiredDatasets``.

Here no daemon runs at all (nothing ever annotates the job) and only slot1 (SITE_A) lists the
job's dataset, as the daemon's ads would: the job must run there, with no annotation ever
written (on the form before this branch it never runs). Whether the very first cycle matches
it also depends on the pool (a slot still busy from an earlier test, a startd update in
between), so that is not asserted; the benchmark's NegotiatorLog shows it (LOCALITY.md).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from hydrator.core.expr import near_submit_lines
from tests.support.near import default_near_expressions
from tests.support.pool import COMPLETED, RUNNING, Pool

pytestmark = [pytest.mark.pool, pytest.mark.slow]

SLOT_DATA = """
STARTD_ATTRS = $(STARTD_ATTRS) AvailableDatasets
SLOT1_AvailableDatasets = {"ska:obs_1"}
"""
JOB = """\
executable = /bin/sleep
arguments = 5
output = /dev/null
error = /dev/null
My.RequiredDatasets = {{"ska:obs_1"}}
{lines}queue
"""


@pytest.fixture
def data_at_site_a(condor_pool: Pool) -> Iterator[Pool]:
    condor_pool.write_config("62-near-before-annotation.conf", SLOT_DATA)
    condor_pool.reconfig()
    condor_pool.wait_for_slots("AvailableDatasets isnt undefined", count=1)
    yield condor_pool
    condor_pool.remove_all_jobs()
    condor_pool.remove_config("62-near-before-annotation.conf")
    condor_pool.reconfig()


def test_a_near_job_not_yet_annotated_runs_at_its_data_site(
    data_at_site_a: Pool,
) -> None:
    pool = data_at_site_a
    cluster = pool.submit(JOB.format(lines=near_submit_lines(default_near_expressions())))
    ad = pool.wait_for_job_state(cluster, [RUNNING, COMPLETED], timeout_s=120.0)
    assert pool.job_site(ad) == "SITE_A"
    seen = pool.job_ad(cluster, ["DataLocalitySites", "NumJobMatches"])
    assert seen is not None and seen.get("DataLocalitySites") is None  # never annotated
    assert seen.get("NumJobMatches") == 1
