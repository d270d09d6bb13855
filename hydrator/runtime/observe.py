"""The observer: every update of the metric objects.

The cycle's report (:func:`record_cycle`), the event worker's (:class:`EventCycleRecord`,
:func:`record_message`, :func:`record_listener`), the repair watch's (:func:`record_repair`),
the supervisor's (:func:`record_thread`) and the other runtime parts' values become metric
updates here and nowhere else: the rest of the daemon passes the :class:`Metrics` object
along and reports what happened. Whatever must reach ``/metrics`` at once (the listener's
connected gauge) is recorded at that moment, not per cycle. The declarations are
:mod:`hydrator.runtime.metrics`; the cycle's log line is :func:`hydrator.runtime.outcome.log_cycle`.
"""

from __future__ import annotations

import contextlib
from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from hydrator.core.plan import SourceStatus
from hydrator.core.ports import (
    CountsCalls,
    CountsReadCalls,
    DefersChecks,
    ReusesAnswers,
    Source,
)
from hydrator.domain import DatasetId, ReplicaState, Site, SiteView, Transfer
from hydrator.runtime.metrics import JOB_NAMES

if TYPE_CHECKING:
    from hydrator.core.advertise import Advertised
    from hydrator.core.jobs import JobsReport
    from hydrator.core.locality import LocalityReport
    from hydrator.core.near import Problem
    from hydrator.core.slot_coverage import RepairReport, SiteCoverage
    from hydrator.core.storage import Drain
    from hydrator.runtime.metrics import Metrics
    from hydrator.runtime.outcome import CycleReport, Published


def record_cycle(metrics: Metrics, report: CycleReport, published: Published) -> None:
    """Update the metrics from a cycle; times are as of the cycle's start."""
    now = report.started
    metrics.cycles.labels(report.outcome).inc()
    for name, taken in report.phases.items():
        metrics.cycle_phase.labels(name).observe(taken.wall_s)
    if report.outcome in ("abandoned", "failed") or report.plan is None:
        return
    metrics.cycle_duration.observe(report.duration_s)
    metrics.last_success.set(now.timestamp() + report.duration_s)
    metrics.state_rows_written.inc(report.rows_written)
    for change_kind, count in report.plan.changes.counts.items():
        metrics.changes.labels(change_kind.value).inc(count)  # one call per kind, not per change
    metrics.site_held.clear()
    for status in report.plan.sources:
        _record_source(metrics, status, now)
        for site in status.held_sites:
            metrics.site_held.labels(site, status.name).set(1)
    metrics.collector_merges_deferred.set(sum(r.deferred for r in report.published.values()))
    metrics.collector_merges_handed.set(sum(r.handed for r in report.published.values()))
    for reported in report.published.values():
        for kind, count in reported.sent.items():
            metrics.collector_updates.labels(kind, "ok").inc(count)
        for kind, count in reported.failed.items():
            metrics.collector_updates.labels(kind, "error").inc(count)
    if report.jobs is not None:
        record_jobs(metrics, report.jobs)
    sizes = {site: len(ad.body) for site, ad in published.ads.items()}
    record_sites(metrics, report.plan.sites.values(), sizes)  # counts: the truth, not the ads


def _record_source(metrics: Metrics, status: SourceStatus, now: datetime) -> None:
    name = status.name
    metrics.source_requests.labels(name, status.outcome).inc()
    if status.outcome.endswith("_error"):
        metrics.source_errors.labels(name, status.outcome.removesuffix("_error")).inc()
    metrics.invalid_records.labels(name).inc(status.invalid)
    if status.outcome in ("ok", "held"):  # it answered: its invalid records are known
        metrics.source_invalid.labels(name).set(status.invalid)
    metrics.unmapped.labels(name).set(status.unmapped_count)
    metrics.source_stale.labels(name).set(0 if status.fresh else 1)
    if status.last_success is not None:
        metrics.source_last_success.labels(name).set(status.last_success.timestamp())
        staleness = 0.0 if status.fresh else (now - status.last_success).total_seconds()
        metrics.source_staleness.labels(name).set(staleness)


def record_jobs(metrics: Metrics, report: JobsReport) -> None:
    """Count one annotation cycle and replace the per-site demand gauges."""
    metrics.job_edits.labels("ok").inc(report.edits)
    metrics.job_edits.labels("error").inc(len(report.refused_schedds))
    metrics.job_edit_calls.inc(report.edit_calls)
    metrics.jobs_edited.inc(report.jobs_edited)
    metrics.jobs_seen.set(report.seen)
    metrics.job_edits_deferred.set(report.deferred)
    refused = len(report.refused_schedds)
    metrics.job_schedd_failures.labels("refused").inc(refused)
    metrics.job_schedd_failures.labels("unavailable").inc(len(report.failed_schedds) - refused)
    demand = report.demand
    metrics.jobs_at_site.clear()
    for locality, counts in (("complete", demand.complete), ("partial", demand.partial)):
        for site, count in counts.items():
            metrics.jobs_at_site.labels(site, locality).set(count)
    metrics.jobs_data_nowhere.set(demand.nowhere)


def record_locality(metrics: Metrics, report: LocalityReport) -> None:
    """Replace the matchmaking-quality gauges with this cycle's report."""
    metrics.jobs_running.labels("local").set(report.running_local)
    metrics.jobs_running.labels("remote").set(report.running_remote)
    metrics.jobs_running.labels("near").set(report.running_near)
    metrics.site_remote_readers.clear()
    for site, count in report.remote_readers.items():
        metrics.site_remote_readers.labels(site).set(count)
    ratio = report.local_ratio
    metrics.local_ratio.set(float("nan") if ratio is None else ratio)
    for reason, count in report.idle.items():
        metrics.jobs_idle.labels(reason).set(count)
    metrics.jobs_running_by_site.clear()
    for (site, locality), count in report.running_by_site.items():
        metrics.jobs_running_by_site.labels(site, locality).set(count)
    metrics.unclaimed_with_data.clear()
    for site in report.missed_by_site:
        metrics.unclaimed_with_data.labels(site).set(report.unclaimed_by_site.get(site, 0))


def record_pool_read(metrics: Metrics, invalid: int | None) -> None:
    """One read of the pool for matchmaking quality: ``invalid`` job dataset names it found,
    None when the read failed."""
    if invalid is None:
        metrics.pool_queries.labels("error").inc()
        return
    metrics.pool_queries.labels("ok").inc()
    metrics.invalid_records.labels(JOB_NAMES).inc(invalid)


def record_unadvertised(metrics: Metrics, advertised: Iterable[Advertised]) -> None:
    metrics.unadvertised.clear()
    for a in advertised:
        metrics.unadvertised.labels(a.view.site, "not_demanded").set(a.not_demanded)
        metrics.unadvertised.labels(a.view.site, "over_budget").set(a.over_budget)
        metrics.unadvertised.labels(a.view.site, "over_size").set(a.over_size)


def record_sites(metrics: Metrics, views: Iterable[SiteView], sizes: Mapping[Site, int]) -> None:
    """Replace the per-site gauges (sites that went away lose their series)."""
    views = tuple(views)
    metrics.datasets.clear()
    metrics.transfers.clear()
    metrics.classad_size.clear()
    for view in views:
        counts = {
            ReplicaState.AVAILABLE: len(view.available),
            ReplicaState.PARTIAL: len(view.partial),
            ReplicaState.REPLICATING: len(view.replicating),
            ReplicaState.STUCK: len(view.stuck) - _present(view, view.stuck),
        }
        for state, count in counts.items():
            metrics.datasets.labels(view.site, state.value).set(count)
        moving = len(view.replicating) + len(view.incoming)
        metrics.transfers.labels(view.site, Transfer.REPLICATING.value).set(moving)
        metrics.transfers.labels(view.site, Transfer.STUCK.value).set(len(view.stuck))
        metrics.classad_size.labels(view.site).set(sizes.get(view.site, 0))
    record_storage(metrics, views)


def record_storage(metrics: Metrics, views: Iterable[SiteView]) -> None:
    """Replace the per-storage gauges from the sites' views (gone elements lose theirs)."""
    metrics.storage_available.clear()
    metrics.storage_unavailable_wanted.clear()
    for view in views:
        for status in view.storages:
            metrics.storage_available.labels(view.site, status.storage).set(status.available)
            wanted = 0 if status.available else status.wanted
            metrics.storage_unavailable_wanted.labels(view.site, status.storage).set(wanted)


def record_drains(metrics: Metrics, active: Iterable[Drain]) -> None:
    """One series per drain in effect, ``(site, storage or "")``."""
    metrics.drains.clear()
    for drain in active:
        metrics.drains.labels(drain.site, drain.storage or "").set(1)


def _present(view: SiteView, datasets: Iterable[DatasetId]) -> int:
    """How many of ``datasets`` the view lists as available or partial (binary searches in
    its sorted lists: the cost grows with ``datasets``, not with the site's size)."""
    found = 0
    for d in datasets:
        wanted = (d.scope, d.name)
        at = bisect_left(view.available, wanted, key=_by_id)
        if at < len(view.available) and view.available[at] == d:
            found += 1
            continue
        at = bisect_left(view.partial, wanted, key=_by_pair)
        found += at < len(view.partial) and view.partial[at][0] == d
    return found


def _by_id(d: DatasetId) -> tuple[str, str]:
    return (d.scope, d.name)


def _by_pair(pair: tuple[DatasetId, float]) -> tuple[str, str]:
    return (pair[0].scope, pair[0].name)


# ---- sources


@dataclass(frozen=True, slots=True)
class FetchRecord:
    """What one source's fetch or read told: ``duration_s`` (None: not timed), requests by
    method, and the optional counts of :mod:`hydrator.core.ports` (None: not known)."""

    source: str
    duration_s: float | None = None
    calls: Mapping[str, int] | None = None
    deferred: int | None = None
    reused: int | None = None


def fetch_record(source: Source, duration_s: float) -> FetchRecord:
    """What ``source`` knows after a fetch that took ``duration_s``: its requests
    (:func:`calls_of`) and the counts of the optional capabilities it has
    (:class:`~hydrator.core.ports.DefersChecks`, :class:`~hydrator.core.ports.ReusesAnswers`)."""
    return FetchRecord(
        source.name,
        duration_s,
        calls_of(source),
        source.deferred_last_fetch if isinstance(source, DefersChecks) else None,
        source.reused_last_fetch if isinstance(source, ReusesAnswers) else None,
    )


def calls_of(source: object, read: bool = False) -> dict[str, int] | None:
    """The requests of ``source``'s last fetch (:class:`~hydrator.core.ports.CountsCalls`)
    or, with ``read``, of its last targeted read (:class:`~hydrator.core.ports.CountsReadCalls`)
    by method; None when the source does not count them. With :func:`fetch_record`, the one
    place that reads a source's optional capabilities."""
    if read:
        counted = source.calls_last_read if isinstance(source, CountsReadCalls) else None
    else:
        counted = source.calls_last_fetch if isinstance(source, CountsCalls) else None
    if counted is None:
        return None
    return {str(method): int(count) for method, count in counted.items()}


def record_read_calls(metrics: Metrics, name: str, source: object) -> None:
    """The requests of ``source``'s last targeted read into ``hydrator_source_calls_total``,
    as a full read's are (failed reads' too)."""
    calls = calls_of(source, read=True)
    if calls is not None:
        record_fetch(metrics, FetchRecord(name, calls=calls))


def record_fetch(metrics: Metrics, record: FetchRecord) -> None:
    name = record.source
    if record.duration_s is not None:
        metrics.source_duration.labels(name).observe(record.duration_s)
    if record.deferred is not None:
        metrics.source_deferred.labels(name).set(record.deferred)
    if record.reused is not None:
        metrics.source_reused.labels(name).set(record.reused)
    for method, count in (record.calls or {}).items():
        metrics.source_calls.labels(name, method).inc(count)


def record_rejected_rows(metrics: Metrics, rejected: Mapping[str, int]) -> None:
    """The saved state's rows refused at load, by table."""
    for table, count in rejected.items():
        metrics.state_rejected_rows.labels(table).set(count)


def record_sources_removed(metrics: Metrics, removed: Iterable[str]) -> None:
    """Sources a reload removed: every series labelled with one of them goes (no gauge stays
    behind to fire an alert, no counter to be summed with a later namesake)."""
    for name in removed:
        metrics.forget_source(name)


def record_remote_budget(metrics: Metrics, budget: float) -> None:
    metrics.remote_budget.set(budget)


def record_near_read(metrics: Metrics, ok: bool) -> None:
    metrics.near_reads.labels("ok" if ok else "failed").inc()


def record_near_problem(metrics: Metrics, problem: Problem) -> None:
    metrics.near_problems.labels(problem.kind).inc()


def record_queue_read(metrics: Metrics, outcome: str) -> None:
    metrics.queue_reads.labels(outcome).inc()


# ---- events


def record_listener(metrics: Metrics, source: str, connected: bool, now: float) -> None:
    """The listener's state, at once (served before the next cycle); ``now``: Unix time."""
    metrics.events_connected.labels(source).set(1 if connected else 0)
    metrics.events_disconnected_since.labels(source).set(0 if connected else now)


def forget_listener(metrics: Metrics, source: str) -> None:
    """The listener's series go (it was stopped on purpose: a reload)."""
    for gauge in (metrics.events_connected, metrics.events_disconnected_since):
        with contextlib.suppress(KeyError):
            gauge.remove(source)


def record_message(
    metrics: Metrics, source: str, label: str, ignored: str | None, now: float
) -> None:
    """One message received at ``now`` (Unix time): applied, or ignored for the reason
    ``ignored``."""
    metrics.events_received.labels(source, label).inc()
    metrics.events_last_message.labels(source).set(now)
    if ignored is None:
        metrics.events_applied.labels(source, label).inc()
    else:
        metrics.events_ignored.labels(source, label, ignored).inc()


@dataclass(frozen=True, slots=True)
class EventCycleRecord:
    """What one event cycle did: its ``outcome``; when it published, the datasets it
    re-read, the requests it saved against a full read, and each change's lag (seconds)."""

    source: str
    outcome: str
    reads: int = 0
    saved: int = 0
    lags_s: Sequence[float] = ()


def record_event_cycle(metrics: Metrics, record: EventCycleRecord) -> None:
    source = record.source
    metrics.event_cycles.labels(source, record.outcome).inc()
    if record.outcome in ("ok", "degraded"):
        metrics.event_reads.labels(source).inc(record.reads)
        metrics.event_reads_saved.labels(source).inc(record.saved)
        for lag in record.lags_s:
            metrics.event_lag.labels(source).observe(lag)


def record_hints_covered(metrics: Metrics, source: str, covered: int) -> None:
    """Hints a successful full read covered (dropped unread)."""
    metrics.event_hints_covered.labels(source).inc(covered)


def record_full_read_skipped(metrics: Metrics) -> None:
    metrics.full_reads_skipped.inc()


def record_refresh_cycle(metrics: Metrics, outcome: str) -> None:
    metrics.refresh_cycles.labels(outcome).inc()


# ---- the repair watch


def record_repair_failed(metrics: Metrics) -> None:
    metrics.slot_repair_queries.labels("error").inc()


def record_repair(metrics: Metrics, report: RepairReport) -> None:
    """One repair look's counts (its coverage: :func:`record_coverage`)."""
    if report.cycle_merge_bytes:
        metrics.collector_merge_bytes.inc(report.cycle_merge_bytes)
    if not report.looked:
        return
    plan = report.plan
    metrics.slot_repair_queries.labels("ok").inc()
    metrics.slot_repair_query_ads.inc(report.returned)
    for site, n in plan.found_bare.items():
        metrics.slots_found_bare.labels(site).inc(n)
    for site, n in plan.found_stale.items():
        metrics.slots_found_stale.labels(site).inc(n)
    for site, n in plan.refused.items():
        metrics.slot_repair_refused.labels(site).inc(n)
    for site, n in report.merged.items():
        metrics.slot_repairs.labels(site).inc(n)
        metrics.slot_repair_bytes.labels(site).inc(report.merge_bytes.get(site, 0))
    for site, delays in report.delays_s.items():
        for delay in delays:
            metrics.slot_bare_seconds.labels(site).observe(delay)
    metrics.slots_without_site.set(report.without_site)
    metrics.slots_unknown_site.set(report.unknown_site)


_COVERAGE_STATES = ("current", "bare", "stale", "deferred")


def record_coverage(
    metrics: Metrics, coverage: Mapping[Site, SiteCoverage], gone: Iterable[Site]
) -> None:
    """Replace the per-site coverage gauges; the ``gone`` sites' series are removed."""
    for site in gone:
        metrics.slot_coverage_ratio.remove(site)
        for state in _COVERAGE_STATES:
            metrics.slot_coverage.remove(site, state)
    for site, c in coverage.items():
        metrics.slot_coverage_ratio.labels(site).set(c.ratio)
        for state, n in zip(
            _COVERAGE_STATES, (c.current, c.bare, c.stale, c.deferred), strict=True
        ):
            metrics.slot_coverage.labels(site, state).set(n)


# ---- the supervisor and the HTTP front


def record_thread(metrics: Metrics, name: str, alive: bool) -> None:
    """A supervised thread's state, as the supervisor last saw it."""
    metrics.thread_alive.labels(name).set(1 if alive else 0)


def record_thread_restart(metrics: Metrics, name: str) -> None:
    metrics.thread_restarts.labels(name).inc()


def forget_thread(metrics: Metrics, name: str) -> None:
    for metric in (metrics.thread_alive, metrics.thread_restarts):
        with contextlib.suppress(KeyError):
            metric.remove(name)


def record_http_front_restart(metrics: Metrics) -> None:
    metrics.http_front_restarts.inc()
