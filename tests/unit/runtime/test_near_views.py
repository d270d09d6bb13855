"""Each site's near sites in the JSON views and ``hydrator show``: ``GET /v1/sites`` and
``/v1/sites/<site>`` (the real server process), ``hydrator once --json`` and ``hydrator show``
list what the site's ad carries (``[distances]`` operator table, on a static inventory)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import requests
from prometheus_client import CollectorRegistry

from hydrator.config import load_config
from hydrator.domain import Site
from hydrator.runtime.cli import main
from hydrator.runtime.http_endpoint import HttpEndpoint
from hydrator.runtime.metrics import Metrics
from hydrator.runtime.wiring import build_service
from tests.support.near import INVENTORY

DISTANCES = """
[distances]
enabled = true
max_distance = 1
[distances.sites]
SITE_A = { SITE_B = 1, SITE_C = 4 }
SITE_B = { SITE_A = 1 }
"""
NEAR = {"SITE_A": ["SITE_B"], "SITE_B": ["SITE_A"], "SITE_C": []}


@pytest.fixture()
def config(tmp_path: Path) -> Path:
    (tmp_path / "inv.toml").write_text(INVENTORY)
    path = tmp_path / "hydrator.toml"
    path.write_text(
        '[daemon]\nstate_path = "state.sqlite"\n[http]\nlisten = "127.0.0.1:0"\n'
        '[[sources]]\ntype = "static"\nname = "inv"\npath = "inv.toml"\nsettle_s = 0\n' + DISTANCES
    )
    return path


def get(url: str) -> Any:
    answer = requests.get(url, timeout=10)
    answer.raise_for_status()
    return answer.json()


def test_v1_sites_lists_each_sites_near_sites_as_its_ad_carries_them(config: Path) -> None:
    parsed = load_config(config)
    metrics = Metrics(CollectorRegistry())
    service = build_service(parsed, metrics)
    endpoint = HttpEndpoint(service, parsed.http, wedged_after_s=300, metrics=metrics)
    try:
        endpoint.start()
        base = f"http://127.0.0.1:{endpoint.port}"
        service.run_cycle()
        listed = {s["site"]: s["near"] for s in get(f"{base}/v1/sites")["sites"]}
        assert listed == NEAR
        site = get(f"{base}/v1/sites/SITE_A")
        assert site["near"] == ["SITE_B"]
        assert site["digest"] == service.published.ads[Site("SITE_A")].view.digest
    finally:
        endpoint.stop()
        service.close()


def test_once_json_and_show_list_each_sites_near_sites(
    config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["once", "--json", "--config", str(config)]) == 0
    sites = json.loads(capsys.readouterr().out)["sites"]
    assert {name: site["near"] for name, site in sites.items()} == NEAR

    assert main(["show", "--config", str(config)]) == 0
    shown = capsys.readouterr().out
    assert 'DataLocalityNearSites = { "SITE_B" }' in shown
    assert 'DataLocalityNearSites = { "SITE_A" }' in shown
    assert main(["show", "SITE_C", "--config", str(config)]) == 0
    assert "DataLocalityNearSites = {  }" in capsys.readouterr().out


def test_without_distances_no_view_names_near_sites(
    config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config.write_text(config.read_text().split("[distances]")[0])
    assert main(["once", "--json", "--config", str(config)]) == 0
    sites = json.loads(capsys.readouterr().out)["sites"]
    assert all(site["near"] is None for site in sites.values())
    assert main(["show", "--config", str(config)]) == 0
    assert "DataLocalityNearSites" not in capsys.readouterr().out
