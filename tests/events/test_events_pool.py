"""The whole chain on the real parts, once: a rule's last lock goes OK on the Rucio server, its
own hermes sends ``datasetlock_ok`` to ActiveMQ, ``hydrator run`` hears it, re-reads that
dataset and merges it into the slot ads of the real pool's collector, while its scheduled full
read is 10 minutes away. The pool is shared and locked: run this file alone."""

from __future__ import annotations

import time
from collections.abc import Iterator

import classad2
import pytest
import requests

from tests.support.hermes import EventDaemon, Hermes
from tests.support.pool import SLOT_SITES, Pool
from tests.support.rucio_server import RucioAdmin
from tests.support.wait import wait_for

pytestmark = [pytest.mark.pool, pytest.mark.rucio, pytest.mark.activemq, pytest.mark.slow]


@pytest.fixture()
def daemon_site() -> str:
    assert SLOT_SITES["slot1"] == "SITE_A"
    return "SITE_A"


@pytest.fixture()
def daemon_extra_config(condor_pool: Pool) -> Iterator[str]:
    yield (
        f'\n[collector]\nenabled = true\npool = "{condor_pool.collector_address}"\n'
        f'token_dir = "{condor_pool.token_dir}"\nrefresh_s = 600\nmerge_min_interval_s = 0\n'
    )
    invalidate = classad2.ClassAd({"MyType": "Query", "TargetType": "DataLocality"})
    invalidate["Requirements"] = classad2.ExprTree('MyType == "DataLocality"')
    condor_pool.advertise([invalidate], "INVALIDATE_ADS_GENERIC")


def slot1_available(pool: Pool) -> list[str]:
    ads = [ad for ad in pool.slot_ads(["AvailableDatasets"]) if ad["Name"].startswith("slot1@")]
    value = ads[0].get("AvailableDatasets") if ads else None
    return list(value) if value is not None else []


def test_a_lock_ok_reaches_the_slot_ads_through_the_stream(
    running: EventDaemon,
    rucio_admin: RucioAdmin,
    hermes: Hermes,
    condor_pool: Pool,
) -> None:
    running.wait_subscribed()
    did = running.lock_ok(rucio_admin)
    sent = time.monotonic()
    hermes.run_once()
    wait_for(
        "the dataset in slot1's ad",
        lambda: did in slot1_available(condor_pool),
        timeout_s=30.0,
        ignore=(requests.RequestException,),
    )
    took = time.monotonic() - sent
    print(f"hermes run to slot ad: {took:.1f} s (hermes --run-once itself included)")
    assert took < 20, took
