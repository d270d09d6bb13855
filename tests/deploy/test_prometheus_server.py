"""The real Prometheus server scrapes a running ``hydrator run`` (the demo configuration) and
evaluates the shipped alert rules; everything is read back through Prometheus' HTTP API."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.support.daemon import Daemon
from tests.support.prometheus import (
    RULES,
    PrometheusServer,
    demo_inventory,
    running_demo_daemon,
    running_prometheus,
)
from tests.support.wait import wait_for

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def scraped(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Daemon, PrometheusServer]]:
    tmp = tmp_path_factory.mktemp("prometheus")
    with (
        running_demo_daemon(tmp / "hydrator", interval_s=1) as daemon,
        running_prometheus(tmp / "prometheus", [daemon.target], rule_files=[RULES]) as prom,
    ):
        yield daemon, prom


def test_prometheus_scrapes_the_daemons_metrics(scraped: tuple[Daemon, PrometheusServer]) -> None:
    _, prom = scraped
    wait_for(
        "target up",
        lambda: prom.value('up{job="hydrator"}'),
        done=lambda got: got == 1.0,
        timeout_s=20.0,
        ignore=(requests.RequestException,),
    )
    available = 'hydrator_datasets{job="hydrator",site="SRCNET_CH",state="available"}'
    assert (
        wait_for(
            "SRCNET_CH datasets",
            lambda: prom.value(available),
            timeout_s=20.0,
            ignore=(requests.RequestException,),
        )
        == 3.0
    )
    assert prom.value('hydrator_datasets{site="SRCNET_UK",state="replicating"}') == 1.0
    assert prom.value('hydrator_datasets{site="SRCNET_ES",state="stuck"}') == 1.0
    assert prom.value('hydrator_source_stale{source="demo"}') == 0.0

    first = wait_for(
        "a cycle counted",
        lambda: prom.value('sum(hydrator_cycles_total{outcome="ok"})') or 0.0,
        timeout_s=20.0,
        ignore=(requests.RequestException,),
    )
    wait_for(
        "cycles increasing",
        lambda: (prom.value('sum(hydrator_cycles_total{outcome="ok"})') or 0) > first,
        timeout_s=20.0,
        ignore=(requests.RequestException,),
    )
    assert prom.value('sum(hydrator_cycles_total{outcome="failed"})') == 0.0


def test_a_data_change_reaches_prometheus(scraped: tuple[Daemon, PrometheusServer]) -> None:
    daemon, prom = scraped
    query = 'hydrator_datasets{site="SRCNET_ES",state="available"}'
    assert (
        wait_for(
            "SRCNET_ES before",
            lambda: prom.value(query),
            timeout_s=20.0,
            ignore=(requests.RequestException,),
        )
        == 1.0
    )
    added = 'sum(hydrator_changes_total{kind="added"})'
    before = wait_for(
        "changes counted",
        lambda: prom.value(added) or 0.0,
        timeout_s=20.0,
        ignore=(requests.RequestException,),
    )
    inventory = demo_inventory(daemon)
    text = inventory.read_text()
    inventory.write_text(
        text.replace(
            'available = ["ska:skymodel_v3"]', 'available = ["ska:skymodel_v3", "ska:obs_9"]'
        )
    )
    wait_for(
        "SRCNET_ES after",
        lambda: prom.value(query),
        done=lambda got: got == 2.0,
        timeout_s=20.0,
        ignore=(requests.RequestException,),
    )
    wait_for(
        "added change",
        lambda: (prom.value(added) or 0) > before,
        timeout_s=20.0,
        ignore=(requests.RequestException,),
    )
    assert prom.value(added) == before + 1


def test_shipped_alert_rules_load_and_evaluate_healthy(
    scraped: tuple[Daemon, PrometheusServer],
) -> None:
    _, prom = scraped

    def evaluated(rules: list[dict[str, object]]) -> bool:
        return bool(rules) and all(
            r["health"] != "unknown" and r.get("lastEvaluation") for r in rules
        )

    rules = wait_for(
        "rules evaluated",
        prom.rules,
        done=evaluated,
        timeout_s=20.0,
        ignore=(requests.RequestException,),
    )
    alerts = {r["name"] for r in rules if r["type"] == "alerting"}
    assert "HydratorDown" in alerts and "HydratorDataLocalityRatioFalling" in alerts
    assert len(rules) == Path(RULES).read_text().count("- alert:")
    assert {r["name"]: r["health"] for r in rules} == {name: "ok" for name in alerts}
    firing = {r["name"] for r in rules if r["state"] == "firing"}
    assert firing == set(), "a healthy demo daemon raises no alert"


def test_dashboard_renders_from_prometheus(
    scraped: tuple[Daemon, PrometheusServer], tmp_path: Path
) -> None:
    from deploy.grafana.render import Prometheus, fetch, load_dashboard, render

    _, prom = scraped
    wait_for(
        "two scrapes",
        lambda: (prom.value("count_over_time(up[1m])") or 0) >= 2,
        timeout_s=20.0,
        ignore=(requests.RequestException,),
    )
    dashboard = load_dashboard()
    source = Prometheus(prom.url, scrape_interval_s=1.0)
    now = time.time()
    panel = next(p for p in dashboard["panels"] if p["title"] == "Datasets per site by state")
    bars = {s.legend: s.values[-1] for s in fetch(source, panel, now - 60, now, 1.0)}
    assert bars["SRCNET_CH available"] == 3.0 and bars["SRCNET_ES stuck"] == 1.0
    out = tmp_path / "dashboard.png"
    render(dashboard, source, now - 60, now, out)
    assert out.read_bytes().startswith(b"\x89PNG")
