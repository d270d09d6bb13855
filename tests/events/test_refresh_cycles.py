"""Refresh cycles on the real stack (issue 24; docs/events.md): while events flow the scheduled
gate skips the full read and runs a refresh cycle instead, which reads the Rucio server's RSE
availability (one ``list_rses()``) and no dataset. Rucio sends no message when an RSE's
``availability_read`` changes: only the refresh cycle makes it leave the ads within one
scheduled interval (the reconcile interval is its default, 30 minutes)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from hydrator.domain import Site
from hydrator.runtime.events import start_events
from hydrator.runtime.report import site_json
from hydrator.runtime.wiring import build_service, event_listener
from tests.support.activemq import Broker
from tests.support.event_service import CALLS, EventService, daemon_config
from tests.support.rucio_server import RucioAdmin, RucioServer, unique
from tests.support.wait import wait_for

pytestmark = [pytest.mark.rucio, pytest.mark.activemq]
READS = ("list_datasets_per_rse", "list_dataset_replicas", "list_replicas")  # dataset reads


@pytest.fixture()
def stocked(
    rucio_server: RucioServer,
    rucio_admin: RucioAdmin,
    running_activemq: Broker,
    tmp_path: Path,
) -> Iterator[tuple[EventService, str, str]]:
    """A daemon's service with events on (reconcile interval 30 minutes) after its start-up
    full read of one dataset at its site's RSE and one at another site's."""
    tag = unique("rf").lower()
    site, attrs = f"SITE-RF-{tag}", {"fed": tag}
    dst = rucio_admin.rse(site, attributes=attrs)
    src = rucio_admin.rse(f"SITE-RS-{tag}", attributes=attrs)
    scope = rucio_admin.scope()
    here, there = rucio_admin.dataset(scope, 2, at=[dst]), rucio_admin.dataset(scope, 2, at=[src])
    rucio_admin.rule(scope, here, dst)
    rucio_admin.rule(scope, there, src)
    rucio_server.run_abacus()
    config = daemon_config(rucio_server, running_activemq, tmp_path, tag)
    service = build_service(config)
    gate = start_events(config, service, event_listener)
    assert gate is not None
    try:
        made = EventService(service, gate, site, dst, src, scope)
        wait_for(
            "subscribed",
            lambda: gate.cycles[0].status().connected,
            timeout_s=30.0,
            ignore=(requests.RequestException,),
        )
        gate()  # the start-up full read
        assert made.full_reads() == 1
        yield made, f"{scope}:{here}", f"{scope}:{there}"
    finally:
        gate.stop()
        service.close()
        rucio_admin.client.update_rse(dst, {"availability_read": True})


def doc(daemon: EventService, site: str) -> dict[str, Any]:
    """``/v1/sites/<site>`` as the daemon serves it."""
    return site_json(daemon.service.published.ads[Site(site)].view)


def test_an_rse_set_unavailable_leaves_the_ads_at_the_next_gate_without_a_full_read(
    stocked: tuple[EventService, str, str], rucio_admin: RucioAdmin
) -> None:
    daemon, here, there = stocked
    other = next(s for s in daemon.service.published.ads if s != Site(daemon.site))
    assert doc(daemon, daemon.site)["available"] == [here]
    assert doc(daemon, other)["available"] == [there]
    calls = {m: daemon.sample(CALLS, source="rucio", method=m) for m in READS}
    rses = daemon.sample(CALLS, source="rucio", method="list_rses")

    rucio_admin.client.update_rse(daemon.dst, {"availability_read": False})
    daemon.gate()  # the next scheduled run: the full read is not due, a refresh cycle runs
    reason = f"RSE {daemon.dst}: availability_read false"
    down = doc(daemon, daemon.site)
    assert down["available"] == [] and down["unavailable"] == [reason]
    ad = daemon.service.published.ads[Site(daemon.site)].body.decode()
    assert f'DataLocalityUnavailable = "{reason}"' in ad
    assert here not in ad
    assert doc(daemon, other)["available"] == [there], "the other site is untouched"

    rucio_admin.client.update_rse(daemon.dst, {"availability_read": True})
    daemon.gate()
    back = doc(daemon, daemon.site)
    assert back["available"] == [here] and back["unavailable"] == []
    assert (
        "DataLocalityUnavailable"
        not in daemon.service.published.ads[Site(daemon.site)].body.decode()
    )

    assert daemon.full_reads() == 1, "no full read: the refresh cycles read no dataset"
    assert daemon.sample("hydrator_full_reads_skipped_total") == 2
    assert daemon.sample("hydrator_refresh_cycles_total", outcome="ok") == 2
    assert daemon.sample(CALLS, source="rucio", method="list_rses") == rses + 2
    assert {m: daemon.sample(CALLS, source="rucio", method=m) for m in READS} == calls
