"""Matchmaking quality on the real pool: data-bound jobs submitted with ``hydrator expr``
requirements run on their data's site and count as local; a job pinned to a site without its data
counts as remote; an idle job whose data is nowhere counts as ``nowhere``.

The daemon (``hydrator run`` with ``[collector]`` enabled) merges the site lists into the slot
ads so the negotiator can match; the metrics are read twice: from an in-process service built by
the same wiring (``registry.get_sample_value``) and from the running daemon's ``/metrics``.
"""

from __future__ import annotations

import math
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hydrator.config import load_config
from hydrator.runtime.metrics import Metrics
from hydrator.runtime.service import Service
from hydrator.runtime.wiring import build_assembly
from tests.support.daemon import Daemon
from tests.support.pool import IDLE, RUNNING, SUBMIT_USER, Pool
from tests.support.static_inventory import (
    INVENTORY,
    TRANSIENT,
    expressions,
    start_publishing,
    write_inventory,
)
from tests.support.wait import wait_for

pytestmark = [pytest.mark.pool, pytest.mark.slow]

# INVENTORY: SITE_A holds ska:obs_1, SITE_B ska:obs_2, SITE_C ska:obs_3 (and skymodel_v3)
SLEEP = "executable = /bin/sleep\narguments = 600\noutput = /dev/null\nerror = /dev/null\n"


@pytest.fixture
def daemon(condor_pool: Pool, tmp_path: Path) -> Iterator[Daemon]:
    d = Daemon(tmp_path)
    write_inventory(d.directory, INVENTORY)
    start_publishing(d, condor_pool)
    yield d
    d.stop()


@pytest.fixture
def service(daemon: Daemon, metrics: Metrics) -> Iterator[Service]:
    """The same configuration, in process, with its own state file, reporting to
    ``metrics``."""
    text = (daemon.directory / "hydrator.toml").read_text()
    path = daemon.directory / "in-process.toml"
    path.write_text(text.replace('"state.sqlite"', '"in-process.sqlite"'))
    built = build_assembly(load_config(path), metrics)
    assert built.pool.probe is not None, "[collector] enabled wires the pool probe"
    yield built.service
    built.service.close()


@pytest.fixture
def jobs(condor_pool: Pool) -> Iterator[list[int]]:
    clusters: list[int] = []
    yield clusters
    for cluster in clusters:
        condor_pool.run_in_chroot(["condor_rm", str(cluster)], user=SUBMIT_USER, check=False)


def data_bound(*datasets: str) -> str:
    return SLEEP + expressions(*datasets) + "queue\n"


def pinned(dataset: str, site: str) -> str:
    lines = f'My.RequiredDatasets = {{"{dataset}"}}\nrequirements = GLIDEIN_Site == "{site}"\n'
    return SLEEP + lines + "queue\n"


def sample(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def test_local_remote_and_nowhere_jobs_are_counted(
    metrics: Metrics, condor_pool: Pool, daemon: Daemon, service: Service, jobs: list[int]
) -> None:
    pool = condor_pool
    jobs.append(pool.submit(data_bound("ska:obs_1")))  # SITE_A
    jobs.append(pool.submit(data_bound("ska:obs_3")))  # SITE_C
    jobs.append(pool.submit(data_bound("ska:obs_404")))  # held nowhere: stays idle
    for cluster in jobs[:2]:
        pool.wait_for_job_state(cluster, [RUNNING], timeout_s=90)
    assert [pool.job_site(pool.job_ad(c)) for c in jobs[:2]] == ["SITE_A", "SITE_C"]
    pool.wait_for_job_state(jobs[2], [IDLE])

    service.run_cycle()
    assert sample(metrics, "hydrator_pool_queries_total", outcome="ok") == 1
    assert sample(metrics, "hydrator_jobs_running", locality="local") == 2
    assert sample(metrics, "hydrator_jobs_running", locality="remote") == 0
    assert sample(metrics, "hydrator_jobs_running_data_local_ratio") == 1.0
    assert sample(metrics, "hydrator_site_jobs_running", site="SITE_A", locality="local") == 1
    assert sample(metrics, "hydrator_site_jobs_running", site="SITE_C", locality="local") == 1
    assert sample(metrics, "hydrator_jobs_idle_data_bound", reason="nowhere") == 1
    assert sample(metrics, "hydrator_jobs_idle_data_bound", reason="missed_locality") == 0
    wait_for(
        "daemon's /metrics: ratio 1.0",
        lambda: daemon.metric("hydrator_jobs_running_data_local_ratio"),
        done=lambda got: got == 1.0,
        timeout_s=30.0,
        ignore=TRANSIENT,
    )

    # obs_2 is at SITE_B only; pinned to SITE_C (its second slot is free) it runs remote
    jobs.append(pool.submit(pinned("ska:obs_2", "SITE_C")))
    pool.wait_for_job_state(jobs[3], [RUNNING], timeout_s=90)
    service.run_cycle()
    assert sample(metrics, "hydrator_jobs_running", locality="local") == 2
    assert sample(metrics, "hydrator_jobs_running", locality="remote") == 1
    assert sample(metrics, "hydrator_site_jobs_running", site="SITE_C", locality="remote") == 1
    ratio = sample(metrics, "hydrator_jobs_running_data_local_ratio")
    assert ratio is not None and math.isclose(ratio, 2 / 3)
    wait_for(
        "daemon's /metrics: one remote job",
        lambda: daemon.metric("hydrator_jobs_running", locality="remote"),
        done=lambda got: got == 1,
        timeout_s=30.0,
        ignore=TRANSIENT,
    )
    served = daemon.metrics()  # the daemon process's /metrics
    assert math.isclose(served[("hydrator_jobs_running_data_local_ratio", frozenset())], 2 / 3)
    nowhere = ("hydrator_jobs_idle_data_bound", frozenset({("reason", "nowhere")}))
    assert served[nowhere] == 1


FALLBACK_S = 10  # two of the test pool's 5 s negotiation cycles


def fallback_job(dataset: str) -> str:
    """A sleeping job with the lines ``hydrator expr --fallback-after FALLBACK_S`` prints."""
    lines = subprocess.run(
        [sys.executable, "-m", "hydrator", "expr", "--fallback-after", str(FALLBACK_S), dataset],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert f"|| (time() - MY.QDate > {FALLBACK_S})" in lines
    return SLEEP + lines + "queue\n"


def waited_s(pool: Pool, cluster: int) -> int:
    ad = pool.job_ad(cluster, ["QDate", "JobStartDate"])
    assert ad is not None and "JobStartDate" in ad, ad
    return int(ad["JobStartDate"]) - int(ad["QDate"])


def test_fallback_runs_local_when_it_can_and_elsewhere_after_the_wait(
    condor_pool: Pool, daemon: Daemon, jobs: list[int]
) -> None:
    pool = condor_pool  # ska:obs_1 is at SITE_A only, which has one slot
    jobs.append(pool.submit(fallback_job("ska:obs_1")))
    first = pool.wait_for_job_state(jobs[0], [RUNNING], timeout_s=60)
    assert pool.job_site(first) == "SITE_A"
    assert waited_s(pool, jobs[0]) < FALLBACK_S  # took the free local slot without waiting

    jobs.append(pool.submit(fallback_job("ska:obs_1")))  # SITE_A's slot is now busy
    queued = time.monotonic()
    time.sleep(FALLBACK_S - 2)  # at least one negotiation cycle saw it: free slots, none local
    pool.wait_for_job_state(jobs[1], [IDLE], timeout_s=1)
    second = pool.wait_for_job_state(jobs[1], [RUNNING], timeout_s=FALLBACK_S + 30)
    assert pool.job_site(second) != "SITE_A"
    assert waited_s(pool, jobs[1]) > FALLBACK_S
    print(
        f"fallback job ran at {pool.job_site(second)} {time.monotonic() - queued:.0f}s after submit"
    )
