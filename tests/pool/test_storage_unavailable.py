"""Storage that cannot serve, on the real pool: ``hydrator run`` merging into slot
ads and annotating idle jobs; a storage element drained with ``hydrator drain`` (and one its
catalogue states unavailable) takes its data out of the slot ads, the job annotation and
``/v1/demand`` within a cycle, ``DataLocalityUnavailable`` says why, and all comes back (the
attribute back to "") when the storage is back."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.pool.annotating import annotated, jobs_of, submit_idle
from tests.support.daemon import Daemon
from tests.support.pool import IDLE, SLOT_SITES, Pool
from tests.support.static_inventory import TRANSIENT, invalidate_site_ads, start_static
from tests.support.wait import wait_for

pytestmark = [pytest.mark.pool, pytest.mark.slow]

INVENTORY = """\
[storage.A_DISK]
available = ["ska:obs_1"]

[storage.A_SCRATCH]
site = "SITE_A"
available = ["ska:obs_s"]

[storage.B_DISK]
available = ["ska:obs_2"]
{b_state}
[storage.C_DISK]
available = ["ska:obs_3"]
"""
DRAINED = "storage A_SCRATCH: drained by the operator: disk swap"


def write(d: Daemon, b_state: str = "") -> None:
    path = d.directory / "inventory.toml"
    path.with_suffix(".tmp").write_text(INVENTORY.format(b_state=b_state))
    path.with_suffix(".tmp").replace(path)


def slot(pool: Pool, name: str) -> dict[str, Any]:
    attrs = ["AvailableDatasets", "DataLocalityUnavailable"]
    ads = [ad for ad in pool.slot_ads(attrs) if ad["Name"].startswith(f"{name}@")]
    if not ads:
        return {}
    ad = ads[0]
    value = ad.get("AvailableDatasets")
    return {
        "available": None if value is None else list(value),
        "unavailable": ad.get("DataLocalityUnavailable"),
    }


def hydrator(d: Daemon, *args: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "hydrator", *args, "--config", str(d.directory / "hydrator.toml")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr


@pytest.fixture
def daemon(condor_pool: Pool, tmp_path: Path) -> Iterator[Daemon]:
    condor_pool.remove_all_jobs()
    d = Daemon(tmp_path)
    write(d)
    yield d
    d.stop()
    invalidate_site_ads(condor_pool)
    condor_pool.remove_all_jobs()


def test_unavailable_storage_leaves_slot_ads_job_annotation_and_demand(
    condor_pool: Pool, daemon: Daemon
) -> None:
    pool, d = condor_pool, daemon
    assert SLOT_SITES["slot1"] == "SITE_A" and SLOT_SITES["slot2"] == "SITE_B"
    job = submit_idle(pool, '{"ska:obs_s"}')
    pool.wait_for_job_state(job, [IDLE])
    start_static(
        d,
        f'[collector]\nenabled = true\npool = "{pool.collector_address}"\n'
        f'token_dir = "{pool.token_dir}"\nrefresh_s = 600\nmerge_min_interval_s = 0\n\n'
        "[jobs]\nannotate = true\n",
    )
    demand = f"{d.url}/v1/demand"

    def at_a() -> dict[str, int]:
        sites: dict[str, dict[str, int]] = requests.get(demand, timeout=5).json()["sites"]
        return sites.get("SITE_A", {})

    wait_for(
        "SITE_A's slot lists A_SCRATCH's dataset",
        lambda: slot(pool, "slot1"),
        done=lambda got: got == {"available": ["ska:obs_1", "ska:obs_s"], "unavailable": ""},
        timeout_s=30.0,
        ignore=TRANSIENT,
    )
    wait_for(
        "the job sent to SITE_A",
        lambda: annotated(jobs_of(pool, [job])[0])[0],
        done=lambda got: got == ["SITE_A"],
        timeout_s=30.0,
        ignore=TRANSIENT,
    )
    wait_for(
        "demand at SITE_A",
        lambda: at_a().get("complete"),
        done=lambda got: got == 1,
        timeout_s=30.0,
        ignore=TRANSIENT,
    )

    hydrator(d, "drain", "SITE_A", "--storage", "A_SCRATCH", "--reason", "disk swap")
    started = time.monotonic()
    wait_for(
        "A_SCRATCH's dataset out of the slot ad, with the reason",
        lambda: slot(pool, "slot1"),
        done=lambda got: got == {"available": ["ska:obs_1"], "unavailable": DRAINED},
        timeout_s=30.0,
        ignore=TRANSIENT,
    )
    took = time.monotonic() - started
    print(f"drain reached the slot ad in {took:.1f}s")
    wait_for(
        "the job no longer sent there",
        lambda: annotated(jobs_of(pool, [job])[0])[0],
        done=lambda got: got == [],
        timeout_s=30.0,
        ignore=TRANSIENT,
    )
    wait_for(
        "no demand at SITE_A",
        lambda: at_a().get("complete"),
        done=lambda got: got == 0,
        timeout_s=30.0,
        ignore=TRANSIENT,
    )
    assert requests.get(demand, timeout=5).json()["nowhere"] == 1
    # SITE_B keeps its list (a single sample may fall between a startd's update, which wipes
    # the merge, and the repair watch's next look: wait for the look, not for a change)
    wait_for(
        "SITE_B's slot still lists its dataset",
        lambda: slot(pool, "slot2"),
        done=lambda got: got == {"available": ["ska:obs_2"], "unavailable": ""},
        timeout_s=10.0,
        ignore=TRANSIENT,
    )

    hydrator(d, "undrain", "SITE_A", "--storage", "A_SCRATCH")
    wait_for(
        "back, and the reason cleared in the slot ad",
        lambda: slot(pool, "slot1"),
        done=lambda got: got == {"available": ["ska:obs_1", "ska:obs_s"], "unavailable": ""},
        timeout_s=30.0,
        ignore=TRANSIENT,
    )
    wait_for(
        "the job sent to SITE_A again",
        lambda: annotated(jobs_of(pool, [job])[0])[0],
        done=lambda got: got == ["SITE_A"],
        timeout_s=30.0,
        ignore=TRANSIENT,
    )

    write(d, 'unavailable = "controller replaced"\n')  # the catalogue says so
    wait_for(
        "B_DISK's data out of SITE_B's slot",
        lambda: slot(pool, "slot2"),
        done=lambda got: (
            got == {"available": [], "unavailable": "storage B_DISK: controller replaced"}
        ),
        timeout_s=30.0,
        ignore=TRANSIENT,
    )
