"""Logging and metrics for cycles: one log line per cycle, metrics updated from the report.

The log handlers and formatters are :mod:`hydrator.logs`.
"""

from __future__ import annotations

import logging
from datetime import datetime
from itertools import chain
from typing import TYPE_CHECKING, Any

from hydrator.core.plan import SourceStatus
from hydrator.domain import ChangeKind

if TYPE_CHECKING:
    from hydrator.runtime.metrics import Metrics
    from hydrator.runtime.outcome import CycleReport, Published

log = logging.getLogger("hydrator.cycle")


def cycle_fields(report: CycleReport) -> dict[str, Any]:
    """The counts of one cycle, as logged and as ``once --json`` summarises them."""
    fields: dict[str, Any] = {"outcome": report.outcome, "duration_s": round(report.duration_s, 3)}
    plan = report.plan
    if plan is not None:
        kinds = plan.changes.counts  # counted by the core: a first cycle's are not built
        fields.update(
            sources=len(plan.sources),
            fresh=sum(1 for s in plan.sources if s.fresh),
            stale=sorted(s.name for s in plan.sources if not s.fresh),
            sites=len(plan.sites),
            entries=plan.derived.entries,
            added=kinds.get(ChangeKind.ADDED, 0),
            removed=kinds.get(ChangeKind.REMOVED, 0),
            changed=kinds.get(ChangeKind.CHANGED, 0),
            invalid=sum(s.invalid for s in plan.sources),
            rows_written=report.rows_written,
        )
    if report.queue is not None:
        fields["queue"] = report.queue.value  # read, reused or failed
    if report.jobs is not None:
        fields.update(jobs_seen=report.jobs.seen, job_edits=report.jobs.edits)
        if report.jobs.failed_schedds:
            fields["failed_schedds"] = list(report.jobs.failed_schedds)
    if report.publish_errors:
        fields["publish_errors"] = sorted(report.publish_errors)
    if report.error:
        fields["error"] = report.error
    return fields


def log_cycle(report: CycleReport) -> None:
    fields = cycle_fields(report)
    text = " ".join(f"{k}={_fmt(v)}" for k, v in fields.items() if k != "outcome")
    level = logging.INFO if report.outcome == "ok" else logging.WARNING
    log.log(level, "cycle %s %s", report.outcome, text, extra={"fields": fields})
    if report.phases and log.isEnabledFor(logging.DEBUG):
        seconds = {name: round(t.wall_s, 3) for name, t in report.phases.items()}
        text = " ".join(f"{name}={s}" for name, s in seconds.items())
        log.debug("cycle phases %s", text, extra={"fields": {"phases_s": seconds}})
    for status in report.plan.sources if report.plan else ():
        for site, reason in chain(status.held_sites.items(), status.refused_sites.items()):
            log.warning("%s", reason, extra={"fields": {"site": site, "source": status.name}})


def _fmt(value: Any) -> str:
    if isinstance(value, list):
        return ",".join(str(v) for v in value) or "-"
    return str(value)


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
    for reported in report.published.values():
        for kind, count in reported.sent.items():
            metrics.collector_updates.labels(kind, "ok").inc(count)
        for kind, count in reported.failed.items():
            metrics.collector_updates.labels(kind, "error").inc(count)
    if report.jobs is not None:
        metrics.set_jobs(report.jobs)
    sizes = {site: len(ad.body) for site, ad in published.ads.items()}
    metrics.set_sites(report.plan.sites.values(), sizes)  # counts: the truth, not the ads


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
