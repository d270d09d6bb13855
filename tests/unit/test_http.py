"""The HTTP endpoint, on a real socket: ClassAds with ETag/304, JSON, probes, metrics."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from hydrator.config import parse_config
from hydrator.http import HttpEndpoint
from hydrator.wiring import build_service

INVENTORY = (
    '[storage.A]\nsite = "SITE_A"\navailable = ["ska:x", "ska:y"]\npartial = { "ska:p" = 0.4 }\n'
)


@pytest.fixture
def endpoint(tmp_path: Path) -> Iterator[tuple[str, object]]:
    (tmp_path / "inv.toml").write_text(INVENTORY)
    config = parse_config(
        {
            "daemon": {"state_path": "s.sqlite"},
            "http": {"max_age_s": 30},
            "sources": [{"type": "static", "path": "inv.toml"}],
        },
        tmp_path,
    )
    service = build_service(config)
    http = HttpEndpoint(service, "127.0.0.1", 0, max_age_s=30, wedged_after_s=300)
    http.start()
    yield f"http://127.0.0.1:{http.port}", service
    http.stop()
    service.close()


def test_readiness_follows_the_first_cycle_and_classads_are_served(
    endpoint: tuple[str, object],
) -> None:
    base, service = endpoint
    assert requests.get(f"{base}/healthz", timeout=5).status_code == 200
    assert requests.get(f"{base}/readyz", timeout=5).status_code == 503
    assert requests.get(f"{base}/v1/sites/SITE_A/classad", timeout=5).status_code == 404
    service.run_cycle()  # type: ignore[attr-defined]
    assert requests.get(f"{base}/readyz", timeout=5).status_code == 200
    r = requests.get(f"{base}/v1/sites/SITE_A/classad", timeout=5)
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/plain")
    assert r.headers["Cache-Control"] == "max-age=30"
    lines = r.text.splitlines()
    assert lines[-1] == "- update:true"
    assert 'AvailableDatasets = { "ska:x","ska:y" }' in lines
    assert 'PartialDatasets = { "ska:p" }' in lines


def test_conditional_get_answers_304_until_the_content_changes(
    endpoint: tuple[str, object],
) -> None:
    base, service = endpoint
    service.run_cycle()  # type: ignore[attr-defined]
    url = f"{base}/v1/sites/SITE_A/classad"
    tag = requests.get(url, timeout=5).headers["ETag"]
    again = requests.get(url, headers={"If-None-Match": tag}, timeout=5)
    assert again.status_code == 304 and again.content == b""
    assert (
        requests.get(url, headers={"If-None-Match": '"other", ' + tag}, timeout=5).status_code
        == 304
    )
    assert requests.get(url, headers={"If-None-Match": '"stale"'}, timeout=5).status_code == 200


def test_json_views_and_unknown_paths(endpoint: tuple[str, object]) -> None:
    base, service = endpoint
    service.run_cycle()  # type: ignore[attr-defined]
    sites = requests.get(f"{base}/v1/sites", timeout=5).json()
    assert [(s["site"], s["available"], s["partial"]) for s in sites["sites"]] == [("SITE_A", 2, 1)]
    assert sites["sources"][0]["fresh"] is True
    site = requests.get(f"{base}/v1/sites/SITE_A", timeout=5).json()
    assert site["partial"] == [{"dataset": "ska:p", "fraction": 0.4}]
    for path in ["/v1/sites/SITE%20A/classad", "/v1/sites/NOPE", "/nope", "/v1/sites/../../etc"]:
        assert requests.get(base + path, timeout=5).status_code == 404, path
    assert (
        requests.head(f"{base}/v1/sites/SITE_A/classad", timeout=5).headers["Content-Length"] != "0"
    )


def test_metrics_are_exposed(endpoint: tuple[str, object]) -> None:
    base, service = endpoint
    service.run_cycle()  # type: ignore[attr-defined]
    text = requests.get(f"{base}/metrics", timeout=5).text
    assert 'hydrator_datasets{site="SITE_A",state="available"} 2.0' in text
    assert 'hydrator_cycles_total{outcome="ok"} 1.0' in text
    assert "hydrator_classad_size_bytes" in text


def test_health_fails_when_the_loop_is_wedged(tmp_path: Path, endpoint: tuple[str, object]) -> None:
    base, service = endpoint
    service.last_cycle_end -= 301  # type: ignore[attr-defined]
    assert requests.get(f"{base}/healthz", timeout=5).status_code == 503


def test_a_bug_answers_500_and_is_logged_and_the_endpoint_keeps_serving(
    endpoint: tuple[str, object], caplog: pytest.LogCaptureFixture
) -> None:
    base, service = endpoint
    service.run_cycle()  # type: ignore[attr-defined]
    good = service.published  # type: ignore[attr-defined]
    service.published = None  # type: ignore[attr-defined]  # every view of it now raises
    try:
        assert requests.get(f"{base}/v1/sites", timeout=5).status_code == 500
        assert requests.get(f"{base}/v1/sites/SITE_A/classad", timeout=5).status_code == 500
    finally:
        service.published = good  # type: ignore[attr-defined]
    errors = [r for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 2 and all(r.exc_info for r in errors)
    assert "GET /v1/sites" in errors[0].getMessage()
    assert requests.get(f"{base}/v1/sites/SITE_A/classad", timeout=5).status_code == 200
