"""The service: one cycle as a plain call, one method per kind of cycle (:class:`CycleKind`:
:meth:`Service.run_cycle`, :meth:`~Service.run_event_cycle`,
:meth:`~Service.run_refresh_cycle`; and :meth:`~Service.run_dry_cycle`), plus what the HTTP
endpoint serves between cycles. Scheduling lives in :mod:`.scheduler`; the decision in
:mod:`hydrator.core.plan`; this module only sequences fetch -> plan -> save -> publish.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from enum import Enum
from functools import partial
from typing import NamedTuple

from hydrator.config import DEFAULT_DEADLINE_S
from hydrator.core.between_reads import planned_between
from hydrator.core.jobs import JobsReport
from hydrator.core.locality import locality_report
from hydrator.core.near import with_near
from hydrator.core.plan import Model, Plan, planned
from hydrator.core.ports import (
    Abandonable,
    FetchContext,
    PublishReport,
    Source,
)
from hydrator.core.queue import QueueSnapshot, idle_demand
from hydrator.core.storage import Drain
from hydrator.domain import DatasetId, Site, SiteView, SourceFailure, SourceOutcome, State
from hydrator.errors import (
    HydratorError,
    PermanentSourceError,
    PoolError,
    PublishError,
    SourceError,
)
from hydrator.redact import redact
from hydrator.runtime.advertising import Advertising
from hydrator.runtime.drain_reads import DrainReads
from hydrator.runtime.fetching import FetchThreads
from hydrator.runtime.memory import FULL_COLLECTION_EVERY, collector_paused
from hydrator.runtime.observe import (
    fetch_record,
    record_cycle,
    record_fetch,
    record_locality,
    record_pool_read,
    record_remote_budget,
    record_unadvertised,
)
from hydrator.runtime.outcome import CycleReport, Published, log_cycle, render_ads
from hydrator.runtime.parts import Catalogue, Instruments, Policies, Pool
from hydrator.runtime.phases import phase, recording
from hydrator.runtime.queue_reads import QueueReads

log = logging.getLogger(__name__)

Rereader = Callable[[State, FetchContext], Mapping[str, SourceOutcome]]
"""An event or refresh cycle's answers in place of a full read's fetch
(:mod:`hydrator.runtime.event_worker`, :mod:`hydrator.runtime.refresh_answers`): from the
state before and the cycle's context, one answer per source; the service plans them with
:func:`~hydrator.core.between_reads.planned_between`."""


class CycleKind(Enum):
    """The kinds of cycle, one :class:`Service` method each. The value is what ``/v1/sites``
    labels the sites a cycle changed with (``origin``; :attr:`Published.origins`)."""

    FULL_READ = "full_read"
    """Every source fetched, then planned (:meth:`Service.run_cycle`): the scheduled cycle,
    the first one, the event gate's full read, ``hydrator once``."""
    EVENT = "event"
    """A :data:`Rereader` re-reads the datasets messages named (:meth:`Service.run_event_cycle`);
    the queues' last snapshot is reused while young (:mod:`.queue_reads`)."""
    REFRESH = "refresh"
    """A :data:`Rereader` restates the last good answers with the storage statuses read now,
    no dataset (:meth:`Service.run_refresh_cycle`); the drains and the queues read afresh."""


class _Decided(NamedTuple):
    """What a cycle decided before it saves: the plan, the model of its state, the demand it
    advertises by (None: the queues never read) and the queues' snapshot taken for it (None:
    none yet)."""

    plan: Plan
    model: Model
    wanted: Mapping[DatasetId, int] | None
    queue: QueueSnapshot | None


@dataclass(frozen=True)
class ServiceStartup:
    """What a service starts from (built by :func:`hydrator.runtime.wiring.load_startup`):
    the saved state's model and the views it serves before its first cycle (from the core's
    :class:`~hydrator.core.startup.Startup`, the views rendered into ads), and the operator's
    drains as read (empty when they could not be; the next cycle reads them again)."""

    model: Model
    published: Published
    drains: Sequence[Drain] = ()


class Service:
    """Sequences one cycle of each kind (:class:`CycleKind`); owns the stop event
    (:meth:`stop`) and what is kept between cycles: the state with its views, what is served
    (:attr:`published`), where each site's lists came from, the drains (:class:`.DrainReads`),
    each site's advertise answer (:class:`.Advertising`), the queues' last snapshot
    (:class:`.QueueReads`) and the last demand. Built by :mod:`hydrator.runtime.wiring`
    (``assemble``), which makes every part it is given and hands the daemon's other parts
    those they use: the service keeps its parts to itself."""

    def __init__(
        self,
        startup: ServiceStartup,
        *,
        catalogue: Catalogue,
        pool: Pool,
        policies: Policies,
        instruments: Instruments,
    ) -> None:
        """``startup`` is what the first cycle starts from; the parts are the groups of
        :mod:`.parts`: the catalogue side, the pool side, the policies, and the metrics and
        clock. The configuration they were built from stays with the builder (the event
        cycles, the repair watch and the reschedule step are given their settings there)."""
        self._catalogue, self._pool, self._policies = catalogue, pool, policies
        self._metrics, self._clock = instruments.metrics, instruments.clock
        self._stop_event = threading.Event()
        self.last_cycle_end = time.monotonic()
        self.published = startup.published
        self._model = startup.model  # the state's model: handed to each plan
        self._drains = DrainReads(catalogue.store, self._metrics, self._clock, startup.drains)
        self._origins: dict[Site, tuple[str, datetime]] = {}  # see _note_origins
        self._advertising = Advertising(policies.advertise, policies.classad)
        self._queue_reads = QueueReads(pool.queue, pool.queue_max_age_s, self._metrics)
        self._last_wanted: Mapping[DatasetId, int] | None = None  # None: never read
        self._fetches = FetchThreads(self._deadline_s, self._stop_event)
        self._lock = threading.Lock()  # one cycle at a time, whoever calls
        self._cycles = 0
        self._listeners: list[Callable[[], None]] = []
        if pool.near is not None:
            record_remote_budget(self._metrics, pool.near.config.remote_budget)

    def add_listener(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` after every cycle (in the cycle's thread), once :attr:`published`,
        :meth:`readiness` and :attr:`last_cycle_end` say what the cycle did; its errors are
        logged."""
        self._listeners.append(listener)

    def remove_listener(self, listener: Callable[[], None]) -> None:
        self._listeners.remove(listener)

    def stop(self) -> None:
        """Stop the running full read: its fetch is abandoned and the cycle ends before it
        saves (SIGTERM); the next full read ends so too."""
        self._stop_event.set()

    @property
    def state(self) -> State:
        return self._model.state

    def readiness(self) -> tuple[bool, str]:
        """``(ready, reason)``: ready once every configured source has answered successfully
        at least once, in this run or in the saved state (its last-known-good data is then
        served); the reason names the sources still missing and their last error."""
        errors = {s.name: s.reason for s in self.published.sources}
        missing = []
        for source in self._catalogue.sources:
            saved = self._model.state.sources.get(source.name)
            if saved is None or saved.last_success is None:
                error = errors.get(source.name)
                missing.append(f"{source.name} ({error})" if error else source.name)
        if missing:
            return False, "no successful answer yet from source(s): " + ", ".join(missing)
        return True, f"every source ({len(self._catalogue.sources)}) has answered at least once"

    def run_cycle(self) -> CycleReport:
        """A full read (:attr:`CycleKind.FULL_READ`): fetch, plan, save, publish, annotate.
        Never raises for source, state or publish failures (the report says)."""
        return self._run(partial(self._cycle, CycleKind.FULL_READ, None))

    def run_event_cycle(self, reread: Rereader) -> CycleReport:
        """An event cycle (:attr:`CycleKind.EVENT`): ``reread`` answers in place of the
        fetch, the answers are planned between full reads, then as :meth:`run_cycle`."""
        return self._run(partial(self._cycle, CycleKind.EVENT, reread))

    def run_refresh_cycle(self, reread: Rereader) -> CycleReport:
        """A refresh cycle (:attr:`CycleKind.REFRESH`, in place of a skipped full read):
        as :meth:`run_event_cycle`."""
        return self._run(partial(self._cycle, CycleKind.REFRESH, reread))

    def run_dry_cycle(self) -> CycleReport:
        """A full read's fetch and plan, nothing saved, published or annotated (``hydrator
        once --dry-run``)."""
        return self._run(self._dry_cycle)

    def _run(self, cycle: Callable[[datetime, float], CycleReport]) -> CycleReport:
        """``cycle``, given its start (the clock's) and monotonic ``t0``: one at a time,
        its phases recorded, the garbage collector paused; a failure (``HydratorError``) is
        a failed report; then logged, counted and the listeners told."""
        with self._lock, recording() as phases:
            started, t0 = self._clock(), time.monotonic()
            self._cycles += 1
            with collector_paused(full=self._cycles % FULL_COLLECTION_EVERY == 0):
                try:
                    report = cycle(started, t0)
                except HydratorError as exc:
                    log.error("cycle failed: %s", exc)
                    error = redact(str(exc))
                    report = CycleReport(started, time.monotonic() - t0, "failed", error=error)
            report = replace(report, phases=phases.taken())
            self.last_cycle_end = time.monotonic()
            self._observe(report)
            self._notify()
            return report

    def notify_listeners(self) -> None:
        """Call the after-cycle listeners again (an event cycle's metrics, recorded after its
        cycle, then reach the served files at once)."""
        with self._lock:
            self._notify()

    def _notify(self) -> None:
        for listener in list(self._listeners):
            try:
                listener()
            except Exception:  # a listener's bug must not end the daemon's cycles
                log.exception("after-cycle listener %r failed", listener)

    def _decide(
        self, kind: CycleKind, reread: Rereader | None, started: datetime
    ) -> _Decided | None:
        """The queues, the drains, and the plan: of ``reread``'s answers, planned between
        full reads (read times kept); or (a full read, no ``reread``) of every source fetched;
        None when stopped during the fetch."""
        # the cycle's one queue read: first when the demand needs it, else after the ads;
        # an event cycle reuses a young one (queue_reads.py)
        reads = self._queue_reads
        reads.begin(scheduled=kind is not CycleKind.EVENT)
        with phase("queue"):
            queue = reads.take() if reads.pool else None
            wanted = self._wanted(queue)
        drains = self._drains.active(started)
        context = FetchContext(
            now=started,
            wanted=wanted or {},
            previous={name: s.replicas for name, s in self._model.state.sources.items()},
            drains=drains,
        )
        policy = self._policies.guards
        if reread is not None:
            with phase("plan"):
                state = self._model.state
                answers = reread(state, context)
                decided = planned_between(
                    state, answers, started, policy, drains, model=self._model
                )
            return _Decided(*decided, wanted, queue)
        self._drains.applied(drains)
        with phase("fetch"):
            outcomes = self._fetch_all(context)
        if self._stop_event.is_set():
            return None
        with phase("plan"):
            plan, model = planned(
                self._model.state, outcomes, started, policy, drains, model=self._model
            )
        return _Decided(plan, model, wanted, queue)

    def _dry_cycle(self, started: datetime, t0: float) -> CycleReport:
        decided = self._decide(CycleKind.FULL_READ, None, started)
        if decided is None:
            return CycleReport(started, time.monotonic() - t0, "abandoned")
        plan = decided.plan
        return CycleReport(started, time.monotonic() - t0, _outcome(plan, {}), plan)

    def _cycle(
        self, kind: CycleKind, reread: Rereader | None, started: datetime, t0: float
    ) -> CycleReport:
        decided = self._decide(kind, reread, started)
        if decided is None:
            return CycleReport(started, time.monotonic() - t0, "abandoned")
        plan, model, wanted, queue = decided
        with phase("save"):
            rows = self._catalogue.store.save(plan)  # StateError: nothing advanced, cycle failed
        self._model = model
        self._note_origins(plan, started, kind)
        if self._policies.advertise.demand_only and wanted is None:
            published: dict[str, PublishReport] = {}
            errors = {"demand": "the queues have not been read yet: nothing advertised"}
            log.warning("demand mode: the queues have not been read yet, publishing nothing")
        else:
            published, errors = self._advertise_and_publish(plan, wanted or {}, started)
        reads = self._queue_reads
        with phase("jobs"):
            if queue is None and reads.present:
                queue = reads.take()  # annotation alone: a slow schedd never delays the ads
            self._measure_locality(plan, queue)
            jobs = self._annotate(plan, started, queue)
            reads.edited(jobs)
        duration = time.monotonic() - t0
        outcome = _outcome(plan, errors)
        report = CycleReport(started, duration, outcome, plan, rows, published, errors, jobs=jobs)
        return replace(report, queue=reads.outcome)

    def _advertise_and_publish(
        self,
        plan: Plan,
        wanted: Mapping[DatasetId, int],
        started: datetime,
    ) -> tuple[dict[str, PublishReport], dict[str, str]]:
        near = self._pool.near.current(plan.sites) if self._pool.near is not None else {}
        self._advertising.near(near)  # its line counts in max_ad_bytes
        with phase("advertise"):
            advertised = self._advertising.choose(plan, wanted, self.published.ads)
        views = {site: with_near(a.view, near.get(site)) for site, a in advertised.items()}
        with phase("render"):
            ads = render_ads(views, self._policies.classad, self.published.ads)
        self.published = Published(
            ads,
            plan.sources,
            started,
            self.published.demand,  # until this cycle's annotation replaces it
            plan.sites,  # the full lists, for the JSON views
            dict(self._origins),
        )
        record_unadvertised(self._metrics, advertised.values())
        with phase("publish"):
            return self._publish(views, plan.removed_sites, started)

    def drains_changed(self) -> bool:
        """The active drains differ from those the last full read applied
        (:meth:`.DrainReads.changed`): only a full read applies them all."""
        return self._drains.changed()

    def _note_origins(self, plan: Plan, started: datetime, kind: CycleKind) -> None:
        """Where each site's data last came from: a full read sets every site, an event or
        refresh cycle the sites whose lists it changed (``/v1/sites`` says it): their content,
        or what storage and drains let them serve (a refresh cycle changes only that)."""
        origin = kind.value
        if kind is CycleKind.FULL_READ:
            self._origins = {site: (origin, started) for site in plan.sites}
            return
        served = self.published.views  # the last cycle's lists, storage and drains applied
        for site, view in plan.sites.items():
            last = served.get(site)
            if site in plan.changed_sites or (last is not None and last.digest != view.digest):
                self._origins[site] = (origin, started)
        for site in plan.removed_sites:
            self._origins.pop(site, None)

    def _wanted(self, queue: QueueSnapshot | None) -> Mapping[DatasetId, int] | None:
        """What queued jobs declare; on a failed query the last good answer (a schedd that
        does not answer must not empty demand-driven ads); None if never read."""
        demand = self._pool.demand
        if demand is None and (queue is None or not queue.pool):
            return {}
        try:
            if demand is not None:
                self._last_wanted = demand()
            elif queue is not None:
                self._last_wanted = idle_demand(queue).counts
        except HydratorError as exc:
            log.warning("queue query failed, using the previous demand: %s", exc)
        return self._last_wanted

    def _fetch_all(self, context: FetchContext) -> dict[str, SourceOutcome]:
        """Every source fetched at once, each awaited up to its ``deadline_s``:
        one past it is failed and the cycle goes on (:mod:`.fetching`)."""
        return self._fetches.fetch_all(self._catalogue.sources, lambda s: self._fetch(s, context))

    def _deadline_s(self, source: str) -> float:
        """The configured ``deadline_s`` of the source named ``source``."""
        return self._catalogue.deadlines_s.get(source, DEFAULT_DEADLINE_S)

    def busy_sources(self) -> list[str]:
        """Sources whose fetch, abandoned at its deadline, still runs (nothing to wait for)."""
        return self._fetches.busy()

    def _fetch(self, source: Source, context: FetchContext) -> SourceOutcome:
        t0 = time.monotonic()
        try:
            outcome: SourceOutcome = source.fetch(context)
        except SourceError as exc:
            log.warning("source %s failed: %s", source.name, exc)
            permanent = isinstance(exc, PermanentSourceError)
            outcome = SourceFailure(source.name, redact(str(exc)), permanent)
        except Exception as exc:  # a bug in one adapter must not stop the others or the daemon
            log.exception("source %s raised an unexpected error", source.name)
            reason = redact(f"unexpected {type(exc).__name__}: {exc}")
            outcome = SourceFailure(source.name, reason)
        record_fetch(self._metrics, fetch_record(source, time.monotonic() - t0))
        return outcome

    def _publish(
        self, views: Mapping[Site, SiteView], removed: frozenset[Site], now: datetime
    ) -> tuple[dict[str, PublishReport], dict[str, str]]:
        reports: dict[str, PublishReport] = {}
        errors: dict[str, str] = {}
        for publisher in self._pool.publishers:
            try:
                reports[publisher.name] = publisher.publish(views, removed, now)
            except PublishError as exc:
                log.warning("publisher %s failed, retrying next cycle: %s", publisher.name, exc)
                errors[publisher.name] = redact(str(exc))
        return reports, errors

    def _measure_locality(self, plan: Plan, queue: QueueSnapshot | None) -> None:
        """Matchmaking quality from the pool, and the invalid names its jobs declare; a pool
        that cannot be read skips both this cycle."""
        probe, near = self._pool.probe, self._pool.near
        if probe is None:
            return
        try:
            if queue is None:  # a probe given without a queue reader reads on its own
                jobs, slots = probe.jobs_and_slots()
            else:
                jobs, slots = probe.jobs_and_slots(queue)
        except PoolError as exc:
            log.warning("cannot read the pool for matchmaking quality: %s", exc)
            record_pool_read(self._metrics, None)
            return
        record_pool_read(self._metrics, probe.invalid_last_query)
        table = near.table.near if near is not None else None
        record_locality(self._metrics, locality_report(jobs, slots, plan.sites, table))

    def _annotate(
        self, plan: Plan, started: datetime, queue: QueueSnapshot | None
    ) -> JobsReport | None:
        """Write where their data is onto idle jobs (after the ads are out: a slow or failing
        schedd never delays them); a failure here is counted and logged, never fails the cycle."""
        if self._pool.annotator is None:
            return None
        try:
            report = self._pool.annotator.run(plan.sites, int(started.timestamp()), queue)
        except Exception:  # a bug in annotation must not cost the cycle its ads
            log.exception("job annotation failed")
            return JobsReport(error="job annotation failed unexpectedly")
        self.published = replace(self.published, demand=report.demand)
        return report

    def _observe(self, report: CycleReport) -> None:
        log_cycle(report)
        record_cycle(self._metrics, report, self.published)

    def close(self) -> None:
        busy = set(self.busy_sources())  # closing under a running fetch could block on it
        closers = [(s.name, s.close) for s in self._catalogue.sources if s.name not in busy]
        for source in self._catalogue.sources:  # ... unless Abandonable: that ends it, not blocking
            if source.name in busy and isinstance(source, Abandonable):
                closers.append((source.name, source.abandon))
        pool = self._pool
        closers += [(p.name, p.close) for p in pool.publishers]
        if pool.annotator is not None:
            closers.append(("job annotator", pool.annotator.close))
        if pool.near is not None:
            closers.append(("distance reader", pool.near.close))
        for name, close in closers:
            try:
                close()
            except Exception:  # closing is best effort at shutdown; say what failed
                log.exception("closing %s failed", name)
        self._catalogue.store.close()


def _outcome(plan: Plan, publish_errors: Mapping[str, str]) -> str:
    if publish_errors or any(not s.fresh for s in plan.sources):
        return "degraded"
    return "ok"
