"""Job annotation on the real pool, as the dedicated identity ``hydrator@<UID_DOMAIN>`` (in
QUEUE_SUPER_USERS with a schedd user record, set up by scripts/condor-pool): values for
complete/partial/nowhere jobs, only changed groups edited, a no-change cycle edits nothing, the
budget, DESIRED_Sites, running and held jobs untouched, an unknown schedd counted."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.pool.annotating import INVENTORY, Annotating, annotated, jobs_of, submit_idle
from tests.support.daemon import Daemon
from tests.support.pool import EDITOR_IDENTITY, HELD, IDLE, RUNNING, Pool
from tests.support.static_inventory import INVENTORY as E2E_INVENTORY
from tests.support.static_inventory import TRANSIENT, start_static, write_inventory
from tests.support.wait import wait_for

pytestmark = pytest.mark.pool

COMPLETE = '{"ska:obs_1", "ska:sky"}'  # complete at A, partly at B
MOVING = '{"ska:obs_2"}'  # complete at B, incoming at C
NOWHERE = '{"ska:obs_9"}'


@pytest.fixture(scope="module")
def editor_token(condor_pool: Pool, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return condor_pool.token_dir_for(EDITOR_IDENTITY, tmp_path_factory.mktemp("editor"))


@pytest.fixture
def hydrator(condor_pool: Pool, editor_token: Path, tmp_path: Path) -> Iterator[Annotating]:
    condor_pool.remove_all_jobs()
    h = Annotating(tmp_path, condor_pool, editor_token)
    h.write_inventory()
    yield h
    condor_pool.remove_all_jobs()


def test_jobs_get_their_sites_and_a_no_change_cycle_edits_nothing(
    condor_pool: Pool, hydrator: Annotating
) -> None:
    complete = submit_idle(condor_pool, COMPLETE, count=3)
    moving = submit_idle(condor_pool, MOVING)
    nowhere = submit_idle(condor_pool, NOWHERE)
    condor_pool.wait_for_job_state(nowhere, [IDLE])

    first = hydrator.once()["jobs"]

    assert first == {
        "seen": 5,
        "edits": 3,  # one per distinct RequiredDatasets value
        "edit_calls": 9,  # sites, partial sites, updated
        "jobs_edited": 5,
        "deferred": 0,
        "failed_schedds": 0,
        "failed_schedd_names": [],
        "error": None,
    }
    ads = jobs_of(condor_pool, [complete, moving, nowhere])
    assert [annotated(ad) for ad in ads] == [(["SITE_A"], ["SITE_B"])] * 3 + [
        (["SITE_B"], ["SITE_C"]),
        ([], []),  # data nowhere: empty lists, not missing attributes
    ]
    assert all(ad["JobStatus"] == IDLE for ad in ads)
    assert all(abs(ad["DataLocalitySitesUpdated"] - time.time()) < 120 for ad in ads)
    assert all("DESIRED_Sites" not in ad for ad in ads)  # opt-in only

    again = hydrator.once()["jobs"]
    assert (again["seen"], again["edits"], again["edit_calls"]) == (5, 0, 0)


def test_a_data_change_edits_only_the_jobs_whose_sites_changed(
    condor_pool: Pool, hydrator: Annotating
) -> None:
    complete = submit_idle(condor_pool, COMPLETE, count=2)
    moving = submit_idle(condor_pool, MOVING, count=2)
    condor_pool.wait_for_job_state(moving, [IDLE])
    hydrator.once()
    before = {int(ad["ClusterId"]): ad for ad in jobs_of(condor_pool, [complete, moving])}
    time.sleep(1.1)  # a later state epoch

    # obs_2 arrives at SITE_C: only the MOVING jobs' lists change
    hydrator.write_inventory(
        INVENTORY.replace('replicating = { "ska:obs_2" = 0.1 }', "").replace(
            'available = ["ska:sky"]', 'available = ["ska:sky", "ska:obs_2"]'
        )
    )
    report = hydrator.once()["jobs"]

    assert (report["edits"], report["jobs_edited"]) == (1, 2)
    assert report["edit_calls"] == 3  # sites, partial sites (C left them), updated
    after = {int(ad["ClusterId"]): ad for ad in jobs_of(condor_pool, [complete, moving])}
    assert annotated(after[moving]) == (["SITE_B", "SITE_C"], [])
    assert after[moving]["DataLocalitySitesUpdated"] > before[moving]["DataLocalitySitesUpdated"]
    assert (
        after[complete]["DataLocalitySitesUpdated"] == before[complete]["DataLocalitySitesUpdated"]
    )


def test_the_budget_defers_groups_to_the_next_cycle(
    condor_pool: Pool, hydrator: Annotating
) -> None:
    clusters = [submit_idle(condor_pool, v) for v in (COMPLETE, MOVING, NOWHERE)]
    condor_pool.wait_for_job_state(clusters[-1], [IDLE])
    budget = "max_edits_per_cycle = 2\n"

    first = hydrator.once(budget)["jobs"]
    second = hydrator.once(budget)["jobs"]
    third = hydrator.once(budget)["jobs"]

    assert [(r["edits"], r["deferred"]) for r in (first, second, third)] == [(2, 1), (1, 0), (0, 0)]
    assert all(annotated(ad)[0] is not None for ad in jobs_of(condor_pool, clusters))


def test_desired_sites_is_opt_in_and_keeps_a_submit_time_value(
    condor_pool: Pool, hydrator: Annotating
) -> None:
    plain = submit_idle(condor_pool, COMPLETE)
    own = submit_idle(condor_pool, COMPLETE, extra='+DESIRED_Sites = "T2_US_Nebraska"\n')
    condor_pool.wait_for_job_state(own, [IDLE])
    opt_in = 'desired_sites_attribute = "DESIRED_Sites"\n'

    hydrator.once(opt_in)
    ads = jobs_of(condor_pool, [plain, own])
    assert [ad["DESIRED_Sites"] for ad in ads] == ["SITE_A", "T2_US_Nebraska"]

    # the data moves: the value the hydrator wrote follows, the job's own stays
    hydrator.write_inventory(
        INVENTORY.replace(
            'available = ["ska:obs_2", "ska:sky"]',
            'available = ["ska:obs_1", "ska:obs_2", "ska:sky"]',
        )
    )
    hydrator.once(opt_in)
    assert [ad["DESIRED_Sites"] for ad in jobs_of(condor_pool, [plain, own])] == [
        "SITE_A,SITE_B",
        "T2_US_Nebraska",
    ]
    hydrator.once(opt_in + "overwrite_desired_sites = true\n")
    assert [ad["DESIRED_Sites"] for ad in jobs_of(condor_pool, [plain, own])] == [
        "SITE_A,SITE_B",
        "SITE_A,SITE_B",
    ]


def test_running_and_held_jobs_are_never_edited(condor_pool: Pool, hydrator: Annotating) -> None:
    running = condor_pool.submit(
        "executable = /bin/sleep\narguments = 300\noutput = /dev/null\nerror = /dev/null\n"
        'requirements = TARGET.GLIDEIN_Site == "SITE_B"\n'
        f"+RequiredDatasets = {COMPLETE}\nqueue\n"
    )
    held = submit_idle(condor_pool, COMPLETE)
    condor_pool.run_in_chroot(["condor_hold", str(held)], user="submitter")
    condor_pool.wait_for_job_state(running, [RUNNING])
    condor_pool.wait_for_job_state(held, [HELD])

    report = hydrator.once()["jobs"]

    assert (report["seen"], report["edits"]) == (0, 0)
    assert [annotated(ad) for ad in jobs_of(condor_pool, [running, held])] == [(None, None)] * 2


def test_a_schedd_that_cannot_be_found_is_counted_never_read_as_no_jobs(
    condor_pool: Pool, hydrator: Annotating
) -> None:
    submit_idle(condor_pool, COMPLETE)
    name = condor_pool.schedd_name()

    report = hydrator.once(f'schedds = ["{name}", "no-such-schedd@nowhere"]\n')

    jobs = report["jobs"]
    assert (jobs["seen"], jobs["edits"], jobs["failed_schedds"]) == (1, 1, 1)
    assert jobs["failed_schedd_names"] == ["no-such-schedd@nowhere"]
    assert report["summary"]["outcome"] == "ok"  # the ads' cycle is not failed by it
    assert "schedd no-such-schedd@nowhere" in hydrator.last_stderr


def daemon_jobs_config(pool: Pool, token_dir: Path) -> str:
    return (
        f'[collector]\nenabled = false\npool = "{pool.collector_address}"\n'
        f'token_dir = "{token_dir}"\n\n[jobs]\nannotate = true\n'
    )


@pytest.fixture
def daemon_dir(condor_pool: Pool, tmp_path: Path) -> Iterator[Daemon]:
    condor_pool.remove_all_jobs()
    d = Daemon(tmp_path)
    write_inventory(d.directory, E2E_INVENTORY)
    yield d
    d.stop()
    condor_pool.remove_all_jobs()


def test_demand_endpoint_and_metric_count_idle_jobs_per_site(
    condor_pool: Pool, editor_token: Path, daemon_dir: Daemon
) -> None:
    d = daemon_dir
    for required, count in (('{"ska:obs_1"}', 2), ('{"ska:skymodel_v3"}', 1), (NOWHERE, 1)):
        last = submit_idle(condor_pool, required, count)
    condor_pool.wait_for_job_state(last, [IDLE])
    start_static(d, daemon_jobs_config(condor_pool, editor_token))

    url = f"{d.url}/v1/demand"
    wait_for(
        "demand",
        lambda: requests.get(url, timeout=5).json()["jobs"],
        done=lambda got: got == 4,
        timeout_s=30.0,
        ignore=TRANSIENT,
    )
    answer = requests.get(url, timeout=5)
    assert answer.json()["sites"] == {
        "SITE_A": {"complete": 2, "partial": 0},
        "SITE_B": {"complete": 1, "partial": 0},
        "SITE_C": {"complete": 1, "partial": 0},
    }
    assert answer.json()["nowhere"] == 1
    etag = answer.headers["ETag"]
    again = requests.get(url, headers={"If-None-Match": etag}, timeout=5)
    assert (again.status_code, again.content) == (304, b"")
    at_a = ("hydrator_jobs_idle_data_bound_at_site", {"site": "SITE_A", "locality": "complete"})
    assert d.metric(at_a[0], **at_a[1]) == 2
    assert d.metric("hydrator_jobs_idle_data_nowhere") == 1


def test_an_identity_without_edit_rights_is_refused_counted_and_ads_still_served(
    condor_pool: Pool, daemon_dir: Daemon, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """``intruder@<UID_DOMAIN>`` authenticates but is no queue super user: every edit is
    refused; the daemon logs it once, counts it each cycle, and serves its ads."""
    d = daemon_dir
    cluster = submit_idle(condor_pool, '{"ska:obs_1"}')
    condor_pool.wait_for_job_state(cluster, [IDLE])
    intruder = condor_pool.token_dir_for("intruder", tmp_path_factory.mktemp("intruder"))
    start_static(d, daemon_jobs_config(condor_pool, intruder))

    refused = "hydrator_job_schedd_failures_total"
    wait_for(
        "3 refusals",
        lambda: (d.metric(refused, reason="refused") or 0) >= 3,
        timeout_s=30.0,
        ignore=TRANSIENT,
    )

    assert requests.get(f"{d.url}/v1/sites/SITE_A/classad", timeout=5).ok
    assert requests.get(f"{d.url}/v1/demand", timeout=5).json()["jobs"] == 1  # reads still work
    assert d.metric("hydrator_job_edits_total", outcome="ok") == 0
    assert annotated(jobs_of(condor_pool, [cluster])[0]) == (None, None)
    name = condor_pool.schedd_name()
    log = (d.directory / "daemon.log").read_text()
    assert log.count(f"schedd {name}: edit refused or failed") == 1  # once per change of state


def test_a_stopped_schedd_keeps_its_jobs_in_the_demand_until_it_is_back(
    condor_pool: Pool, editor_token: Path, daemon_dir: Daemon
) -> None:
    """The daemon remembers a schedd it has read: while the schedd is down (no collector ad,
    as when it restarts) it is counted as failed and its last good jobs stay in /v1/demand."""
    d, pool = daemon_dir, condor_pool
    cluster = submit_idle(pool, '{"ska:obs_1"}', count=2)
    pool.wait_for_job_state(cluster, [IDLE])
    start_static(d, daemon_jobs_config(pool, editor_token))
    url = f"{d.url}/v1/demand"
    wait_for(
        "demand",
        lambda: requests.get(url, timeout=5).json()["jobs"],
        done=lambda got: got == 2,
        timeout_s=30.0,
        ignore=TRANSIENT,
    )
    name = pool.schedd_name()

    pool.daemon_off("schedd")
    try:
        wait_for(
            "stale",
            lambda: requests.get(url, timeout=5).json()["stale_schedds"],
            done=lambda got: got == [name],
            timeout_s=30.0,
            ignore=TRANSIENT,
        )
        doc = requests.get(url, timeout=5).json()
        assert (doc["jobs"], doc["sites"]["SITE_A"]["complete"]) == (2, 2)  # not "no jobs"
        unavailable = "hydrator_job_schedd_failures_total"
        assert (d.metric(unavailable, reason="unavailable") or 0) >= 1
        assert requests.get(f"{d.url}/v1/sites/SITE_A/classad", timeout=5).ok
    finally:
        pool.daemon_on("schedd")
    wait_for(
        "fresh again",
        lambda: requests.get(url, timeout=5).json()["stale_schedds"],
        done=lambda got: got == [],
        timeout_s=60.0,
        ignore=TRANSIENT,
    )
    assert f"schedd {name}: job annotation works again" in (d.directory / "daemon.log").read_text()
