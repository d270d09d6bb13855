"""No secret reaches any output: a marker in every credential, then every output is searched.

The daemon runs as a user runs it (``hydrator once``, ``hydrator run``) against the fake SRCNet
services (tests/support/fake_dmapi.py) and a Rucio server address that cannot be reached. Every
credential carries the marker, in each of the ways that leaked before:

* a DMAPI token file whose content has a line break inside (requests put the refused header
  value, ``Bearer <token>``, into its error message, which became the source's reason);
* a token endpoint answering an ``access_token`` with CR/LF inside;
* URLs with credentials (``http://user:password@host``) in an error text.

Then the text and JSON logs, the state database's bytes, ``once --json``, ``/v1/sites`` and
``/metrics`` must not hold the marker, and the reasons must still say what is wrong.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.support.daemon import Daemon
from tests.support.fake_dmapi import FakeSrcnet
from tests.support.ports import free_port
from tests.support.wait import wait_for

pytestmark = pytest.mark.slow

MARKER = "Zq7MARKERx"
INVENTORY = '[storage.CH_DISK]\navailable = ["ska:obs_1"]\n'


@pytest.fixture
def fake() -> Iterator[FakeSrcnet]:
    server = FakeSrcnet(client_secret=f"client-secret-{MARKER}")
    server.access_token = f"tok-{MARKER}-a\r\nX-Injected: tok-{MARKER}-b"
    with server.running():
        yield server


def write_config(tmp: Path, fake: FakeSrcnet, port: int) -> Path:
    """Four failing sources (one per leak) beside a static one that works."""
    (tmp / "inventory.toml").write_text(INVENTORY)
    (tmp / "dm-token").write_text(f"tok-{MARKER}-first\ntok-{MARKER}-second\n")
    (tmp / "good-token").write_text(f"good-{MARKER}\n")
    (tmp / "client-id").write_text(fake.client_id)
    (tmp / "client-secret").write_text(fake.client_secret)
    (tmp / "rucio-password").write_text(f"pw-{MARKER}\n")
    url_with_password = f"http://alice:url-{MARKER}@127.0.0.1:99999"  # an invalid port
    config = f"""
[daemon]
interval_s = 1
jitter_s = 0
state_path = "state.sqlite"

[http]
listen = "127.0.0.1:{port}"

[sites]
CH_DISK = "SRCNET_CH"

[[sources]]
type = "static"
name = "static"
path = "inventory.toml"
settle_s = 0

[[sources]]
type = "dmapi"
name = "dm-file"
base_url = "{fake.base_url}"
token_file = "dm-token"
datasets = ["ska:obs_1"]
max_attempts = 1

[[sources]]
type = "dmapi"
name = "dm-iam"
base_url = "{fake.base_url}"
token_url = "{fake.token_url}"
client_id_file = "client-id"
client_secret_file = "client-secret"
datasets = ["ska:obs_1"]
max_attempts = 1

[[sources]]
type = "dmapi"
name = "dm-url"
base_url = "{url_with_password}/api/v1"
token_file = "good-token"
datasets = ["ska:obs_1"]
max_attempts = 1

[[sources]]
type = "rucio"
name = "rucio"
rucio_host = "{url_with_password}"
auth_host = "{url_with_password}"
auth_type = "userpass"
account = "alice"
username = "alice"
password_file = "rucio-password"
max_attempts = 1
timeout_s = 2
"""
    path = tmp / "hydrator.toml"
    path.write_text(config)
    return path


def hydrator(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hydrator", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def assert_clean(what: str, text: str | bytes) -> None:
    data = text.encode() if isinstance(text, str) else text
    assert MARKER.encode() not in data, f"{what} holds a secret:\n{data[:3000]!r}"


def state_bytes(tmp: Path) -> bytes:
    """The database and any journal or WAL beside it."""
    return b"".join(p.read_bytes() for p in sorted(tmp.glob("state.sqlite*")))


def test_no_output_holds_a_secret(tmp_path: Path, fake: FakeSrcnet) -> None:
    config = str(write_config(tmp_path, fake, free_port()))
    once_text = hydrator("--log-format", "text", "once", "--json", "--config", config)
    once_json = hydrator("--log-format", "json", "once", "--json", "--config", config)
    for name, result in (("text", once_text), ("json", once_json)):
        assert result.returncode == 0, result.stderr
        assert_clean(f"once --json ({name} logs) stdout", result.stdout)
        assert_clean(f"{name} logs", result.stderr)
    assert_clean("the state database", state_bytes(tmp_path))

    reasons = {s["name"]: s["reason"] for s in json.loads(once_text.stdout)["sources"]}
    assert "dm-token holds whitespace or control characters" in reasons["dm-file"]
    assert f"token endpoint {fake.token_url} holds whitespace" in reasons["dm-iam"]
    assert "http://alice:[REDACTED]@127.0.0.1:99999" in reasons["dm-url"]
    assert "http://alice:[REDACTED]@127.0.0.1:99999" in reasons["rucio"]
    assert reasons["static"] is None
    assert fake.counts["locate"] == 0, "a refused token was sent"


def test_the_running_daemon_serves_and_logs_no_secret(tmp_path: Path, fake: FakeSrcnet) -> None:
    daemon = Daemon(tmp_path)
    config = write_config(tmp_path, fake, daemon.port)
    with daemon:
        daemon.start(config, ready=False)  # its failing sources never make it ready
        sites = wait_for_sources(daemon.url)
        metrics = requests.get(f"{daemon.url}/metrics", timeout=5).text
        assert_clean("/v1/sites", json.dumps(sites))
        assert_clean("/metrics", metrics)
        assert 'hydrator_source_errors_total{kind="permanent",source="dm-file"}' in metrics
        assert daemon.stop(timeout_s=20) == 0  # SIGTERM (SIGKILL after 20 s)
    assert_clean("the daemon's log", daemon.output())
    assert_clean("the state database", state_bytes(tmp_path))


def wait_for_sources(base: str) -> dict[str, object]:
    """``/v1/sites`` once it reports every source with a reason (after the first cycle)."""

    def sites() -> dict[str, object]:
        doc: dict[str, object] = requests.get(f"{base}/v1/sites", timeout=2).json()
        return doc

    def every_source(doc: dict[str, object]) -> bool:
        sources = doc.get("sources")
        return isinstance(sources, list) and len(sources) == 5

    return wait_for(
        "the daemon reports its five sources",
        sites,
        done=every_source,
        timeout_s=30.0,
        ignore=(requests.RequestException,),
        interval_s=0.2,
    )
