"""The daemon's cycles over a real Rucio server: an outage keeps the data, recovery is immediate."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from hydrator.config import parse_config
from hydrator.domain import Site
from hydrator.runtime.metrics import Metrics
from hydrator.runtime.service import Service
from hydrator.runtime.wiring import build_service
from tests.support.rucio_server import Federation, RucioServer, source_config

pytestmark = pytest.mark.rucio


def service_for(
    server: RucioServer, federation: Federation, state_dir: Path, metrics: Metrics | None = None
) -> Service:
    config = parse_config(
        {
            "daemon": {"state_path": str(state_dir / "state.sqlite")},
            "sources": [
                source_config(
                    server, rse_expression=federation.expression, max_attempts=2
                ).model_dump(mode="json", exclude_none=True)
            ],
            "sites": federation.overrides,
        },
        state_dir,
    )
    return build_service(config, metrics)


def published(service: Service) -> dict[tuple[str, str], str]:
    out: dict[tuple[str, str], str] = {}
    for site, ad in service.published.ads.items():
        v = ad.view
        out.update({(site, str(d)): "available" for d in v.available})
        out.update({(site, str(d)): "partial" for d, _ in v.partial})
        out.update({(site, str(d)): "replicating" for d, _ in v.replicating})
    return out


def test_outage_keeps_everything_and_recovery_is_immediate(
    metrics: Metrics, running_rucio: RucioServer, federation: Federation, tmp_path: Path
) -> None:
    expected = {k: state for k, (state, _) in federation.expected.items() if state != "stuck"}
    service = service_for(running_rucio, federation, tmp_path, metrics)
    first = service.run_cycle()
    assert first.outcome == "ok"
    assert published(service) == expected

    running_rucio.stop()
    for _ in range(3):
        report = service.run_cycle()
        assert report.outcome == "degraded" and report.plan is not None
        assert report.plan.changes == ()
        assert published(service) == expected, "an outage never drops data"
    m = metrics.registry.get_sample_value
    assert m("hydrator_source_stale", {"source": "rucio"}) == 1
    assert m("hydrator_source_errors_total", {"source": "rucio", "kind": "transient"}) == 3
    updated = service.published.ads[Site(federation.sites["A"])].view.updated
    assert (
        first.plan is not None and updated == first.plan.sites[Site(federation.sites["A"])].updated
    )
    service.close()

    # a restart during the outage serves the saved state at once
    again = Metrics(CollectorRegistry())  # a restart's own
    restarted = service_for(running_rucio, federation, tmp_path, again)
    assert published(restarted) == expected
    running_rucio.start()
    recovered = restarted.run_cycle()
    assert recovered.outcome == "ok" and recovered.plan is not None
    assert recovered.plan.changes == () and recovered.rows_written == 0
    assert again.registry.get_sample_value("hydrator_source_stale", {"source": "rucio"}) == 0
    restarted.close()


def test_api_calls_are_counted_per_method(
    metrics: Metrics, running_rucio: RucioServer, federation: Federation, tmp_path: Path
) -> None:
    service = service_for(running_rucio, federation, tmp_path, metrics)
    service.run_cycle()
    m = metrics.registry.get_sample_value
    per_rse = m(
        "hydrator_source_api_calls_total", {"source": "rucio", "method": "list_datasets_per_rse"}
    )
    # one listing per disk RSE that maps to a site (tape and the unmapped RSE are not listed)
    assert per_rse == len([r for r in federation.rses if r not in ("tape", "nosite")])
    service.close()
