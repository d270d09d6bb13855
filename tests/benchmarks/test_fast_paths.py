"""The ``fast-paths`` scenario runs at a tiny size and records what it measured (no timing is
asserted: the figures are for docs/performance.md, not for tests)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "benchmarks", "fast-paths", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_a_tiny_run_records_each_fast_path_against_its_plain_code(tmp_path: Path) -> None:
    out = tmp_path / "fast_paths.json"
    ran = _run(
        *("--site-datasets", "500", "--ids", "1000", "--replicas", "2000"),
        *("--repetitions", "2", "--json", str(out)),
    )
    assert ran.returncode == 0, ran.stderr
    figures = json.loads(out.read_text())
    assert json.loads(ran.stdout) == figures
    assert (figures["site_datasets"], figures["ids"], figures["replicas"]) == (500, 1000, 2000)
    rendered = figures["render"]
    assert rendered["datasets"] == 500 == sum(rendered["lists"].values())
    assert figures["json"]["datasets"] == 500 - rendered["lists"]["stuck"]
    for part, variants, pairs in [
        (
            figures["render"]["names"],
            ("one_pattern", "two_patterns"),
            {"one_pattern_vs_two_patterns"},
        ),
        (
            figures["render"]["site_classad"],
            ("one_pattern", "two_patterns"),
            {"one_pattern_vs_two_patterns"},
        ),
        (figures["intern"]["make"], ("interned", "plain"), {"interned_vs_plain"}),
        (figures["intern"]["compare"], ("interned", "plain"), {"interned_vs_plain"}),
        (figures["towards"]["build"], ("tuples", "dicts"), {"tuples_vs_dicts"}),
        (figures["towards"]["lookups"], ("tuples", "dicts"), {"tuples_vs_dicts"}),
        (
            figures["json"]["encode"],
            ("compact", "indent", "default_separators"),
            {"compact_vs_indent", "compact_vs_default_separators"},
        ),
        (
            figures["json"]["file"],
            ("compact", "indent", "default_separators"),
            {"compact_vs_indent", "compact_vs_default_separators"},
        ),
    ]:
        for variant in variants:
            timed = part[f"{variant}_s"]
            assert len(timed["runs"]) == 2 and timed["max"] == max(timed["runs"])
        assert set(part["saving_pct"]) == pairs
    intern, transfers = figures["intern"], figures["towards"]
    assert intern["ids"] == 1000
    assert intern["bytes"]["plain"]["held"] > intern["bytes"]["interned"]["held"] > 0
    assert transfers["replicas"] == 2000 and transfers["datasets_with_rules"] > 0
    assert transfers["bytes"]["dicts"]["held"] > transfers["bytes"]["tuples"]["held"] > 0
    sizes = figures["json"]["bytes"]
    assert sizes["indent"] > sizes["default_separators"] > sizes["compact"] > 0
    for when in ("machine_before", "machine_after"):
        assert len(figures[when]["load_average"]) == 3 and figures[when]["cpu"]


def test_its_options_are_checked() -> None:
    helped = _run("--help")
    assert helped.returncode == 0 and "--site-datasets" in helped.stdout
    refused = _run("--ids", "0")
    assert refused.returncode == 2 and "at least 1" in refused.stderr
