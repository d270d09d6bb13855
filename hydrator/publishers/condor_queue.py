"""Read the HTCondor job queues: which datasets idle jobs are waiting for (queries only).

Jobs declare their data in ``RequiredDatasets``, a ClassAd list of ``scope:name`` strings
(``+RequiredDatasets = {"ska:obs_1","ska:obs_2"}``); a comma- or space-separated string is
accepted too, as some submit tools can only set strings. :func:`query_demand` asks every schedd
the collector knows for its idle jobs' ``RequiredDatasets`` (a projection, nothing else) and
counts idle jobs per dataset; names that are not valid dataset ids are skipped and counted.

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

from hydrator.domain import DatasetId, InvalidNameError
from hydrator.errors import PublishError

log = logging.getLogger(__name__)

REQUIRED_ATTRIBUTE = "RequiredDatasets"
IDLE = 1
_SEPARATORS = re.compile(r"[,\s]+")
_ERRORS: tuple[type[BaseException], ...] = (
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


def _schedd_values(schedd_ad: Any, constraint: str) -> list[Any]:
    schedd = htcondor2.Schedd(schedd_ad)
    ads = schedd.query(constraint=constraint, projection=[REQUIRED_ATTRIBUTE])
    # eval gives Python values: a ClassAd list becomes a list of str
    return [ad.eval(REQUIRED_ATTRIBUTE) for ad in ads if REQUIRED_ATTRIBUTE in ad]


def query_demand(collector: htcondor2.Collector) -> QueueDemand:
    """Idle jobs' datasets across every schedd of the pool (see the module docstring)."""
    try:
        schedds = collector.locateAll(htcondor2.DaemonType.Schedd)
    except _ERRORS as exc:
        raise PublishError(f"cannot list schedds: {exc}") from exc
    constraint = f"JobStatus == {IDLE} && {REQUIRED_ATTRIBUTE} isnt undefined"
    values: list[Any] = []
    failed = 0
    for ad in schedds:
        try:
            values += _schedd_values(ad, constraint)
        except _ERRORS as exc:
            failed += 1
            log.warning("schedd %s: cannot read its queue: %s", ad.get("Name"), exc)
    if schedds and failed == len(schedds):
        raise PublishError(f"none of {len(schedds)} schedds could be read")
    demand = count_demand(values)
    if demand.invalid:
        log.warning("skipped %d invalid dataset names in %s", demand.invalid, REQUIRED_ATTRIBUTE)
    return QueueDemand(demand.counts, demand.invalid, demand.jobs, failed)
