"""Near sites reach the site ads through a cycle (the operator table of ``[distances]``), and
a bad table neither fills an ad with garbage nor takes away the lists that were good."""

from __future__ import annotations

from pathlib import Path

from hydrator.adapters.sources.static import StaticSource
from hydrator.adapters.state.sqlite import SqliteStateStore
from hydrator.config import Config, parse_config
from hydrator.domain import Site
from hydrator.runtime.metrics import Metrics
from hydrator.runtime.service import Service
from hydrator.runtime.wiring import assemble
from tests.support.near import INVENTORY


def make(
    tmp_path: Path, table: dict[str, dict[str, object]], metrics: Metrics
) -> tuple[Config, Service]:
    (tmp_path / "inv.toml").write_text(INVENTORY)
    config = parse_config(
        {
            "daemon": {"state_path": "s.sqlite"},
            "sources": [{"type": "static", "path": "inv.toml", "settle_s": 0}],
            "distances": {"enabled": True, "max_distance": 2, "refresh_s": 1e-9, "sites": table},
        },
        tmp_path,
    )
    source = StaticSource("static", tmp_path / "inv.toml", {})
    store = SqliteStateStore(config.daemon.state_path)
    return config, assemble(config, sources=[source], store=store, metrics=metrics).service


def body(service: Service, site: str) -> str:
    return service.published.ads[Site(site)].body.decode()


def test_near_sites_from_the_operator_table_reach_the_ads_and_survive_a_bad_table(
    tmp_path: Path, metrics: Metrics
) -> None:
    table: dict[str, dict[str, object]] = {
        "SITE_A": {"SITE_B": 1, "SITE_C": 5},
        "SITE_B": {"SITE_A": 1},
    }
    config, service = make(tmp_path, table, metrics)
    service.run_cycle()
    assert 'DataLocalityNearSites = { "SITE_B" }' in body(service, "SITE_A")
    assert 'DataLocalityNearSites = { "SITE_A" }' in body(service, "SITE_B")
    assert "DataLocalityNearSites = {  }" in body(service, "SITE_C")
    digest = service.published.ads[Site("SITE_A")].view.digest

    config.distances.sites["SITE_A"]["SITE_B"] = -1  # negative: bad, counted once
    config.distances.sites["SITE_B"]["SITE_A"] = "near"  # not a number
    service.run_cycle()
    service.run_cycle()
    assert 'DataLocalityNearSites = { "SITE_B" }' in body(service, "SITE_A")  # last good
    assert service.published.ads[Site("SITE_A")].view.digest == digest
    sample = metrics.registry.get_sample_value
    assert sample("hydrator_near_problems_total", {"kind": "negative"}) == 1
    assert sample("hydrator_near_problems_total", {"kind": "not_a_number"}) == 1

    config.distances.sites["SITE_A"]["SITE_B"] = 3  # good again, and no longer near
    config.distances.sites["SITE_B"]["SITE_A"] = 3
    service.run_cycle()
    assert "DataLocalityNearSites = {  }" in body(service, "SITE_A")
    service.close()


def test_an_ad_cut_to_max_ad_bytes_still_fits_with_its_near_sites(tmp_path: Path) -> None:
    """The hook refuses an answer over its --max-bytes: the near line counts in the cut."""
    names = ", ".join(f'"ska:dataset_number_{i:04d}"' for i in range(80))
    others = [f"SITE_NEAR_{i:02d}_WITH_A_LONG_NAME" for i in range(8)]
    (tmp_path / "inv.toml").write_text(f'[storage.A]\nsite = "SITE_A"\navailable = [{names}]\n')
    config = parse_config(
        {
            "daemon": {"state_path": "s.sqlite"},
            "classad": {"max_ad_bytes": 1024},
            "sources": [{"type": "static", "path": "inv.toml", "settle_s": 0}],
            "distances": {"enabled": True, "sites": {"SITE_A": dict.fromkeys(others, 0)}},
        },
        tmp_path,
    )
    source = StaticSource("static", tmp_path / "inv.toml", {})
    store = SqliteStateStore(config.daemon.state_path)
    service = assemble(config, sources=[source], store=store).service
    service.run_cycle()
    text = body(service, "SITE_A")
    assert "SITE_NEAR_07_WITH_A_LONG_NAME" in text
    assert len(text.encode()) <= 1024
    service.close()


def test_an_ad_cut_to_size_is_cut_again_when_its_near_list_grows_alone(tmp_path: Path) -> None:
    """The site's lists stay the same while its near list grows: the ad is measured again
    (not the cut remembered from the shorter near line) and still fits max_ad_bytes."""
    names = ", ".join(f'"ska:dataset_number_{i:04d}"' for i in range(80))
    others = [f"SITE_NEAR_{i:02d}_WITH_A_LONG_NAME" for i in range(8)]
    (tmp_path / "inv.toml").write_text(f'[storage.A]\nsite = "SITE_A"\navailable = [{names}]\n')
    table = {"SITE_A": {others[0]: 0}}
    config = parse_config(
        {
            "daemon": {"state_path": "s.sqlite"},
            "classad": {"max_ad_bytes": 1024},
            "sources": [{"type": "static", "path": "inv.toml", "settle_s": 0}],
            "distances": {"enabled": True, "refresh_s": 1e-9, "sites": table},
        },
        tmp_path,
    )
    source = StaticSource("static", tmp_path / "inv.toml", {})
    store = SqliteStateStore(config.daemon.state_path)
    service = assemble(config, sources=[source], store=store).service
    service.run_cycle()
    first = body(service, "SITE_A")
    assert others[0] in first and others[1] not in first
    assert len(first.encode()) <= 1024

    config.distances.sites["SITE_A"] = dict.fromkeys(others, 0)
    service.run_cycle()
    text = body(service, "SITE_A")
    assert all(name in text for name in others)
    assert len(text.encode()) <= 1024
    assert text.count("ska:dataset_number_") < first.count("ska:dataset_number_")
    service.close()
