"""Presence and transfer as two facts, through the daemon's cycle on a real Rucio server.

Each test has its own site X with two disk RSEs (x1, x2) and a source RSE at another site, so
the published lists and the per-site metrics are exactly what the scenario makes. Rules go
STUCK through the public API (:meth:`RucioAdmin.make_stuck`: ``update_replicas_states`` with
state U, which runs the server's failed-transfer handling); files arrive with state A.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from hydrator.adapters.sources.rucio import RucioSource
from hydrator.config import parse_config
from hydrator.core.ports import FetchContext
from hydrator.domain import ReplicaState, Site, Transfer
from hydrator.runtime.json_views import site_json
from hydrator.runtime.metrics import Metrics
from hydrator.runtime.service import Service
from hydrator.runtime.wiring import build_service
from tests.support.rucio_server import RucioAdmin, RucioServer, source_config, unique

pytestmark = pytest.mark.rucio


@dataclass(frozen=True)
class Place:
    site: str
    x1: str
    x2: str
    src: str
    scope: str
    expression: str


@pytest.fixture()
def place(rucio_admin: RucioAdmin) -> Place:
    tag = unique("p").lower()
    site, attributes = f"SITE-X-{tag}", {"fed": tag}
    return Place(
        site=site,
        x1=rucio_admin.rse(site, attributes=attributes),
        x2=rucio_admin.rse(site, attributes=attributes),
        src=rucio_admin.rse(f"SITE-S-{tag}", attributes=attributes),
        scope=rucio_admin.scope(),
        expression=f"rse_type=DISK&fed={tag}",
    )


Cycle = Callable[[], Service]


@pytest.fixture()
def cycle(
    rucio_server: RucioServer, place: Place, tmp_path: Path, metrics: Metrics
) -> Iterator[Cycle]:
    """Run one daemon cycle (the same service each call, reporting to ``metrics``) and
    return the service."""
    config = parse_config(
        {
            "daemon": {"state_path": str(tmp_path / "state.sqlite")},
            "sources": [
                source_config(rucio_server, rse_expression=place.expression).model_dump(
                    mode="json", exclude_none=True
                )
            ],
            "classad": {"advertise_stuck": True},
        },
        tmp_path,
    )
    service = build_service(config, metrics)

    def run() -> Service:
        report = service.run_cycle()
        assert report.outcome == "ok", report
        return service

    yield run
    service.close()


def lists(service: Service, site: str) -> tuple[list[str], list[str], list[str]]:
    """The three advertised lists of the site's ad."""
    v = service.published.ads[Site(site)].view
    return (
        [str(d) for d in v.available],
        [str(d) for d, _ in v.partial],
        [str(d) for d, _ in v.replicating],
    )


def numbers(metrics: Metrics, site: str) -> dict[str, float | None]:
    """hydrator_datasets{state} and hydrator_transfers{state} of the site."""
    m = metrics.registry.get_sample_value
    out = {
        state: m("hydrator_datasets", {"site": site, "state": state})
        for state in ("available", "partial", "replicating", "stuck")
    }
    for state in ("replicating", "stuck"):
        out[f"transfers_{state}"] = m("hydrator_transfers", {"site": site, "state": state})
    return out


def expect(
    available: int = 0,
    partial: int = 0,
    replicating: int = 0,
    stuck: int = 0,
    moving: int = 0,
    stuck_transfers: int = 0,
) -> dict[str, float]:
    return {
        "available": available,
        "partial": partial,
        "replicating": replicating,
        "stuck": stuck,
        "transfers_replicating": moving,
        "transfers_stuck": stuck_transfers,
    }


def detail(service: Service, site: str) -> dict[str, Any]:
    return site_json(service.published.ads[Site(site)].view)


def ad_line(service: Service, site: str, attribute: str) -> str:
    body = service.published.ads[Site(site)].body.decode()
    return next(line for line in body.splitlines() if line.startswith(f"{attribute} ="))


def placed(admin: RucioAdmin, place: Place, files: int) -> tuple[str, str, list[str]]:
    """A dataset of ``files`` files complete at the source RSE with its rule there:
    (``scope:name``, name, file names)."""
    name = admin.dataset(place.scope, files, at=[place.src])
    admin.rule(place.scope, name, place.src)
    return f"{place.scope}:{name}", name, admin.files(place.scope, name)


def partial_and_stuck(admin: RucioAdmin, place: Place) -> str:
    """Two of three files arrived at x1, the third one's transfer failed: the rule is STUCK."""
    did, name, files = placed(admin, place, 3)
    rule = admin.rule(place.scope, name, place.x1)
    admin.set_file_states(place.x1, place.scope, files[:2], "A")
    admin.make_stuck(rule)
    return did


def test_partial_and_stuck_is_advertised_as_partial(
    metrics: Metrics, rucio_admin: RucioAdmin, place: Place, cycle: Cycle
) -> None:
    did = partial_and_stuck(rucio_admin, place)
    service = cycle()
    assert lists(service, place.site) == ([], [did], [])
    assert numbers(metrics, place.site) == expect(partial=1, stuck_transfers=1)
    shown = detail(service, place.site)
    assert shown["partial"] == [
        {"dataset": did, "fraction": 2 / 3, "bytes_fraction": 2 / 3, "transfer": "stuck"}
    ]
    assert shown["stuck"] == [did]
    assert ad_line(service, place.site, "PartialDatasets") == f'PartialDatasets = {{ "{did}" }}'
    assert ad_line(service, place.site, "StuckDatasets") == f'StuckDatasets = {{ "{did}" }}'


def test_partial_and_replicating_is_advertised_as_partial(
    metrics: Metrics, rucio_admin: RucioAdmin, place: Place, cycle: Cycle
) -> None:
    did, name, files = placed(rucio_admin, place, 3)
    rucio_admin.rule(place.scope, name, place.x1)
    rucio_admin.set_file_states(place.x1, place.scope, files[:1], "A")
    service = cycle()
    assert lists(service, place.site) == ([], [did], [])
    assert numbers(metrics, place.site) == expect(partial=1, moving=1)
    shown = detail(service, place.site)
    assert shown["partial"][0]["transfer"] == "replicating"
    assert shown["incoming"] == [{"dataset": did, "progress": 1 / 3}]
    assert shown["stuck"] == []


def test_complete_at_one_rse_while_replicating_to_another_of_the_site(
    metrics: Metrics, rucio_admin: RucioAdmin, place: Place, cycle: Cycle
) -> None:
    name = rucio_admin.dataset(place.scope, 2, at=[place.x1])
    did = f"{place.scope}:{name}"
    rucio_admin.rule(place.scope, name, place.x1)
    rucio_admin.rule(place.scope, name, place.x2)  # its files stay COPYING: REPLICATING
    service = cycle()
    assert lists(service, place.site) == ([did], [], [])
    assert numbers(metrics, place.site) == expect(available=1, moving=1)
    assert detail(service, place.site)["incoming"] == [{"dataset": did, "progress": 0.0}]


def test_files_spread_over_two_rses_of_a_site_make_it_complete(
    metrics: Metrics, rucio_admin: RucioAdmin, place: Place, cycle: Cycle
) -> None:
    client, scope = rucio_admin.client, place.scope
    name = unique("spread")
    client.add_dataset(scope, name)
    dids = [
        {"scope": scope, "name": f"{name}.f{i}", "bytes": 100 * (i + 1), "adler32": "0cc737eb"}
        for i in range(4)
    ]
    client.add_replicas(place.x1, [dict(d, state="A") for d in dids[:2]])
    client.add_replicas(place.x2, [dict(d, state="A") for d in dids[2:]])
    client.attach_dids(scope, name, [{"scope": scope, "name": d["name"]} for d in dids])
    # grouping NONE: each file locked where it already is, the rule is OK at once
    rucio_admin.rule(scope, name, f"{place.x1}|{place.x2}", grouping="NONE")
    rucio_admin.server.run_abacus()  # the summary now says 2 of 4 files at each RSE
    service = cycle()
    did = f"{scope}:{name}"
    assert lists(service, place.site) == ([did], [], [])
    assert numbers(metrics, place.site) == expect(available=1)
    calls = metrics.registry.get_sample_value(
        "hydrator_source_api_calls_total", {"source": "rucio", "method": "list_replicas"}
    )
    assert calls == 1  # the file-level union: one call for the dataset


def test_stuck_with_no_file_present_is_reported_not_advertised(
    metrics: Metrics, rucio_admin: RucioAdmin, place: Place, cycle: Cycle
) -> None:
    did, name, _ = placed(rucio_admin, place, 2)
    rucio_admin.make_stuck(rucio_admin.rule(place.scope, name, place.x1))
    service = cycle()
    assert lists(service, place.site) == ([], [], [])
    assert numbers(metrics, place.site) == expect(stuck=1, stuck_transfers=1)
    assert detail(service, place.site)["stuck"] == [did]
    assert ad_line(service, place.site, "StuckDatasets") == f'StuckDatasets = {{ "{did}" }}'


def test_a_stuck_rule_that_recovers(
    metrics: Metrics, rucio_admin: RucioAdmin, place: Place, cycle: Cycle
) -> None:
    did, name, files = placed(rucio_admin, place, 2)
    rule = rucio_admin.rule(place.scope, name, place.x1)
    rucio_admin.make_stuck(rule)
    service = cycle()
    assert lists(service, place.site) == ([], [], [])
    assert numbers(metrics, place.site) == expect(stuck=1, stuck_transfers=1)

    rucio_admin.set_file_states(place.x1, place.scope, files[:1], "A")  # one retry succeeded
    service = cycle()
    assert lists(service, place.site) == ([], [did], [])
    assert numbers(metrics, place.site) == expect(partial=1, stuck_transfers=1)

    rucio_admin.set_file_states(place.x1, place.scope, files[1:], "A")
    assert rucio_admin.rule_info(rule)["state"] == "STUCK"  # until the judge looks again
    service = cycle()
    assert lists(service, place.site) == ([did], [], [])
    assert numbers(metrics, place.site) == expect(available=1)  # every lock OK: no transfer
    assert ad_line(service, place.site, "StuckDatasets") == "StuckDatasets = {  }"

    rucio_admin.repair()
    assert rucio_admin.rule_info(rule)["state"] == "OK"
    report = service.run_cycle()
    assert report.plan is not None and report.plan.changes == ()
    assert lists(service, place.site) == ([did], [], [])


def test_over_the_deep_check_limit_the_locks_of_a_rule_show_the_files_present(
    rucio_admin: RucioAdmin, rucio_server: RucioServer, place: Place
) -> None:
    did = partial_and_stuck(rucio_admin, place)
    scope, name = did.split(":")
    rucio_admin.rule(scope, name, place.x2)  # a second rule: x1's locks alone no longer settle it
    config = source_config(rucio_server, rse_expression=place.expression, deep_check_limit=0)
    source = RucioSource(config, {})
    try:
        snapshot = source.fetch(FetchContext(now=datetime.now(UTC)))
    finally:
        source.close()
    found = {(r.site, str(r.dataset)): r for r in snapshot.replicas}[(Site(place.site), did)]
    # the summary rows still say 0/0 (abacus has not run); the x1 rule's two OK locks say
    # more, and its stuck transfer wins over x2's active one
    assert (found.state, found.fraction, found.transfer) == (
        ReplicaState.PARTIAL,
        2 / 3,
        Transfer.STUCK,
    )
    assert "list_dataset_replicas" not in source.calls_last_fetch
    assert "list_replicas" not in source.calls_last_fetch
    assert source.deep_checks_skipped_last_fetch == 1
