"""The fetch-only benchmark (benchmarks/fetch_only.py) measures both sides' fetches in one run."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_old_and_new_fetches_are_measured_in_one_run(tmp_path: Path) -> None:
    old = tmp_path / "old"
    shutil.copytree(ROOT / "hydrator", old / "hydrator", ignore=shutil.ignore_patterns("*.pyc"))
    out = tmp_path / "fetch.json"
    command = [sys.executable, "-m", "benchmarks", "fetch", "--replicas", "1000"]
    command += ["--cycles", "2", "--rounds", "1", "--code", str(old), "--json", str(out)]
    done = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    for side in ("old", "new"):
        (run,) = result["runs"][side]
        assert len(run["churn"]) == 2 and len(run["nochange"]) == 2
        assert all(cpu > 0 and wall > 0 for cpu, wall in [run["first"], *run["churn"]])
    assert set(result["new_vs_old_pct"]) == set(result["old"]) >= {"churn_cpu_s", "first_cpu_s"}


def test_the_old_side_is_required() -> None:
    command = [sys.executable, "-m", "benchmarks", "fetch", "--replicas", "1000"]
    refused = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    assert refused.returncode == 2 and "--code DIR" in refused.stderr
