"""Refresh cycles on the real stack (docs/events.md): while events flow the scheduled
gate skips the full read and runs a refresh cycle instead, which reads the Rucio server's RSE
availability (one ``list_rses()``) and no dataset. Rucio sends no message when an RSE's
``availability_read`` changes: only the refresh cycle makes it leave the ads within one
scheduled interval (the reconcile interval is its default, 30 minutes)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests

from hydrator.domain import Site
from hydrator.runtime.json_views import site_json
from hydrator.runtime.wiring import build_assembly, event_listener, start_events
from tests.support.activemq import Broker
from tests.support.event_service import CALLS, EventService, daemon_config
from tests.support.rucio_server import RucioAdmin, RucioServer, unique
from tests.support.wait import wait_for

pytestmark = [pytest.mark.rucio, pytest.mark.activemq]
READS = ("list_datasets_per_rse", "list_dataset_replicas", "list_replicas")  # dataset reads


@dataclass
class Stocked:
    """The daemon, the second RSE of its site, and its datasets (``scope:name``): one at
    ``dst`` alone, one at both RSEs of the site, one at another site's RSE."""

    daemon: EventService
    dst2: str
    here: str
    both: str
    there: str


@pytest.fixture()
def stocked(
    rucio_server: RucioServer,
    rucio_admin: RucioAdmin,
    running_activemq: Broker,
    tmp_path: Path,
) -> Iterator[Stocked]:
    """A daemon's service with events on (reconcile interval 30 minutes) after its start-up
    full read (:class:`Stocked`)."""
    tag = unique("rf").lower()
    site, attrs = f"SITE-RF-{tag}", {"fed": tag}
    dst, dst2 = rucio_admin.rse(site, attributes=attrs), rucio_admin.rse(site, attributes=attrs)
    src = rucio_admin.rse(f"SITE-RS-{tag}", attributes=attrs)
    scope = rucio_admin.scope()
    placed = {"here": [dst], "both": [dst, dst2], "there": [src]}
    names = {key: rucio_admin.dataset(scope, 2, at=rses) for key, rses in placed.items()}
    for key, rses in placed.items():
        for rse in rses:
            rucio_admin.rule(scope, names[key], rse)
    rucio_server.run_abacus()
    config = daemon_config(rucio_server, running_activemq, tmp_path, tag)
    built = build_assembly(config)
    service, metrics = built.service, built.instruments.metrics
    gate = start_events(config, built, event_listener)
    assert gate is not None
    try:
        made = EventService(service, metrics, gate, site, dst, src, scope)
        wait_for(
            "subscribed",
            lambda: gate.cycles[0].status().connected,
            timeout_s=30.0,
            ignore=(requests.RequestException,),
        )
        gate()  # the start-up full read
        assert made.full_reads() == 1
        ids = {key: f"{scope}:{name}" for key, name in names.items()}
        yield Stocked(made, dst2, ids["here"], ids["both"], ids["there"])
    finally:
        gate.stop()
        service.close()
        for rse in (dst, dst2):
            rucio_admin.client.update_rse(rse, {"availability_read": True})


def doc(daemon: EventService, site: str) -> dict[str, Any]:
    """``/v1/sites/<site>`` as the daemon serves it."""
    return site_json(daemon.service.published.ads[Site(site)].view)


def test_a_site_whose_rses_are_set_unavailable_leaves_the_ads_at_the_next_gate_without_a_full_read(
    stocked: Stocked, rucio_admin: RucioAdmin
) -> None:
    daemon = stocked.daemon
    other = next(s for s in daemon.service.published.ads if s != Site(daemon.site))
    assert doc(daemon, daemon.site)["available"] == sorted([stocked.here, stocked.both])
    assert doc(daemon, other)["available"] == [stocked.there]
    calls = {m: daemon.sample(CALLS, source="rucio", method=m) for m in READS}
    rses = daemon.sample(CALLS, source="rucio", method="list_rses")

    for rse in (daemon.dst, stocked.dst2):
        rucio_admin.client.update_rse(rse, {"availability_read": False})
    daemon.gate()  # the next scheduled run: the full read is not due, a refresh cycle runs
    reasons = sorted(f"RSE {r}: availability_read false" for r in (daemon.dst, stocked.dst2))
    down = doc(daemon, daemon.site)
    assert down["available"] == [] and down["unavailable"] == reasons
    ad = daemon.service.published.ads[Site(daemon.site)].body.decode()
    assert "DataLocalityUnavailable = " in ad and reasons[0] in ad
    assert stocked.here not in ad and stocked.both not in ad
    assert doc(daemon, other)["available"] == [stocked.there], "the other site is untouched"

    for rse in (daemon.dst, stocked.dst2):
        rucio_admin.client.update_rse(rse, {"availability_read": True})
    daemon.gate()
    back = doc(daemon, daemon.site)
    assert back["available"] == sorted([stocked.here, stocked.both])
    assert back["unavailable"] == []
    body = daemon.service.published.ads[Site(daemon.site)].body.decode()
    assert "DataLocalityUnavailable" not in body

    assert daemon.full_reads() == 1, "no full read: the refresh cycles read no dataset"
    assert daemon.sample("hydrator_full_reads_skipped_total") == 2
    assert daemon.sample("hydrator_refresh_cycles_total", outcome="ok") == 2
    assert daemon.sample(CALLS, source="rucio", method="list_rses") == rses + 2
    assert {m: daemon.sample(CALLS, source="rucio", method=m) for m in READS} == calls


def test_one_rse_of_two_set_unavailable_makes_the_refresh_run_a_full_read_at_once(
    stocked: Stocked, rucio_admin: RucioAdmin
) -> None:
    """Which datasets the other RSE also holds only a full read says: it follows the refresh
    cycle in the same scheduled run; so does the RSE's return (the full read while it was
    down took its datasets out of the state)."""
    daemon = stocked.daemon
    rucio_admin.client.update_rse(daemon.dst, {"availability_read": False})
    daemon.gate()
    assert daemon.full_reads() == 2
    down = doc(daemon, daemon.site)
    assert down["available"] == [stocked.both], "also at the other RSE: stays"
    assert down["unavailable"] == [f"RSE {daemon.dst}: availability_read false"]
    daemon.gate()  # nothing changed: a refresh cycle alone
    assert daemon.full_reads() == 2

    rucio_admin.client.update_rse(daemon.dst, {"availability_read": True})
    daemon.gate()
    assert daemon.full_reads() == 3
    assert doc(daemon, daemon.site)["available"] == sorted([stocked.here, stocked.both])
    assert daemon.sample("hydrator_refresh_cycles_total", outcome="ok") == 3
    assert daemon.sample("hydrator_full_reads_skipped_total") == 1
