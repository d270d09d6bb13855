"""The service: one cycle as a plain call (:meth:`Service.run_cycle`), plus what the HTTP
endpoint serves between cycles. Scheduling lives in :mod:`.scheduler`; the decision in
:mod:`hydrator.core.plan`; this module only sequences fetch -> plan -> save -> publish.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime
from itertools import chain
from operator import itemgetter

from prometheus_client import CollectorRegistry

from hydrator.adapters.htcondor import Publisher, PublishReport
from hydrator.adapters.sources import FetchContext, Source
from hydrator.adapters.state.sqlite import StateStore
from hydrator.config import DEFAULT_DEADLINE_S, ClassAdConfig, Config
from hydrator.core.advertise import MIN_NAME_BYTES, Advertised, AdvertisePolicy, advertise
from hydrator.core.derived import Derived
from hydrator.core.jobs import Annotator, JobsReport
from hydrator.core.locality import PoolProbe, locality_report
from hydrator.core.plan import Plan, Policy, plan_cycle
from hydrator.core.queue import QueueReader, QueueSnapshot, idle_demand
from hydrator.core.render import etag, published_updated, render_cron
from hydrator.core.storage import Drain, with_storage
from hydrator.domain import (
    DatasetId,
    Site,
    SiteView,
    SourceFailure,
    SourceOutcome,
    State,
)
from hydrator.errors import HydratorError, PermanentSourceError, PublishError, SourceError
from hydrator.redact import redact
from hydrator.runtime.fetching import FetchThreads
from hydrator.runtime.metrics import Metrics
from hydrator.runtime.observe import log_cycle, record_cycle
from hydrator.runtime.outcome import CycleReport, Published, SiteAd

log = logging.getLogger(__name__)

Demand = Callable[[], Mapping[DatasetId, int]]
Planner = Callable[[Derived, FetchContext], Plan]
"""An event cycle's decision in place of fetch + plan (:mod:`hydrator.runtime.events`)."""


def utcnow() -> datetime:
    return datetime.now(UTC)


def render_ads(
    views: Mapping[Site, SiteView],
    attrs: ClassAdConfig,
    previous: Mapping[Site, SiteAd] | None = None,
) -> dict[Site, SiteAd]:
    """Render each site's ad; reuse the ``previous`` body of a site whose lists (digest) and
    published update time are unchanged, which is most sites in most cycles."""
    ads: dict[Site, SiteAd] = {}
    for site, view in views.items():
        old = previous.get(site) if previous else None
        if (
            old is not None
            and old.view.digest == view.digest
            and published_updated(old.view, attrs) == published_updated(view, attrs)
        ):
            ads[site] = SiteAd(view, old.body, old.etag)
            continue
        body = render_cron(view, attrs)
        ads[site] = SiteAd(view, body.encode("utf-8"), etag(body))
    return ads


def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "malloc_trim") else None


_LIBC = _libc()
FULL_COLLECTION_EVERY = 60  # cycles between full passes over frozen objects
FEW_NEW_OBJECTS = 100_000  # a block that leaves fewer is collected at its end (~50 ms at most)


class _Frozen:
    """About how many tracked objects :func:`collector_paused` froze: counted exactly only at a
    full collection (``gc.get_freeze_count()`` walks them all: 60 ms at a million replicas),
    else grown by each block's net new objects. Frozen objects freed later lower a later
    block's net count; where that count stopped at zero the sum runs high, which errs
    towards collecting."""

    objects = 0


@contextmanager
def collector_paused(full: bool = False) -> Iterator[None]:
    """Run the block without garbage-collector passes, then collect its cyclic garbage once and
    move every surviving object out of the collector's reach (``gc.freeze``).

    The model a daemon holds (a million replicas, their names, the site views) lives for many
    cycles and holds no reference cycles, yet the collector's passes over it while a cycle
    allocated cost seconds per cycle and found nothing (issue 15). Frozen objects are still
    freed by reference counting when a later cycle drops them; the one collection scans only
    what is not frozen yet (the block's allocations). A cycle of objects that outlived a block
    and was dropped later is not seen while frozen: with ``full`` (every
    ``FULL_COLLECTION_EVERY`` cycles) everything is unfrozen and collected once.

    A block that leaves at least ``FEW_NEW_OBJECTS`` new objects the collector tracks, and
    more than were frozen before it, built most of the model (a startup that loads the state,
    a first cycle): it is frozen without that collection, which would scan the whole new
    model (1.6 s at a million replicas) to find a few hundred objects (a first cycle's,
    ~25 kB: rucio-clients' configuration parsers); its cyclic garbage waits for the next
    full collection."""
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        young = gc.get_count()[0]  # net new tracked objects since the last freeze
        if full:
            gc.unfreeze()
            gc.collect()
        elif young < FEW_NEW_OBJECTS or young <= _Frozen.objects:
            gc.collect()
        gc.freeze()
        _Frozen.objects = gc.get_freeze_count() if full else _Frozen.objects + young
        release_free_memory()


def release_free_memory() -> None:
    """Give the C allocator's free pages back to the system (glibc ``malloc_trim``; nothing
    elsewhere). A cycle's transient buffers (answers of megabytes, parsed chunks) are freed in
    the fetch thread's own malloc arena, which otherwise keeps them: at 100k replicas a third
    of the process's resident memory (issue 15)."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


M_MMAP_THRESHOLD = -3  # glibc <malloc.h>
MMAP_THRESHOLD_BYTES = 128 * 1024  # glibc's initial value, kept fixed
M_ARENA_MAX = -8  # glibc <malloc.h>
ARENAS = 1  # one malloc arena for every thread (glibc's default: 8 per core)


def map_large_blocks() -> None:
    """Keep glibc's mmap threshold at ``MMAP_THRESHOLD_BYTES`` (``mallopt(M_MMAP_THRESHOLD)``;
    nothing elsewhere): a block that large which free heap space cannot serve gets a mapping
    of its own, unmapped when freed, instead of growing the heap.

    By default glibc raises that threshold each time such a block is freed, up to 32 MiB, and
    the heap's trim threshold with it (mallopt(3): setting either stops the adjustment). The
    tables a cycle copies and drops (indexes, sets, answers, lists) then
    grow a heap that stays resident between cycles. At a million replicas, fixing it lowered
    the peak RSS by 50-75 MiB (issue 15).

    Also one arena for all threads (``mallopt(M_ARENA_MAX)``, as ``MALLOC_ARENA_MAX=1``
    does): a source fetches in a thread of its own, whose arena would keep the cycle's freed
    answers and parse buffers apart from the main one's free space until ``malloc_trim``.
    Threads here take turns under the GIL, so they gain nothing from arenas of their own. At
    a million replicas it lowered the peak after a restart by ~30 MiB (issue 15)."""
    if _LIBC is not None and hasattr(_LIBC, "mallopt"):
        _LIBC.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
        _LIBC.mallopt(M_ARENA_MAX, ARENAS)


class Service:
    """Sequences one cycle; owns the stop event and the state between cycles."""

    def __init__(
        self,
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
    ) -> None:
        """``queue`` reads the schedds once per cycle for the demand, ``probe`` and
        ``annotator`` (:mod:`hydrator.core.queue`); ``demand``, when given, answers the
        demand instead (no queue)."""
        self.config = config
        self.sources = list(sources)
        self.store = store
        self.publishers = list(publishers)
        self.metrics = metrics if metrics is not None else Metrics(CollectorRegistry())
        self.demand = demand
        self.probe = probe
        self.annotator = annotator
        self.queue = queue
        self.clock = clock
        self.policy = Policy(**config.safety.model_dump())
        self._drains: Sequence[Drain] = ()  # the operator's, as last read
        self._drains_read: frozenset[Drain] | None = None  # active in the last full read
        self.advertise_policy = AdvertisePolicy(
            demand_only=config.classad.advertise == "demand",
            max_datasets_per_site=config.classad.max_datasets_per_site,
            max_ad_bytes=config.classad.max_ad_bytes,
            stuck=config.classad.advertise_stuck,
        )
        self._over_size: frozenset[Site] = frozenset()  # sites whose ads were cut to fit
        self._advertised: dict[Site, _AdvertiseMemo] = {}  # last cycle's, per site
        self._last_wanted: Mapping[DatasetId, int] | None = None  # None: never read
        self.stop_event = threading.Event()
        self._fetches = FetchThreads(self._deadline_s, self.stop_event)
        self._lock = threading.Lock()  # one cycle at a time, whoever calls
        map_large_blocks()
        with collector_paused():
            self._derived = store.load()  # the state, and its views and indexes
            self.published = Published()  # empty, for _ad_size while the startup views are cut
            for table, count in store.rejected_rows.items():
                self.metrics.state_rejected_rows.labels(table).set(count)
            views = self._startup_views()
            full = self._derived.stamped_views() if views else {}
            self.published = Published(render_ads(views, config.classad), views=full)
        self._cycles = 0
        self.last_cycle_end = time.monotonic()
        self._listeners: list[Callable[[], None]] = []
        self._origins: dict[Site, tuple[str, datetime]] = {}  # see _note_origins

    def add_listener(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` after every cycle (in the cycle's thread), once :attr:`published`,
        :attr:`ready` and :attr:`last_cycle_end` say what the cycle did; its errors are logged."""
        self._listeners.append(listener)

    def remove_listener(self, listener: Callable[[], None]) -> None:
        self._listeners.remove(listener)

    @property
    def state(self) -> State:
        return self._derived.state

    def readiness(self) -> tuple[bool, str]:
        """``(ready, reason)``: ready once every configured source has answered successfully
        at least once, in this run or in the saved state (its last-known-good data is then
        served); the reason names the sources still missing and their last error."""
        errors = {s.name: s.reason for s in self.published.sources}
        missing = []
        for source in self.sources:
            saved = self._derived.state.sources.get(source.name)
            if saved is None or saved.last_success is None:
                error = errors.get(source.name)
                missing.append(f"{source.name} ({error})" if error else source.name)
        if missing:
            return False, "no successful answer yet from source(s): " + ", ".join(missing)
        return True, f"every source ({len(self.sources)}) has answered at least once"

    def run_cycle(self, dry_run: bool = False, planner: Planner | None = None) -> CycleReport:
        """Fetch, plan, save, publish. Never raises for source, state or publish failures.
        With ``planner`` (an event cycle), it decides the plan instead of fetch + plan."""
        with self._lock:
            started, t0 = self.clock(), time.monotonic()
            self._cycles += 1
            with collector_paused(full=self._cycles % FULL_COLLECTION_EVERY == 0):
                try:
                    report = self._cycle(started, t0, dry_run, planner)
                except HydratorError as exc:
                    log.error("cycle failed: %s", exc)
                    error = redact(str(exc))
                    report = CycleReport(started, time.monotonic() - t0, "failed", error=error)
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

    def _startup_views(self) -> dict[Site, SiteView]:
        """What to serve from the saved state before the first cycle: nothing in demand mode
        (the demand is not known yet; hooks keep their last good copy); else the saved views
        with the saved storage statuses and the drains in effect (a drained site must not
        be advertised again by a restart)."""
        if self.advertise_policy.demand_only:
            return {}
        policy, size = self.advertise_policy, self._ad_size
        now = self.clock()
        sources = self._derived.state.sources
        views = with_storage(
            self._derived.stamped_views(),
            [s for name in sorted(sources) for s in sources[name].storages],
            self._read_drains(now),
            now,
        )
        return {s: advertise(v, {}, policy, size).view for s, v in views.items()}

    def _cycle(
        self, started: datetime, t0: float, dry_run: bool, planner: Planner | None
    ) -> CycleReport:
        # the cycle's one queue read: first when the demand needs it, else after the ads
        queue = self.queue.read() if self.queue is not None and self.queue.pool else None
        wanted = self._wanted(queue)
        drains = self._read_drains(started)
        context = FetchContext(
            now=started,
            wanted=wanted or {},
            previous={name: s.replicas for name, s in self._derived.state.sources.items()},
            drains=drains,
        )
        if planner is not None:
            plan = planner(self._derived, context)
        else:
            self._drains_read = frozenset(drains)
            outcomes = self._fetch_all(context)
            if self.stop_event.is_set():
                return CycleReport(started, time.monotonic() - t0, "abandoned")
            plan = plan_cycle(self._derived, outcomes, started, self.policy, drains)
        if dry_run:
            return CycleReport(started, time.monotonic() - t0, _outcome(plan, {}), plan)
        rows = self.store.save(plan)  # StateError: nothing advanced, cycle failed
        self._derived = plan.derived
        self._note_origins(plan, started, "event" if planner is not None else "full_read")
        if self.advertise_policy.demand_only and wanted is None:
            published: dict[str, PublishReport] = {}
            errors = {"demand": "the queues have not been read yet: nothing advertised"}
            log.warning("demand mode: the queues have not been read yet, publishing nothing")
        else:
            published, errors = self._advertise_and_publish(plan, wanted or {}, started)
        if queue is None and self.queue is not None:
            queue = self.queue.read()  # annotation alone: a slow schedd never delays the ads
        self._measure_locality(plan, queue)
        jobs = self._annotate(plan, started, queue)
        duration = time.monotonic() - t0
        outcome = _outcome(plan, errors)
        return CycleReport(started, duration, outcome, plan, rows, published, errors, jobs=jobs)

    def _advertise_and_publish(
        self, plan: Plan, wanted: Mapping[DatasetId, int], started: datetime
    ) -> tuple[dict[str, PublishReport], dict[str, str]]:
        advertised = self._advertise(plan, wanted)
        views = {site: a.view for site, a in advertised.items()}
        self.published = Published(
            render_ads(views, self.config.classad, self.published.ads),
            plan.sources,
            started,
            self.published.demand,  # until this cycle's annotation replaces it
            plan.sites,  # the full lists, for the JSON views
            dict(self._origins),
        )
        self.metrics.set_unadvertised(advertised.values())
        return self._publish(views, plan.removed_sites, started)

    def _read_drains(self, now: datetime) -> Sequence[Drain]:
        """The operator's drains, read every cycle (``hydrator drain`` writes them while the
        daemon runs); on a failed read the last good ones (a drain must not lapse because
        the file was busy)."""
        try:
            self._drains = self.store.drains()
        except HydratorError as exc:
            log.warning("cannot read the drains, using the previous ones: %s", exc)
        active = [d for d in self._drains if d.active(now)]
        self.metrics.set_drains((d.site, d.storage or "") for d in active)
        return active

    def drains_changed(self) -> bool:
        """The active drains differ from those the last full read applied (a drain or
        undrain since, or an ``until`` passed): an event cycle would not apply them all
        (a storage drain needs the source's read of its storage). False when they cannot
        be read (the last good ones stand)."""
        try:
            drains = self.store.drains()
        except HydratorError:
            return False
        now = self.clock()
        return frozenset(d for d in drains if d.active(now)) != self._drains_read

    def _note_origins(self, plan: Plan, started: datetime, origin: str) -> None:
        """Where each site's data last came from: a full read sets every site, an event
        cycle the sites whose content it changed (``/v1/sites`` says it)."""
        if origin == "full_read":
            self._origins = {site: (origin, started) for site in plan.sites}
            return
        for site in plan.changed_sites:
            self._origins[site] = (origin, started)
        for site in plan.removed_sites:
            self._origins.pop(site, None)

    def _wanted(self, queue: QueueSnapshot | None) -> Mapping[DatasetId, int] | None:
        """What queued jobs declare; on a failed query the last good answer (a schedd that
        does not answer must not empty demand-driven ads); None if never read."""
        if self.demand is None and (queue is None or not queue.pool):
            return {}
        try:
            if self.demand is not None:
                self._last_wanted = self.demand()
            elif queue is not None:
                self._last_wanted = idle_demand(queue).counts
        except HydratorError as exc:
            log.warning("queue query failed, using the previous demand: %s", exc)
        return self._last_wanted

    def _advertise(self, plan: Plan, wanted: Mapping[DatasetId, int]) -> dict[Site, Advertised]:
        policy, size = self.advertise_policy, self._ad_size
        contents, memo = plan.derived.contents, self._advertised
        demand = dict(wanted)  # a copy the memo keeps, whatever the caller does with its own
        advertised: dict[Site, Advertised] = {}
        for site, view in plan.sites.items():
            known = memo.get(site)
            if known is not None and known.fits(contents[site], view, wanted):
                advertised[site] = known.stamped(view)
                continue
            advertised[site] = advertise(view, wanted, policy, size)
            memo[site] = _AdvertiseMemo(contents[site], view, demand, advertised[site])
        for site in memo.keys() - plan.sites.keys():
            del memo[site]
        self._warn_over_size(advertised)
        return advertised

    def _ad_size(self, view: SiteView) -> int:
        """Bytes of ``view``'s ad as the hook gets it, or a bound on the same side of
        ``max_ad_bytes`` (all :func:`advertise` compares it with): the published body when the
        lists are unchanged; else bounds from the names over the empty ad (each name costs its
        length and two quotes, plus at most a comma; so at least ``MIN_NAME_BYTES``, which
        settles a long list at once); a rendering only between the bounds."""
        old = self.published.ads.get(view.site)
        if old is not None and old.view.digest == view.digest:
            return len(old.body)
        attrs = self.config.classad
        empty = replace(view, available=(), partial=(), replicating=())
        first = itemgetter(0)
        names = chain(view.available, map(first, view.partial), map(first, view.replicating))
        count = len(view.available) + len(view.partial) + len(view.replicating)
        limit = self.advertise_policy.max_ad_bytes
        if MIN_NAME_BYTES * count > limit:  # too many names to fit, whatever their length
            return MIN_NAME_BYTES * count
        # len("scope:name") + 2 quotes per name, summed in C (DatasetId is the tuple)
        text = sum(map(len, map(":".join, names))) + 2 * count
        lower = len(render_cron(empty, attrs).encode("utf-8")) + text
        upper = lower + count
        if upper <= limit:
            return upper
        if lower > limit:
            return lower
        return len(render_cron(view, attrs).encode("utf-8"))

    def _warn_over_size(self, advertised: Mapping[Site, Advertised]) -> None:
        """One warning when a site's ad starts being cut to fit, one line when it fits again."""
        over = frozenset(site for site, a in advertised.items() if a.over_size)
        limit = self.advertise_policy.max_ad_bytes
        for site in sorted(over - self._over_size):
            log.warning(
                "site %s: its ad would exceed [classad] max_ad_bytes = %d; leaving out %d "
                "dataset(s), least demanded first (hydrator_datasets_unadvertised"
                '{reason="over_size"}); /v1/sites still lists them all',
                site,
                limit,
                advertised[site].over_size,
            )
        for site in sorted(self._over_size - over):
            log.info("site %s: its ad fits max_ad_bytes = %d again", site, limit)
        self._over_size = over

    def _fetch_all(self, context: FetchContext) -> dict[str, SourceOutcome]:
        """Every source fetched at once, each awaited up to its ``deadline_s`` (issue 26):
        one past it is failed and the cycle goes on (:mod:`.fetching`)."""
        return self._fetches.fetch_all(self.sources, lambda s: self._fetch(s, context))

    def _deadline_s(self, source: str) -> float:
        """The configured ``deadline_s`` of the source named ``source``."""
        deadlines = {s.name: s.deadline_s for s in self.config.sources}
        return deadlines.get(source, DEFAULT_DEADLINE_S)

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
        self.metrics.source_duration.labels(source.name).observe(time.monotonic() - t0)
        self._record_source_counts(source)
        return outcome

    def _record_source_counts(self, source: Source) -> None:
        """Adapters that count their API requests expose ``calls_last_fetch``: an int, or a
        mapping method -> count (Rucio); those with a per-cycle budget expose
        ``deferred_last_fetch``, the checks left to later cycles, and those that reuse earlier
        answers ``reused_last_fetch``. Optional, so none is part of the Source protocol."""
        deferred = getattr(source, "deferred_last_fetch", None)
        if isinstance(deferred, int):
            self.metrics.source_deferred.labels(source.name).set(deferred)
        reused = getattr(source, "reused_last_fetch", None)
        if isinstance(reused, int):
            self.metrics.source_reused.labels(source.name).set(reused)
        calls = getattr(source, "calls_last_fetch", None)
        if isinstance(calls, int):
            calls = {"request": calls}
        if isinstance(calls, Mapping):
            for method, count in calls.items():
                self.metrics.source_calls.labels(source.name, str(method)).inc(int(count))

    def _publish(
        self, views: Mapping[Site, SiteView], removed: frozenset[Site], now: datetime
    ) -> tuple[dict[str, PublishReport], dict[str, str]]:
        reports: dict[str, PublishReport] = {}
        errors: dict[str, str] = {}
        for publisher in self.publishers:
            try:
                reports[publisher.name] = publisher.publish(views, removed, now)
            except PublishError as exc:
                log.warning("publisher %s failed, retrying next cycle: %s", publisher.name, exc)
                errors[publisher.name] = redact(str(exc))
        return reports, errors

    def _measure_locality(self, plan: Plan, queue: QueueSnapshot | None) -> None:
        """Matchmaking quality from the pool; a pool that cannot be read skips it this cycle."""
        if self.probe is None:
            return
        try:
            if queue is None:  # a probe given without a queue reader reads on its own
                jobs, slots = self.probe.jobs_and_slots()
            else:
                jobs, slots = self.probe.jobs_and_slots(queue)
        except PublishError as exc:
            log.warning("cannot read the pool for matchmaking quality: %s", exc)
            self.metrics.pool_queries.labels("error").inc()
            return
        self.metrics.pool_queries.labels("ok").inc()
        self.metrics.set_locality(locality_report(jobs, slots, plan.sites))

    def _annotate(
        self, plan: Plan, started: datetime, queue: QueueSnapshot | None
    ) -> JobsReport | None:
        """Write where their data is onto idle jobs (after the ads are out: a slow or failing
        schedd never delays them); a failure here is counted and logged, never fails the cycle."""
        if self.annotator is None:
            return None
        try:
            report = self.annotator.run(plan.sites, int(started.timestamp()), queue)
        except Exception:  # a bug in annotation must not cost the cycle its ads
            log.exception("job annotation failed")
            return JobsReport(error="job annotation failed unexpectedly")
        self.published = replace(self.published, demand=report.demand)
        return report

    def _observe(self, report: CycleReport) -> None:
        log_cycle(report)
        record_cycle(self.metrics, report, self.published)

    def close(self) -> None:
        busy = set(self.busy_sources())  # closing under a running fetch could block on it
        closers = [(s.name, s.close) for s in self.sources if s.name not in busy]
        for source in self.sources:  # ... unless its optional ``abandon`` ends it, not blocking
            abandon = getattr(source, "abandon", None)
            if source.name in busy and callable(abandon):
                closers.append((source.name, abandon))
        closers += [(p.name, p.close) for p in self.publishers]
        if self.annotator is not None:
            closers.append(("job annotator", self.annotator.close))
        for name, close in closers:
            try:
                close()
            except Exception:  # closing is best effort at shutdown; say what failed
                log.exception("closing %s failed", name)
        self.store.close()


class _AdvertiseMemo:
    """A site's :func:`advertise` answer, reused while its inputs are the same: the same
    unstamped view object (the core hands on an unchanged site's view as is), the same
    demand, the same storage statuses and reasons (issue 24), and an ``updated`` time of the
    same width in the ad (the size checks see the rendered ad). Everything else
    :func:`advertise` reads is fixed per service (policy, configuration) or follows from the
    view (the held replicas of its site). Saves
    re-rendering over-size ads each cycle to find how much fits."""

    __slots__ = ("advertised", "contents", "stamp_width", "stated", "wanted")

    def __init__(
        self,
        contents: SiteView,
        view: SiteView,
        wanted: dict[DatasetId, int],
        advertised: Advertised,
    ) -> None:
        self.contents = contents  # held, so that an identity test is sound
        self.stamp_width = _stamp_width(view)
        self.wanted = wanted
        self.advertised = advertised
        self.stated = (view.storages, view.unavailable)  # storage and drains (issue 24)

    def fits(self, contents: SiteView, view: SiteView, wanted: Mapping[DatasetId, int]) -> bool:
        return (
            contents is self.contents
            and _stamp_width(view) == self.stamp_width
            and wanted == self.wanted
            and (view.storages, view.unavailable) == self.stated
        )

    def stamped(self, view: SiteView) -> Advertised:
        """The remembered answer for the (equal) ``view`` with its ``updated`` time."""
        known = self.advertised
        return replace(known, view=replace(known.view, updated=view.updated))


def _stamp_width(view: SiteView) -> int:
    """Characters the ``updated`` time takes in an ad (0: none)."""
    return 0 if view.updated is None else len(str(int(view.updated.timestamp())))


def _outcome(plan: Plan, publish_errors: Mapping[str, str]) -> str:
    if publish_errors or any(not s.fresh for s in plan.sources):
        return "degraded"
    return "ok"
