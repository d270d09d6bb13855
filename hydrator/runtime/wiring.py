"""Builds a :class:`~hydrator.runtime.service.Service` from a :class:`~hydrator.config.Config`,
with the parts it is given beside it (:class:`Assembly`: :func:`assemble`,
:func:`build_assembly`): the daemon's other parts are handed their parts from there.

The one runtime module that imports ``hydrator.adapters`` (an import-linter contract says
so): the rest of the runtime sees the ports of :mod:`hydrator.core.ports`. Each adapter has
one typed factory here, found through a mapping from its configuration type
(:data:`SOURCE_FACTORIES`); no adapter is found by a string. A factory imports its adapter
module when called, so a static-only setup never imports rucio-clients or htcondor2.
:func:`start_events` builds and starts the event cycles of the sources that follow events,
with their gate.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry

from hydrator.adapters.state import drains as drain_rows
from hydrator.adapters.state.drains import reset_state
from hydrator.adapters.state.sqlite import SqliteStateStore, StateLock
from hydrator.config import (
    ClassAdConfig,
    CollectorConfig,
    Config,
    DmapiSourceConfig,
    JobsConfig,
    RucioEventsConfig,
    RucioSourceConfig,
    SourceConfig,
    StaticSourceConfig,
)
from hydrator.core.advertise import AdvertisePolicy
from hydrator.core.event_hints import ReconcilePolicy
from hydrator.core.jobs import AnnotateSettings
from hydrator.core.plan import GuardPolicy
from hydrator.core.ports import (
    DistanceReader,
    EventListener,
    EventSink,
    LoadsInOrder,
    PoolProbe,
    Publisher,
    QueueAdapter,
    QueueReader,
    Source,
    StateStore,
    TargetedReads,
)
from hydrator.core.slot_coverage import SiteCoverage
from hydrator.core.startup import startup_from
from hydrator.core.storage import Drain
from hydrator.domain import Site
from hydrator.errors import ConfigError, HydratorError, StateError
from hydrator.runtime.annotate_jobs import Annotator
from hydrator.runtime.event_worker import EventCycles, ListenerFactory
from hydrator.runtime.full_read_gate import FullReadGate
from hydrator.runtime.memory import collector_paused, map_large_blocks
from hydrator.runtime.metrics import Metrics
from hydrator.runtime.near_sites import NearSites
from hydrator.runtime.observe import record_drains, record_rejected_rows
from hydrator.runtime.outcome import Published, render_ads
from hydrator.runtime.parts import Catalogue, Demand, Instruments, Policies, Pool, utcnow
from hydrator.runtime.queue_reads import queue_max_age_s
from hydrator.runtime.service import Service, ServiceStartup

if TYPE_CHECKING:
    from hydrator.adapters.htcondor.collector import CollectorPublisher
    from hydrator.adapters.htcondor.condor_queue import CondorQueue

log = logging.getLogger(__name__)


def static_source(config: StaticSourceConfig, sites: Mapping[str, str]) -> Source:
    """``type = "static"``: an inventory file."""
    from hydrator.adapters.sources import static  # noqa: PLC0415  (lazy)

    return static.build(config, sites)


def rucio_source(config: RucioSourceConfig, sites: Mapping[str, str]) -> Source:
    """``type = "rucio"``: imports rucio-clients."""
    from hydrator.adapters.sources import rucio  # noqa: PLC0415  (lazy)

    return rucio.build(config, sites)


def dmapi_source(config: DmapiSourceConfig, sites: Mapping[str, str]) -> Source:
    """``type = "dmapi"``: the SKA Data Management API over requests."""
    from hydrator.adapters.sources import dmapi  # noqa: PLC0415  (lazy)

    return dmapi.build(config, sites)


SourceFactory = Callable[[Any, Mapping[str, str]], Source]
SOURCE_FACTORIES: Mapping[type, SourceFactory] = {
    StaticSourceConfig: static_source,
    RucioSourceConfig: rucio_source,
    DmapiSourceConfig: dmapi_source,
}
"""Configuration type -> factory; ``tests/unit/runtime/test_wiring.py`` checks that every
member of :data:`~hydrator.config.SourceConfig` has one whose parameter is that type."""


def build_source(config: SourceConfig, sites: Mapping[str, str]) -> Source:
    return SOURCE_FACTORIES[type(config)](config, sites)


def collector_publisher(config: CollectorConfig, attrs: ClassAdConfig) -> CollectorPublisher:
    """``[collector]``: imports htcondor2 (after pointing it at ``token_dir``)."""
    if config.token_dir is not None:
        # read by the HTCondor library when it first loads its configuration
        os.environ.setdefault("_CONDOR_SEC_TOKEN_DIRECTORY", str(config.token_dir))
    from hydrator.adapters.htcondor import collector  # noqa: PLC0415  (lazy)

    return collector.build(config, attrs)


def schedd_queues(
    config: JobsConfig, collector: CollectorConfig, reader: CondorQueue | None = None
) -> QueueAdapter:
    """``[jobs]``: edits the schedds' queues through htcondor2, located by ``reader``."""
    from hydrator.adapters.htcondor import schedd_jobs  # noqa: PLC0415  (lazy)

    return schedd_jobs.build(config, collector, reader)


def schedd_reschedule(config: Config) -> Callable[[], int]:
    """``[collector] reschedule_min_interval_s``: asks the schedds for a negotiation cycle."""
    from hydrator.adapters.htcondor.schedd_reschedule import ScheddReschedule  # noqa: PLC0415  (lazy)

    return ScheddReschedule(config.collector, config.jobs.schedds)


def queue_reader(config: Config) -> CondorQueue | None:
    """The one queue read per cycle (:mod:`hydrator.core.queue`) for the consumers that are on:
    the demand and the probe (``[collector]``), annotation (``[jobs]``); None when none is."""
    pool, jobs = config.collector.enabled, config.jobs if config.jobs.annotate else None
    if not pool and jobs is None:
        return None
    from hydrator.adapters.htcondor import condor_queue  # noqa: PLC0415  (lazy)

    running = pool and config.collector.locality_metrics
    return condor_queue.build(config.collector, jobs, pool=pool, running=running)


def build_publishers(config: Config) -> tuple[list[Publisher], PoolProbe | None]:
    """The collector publisher when ``[collector]`` is on, and the pool probe."""
    if not config.collector.enabled:
        return [], None
    publisher = collector_publisher(config.collector, config.classad)
    from hydrator.adapters.htcondor import condor_queue  # noqa: PLC0415  (lazy)

    probe = condor_queue.CondorPoolProbe(publisher.collector, config.collector.slot_site_attribute)
    return [publisher], probe


def build_annotator(config: Config, reader: CondorQueue | None = None) -> Annotator | None:
    """The job annotator of ``[jobs]`` (None when off), editing through ``reader``'s
    schedds; imports htcondor2 only when on."""
    if not config.jobs.annotate:
        return None
    settings = AnnotateSettings(
        desired_sites=bool(config.jobs.desired_sites_attribute),
        overwrite_desired_sites=config.jobs.overwrite_desired_sites,
        max_edits=config.jobs.max_edits_per_cycle,
    )
    return Annotator(schedd_queues(config.jobs, config.collector, reader), settings)


def slot_coverage(
    config: Config, digests: Mapping[Site, str]
) -> tuple[Mapping[Site, SiteCoverage], int, int]:
    """``hydrator show``: the slot ads' coverage now, asked of ``[collector]`` (raises
    PublishError): per site, then slot ads without a site attribute and of unknown sites."""
    return collector_publisher(config.collector, config.classad).coverage_now(digests)


def state_store(path: Path, *, read_only: bool = False) -> StateStore:
    """The state file at ``path`` without the writer's lock (``hydrator show`` reads it)."""
    return SqliteStateStore(path, read_only=read_only)


def set_drain(path: Path, drain: Drain) -> None:
    """Save ``drain`` in the state file at ``path`` (``hydrator drain``); raises StateError."""
    drain_rows.set_drain(path, drain)


def remove_drain(path: Path, site: Site, storage: str | None) -> int:
    """Remove a drain from the state file (``hydrator undrain``): how many (0 or 1)."""
    return drain_rows.remove_drain(path, site, storage)


def reported_targets(path: Path) -> tuple[set[str], set[tuple[str, str]]]:
    """The sites and (site, storage element) the sources' last good answers state, from
    ``path`` alone (``hydrator drain``'s check)."""
    return drain_rows.reported_targets(path)


def event_listener(config: RucioEventsConfig, source: str, sink: EventSink) -> EventListener:
    """``[sources.events]``: the STOMP listener (imports stomp-py)."""
    from hydrator.adapters.events import stomp_listener  # noqa: PLC0415  (lazy)

    return stomp_listener.build(config, source, sink)


@dataclass(frozen=True)
class Assembly:
    """A :class:`Service` and the parts it was built over, grouped as :mod:`.parts` says.
    The daemon's other parts are handed from here what they use (the event cycles and their
    gate: the sources, the deadlines, the metrics; the repair watch: the publishers, the
    metrics, the clock; the HTTP endpoint and the supervisor: the metrics), never from the
    service, which keeps its parts to itself. A reload builds a new assembly (over the same
    metrics) and hands its parts out anew."""

    service: Service
    catalogue: Catalogue
    pool: Pool
    instruments: Instruments


def assemble(
    config: Config,
    *,
    sources: Sequence[Source],
    store: StateStore,
    publishers: Sequence[Publisher] = (),
    metrics: Metrics | None = None,
    demand: Demand | None = None,
    probe: PoolProbe | None = None,
    annotator: Annotator | None = None,
    clock: Callable[[], datetime] = utcnow,
    queue: QueueReader | None = None,
    distances: DistanceReader | None = None,
) -> Assembly:
    """A :class:`Service` over the given parts, grouped as :mod:`.parts` says, with its
    policies from ``config`` and its :class:`ServiceStartup` loaded from ``store`` (garbage
    collection paused and the model frozen after, glibc's allocator tuned first:
    :mod:`.memory`), and those parts beside it (:class:`Assembly`). ``demand``, when given
    (tests), answers the demand in place of ``queue``."""
    metrics = metrics if metrics is not None else Metrics(CollectorRegistry())
    advertise_policy = AdvertisePolicy(
        demand_only=config.classad.advertise == "demand",
        max_datasets_per_site=config.classad.max_datasets_per_site,
        max_ad_bytes=config.classad.max_ad_bytes,
        stuck=config.classad.advertise_stuck,
    )
    map_large_blocks()
    with collector_paused():
        startup = load_startup(config, store, metrics, advertise_policy, clock)
    near = NearSites(config.distances, metrics, distances) if config.distances.enabled else None
    deadlines_s = {s.name: s.deadline_s for s in config.sources}
    catalogue = Catalogue(tuple(sources), store, deadlines_s)
    pool = Pool(
        tuple(publishers),
        queue=queue,
        demand=demand,
        probe=probe,
        annotator=annotator,
        near=near,
        queue_max_age_s=queue_max_age_s(config),
    )
    policies = Policies(GuardPolicy(**config.safety.model_dump()), advertise_policy, config.classad)
    instruments = Instruments(metrics, clock)
    service = Service(
        startup, catalogue=catalogue, pool=pool, policies=policies, instruments=instruments
    )
    return Assembly(service, catalogue, pool, instruments)


def load_startup(
    config: Config,
    store: StateStore,
    metrics: Metrics,
    policy: AdvertisePolicy,
    clock: Callable[[], datetime],
) -> ServiceStartup:
    """The saved state (its rejected rows counted), the drains (on a failed read none, with
    a warning: the first cycle reads them again) and the ads served until the first cycle
    (:func:`~hydrator.core.startup.startup_views`, at ``clock()`` after the load)."""
    as_read = None
    if isinstance(store, LoadsInOrder):
        state, as_read = store.load_in_order()
    else:
        state = store.load()
    record_rejected_rows(metrics, store.rejected_rows)
    drains: Sequence[Drain] = ()
    active: list[Drain] = []
    now = clock()
    if not policy.demand_only:  # only the startup views read them before the first cycle
        try:
            drains = store.drains()
        except HydratorError as exc:
            log.warning("cannot read the drains, using the previous ones: %s", exc)
        active = [d for d in drains if d.active(now)]
        record_drains(metrics, active)
    model, views, full = startup_from(state, active, now, policy, config.classad, as_read=as_read)
    return ServiceStartup(model, Published(render_ads(views, config.classad), views=full), drains)


def build_service(
    config: Config,
    metrics: Metrics | None = None,
    *,
    read_only: bool = False,
    reset: bool = False,
) -> Service:
    """The service of :func:`build_assembly` alone, for tests and ``benchmarks/annotate.py``
    (the command line, ``hydrator once`` included, calls :func:`build_assembly`)."""
    return build_assembly(config, metrics, read_only=read_only, reset=reset).service


def build_assembly(
    config: Config,
    metrics: Metrics | None = None,
    *,
    read_only: bool = False,
    reset: bool = False,
) -> Assembly:
    """Everything a cycle needs, and the parts the daemon hands out beside the service
    (:class:`Assembly`); raises ConfigError/StateError with a one-line message.

    A writer (``read_only`` false) first takes the state's :class:`StateLock`, held until
    :meth:`Service.close`; ``reset`` then moves the existing state file aside. A reader takes
    no lock and opens the state read-only (``hydrator once --dry-run``).
    """
    path = config.daemon.state_path
    if not path.parent.is_dir():
        raise StateError(f"daemon.state_path: directory {path.parent} does not exist")
    lock = None if read_only else StateLock(path)
    try:
        if reset:
            reset_state(path, datetime.now(UTC))
        store = SqliteStateStore(path, read_only=read_only, lock=lock)
    except BaseException:
        if lock is not None:
            lock.release()
        raise
    try:
        return _assembly(config, store, metrics)
    except BaseException:
        store.close()
        raise


def _assembly(config: Config, store: SqliteStateStore, metrics: Metrics | None) -> Assembly:
    sources = [build_source(s, config.sites) for s in config.sources]
    publishers, pool_probe = build_publishers(config)
    queue = queue_reader(config)
    from_queue = any(
        isinstance(s, DmapiSourceConfig) and s.datasets_from_queue for s in config.sources
    )
    if from_queue and not config.collector.enabled:
        raise ConfigError(
            "sources.datasets_from_queue", "needs [collector] enabled = true to query the queue"
        )
    if config.classad.advertise == "demand" and not config.collector.enabled:
        raise ConfigError(
            "classad.advertise", '"demand" needs [collector] enabled = true to read the queues'
        )
    # the CondorPoolProbe (slots) and the shared queue read feed the matchmaking metrics
    probe = pool_probe if config.collector.locality_metrics else None
    return assemble(
        config,
        sources=sources,
        store=store,
        publishers=publishers,
        metrics=metrics,
        probe=probe,
        annotator=build_annotator(config, queue),
        queue=queue,
        distances=distance_reader(config),
    )


def distance_reader(config: Config) -> DistanceReader | None:
    """The distances of ``[distances] source`` (a Rucio source: imports rucio-clients); None
    for the operator table or with ``[distances]`` off."""
    name = config.distances.source
    if not config.distances.enabled or name is None:
        return None
    from hydrator.adapters.sources.rucio.distances import RucioDistances  # noqa: PLC0415

    (source,) = [s for s in config.sources if s.name == name and isinstance(s, RucioSourceConfig)]
    return RucioDistances(source, config.sites, config.distances.max_answer_bytes)


def start_events(
    config: Config, assembly: Assembly, listener: ListenerFactory
) -> FullReadGate | None:
    """Start an :class:`EventCycles` (worker and listener) per Rucio source with events on;
    the gate for the scheduler, or None when no source has events. ``listener`` builds a
    listener (the daemon's: :func:`event_listener`, STOMP). Each is handed ``assembly``'s
    service (the cycles it runs) and the parts it uses: the metrics, the sources' deadlines,
    the sources the gate's refresh cycles read."""
    service, catalogue = assembly.service, assembly.catalogue
    metrics = assembly.instruments.metrics
    chosen = event_sources(config, catalogue.sources)
    if not chosen:
        return None
    cycles: list[EventCycles] = []
    for source_config, source in chosen:
        if not isinstance(source, TargetedReads):
            raise ConfigError(
                f"sources.{source_config.name}.events", "this source cannot re-read datasets"
            )
        events = source_config.events
        policy = ReconcilePolicy(
            config.daemon.interval_s, events.reconcile_interval_s, events.silence_s
        )
        made = EventCycles(
            service,
            source,
            events,
            policy,
            source_config.scopes,
            metrics=metrics,
            deadlines_s=catalogue.deadlines_s,
        )
        made.listener = listener(events, source_config.name, made)
        made.start()
        cycles.append(made)
    poll_all = len(chosen) < len(catalogue.sources)
    return FullReadGate(service, cycles, poll_all, metrics=metrics, sources=catalogue.sources)


def event_sources(
    config: Config, sources: Sequence[Source]
) -> list[tuple[RucioSourceConfig, Source]]:
    """The configured Rucio sources with ``[sources.events] enabled``, with their adapters
    (among ``sources``)."""
    by_name = {s.name: s for s in sources}
    return [
        (c, by_name[c.name])
        for c in config.sources
        if isinstance(c, RucioSourceConfig) and c.events.enabled and c.name in by_name
    ]
