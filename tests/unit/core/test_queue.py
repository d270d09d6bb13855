"""The cycle's one queue read, shared (pure): what the demand, the matchmaking probe and job
annotation each take from a :class:`QueueSnapshot`, with the failure semantics each had when it
read the schedds on its own."""

from __future__ import annotations

import pytest

from hydrator.core.jobs import QueuedJob, ScheddFailure, ScheddQueue, annotation_reads
from hydrator.core.queue import (
    IDLE,
    RUNNING,
    QueueJob,
    QueueSnapshot,
    ScheddRead,
    data_bound_jobs,
    idle_demand,
)
from hydrator.domain import DatasetId
from hydrator.errors import PoolError

HELD = 5
X, Y = DatasetId("ska", "x"), DatasetId("ska", "y")

IDLE_XY = QueueJob("1.0", IDLE, ("ska:x", "ska:y"), annotate=True, updated=7)
IDLE_X_BAD = QueueJob("1.1", IDLE, ("ska:x", "bad name"), annotate=True)
RUNNING_X = QueueJob("2.0", RUNNING, ("ska:x",), remote_host="slot1_1@h")
HELD_X = QueueJob("3.0", HELD, ("ska:x",))
# matches a [jobs] constraint that does not ask for RequiredDatasets
IDLE_NONE = QueueJob("4.0", IDLE, None, annotate=True)
IDLE_NOT_ANNOTATED = QueueJob("5.0", IDLE, ("ska:y",))  # outside [jobs] constraint

ALL = (IDLE_XY, IDLE_X_BAD, RUNNING_X, HELD_X, IDLE_NONE, IDLE_NOT_ANNOTATED)


def snapshot(*reads: ScheddRead, error: str | None = None) -> QueueSnapshot:
    return QueueSnapshot(reads, error)


def test_each_consumer_takes_its_jobs_from_the_same_read() -> None:
    queue = snapshot(ScheddRead("s1", ALL, annotate=True))

    demand = idle_demand(queue)
    assert demand.counts == {X: 2, Y: 2} and (demand.jobs, demand.invalid) == (3, 1)
    assert data_bound_jobs(queue) == [IDLE_XY, IDLE_X_BAD, RUNNING_X, IDLE_NOT_ANNOTATED]
    [read] = annotation_reads(queue)
    assert isinstance(read, ScheddQueue) and read.schedd == "s1"
    assert read.jobs == (
        QueuedJob("1.0", frozenset({"ska:x", "ska:y"}), updated=7),
        QueuedJob("1.1", frozenset({"ska:x", "bad name"})),
        QueuedJob("4.0", frozenset()),  # declares no data: never edited (plan_edits)
    )


@pytest.mark.parametrize(
    ("reads", "error", "demand_jobs", "failed", "annotated"),
    [
        # a schedd that fails is skipped by the demand and the probe, failed for annotation
        (
            [
                ScheddRead("s1", ALL, annotate=True),
                ScheddRead("s2", error="refused", annotate=True),
            ],
            None,
            3,
            1,
            ["s1", "s2: refused"],
        ),
        # annotation covers only its [jobs] schedds; the demand counts every listed one
        ([ScheddRead("s1", ALL), ScheddRead("s2", (IDLE_XY,), annotate=True)], None, 4, 0, ["s2"]),
        # expected by annotation, gone from the collector: not counted by the demand
        (
            [ScheddRead("s1", ALL), ScheddRead("s3", error="no ad", listed=False, annotate=True)],
            None,
            3,
            0,
            ["s3: no ad"],
        ),
        # no schedd at all: nothing to count, no failure
        ([], None, 0, 0, []),
    ],
)
def test_failed_and_covered_schedds(
    reads: list[ScheddRead], error: str | None, demand_jobs: int, failed: int, annotated: list[str]
) -> None:
    queue = snapshot(*reads, error=error)
    demand = idle_demand(queue)
    assert (demand.jobs, demand.failed_schedds) == (demand_jobs, failed)
    got = [
        r.schedd if isinstance(r, ScheddQueue) else f"{r.schedd}: {r.error}"
        for r in annotation_reads(queue)
    ]
    assert got == annotated


def test_a_collector_that_cannot_list_the_schedds_fails_every_consumer() -> None:
    queue = snapshot(error="cannot list the schedds: connection refused")
    for consumer in (idle_demand, data_bound_jobs, annotation_reads):
        with pytest.raises(PoolError, match="connection refused"):
            consumer(queue)
    # schedds annotation names in [jobs] schedds stay failed, one by one (never no jobs)
    named = snapshot(ScheddRead("s1", error="no ad", listed=False, annotate=True), error="down")
    assert annotation_reads(named) == [ScheddFailure("s1", "no ad")]
    with pytest.raises(PoolError):
        idle_demand(named)


def test_when_no_listed_schedd_answers_the_demand_and_probe_fail() -> None:
    queue = snapshot(ScheddRead("s1", error="x"), ScheddRead("s2", error="y"))
    with pytest.raises(PoolError, match="none of 2 schedds"):
        idle_demand(queue)
    with pytest.raises(PoolError):
        data_bound_jobs(queue)


def test_the_snapshot_is_immutable() -> None:
    queue = snapshot(ScheddRead("s1", ALL))
    with pytest.raises(AttributeError):
        write(queue, "schedds", ())
    with pytest.raises(AttributeError):
        write(IDLE_XY, "required", None)


def write(value: object, field: str, new: object) -> None:
    """Assign as ordinary code would; a frozen value refuses (mypy needs no exception for it)."""
    setattr(value, field, new)
