"""Job annotation decisions (pure): values per RequiredDatasets value, edits only for changes,
grouped, within the budget; DESIRED_Sites opt-in; demand per site. The annotator's sequencing
over the port: tests/unit/runtime/test_annotate_jobs.py."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hydrator.core.jobs import (
    AnnotateSettings,
    Annotation,
    GroupEdit,
    JobField,
    QueuedJob,
    ScheddQueue,
    annotate_values,
    plan_edits,
    site_demand,
    state_epoch,
)
from hydrator.domain import Site, SiteView
from tests.unit.factories import ANNOTATION_VIEWS as VIEWS
from tests.unit.factories import t

S = Site
XY = frozenset({"ska:x", "ska:y"})
X = frozenset({"ska:x"})
Z = frozenset({"ska:z"})
BAD = frozenset({"ska:x", "not a name"})
EPOCH = 1_800_000_000


@pytest.mark.parametrize(
    ("required", "sites", "partial"),
    [
        (X, ("A", "B"), ("C",)),
        (XY, ("A",), ("B", "C")),
        (frozenset({"ska:y"}), ("A",), ("B", "C")),
        (Z, (), ()),  # nowhere: empty lists, not missing ones
        (BAD, (), ()),  # an invalid name is held nowhere
    ],
)
def test_annotation_per_distinct_value(
    required: frozenset[str], sites: tuple[str, ...], partial: tuple[str, ...]
) -> None:
    expected = Annotation(tuple(map(Site, sites)), tuple(map(Site, partial)))
    assert annotate_values(VIEWS, [required])[required] == expected


def job(
    job_id: str,
    required: frozenset[str],
    ann: Annotation | None = None,
    desired_sites: str | None = None,
) -> QueuedJob:
    if ann is None:
        return QueuedJob(job_id, required, desired_sites=desired_sites)
    return QueuedJob(
        job_id, required, ann.sites, ann.partial_sites, EPOCH - 60, desired_sites=desired_sites
    )


def plan(
    jobs: list[QueuedJob], settings: AnnotateSettings | None = None, schedd: str = "s1"
) -> tuple[GroupEdit, ...]:
    wanted = annotate_values(VIEWS, [j.required for j in jobs])
    return plan_edits(
        [ScheddQueue(schedd, tuple(jobs))], wanted, settings or AnnotateSettings(), EPOCH
    ).edits


def calls(edit: GroupEdit) -> dict[JobField, tuple[object, tuple[str, ...]]]:
    return {c.field: (c.value, c.job_ids) for c in edit.calls}


def test_new_jobs_get_every_attribute_in_one_edit_per_distinct_value() -> None:
    edits = plan([job("1.0", XY), job("1.1", XY), job("2.0", X), job("3.0", frozenset())])
    assert len(edits) == 2  # XY and X; the job without names is not data-bound
    xy = next(e for e in edits if e.required == XY)
    assert calls(xy) == {
        JobField.SITES: (("A",), ("1.0", "1.1")),
        JobField.PARTIAL_SITES: (("B", "C"), ("1.0", "1.1")),
        JobField.UPDATED: (EPOCH, ("1.0", "1.1")),
    }
    assert xy.jobs == 2


def test_current_jobs_need_no_edit() -> None:
    want = annotate_values(VIEWS, [XY])[XY]
    assert plan([job("1.0", XY, want), job("1.1", XY, want)]) == ()


def test_a_change_edits_only_the_changed_attribute_and_jobs() -> None:
    want = annotate_values(VIEWS, [XY])[XY]
    stale = replace(want, sites=(Site("A"), Site("D")))
    (edit,) = plan([job("1.0", XY, want), job("1.1", XY, stale)])
    assert calls(edit) == {JobField.SITES: (("A",), ("1.1",)), JobField.UPDATED: (EPOCH, ("1.1",))}


def test_budget_takes_unannotated_then_bigger_groups_and_defers_the_rest() -> None:
    want_x = annotate_values(VIEWS, [X])[X]
    jobs = [job("1.0", Z), job("2.0", XY), job("2.1", XY), job("3.0", X, replace(want_x, sites=()))]
    wanted = annotate_values(VIEWS, [j.required for j in jobs])
    result = plan_edits(
        [ScheddQueue("s", tuple(jobs))], wanted, AnnotateSettings(max_edits=2), EPOCH
    )
    assert [e.required for e in result.edits] == [XY, Z]
    assert result.deferred == 1


def test_desired_sites_opt_in_and_a_submit_time_value_is_kept() -> None:
    want = annotate_values(VIEWS, [X])[X]
    on = AnnotateSettings(desired_sites=True)
    jobs = [
        job("1.0", X),  # new: gets it
        job("1.1", X, desired_sites="T2_US_Nebraska"),  # set at submit: kept
        job("1.2", X, want, desired_sites="A"),  # ours from an earlier cycle (A == join(sites))
    ]
    jobs[2] = replace(jobs[2], sites=("A",))  # data moved since: B joined
    (edit,) = plan(jobs, on)
    assert calls(edit)[JobField.DESIRED_SITES] == ("A,B", ("1.0", "1.2"))
    assert JobField.DESIRED_SITES not in calls(plan(jobs)[0])  # off by default
    (forced,) = plan(jobs, replace(on, overwrite_desired_sites=True))
    assert calls(forced)[JobField.DESIRED_SITES] == ("A,B", ("1.0", "1.1", "1.2"))
    assert edit.calls[0].field is JobField.DESIRED_SITES  # first: see _group_edit


def test_demand_counts_jobs_per_site() -> None:
    queues = [
        ScheddQueue("s1", (job("1.0", XY), job("1.1", XY), job("2.0", Z))),
        ScheddQueue("s2", (job("3.0", X), job("4.0", frozenset()))),
    ]
    wanted = annotate_values(VIEWS, [j.required for q in queues for j in q.jobs])
    demand = site_demand(queues, wanted)
    assert demand.complete == {"A": 3, "B": 1}
    assert demand.partial == {"B": 2, "C": 3}
    assert (demand.nowhere, demand.jobs) == (1, 4)


def test_state_epoch_is_the_oldest_site_refresh() -> None:
    views: dict[Site, SiteView] = {
        s: replace(v, updated=t(i)) for i, (s, v) in enumerate(VIEWS.items())
    }
    assert state_epoch(views, 5) == int(t(0).timestamp())
    assert state_epoch(VIEWS, 5) == 5
