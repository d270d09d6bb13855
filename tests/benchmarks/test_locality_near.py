"""The locality scenario's near-with-budget targets are judged from the record (no pool
needed): a missed target is reported as missed, an absent comparison as not checked; its
options select scenarios and refuse a budget of 0."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks.locality import NEAR, TOTAL, background_submit, near_targets, scenarios

ROOT = Path(__file__).resolve().parents[2]


def record(key: str, makespan_s: float, **more: Any) -> dict[str, Any]:
    return {"key": key, "makespan_s": makespan_s, **more}


def near(**changed: Any) -> dict[str, Any]:
    fields = {"local_fraction": 0.75, "near_fraction": 0.25, "started": TOTAL}
    fields |= {"max_remote_readers": 2, "budget": 2}
    return record("near", 20.0, **(fields | changed))


def test_near_targets_met_missed_and_not_checked() -> None:
    met = near_targets([record("c", 40.0), record("d", 20.0), near()])
    assert [ok for _, _, ok in met] == [True, True, True, True]
    missed = near_targets([record("c", 25.0), record("d", 15.0), near(max_remote_readers=3)])
    assert [ok for _, _, ok in missed] == [True, False, False, False]
    far = near_targets([near(near_fraction=0.2)])
    assert [ok for _, _, ok in far] == [False, True, None, None]


def test_the_near_scenario_writes_hydrator_expr_near_and_its_table_is_symmetric() -> None:
    (scenario,) = [s for s in scenarios() if s.key == "near"]
    assert scenario.annotate and any("concurrency_limits_expr" in line for line in scenario.lines)
    assert all(a in NEAR[b] for a in NEAR for b in NEAR[a])
    assert NEAR["SITE_D"] == {"SITE_A", "SITE_B", "SITE_C"}


def locality(*options: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "benchmarks", "locality", *options],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_a_budget_of_0_and_an_unknown_scenario_are_refused() -> None:
    for options in (["--budget", "0"], ["--scenarios", "c", "nearby"]):
        run = locality(*options)
        assert run.returncode == 2, run.stderr


def test_the_background_pins_its_jobs_to_their_sites_and_declares_no_data() -> None:
    text = background_submit({"SITE_A": 2, "SITE_B": 1, "SITE_D": 0}, 3600)
    rows = text.split("queue Site from (\n")[1].split("\n)")[0].split("\n")
    assert rows == ["SITE_A", "SITE_A", "SITE_B"]
    assert 'requirements = TARGET.GLIDEIN_Site =?= "$(Site)"' in text.splitlines()
    assert "arguments = 3600" in text.splitlines()
    assert "RequiredDatasets" not in text and "concurrency_limits" not in text


def test_the_contended_workload_holds_two_of_three_slots_at_each_data_site_only() -> None:
    run = locality("--workload", "contended", "--scenarios", "c", "d", "d2", "near", "--dry-run")
    assert run.returncode == 0, run.stderr
    out = run.stdout
    assert "BACKGROUND = {'SITE_A': 2, 'SITE_B': 2, 'SITE_C': 2}" in out.splitlines()
    assert "TOTAL = 24" in out.splitlines() and "REMOTE_BUDGET = 1" in out.splitlines()
    assert "CONCURRENCY_LIMIT_DEFAULT_REMOTE = 1" in out.splitlines()
    background = out.split("# background\n")[1].split("queue Site from (\n")[1].split("\n)")[0]
    assert background.split() == ["SITE_A", "SITE_A", "SITE_B", "SITE_B", "SITE_C", "SITE_C"]
    assert out.count("# scenario ") == 4 and "fallback after 107 s" in out


def test_the_contended_workload_refuses_the_glidein_scenarios_and_short_has_no_background() -> None:
    refused = locality("--workload", "contended", "--scenarios", "c", "e2", "--dry-run")
    assert refused.returncode == 2 and "e1 and e2" in refused.stderr
    short = locality("--scenarios", "c", "--dry-run")
    assert short.returncode == 0 and "BACKGROUND = {}" in short.stdout.splitlines()
    assert "# background" not in short.stdout and "TOTAL = 48" in short.stdout.splitlines()


def test_the_busy_workload_has_long_jobs_a_binding_budget_and_site_a_near_every_site() -> None:
    run = subprocess.run(
        [sys.executable, "-c", BUSY],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert run.stdout.split() == ["48", "15", "1", "SITE_B,SITE_C,SITE_D", "SITE_A,SITE_D", "True"]


# In a child: select_workload rebinds the module's constants.
BUSY = """
from benchmarks import locality as L
L.select_workload("busy")
near = L.NEAR
sub = L.scenarios()[-1].submit()
print(L.TOTAL, min(L.SLEEPS_S), L.REMOTE_BUDGET, ",".join(sorted(near["SITE_A"])),
      ",".join(sorted(near["SITE_B"])), all(a in near[b] for a in near for b in near[a])
      and "$(Sleep)" in sub and " 24\\n" in sub)
"""
