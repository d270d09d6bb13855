"""End to end on the real pool: ``hydrator run`` serves site ClassAds, the execute-node hook puts
them into slot ads as a STARTD_CRON job, and the negotiator sends jobs to their data.

The hook runs once per site (tests/support/pool_hook.py).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.support.daemon import Daemon
from tests.support.pool import COMPLETED, IDLE, SLOT_SITES, Pool
from tests.support.pool_hook import HOOK_PERIOD_S, install_hook, remove_hook, restart_startd
from tests.support.static_inventory import (
    CYCLE_S,
    INVENTORY,
    SITES,
    TRANSIENT,
    expressions,
    start_static,
    write_inventory,
)
from tests.support.wait import wait_for

pytestmark = [pytest.mark.pool, pytest.mark.slow]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = Daemon(tmp_path_factory.mktemp("hydrator"))
    write_inventory(d.directory, INVENTORY)
    start_static(d)
    yield d
    d.stop()


@pytest.fixture(scope="module")
def hooked_pool(condor_pool: Pool, daemon: Daemon) -> Iterator[Pool]:
    """The pool with the hook installed as STARTD_CRON jobs pointing at the daemon."""
    install_hook(condor_pool, daemon.url)
    yield condor_pool
    remove_hook(condor_pool)
    restart_startd(condor_pool)  # drop the hook's attributes from the slot ads


def available_by_slot(pool: Pool) -> dict[str, list[str] | None]:
    ads = pool.slot_ads(["AvailableDatasets"], constraint='SlotType != "Dynamic"')
    return {str(ad["Name"]).split("@")[0]: ad.get("AvailableDatasets") for ad in ads}


def wait_lists(what: str, pool: Pool, want: dict[str, list[str]], timeout_s: float) -> None:
    """Until the static slots' AvailableDatasets are ``want`` (see :func:`available_by_slot`)."""
    wait_for(
        what,
        lambda: available_by_slot(pool),
        done=lambda got: got == want,
        timeout_s=timeout_s,
        ignore=TRANSIENT,
    )


def expected_by_slot(inventory: dict[str, list[str]]) -> dict[str, list[str]]:
    by_site = {SITES[e]: sorted(names) for e, names in inventory.items()}
    return {slot: by_site.get(site, []) for slot, site in SLOT_SITES.items()}


def job(*datasets: str, generic: bool = False) -> str:
    return (
        "executable = /bin/true\noutput = /dev/null\nerror = /dev/null\n"
        + expressions(*datasets, generic=generic)
        + "queue\n"
    )


def test_hook_puts_each_sites_lists_into_that_sites_slots(hooked_pool: Pool) -> None:
    want = expected_by_slot(INVENTORY)
    started = time.monotonic()
    wait_lists("hook attributes", hooked_pool, want, timeout_s=30.0)
    took = time.monotonic() - started
    print(f"site lists in the slot ads {took:.1f}s after installing the hook")

    def every_slot_has_its_site() -> bool:  # dynamic slots too, also one left by an earlier job
        ads = hooked_pool.slot_ads(["DataLocalitySite", "DataLocalityUpdated"])
        return all(
            ad.get("DataLocalitySite") == ad["GLIDEIN_Site"]
            and ad.get("DataLocalityUpdated", 0) > time.time() - 600
            for ad in ads
        )

    wait_for(
        "every slot's DataLocalitySite", every_slot_has_its_site, timeout_s=30.0, ignore=TRANSIENT
    )


def test_jobs_run_only_where_their_data_is(hooked_pool: Pool) -> None:
    pool = hooked_pool
    want = expected_by_slot(INVENTORY)
    wait_lists("hook attributes", pool, want, timeout_s=30.0)
    at_b = pool.submit(job("ska:obs_2"))
    at_c = pool.submit(job("ska:obs_3", "ska:skymodel_v3"))
    # the same test driven by the job's own RequiredDatasets (stringListSubsetMatch)
    generic_at_b = pool.submit(job("ska:skymodel_v3", "ska:obs_2", generic=True))
    nowhere = pool.submit(job("ska:obs_2", "ska:obs_3"))  # no site holds both
    generic_nowhere = pool.submit(job("ska:obs_1", "ska:obs_3", generic=True))
    assert pool.job_site(pool.wait_for_job_state(at_b, [COMPLETED])) == "SITE_B"
    assert pool.job_site(pool.wait_for_job_state(at_c, [COMPLETED])) == "SITE_C"
    assert pool.job_site(pool.wait_for_job_state(generic_at_b, [COMPLETED])) == "SITE_B"
    time.sleep(6)  # more negotiation cycles (5 s): they still match nothing
    for cluster in (nowhere, generic_nowhere):
        ad = pool.job_ad(cluster)
        assert ad is not None and ad["JobStatus"] == IDLE
        pool.run_in_chroot(["condor_rm", str(cluster)], user="submitter")


def test_attributes_and_jobs_follow_a_data_change(hooked_pool: Pool, daemon: Daemon) -> None:
    pool = hooked_pool
    changed = dict(INVENTORY, A_DISK=["ska:obs_1", "ska:obs_new"])
    write_inventory(daemon.directory, changed)
    try:
        started = time.monotonic()
        want = expected_by_slot(changed)
        wait_lists("changed lists", pool, want, timeout_s=20.0)
        took = time.monotonic() - started
        print(f"data change reached the slot ads in {took:.1f}s")
        assert took < CYCLE_S + HOOK_PERIOD_S + 5  # one cycle + one hook period + updates
        new = pool.submit(job("ska:obs_new"))
        assert pool.job_site(pool.wait_for_job_state(new, [COMPLETED])) == "SITE_A"
    finally:
        write_inventory(daemon.directory, INVENTORY)
    want = expected_by_slot(INVENTORY)
    wait_lists("lists restored", pool, want, timeout_s=30.0)


def test_hydrator_stopped_slots_keep_their_last_values(hooked_pool: Pool, daemon: Daemon) -> None:
    pool = hooked_pool
    want = expected_by_slot(INVENTORY)
    wait_lists("hook attributes", pool, want, timeout_s=30.0)
    daemon.stop()
    try:
        time.sleep(2 * HOOK_PERIOD_S + 1)  # the hook has failed to fetch at least twice
        assert available_by_slot(pool) == want
        restart_startd(pool)  # even a new startd gets them back, from the hook's disk copy
        wait_lists("values from the hook's copy", pool, want, timeout_s=20.0)
        at_b = pool.submit(job("ska:skymodel_v3", "ska:obs_2"))
        assert pool.job_site(pool.wait_for_job_state(at_b, [COMPLETED])) == "SITE_B"
    finally:
        start_static(daemon)
