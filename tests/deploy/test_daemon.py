"""The deployment artefacts against the real daemon (``hydrator run`` on the demo inventory).

The daemon runs under the systemd unit's process sandbox (tests/deploy/sandbox.py: its
SystemCallFilter=, RestrictAddressFamilies=, MemoryDenyWriteExecute=, NoNewPrivileges=); the
container HEALTHCHECK script probes it; the metrics the alert rules use are ones it exports;
SIGTERM (the unit's and the pod's stop signal) ends it with exit 0 well within TimeoutStopSec
and terminationGracePeriodSeconds.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.deploy.healthcheck import run_healthcheck, status
from tests.deploy.sandbox import address_families, allowed_syscalls, preexec
from tests.support.deploy import DEPLOY, REPO, venv_command
from tests.support.ports import free_port

pytestmark = pytest.mark.slow

UNIT = DEPLOY / "systemd" / "hydrator.service"
STARTUP_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0


@pytest.fixture
def daemon(tmp_path: Path, systemd_analyze: str) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A sandboxed ``hydrator run`` on a copy of the demo; yields (base URL, process)."""
    sandbox = preexec(allowed_syscalls(systemd_analyze, UNIT), address_families(UNIT))
    port = free_port()
    shutil.copy2(REPO / "config" / "demo-inventory.toml", tmp_path)  # old mtime: settled
    demo = (REPO / "config" / "demo.toml").read_text()
    config = tmp_path / "hydrator.toml"
    config.write_text(demo.replace("127.0.0.1:9620", f"127.0.0.1:{port}"))
    process = subprocess.Popen(
        [venv_command("hydrator"), "run", "--config", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "log").open("wb"),
        preexec_fn=sandbox,  # noqa: PLW1509 (the child runs no threads before exec)
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while status(f"{base}/readyz") != 200:
            if process.poll() is not None or time.monotonic() > deadline:
                log = (tmp_path / "log").read_text()
                pytest.fail(f"daemon not ready (exit {process.poll()}):\n{log}")
            time.sleep(0.2)
        yield base, process
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_sandboxed_daemon_is_healthy_by_the_container_healthcheck(
    daemon: tuple[str, subprocess.Popen[bytes]],
) -> None:
    base, process = daemon
    result = run_healthcheck(f"{base}/healthz")
    assert result.returncode == 0, result.stderr
    assert process.poll() is None


def test_alert_rules_use_metrics_the_daemon_exports(
    daemon: tuple[str, subprocess.Popen[bytes]],
) -> None:
    base, _ = daemon
    with urllib.request.urlopen(f"{base}/metrics", timeout=5) as response:
        exposition = response.read().decode()
    # the ones a static-source daemon without a collector has after one cycle
    for name in (
        "hydrator_last_successful_cycle_timestamp_seconds",
        "hydrator_cycles_total",
        "hydrator_source_staleness_seconds",
        "hydrator_invalid_records_total",
    ):
        assert f"\n{name}" in exposition, name


def test_sigterm_stops_the_daemon_with_exit_0(
    daemon: tuple[str, subprocess.Popen[bytes]],
) -> None:
    _, process = daemon
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=STOP_TIMEOUT_S) == 0
