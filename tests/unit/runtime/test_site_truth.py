"""What the daemon says about each site: ``/v1/sites`` lists everything held, whatever its ad
leaves out, and a site emptied in one answer of an "ok" source is held back, visibly
(``/v1/sites``, ``hydrator_site_held``, the log), on a real static inventory."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from prometheus_client import CollectorRegistry

from hydrator.config import parse_config
from hydrator.domain import Site
from hydrator.runtime.http_endpoint import HttpEndpoint
from hydrator.runtime.metrics import Metrics
from hydrator.runtime.service import Service
from hydrator.runtime.wiring import build_service


def table(element: str, site: str, names: list[str]) -> str:
    listed = ", ".join(f'"ska:{n}"' for n in names)
    return f'[storage.{element}]\nsite = "{site}"\navailable = [{listed}]\n'


@contextlib.contextmanager
def serving(
    tmp_path: Path, metrics: Metrics | None = None, **safety: Any
) -> Iterator[tuple[str, Service]]:
    """The daemon's endpoint (the real server process) on the static ``inv.toml``, reporting
    to ``metrics`` (fresh ones when None)."""
    metrics = metrics if metrics is not None else Metrics(CollectorRegistry())
    config = parse_config(
        {
            "daemon": {"state_path": "s.sqlite"},
            "sources": [{"type": "static", "path": "inv.toml", "settle_s": 0}],
            "http": {"listen": "127.0.0.1:0"},
            "safety": safety,
        },
        tmp_path,
    )
    service = build_service(config, metrics)
    endpoint = HttpEndpoint(service, config.http, wedged_after_s=300, metrics=metrics)
    try:
        endpoint.start()
        yield f"http://127.0.0.1:{endpoint.port}", service
    finally:
        endpoint.stop()
        service.close()


def get(url: str) -> Any:
    answer = requests.get(url, timeout=10)
    answer.raise_for_status()
    return answer.json() if "json" in answer.headers["Content-Type"] else answer.text


def test_v1_sites_lists_all_5000_datasets_while_the_ad_holds_what_fits(tmp_path: Path) -> None:
    names = [f"observation_{i:05d}_{'x' * 20}" for i in range(5000)]
    (tmp_path / "inv.toml").write_text(table("A", "SITE_A", names))
    with serving(tmp_path) as (base, service):
        service.run_cycle()
        ad = get(f"{base}/v1/sites/SITE_A/classad")
        advertised = ad.split("AvailableDatasets = {", 1)[1].split("}", 1)[0].count('"') // 2
        assert 0 < advertised < 5000, "the ad is cut to [classad] max_ad_bytes"
        (listed,) = get(f"{base}/v1/sites")["sites"]
        assert listed["available"] == 5000
        site = get(f"{base}/v1/sites/SITE_A")
        assert site["available"] == [f"ska:{n}" for n in names]


def test_a_site_whose_table_is_removed_is_held_not_emptied(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, metrics: Metrics
) -> None:
    """One static source, SITE_A 70 datasets and SITE_B 30; B's storage table removed."""
    at_a = table("A", "SITE_A", [f"a{i}" for i in range(70)])
    at_b = table("B", "SITE_B", [f"b{i}" for i in range(30)])
    (tmp_path / "inv.toml").write_text(at_a + at_b)
    with serving(tmp_path, metrics, accept_drop_after_cycles=3) as (base, service):
        service.run_cycle()
        (tmp_path / "inv.toml").write_text(at_a)
        m = metrics.registry.get_sample_value
        with caplog.at_level(logging.WARNING, logger="hydrator.cycle"):
            for cycle in (1, 2):
                report = service.run_cycle()
                assert report.plan is not None and report.plan.sources[0].fresh
                sites = {s["site"]: s for s in get(f"{base}/v1/sites")["sites"]}
                assert sites["SITE_B"]["available"] == 30, f"cycle {cycle}: SITE_B kept"
                assert (
                    f"0 entries against 30 last time (cycle {cycle} of 3)"
                    in (sites["SITE_B"]["held"])
                )
                assert sites["SITE_A"]["held"] is None
                (source,) = get(f"{base}/v1/sites")["sources"]
                assert source["fresh"] and set(source["held_sites"]) == {"SITE_B"}
                assert '"ska:b0"' in get(f"{base}/v1/sites/SITE_B/classad")
                assert m("hydrator_site_held", {"site": "SITE_B", "source": "static"}) == 1
        held = [r.getMessage() for r in caplog.records if "SITE_B" in r.getMessage()]
        assert len(held) == 2 and "held back" in held[0]
        service.run_cycle()  # the third cycle: accepted
        assert [s["site"] for s in get(f"{base}/v1/sites")["sites"]] == ["SITE_A"]
        assert m("hydrator_site_held", {"site": "SITE_B", "source": "static"}) is None


def test_a_storage_table_gone_holds_its_site_though_the_site_shrinks_little(
    tmp_path: Path,
) -> None:
    """The site guard per storage element: SITE_B has B1 (25 datasets) and B2 (40); B1's
    table removed is a drop of 38 % at the site, under the site share (50 %), but B1 lost all
    of its entries: the site is held, naming the element, then the drop is accepted."""
    at_b1 = table("B1", "SITE_B", [f"b1_{i}" for i in range(25)])
    at_b2 = table("B2", "SITE_B", [f"b2_{i}" for i in range(40)])
    (tmp_path / "inv.toml").write_text(at_b1 + at_b2)
    with serving(tmp_path, accept_drop_after_cycles=2) as (base, service):
        service.run_cycle()
        (tmp_path / "inv.toml").write_text(at_b2)
        service.run_cycle()
        (site,) = get(f"{base}/v1/sites")["sites"]
        assert site["available"] == 65
        assert "storage element B1: 0 entries against 25 last time" in site["held"]
        service.run_cycle()  # the second cycle: accepted
        (site,) = get(f"{base}/v1/sites")["sites"]
        assert (site["available"], site["held"]) == (40, None)


def test_an_operator_accepts_a_real_removal_at_once(tmp_path: Path) -> None:
    at_a = table("A", "SITE_A", [f"a{i}" for i in range(70)])
    at_b = table("B", "SITE_B", [f"b{i}" for i in range(30)])
    (tmp_path / "inv.toml").write_text(at_a + at_b)
    with serving(tmp_path, accept_site_drops=["SITE_B"]) as (base, service):
        service.run_cycle()
        (tmp_path / "inv.toml").write_text(at_a)
        service.run_cycle()
        assert Site("SITE_B") not in service.published.ads
        assert [s["site"] for s in get(f"{base}/v1/sites")["sites"]] == ["SITE_A"]


def test_a_site_differing_only_in_case_is_refused_in_v1_sites_and_the_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, metrics: Metrics
) -> None:
    """A site name differing only in case is refused, through a real inventory: ``site_a``
    beside ``SITE_A``."""
    upper = table("A", "SITE_A", ["a0", "a1"])
    (tmp_path / "inv.toml").write_text(upper + table("L", "site_a", ["l0"]))
    with serving(tmp_path) as (base, service), caplog.at_level(logging.WARNING):
        service.run_cycle()
        document = get(f"{base}/v1/sites")
        assert [s["site"] for s in document["sites"]] == ["SITE_A"]
        (source,) = document["sources"]
        assert source["invalid"] == 1
        assert "site_a differs only in case from SITE_A" in source["refused_sites"]["site_a"]
        assert get(f"{base}/v1/sites/SITE_A")["available"] == ["ska:a0", "ska:a1"]
    assert any("site_a differs only in case" in r.getMessage() for r in caplog.records)
