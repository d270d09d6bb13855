"""Read the HTCondor pool: queued jobs (once per cycle) and slots.

Queries only (the collector publisher is the one module that writes).

Jobs declare their data in ``RequiredDatasets``, a ClassAd list of ``scope:name`` strings
(``+RequiredDatasets = {"ska:obs_1","ska:obs_2"}``); a comma- or space-separated string is
accepted too, as some submit tools can only set strings.

:class:`CondorQueue` is the :class:`~hydrator.core.ports.QueueReader`: once per cycle it asks
each schedd one query for the union of what the demand, the matchmaking probe and job
annotation need (constraints ORed, projections joined; :mod:`hydrator.core.queue` takes each
one's part). Whether a job matches ``[jobs] constraint`` is evaluated here, on the job's
projected attributes (the constraint's attribute references are projected too), so that one
query serves all three. Schedds are found with ``Collector.locateAll`` (or
``Collector.locate`` for the names in ``[jobs] schedds`` when only annotation reads). A schedd
seen before that has no collector ad now (a restarting schedd has none for 10-20 s,
docs/platform.md) stays in the snapshot as failed until it is back, or forgotten after
:data:`FORGET_AFTER_S`.
``queries`` counts the schedd queries made, per schedd.

:class:`CondorPoolProbe` reads every slot with its site and turns the snapshot's data-bound
jobs (idle and running, with the site of the slot a running job occupies) into
:class:`~hydrator.core.locality.PoolJob` for the matchmaking-quality metrics.

``htcondor2`` raises builtin exceptions; a schedd that cannot be read is a failed
:class:`~hydrator.core.queue.ScheddRead`, never an empty queue.
"""

from __future__ import annotations

import logging
import re
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import classad2
import htcondor2

from hydrator.config import CollectorConfig, JobsConfig
from hydrator.core.jobs import JobField
from hydrator.core.locality import PoolJob, PoolSlot
from hydrator.core.queue import (
    IDLE,
    RUNNING,
    QueueDemand,
    QueueJob,
    QueueSnapshot,
    ScheddRead,
    data_bound_jobs,
)
from hydrator.domain import DatasetId, Site
from hydrator.errors import ConfigError, PoolError
from hydrator.logs import ProblemLog
from hydrator.names import InvalidNameError, shown

log = logging.getLogger(__name__)

REQUIRED_ATTRIBUTE = "RequiredDatasets"
_SEPARATORS = re.compile(r"[,\s]+")
# What the htcondor2 bindings raise for a daemon that cannot be reached or answers badly.
HTCONDOR_ERRORS: tuple[type[BaseException], ...] = (
    htcondor2.HTCondorException,
    RuntimeError,
    OSError,
    ValueError,
    TypeError,
)
FORGET_AFTER_S = 900.0
"""A schedd absent from the collector this long (seconds) is no longer reported as failed."""
NO_AD = "no collector ad (down or restarting?)"

__all__ = ["IDLE", "RUNNING", "QueueDemand"]


def required_names(value: Any) -> list[str]:
    """The dataset names in a ``RequiredDatasets`` value (list of strings, or a string)."""
    if isinstance(value, str):
        return [n for n in _SEPARATORS.split(value) if n]
    if isinstance(value, Iterable):
        return [n if isinstance(n, str) else repr(n) for n in value]
    return [repr(value)]


def job_attributes(config: JobsConfig) -> dict[JobField, str]:
    """The job attribute that holds each :class:`JobField` (``[jobs] *_attribute``)."""
    names = {
        JobField.SITES: config.sites_attribute,
        JobField.PARTIAL_SITES: config.partial_sites_attribute,
        JobField.UPDATED: config.updated_attribute,
    }
    if config.desired_sites_attribute:
        names[JobField.DESIRED_SITES] = config.desired_sites_attribute
    return names


def _strings(value: Any) -> tuple[str, ...] | None:
    """A ClassAd list of strings as a tuple; anything else None (it will be overwritten)."""
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(value)
    return None


class JobQuery:
    """What one query asks each schedd: the union of the consumers' constraints and
    projections, and how each returned ad becomes a :class:`QueueJob`.

    ``pool``: the demand (idle data-bound jobs) is read, and with ``running`` the probe's
    running data-bound jobs too; ``jobs``: annotation's idle jobs matching its constraint."""

    def __init__(self, pool: bool, running: bool, jobs: JobsConfig | None) -> None:
        self.pool = pool
        parts: list[str] = []
        projection = ["ClusterId", "ProcId", "JobStatus", REQUIRED_ATTRIBUTE]
        if pool:
            states = f"JobStatus == {IDLE}"
            if running:
                states = f"({states} || JobStatus == {RUNNING})"
            parts.append(f"{states} && {REQUIRED_ATTRIBUTE} isnt undefined")
            projection += ["RemoteHost"] if running else []
        self.running = pool and running
        self.attrs = job_attributes(jobs) if jobs is not None else {}
        self._owned_attrs = (
            self.attrs.get(JobField.SITES, ""),
            self.attrs.get(JobField.PARTIAL_SITES, ""),
            self.attrs.get(JobField.UPDATED, ""),
            self.attrs.get(JobField.DESIRED_SITES, ""),
        )
        self.annotate: classad2.ExprTree | None = None
        self.all_annotate = jobs is not None and not pool  # every job returned matches it
        if jobs is not None:
            annotate = f"JobStatus == {IDLE} && ({jobs.constraint})"
            parts.append(annotate)
            self.annotate = classad2.ExprTree(annotate)
            refs = classad2.ClassAd().externalRefs(self.annotate)
            projection += [*self.attrs.values(), *_own_attributes(refs)]
        self.constraint = " || ".join(f"({p})" for p in parts) if len(parts) > 1 else parts[0]
        self.projection = list(dict.fromkeys(projection))

    def job(self, ad: classad2.ClassAd) -> QueueJob:
        """``ad`` (projected) as a :class:`QueueJob`: one value per job, and only the
        lookups its state needs (a lookup of a missing attribute raises inside classad2, and
        10,000 jobs a cycle make each lookup count)."""
        status = ad.get("JobStatus")
        required = ad.get(REQUIRED_ATTRIBUTE)
        if isinstance(required, classad2.ExprTree):  # an expression, not a literal list
            required = required.eval(ad)
        host = ad.get("RemoteHost") if status == RUNNING and self.running else None
        annotate = status == IDLE and (
            self.all_annotate or (self.annotate is not None and self.annotate.eval(ad) is True)
        )
        owned = self._owned(ad) if annotate else (None, None, None, None)
        return QueueJob(
            f"{ad['ClusterId']}.{ad['ProcId']}",
            status if isinstance(status, int) else 0,
            None if required is None else tuple(required_names(required)),
            host if isinstance(host, str) else None,
            annotate,
            *owned,
        )

    def _owned(
        self, ad: classad2.ClassAd
    ) -> tuple[tuple[str, ...] | None, tuple[str, ...] | None, int | None, str | None]:
        """The values the annotator owns as ``ad`` carries them (sites, partial sites,
        updated, desired sites)."""
        sites, partial, updated_attr, desired_attr = self._owned_attrs
        updated = ad.get(updated_attr)
        desired = ad.get(desired_attr) if desired_attr else None
        return (
            _strings(ad.get(sites)),
            _strings(ad.get(partial)),
            updated if isinstance(updated, int) and not isinstance(updated, bool) else None,
            None if desired is None else str(desired),
        )


def _own_attributes(refs: Iterable[str]) -> list[str]:
    """The job's own attributes among a constraint's references (``MY.x`` is ``x``; a
    ``TARGET.`` reference has no target in a queue query)."""
    out = []
    for ref in refs:
        scope, _, name = ref.rpartition(".")
        if scope.upper() in ("", "MY"):
            out.append(name)
    return out


class CondorQueue:
    """:class:`~hydrator.core.ports.QueueReader` over one pool's schedds (see the module doc).

    ``names``: the schedds annotation covers (``[jobs] schedds``; empty: every one)."""

    def __init__(
        self,
        collector: htcondor2.Collector,
        query: JobQuery,
        names: Iterable[str] = (),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._collector = collector
        self.query = query
        self._names = tuple(names)
        self._clock = clock
        self._seen: dict[str, tuple[classad2.ClassAd, float]] = {}  # name -> (location, when)
        self.queries: Counter[str] = Counter()
        """Schedd queries made since the start, per schedd (one per schedd and read)."""

    @property
    def pool(self) -> bool:
        return self.query.pool

    def read(self) -> QueueSnapshot:
        try:
            found = self._locate()
        except PoolError as exc:
            failed = tuple(
                ScheddRead(n, (), NO_AD, listed=False, annotate=True) for n in self._names
            )
            expected = failed if self.query.annotate is not None else ()
            return QueueSnapshot(expected, str(exc), self.query.pool)
        reads = tuple(self._read(name, ad) for name, ad in found.items())
        return QueueSnapshot(reads, pool=self.query.pool)

    def location(self, schedd: str) -> classad2.ClassAd | None:
        """The location ad of ``schedd`` as last found (for edits), None if never found."""
        seen = self._seen.get(schedd)
        return None if seen is None else seen[0]

    def _read(self, name: str, location: classad2.ClassAd | None) -> ScheddRead:
        annotate = self.query.annotate is not None and (not self._names or name in self._names)
        if location is None:
            return ScheddRead(name, error=NO_AD, listed=False, annotate=annotate)
        self.queries[name] += 1
        try:
            ads = htcondor2.Schedd(location).query(
                constraint=self.query.constraint, projection=self.query.projection
            )
        except HTCONDOR_ERRORS as exc:
            if self.query.pool:  # annotation says it once per change (runtime.annotate_jobs)
                log.warning("schedd %s: cannot read its queue: %s", name, exc)
            error = str(exc) or type(exc).__name__
            return ScheddRead(name, error=error, annotate=annotate)
        return ScheddRead(name, tuple(map(self.query.job, ads)), annotate=annotate)

    def _locate(self) -> dict[str, classad2.ClassAd | None]:
        """Name -> location ad, or None for a schedd annotation expects that is not there;
        raises PoolError if the collector cannot list the schedds."""
        now = self._clock()
        found: dict[str, classad2.ClassAd | None]
        if self._names and not self.query.pool:
            found = {name: self._locate_one(name) for name in self._names}
        else:
            try:
                ads = self._collector.locateAll(htcondor2.DaemonType.Schedd)
            except HTCONDOR_ERRORS as exc:
                raise PoolError(f"cannot list the schedds: {exc}") from exc
            found = {str(ad.get("Name")): ad for ad in ads}
            if self.query.annotate is not None:
                recent = [n for n, (_, when) in self._seen.items() if now - when < FORGET_AFTER_S]
                for name in self._names or recent:
                    found.setdefault(name, None)
        for name, ad in found.items():
            if ad is not None:
                self._seen[name] = (ad, now)
        self._seen = {n: v for n, v in self._seen.items() if now - v[1] < FORGET_AFTER_S}
        return found

    def _locate_one(self, name: str) -> classad2.ClassAd | None:
        try:
            ad: classad2.ClassAd = self._collector.locate(htcondor2.DaemonType.Schedd, name)
        except HTCONDOR_ERRORS:
            return None
        return ad


MAX_WARNED_NAMES = 1000  # distinct invalid names logged per process (jobs are users' input)


def valid_datasets(names: Iterable[str]) -> tuple[frozenset[DatasetId], list[str]]:
    """The valid dataset ids among ``names``, and the invalid names left out."""
    out: set[DatasetId] = set()
    invalid: list[str] = []
    for name in names:
        try:
            out.add(DatasetId.parse(name))
        except InvalidNameError:
            invalid.append(name)
    return frozenset(out), invalid


_DYNAMIC_SLOT = re.compile(r"(?P<parent>[^@]+)_[0-9]+@(?P<host>.+)")


def slot_site(site_of: Mapping[str, Site], slot_name: str) -> Site | None:
    """The site of the slot named ``slot_name``. A dynamic slot (``slot4_1@host``) not yet in
    the collector (its ad comes with the startd's next update) has its partitionable parent's
    site (``slot4@host``): dynamic slots inherit the parent's attributes."""
    site = site_of.get(slot_name)
    if site is None and (m := _DYNAMIC_SLOT.fullmatch(slot_name)):
        site = site_of.get(f"{m['parent']}@{m['host']}")
    return site


class CondorPoolProbe:
    """:class:`~hydrator.core.ports.PoolProbe` over a pool's collector (slots) and the
    cycle's queue snapshot (jobs)."""

    def __init__(self, collector: htcondor2.Collector, slot_site_attribute: str) -> None:
        self._collector = collector
        self._site_attribute = slot_site_attribute
        self._warned: ProblemLog[str] = ProblemLog(
            log, limit=MAX_WARNED_NAMES, once_per_process=True
        )
        self.invalid_last_query = 0  # the port's: invalid names the last read skipped

    def jobs_and_slots(
        self, queue: QueueSnapshot | None = None
    ) -> tuple[list[PoolJob], list[PoolSlot]]:
        """Data-bound idle/running jobs of ``queue`` (without one, a read of its own) and
        every slot with a site; raises PoolError."""
        site_of, slots = self._slots()
        if queue is None:
            queue = CondorQueue(self._collector, JobQuery(True, True, None)).read()
        return self.pool_jobs(data_bound_jobs(queue), site_of), slots

    def pool_jobs(self, queued: Iterable[QueueJob], site_of: Mapping[str, Site]) -> list[PoolJob]:
        """Queued data-bound jobs -> :class:`PoolJob`; invalid names are counted, each logged
        once, skipped (a job left with no valid name is not data-bound for these metrics)."""
        jobs = []
        self.invalid_last_query = 0
        for job in queued:
            required, invalid = valid_datasets(job.required or ())
            self.invalid_last_query += len(invalid)
            for name in set(invalid):
                self._warned.problem(
                    name, "a job declares an invalid dataset name %s; skipped", shown(name)
                )
            if not required:
                continue
            running = job.status == RUNNING
            host = job.remote_host
            site = slot_site(site_of, host) if running and host is not None else None
            jobs.append(PoolJob(required, running, site))
        return jobs

    def _slots(self) -> tuple[dict[str, Site], list[PoolSlot]]:
        attr = self._site_attribute
        try:
            ads = self._collector.query(
                htcondor2.AdType.Slot,
                f"isString({attr})",
                ["Name", attr, "State", "PartitionableSlot", "Cpus"],
            )
        except HTCONDOR_ERRORS as exc:
            raise PoolError(f"cannot query slots: {exc}") from exc
        site_of: dict[str, Site] = {}
        slots: list[PoolSlot] = []
        for ad in ads:
            name, site = ad.get("Name"), ad.get(attr)
            if not isinstance(name, str) or not isinstance(site, str):
                continue
            site_of[name] = Site(site)
            # a partitionable slot stays Unclaimed while it has resources left to carve
            free = ad.get("State") == "Unclaimed" and (
                ad.get("PartitionableSlot") is not True or (ad.get("Cpus") or 0) > 0
            )
            slots.append(PoolSlot(Site(site), free))
        return site_of, slots


def build(
    collector: CollectorConfig, jobs: JobsConfig | None, *, pool: bool, running: bool
) -> CondorQueue:
    """The reader on ``[collector] pool`` for the consumers that are on: ``pool`` (the demand,
    and with ``running`` the probe) and ``jobs`` (annotation; None when off); authenticating
    with the IDTOKEN in ``[collector] token_dir`` (set in the library's configuration: the
    environment is read only once, when the library loads). Raises ConfigError for a
    ``[jobs] constraint`` that is not a ClassAd expression or a pool that cannot be used."""
    if jobs is not None:
        try:
            classad2.ExprTree(jobs.constraint)
        except classad2.ClassAdException as exc:
            raise ConfigError("jobs.constraint", f"not a ClassAd expression: {exc}") from None
    if collector.token_dir is not None:
        htcondor2.param["SEC_TOKEN_DIRECTORY"] = str(collector.token_dir)
    try:
        condor = htcondor2.Collector(collector.pool)
    except HTCONDOR_ERRORS as exc:
        raise ConfigError("collector.pool", f"cannot use {collector.pool!r}: {exc}") from None
    names = jobs.schedds if jobs is not None else ()
    return CondorQueue(condor, JobQuery(pool, running, jobs), names)
