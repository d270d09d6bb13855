"""A summary line that is not JSON, from the real Rucio server through a proxy that alters one
line: the daemon counts a failed source in one log line (no traceback) naming the RSE and the
line, keeps what it published, and reads the next good answer as before."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from hydrator.config import parse_config
from hydrator.runtime.metrics import Metrics
from hydrator.runtime.service import Service
from hydrator.runtime.wiring import build_service
from tests.support.corrupting_proxy import corrupting_proxy
from tests.support.rucio_server import Federation, RucioServer, source_config

pytestmark = pytest.mark.rucio


def service_through(
    url: str, server: RucioServer, fed: Federation, state_dir: Path, metrics: Metrics
) -> Service:
    """The daemon reading ``fed`` from ``server`` at ``url`` (the proxy), reporting to
    ``metrics``."""
    source = source_config(
        server, rse_expression=fed.expression, rucio_host=url, auth_host=url, max_attempts=2
    )
    config = parse_config(
        {
            "daemon": {"state_path": str(state_dir / "state.sqlite")},
            "sources": [source.model_dump(mode="json", exclude_none=True)],
            "sites": fed.overrides,
        },
        state_dir,
    )
    return build_service(config, metrics)


def held(service: Service) -> dict[str, set[str]]:
    """Site -> the datasets its ad says are there (complete or partial)."""
    return {
        site: {str(d) for d in ad.view.available} | {str(d) for d, _ in ad.view.partial}
        for site, ad in service.published.ads.items()
    }


def test_a_summary_line_that_is_not_json_is_one_failed_source_line_and_keeps_the_data(
    metrics: Metrics,
    running_rucio: RucioServer,
    federation: Federation,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    rse = federation.rses["a1"]
    with corrupting_proxy(running_rucio.url) as proxy:
        service = service_through(proxy.url, running_rucio, federation, tmp_path, metrics)
        try:
            assert service.run_cycle().outcome == "ok"
            before = held(service)
            assert federation.did("complete") in before[federation.sites["A"]]

            proxy.break_line(f"/replicas/rse/{rse}", 2)
            caplog.clear()
            with caplog.at_level(logging.WARNING):
                report = service.run_cycle()
            assert proxy.altered_answers == 1
            assert report.outcome == "degraded" and report.plan is not None
            assert report.plan.changes == () and held(service) == before
            m = metrics.registry.get_sample_value
            errors = {"source": "rucio", "kind": "transient"}
            assert m("hydrator_source_errors_total", errors) == 1
            assert m("hydrator_source_stale", {"source": "rucio"}) == 1
            failed = [r for r in caplog.records if "source rucio failed" in r.getMessage()]
            assert len(failed) == 1, [r.getMessage() for r in caplog.records]
            message = failed[0].getMessage()
            assert f"the dataset summary of RSE {rse} (list_datasets_per_rse)" in message
            assert "line 2 is not JSON" in message and "$" not in message
            assert "\n" not in message
            assert all(r.exc_info is None for r in caplog.records), "no traceback"

            proxy.mend()
            recovered = service.run_cycle()
            assert recovered.outcome == "ok" and held(service) == before
            assert m("hydrator_source_stale", {"source": "rucio"}) == 0
        finally:
            service.close()
