"""``hydrator expr``: the generated requirements and rank, evaluated by the real ClassAd library."""

from __future__ import annotations

import time

import classad2
import htcondor2  # noqa: F401  (registers join/stringListSubsetMatch)
import pytest

from hydrator.config import ClassAdConfig
from hydrator.core.expr import job_expressions
from hydrator.domain import DatasetId
from hydrator.runtime.cli import main
from tests.support.near import default_near_expressions

A, B = DatasetId("ska", "obs_1234"), DatasetId("cms", "/Prim/Proc/AOD#1a2b")
SLOTS = {
    "both": {"AvailableDatasets": [str(A), str(B)], "PartialDatasets": []},
    "a_only": {"AvailableDatasets": [str(A)], "PartialDatasets": [str(B)]},
    "upper": {"AvailableDatasets": [str(A).upper(), str(B)], "PartialDatasets": []},
    "none": {},
}


def matches(requirements: str, slot: str) -> bool:
    """Does a job with these requirements match the slot (UNDEFINED counts as no, as in the
    negotiator)?"""
    job = classad2.ClassAd({"RequiredDatasets": [str(A), str(B)]})
    job["Requirements"] = classad2.ExprTree(requirements)
    return bool(classad2.ClassAd(SLOTS[slot]).matches(job))  # evaluates job.Requirements


def rank(expression: str, slot: str) -> float:
    job = classad2.ClassAd({"RequiredDatasets": [str(A), str(B)]})
    return float(classad2.ExprTree(expression).eval(job, classad2.ClassAd(SLOTS[slot])))


@pytest.mark.parametrize(
    ("slot", "strict", "partial_ok", "generic", "expected_rank"),
    [
        ("both", True, True, True, 2.0),
        ("a_only", False, True, False, 1.0),
        ("upper", False, False, False, 1.0),
        ("none", False, False, False, 0.0),
    ],
)
def test_expressions_against_slots(
    slot: str, strict: bool, partial_ok: bool, generic: bool, expected_rank: float
) -> None:
    e = job_expressions([A, B], ClassAdConfig())
    loose = job_expressions([A, B], ClassAdConfig(), partial_ok=True)
    assert matches(e.requirements, slot) is strict
    assert matches(loose.requirements, slot) is partial_ok
    assert matches(e.generic_requirements, slot) is generic
    assert rank(e.rank, slot) == expected_rank


def test_cli_prints_submit_lines(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["expr", str(A), str(B)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f'My.RequiredDatasets = {{"{A}", "{B}"}}'
    assert out[1].startswith("requirements = identicalMember(")
    assert out[2].startswith("rank = sum({")


def test_cli_rejects_a_bad_name_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["expr", 'ska:obs"; Rank = 1']) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "invalid dataset name" in err


def test_toil_line_survives_toils_own_parsing(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["expr", "--toil", str(A), str(B)]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith("export TOIL_HTCONDOR_PARAMS='") and line.endswith("'")
    value = line.split("'", 1)[1][:-1]
    # toil/batchSystems/htcondor.py: split on ';', then each pair on its first '='
    pairs = dict(p.split("=", 1) for p in value.split(";"))
    params = {k.strip(): v.strip() for k, v in pairs.items()}
    assert set(params) == {"+RequiredDatasets", "requirements", "rank"}
    assert matches(params["requirements"], "both") and not matches(params["requirements"], "a_only")


def test_cli_fallback_after_prints_strict_or_waited(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["expr", "--fallback-after", "20", str(A)]) == 0
    out = capsys.readouterr().out.splitlines()
    strict = f'identicalMember("{A}", TARGET.AvailableDatasets)'
    assert out == [
        f'My.RequiredDatasets = {{"{A}"}}',
        f"requirements = ({strict}) || (time() - MY.QDate > 20)",
        f"rank = sum({{{strict}}})",
    ]


@pytest.mark.parametrize(
    ("queued_s_ago", "slot", "expected"),
    [(5, "none", False), (30, "none", True), (5, "both", True)],
)
def test_fallback_requirements_open_up_after_the_wait(
    queued_s_ago: int, slot: str, expected: bool
) -> None:
    e = job_expressions([A, B], ClassAdConfig(), fallback_after_s=20)
    job = classad2.ClassAd({"QDate": int(time.time()) - queued_s_ago})
    job["Requirements"] = classad2.ExprTree(e.requirements)
    assert bool(classad2.ClassAd(SLOTS[slot]).matches(job)) is expected
    generic = classad2.ClassAd({"QDate": job["QDate"], "RequiredDatasets": [str(A), str(B)]})
    generic["Requirements"] = classad2.ExprTree(e.generic_requirements)
    assert bool(classad2.ClassAd(SLOTS[slot]).matches(generic)) is expected


def test_cli_rejects_a_non_positive_fallback(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["expr", "--fallback-after", "0", str(A)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "fallback after 0 s" in err


def test_cli_rank_only_drops_the_requirements(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["expr", "--rank-only", str(A)]) == 0
    plain = capsys.readouterr().out.splitlines()
    assert [line.split(" = ")[0] for line in plain] == ["My.RequiredDatasets", "rank"]
    assert main(["expr", "--toil", "--rank-only", str(A), str(B)]) == 0
    value = capsys.readouterr().out.strip().split("'", 1)[1][:-1]
    names = [pair.split("=", 1)[0].strip() for pair in value.split(";")]  # Toil's split
    assert names == ["+RequiredDatasets", "rank"]


@pytest.mark.parametrize("other", [["--fallback-after", "60"], ["--generic"]])
def test_cli_rank_only_refuses_requirement_options(
    other: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["expr", "--rank-only", *other, str(A)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--rank-only" in err


NEAR_JOB = {"DataLocalitySites": ["SITE_C", "SITE_D"]}
NEAR_SLOTS = {
    "local": ({"GLIDEIN_Site": "SITE_C"}, True, 2, "hydrator_local"),
    "near": (
        {"GLIDEIN_Site": "SITE_A", "DataLocalityNearSites": ["SITE_D"]},
        True,
        1,
        "remote.SITE_C,remote.SITE_D",
    ),
    "far": (
        {"GLIDEIN_Site": "SITE_A", "DataLocalityNearSites": ["SITE_B"]},
        False,
        0,
        "remote.SITE_C,remote.SITE_D",
    ),
    "bare": ({"GLIDEIN_Site": "SITE_A"}, False, 0, "remote.SITE_C,remote.SITE_D"),
}


@pytest.mark.parametrize("slot", NEAR_SLOTS)
def test_near_form_local_over_near_over_far_and_remote_readers_hold_their_sites_limits(
    slot: str,
) -> None:
    ad, matches_, rank_, limits = NEAR_SLOTS[slot]
    expr = default_near_expressions()
    job, target = classad2.ClassAd(NEAR_JOB), classad2.ClassAd(ad)
    assert classad2.ExprTree(expr.requirements).eval(job, target) is matches_
    assert classad2.ExprTree(expr.rank).eval(job, target) == rank_
    assert classad2.ExprTree(expr.concurrency_limits_expr).eval(job, target) == limits


def test_near_limits_are_undefined_for_the_job_alone() -> None:
    """So the negotiator evaluates them against each candidate slot (docs/near.md)."""
    limits = classad2.ExprTree(default_near_expressions().concurrency_limits_expr)
    assert limits.eval(classad2.ClassAd(NEAR_JOB)) is classad2.Value.Undefined
    assert (
        classad2.ExprTree(default_near_expressions().requirements).eval(
            classad2.ClassAd({}), classad2.ClassAd({"GLIDEIN_Site": "SITE_C"})
        )
        is False
    )  # no annotation yet: no match


UNANNOTATED = {"RequiredDatasets": ["ska:x", "ska:y"]}
BEFORE_ANNOTATION = {  # slot -> (job, matches, rank)
    "holds-all": ({"AvailableDatasets": ["ska:x", "ska:y", "ska:z"]}, UNANNOTATED, True, 2),
    "holds-part": ({"AvailableDatasets": ["ska:x"]}, UNANNOTATED, False, 0),
    "near-only": ({"DataLocalityNearSites": ["SITE_C"]}, UNANNOTATED, False, 0),
    # once annotated, the annotation decides: here the data is nowhere complete
    "annotated": (
        {"AvailableDatasets": ["ska:x", "ska:y"]},
        {**UNANNOTATED, "DataLocalitySites": []},
        False,
        0,
    ),
}


@pytest.mark.parametrize("slot", BEFORE_ANNOTATION)
def test_near_form_before_the_annotation_is_local_where_the_slot_lists_every_dataset(
    slot: str,
) -> None:
    """The cycle condor_submit asks for comes before the annotation: local slots match in it,
    and the job holds no limit (UNDEFINED: the negotiator skips no candidate for it)."""
    attrs, job_attrs, matches_, rank_ = BEFORE_ANNOTATION[slot]
    expr = default_near_expressions()
    job, target = classad2.ClassAd(job_attrs), classad2.ClassAd({"GLIDEIN_Site": "SITE_A", **attrs})
    assert classad2.ExprTree(expr.requirements).eval(job, target) is matches_
    assert classad2.ExprTree(expr.rank).eval(job, target) == rank_
    limits = classad2.ExprTree(expr.concurrency_limits_expr)
    if "DataLocalitySites" not in job_attrs:
        assert limits.eval(job, target) is classad2.Value.Undefined
        assert limits.eval(job) is classad2.Value.Undefined


def test_cli_near_prints_the_submit_lines(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["expr", "--near", "ska:obs_1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == 'My.RequiredDatasets = {"ska:obs_1"}'
    assert [line.split(" = ")[0] for line in out[1:]] == [
        "requirements",
        "rank",
        "concurrency_limits_expr",
    ]
    assert main(["expr", "--near", "--rank-only", "ska:obs_1"]) == 2


def test_cli_near_uses_the_available_attribute_given(capsys: pytest.CaptureFixture[str]) -> None:
    """The job matches before its annotation where the slot's available list, under the name
    given, holds every dataset."""
    assert main(["expr", "--near", "--available-attribute", "OurAvailable", "ska:obs_1"]) == 0
    out = capsys.readouterr().out
    assert "TARGET.OurAvailable" in out
    assert ClassAdConfig().available_attribute not in out


def test_cli_near_refuses_a_partial_attribute(capsys: pytest.CaptureFixture[str]) -> None:
    """A near job reads no partial list: the name would be ignored, so it is refused."""
    assert main(["expr", "--near", "--partial-attribute", "OurPartial", "ska:obs_1"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == "hydrator: --near takes no other option but --available-attribute\n"
