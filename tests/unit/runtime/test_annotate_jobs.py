"""The job annotator's sequencing over a scripted :class:`~hydrator.core.ports.QueueAdapter`
(hydrator.runtime.annotate_jobs): counts per cycle, no edit when nothing changed, failing
schedds counted, logged once per change and never read as no jobs."""

from __future__ import annotations

import logging

import pytest

from hydrator.core.jobs import (
    AnnotateSettings,
    Annotation,
    QueuedJob,
    ScheddFailure,
    ScheddQueue,
    annotate_values,
)
from hydrator.domain import Site
from hydrator.errors import PoolError
from hydrator.runtime.annotate_jobs import Annotator
from tests.support.scripted import ScriptedQueue
from tests.unit.factories import ANNOTATION_VIEWS as VIEWS

S = Site
XY = frozenset({"ska:x", "ska:y"})
X = frozenset({"ska:x"})
EPOCH = 1_800_000_000


def job(job_id: str, required: frozenset[str], ann: Annotation | None = None) -> QueuedJob:
    if ann is None:
        return QueuedJob(job_id, required)
    return QueuedJob(job_id, required, ann.sites, ann.partial_sites, EPOCH - 60)


def test_annotator_cycle_counts_and_a_no_change_cycle_edits_nothing() -> None:
    adapter = ScriptedQueue()
    jobs = (job("1.0", XY), job("1.1", XY), job("2.0", X))
    want = annotate_values(VIEWS, [XY, X])
    done = tuple(job(j.job_id, j.required, want[j.required]) for j in jobs)
    adapter.reads = [[ScheddQueue("s1", jobs)], [ScheddQueue("s1", done)]]
    annotator = Annotator(adapter, AnnotateSettings())
    first = annotator.run(VIEWS, EPOCH)
    assert (first.seen, first.edits, first.edit_calls, first.jobs_edited) == (3, 2, 6, 3)
    second = annotator.run(VIEWS, EPOCH)
    assert (second.seen, second.edits, second.edit_calls) == (3, 0, 0)
    assert second.demand.complete == {"A": 3, "B": 1}


def test_failing_schedds_are_counted_logged_once_and_keep_their_last_demand(
    caplog: pytest.LogCaptureFixture,
) -> None:
    adapter = ScriptedQueue()
    good = ScheddQueue("s1", (job("1.0", X),))
    other = ScheddQueue("s2", (job("9.0", X), job("9.1", X)))
    adapter.reads = [
        [good, other],
        [good, ScheddFailure("s2", "connection refused")],
        [good, ScheddFailure("s2", "connection refused")],
        PoolError("collector down"),
        [good, other],
    ]
    adapter.refuse = {"s1"}
    annotator = Annotator(adapter, AnnotateSettings())
    with caplog.at_level(logging.INFO, logger="hydrator.runtime.annotate_jobs"):
        reports = [annotator.run(VIEWS, EPOCH) for _ in range(5)]
    assert [len(r.failed_schedds) for r in reports] == [1, 2, 2, 2, 1]
    assert [r.refused_schedds for r in reports] == [("s1",), ("s1",), ("s1",), (), ("s1",)]
    # a schedd that does not answer is counted from its last good read, never as no jobs
    assert [r.demand.complete.get(Site("A")) for r in reports] == [3, 3, 3, 3, 3]
    assert reports[1].demand.schedds_stale == ("s2",)
    assert reports[3].error is not None
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert sum("s1" in w for w in warnings) == 1  # refused: once, not every cycle
    assert sum("schedd s2" in w for w in warnings) == 1
    assert any("schedd s2: job annotation works again" in r.getMessage() for r in caplog.records)
