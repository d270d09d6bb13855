"""The HTTP endpoint, on a real socket: ClassAds with ETag/304, JSON, probes, metrics."""

from __future__ import annotations

import os
import resource
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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
    base, service, http = _started(tmp_path)
    yield base, service
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
    assert site["partial"] == [
        {"dataset": "ska:p", "fraction": 0.4, "bytes_fraction": 0.4, "transfer": "none"}
    ]
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


def test_the_fronts_requests_are_counted_by_route_and_status_in_the_same_scrape(
    endpoint: tuple[str, object],
) -> None:
    base, service = endpoint
    service.run_cycle()  # type: ignore[attr-defined]
    url = f"{base}/v1/sites/SITE_A/classad"
    tag = requests.get(url, timeout=5).headers["ETag"]
    for _ in range(3):
        requests.get(url, headers={"If-None-Match": tag}, timeout=5)
    requests.get(f"{base}/v1/sites/NOT_A_SITE/classad", timeout=5)
    requests.get(f"{base}/healthz", timeout=5)
    with socket.create_connection(("127.0.0.1", int(base.rsplit(":", 1)[1])), timeout=5) as sock:
        sock.sendall(b"NONSENSE\r\n\r\n")
        sock.recv(1024)
    text = requests.get(f"{base}/metrics", timeout=5).text
    assert 'hydrator_http_requests_total{code="200",route="classad"} 1.0' in text
    assert 'hydrator_http_requests_total{code="304",route="classad"} 3.0' in text
    assert 'hydrator_http_requests_total{code="404",route="classad"} 1.0' in text
    assert 'hydrator_http_requests_total{code="200",route="healthz"} 1.0' in text
    assert 'hydrator_http_requests_total{code="400",route="invalid"} 1.0' in text
    assert "NOT_A_SITE" not in text  # site names from clients never become labels
    assert "hydrator_http_connections 1.0" in text  # the scrape's own connection
    assert 'hydrator_cycles_total{outcome="ok"} 1.0' in text  # and the daemon's metrics
    helps = [line for line in text.splitlines() if line.startswith("# HELP ")]
    assert len(helps) == len(set(helps))


def test_health_fails_when_no_cycle_ends_for_too_long(tmp_path: Path) -> None:
    base, service, http = _started(tmp_path, wedged_after_s=1.0)
    try:
        url = f"{base}/healthz"
        assert requests.get(url, timeout=5).status_code == 200
        time.sleep(1.2)
        assert requests.get(url, timeout=5).status_code == 503  # wedged: no cycle for 1 s
        service.run_cycle()
        assert requests.get(url, timeout=5).status_code == 200
    finally:
        http.stop()
        service.close()


def test_a_bug_answers_500_and_is_logged_and_classads_are_still_served(
    endpoint: tuple[str, object], caplog: pytest.LogCaptureFixture
) -> None:
    base, service = endpoint
    service.run_cycle()  # type: ignore[attr-defined]
    good = service.published  # type: ignore[attr-defined]
    service.published = None  # type: ignore[attr-defined]  # every JSON view of it now raises
    try:
        assert requests.get(f"{base}/v1/sites", timeout=5).status_code == 500
        assert requests.get(f"{base}/v1/sites/SITE_A/classad", timeout=5).status_code == 200
    finally:
        service.published = good  # type: ignore[attr-defined]
    (error,) = [r for r in caplog.records if r.levelname == "ERROR"]
    assert error.exc_info and "GET /v1/sites" in error.getMessage()
    assert requests.get(f"{base}/v1/sites", timeout=5).status_code == 200


def test_changes_reach_the_front_before_the_cycle_returns(tmp_path: Path) -> None:
    base, service, http = _started(tmp_path)
    try:
        service.run_cycle()
        url = f"{base}/v1/sites/SITE_A/classad"
        first = requests.get(url, timeout=5)
        (tmp_path / "inv.toml").write_text(
            INVENTORY.replace('"ska:y"', '"ska:z"')
            + '[storage.B]\nsite = "SITE_B"\navailable = []\n'
        )
        service.run_cycle()
        second = requests.get(url, timeout=5)
        assert second.headers["ETag"] != first.headers["ETag"] and '"ska:z"' in second.text
        assert requests.get(f"{base}/v1/sites/SITE_B/classad", timeout=5).status_code == 200
        (tmp_path / "inv.toml").write_text('[storage.B]\nsite = "SITE_B"\navailable = ["ska:b"]\n')
        service.run_cycle()
        assert requests.get(url, timeout=5).status_code == 404  # SITE_A is gone
        assert '"ska:b"' in requests.get(f"{base}/v1/sites/SITE_B/classad", timeout=5).text
    finally:
        http.stop()
        service.close()


def test_a_front_that_dies_is_restarted_with_everything_and_counted(tmp_path: Path) -> None:
    base, service, http = _started(tmp_path)
    try:
        service.run_cycle()
        front = http._front
        assert front is not None
        os.kill(front.pid, signal.SIGKILL)
        # The public socket stays open while no front runs: a client waits in the accept queue
        # instead of being refused, and is answered by the new front.
        t0 = time.monotonic()
        r = requests.get(f"{base}/v1/sites/SITE_A/classad", timeout=10)
        assert r.status_code == 200 and '"ska:x"' in r.text and http._front is not front
        assert time.monotonic() - t0 < 5
        metrics = requests.get(f"{base}/metrics", timeout=5).text
        assert "hydrator_http_front_restarts_total 1.0" in metrics
    finally:
        http.stop()
        service.close()
    assert front.poll() is not None and http._front is None
    with pytest.raises(requests.ConnectionError):
        requests.get(f"{base}/healthz", timeout=2)


def test_the_front_lifts_its_open_files_limit_to_the_hard_one(tmp_path: Path) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))  # what the front inherits
    try:
        _, service, http = _started(tmp_path)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    try:
        assert http._front is not None
        limits = Path(f"/proc/{http._front.pid}/limits").read_text().splitlines()
        (line,) = [x for x in limits if x.startswith("Max open files")]
        front_soft, front_hard = line.split()[3:5]
        assert front_soft == front_hard == str(hard)
    finally:
        http.stop()
        service.close()


def _started(tmp_path: Path, wedged_after_s: float = 300) -> tuple[str, Any, HttpEndpoint]:
    (tmp_path / "inv.toml").write_text(INVENTORY)
    config = parse_config(
        {"daemon": {"state_path": "s.sqlite"}, "sources": [{"type": "static", "path": "inv.toml"}]},
        tmp_path,
    )
    service = build_service(config)
    http = HttpEndpoint(service, "127.0.0.1", 0, max_age_s=30, wedged_after_s=wedged_after_s)
    http.start()
    return f"http://127.0.0.1:{http.port}", service, http
