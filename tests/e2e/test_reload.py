"""End to end (issue 26 item 9): ``hydrator run`` as a real process reloads its configuration
on SIGHUP: a valid change takes effect, an invalid one is refused with one line naming the
problem while the daemon keeps serving; it stops cleanly afterwards."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import requests

from tests.support.squid import free_port

pytestmark = pytest.mark.slow

ONE_SOURCE = """
[daemon]
interval_s = 1
jitter_s = 0
state_path = "state.sqlite"

[http]
listen = "127.0.0.1:{port}"

[[sources]]
type = "static"
name = "first"
path = "first.toml"
settle_s = 0
"""
SECOND_SOURCE = """
[[sources]]
type = "static"
name = "second"
path = "second.toml"
settle_s = 0
"""


def until(check: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except requests.RequestException:
            pass
        time.sleep(0.2)
    raise AssertionError("condition not met in time")


class Running:
    def __init__(self, tmp: Path, proc: subprocess.Popen[bytes], base: str) -> None:
        self.tmp, self.proc, self.base = tmp, proc, base

    def log(self) -> str:
        return (self.tmp / "stderr.log").read_text()

    def status(self, site: str) -> int:
        return requests.get(f"{self.base}/v1/sites/{site}/classad", timeout=5).status_code

    def hup(self, config: str) -> int:
        """Write ``config``, send SIGHUP; the log's length before (to read what follows)."""
        (self.tmp / "hydrator.toml").write_text(config)
        mark = len(self.log())
        self.proc.send_signal(signal.SIGHUP)
        return mark


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Running]:
    port = free_port()
    (tmp_path / "first.toml").write_text('[storage.A]\nsite = "SITE_A"\navailable = ["ska:a"]\n')
    (tmp_path / "second.toml").write_text('[storage.B]\nsite = "SITE_B"\navailable = ["ska:b"]\n')
    config = ONE_SOURCE.format(port=port)
    (tmp_path / "hydrator.toml").write_text(config)
    with open(tmp_path / "stderr.log", "wb") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "hydrator", "run", "--config", str(tmp_path / "hydrator.toml")],
            stderr=stderr,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    running = Running(tmp_path, proc, f"http://127.0.0.1:{port}")
    try:
        until(lambda: running.status("SITE_A") == 200)
        yield running
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_sighup_applies_a_valid_config_and_refuses_an_invalid_one(daemon: Running) -> None:
    config = ONE_SOURCE.format(port=daemon.base.rsplit(":", 1)[1])
    assert daemon.status("SITE_B") == 404

    mark = daemon.hup(config.replace("interval_s = 1", "interval_s = 0"))
    until(lambda: "reload refused" in daemon.log()[mark:])
    time.sleep(2.5)  # two cycles of the running configuration
    refused = [line for line in daemon.log()[mark:].splitlines() if "reload" in line]
    assert len(refused) == 2, refused  # "received SIGHUP", then the one refusal
    assert (
        "ERROR" in refused[1]
        and "daemon.interval_s: Input should be greater than 0" in (refused[1])
    )
    assert daemon.proc.poll() is None and daemon.status("SITE_A") == 200

    # valid TOML and keys, but no service can be built from it: refused after the build
    mark = daemon.hup(config + SECOND_SOURCE + '[classad]\nadvertise = "demand"\n')
    until(lambda: "reload refused" in daemon.log()[mark:])
    assert "classad.advertise" in daemon.log()[mark:]
    until(lambda: daemon.status("SITE_A") == 200)
    assert daemon.status("SITE_B") == 404 and daemon.proc.poll() is None

    mark = daemon.hup(config + SECOND_SOURCE)
    until(lambda: daemon.status("SITE_B") == 200)
    assert "reloaded: 2 source(s)" in daemon.log()[mark:]
    assert '"ska:b"' in requests.get(f"{daemon.base}/v1/sites/SITE_B/classad", timeout=5).text
    assert daemon.status("SITE_A") == 200

    daemon.proc.send_signal(signal.SIGTERM)
    assert daemon.proc.wait(timeout=20) == 0
    assert "Traceback" not in daemon.log()
