"""deploy/grafana/hydrator.json: a valid dashboard whose queries parse (promtool) and use only
metric names the daemon really exports (collected from a live registry after a real cycle)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from hydrator.adapters.http.server import ServerMetrics
from hydrator.config import load_config
from hydrator.core.locality import LocalityReport
from hydrator.runtime.metrics import Metrics
from hydrator.runtime.observe import record_locality
from hydrator.runtime.wiring import build_service
from tests.support.deploy import DEPLOY, REPO

DASHBOARD = DEPLOY / "grafana" / "hydrator.json"
# Exported but deliberately not on the dashboard (bookkeeping, not operations).
NOT_ON_DASHBOARD = {
    "hydrator_state_rows_written_total",
    "hydrator_source_last_success_timestamp_seconds",
}
SUFFIXES = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"], "gauge": [""]}


def dashboard() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return doc


def panels(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in doc["panels"] if p["type"] != "row"]


def exprs(doc: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in panels(doc) for t in p["targets"]]


def concrete(expr: str) -> str:
    """The expression as Grafana sends it (variables replaced as for 'All' and a 1m step)."""
    return expr.replace("$__rate_interval", "1m").replace("$instance", ".*")


@dataclass(frozen=True)
class Exported:
    names: set[str]  # every sample name a query may use
    primary: set[str]  # one per metric: name_total, name_bucket, or the gauge's name


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Exported:
    """Metric names from a live registry after one cycle of the demo configuration."""
    tmp = tmp_path_factory.mktemp("demo")
    for name in ("demo.toml", "demo-inventory.toml"):
        shutil.copy2(REPO / "config" / name, tmp / name)  # old mtime: settled
    metrics = Metrics(CollectorRegistry())
    service = build_service(load_config(tmp / "demo.toml"), metrics)
    try:
        assert service.run_cycle().outcome == "ok"
    finally:
        service.close()
    record_locality(metrics, LocalityReport())  # what a probe sets each cycle
    front = ServerMetrics()  # appended to the scrape by the HTTP server process
    front.requests.labels("healthz", "200").inc()
    names: set[str] = set()
    primary: set[str] = set()
    for family in [*metrics.registry.collect(), *front.registry.collect()]:
        suffixes = SUFFIXES[family.type]
        names |= {family.name + s for s in suffixes} | {s.name for s in family.samples}
        primary.add(family.name + suffixes[0])
    return Exported(names, primary)


def used_metrics() -> set[str]:
    return {name for expr in exprs(dashboard()) for name in re.findall(r"\bhydrator_\w+", expr)}


def test_dashboard_is_valid_grafana_json() -> None:
    doc = dashboard()
    assert 36 <= doc["schemaVersion"] <= 41
    assert [i["name"] for i in doc["__inputs"]] == ["DS_PROMETHEUS"]
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids))
    for panel in panels(doc):
        assert panel["datasource"] == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
        assert panel["targets"], panel["title"]
        assert all(t["datasource"]["uid"] == "${DS_PROMETHEUS}" for t in panel["targets"])
        assert panel["type"] in {"timeseries", "stat", "bargauge"}


def test_panels_fit_the_grid_without_overlapping() -> None:
    taken: set[tuple[int, int]] = set()
    for panel in dashboard()["panels"]:
        g = panel["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, panel["title"]
        cells = {
            (x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])
        }
        assert not cells & taken, f"{panel['title']} overlaps another panel"
        taken |= cells


def test_queries_use_only_exported_metrics(exported: Exported) -> None:
    used = used_metrics()
    assert used, "no hydrator metric in the dashboard"
    assert used - exported.names == set()


def test_every_operational_metric_is_on_the_dashboard(exported: Exported) -> None:
    assert exported.primary >= NOT_ON_DASHBOARD
    assert sorted(exported.primary - used_metrics() - NOT_ON_DASHBOARD) == []


def promtool_check(
    promtool: str, tmp_path: Path, expressions: list[str]
) -> subprocess.CompletedProcess[str]:
    rules = [
        {"record": f"dashboard:panel_{i}", "expr": concrete(e)} for i, e in enumerate(expressions)
    ]
    path = tmp_path / "dashboard.rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    return subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, check=False
    )


def test_every_query_parses(promtool: str, tmp_path: Path) -> None:
    expressions = exprs(dashboard())
    result = promtool_check(promtool, tmp_path, expressions)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(expressions)} rules found" in result.stdout


def test_a_broken_query_is_rejected(promtool: str, tmp_path: Path) -> None:
    # Guards the test above: promtool really parses the expressions.
    result = promtool_check(promtool, tmp_path, ["sum by (site (hydrator_datasets)"])
    assert result.returncode != 0
