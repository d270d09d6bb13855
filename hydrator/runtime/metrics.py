"""Prometheus metrics, registered on an injected :class:`CollectorRegistry`.

Names follow the Prometheus conventions: ``hydrator_`` prefix, base units, ``_total`` counters.
Labels are bounded: ``source``, ``site``, ``state``, ``kind``, ``outcome``; never a dataset name.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Generic, TypeVar, overload

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from hydrator.core.near import PROBLEM_KINDS

_CYCLE_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
NAMESPACE = "hydrator"
JOB_NAMES = "RequiredDatasets"
"""The ``source`` of ``hydrator_invalid_records_total`` for jobs' dataset names: no source can
be named so (source names are lower case)."""

M = TypeVar("M", Counter, Gauge, Histogram)  # the kind of one declared metric


class _Declared(Generic[M]):
    """A metric declared on :class:`Metrics`: built on each instance's registry by
    ``Metrics.__init__`` (which stores it under the same attribute name, shadowing this
    declaration). Read through an instance, the attribute is typed as the built metric."""

    def __init__(
        self,
        build: Callable[[CollectorRegistry], M],
        preset: Iterable[str],
        labels: Iterable[str] = (),
    ) -> None:
        self._build: Callable[[CollectorRegistry], M] = build
        self._preset = tuple(preset)
        self.labels = tuple(labels)

    def build(self, registry: CollectorRegistry) -> M:
        """The metric registered on ``registry``, with one series per ``preset`` label value
        (so that it is exported at 0 before its first event)."""
        metric = self._build(registry)
        for value in self._preset:
            metric.labels(value)
        return metric

    @overload
    def __get__(self, instance: None, owner: type[object]) -> _Declared[M]: ...

    @overload
    def __get__(self, instance: object, owner: type[object]) -> M: ...

    def __get__(self, instance: object | None, owner: type[object]) -> _Declared[M] | M:
        if instance is None:
            return self
        raise AttributeError(f"{owner.__name__}: metric read before __init__ built it")


def _counter(
    name: str, documentation: str, *labels: str, preset: Iterable[str] = ()
) -> _Declared[Counter]:
    """A counter ``hydrator_<name>_total``; ``preset``: values of its one label shown at 0."""

    def build(registry: CollectorRegistry) -> Counter:
        return Counter(name, documentation, labels, namespace=NAMESPACE, registry=registry)

    return _Declared(build, preset, labels)


def _gauge(name: str, documentation: str, *labels: str) -> _Declared[Gauge]:
    def build(registry: CollectorRegistry) -> Gauge:
        return Gauge(name, documentation, labels, namespace=NAMESPACE, registry=registry)

    return _Declared(build, (), labels)


def _histogram(
    name: str, documentation: str, *labels: str, buckets: Iterable[float]
) -> _Declared[Histogram]:
    """A histogram over ``buckets`` (upper bounds in the metric's unit)."""
    bounds = tuple(buckets)

    def build(registry: CollectorRegistry) -> Histogram:
        return Histogram(
            name, documentation, labels, namespace=NAMESPACE, registry=registry, buckets=bounds
        )

    return _Declared(build, (), labels)


class Metrics:
    """Every metric the daemon exports. Create one per registry.

    Each class attribute below declares one metric (name without the ``hydrator_`` prefix,
    help text, label names); an instance holds the metric itself under that attribute. They are
    registered, and so exported, in the order declared here.
    """

    # ---- cycles
    cycle_duration = _histogram(
        "cycle_duration_seconds",
        "Duration of one cycle, from first fetch to last publish.",
        buckets=_CYCLE_BUCKETS,
    )
    cycles = _counter(
        "cycles",
        "Cycles by outcome (ok, degraded, failed, abandoned).",
        "outcome",
        preset=("ok", "degraded", "failed", "abandoned"),
    )
    last_success = _gauge(
        "last_successful_cycle_timestamp_seconds",
        "Unix time at which the last ok or degraded cycle finished.",
    )
    http_front_restarts = _counter(
        "http_front_restarts", "Times the HTTP server process exited and was restarted."
    )

    # ---- sources
    source_requests = _counter(
        "source_requests",
        "Source fetches by outcome (ok, transient_error, permanent_error, held).",
        "source",
        "outcome",
    )
    source_errors = _counter(
        "source_errors", "Failed source fetches by kind (transient, permanent).", "source", "kind"
    )
    source_duration = _histogram(
        "source_fetch_duration_seconds",
        "Duration of one source fetch.",
        "source",
        buckets=_CYCLE_BUCKETS,
    )
    source_staleness = _gauge(
        "source_staleness_seconds",
        "Seconds since the source's answer was last used (0 when fresh).",
        "source",
    )
    source_stale = _gauge(
        "source_stale",
        "1 while the source's last good snapshot is in use instead of a fresh answer.",
        "source",
    )
    source_last_success = _gauge(
        "source_last_success_timestamp_seconds", "Unix time of the last used answer.", "source"
    )
    source_calls = _counter(
        "source_api_calls",
        "API requests made by sources (retries included), by method.",
        "source",
        "method",
    )
    source_deferred = _gauge(
        "source_deferred_checks",
        "Checks the last fetch left to later cycles because of its per-cycle budget"
        " (DMAPI: known datasets not located again; Rucio: deep checks over the limit).",
        "source",
    )
    source_reused = _gauge(
        "source_reused_checks",
        "Checks the last fetch answered from an earlier one whose inputs still stand, with no"
        " call (Rucio: deep checks younger than deep_check_max_age_s).",
        "source",
    )
    invalid_records = _counter(
        "invalid_records",
        "Records skipped as malformed or with invalid names (a bad record is counted in"
        f" every answer that holds it); source {JOB_NAMES}: the dataset names queued jobs"
        " declare, per pool read for matchmaking quality.",
        "source",
    )
    source_invalid = _gauge(
        "source_invalid_records",
        "Records skipped as malformed or with invalid names in the source's last answer"
        " (unchanged while it fails): alert on its rise, not on its level.",
        "source",
    )
    unmapped = _gauge(
        "unmapped_storage_elements", "Storage elements with no site, ignored.", "source"
    )
    state_rejected_rows = _gauge(
        "state_rejected_rows",
        "Rows of the state database ignored as invalid when it was loaded at start, by table"
        " (never published; --reset-state or a repaired file clears them).",
        "table",
    )

    # ---- content: what the sites hold, what changed, what was published
    datasets = _gauge(
        "datasets",
        "Datasets per site by what is there: available (complete), partial (some files),"
        " replicating (none yet, a transfer active), stuck (none, the transfer stuck).",
        "site",
        "state",
    )
    transfers = _gauge(
        "transfers",
        "Transfers towards each site by state (replicating, stuck), whatever is present.",
        "site",
        "state",
    )
    changes = _counter(
        "changes",
        "(site, dataset) changes by kind (added, removed, changed).",
        "kind",
        preset=("added", "removed", "changed"),
    )
    state_rows_written = _counter(
        "state_rows_written", "Replica rows written to the state database."
    )
    collector_updates = _counter(
        "collector_updates",
        "Collector updates by kind (merge, site_ad, invalidate) and outcome (ok, error).",
        "kind",
        "outcome",
    )
    collector_merges_deferred = _gauge(
        "collector_merges_deferred",
        "Slot merges held back in the last cycle by [collector] merge_budget_bytes_per_s or"
        " merge_min_interval_s: slots whose ads still carry older lists of their site.",
    )
    collector_merges_handed = _gauge(
        "collector_merges_handed",
        "Slot merges the last cycle left to the repair looks, which deliver every slot merge"
        " while the repair watch runs: slots whose ads carried no or older lists of their site.",
    )
    unadvertised = _gauge(
        "datasets_unadvertised",
        "Datasets a site holds that its ad leaves out, by reason (not_demanded, "
        "over_budget, over_size; see [classad] advertise, max_datasets_per_site, "
        "max_ad_bytes).",
        "site",
        "reason",
    )
    classad_size = _gauge("classad_size_bytes", "Size of the site's old-syntax ClassAd.", "site")
    site_held = _gauge(
        "site_held",
        "1 while the site guard holds back a drop of a source's entries at a site ([safety]"
        " site_max_drop_fraction); the count of cycles held is in /v1/sites and the log.",
        "site",
        "source",
    )

    # ---- locality: where data-bound jobs run and wait
    jobs_running = _gauge(
        "jobs_running",
        "Running jobs that declare RequiredDatasets, by whether their slot's "
        "site holds all of them (local), is near a site that does (near) or neither (remote).",
        "locality",
    )
    jobs_running_by_site = _gauge(
        "site_jobs_running", "Running data-bound jobs per site and locality.", "site", "locality"
    )
    local_ratio = _gauge(
        "jobs_running_data_local_ratio",
        "Share of running data-bound jobs whose site holds all their datasets (NaN when none run).",
    )
    jobs_idle = _gauge(
        "jobs_idle_data_bound",
        "Idle data-bound jobs by the best any site offers: "
        "missed_locality, waiting_local, partial_only, replicating_only, nowhere.",
        "reason",
    )
    unclaimed_with_data = _gauge(
        "sites_unclaimed_slots_with_data",
        "Unclaimed slots at a site that holds all the datasets of at least one idle job.",
        "site",
    )
    pool_queries = _counter(
        "pool_queries", "Pool reads for matchmaking quality by outcome (ok, error).", "outcome"
    )

    # ---- jobs: the annotator
    job_edits = _counter(
        "job_edits",
        "Job groups (one distinct RequiredDatasets value on one schedd) whose annotation"
        " was written (outcome ok) or refused/failed (error).",
        "outcome",
        preset=("ok", "error"),
    )
    job_edit_calls = _counter(
        "job_edit_calls",
        "Schedd.edit calls made by the job annotator (one per changed attribute of a group).",
    )
    jobs_edited = _counter("jobs_edited", "Jobs whose annotation was written.")
    jobs_seen = _gauge(
        "jobs_seen",
        "Idle data-bound jobs the annotator read in the last cycle, from the schedds that"
        " answered.",
    )
    job_edits_deferred = _gauge(
        "job_edits_deferred",
        "Job groups left for a later cycle by [jobs] max_edits_per_cycle in the last cycle.",
    )
    job_schedd_failures = _counter(
        "job_schedd_failures",
        "Schedds the annotator could not read (unavailable) or that refused an edit (refused),"
        " per cycle.",
        "reason",
        preset=("unavailable", "refused"),
    )
    jobs_at_site = _gauge(
        "jobs_idle_data_bound_at_site",
        "Idle data-bound jobs that could run data-local at a site: every dataset complete"
        " there (complete) or at least partly there or incoming (partial).",
        "site",
        "locality",
    )
    jobs_data_nowhere = _gauge(
        "jobs_idle_data_nowhere", "Idle data-bound jobs whose data no site holds, even partly."
    )

    # ---- storage: what can serve
    storage_available = _gauge(
        "storage_available",
        "1 when the storage element (RSE, storage area) can serve its site's replicas, 0 when"
        " its catalogue, a downtime or an operator drain says it cannot (what it holds is then"
        " left out of the site's ad).",
        "site",
        "storage",
    )
    storage_unavailable_wanted = _gauge(
        "storage_unavailable_wanted_datasets",
        "Datasets held at an unavailable storage element that queued jobs declare in"
        " RequiredDatasets (0 while it is available).",
        "site",
        "storage",
    )
    drains = _gauge(
        "drains",
        'Operator drains in effect (hydrator drain): 1 per drained site (storage "") and per'
        " drained storage element.",
        "site",
        "storage",
    )
    # ---- the Rucio event stream (docs/events.md); type: a known event type or "other"
    events_received = _counter(
        "events_received", "Messages received from the broker, by event type.", "source", "type"
    )
    events_applied = _counter(
        "events_applied",
        "Messages whose datasets were queued for an event cycle's re-read (or, with no"
        " dataset to name, marked for the next full read), by event type.",
        "source",
        "type",
    )
    events_ignored = _counter(
        "events_ignored",
        "Messages dropped, by event type and reason (too_large, not_utf8, not_json,"
        " malformed, bad_time, invalid_name, irrelevant, duplicate, out_of_date,"
        " out_of_scope).",
        "source",
        "type",
        "reason",
    )
    event_lag = _histogram(
        "event_lag_seconds",
        "From a message's created_at (the catalogue's change) to the publish of the event"
        " cycle that re-read its dataset.",
        "source",
        buckets=(0.5, 1, 2, 3, 5, 10, 20, 30, 60, 120, 300, 900),
    )
    events_connected = _gauge(
        "events_listener_connected", "1 while the event listener is subscribed.", "source"
    )
    events_disconnected_since = _gauge(
        "events_listener_disconnected_since_timestamp_seconds",
        "Unix time since when the listener has not been subscribed (0 while subscribed).",
        "source",
    )
    events_last_message = _gauge(
        "events_last_message_timestamp_seconds",
        "Unix time of the last message received.",
        "source",
    )
    event_reads = _counter(
        "event_reads", "Datasets re-read by event cycles (one exact read each).", "source"
    )
    event_reads_saved = _counter(
        "event_reads_saved",
        "API requests the event stream saved: per event cycle, the requests of the last"
        " full read less the datasets the event cycle re-read.",
        "source",
    )
    event_cycles = _counter(
        "event_cycles", "Event cycles by outcome (ok, degraded, failed).", "source", "outcome"
    )
    full_reads_skipped = _counter(
        "full_reads_skipped",
        "Scheduled full reads skipped because events flow (reconciliation not due).",
    )
    cycle_phase = _histogram(
        "cycle_phase_seconds",
        "Wall seconds of each phase of a cycle (queue, fetch, plan, save, advertise, render,"
        " publish, jobs, gc, other): where the cycle's time goes (hydrator.runtime.phases).",
        "phase",
        buckets=_CYCLE_BUCKETS,
    )
    queue_reads = _counter(
        "queue_reads",
        "Cycles' takes of the schedds' queues: read (one query per schedd), reused (an event"
        " cycle within [collector] queue_max_age_s: no query), failed (the collector or every"
        " schedd asked failed; reused as such within the age).",
        "outcome",
        preset=("read", "reused", "failed"),
    )
    refresh_cycles = _counter(
        "refresh_cycles",
        "Refresh cycles (a scheduled full read skipped while events flow: storage statuses,"
        " drains, queues and jobs read again, no dataset) by outcome (ok, degraded, failed).",
        "outcome",
    )
    event_hints_covered = _counter(
        "event_hints_covered",
        "Datasets and files held for an event cycle that a full read covered instead (named"
        " before it began, while it was scheduled): dropped, not re-read.",
        "source",
    )
    # ---- supervised threads (hydrator.runtime.supervise)
    thread_alive = _gauge(
        "thread_alive",
        "1 while a supervised thread runs, 0 while it is down (found dead, being restarted).",
        "thread",
    )
    thread_restarts = _counter(
        "thread_restarts", "Restarts of a supervised thread found dead.", "thread"
    )
    near_reads = _counter(
        "near_reads",
        "Reads of the distances between storage elements (near sites, [distances]) by outcome"
        " (ok, failed: the last good near lists are kept).",
        "outcome",
        preset=("ok", "failed"),
    )
    near_problems = _counter(
        "near_problems",
        "Bad distance inputs by kind, each counted once when it appears (negative,"
        " not_a_number, unknown_element, asymmetric, unmapped_site, refused).",
        "kind",
        preset=PROBLEM_KINDS,
    )
    site_remote_readers = _gauge(
        "site_remote_readers",
        "Running data-bound jobs that are not local and whose data is complete at the site:"
        " they read from it remotely (near or far), as the remote-read budget counts them.",
        "site",
    )
    remote_budget = _gauge(
        "remote_budget",
        "[distances] remote_budget: remote readers allowed per site (NaN without [distances]).",
    )

    # ---- slot coverage: which slot ads carry their site's current lists (docs/coverage.md)
    slot_coverage_ratio = _gauge(
        "slot_coverage_ratio",
        "Share of the site's slot ads carrying its current lists at the last look (0..1).",
        "site",
    )
    slot_coverage = _gauge(
        "slot_coverage_slots",
        "The site's slot ads at the last look by state: current (its current lists), bare"
        " (none: wiped by the startd's update, or new), stale (older lists, to repair),"
        " deferred (older lists held back by [collector] merge_budget_bytes_per_s or"
        " merge_min_interval_s).",
        "site",
        "state",
    )
    slots_found_bare = _counter(
        "slots_found_bare",
        "Slot ads found without their site's lists (wiped or new), once per episode.",
        "site",
    )
    slots_found_stale = _counter(
        "slots_found_stale",
        "Slot ads found with older lists of their site (not deferred), once per episode.",
        "site",
    )
    slot_bare_seconds = _histogram(
        "slot_bare_seconds",
        "How long a slot ad went without its site's current lists until a merge repaired it"
        " (from its LastHeardFrom, or the digest's publication; docs/coverage.md).",
        "site",
        buckets=(0.5, 1, 2, 3, 5, 10, 30, 60, 120, 300, 600),
    )
    slot_repairs = _counter(
        "slot_repairs", "Merges the repair watch sent, into slots found bare or stale.", "site"
    )
    slot_repair_bytes = _counter(
        "slot_repair_bytes", "Old-syntax bytes of the repair watch's merges.", "site"
    )
    slot_repair_refused = _counter(
        "slot_repair_refused",
        "Repairs the collector did not keep (the slot still lacked its lists at the next"
        " look, without a startd update since); such a slot is retried with back-off.",
        "site",
    )
    slot_repair_queries = _counter(
        "slot_repair_queries",
        "Repair looks (one collector query each) by outcome (ok, error).",
        "outcome",
        preset=("ok", "error"),
    )
    slot_repair_query_ads = _counter(
        "slot_repair_query_ads", "Slot ads the repair looks' queries returned."
    )
    collector_merge_bytes = _counter(
        "collector_merge_bytes",
        "Old-syntax bytes of the cycles' slot merges (the repair watch's: slot_repair_bytes).",
    )
    slots_without_site = _gauge(
        "slots_without_site",
        "Slot ads without the [collector] slot_site_attribute at the last cycle (never merged).",
    )
    slots_unknown_site = _gauge(
        "slots_unknown_site",
        "Slot ads whose site attribute names no site the hydrator publishes, at the last cycle.",
    )

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self._of_sources: list[tuple[Counter | Gauge | Histogram, tuple[str, ...]]] = []
        for attr, declared in vars(Metrics).items():
            if isinstance(declared, _Declared):
                built = declared.build(registry)
                setattr(self, attr, built)
                if "source" in declared.labels:
                    self._of_sources.append((built, declared.labels))
        self.local_ratio.set(float("nan"))  # unknown until the pool is read, not 0 %
        self.remote_budget.set(float("nan"))

    def forget_source(self, name: str) -> None:
        """Remove every series labelled ``source=name`` (a source a reload removed): no gauge
        of it stays behind to fire an alert, no counter to be summed with a later namesake."""
        for metric, labels in self._of_sources:
            found = {
                tuple(sample.labels[label] for label in labels)
                for family in metric.collect()
                for sample in family.samples
                if sample.labels.get("source") == name
            }
            for values in found:
                metric.remove(*values)
