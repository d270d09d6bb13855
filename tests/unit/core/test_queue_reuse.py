"""When a cycle reads the queues again, and a reused snapshot after the annotator's edits
(:mod:`hydrator.core.queue_reuse`)."""

from __future__ import annotations

import pytest

from hydrator.core.jobs import (
    AnnotateSettings,
    Annotation,
    FieldEdit,
    GroupEdit,
    JobField,
    ScheddQueue,
    annotation_reads,
    plan_edits,
)
from hydrator.core.queue import IDLE, QueueJob, QueueSnapshot, ScheddRead
from hydrator.core.queue_reuse import QueueRead, read_due, read_outcome, with_edits
from hydrator.domain import Site


@pytest.mark.parametrize(
    ("scheduled", "age_s", "max_age_s", "due"),
    [
        (True, 1.0, 60.0, True),  # a scheduled cycle always reads
        (True, None, 60.0, True),
        (False, None, 60.0, True),  # no snapshot yet
        (False, 0.5, 60.0, False),  # an event cycle within the age reuses
        (False, 59.9, 60.0, False),
        (False, 60.0, 60.0, True),  # at the age: read
        (False, 61.0, 60.0, True),
        (False, 0.0, 0.0, True),  # 0: every cycle reads
    ],
)
def test_read_due(scheduled: bool, age_s: float | None, max_age_s: float, due: bool) -> None:
    assert read_due(scheduled=scheduled, age_s=age_s, max_age_s=max_age_s) is due


@pytest.mark.parametrize(
    ("snapshot", "outcome"),
    [
        (QueueSnapshot(), QueueRead.READ),  # no schedd in the pool: nothing failed
        (QueueSnapshot((ScheddRead("s1"), ScheddRead("s2", error="down"))), QueueRead.READ),
        (QueueSnapshot((ScheddRead("s1", error="down"),)), QueueRead.FAILED),
        (QueueSnapshot(error="cannot list the schedds"), QueueRead.FAILED),
    ],
)
def test_read_outcome(snapshot: QueueSnapshot, outcome: QueueRead) -> None:
    assert read_outcome(snapshot) is outcome


def job(job_id: str, required: tuple[str, ...] = ("ska:x",)) -> QueueJob:
    return QueueJob(job_id, IDLE, required, annotate=True)


def test_a_reused_snapshot_carries_the_edits_so_they_are_not_planned_again() -> None:
    snapshot = QueueSnapshot((ScheddRead("s1", (job("1.0"), job("1.1")), annotate=True),))
    wanted = {frozenset({"ska:x"}): Annotation((Site("SITE_A"),), (Site("SITE_B"),))}
    settings = AnnotateSettings(desired_sites=True)
    queues = [r for r in annotation_reads(snapshot) if isinstance(r, ScheddQueue)]
    first = plan_edits(queues, wanted, settings, epoch=100)
    assert first.edits, "the jobs carry nothing yet"

    edited = with_edits(snapshot, first.edits)

    again = [r for r in annotation_reads(edited) if isinstance(r, ScheddQueue)]
    assert plan_edits(again, wanted, settings, epoch=100).edits == ()
    jobs = edited.schedds[0].jobs
    assert [(j.sites, j.partial_sites, j.updated, j.desired_sites) for j in jobs] == [
        (("SITE_A",), ("SITE_B",), 100, "SITE_A")
    ] * 2


def test_edits_touch_only_the_jobs_and_schedd_they_name() -> None:
    snapshot = QueueSnapshot(
        (ScheddRead("s1", (job("1.0"), job("1.1"))), ScheddRead("s2", (job("1.0"),)))
    )
    edit = GroupEdit("s1", frozenset({"ska:x"}), (FieldEdit(JobField.UPDATED, 7, ("1.1",)),))

    edited = with_edits(snapshot, [edit])

    assert [[j.updated for j in r.jobs] for r in edited.schedds] == [[None, 7], [None]]
    assert edited.schedds[1] is snapshot.schedds[1]
    assert with_edits(snapshot, []) is snapshot
