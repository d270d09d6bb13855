"""End to end, as processes: no source stalls the daemon, a fresh inventory is served at once,
long lists stay short.

The slow catalogues are real servers on 127.0.0.1: the DMAPI fake trickling its answers
(tests/support/fake_dmapi.py) and, for Rucio, a server that sends a status line and then one
header line every half second for ever (tests/support/trickle.py): rucio-clients' per-read
timeouts never fire on it, so only the service's deadline ends the fetch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.support.daemon import Daemon
from tests.support.fake_dmapi import FakeSrcnet
from tests.support.ports import free_port
from tests.support.trickle import TrickleServer, trickling
from tests.support.wait import wait_for

pytestmark = pytest.mark.slow

INVENTORY = '[storage.CH_DISK]\nsite = "SRCNET_CH"\navailable = ["ska:obs_1"]\n'


@pytest.fixture
def fake() -> Iterator[FakeSrcnet]:
    server = FakeSrcnet()
    with server.running():
        yield server


@pytest.fixture
def rucio() -> Iterator[TrickleServer]:
    with trickling(0.5) as server:
        yield server


def write_config(
    tmp: Path, fake: FakeSrcnet, rucio: TrickleServer, port: int, **daemon: object
) -> Path:
    """A static source beside a DMAPI source and a Rucio source that both trickle."""
    (tmp / "inventory.toml").write_text(INVENTORY)
    os.utime(tmp / "inventory.toml", (time.time() - 60, time.time() - 60))  # settled
    (tmp / "client-id").write_text(fake.client_id)
    (tmp / "client-secret").write_text(fake.client_secret)
    (tmp / "rucio-password").write_text("not-a-real-password\n")
    fake.add_dataset("ska", "obs_1", ("CH_DISK", None))
    fake.trickle_interval_s = 0.5
    fake.trickle_next("locate", 1000, "headers")
    settings = {"interval_s": 2, "jitter_s": 0, **daemon}
    lines = "\n".join(f"{k} = {v}" for k, v in settings.items())
    path = tmp / "hydrator.toml"
    path.write_text(
        f"""
[daemon]
{lines}
state_path = "state.sqlite"

[http]
listen = "127.0.0.1:{port}"

[[sources]]
type = "static"
name = "static"
path = "inventory.toml"
settle_s = 0

[[sources]]
type = "dmapi"
name = "dmapi"
base_url = "{fake.base_url}"
token_url = "{fake.token_url}"
client_id_file = "client-id"
client_secret_file = "client-secret"
datasets = ["ska:obs_1"]
deadline_s = 3
timeout_s = 2

[[sources]]
type = "rucio"
name = "rucio"
rucio_host = "{rucio.url}"
auth_host = "{rucio.url}"
auth_type = "userpass"
account = "alice"
username = "alice"
password_file = "rucio-password"
deadline_s = 3
timeout_s = 2
"""
    )
    return path


def hydrator(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hydrator", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def test_once_ends_at_the_deadline_of_trickling_sources(
    tmp_path: Path, fake: FakeSrcnet, rucio: TrickleServer
) -> None:
    """It used to run for as long as the server trickled."""
    config = write_config(tmp_path, fake, rucio, free_port())
    t0 = time.monotonic()
    result = hydrator("once", "--json", "--config", str(config))
    took = time.monotonic() - t0
    assert result.returncode == 0, result.stderr
    assert took < 12, f"once took {took:.1f} s with deadline_s = 3"  # + imports, grace, exit
    sources = {s["name"]: s for s in json.loads(result.stdout)["sources"]}
    assert sources["static"]["fresh"] and sources["static"]["entries"] == 1
    assert "deadline_s = 3 s" in sources["dmapi"]["reason"]
    assert "deadline_s = 3 s" in sources["rucio"]["reason"]
    assert rucio.counts["requests"] >= 1  # the Rucio fetch did reach the trickling server


def test_a_trickling_source_delays_no_other_and_sigterm_stops_the_daemon(
    tmp_path: Path, fake: FakeSrcnet, rucio: TrickleServer
) -> None:
    daemon = Daemon(tmp_path)
    config = write_config(tmp_path, fake, rucio, daemon.port)
    base = daemon.url
    with daemon:
        daemon.start(config, ready=False)  # its trickling sources never answer
        wait_for(
            "SRCNET_CH lists ska:obs_1",
            lambda: classad(base),
            done=lambda text: "ska:obs_1" in text,
            timeout_s=20.0,
        )
        inventory = tmp_path / "inventory.toml"
        inventory.write_text(INVENTORY.replace('["ska:obs_1"]', '["ska:obs_1", "ska:obs_2"]'))
        t0 = time.monotonic()
        # a cycle is at most deadline_s + 1 s grace (the sources are fetched side by side)
        # and the next starts at once (interval_s = 2 s is shorter): the change is out within
        # two cycles, ~8 s (a margin for a loaded machine; it used to wait for ever)
        wait_for(
            "SRCNET_CH lists ska:obs_2",
            lambda: classad(base),
            done=lambda text: "ska:obs_2" in text,
            timeout_s=15.0,
        )
        assert time.monotonic() - t0 < 12
        time.sleep(1)  # let a cycle be under way, waiting for the trickling sources
        t0 = time.monotonic()
        assert daemon.stop(timeout_s=15) == 0  # SIGTERM (SIGKILL after 15 s)
        assert time.monotonic() - t0 < 10, "SIGTERM took more than 10 s"
    log = daemon.output()
    assert "received SIGTERM, stopping" in log and "Traceback" not in log
    assert "no answer within deadline_s = 3 s" in log


def classad(base: str) -> str:
    try:
        return requests.get(f"{base}/v1/sites/SRCNET_CH/classad", timeout=2).text
    except requests.RequestException:
        return ""


def test_a_fresh_inventory_is_served_once_settled_not_an_interval_later(tmp_path: Path) -> None:
    """With interval_s = 60, nothing was served and /readyz stayed 503 for a minute."""
    port = free_port()
    (tmp_path / "hydrator.toml").write_text(
        f'[daemon]\ninterval_s = 60\nstate_path = "state.sqlite"\n'
        f'[http]\nlisten = "127.0.0.1:{port}"\n'
        '[[sources]]\ntype = "static"\npath = "inventory.toml"\nsettle_s = 2\n'
    )
    (tmp_path / "inventory.toml").write_text(INVENTORY)  # fresh: younger than settle_s
    t0 = time.monotonic()
    with Daemon(tmp_path, port) as daemon:
        daemon.start(tmp_path / "hydrator.toml", ready_timeout_s=20.0)  # /readyz answers 200
        assert time.monotonic() - t0 < 2 + 8, "settle_s = 2, plus start-up (not interval_s = 60)"
        assert "ska:obs_1" in classad(daemon.url)


def test_the_unmapped_list_is_bounded_in_once_json(tmp_path: Path, fake: FakeSrcnet) -> None:
    """600,001 unmapped identifiers made a 19 MB once --json."""
    fake.add_dataset("ska", "obs_1", *((f"RSE_{i:05d}", None) for i in range(2000)))
    (tmp_path / "client-id").write_text(fake.client_id)
    (tmp_path / "client-secret").write_text(fake.client_secret)
    (tmp_path / "hydrator.toml").write_text(
        '[daemon]\nstate_path = "state.sqlite"\n[sites]\nRSE_01999 = "SITE_A"\n'
        f'[[sources]]\ntype = "dmapi"\nbase_url = "{fake.base_url}"\n'
        f'token_url = "{fake.token_url}"\nclient_id_file = "client-id"\n'
        'client_secret_file = "client-secret"\ndatasets = ["ska:obs_1"]\n'
        "max_listed_unmapped = 3\n"
    )
    result = hydrator("once", "--json", "--config", str(tmp_path / "hydrator.toml"))
    assert result.returncode == 0, result.stderr
    (source,) = json.loads(result.stdout)["sources"]
    assert source["unmapped"] == ["RSE_00000", "RSE_00001", "RSE_00002"]
    assert source["unmapped_count"] == 1999
    assert result.stderr.count("no site for RSE") == 3
