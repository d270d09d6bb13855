"""JSON documents for the HTTP API and ``hydrator once --json`` (plain dicts at the edge only)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from hydrator.core.jobs import JobsReport
from hydrator.core.near import with_near
from hydrator.core.plan import SourceStatus
from hydrator.core.slot_coverage import SiteCoverage
from hydrator.domain import Change, Site, SiteView, StorageStatus
from hydrator.runtime.outcome import cycle_fields

if TYPE_CHECKING:
    from hydrator.runtime.outcome import CycleReport, Published


def utc_iso(when: datetime | None) -> str | None:
    """A time in a JSON document: ISO 8601 in UTC (``+00:00``), whatever offset it was given
    with; None stays None."""
    return None if when is None else when.astimezone(UTC).isoformat()


def site_json(view: SiteView) -> dict[str, Any]:
    """One site's datasets by presence, and the transfers towards it.

    ``available``, ``partial``, ``replicating`` are the advertised lists (presence first);
    ``fraction``/``bytes_fraction`` are shares of files/bytes present, ``progress`` the
    transfer's share done (0..1). ``stuck`` and ``incoming`` list every stuck and active
    transfer towards the site, whatever is present; a partial entry names its ``transfer``.
    ``storages`` lists the site's storage elements as their catalogues (or the operator) state
    them (:func:`storage_json`), ``unavailable`` the reasons some cannot serve (what the ad's
    ``DataLocalityUnavailable`` says; a drained site lists no dataset). ``near``: the sites it
    reads from cheaply (``[distances]``; null: not known, or ``[distances]`` off).
    """
    stuck, moving = set(view.stuck), {d for d, _ in view.incoming}
    size = dict(view.partial_bytes)
    incoming = sorted((*view.replicating, *view.incoming), key=lambda p: (p[0].scope, p[0].name))
    return {
        "site": view.site,
        "updated": utc_iso(view.updated),
        "digest": view.digest,
        "available": [str(d) for d in view.available],
        "partial": [
            {
                "dataset": str(d),
                "fraction": f,
                "bytes_fraction": size.get(d, f),
                "transfer": "stuck" if d in stuck else "replicating" if d in moving else "none",
            }
            for d, f in view.partial
        ],
        "replicating": [{"dataset": str(d), "progress": f} for d, f in view.replicating],
        "stuck": [str(d) for d in view.stuck],
        "incoming": [{"dataset": str(d), "progress": p} for d, p in incoming],
        "unavailable": list(view.unavailable),
        "storages": [storage_json(s) for s in view.storages],
        "near": _near(view),
    }


def _near(view: SiteView) -> list[str] | None:
    return None if view.near is None else [str(site) for site in view.near]


def storage_json(status: StorageStatus) -> dict[str, Any]:
    """One storage element of a site: whether it can serve, why not, until when (UTC, ISO
    8601, null: unknown or until undone), a future downtime (not applied)."""
    return {
        "storage": status.storage,
        "kind": status.kind,
        "available": status.available,
        "reason": status.reason,
        "until": utc_iso(status.until),
        "upcoming": status.upcoming,
        "wanted_datasets": status.wanted,
    }


def source_json(status: SourceStatus) -> dict[str, Any]:
    """One source's outcome; ``held_sites``/``refused_sites``: site -> why (the site guard,
    names that differ only in case)."""
    return {
        "name": status.name,
        "fresh": status.fresh,
        "entries": status.entries,
        "invalid": status.invalid,
        "unmapped": sorted(status.unmapped),  # bounded by the source (DMAPI: the first N)
        "unmapped_count": status.unmapped_count,
        "reason": status.reason,
        "last_success": utc_iso(status.last_success),
        "held_sites": dict(status.held_sites),
        "refused_sites": dict(status.refused_sites),
    }


def sites_json(
    published: Published, coverage: Mapping[Site, SiteCoverage] | None = None
) -> dict[str, Any]:
    """Every site with its counts, for ``GET /v1/sites``: of everything held, whatever its ad
    leaves out; ``held``: why the site guard holds back a drop there (null: it does not);
    ``coverage``: its slot ads at the repair watch's last look (null: none yet)."""
    sites = []
    held = {site: why for s in published.sources for site, why in s.held_sites.items()}
    for site in published.ads:
        v = published.view(site)
        origin, origin_at = published.origins.get(v.site, (None, None))
        sites.append(
            {
                "site": v.site,
                "available": len(v.available),
                "partial": len(v.partial),
                "replicating": len(v.replicating),
                "stuck": len(v.stuck),
                "incoming": len(v.replicating) + len(v.incoming),
                "digest": v.digest,
                "updated": utc_iso(v.updated),
                "classad": f"/v1/sites/{v.site}/classad",
                "held": held.get(v.site),
                "unavailable": list(v.unavailable),
                "storages": [storage_json(s) for s in v.storages],
                "near": _near(v),  # the sites it reads from cheaply; null: not known
                # "full_read", "event" (an event cycle re-read some of its datasets) or
                # "refresh" (a refresh cycle's storage statuses or drains changed its lists)
                "origin": origin,
                "origin_time": utc_iso(origin_at),
                "coverage": coverage_json((coverage or {}).get(v.site)),
            }
        )
    return {
        "generated": utc_iso(published.generated),
        "sites": sites,
        "sources": [source_json(s) for s in published.sources],
    }


def coverage_json(coverage: SiteCoverage | None) -> dict[str, Any] | None:
    """A site's slot ads by state at the repair watch's last look (docs/coverage.md):
    ``ratio`` is the share carrying the site's current lists."""
    if coverage is None:
        return None
    return {
        "slots": coverage.slots,
        "current": coverage.current,
        "bare": coverage.bare,
        "stale": coverage.stale,
        "deferred": coverage.deferred,
        "ratio": round(coverage.ratio, 4),
    }


def change_json(change: Change) -> dict[str, Any]:
    return {
        "site": change.site,
        "dataset": str(change.dataset),
        "kind": change.kind.value,
        "old": change.old.state.value if change.old else None,
        "new": change.new.state.value if change.new else None,
        "fraction": change.new.fraction if change.new else None,
        "transfer": change.new.transfer.value if change.new else None,
        "progress": change.new.progress if change.new else None,
    }


def cycle_json(
    report: CycleReport, near: Mapping[Site, tuple[Site, ...]] | None = None
) -> dict[str, Any]:
    """``hydrator once --json``: per site the datasets by state (with its ``near`` sites, as
    its ad carries them), and this cycle's changes."""
    plan, near = report.plan, near or {}
    views = {s: with_near(v, near.get(s)) for s, v in plan.sites.items()} if plan else {}
    return {
        "started": utc_iso(report.started),
        "summary": cycle_fields(report),
        "sources": [source_json(s) for s in plan.sources] if plan else [],
        "sites": {site: site_json(view) for site, view in views.items()},
        "changes": [change_json(c) for c in plan.changes] if plan else [],
        "publish_errors": dict(report.publish_errors),
        "jobs": jobs_json(report.jobs) if report.jobs is not None else None,
    }


def jobs_json(report: JobsReport) -> dict[str, Any]:
    """One annotation cycle: ``edits`` are job groups written (one distinct RequiredDatasets
    value on one schedd), ``edit_calls`` the Schedd.edit calls they took (one per attribute)."""
    return {
        "seen": report.seen,
        "edits": report.edits,
        "edit_calls": report.edit_calls,
        "jobs_edited": report.jobs_edited,
        "deferred": report.deferred,
        "failed_schedds": len(report.failed_schedds),
        "failed_schedd_names": list(report.failed_schedds),
        "error": report.error,
    }


def demand_json(published: Published) -> dict[str, Any]:
    """``GET /v1/demand``: per site, the idle data-bound jobs that could run data-local there
    (``complete``: every dataset complete at the site; ``partial``: at least partly there or
    incoming, not all complete; every published site is listed, with zeros), and the jobs
    whose data is nowhere. ``stale_schedds``: schedds that did not answer in the last cycle,
    counted from their last good read. Before the queues were read, or with ``[jobs]
    annotate = false``, ``jobs`` is null. No timestamp: the body (and its ETag) changes only
    when the numbers do."""
    demand = published.demand
    if demand is None:
        return {"jobs": None, "sites": {}, "nowhere": None, "stale_schedds": []}
    sites = sorted(set(published.ads) | set(demand.complete) | set(demand.partial))
    return {
        "jobs": demand.jobs,
        "sites": {
            s: {"complete": demand.complete.get(s, 0), "partial": demand.partial.get(s, 0)}
            for s in sites
        },
        "nowhere": demand.nowhere,
        "stale_schedds": list(demand.schedds_stale),
    }
