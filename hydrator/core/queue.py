"""The schedds' queues as read once per cycle, and what each consumer takes from them (pure).

Three parts of a cycle look at queued jobs: the **demand** (idle jobs' ``RequiredDatasets``,
for ``[classad] advertise = "demand"`` and ``datasets_from_queue``), the **matchmaking probe**
(idle and running data-bound jobs, :mod:`hydrator.core.locality`) and **job annotation**
(idle jobs matching ``[jobs] constraint``, :mod:`hydrator.core.jobs`). A
:class:`~hydrator.core.ports.QueueReader` (the htcondor2 adapter
:class:`hydrator.adapters.htcondor.condor_queue.CondorQueue`) asks each schedd once per
cycle for the union of their jobs and attributes; the cycle hands the resulting
:class:`QueueSnapshot` to each, and the functions here take out each one's part:
:func:`idle_demand`, :func:`data_bound_jobs`; the annotation's is
:func:`hydrator.core.jobs.annotation_reads`.

Failure semantics are those each consumer had with a read of its own: the demand and the probe
count every schedd the collector lists, skip one that cannot be read and fail
(:class:`~hydrator.errors.PoolError`) when the collector cannot list them or none answers;
annotation sees each schedd it covers as read or failed (:attr:`ScheddRead.annotate`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from hydrator.domain import DatasetId
from hydrator.errors import PoolError
from hydrator.names import InvalidNameError

IDLE, RUNNING = 1, 2
"""HTCondor ``JobStatus`` values of idle and running jobs."""


@dataclass(frozen=True)
class QueueJob:
    """A queued job as one read of its schedd reports it.

    ``required``: the names in its ``RequiredDatasets`` (valid or not), None when it has none.
    ``annotate``: it matches the annotation's constraint (``[jobs] constraint`` and idle); then
    ``sites`` .. ``desired_sites`` are the values the annotator owns as the job carries them,
    None when missing (or of a type the annotator never writes).
    """

    job_id: str  # "cluster.proc"
    status: int  # JobStatus
    required: tuple[str, ...] | None
    remote_host: str | None = None  # the slot a running job occupies ("slot1_2@host")
    annotate: bool = False
    sites: tuple[str, ...] | None = None
    partial_sites: tuple[str, ...] | None = None
    updated: int | None = None
    desired_sites: str | None = None


@dataclass(frozen=True)
class ScheddRead:
    """One schedd in one cycle: its jobs, or why it could not be read (``error``).

    ``listed``: the collector lists it now (the demand and the probe count those only);
    ``annotate``: job annotation covers it (``[jobs] schedds``, or every schedd).
    """

    schedd: str
    jobs: tuple[QueueJob, ...] = ()
    error: str | None = None
    listed: bool = True
    annotate: bool = False


@dataclass(frozen=True)
class QueueSnapshot:
    """Every schedd's jobs as read once this cycle; ``error`` when the collector could not
    list the schedds at all (then ``schedds`` holds only those annotation still expects).
    ``pool``: the read covers the demand and the probe (every schedd's data-bound jobs);
    False when it was made for annotation alone."""

    schedds: tuple[ScheddRead, ...] = ()
    error: str | None = None
    pool: bool = True


@dataclass(frozen=True)
class QueueDemand:
    """Idle jobs per dataset; ``invalid`` counts skipped names, ``jobs`` the idle jobs seen."""

    counts: Mapping[DatasetId, int] = field(default_factory=dict)
    invalid: int = 0
    jobs: int = 0
    failed_schedds: int = 0


def demand_of_names(names: Iterable[Iterable[str]]) -> QueueDemand:
    """Idle jobs per dataset from each job's ``RequiredDatasets`` names: a job counts once per
    dataset; invalid names are skipped and counted."""
    counts: Counter[DatasetId] = Counter()
    invalid = jobs = 0
    for job in names:
        jobs += 1
        wanted: set[DatasetId] = set()
        for name in job:
            try:
                wanted.add(DatasetId.parse(name))
            except InvalidNameError:
                invalid += 1
        counts.update(wanted)
    return QueueDemand(dict(counts), invalid, jobs)


def pool_reads(queue: QueueSnapshot) -> tuple[list[QueueJob], int]:
    """The jobs of every listed schedd that answered, and how many listed ones did not;
    raises PoolError when the schedds could not be listed or none answered."""
    if queue.error is not None:
        raise PoolError(queue.error)
    listed = [r for r in queue.schedds if r.listed]
    failed = sum(1 for r in listed if r.error is not None)
    if listed and failed == len(listed):
        raise PoolError(f"none of {len(listed)} schedds could be read")
    return [j for r in listed if r.error is None for j in r.jobs], failed


def idle_demand(queue: QueueSnapshot) -> QueueDemand:
    """Idle jobs per dataset they declare (the demand); raises PoolError as
    :func:`pool_reads`."""
    jobs, failed = pool_reads(queue)
    names = (j.required for j in jobs if j.status == IDLE and j.required is not None)
    demand = demand_of_names(names)
    return QueueDemand(demand.counts, demand.invalid, demand.jobs, failed)


def data_bound_jobs(queue: QueueSnapshot) -> list[QueueJob]:
    """Idle and running jobs that declare ``RequiredDatasets`` (the matchmaking probe's);
    raises PoolError as :func:`pool_reads`."""
    jobs, _ = pool_reads(queue)
    return [j for j in jobs if j.status in (IDLE, RUNNING) and j.required is not None]
