"""Job annotation: put on each idle data-bound job the sites where its data is now.

Provisioners (GlideinWMS frontends, pyglidein, ...) decide where to start glideins from the idle
jobs' own attributes, never from slot ads. So each cycle the hydrator writes, on every idle job
that declares ``RequiredDatasets`` (names configurable in ``[jobs]``):

* ``DataLocalitySites``: ClassAd list of the sites where every required dataset is complete;
* ``DataLocalityPartialSites``: sites holding or receiving every required dataset (complete,
  partial or being replicated there) without all of them complete;
* ``DataLocalitySitesUpdated``: epoch (s) of the hydrator state the lists come from; written
  with the lists, not refreshed on its own;
* optionally ``DESIRED_Sites`` (the CMS/GlideinWMS convention): the complete sites as a
  comma-separated string, left alone on a job that set its own value at submit unless
  ``overwrite_desired_sites``.

A job whose data is nowhere gets empty lists, never a missing attribute. A job with an invalid
dataset name cannot be satisfied anywhere: empty lists too.

This module is the decision, with no I/O: :func:`annotate_values` computes the values per distinct
``RequiredDatasets`` value from the site views, :func:`plan_edits` compares them with what the
jobs carry and returns the edits, one :class:`GroupEdit` per (schedd, distinct value) covering
every job of that group that needs it, within a budget; :func:`site_demand` counts the jobs per
site for ``GET /v1/demand``. The runtime's :class:`hydrator.runtime.annotate_jobs.Annotator`
sequences a cycle over the :class:`~hydrator.core.ports.QueueAdapter` port (the htcondor2
module :mod:`hydrator.adapters.htcondor.schedd_jobs`).

Definitions: an **edit** is one group written (the budget unit, ``max_edits_per_cycle``); it
costs one ``Schedd.edit`` call (an **edit call**) per attribute that changed, as HTCondor edits
one attribute per call. A cycle in which nothing changed makes no edit.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from hydrator.core.locality import SiteSets, site_sets
from hydrator.core.queue import QueueJob, QueueSnapshot
from hydrator.domain import DatasetId, Site, SiteView
from hydrator.errors import PoolError
from hydrator.names import InvalidNameError

Value = tuple[str, ...] | int | str
"""An attribute value to write: a ClassAd list of strings, an integer, or a string."""


class JobField(enum.Enum):
    """What the annotator writes; the adapter maps each to the configured attribute name."""

    DESIRED_SITES = "desired_sites"  # first: see _group_edit for why
    SITES = "sites"
    PARTIAL_SITES = "partial_sites"
    UPDATED = "updated"


@dataclass(frozen=True)
class QueuedJob:
    """An idle job as its schedd reports it. ``required``: the names in its ``RequiredDatasets``
    (valid or not); the other fields are the values the annotator owns as the job carries them
    now, None when missing (or of a type the annotator never writes)."""

    job_id: str  # "cluster.proc"
    required: frozenset[str]
    sites: tuple[str, ...] | None = None
    partial_sites: tuple[str, ...] | None = None
    updated: int | None = None
    desired_sites: str | None = None


@dataclass(frozen=True)
class ScheddQueue:
    """One schedd's idle data-bound jobs, read successfully this cycle."""

    schedd: str
    jobs: tuple[QueuedJob, ...]


@dataclass(frozen=True)
class ScheddFailure:
    """A schedd that could not be read this cycle (down, restarting, refusing)."""

    schedd: str
    error: str


@dataclass(frozen=True)
class Annotation:
    """The values for one distinct ``RequiredDatasets`` value; sites sorted."""

    sites: tuple[Site, ...]
    partial_sites: tuple[Site, ...]


@dataclass(frozen=True)
class FieldEdit:
    """One ``Schedd.edit`` call: set ``field`` to ``value`` on ``job_ids``."""

    field: JobField
    value: Value
    job_ids: tuple[str, ...]


@dataclass(frozen=True)
class GroupEdit:
    """The edits of one group (one schedd, one distinct ``RequiredDatasets`` value)."""

    schedd: str
    required: frozenset[str]
    calls: tuple[FieldEdit, ...]

    @property
    def jobs(self) -> int:
        """Jobs whose annotation this edit writes."""
        return len({j for call in self.calls for j in call.job_ids})


@dataclass(frozen=True)
class EditPlan:
    edits: tuple[GroupEdit, ...]  # within the budget, most urgent first
    deferred: int  # groups that needed an edit but were over the budget


@dataclass(frozen=True)
class SiteDemand:
    """Idle data-bound jobs that could run data-local per site (complete / partial only), and
    those whose data is nowhere. ``schedds_stale``: schedds counted from their last good read."""

    complete: Mapping[Site, int] = field(default_factory=dict)
    partial: Mapping[Site, int] = field(default_factory=dict)
    nowhere: int = 0
    jobs: int = 0
    schedds_stale: tuple[str, ...] = ()


@dataclass(frozen=True)
class JobsReport:
    """What one annotation cycle did (``once --json`` shows seen, edits, failed_schedds)."""

    seen: int = 0  # idle data-bound jobs read this cycle
    edits: int = 0  # groups written
    edit_calls: int = 0  # Schedd.edit calls made (successful)
    jobs_edited: int = 0
    deferred: int = 0  # groups left for a later cycle by the budget
    failed_schedds: tuple[str, ...] = ()  # unreadable, or refused an edit
    refused_schedds: tuple[str, ...] = ()  # the subset that refused an edit
    demand: SiteDemand = SiteDemand()
    error: str | None = None  # the schedds could not be listed at all
    applied: tuple[GroupEdit, ...] = ()  # the edits made (a reused queue snapshot gets them)


@dataclass(frozen=True)
class AnnotateSettings:
    desired_sites: bool = False  # also write DESIRED_Sites
    overwrite_desired_sites: bool = False
    max_edits: int = 1000  # groups per cycle


def _parse(names: frozenset[str]) -> frozenset[DatasetId] | None:
    """The dataset ids, or None if any name is invalid (such a job is satisfied nowhere)."""
    try:
        return frozenset(DatasetId.parse(n) for n in names)
    except InvalidNameError:
        return None


def annotation(required: frozenset[DatasetId] | None, sets: Mapping[Site, SiteSets]) -> Annotation:
    """Where a job needing ``required`` could run data-local (None: an invalid name)."""
    if not required:
        return Annotation((), ())
    complete = [s for s, h in sets.items() if required <= h.available]
    partial = [
        s for s, h in sets.items() if required <= h.present_or_replicating and s not in complete
    ]
    return Annotation(tuple(sorted(complete)), tuple(sorted(partial)))


def annotate_values(
    views: Mapping[Site, SiteView], values: Iterable[frozenset[str]]
) -> dict[frozenset[str], Annotation]:
    """The annotation of each distinct ``RequiredDatasets`` value (pure; per value, a pass over
    the sites)."""
    sets = site_sets(views)
    return {v: annotation(_parse(v), sets) for v in set(values)}


def _ours(job: QueuedJob) -> bool:
    """True if the job's DESIRED_Sites is the one the hydrator wrote: the job carries our
    annotation and DESIRED_Sites equals its complete sites joined."""
    return (
        job.updated is not None
        and job.sites is not None
        and job.desired_sites == ",".join(job.sites)
    )


def _group_edit(
    schedd: str,
    required: frozenset[str],
    jobs: Sequence[QueuedJob],
    want: Annotation,
    *,
    settings: AnnotateSettings,
    epoch: int,
) -> GroupEdit | None:
    """The calls that bring ``jobs`` (one group) to ``want``; None when they all carry it.

    DESIRED_Sites goes first: if a later call fails, the job's DESIRED_Sites already has the new
    value and the next cycle still recognises it as ours once the lists catch up; the other
    order would leave it looking user-set forever.
    """
    ids: dict[JobField, list[str]] = {f: [] for f in JobField}
    desired = ",".join(want.sites)
    for job in jobs:
        changed = False
        if job.sites != want.sites:
            ids[JobField.SITES].append(job.job_id)
            changed = True
        if job.partial_sites != want.partial_sites:
            ids[JobField.PARTIAL_SITES].append(job.job_id)
            changed = True
        if changed or job.updated is None:
            ids[JobField.UPDATED].append(job.job_id)
        may_set = job.desired_sites is None or settings.overwrite_desired_sites or _ours(job)
        if settings.desired_sites and may_set and job.desired_sites != desired:
            ids[JobField.DESIRED_SITES].append(job.job_id)
    values: dict[JobField, Value] = {
        JobField.DESIRED_SITES: desired,
        JobField.SITES: tuple(want.sites),
        JobField.PARTIAL_SITES: tuple(want.partial_sites),
        JobField.UPDATED: epoch,
    }
    calls = tuple(FieldEdit(f, values[f], tuple(ids[f])) for f in JobField if ids[f])
    return GroupEdit(schedd, required, calls) if calls else None


def _urgency(edit: GroupEdit, missing: bool) -> tuple[bool, int, str, list[str]]:
    # jobs never annotated first (a provisioner cannot place them at all), then big groups
    return (not missing, -edit.jobs, edit.schedd, sorted(edit.required))


def plan_edits(
    queues: Sequence[ScheddQueue],
    wanted: Mapping[frozenset[str], Annotation],
    settings: AnnotateSettings,
    epoch: int,
) -> EditPlan:
    """The edits that bring every job of ``queues`` to its value in ``wanted`` (from
    :func:`annotate_values`), grouped per (schedd, distinct ``RequiredDatasets`` value), at most
    ``settings.max_edits`` groups, the most urgent first; ``epoch`` is the value written to
    the updated attribute. Jobs without dataset names are not data-bound: never edited."""
    candidates: list[tuple[tuple[bool, int, str, list[str]], GroupEdit]] = []
    for queue in queues:
        groups: dict[frozenset[str], list[QueuedJob]] = {}
        for job in queue.jobs:
            if job.required:
                groups.setdefault(job.required, []).append(job)
        for required, jobs in groups.items():
            edit = _group_edit(
                queue.schedd, required, jobs, wanted[required], settings=settings, epoch=epoch
            )
            if edit is not None:
                missing = any(j.updated is None for j in jobs)
                candidates.append((_urgency(edit, missing), edit))
    candidates.sort(key=lambda c: c[0])
    chosen = tuple(edit for _, edit in candidates[: settings.max_edits])
    return EditPlan(chosen, max(0, len(candidates) - settings.max_edits))


def site_demand(
    queues: Iterable[ScheddQueue],
    wanted: Mapping[frozenset[str], Annotation],
    stale: Sequence[str] = (),
) -> SiteDemand:
    """Per site, the idle data-bound jobs that could run there data-local (pure)."""
    complete: Counter[Site] = Counter()
    partial: Counter[Site] = Counter()
    nowhere = jobs = 0
    for queue in queues:
        per_value = Counter(job.required for job in queue.jobs if job.required)
        for value, count in per_value.items():
            want = wanted[value]
            jobs += count
            complete.update(dict.fromkeys(want.sites, count))
            partial.update(dict.fromkeys(want.partial_sites, count))
            nowhere += count if not want.sites and not want.partial_sites else 0
    return SiteDemand(dict(complete), dict(partial), nowhere, jobs, tuple(sorted(stale)))


def state_epoch(views: Mapping[Site, SiteView], fallback_s: int) -> int:
    """The epoch (s) of the state the annotation comes from: the oldest site refresh, so it
    never claims more freshness than the lists have; ``fallback_s`` when no site has one."""
    times = [int(v.updated.timestamp()) for v in views.values() if v.updated is not None]
    return min(times) if times else fallback_s


def annotation_reads(queue: QueueSnapshot) -> list[ScheddQueue | ScheddFailure]:
    """Annotation's part of the cycle's queue snapshot (:mod:`hydrator.core.queue`): each
    schedd it covers, read (its jobs matching ``[jobs] constraint``) or failed. Raises
    PoolError when the collector could not list the schedds and none is expected by name."""
    covered = [r for r in queue.schedds if r.annotate]
    if queue.error is not None and not covered:
        raise PoolError(queue.error)
    return [
        ScheddFailure(r.schedd, r.error)
        if r.error is not None
        else ScheddQueue(r.schedd, tuple(_queued(j) for j in r.jobs if j.annotate))
        for r in covered
    ]


def _queued(job: QueueJob) -> QueuedJob:
    """A job to annotate; one without ``RequiredDatasets`` declares no data (never edited)."""
    return QueuedJob(
        job.job_id,
        frozenset(job.required or ()),
        job.sites,
        job.partial_sites,
        job.updated,
        job.desired_sites,
    )
