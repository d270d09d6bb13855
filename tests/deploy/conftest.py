"""Fixtures for the deployment checks: the tools they run, installed when missing (what the
checks import, paths and helpers, is in tests/support/deploy.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.support.deploy import CACHE, ensure_command

PROMETHEUS_OPERATOR_MODELS = "@kubernetes-models/prometheus-operator@6.0.0"


@pytest.fixture(scope="session")
def systemd_analyze() -> str:
    return ensure_command("systemd-analyze", "systemd")


@pytest.fixture(scope="session")
def promtool() -> str:
    return ensure_command("promtool", "prometheus")


@pytest.fixture(scope="session")
def servicemonitor_validator() -> list[str]:
    """argv prefix of a node script that validates ServiceMonitor JSON documents on stdin."""
    node = ensure_command("node", "nodejs")
    ensure_command("npm", "npm")
    prefix = CACHE / "npm-prometheus-operator"
    marker = prefix / "node_modules" / "@kubernetes-models" / "prometheus-operator" / "package.json"
    if not marker.exists():
        prefix.mkdir(parents=True, exist_ok=True)
        (prefix / "package.json").write_text('{"private": true, "type": "module"}\n')
        result = subprocess.run(
            [
                "npm",
                "install",
                "--no-audit",
                "--no-fund",
                "--prefix",
                str(prefix),
                PROMETHEUS_OPERATOR_MODELS,
            ],
            check=False,
            capture_output=True,
            text=True,
            timeout=300,
        )
        if result.returncode != 0:
            raise RuntimeError(f"npm install failed:\n{result.stdout}{result.stderr}")
    script = prefix / "validate-servicemonitor.mjs"
    script.write_text((Path(__file__).parent / "validate_servicemonitor.mjs").read_text())
    return [node, str(script)]
