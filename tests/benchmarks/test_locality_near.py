"""The locality scenario's near-with-budget targets are judged from the record (no pool
needed): a missed target is reported as missed, an absent comparison as not checked; its
options select scenarios and refuse a budget of 0."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks.locality import (
    INITIAL,
    NEAR,
    TOTAL,
    Experiment,
    _record,
    background_submit,
    medians,
    near_targets,
    orders,
    scenarios,
)

ROOT = Path(__file__).resolve().parents[2]


def record(key: str, makespan_s: float, **more: Any) -> dict[str, Any]:
    return {"key": key, "makespan_s": makespan_s, **more}


def near(makespan_s: float = 20.0, **changed: Any) -> dict[str, Any]:
    fields = {"local_fraction": 0.75, "near_fraction": 0.25, "started": TOTAL}
    fields |= {"max_remote_readers": 2, "budget": 2}
    return record("near", makespan_s, **(fields | changed))


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


def test_a_budget_of_0_a_repeat_of_0_and_an_unknown_scenario_are_refused() -> None:
    for options in (["--budget", "0"], ["--repeat", "0"], ["--scenarios", "c", "nearby"]):
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


def test_repeats_rotate_the_order_so_that_no_scenario_always_runs_first() -> None:
    assert orders(["c", "d", "d2", "near"], 1) == [["c", "d", "d2", "near"]]
    three = orders(["c", "d", "d2", "near"], 3)
    assert three == [["c", "d", "d2", "near"], ["d", "d2", "near", "c"], ["d2", "near", "c", "d"]]
    four = orders(["c", "d", "d2", "near"], 4)
    for key in ("c", "d", "d2", "near"):
        assert sorted(order.index(key) for order in four) == [0, 1, 2, 3]
    dry = locality("--workload", "contended", "--scenarios", "c", "d", "near", "--repeat", "2",
                   "--dry-run")  # fmt: skip
    assert dry.returncode == 0, dry.stderr
    assert "REPEAT 0 ORDER = c d near" in dry.stdout.splitlines()
    assert "REPEAT 1 ORDER = d near c" in dry.stdout.splitlines()


def test_the_median_per_scenario_and_its_targets_keep_the_worst_remote_readers() -> None:
    spans = [(100.0, 110.0, 2), (105.0, 100.0, 3), (110.0, 104.0, 2)]  # d, near, readers
    runs: list[dict[str, Any]] = [
        {"repeat": i, "order": ["d", "near"], "scenarios": [
            record("d", span_d, **common(i)),
            near(span, **(common(i) | {"max_remote_readers": readers}))]}
        for i, (span_d, span, readers) in enumerate(spans)
    ]  # fmt: skip
    began = {"load_avg_start": [1.0], "utc_start": "", "commit": "", "condor_version": "25"}
    out = _record(runs, began, "", 2, complete=True)
    assert [s["repeat"] for s in out["scenarios"]] == [0, 0, 1, 1, 2, 2]
    assert out["median"]["near"]["makespan_s"] == 104.0 and out["median"]["d"]["makespan_s"] == 105
    assert out["median"]["near"]["max_remote_readers"] == 3 and out["median"]["near"]["runs"] == 3
    assert out["median"]["near"]["budget"] == 2 and out["meta"]["complete"] is True
    per_run = [[t["met"] for t in r["near_targets"]] for r in out["runs"]]
    assert per_run == [[True, True, False, None], [True, False, True, None],
                       [True, True, True, None]]  # fmt: skip
    median = {t["target"]: t["met"] for t in out["median_near_targets"]}
    assert median["makespan <= rank-only's"] is True
    assert median["remote readers per site <= budget"] is False
    assert (
        medians([record("d", 1.0, **common(0)), record("d", 3.0, **common(0))])["d"]["makespan_s"]
        == 2.0
    )


def common(i: int) -> dict[str, Any]:
    fields = {"wait_median_s": 1.0 + i, "wait_p95_s": 2.0, "last_start_s": 3.0}
    fields |= {"local_fraction": 0.75, "near_fraction": 0.25, "far_fraction": 0.0}
    return fields | {"max_remote_readers": 2, "started": TOTAL}


def test_a_data_sites_slot_lent_to_another_datasets_reader_is_counted_while_its_jobs_wait() -> None:
    experiment = Experiment.__new__(Experiment)  # no pool: only the timeline and the times
    experiment.at, experiment.timeline = {"submitted": 0.0}, [(0.0, INITIAL)]
    jobs = [
        [0, ["ska:exp_a"], "SITE_B", 0.0, 0.0, False, 10.0, "far", None],  # on B's slot
        [1, ["ska:exp_b"], "SITE_B", 10.0, 10.0, True, 20.0, "local", None],  # waited for it
        [2, ["ska:exp_c"], "SITE_D", 0.0, 0.0, False, 30.0, "near", None],  # D holds nothing
        [3, ["ska:exp_a"], "SITE_A", 0.0, 0.0, True, 30.0, "local", None],
    ]
    lent = experiment.lent_while_waiting(jobs)
    assert lent == {"SITE_A": 0.0, "SITE_B": 10.0, "SITE_C": 0.0, "SITE_D": 0.0}
