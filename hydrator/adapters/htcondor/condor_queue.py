"""Read the HTCondor pool: which datasets idle jobs wait for, and where data-bound jobs run.

Queries only (the collector publisher is the one module that writes).

Jobs declare their data in ``RequiredDatasets``, a ClassAd list of ``scope:name`` strings
(``+RequiredDatasets = {"ska:obs_1","ska:obs_2"}``); a comma- or space-separated string is
accepted too, as some submit tools can only set strings. :func:`query_demand` asks every schedd
the collector knows for its idle jobs' ``RequiredDatasets`` (a projection, nothing else) and
counts idle jobs per dataset; names that are not valid dataset ids are skipped and counted.

:class:`CondorPoolProbe` reads data-bound jobs (idle and running, with the site of the slot a
running job occupies) and every slot with its site, for the matchmaking-quality metrics
(:mod:`hydrator.core.locality`).

``htcondor2`` raises builtin exceptions; a schedd that cannot be read is skipped (counted in
``failed_schedds``); if the collector cannot be read, or no schedd could be, the result is
:class:`~hydrator.errors.PublishError`.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import htcondor2

from hydrator.core.locality import PoolJob, PoolSlot
from hydrator.domain import DatasetId, InvalidNameError, Site, shown
from hydrator.errors import PublishError

log = logging.getLogger(__name__)

REQUIRED_ATTRIBUTE = "RequiredDatasets"
IDLE, RUNNING = 1, 2
_SEPARATORS = re.compile(r"[,\s]+")
# What the htcondor2 bindings raise for a daemon that cannot be reached or answers badly.
HTCONDOR_ERRORS: tuple[type[BaseException], ...] = (
    htcondor2.HTCondorException,
    RuntimeError,
    OSError,
    ValueError,
    TypeError,
)


@dataclass(frozen=True)
class QueueDemand:
    """Idle jobs per dataset; ``invalid`` counts skipped names, ``jobs`` the idle jobs seen."""

    counts: Mapping[DatasetId, int] = field(default_factory=dict)
    invalid: int = 0
    jobs: int = 0
    failed_schedds: int = 0


def required_names(value: Any) -> list[str]:
    """The dataset names in a ``RequiredDatasets`` value (list of strings, or a string)."""
    if isinstance(value, str):
        return [n for n in _SEPARATORS.split(value) if n]
    if isinstance(value, Iterable):
        return [n if isinstance(n, str) else repr(n) for n in value]
    return [repr(value)]


def count_demand(values: Iterable[Any]) -> QueueDemand:
    """Count idle jobs per dataset from their ``RequiredDatasets`` values (pure)."""
    counts: Counter[DatasetId] = Counter()
    invalid = jobs = 0
    for value in values:
        jobs += 1
        wanted: set[DatasetId] = set()
        for name in required_names(value):
            try:
                wanted.add(DatasetId.parse(name))
            except InvalidNameError:
                invalid += 1
        counts.update(wanted)
    return QueueDemand(dict(counts), invalid, jobs)


def query_jobs(
    collector: htcondor2.Collector, constraint: str, projection: list[str]
) -> tuple[list[Any], int]:
    """Job ads (projected) from every schedd, and how many schedds could not be read."""
    try:
        schedds = collector.locateAll(htcondor2.DaemonType.Schedd)
    except HTCONDOR_ERRORS as exc:
        raise PublishError(f"cannot list schedds: {exc}") from exc
    jobs: list[Any] = []
    failed = 0
    for schedd_ad in schedds:
        try:
            jobs += htcondor2.Schedd(schedd_ad).query(constraint=constraint, projection=projection)
        except HTCONDOR_ERRORS as exc:
            failed += 1
            log.warning("schedd %s: cannot read its queue: %s", schedd_ad.get("Name"), exc)
    if schedds and failed == len(schedds):
        raise PublishError(f"none of {len(schedds)} schedds could be read")
    return jobs, failed


def query_demand(collector: htcondor2.Collector) -> QueueDemand:
    """Idle jobs' datasets across every schedd of the pool (see the module docstring)."""
    constraint = f"JobStatus == {IDLE} && {REQUIRED_ATTRIBUTE} isnt undefined"
    jobs, failed = query_jobs(collector, constraint, [REQUIRED_ATTRIBUTE])
    # eval gives Python values: a ClassAd list becomes a list of str
    values = [ad.eval(REQUIRED_ATTRIBUTE) for ad in jobs if REQUIRED_ATTRIBUTE in ad]
    demand = count_demand(values)
    if demand.invalid:
        log.warning("skipped %d invalid dataset names in %s", demand.invalid, REQUIRED_ATTRIBUTE)
    return QueueDemand(demand.counts, demand.invalid, demand.jobs, failed)


MAX_WARNED_NAMES = 1000  # distinct invalid names logged per process (jobs are users' input)


def valid_datasets(value: Any) -> tuple[frozenset[DatasetId], list[str]]:
    """The valid dataset ids in a ``RequiredDatasets`` value, and the invalid names left out."""
    out: set[DatasetId] = set()
    invalid: list[str] = []
    for name in required_names(value):
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
    """:class:`~hydrator.core.locality.PoolProbe` over a pool's collector and schedds."""

    def __init__(self, collector: htcondor2.Collector, slot_site_attribute: str) -> None:
        self._collector = collector
        self._site_attribute = slot_site_attribute
        self._warned: set[str] = set()
        self.invalid_last_query = 0  # invalid dataset names skipped in the last query

    def jobs_and_slots(self) -> tuple[list[PoolJob], list[PoolSlot]]:
        """Data-bound idle/running jobs and every slot with a site; raises PublishError."""
        site_of, slots = self._slots()
        states = f"(JobStatus == {IDLE} || JobStatus == {RUNNING})"
        constraint = f"{states} && {REQUIRED_ATTRIBUTE} isnt undefined"
        ads, _ = query_jobs(
            self._collector, constraint, [REQUIRED_ATTRIBUTE, "JobStatus", "RemoteHost"]
        )
        return self.pool_jobs(ads, site_of), slots

    def pool_jobs(self, ads: Iterable[Any], site_of: Mapping[str, Site]) -> list[PoolJob]:
        """Job ads -> :class:`PoolJob`; invalid names are counted, each logged once, skipped
        (a job left with no valid name is not data-bound for these metrics)."""
        jobs = []
        self.invalid_last_query = 0
        for ad in ads:
            required, invalid = valid_datasets(ad.eval(REQUIRED_ATTRIBUTE))
            self.invalid_last_query += len(invalid)
            for name in set(invalid) - self._warned:
                if len(self._warned) >= MAX_WARNED_NAMES:
                    break
                self._warned.add(name)
                log.warning("a job declares an invalid dataset name %s; skipped", shown(name))
            if not required:
                continue
            running = ad.get("JobStatus") == RUNNING
            host = ad.get("RemoteHost")
            site = slot_site(site_of, host) if running and isinstance(host, str) else None
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
            raise PublishError(f"cannot query slots: {exc}") from exc
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
