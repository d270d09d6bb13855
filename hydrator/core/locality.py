"""Matchmaking quality: do jobs run where their data is? Pure functions over what the pool
reports (jobs with ``RequiredDatasets``, slots with their site) and the published site views.

Definitions (per cycle):

* A running data-bound job is **local** when its slot's site holds all of its datasets
  completely (``AvailableDatasets``); else **near** when its slot's site is near (docs/near.md)
  a site that does; else **remote**. The data-local ratio is local / running. A job that is
  not local reads from the sites holding its data: each counts it as a **remote reader**
  (as the negotiator's remote-read budget does).
* An idle data-bound job is classified by the best any site offers:
  ``missed_locality``  some site holds all its datasets and has unclaimed slots (the job
                       could run next to its data now; look at its requirements/rank);
  ``waiting_local``    some site holds all its datasets, but every slot there is claimed;
  ``partial_only``     no site holds all completely, some holds all at least partially;
  ``replicating_only`` the best is a site where the rest is still being replicated;
  ``nowhere``          no site holds or receives all of them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from hydrator.domain import DatasetId, Site, SiteView

IDLE_REASONS = ("missed_locality", "waiting_local", "partial_only", "replicating_only", "nowhere")


@dataclass(frozen=True)
class PoolJob:
    """A queued job that declares ``RequiredDatasets``; ``site`` is its slot's site if running."""

    required: frozenset[DatasetId]
    running: bool
    site: Site | None = None


@dataclass(frozen=True)
class PoolSlot:
    site: Site
    unclaimed: bool


@dataclass(frozen=True)
class LocalityReport:
    running_local: int = 0
    running_remote: int = 0
    idle: Mapping[str, int] = field(default_factory=dict)  # reason -> jobs
    running_by_site: Mapping[tuple[Site, str], int] = field(default_factory=dict)
    missed_by_site: Mapping[Site, int] = field(default_factory=dict)  # idle jobs a site could take
    unclaimed_by_site: Mapping[Site, int] = field(default_factory=dict)  # unclaimed slots
    running_near: int = 0
    remote_readers: Mapping[Site, int] = field(default_factory=dict)  # data site -> jobs

    @property
    def local_ratio(self) -> float | None:
        """Share of running data-bound jobs on a site holding all their data; None if none run."""
        running = self.running_local + self.running_remote + self.running_near
        return self.running_local / running if running else None


@dataclass(frozen=True)
class SiteSets:
    """What one site holds: complete; at least partly; at least partly or being replicated there."""

    available: frozenset[DatasetId]
    partial_or_better: frozenset[DatasetId]
    present_or_replicating: frozenset[DatasetId]


def site_sets(views: Mapping[Site, SiteView]) -> dict[Site, SiteSets]:
    out = {}
    for site, v in views.items():
        available = frozenset(v.available)
        partial = available | {d for d, _ in v.partial}
        out[site] = SiteSets(available, partial, partial | {d for d, _ in v.replicating})
    return out


def locality_report(
    jobs: Iterable[PoolJob],
    slots: Iterable[PoolSlot],
    views: Mapping[Site, SiteView],
    near: Mapping[Site, tuple[Site, ...]] | None = None,
) -> LocalityReport:
    """The report of the module docstring; ``near``: each site's near sites (none: no job is
    near)."""
    sets = site_sets(views)
    unclaimed = Counter(s.site for s in slots if s.unclaimed)
    free_sites = set(unclaimed)
    idle: Counter[str] = Counter({reason: 0 for reason in IDLE_REASONS})
    running: Counter[tuple[Site, str]] = Counter()
    missed: Counter[Site] = Counter()
    readers: Counter[Site] = Counter()
    kinds: Counter[str] = Counter()
    for job in jobs:
        if job.running:
            site = job.site
            if site is not None and site in sets and job.required <= sets[site].available:
                kind = "local"
            else:  # where the data it reads is: its remote sources
                sources = [s for s, h in sets.items() if job.required <= h.available]
                readers.update(sources)
                kind = _far_kind(site, sources, near or {})
            kinds[kind] += 1
            if site is not None:
                running[(site, kind)] += 1
            continue
        complete = [s for s, h in sets.items() if job.required <= h.available]
        free = [s for s in complete if s in free_sites]
        missed.update(free)
        idle[_idle_reason(job.required, sets, complete, free)] += 1
    return LocalityReport(
        kinds["local"],
        kinds["remote"],
        dict(idle),
        dict(running),
        dict(missed),
        dict(unclaimed),
        kinds["near"],
        dict(readers),
    )


def _far_kind(site: Site | None, sources: list[Site], near: Mapping[Site, tuple[Site, ...]]) -> str:
    """``near`` when a job not local at ``site`` reads from a site near it, else ``remote``."""
    if site is not None and any(s in sources for s in near.get(site, ())):
        return "near"
    return "remote"


def _idle_reason(
    required: frozenset[DatasetId],
    sets: Mapping[Site, SiteSets],
    complete: list[Site],
    free: list[Site],
) -> str:
    if free:
        return "missed_locality"
    if complete:
        return "waiting_local"
    if any(required <= h.partial_or_better for h in sets.values()):
        return "partial_only"
    if any(required <= h.present_or_replicating for h in sets.values()):
        return "replicating_only"
    return "nowhere"
