"""The locality scenario's near-with-budget targets are judged from the record (no pool
needed): a missed target is reported as missed, an absent comparison as not checked; its
options select scenarios and refuse a budget of 0."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks.locality import NEAR, TOTAL, near_targets, scenarios

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


def test_a_budget_of_0_and_an_unknown_scenario_are_refused() -> None:
    for options in (["--budget", "0"], ["--scenarios", "c", "nearby"]):
        run = subprocess.run(
            [sys.executable, "-m", "benchmarks", "locality", *options],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert run.returncode == 2, run.stderr


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
