"""The locality experiment's pure parts (``benchmarks/locality_model.py``): scoring a scenario
and the simulated GlideinWMS frontend, on made-up observations (no pool)."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks.locality import (
    JOBS_PER_DATASET,
    NO_DATA_MATCH_EXPR,
    SITES,
    annotated_match_expr,
    choose_slots,
    job_lines,
    submit_description,
)
from benchmarks.locality_model import (
    JobRecord,
    Timeline,
    allocate,
    compile_match_expr,
    count_requests,
    glideins,
    match_expr_from_doc,
    percentile,
    score,
    work_conserving_ceiling,
)

A = frozenset({"ska:a"})
MATCH = 'glidein["attrs"].get("GLIDEIN_Site") in (job.get("DataLocalitySites") or [])'


def moving_timeline() -> Timeline:
    """ska:a at SITE_A until t=100, at both until t=105, then at SITE_D only."""
    t = Timeline()
    t.record(0, {"SITE_A": A, "SITE_D": frozenset()})
    t.record(100, {"SITE_A": A, "SITE_D": A})
    t.record(105, {"SITE_A": frozenset(), "SITE_D": A})
    return t


def test_local_means_the_slots_site_held_the_data_at_start() -> None:
    jobs = [
        JobRecord(0, A, queued=0, started=10, site="SITE_A"),  # local
        JobRecord(1, A, queued=0, started=102, site="SITE_D"),  # local: replicated at 100
        JobRecord(2, A, queued=0, started=110, site="SITE_A"),  # remote: removed at 105
        JobRecord(3, A, queued=0, started=50, site="SITE_D"),  # remote: not there yet
        JobRecord(4, A, queued=100, started=None),  # idle at the end, data at SITE_D: stranded
    ]
    result = score(jobs, moving_timeline(), ended=200, moved=105)
    assert result["started"] == 4
    assert result["local"] == 2
    assert result["local_fraction"] == 0.5
    assert result["local_fraction_before_move"] == pytest.approx(2 / 3)
    assert result["local_fraction_after_move"] == 0.0
    assert result["started_after_move"] == 1
    assert result["stranded"] == 1
    assert result["wait_censored"] == 1  # its wait counts up to the end: 100 s


def test_a_job_whose_data_is_nowhere_is_not_stranded() -> None:
    t = Timeline()
    t.record(0, {"SITE_A": frozenset()})
    result = score([JobRecord(0, A, queued=0)], t, ended=60)
    assert result["stranded"] == 0
    assert result["never_started"] == 1
    assert result["local_fraction"] is None


def test_waits_median_and_p95() -> None:
    t = Timeline()
    t.record(0, {"SITE_A": A})
    jobs = [JobRecord(i, A, queued=0, started=float(i), site="SITE_A") for i in range(1, 21)]
    result = score(jobs, t, ended=30)
    assert result["wait_median_s"] == 10.5
    assert result["wait_p95_s"] == pytest.approx(19.05)
    assert percentile([], 50) is None
    assert percentile([7.0], 95) == 7.0


def test_timeline_refuses_points_out_of_order() -> None:
    t = moving_timeline()
    with pytest.raises(ValueError, match="time order"):
        t.record(50, {})


def test_request_counting_splits_a_job_over_its_matching_entries() -> None:
    jobs = [
        {"RequiredDatasets": ["ska:a"], "DataLocalitySites": ["SITE_A", "SITE_B"]},
        {"RequiredDatasets": ["ska:a"], "DataLocalitySites": ["SITE_A"]},
        {"RequiredDatasets": ["ska:x"], "DataLocalitySites": []},  # data nowhere: no request
        {"RequiredDatasets": ["ska:a"]},  # not annotated: matches no entry
    ]
    match = compile_match_expr(MATCH)
    requests = count_requests(jobs, SITES, match, lambda job: frozenset({"SITE_A"}))
    assert requests.by_site == {"SITE_A": 1.5, "SITE_B": 0.5, "SITE_C": 0.0, "SITE_D": 0.0}
    assert requests.total == 2
    assert requests.unmatched_jobs == 2
    assert requests.share_at_data_sites == 0.75  # SITE_B got half a job's request, no data


def test_a_frontend_without_data_spreads_requests_by_idle_job_count() -> None:
    jobs = [{"RequiredDatasets": ["ska:a"]}] * 8
    match = compile_match_expr(NO_DATA_MATCH_EXPR)
    requests = count_requests(jobs, SITES, match, lambda job: frozenset({"SITE_A"}))
    assert requests.by_site == dict.fromkeys(SITES, 2.0)
    assert requests.share_at_data_sites == 0.25


def test_an_error_in_match_expr_counts_as_no_match() -> None:
    match = compile_match_expr('job["Missing"] in glidein["attrs"]["GLIDEIN_Site"]')
    assert match({}, {"attrs": {"GLIDEIN_Site": "SITE_A"}}) is False


def test_match_expr_is_read_from_its_fenced_block() -> None:
    doc = 'Text\n\n```python\nnot this\n```\n\n```python match_expr\n  job.get("X") == 1\n```\n'
    assert match_expr_from_doc(doc) == 'job.get("X") == 1'
    with pytest.raises(ValueError, match="found 0"):
        match_expr_from_doc("```python\nx\n```\n")


def test_allocation_splits_the_budget_in_proportion() -> None:
    demand = {"SITE_A": 10.0, "SITE_B": 10.0, "SITE_C": 10.0, "SITE_D": 0.0}
    assert allocate(demand, budget=6, cap=3) == {"SITE_A": 2, "SITE_B": 2, "SITE_C": 2, "SITE_D": 0}
    # never more than the demand (rounded up) or the cap at a site
    assert allocate({"SITE_A": 0.5, "SITE_B": 9.0}, budget=6, cap=3) == {"SITE_A": 1, "SITE_B": 3}
    assert allocate({"SITE_A": 0.0}, budget=6, cap=3) == {"SITE_A": 0}
    spread = allocate(dict.fromkeys(SITES, 7.5), budget=6, cap=3)
    assert sum(spread.values()) == 6
    assert sorted(spread.values()) == [1, 1, 2, 2]


def test_busy_glideins_stay_and_busy_slots_are_kept() -> None:
    assert glideins({"SITE_A": 0, "SITE_B": 2}, {"SITE_A": 1}, cap=3) == {"SITE_A": 1, "SITE_B": 2}
    chosen = choose_slots({"SITE_A": 1, "SITE_D": 2}, busy=frozenset({"slot3"}))
    assert chosen == {"slot3", "slot10", "slot11"}


def test_scenario_jobs_carry_the_hydrator_expressions() -> None:
    strict = "\n".join(job_lines("strict"))
    assert 'identicalMember("$(Dataset)", TARGET.AvailableDatasets)' in strict
    assert "requirements" not in "\n".join(job_lines("rank"))
    text = submit_description(
        "b",
        "desired",
        {
            "SITE_A": frozenset({"ska:exp_a"}),
            "SITE_B": frozenset({"ska:exp_b"}),
            "SITE_C": frozenset({"ska:exp_c"}),
        },
    )
    assert "ska:exp_a SITE_A" in text
    assert text.count("\nska:exp_") == 3 * JOBS_PER_DATASET


def test_the_documented_match_expr_requests_glideins_only_where_the_data_is() -> None:
    """docs/provisioning.md's match_expr over jobs as the bindings (list) or the XML fallback
    (string) give them; a job not yet annotated or whose data is nowhere requests nothing."""
    jobs: list[dict[str, Any]] = [
        {"RequiredDatasets": ["ska:a"], "DataLocalitySites": ["SITE_A"]},
        {"RequiredDatasets": ["ska:b"], "DataLocalitySites": '{ "SITE_B","SITE_D" }'},
        {"RequiredDatasets": ["ska:b"], "DataLocalitySites": "SITE_B,SITE_D"},
        {"RequiredDatasets": ["ska:x"], "DataLocalitySites": []},
        {"RequiredDatasets": ["ska:a"]},
    ]
    held = {"ska:a": {"SITE_A"}, "ska:b": {"SITE_B", "SITE_D"}}
    requests = count_requests(
        jobs,
        SITES,
        compile_match_expr(annotated_match_expr()),
        lambda job: frozenset(held.get(job["RequiredDatasets"][0], ())),
    )
    assert requests.by_site == {"SITE_A": 1.0, "SITE_B": 1.0, "SITE_C": 0.0, "SITE_D": 1.0}
    assert requests.unmatched_jobs == 2
    assert requests.share_at_data_sites == 1.0


def test_ceiling_fills_a_site_without_data_when_jobs_are_queued() -> None:
    free = {"SITE_A": 2, "SITE_D": 2}
    data = {"SITE_A": A, "SITE_D": frozenset()}
    assert work_conserving_ceiling({"ska:a": 4}, [(free, data)]) == 2  # 2 forced onto SITE_D
    assert work_conserving_ceiling({"ska:a": 2}, [(free, data)]) == 2  # none forced


def test_ceiling_places_jobs_over_sites_holding_several_datasets() -> None:
    data = {"X": frozenset({"a", "b"}), "Y": frozenset({"a"})}
    assert work_conserving_ceiling({"a": 2, "b": 2}, [({"X": 2, "Y": 1}, data)]) == 3


def test_ceiling_of_the_experiments_design_in_lockstep_rounds() -> None:
    """4 rounds of 12 free slots; replication after round 2, removal before round 4."""
    f = frozenset
    before = {"A": f({"a"}), "B": f({"b"}), "C": f({"c"}), "D": f()}
    overlap = {**before, "D": f({"a"})}
    after = {**overlap, "A": f()}
    full = dict.fromkeys("ABCD", 3)
    rounds = [(full, before), (full, before), (full, overlap), (full, after)]
    assert work_conserving_ceiling(dict.fromkeys("abc", 16), rounds) == 39
