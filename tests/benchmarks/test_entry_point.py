"""The benchmarks' one entry point lists its scenarios and runs one with its own options."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "benchmarks", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )


def test_the_entry_point_lists_every_scenario() -> None:
    listed = _run("--help")
    assert listed.returncode == 0
    for name in (
        "cycle",
        "state-store",
        "demand",
        "annotation",
        "events",
        "http",
        "locality",
        "coverage",
        "repair-look",
        "record-rucio",
        "model-tricks",
        "fast-paths",
    ):
        assert f"  {name} " in listed.stdout


def test_a_scenario_runs_with_its_own_options_and_an_unknown_one_is_refused() -> None:
    generated = _run("generate", "--replicas", "1000", "--cycles", "1")
    assert generated.returncode == 0, generated.stderr
    assert "'replicas': 1000" in generated.stdout and "churn 1:" in generated.stdout
    cycle_help = _run("cycle", "--help")
    assert cycle_help.returncode == 0 and "--code" in cycle_help.stdout
    assert "--rounds" in cycle_help.stdout
    unknown = _run("http_compare")
    assert unknown.returncode == 2 and "invalid choice" in unknown.stderr


def test_the_http_scenario_says_in_one_line_that_wrk_is_missing(tmp_path: Path) -> None:
    refused = _run("http", "--replicas", "1000", env={**os.environ, "PATH": str(tmp_path)})
    assert refused.returncode == 1
    assert refused.stderr.strip().splitlines() == [
        "http: wrk is not installed (apt-get install --no-install-recommends wrk)"
    ]
