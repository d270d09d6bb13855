"""Every port: what the runtime calls on an adapter, declared once.

An adapter implements one of these ``typing.Protocol`` classes structurally (no base class to
inherit); the runtime types its parts with them and gets the concrete adapters from
:mod:`hydrator.runtime.wiring`, the one runtime module that imports ``hydrator.adapters``
(an import-linter contract in ``pyproject.toml`` says so).

Ports and the adapters (under ``hydrator/adapters/``) that implement them:

* :class:`Source`: one catalogue's answer per cycle (``sources/static.py``,
  ``sources/rucio/``, ``sources/dmapi/``);
* :class:`Publisher`: pushes the site ads to a target (``htcondor/collector.py``);
* :class:`StateStore`: the state between cycles and the drains (``state/sqlite.py``);
* :class:`QueueReader`: the schedds' queues, read once a cycle (``htcondor/condor_queue.py``);
* :class:`QueueAdapter`: reads and edits idle jobs for annotation (``htcondor/schedd_jobs.py``);
* :class:`PoolProbe`: the pool's slots for the matchmaking metrics (``htcondor/condor_queue.py``);
* :class:`DistanceReader`: a catalogue's distances between storage elements
  (``sources/rucio/distances.py``);
* :class:`EventListener`: a connection to an event stream (``events/stomp_listener.py``).

:class:`EventSink` is the other way round: the runtime implements it, a listener calls it.

Optional capabilities (a source that has them is found by ``isinstance``; each is
``runtime_checkable``, so the runtime never probes attributes by name):
:class:`CountsCalls`, :class:`DefersChecks`, :class:`ReusesAnswers` (numbers a source knows
after each fetch, read into metrics), :class:`CountsReadCalls` (its calls after a targeted
read), :class:`Abandonable` (ends a fetch that still runs at shutdown), :class:`TargetedReads`
and :class:`ParentLookups` (what event cycles need of a source), :class:`ReadsStorages` (what
refresh cycles read between full reads).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol, runtime_checkable

from hydrator.core.event_hints import Ignored, ListenerStatus, RucioEvent
from hydrator.core.jobs import GroupEdit, ScheddFailure, ScheddQueue
from hydrator.core.locality import PoolJob, PoolSlot
from hydrator.core.near import ElementDistances
from hydrator.core.plan import Plan
from hydrator.core.queue import QueueSnapshot
from hydrator.core.slot_coverage import RepairReport
from hydrator.core.storage import Drain
from hydrator.domain import DatasetId, Replica, Site, SiteView, Snapshot, State, StorageStatus

# -- sources ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class FetchContext:
    """What a source may use in one cycle.

    ``now`` is the cycle's start (UTC). ``wanted`` counts, per dataset, the queued jobs that
    declare it in ``RequiredDatasets`` (empty when no demand provider is configured).
    ``previous`` maps a source's name to the replicas of its last good answer as the daemon
    holds them (loaded from the state after a restart; absent or empty when there are none).
    Read-only: a source that has no answer of its own to compare with (its first fetch, or the
    one after a failure) may return these very objects for the pairs whose replica is equal,
    so that the daemon holds one object per replica instead of a loaded and a fetched one.
    ``drains`` are the operator's (``hydrator drain``): a source that knows storage elements
    treats a drained one as unavailable while the drain is active
    (:func:`hydrator.core.storage.judge`).
    """

    now: datetime
    wanted: Mapping[DatasetId, int] = field(default_factory=dict)
    previous: Mapping[str, AbstractSet[Replica]] = field(default_factory=dict)
    drains: Sequence[Drain] = ()


class Source(Protocol):
    """A catalogue adapter (``hydrator/adapters/sources/``)."""

    @property
    def name(self) -> str: ...

    def fetch(self, context: FetchContext) -> Snapshot:
        """Answer for this cycle, or raise a SourceError subclass."""
        ...

    def close(self) -> None:
        """Release connections; called once at shutdown."""
        ...


@runtime_checkable
class CountsCalls(Protocol):
    """A source that counts the requests of its last fetch (retries included) per client
    method (a source with one kind of request names it ``request``). Metric
    ``hydrator_source_calls_total``."""

    @property
    def calls_last_fetch(self) -> Mapping[str, int]: ...


@runtime_checkable
class CountsReadCalls(Protocol):
    """A source with targeted reads (:class:`TargetedReads`, :class:`ParentLookups`) that
    counts the requests of its last one (retries included) per client method: an event
    cycle's reads go into ``hydrator_source_calls_total`` as a fetch's do."""

    @property
    def calls_last_read(self) -> Mapping[str, int]: ...


@runtime_checkable
class DefersChecks(Protocol):
    """A source with a per-cycle budget: the checks its last fetch left to later cycles.
    Metric ``hydrator_source_deferred_checks``."""

    @property
    def deferred_last_fetch(self) -> int: ...


@runtime_checkable
class ReusesAnswers(Protocol):
    """A source that reuses earlier answers: how many its last fetch reused.
    Metric ``hydrator_source_reused_checks``."""

    @property
    def reused_last_fetch(self) -> int: ...


@runtime_checkable
class Abandonable(Protocol):
    """A source whose running fetch can be ended from another thread, without blocking (the
    daemon stops while a fetch abandoned at its deadline still runs); ``close`` may block."""

    def abandon(self) -> None: ...


@runtime_checkable
class TargetedReads(Protocol):
    """A source that can re-read given datasets exactly (the Rucio source's deep path)."""

    @property
    def name(self) -> str: ...

    def read_datasets(
        self, datasets: Sequence[DatasetId], context: FetchContext
    ) -> Iterable[Replica]:
        """This source's replicas of exactly ``datasets`` (a dataset found nowhere has none),
        or raise a SourceError."""
        ...


@runtime_checkable
class ReadsStorages(Protocol):
    """A source that can re-read the statuses of its storage elements cheaply, without
    reading any dataset (the Rucio source: one ``list_rses()``), for refresh cycles."""

    def read_storages(self, context: FetchContext) -> tuple[StorageStatus, ...]:
        """Every storage element's status as of now (``context.now``, its drains), within
        the source's deadline, or raise a SourceError."""
        ...


@runtime_checkable
class ParentLookups(Protocol):
    """A source that can name the datasets a file belongs to (``list_parent_dids``)."""

    def parent_datasets(self, files: Sequence[tuple[str, str]]) -> list[DatasetId]:
        """The datasets that contain the (scope, name) ``files``, or raise a SourceError."""
        ...


# -- publishing ------------------------------------------------------------------------------


@dataclass(frozen=True)
class PublishReport:
    """What a publisher did this cycle. ``sent`` counts updates by kind (e.g. ``merge``)."""

    sent: Mapping[str, int] = field(default_factory=dict)
    failed: Mapping[str, int] = field(default_factory=dict)
    skipped_current: int = 0  # targets already up to date, sent nothing
    deferred: int = 0  # targets not up to date, left for a later cycle (rate limits)
    handed: int = 0  # targets not up to date, left to the repair looks (they deliver merges)


class Publisher(Protocol):
    """Pushes the rendered site ads where the matchmaker sees them (the HTTP endpoint, pull
    for the execute-node hook, is not a publisher: it serves the saved state)."""

    @property
    def name(self) -> str: ...

    def publish(
        self, sites: Mapping[Site, SiteView], removed: frozenset[Site], now: datetime
    ) -> PublishReport:
        """Bring the target in line with ``sites``; withdraw ``removed``. Raise PublishError."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class RepairsSlots(Protocol):
    """A publisher that can find, between cycles, the slot ads lacking their site's current
    lists and merge them again (docs/coverage.md); the runtime's repair watch calls it."""

    def repair(self, now: datetime, interval_s: float) -> RepairReport:
        """One look and its merges (``interval_s``: the watch's, the first back-off of a
        slot whose repair was not kept). Raise PublishError when the collector fails."""
        ...

    def hand_merges_to_repairs(self) -> None:
        """From now on the repair looks alone deliver slot merges: a publish still sends and
        withdraws site ads and notes each site's current lists, but merges into no slot; the
        slots it finds stale are reported as ``handed`` and the next look merges them. The
        runtime calls it once, when it schedules the repair watch; until then (``hydrator
        once``, no watch) a publish merges itself."""
        ...


# -- state -----------------------------------------------------------------------------------


class StateStore(Protocol):
    """The state between cycles (and across restarts) and the operator's drains."""

    def load(self) -> State:
        """The saved state (empty on a new database)."""
        ...

    @property
    def rejected_rows(self) -> Mapping[str, int]:
        """Rows the last :meth:`load` ignored as invalid, by table (every table listed)."""
        ...

    def save(self, plan: Plan) -> int:
        """Persist the plan's state in one transaction (the first-seen time of the pairs it
        adds: ``plan.now``); return the number of rows written."""
        ...

    def drains(self) -> list[Drain]:
        """The operator's drains (``hydrator drain``), read at the start of every cycle."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class LoadsInOrder(Protocol):
    """A store that can also give each source's replicas in the order its rows were read
    (each equal to the source's set, or absent), from which :meth:`Model.of
    <hydrator.core.model.Model.of>` builds the site views faster than from the sets (a set's
    hash order visits memory at random)."""

    def load_in_order(self) -> tuple[State, Mapping[str, Sequence[Replica]]]: ...


# -- the pool's queues and slots -------------------------------------------------------------


class QueueReader(Protocol):
    """Reads every schedd's queue once (an adapter over the collector and the schedds)."""

    @property
    def pool(self) -> bool:
        """The reads cover the demand and the probe (else annotation alone)."""
        ...

    def read(self) -> QueueSnapshot:
        """This cycle's snapshot; never raises for a schedd or collector that cannot be read
        (recorded in the snapshot)."""
        ...


class QueueAdapter(Protocol):
    """Reads and edits the schedds' queues for job annotation (called by
    :mod:`hydrator.runtime.annotate_jobs`)."""

    def read(self) -> list[ScheddQueue | ScheddFailure]:
        """Every schedd's idle data-bound jobs; raises PoolError if no schedd can be listed."""
        ...

    def apply(self, edit: GroupEdit) -> int:
        """Make the calls of ``edit`` and return how many were made; raise PoolError when
        the schedd refuses or cannot be reached (the next cycle compares again)."""
        ...

    def close(self) -> None: ...


class PoolProbe(Protocol):
    """Reads the pool for matchmaking quality (an adapter over the schedds and the collector)."""

    def jobs_and_slots(
        self, queue: QueueSnapshot | None = None
    ) -> tuple[list[PoolJob], list[PoolSlot]]:
        """Queued data-bound jobs (those of ``queue``, the cycle's shared read; without one, a
        read of its own) and all slots; raises PoolError if the pool cannot be read."""
        ...

    @property
    def invalid_last_query(self) -> int:
        """Dataset names the last :meth:`jobs_and_slots` skipped as invalid (the jobs'
        ``RequiredDatasets``), for ``hydrator_invalid_records_total``."""
        ...


class DistanceReader(Protocol):
    """Reads a catalogue's distances between storage elements (:mod:`hydrator.core.near`)."""

    def read_distances(self) -> ElementDistances:
        """Every element with its site and every distance, unchecked; raises a
        ``SourceError`` when the catalogue refuses or fails the read."""
        ...

    def close(self) -> None: ...


# -- event streams ---------------------------------------------------------------------------


class EventSink(Protocol):
    """Where a listener delivers; called from the listener's threads, so thread-safe."""

    def event(self, event: RucioEvent) -> None:
        """A message that passed validation."""
        ...

    def ignored(self, label: str, reason: Ignored) -> None:
        """A message dropped at the edge (``label``: its event type as a metric label)."""
        ...

    def connection(self, connected: bool) -> None:
        """The listener's state changed (subscribed, or the connection is gone)."""
        ...


class EventListener(Protocol):
    """A started listener keeps itself connected until :meth:`stop`."""

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def status(self) -> ListenerStatus: ...


@runtime_checkable
class RunsThread(Protocol):
    """A listener that says whether its thread runs (supervision: one found dead is started
    again with :meth:`EventListener.start`)."""

    def alive(self) -> bool: ...
