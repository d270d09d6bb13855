"""What one cycle produced: the report of the cycle and what the HTTP endpoint serves.

Plain frozen values, built by :mod:`hydrator.runtime.service` and read by
:mod:`~hydrator.runtime.observe` (metrics) and :mod:`~hydrator.runtime.json_views` (JSON).
They live here, not in the service, so that those readers do not import the service.
:func:`render_ads` renders the ads served (``hydrator show`` and the restart's too);
:func:`cycle_fields` is a cycle's counts (its log line, ``once --json``) and :func:`log_cycle`
writes its log line.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from itertools import chain
from typing import Any

from hydrator.core.jobs import JobsReport, SiteDemand
from hydrator.core.near import with_near
from hydrator.core.plan import Plan, SourceStatus
from hydrator.core.ports import PublishReport
from hydrator.core.queue_reuse import QueueRead
from hydrator.core.render import AdAttributes, etag, published_updated, render_cron
from hydrator.domain import ChangeKind, Site, SiteView
from hydrator.runtime.phases import PhaseTime


@dataclass(frozen=True)
class SiteAd:
    """A site's published ClassAd, ready to serve: old-syntax body and its entity tag."""

    view: SiteView
    body: bytes
    etag: str


def render_ads(
    views: Mapping[Site, SiteView],
    attrs: AdAttributes,
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


@dataclass(frozen=True)
class Published:
    """What the HTTP endpoint serves; immutable, replaced whole after each cycle."""

    ads: Mapping[Site, SiteAd] = field(default_factory=dict)
    sources: tuple[SourceStatus, ...] = ()
    generated: datetime | None = None
    demand: SiteDemand | None = None  # idle data-bound jobs per site; None: [jobs] off or unread
    views: Mapping[Site, SiteView] = field(default_factory=dict)
    """Each published site's full lists as held (the ads may be cut to fit or to demand):
    what ``/v1/sites`` and ``/v1/sites/<site>`` list."""
    # per site, where its lists last came from ("full_read", "event", "refresh") and when
    origins: Mapping[Site, tuple[str, datetime]] = field(default_factory=dict)

    def view(self, site: Site) -> SiteView:
        """``site``'s full lists (:attr:`views`) with the near sites its ad carries, else its
        ad's view."""
        full, ad = self.views.get(site), self.ads.get(site)
        if full is None:
            return self.ads[site].view
        return full if ad is None else with_near(full, ad.view.near)


@dataclass(frozen=True)
class CycleReport:
    """The result of one cycle. ``outcome``: ok, degraded (a source stale or a publisher
    failed), failed (nothing saved), abandoned (stopped before saving)."""

    started: datetime
    duration_s: float
    outcome: str
    plan: Plan | None = None
    rows_written: int = 0
    published: Mapping[str, PublishReport] = field(default_factory=dict)
    publish_errors: Mapping[str, str] = field(default_factory=dict)
    error: str | None = None
    jobs: JobsReport | None = None  # None: job annotation off, or not run (dry run)
    phases: Mapping[str, PhaseTime] = field(default_factory=dict)
    """Where the cycle's time went, by phase (:mod:`hydrator.runtime.phases`): ``queue``,
    ``fetch``, ``plan``, ``save``, ``advertise``, ``render``, ``publish``, ``jobs``, ``gc`` (the
    collector's passes) and ``other``, each present only if the cycle reached it; they add up to
    the cycle through its memory clean-up, a little over :attr:`duration_s`."""
    queue: QueueRead | None = None
    """How the cycle got the schedds' queues: read, reused (an event cycle within
    ``[collector] queue_max_age_s``) or failed; None when it took none."""


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
            entries=plan.entries,
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
    """Log the cycle's line (a warning unless ok), its phases at debug level, each held site."""
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
