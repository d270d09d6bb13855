"""The ``model-tricks`` scenario runs at a tiny size and records what it measured (no timing
is asserted: the figures are for ``hydrator/core/model.py``'s docstring, not for tests)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "benchmarks", "model-tricks", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_a_tiny_run_records_each_trick_against_its_plain_code(tmp_path: Path) -> None:
    out = tmp_path / "tricks.json"
    ran = _run("--replicas", "2000", "--repetitions", "2", "--json", str(out))
    assert ran.returncode == 0, ran.stderr
    figures = json.loads(out.read_text())
    assert json.loads(ran.stdout) == figures
    assert (figures["replicas"], figures["repetitions"], figures["sites"]) == (2000, 2, 50)
    assert figures["delta"]["added"] > 0 and figures["delta"]["removed"] > 0
    for part, variants, pairs in [
        ("site_counts", ("recount", "patch"), {"patch_vs_recount"}),
        ("index_of", ("attribute", "positional"), {"positional_vs_attribute"}),
        (
            "views_of",
            ("no_shortcut", "attribute", "positional"),
            {"attribute_vs_no_shortcut", "positional_vs_attribute"},
        ),
    ]:
        for variant in variants:
            timed = figures[part][f"{variant}_s"]
            assert len(timed["runs"]) == 2 and timed["max"] == max(timed["runs"])
        assert set(figures[part]["saving_pct"]) == pairs
    assert len(figures["plan_churn_s"]["runs"]) == 2
    for part, variants, pairs in [
        (
            figures["one_source_index"]["first_plan"],
            ("without_index", "with_index"),
            {"without_index_vs_with_index"},
        ),
        (
            figures["one_source_index"]["churn_plan"],
            ("without_index", "with_index"),
            {"without_index_vs_with_index"},
        ),
        (
            figures["identity_reuse"]["delta"],
            ("same_set", "differences", "new_objects"),
            {"same_set_vs_differences", "same_set_vs_new_objects"},
        ),
        (figures["identity_reuse"]["index"], ("rebuild", "patch"), {"patch_vs_rebuild"}),
        (figures["first_changes"], ("lazy", "built"), {"lazy_vs_built"}),
    ]:
        for variant in variants:
            assert len(part[f"{variant}_s"]["runs"]) == 2
        assert set(part["saving_pct"]) == pairs
    assert figures["one_source_index"]["index_bytes"]["held"] > 0
    reuse = figures["identity_reuse"]
    assert reuse["second_object_bytes_per_replica"] > 0 < reuse["second_set_bytes_per_replica"]
    changes = figures["first_changes"]
    assert changes["changes"] == 2000
    assert changes["built_bytes"]["held"] > changes["lazy_bytes"]["held"]
    for when in ("machine_before", "machine_after"):
        assert len(figures[when]["load_average"]) == 3 and figures[when]["cpu"]


def test_its_options_are_checked() -> None:
    helped = _run("--help")
    assert helped.returncode == 0 and "--repetitions" in helped.stdout
    refused = _run("--repetitions", "0")
    assert refused.returncode == 2 and "at least 1" in refused.stderr
