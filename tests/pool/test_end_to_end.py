"""End to end on the real pool: ``hydrator run`` serves site ClassAds, the execute-node hook puts
them into slot ads as a STARTD_CRON job, and the negotiator sends jobs to their data.

The hook runs once per site (tests/support/pool_hook.py).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import htcondor2
import pytest
import requests

from tests.support.pool import COMPLETED, IDLE, SLOT_SITES, Pool
from tests.support.pool_hook import HOOK_PERIOD_S, install_hook, remove_hook, restart_startd

pytestmark = [pytest.mark.pool, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
CYCLE_S = 1
INVENTORY = {
    "A_DISK": ["ska:obs_1"],
    "B_DISK": ["ska:obs_2", "ska:skymodel_v3"],
    "C_DISK": ["ska:obs_3", "ska:skymodel_v3"],
}
SITES = {"A_DISK": "SITE_A", "B_DISK": "SITE_B", "C_DISK": "SITE_C"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(what: str, predicate: Callable[[], bool], timeout_s: float = 30.0) -> float:
    """Seconds until ``predicate()`` held; AssertionError naming ``what`` after ``timeout_s``."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        try:
            if predicate():
                return time.monotonic() - started
        except (requests.RequestException, htcondor2.HTCondorException):
            pass
        time.sleep(0.25)
    raise AssertionError(f"{what}: not within {timeout_s}s")


@dataclass
class Daemon:
    """``hydrator run`` on a static inventory, as a subprocess."""

    directory: Path
    port: int
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def write_inventory(self, inventory: dict[str, list[str]]) -> None:
        text = "".join(
            f"[storage.{e}]\navailable = {names!r}\n\n" for e, names in inventory.items()
        )
        path = self.directory / "inventory.toml"
        path.with_suffix(".tmp").write_text(text.replace("'", '"'))
        path.with_suffix(".tmp").replace(path)  # the daemon never reads half a file

    def write_config(self, extra: str = "") -> Path:
        sites = "".join(f'{e} = "{s}"\n' for e, s in SITES.items())
        config = self.directory / "hydrator.toml"
        config.write_text(
            f'[daemon]\ninterval_s = {CYCLE_S}\njitter_s = 0\nstate_path = "state.sqlite"\n\n'
            f'[http]\nlisten = "127.0.0.1:{self.port}"\nmax_age_s = 1\n\n'
            '[[sources]]\ntype = "static"\nname = "inventory"\npath = "inventory.toml"\n'
            "settle_s = 0\n\n"  # write_inventory renames a complete file into place
            f"[sites]\n{sites}\n[classad]\nupdated_resolution_s = 1\n\n{extra}"
        )
        return config

    def start_publishing(self, pool: Pool, merge_min_interval_s: int = 0) -> None:
        """Start with the collector publisher on ``pool`` (refresh slow enough for tests;
        changed slots re-merged every cycle unless ``merge_min_interval_s`` is given)."""
        self.start(
            f'[collector]\nenabled = true\npool = "{pool.collector_address}"\n'
            f'token_dir = "{pool.token_dir}"\nrefresh_s = 600\n'
            f"merge_min_interval_s = {merge_min_interval_s}\n"
        )

    def start(self, extra_config: str = "") -> None:
        config = self.write_config(extra_config)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "hydrator", "run", "--config", str(config)],
            stdout=subprocess.DEVNULL,
            stderr=open(self.directory / "daemon.log", "ab"),  # noqa: SIM115
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        wait_for("daemon ready", lambda: requests.get(f"{self.url}/readyz", timeout=2).ok)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = Daemon(tmp_path_factory.mktemp("hydrator"), free_port())
    d.write_inventory(INVENTORY)
    d.start()
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


def expected_by_slot(inventory: dict[str, list[str]]) -> dict[str, list[str]]:
    by_site = {SITES[e]: sorted(names) for e, names in inventory.items()}
    return {slot: by_site.get(site, []) for slot, site in SLOT_SITES.items()}


def expressions(*datasets: str, generic: bool = False) -> str:
    """The submit lines ``hydrator expr`` prints (RequiredDatasets, requirements, rank)."""
    return subprocess.run(
        [sys.executable, "-m", "hydrator", "expr", *datasets, *(["--generic"] if generic else [])],
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def job(*datasets: str, generic: bool = False) -> str:
    return (
        "executable = /bin/true\noutput = /dev/null\nerror = /dev/null\n"
        + expressions(*datasets, generic=generic)
        + "queue\n"
    )


def test_hook_puts_each_sites_lists_into_that_sites_slots(hooked_pool: Pool) -> None:
    want = expected_by_slot(INVENTORY)
    took = wait_for("hook attributes", lambda: available_by_slot(hooked_pool) == want)
    print(f"site lists in the slot ads {took:.1f}s after installing the hook")

    def every_slot_has_its_site() -> bool:  # dynamic slots too, also one left by an earlier job
        ads = hooked_pool.slot_ads(["DataLocalitySite", "DataLocalityUpdated"])
        return all(
            ad.get("DataLocalitySite") == ad["GLIDEIN_Site"]
            and ad.get("DataLocalityUpdated", 0) > time.time() - 600
            for ad in ads
        )

    wait_for("every slot's DataLocalitySite", every_slot_has_its_site)


def test_jobs_run_only_where_their_data_is(hooked_pool: Pool) -> None:
    pool = hooked_pool
    wait_for("hook attributes", lambda: available_by_slot(pool) == expected_by_slot(INVENTORY))
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
    daemon.write_inventory(changed)
    try:
        took = wait_for(
            "changed lists", lambda: available_by_slot(pool) == expected_by_slot(changed), 20
        )
        print(f"data change reached the slot ads in {took:.1f}s")
        assert took < CYCLE_S + HOOK_PERIOD_S + 5  # one cycle + one hook period + updates
        new = pool.submit(job("ska:obs_new"))
        assert pool.job_site(pool.wait_for_job_state(new, [COMPLETED])) == "SITE_A"
    finally:
        daemon.write_inventory(INVENTORY)
    wait_for("lists restored", lambda: available_by_slot(pool) == expected_by_slot(INVENTORY))


def test_hydrator_stopped_slots_keep_their_last_values(hooked_pool: Pool, daemon: Daemon) -> None:
    pool = hooked_pool
    want = expected_by_slot(INVENTORY)
    wait_for("hook attributes", lambda: available_by_slot(pool) == want)
    daemon.stop()
    try:
        time.sleep(2 * HOOK_PERIOD_S + 1)  # the hook has failed to fetch at least twice
        assert available_by_slot(pool) == want
        restart_startd(pool)  # even a new startd gets them back, from the hook's disk copy
        wait_for("values from the hook's copy", lambda: available_by_slot(pool) == want, 20)
        at_b = pool.submit(job("ska:skymodel_v3", "ska:obs_2"))
        assert pool.job_site(pool.wait_for_job_state(at_b, [COMPLETED])) == "SITE_B"
    finally:
        daemon.start()
