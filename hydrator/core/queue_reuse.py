"""When a cycle reads the schedds' queues again, and what a reused snapshot says (pure).

Event cycles (docs/events.md) come as often as Rucio's messages, up to about one a second while
a stream flows; the schedds' queues do not change at that pace, and each read is one query per
schedd. So a scheduled (full) cycle always reads, and an event cycle reuses the last snapshot
while it is younger than ``[collector] queue_max_age_s`` (default ``[daemon] interval_s``):
:func:`read_due`. A reused snapshot is handed to the demand, the probe and annotation exactly
as a fresh one; a failed read is reused as the failure it was (the demand keeps its last good
answer, annotation its last good read per schedd), so event cycles do not ask a struggling
schedd again before the age is up. The annotator's own edits since the read are written into
the snapshot (:func:`with_edits`): a reused snapshot must not make it edit the same jobs again.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import replace

from hydrator.core.jobs import GroupEdit, JobField
from hydrator.core.queue import QueueJob, QueueSnapshot


class QueueRead(enum.Enum):
    """How a cycle got its queue snapshot (metric ``hydrator_queue_reads_total{outcome}``)."""

    READ = "read"  # asked the schedds, and at least one answered
    REUSED = "reused"  # the last snapshot, younger than the age
    FAILED = "failed"  # asked, and the collector or every schedd asked failed


def read_due(*, scheduled: bool, age_s: float | None, max_age_s: float) -> bool:
    """True when this cycle reads the queues: a scheduled cycle always; an event cycle when
    there is no snapshot yet (``age_s`` None) or the last is ``max_age_s`` seconds old or
    older (``max_age_s`` 0: every cycle reads)."""
    return scheduled or age_s is None or age_s >= max_age_s


def read_outcome(snapshot: QueueSnapshot) -> QueueRead:
    """:attr:`QueueRead.FAILED` when the collector could not list the schedds or none of
    those asked answered (one schedd down among several is a read: the consumers count it)."""
    asked = snapshot.schedds
    if snapshot.error is not None or (asked and all(r.error is not None for r in asked)):
        return QueueRead.FAILED
    return QueueRead.READ


def with_edits(snapshot: QueueSnapshot, edits: Iterable[GroupEdit]) -> QueueSnapshot:
    """``snapshot`` with the values ``edits`` wrote (each a successful
    :class:`~hydrator.core.jobs.GroupEdit` of the annotator) on the jobs they name: the queue
    as the schedds now hold it, as far as the hydrator changed it."""
    written: dict[tuple[str, str], list[tuple[JobField, object]]] = {}
    for edit in edits:
        for call in edit.calls:
            for job_id in call.job_ids:
                written.setdefault((edit.schedd, job_id), []).append((call.field, call.value))
    if not written:
        return snapshot
    schedds = tuple(
        replace(
            read,
            jobs=tuple(
                _edited(job, written.get((read.schedd, job.job_id), ())) for job in read.jobs
            ),
        )
        if any((read.schedd, job.job_id) in written for job in read.jobs)
        else read
        for read in snapshot.schedds
    )
    return replace(snapshot, schedds=schedds)


def _edited(job: QueueJob, values: Iterable[tuple[JobField, object]]) -> QueueJob:
    """``job`` carrying ``values`` (each of the type the annotator writes for its field)."""
    for field, value in values:
        if field is JobField.SITES and isinstance(value, tuple):
            job = replace(job, sites=value)
        elif field is JobField.PARTIAL_SITES and isinstance(value, tuple):
            job = replace(job, partial_sites=value)
        elif field is JobField.UPDATED and isinstance(value, int):
            job = replace(job, updated=value)
        elif field is JobField.DESIRED_SITES and isinstance(value, str):
            job = replace(job, desired_sites=value)
    return job
