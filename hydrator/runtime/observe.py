"""Logging and metrics for cycles: one log line per cycle, metrics updated from the report."""

from __future__ import annotations

import json
import logging
import sys
from collections import Counter
from datetime import datetime
from typing import TYPE_CHECKING, Any

from hydrator.domain import ChangeKind, SourceStatus
from hydrator.redact import redact

if TYPE_CHECKING:
    from hydrator.runtime.metrics import Metrics
    from hydrator.runtime.service import CycleReport, Published

log = logging.getLogger("hydrator.cycle")


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, and a record's ``fields``.

    Every string in it has passed :func:`~hydrator.redact.redact` (JSON escapes the rest).
    """

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created).astimezone().isoformat(),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            doc.update(fields)
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(_redacted(doc), default=str)


def _redacted(value: Any) -> Any:
    """``value`` with :func:`redact` applied to every string in it (dicts, lists, scalars)."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {redact(str(k)): _redacted(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_redacted(v) for v in value]
    if isinstance(value, int | float | bool) or value is None:
        return value
    return redact(str(value))


class TextFormatter(logging.Formatter):
    """``time level logger: message``, one physical line per record, secrets redacted.

    The whole message (template and every interpolated value) goes through
    :func:`~hydrator.redact.redact`, which escapes control characters: an RSE name or a storage
    area id with a line break cannot forge a log line. A traceback follows on lines indented by
    four spaces, each redacted and escaped too, so no line of it can pass for a record.
    """

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        safe = logging.makeLogRecord(record.__dict__)  # other handlers keep the original
        safe.msg, safe.args = redact(record.getMessage()), None
        safe.exc_info, safe.exc_text, safe.stack_info = None, None, None
        text = super().format(safe)
        blocks = []
        if record.exc_info:
            blocks.append(self.formatException(record.exc_info))
        elif record.exc_text:
            blocks.append(record.exc_text)
        if record.stack_info:
            blocks.append(self.formatStack(record.stack_info))
        for block in blocks:
            text += "".join(f"\n    {redact(line)}" for line in block.splitlines())
        return text


def setup_logging(fmt: str, level: str) -> None:
    """Log to stderr (journald and kubectl logs pick it up) in ``text`` or ``json``.

    The one handler formats through :class:`TextFormatter` or :class:`JsonFormatter`, both of
    which redact secrets and escape control characters; libraries log through it too
    (propagation to the root logger), so none of their lines escapes redaction.
    """
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    logging.getLogger("apscheduler").setLevel(max(logging.WARNING, root.level))
    adopt_library_loggers()


def adopt_library_loggers() -> None:
    """Remove the handlers a library gave its own loggers, so their records propagate to the
    root handler and its redacting formatter. rucio-clients adds a coloured stderr handler to
    its ``baseclient`` logger when imported: :mod:`hydrator.adapters.sources.rucio` calls this after
    importing it."""
    for logger in list(logging.root.manager.loggerDict.values()):
        if isinstance(logger, logging.Logger) and logger.handlers:
            logger.handlers.clear()
            logger.propagate = True


def cycle_fields(report: CycleReport) -> dict[str, Any]:
    """The counts of one cycle, as logged and as ``once --json`` summarises them."""
    fields: dict[str, Any] = {"outcome": report.outcome, "duration_s": round(report.duration_s, 3)}
    plan = report.plan
    if plan is not None:
        kinds = Counter(c.kind.value for c in plan.changes)
        fields.update(
            sources=len(plan.sources),
            fresh=sum(1 for s in plan.sources if s.fresh),
            stale=sorted(s.name for s in plan.sources if not s.fresh),
            sites=len(plan.sites),
            entries=len(plan.state.merged),
            added=kinds[ChangeKind.ADDED.value],
            removed=kinds[ChangeKind.REMOVED.value],
            changed=kinds[ChangeKind.CHANGED.value],
            invalid=sum(s.invalid for s in plan.sources),
            rows_written=report.rows_written,
        )
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


def _fmt(value: Any) -> str:
    if isinstance(value, list):
        return ",".join(str(v) for v in value) or "-"
    return str(value)


def record_cycle(metrics: Metrics, report: CycleReport, published: Published) -> None:
    """Update the metrics from a cycle; times are as of the cycle's start."""
    now = report.started
    metrics.cycles.labels(report.outcome).inc()
    if report.outcome in ("abandoned", "failed") or report.plan is None:
        return
    metrics.cycle_duration.observe(report.duration_s)
    metrics.last_success.set(now.timestamp() + report.duration_s)
    metrics.state_rows_written.inc(report.rows_written)
    for change in report.plan.changes:
        metrics.changes.labels(change.kind.value).inc()
    for status in report.plan.sources:
        _record_source(metrics, status, now)
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
    metrics.unmapped.labels(name).set(len(status.unmapped))
    metrics.source_stale.labels(name).set(0 if status.fresh else 1)
    if status.last_success is not None:
        metrics.source_last_success.labels(name).set(status.last_success.timestamp())
        staleness = 0.0 if status.fresh else (now - status.last_success).total_seconds()
        metrics.source_staleness.labels(name).set(staleness)
