"""Probing a running daemon as the deployments do: the container's HEALTHCHECK script and the
status code of an HTTP path (shared by test_docker.py, test_daemon.py and test_image.py)."""

from __future__ import annotations

import subprocess
import sys
import urllib.error
import urllib.request

from tests.support.deploy import DEPLOY

HEALTHCHECK = DEPLOY / "docker" / "healthcheck.py"


def run_healthcheck(url: str) -> subprocess.CompletedProcess[str]:
    """The HEALTHCHECK script against ``url``, as the image runs it (``python -I``, 30 s bound)."""
    return subprocess.run(
        [sys.executable, "-I", str(HEALTHCHECK)],
        env={"HYDRATOR_HEALTHCHECK_URL": url},
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )


def status(url: str) -> int:
    """The HTTP status of GET ``url`` (2 s bound); 0 when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0
