"""What :func:`hydrator.runtime.wiring.assemble` hands a :class:`~hydrator.runtime.service.Service`,
in four groups: where the data comes from and is kept (:class:`Catalogue`), what reaches the
HTCondor pool (:class:`Pool`), the rules a cycle decides by (:class:`Policies`), and what it
reports to and tells the time by (:class:`Instruments`). The same groups travel beside the
service in a :class:`~hydrator.runtime.wiring.Assembly`, from which the daemon hands its
other parts (event cycles, repair watch, HTTP endpoint) what they use.

Frozen references only, no behaviour: the service calls the parts, these only carry them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

from hydrator.config import ClassAdConfig
from hydrator.core.advertise import AdvertisePolicy
from hydrator.core.plan import GuardPolicy
from hydrator.core.ports import PoolProbe, Publisher, QueueReader, Source, StateStore
from hydrator.domain import DatasetId
from hydrator.runtime.annotate_jobs import Annotator
from hydrator.runtime.metrics import Metrics
from hydrator.runtime.near_sites import NearSites

Demand = Callable[[], Mapping[DatasetId, int]]
"""What queued jobs ask for, per dataset, answered without a queue read (tests give it)."""


def utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class Catalogue:
    """The catalogue side: the sources a full read fetches (each in its own thread, up to its
    deadline: ``deadlines_s``, source name -> ``deadline_s``) and the store the state is
    saved in and the drains read from."""

    sources: tuple[Source, ...]
    store: StateStore
    deadlines_s: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Pool:
    """The pool side, every part optional (a daemon without ``[collector]`` or ``[jobs]``
    has none): the ``publishers`` of the site attributes; ``queue``, the schedds read once
    per cycle for the demand, ``probe`` and ``annotator``; ``demand``, when given (tests),
    answers the demand instead of the queue; ``near``, each site's near sites (``[distances]``),
    whose line goes into the ads; ``queue_max_age_s``, how old a queue read an event cycle
    may reuse (``[collector] queue_max_age_s``, by default ``[daemon] interval_s``)."""

    publishers: tuple[Publisher, ...] = ()
    queue: QueueReader | None = None
    demand: Demand | None = None
    probe: PoolProbe | None = None
    annotator: Annotator | None = None
    near: NearSites | None = None
    queue_max_age_s: float = 60.0


@dataclass(frozen=True)
class Policies:
    """The rules a cycle decides by, built from the configuration: ``guards`` (the thresholds
    of the safety guards, ``[safety]``, that the service's plans apply:
    :func:`~hydrator.core.plan.planned`, and between full reads
    :func:`~hydrator.core.between_reads.planned_between`), ``advertise`` (what an ad carries and
    its size limit) and ``classad`` (the attribute names an ad is rendered with)."""

    guards: GuardPolicy
    advertise: AdvertisePolicy
    classad: ClassAdConfig


@dataclass(frozen=True)
class Instruments:
    """What the service reports to (``metrics``, through :mod:`.observe`) and tells the time
    by (``clock``: timezone-aware UTC, the cycle's start and the drains' expiry)."""

    metrics: Metrics
    clock: Callable[[], datetime] = utcnow
