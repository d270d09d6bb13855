"""Glidein hooks fetching site ClassAds through a real squid, as sites run them (CVMFS/Frontier).

The hydrator's HTTP endpoint (daemon side and aiohttp child) serves a static inventory with a
short ``max_age_s``; the real hook script from deploy/ runs with ``http_proxy`` pointing at a
private squid. What reaches the hydrator is read from its own ``/metrics`` (asked directly, not
through squid), what squid did from its access log.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from hydrator.config import parse_config
from hydrator.runtime.http_endpoint import HttpEndpoint
from hydrator.runtime.metrics import Metrics
from hydrator.runtime.service import Service
from hydrator.runtime.wiring import build_service
from tests.support.squid import Squid, running_squid

REPO = Path(__file__).resolve().parents[2]
HOOK = REPO / "deploy" / "condor" / "hydrator-classad-hook"
MAX_AGE_S = 2
INVENTORY = """\
[storage.A]
site = "SITE_A"
available = ["ska:a1"]
[storage.B]
site = "SITE_B"
available = ["ska:b1"]
"""
pytestmark = pytest.mark.squid


class Hydrator:
    def __init__(self, tmp_path: Path) -> None:
        self.inventory = tmp_path / "inv.toml"
        self.inventory.write_text(INVENTORY)
        config = parse_config(
            {
                "daemon": {"state_path": "s.sqlite"},
                "sources": [{"type": "static", "path": "inv.toml", "settle_s": 0}],
                "http": {"listen": "127.0.0.1:0", "max_age_s": MAX_AGE_S},
            },
            tmp_path,
        )
        metrics = Metrics(CollectorRegistry())
        self.service: Service = build_service(config, metrics)
        self.service.run_cycle()
        self.endpoint = HttpEndpoint(self.service, config.http, wedged_after_s=300, metrics=metrics)
        self.endpoint.start()
        self.url = f"http://127.0.0.1:{self.endpoint.port}"

    def classad_requests(self) -> dict[str, float]:
        """Requests for site ads that reached the hydrator, by status code."""
        text = requests.get(f"{self.url}/metrics", timeout=5).text
        counts: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if (
                    sample.name == "hydrator_http_requests_total"
                    and sample.labels["route"] == "classad"
                ):
                    code = sample.labels["code"]
                    counts[code] = counts.get(code, 0) + sample.value
        return counts

    def stop(self) -> None:
        self.endpoint.stop()
        self.service.close()


@pytest.fixture
def squid() -> Iterator[Squid]:
    with running_squid() as proxy:
        yield proxy


@pytest.fixture
def hydrator(tmp_path: Path) -> Iterator[Hydrator]:
    h = Hydrator(tmp_path)
    yield h
    h.stop()


def hook(url: str, proxy: str, cache: Path, site: str) -> str:
    """One run of the real hook through ``proxy``; its standard output."""
    env = {"PATH": os.environ["PATH"], "HOME": str(cache.parent), "http_proxy": proxy}
    result = subprocess.run(
        [str(HOOK), "--url", url, "--site", site, "--cache-dir", str(cache), "--timeout", "5"],
        capture_output=True,
        text=True,
        env=env,
        timeout=20,
        check=True,
    )
    return result.stdout


def test_many_hooks_cost_the_hydrator_one_revalidation_per_max_age_per_site(
    squid: Squid, hydrator: Hydrator, tmp_path: Path
) -> None:
    hooks, period_s, duration_s = 6, 0.5, 6.0
    outputs: list[str] = []
    before = sum(hydrator.classad_requests().values())

    def poll(n: int) -> None:
        site = "SITE_A" if n % 2 else "SITE_B"
        deadline = time.monotonic() + duration_s
        while time.monotonic() < deadline:
            outputs.append(hook(hydrator.url, squid.proxy, tmp_path / f"node{n}", site))
            time.sleep(period_s)

    t0 = time.monotonic()
    threads = [threading.Thread(target=poll, args=(n,)) for n in range(hooks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - t0
    reached = hydrator.classad_requests()
    # per site: the first fetch, then at most one revalidation per max_age_s
    allowed = 2 * (1 + int(elapsed / MAX_AGE_S) + 1)
    assert len(outputs) >= hooks * 5
    assert sum(reached.values()) - before <= allowed, (reached, allowed, len(outputs))
    assert all('"ska:a1"' in out or '"ska:b1"' in out for out in outputs)
    assert reached.get("304", 0) >= 1, reached  # squid revalidates with If-None-Match
    codes = squid.codes()
    assert any(c.startswith("TCP_REFRESH_UNMODIFIED") for c in codes), codes
    assert any(c.endswith("/304") for c in codes), codes  # hooks' own If-None-Match answered


def test_a_changed_ad_reaches_the_hooks_within_max_age(
    squid: Squid, hydrator: Hydrator, tmp_path: Path
) -> None:
    cache = tmp_path / "node"
    assert '"ska:a1"' in hook(hydrator.url, squid.proxy, cache, "SITE_A")
    hydrator.inventory.write_text(INVENTORY.replace('"ska:a1"', '"ska:a2"'))
    hydrator.service.run_cycle()
    changed = time.monotonic()
    while '"ska:a2"' not in (out := hook(hydrator.url, squid.proxy, cache, "SITE_A")):
        assert '"ska:a1"' in out  # the previous values until then, never nothing
        assert time.monotonic() - changed < MAX_AGE_S + 1.0, "not seen within max_age_s"
        time.sleep(0.2)
    assert out.splitlines()[-1] == "- update:true"


def test_with_the_hydrator_stopped_squid_serves_the_last_ad_and_hooks_keep_it(
    squid: Squid, hydrator: Hydrator, tmp_path: Path
) -> None:
    first = hook(hydrator.url, squid.proxy, tmp_path / "node", "SITE_A")
    assert '"ska:a1"' in first
    hydrator.stop()
    time.sleep(MAX_AGE_S + 0.5)  # squid's copy is stale now: it must ask, and cannot
    again = hook(hydrator.url, squid.proxy, tmp_path / "node", "SITE_A")
    assert again.splitlines()[:-1] == first.splitlines()[:-1]
    fresh_node = hook(hydrator.url, squid.proxy, tmp_path / "new-node", "SITE_A")
    assert '"ska:a1"' in fresh_node  # no copy of its own: it came from squid (stale-if-error)
    assert any(c.startswith("TCP_REFRESH_FAIL_OLD") for c in squid.codes()), squid.codes()


def test_a_tampered_copy_behind_squid_is_replaced_not_revalidated(
    squid: Squid, hydrator: Hydrator, tmp_path: Path
) -> None:
    """Squid answers the hook's own If-None-Match with 304 ("print your copy"): a copy that
    no longer passes the hook's checks must not be revalidated, but fetched afresh."""
    cache = tmp_path / "node"
    first = hook(hydrator.url, squid.proxy, cache, "SITE_A")
    assert hook(hydrator.url, squid.proxy, cache, "SITE_A").endswith("-\n")  # a 304 path
    copy = cache / "SITE_A.classad"
    copy.write_text("START = true\nRequirements = true\nRank = 1000\n" + copy.read_text())

    again = hook(hydrator.url, squid.proxy, cache, "SITE_A")

    assert again == first  # the fresh ad, as a change; no START, Requirements or Rank
    assert "START" not in copy.read_text()
