"""The collector publisher's repair looks: between cycles, find the slot ads whose merged lists a
startd update wiped (or that never had them) and merge them again (docs/coverage.md).

* **What a look works from**, kept here between cycles by the publisher
  (:class:`~hydrator.adapters.htcondor.collector.CollectorPublisher`): each site's current
  digest and since when it is published (:meth:`SlotRepairs.note_current`), the last cycle's
  census of every slot ad (:meth:`SlotRepairs.take_census`), the slim merges the cycle handed
  over (:meth:`SlotRepairs.hand_refreshes`), the bytes the cycles merged, and the slots a look
  merged, until a later look sees them covered (their back-off).
* **A look** (:meth:`SlotRepairs.look`, for the runtime's repair watch): one query for the
  slot ads of the last published sites that lack their site's current digest, leaving out
  those the per-slot window holds back
  (:func:`hydrator.core.slot_coverage.stale_constraint`), then the publisher's merges into
  exactly those slots, from the last cycle's rendered ads; no catalogue read. Full merges that
  replace a slot's lists wait for the merge budget
  (:func:`~hydrator.core.collector_merges.held_by_budget`); a slot whose earlier repair the
  collector did not keep waits a back-off from the watch's interval up to
  :data:`MAX_REPAIR_BACKOFF_S` (:func:`~hydrator.core.slot_coverage.plan_repairs`).
* **The looks deliver** once the publisher hands its merges to them: what a cycle finds stale
  is merged by the next look under the same budget, window and back-off. Slots that carry the
  current digest and need only a newer updated value are not returned by a look's query: the
  look sends their slim merges from the cycle's list
  (:func:`~hydrator.core.collector_merges.refreshes_due`).

The decisions are pure and live in :mod:`hydrator.core.slot_coverage` and
:mod:`hydrator.core.collector_merges`; the query and the merges are the publisher's (the one
module that speaks to the collector). Not thread-safe: the publisher calls it under its lock.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime

from hydrator.config import CollectorConfig
from hydrator.core.collector_merges import (
    Rendered,
    Target,
    by_site,
    held_by_budget,
    refreshes_due,
)
from hydrator.core.merge_budget import MergeBudget
from hydrator.core.slot_coverage import (
    Current,
    Pending,
    RepairPlan,
    RepairReport,
    SiteCoverage,
    SlotSeen,
    after_look,
    census,
    plan_repairs,
)
from hydrator.domain import Site

MAX_REPAIR_BACKOFF_S = 60.0
"""Longest wait before merging again into a slot whose earlier repair the collector did not
keep (docs/coverage.md)."""

StaleSlots = Callable[[Mapping[Site, Current], float], list[SlotSeen]]
"""The look's query: the slot ads of these sites that lack their current digest, at a time."""
Merge = Callable[[Sequence[Target], Mapping[Site, Rendered], float], tuple[int, int]]
"""The publisher's merge of rendered ads into slots: (ads sent, their bytes)."""


class SlotRepairs:
    """The repair looks of one collector publisher and what they work from (the module doc).
    ``stale_slots`` and ``merge`` are the publisher's; ``budget`` is shared with its cycles."""

    def __init__(
        self,
        config: CollectorConfig,
        budget: MergeBudget,
        stale_slots: StaleSlots,
        merge: Merge,
    ) -> None:
        self.config = config
        self._budget = budget
        self._stale_slots = stale_slots
        self._merge = merge
        self._current: dict[Site, Current] = {}  # each site's digest and since when
        self._pending: dict[str, Pending] = {}  # slots merged by a repair, until seen covered
        self._census: dict[Site, SiteCoverage] = {}  # the last cycle's full look
        self._strays = (0, 0)  # slots without a site attribute, naming no site of ours
        self._cycle_bytes = 0  # bytes the cycles merged since the last repair report
        self._refresh: list[Target] = []  # slim merges the last cycle handed to the next look

    @property
    def current(self) -> Mapping[Site, Current]:
        """Each published site's digest and since when (a merge's reference too)."""
        return self._current

    # -- what a cycle leaves for the looks ----------------------------------------------------

    def note_current(self, rendered: Mapping[Site, Rendered], now_s: float) -> None:
        """Remember each site's digest and since when it is published (a repair look's
        reference; docs/coverage.md)."""
        self._current = {
            site: (
                old
                if (old := self._current.get(site)) is not None and old.digest == want.digest
                else Current(want.digest, now_s)
            )
            for site, want in rendered.items()
        }

    def take_census(
        self, seen: Sequence[SlotSeen], stale: Sequence[Target], todo: Sequence[Target]
    ) -> None:
        """The cycle's full look as coverage per site (the slots it defers counted apart)."""
        merging = {t.name for t in todo}
        deferred: dict[Site, int] = {}
        for target in stale:
            if target.name not in merging:
                deferred[target.site] = deferred.get(target.site, 0) + 1
        self._census, *strays = census(seen, self._current, deferred)
        self._strays = (strays[0], strays[1])

    def hand_refreshes(self, refresh: list[Target]) -> None:
        """The slim merges the cycle handed to the next look (replacing the last cycle's)."""
        self._refresh = refresh

    def count_cycle_bytes(self, merged_bytes: int) -> None:
        """Bytes a cycle merged itself, reported with the next look."""
        self._cycle_bytes += merged_bytes

    # -- a look -------------------------------------------------------------------------------

    def look(
        self, now: datetime, interval_s: float, rendered: Mapping[Site, Rendered]
    ) -> RepairReport:
        """One repair look (docs/coverage.md) from the last publish's ``rendered`` ads: one
        query for the slot ads of our sites that lack their site's current digest (those held
        back by ``merge_min_interval_s`` left out), then the same merges a cycle makes, into
        exactly those slots (a slot whose earlier repair was not kept waits a back-off from
        ``interval_s`` up to :data:`MAX_REPAIR_BACKOFF_S`). Raises
        :class:`~hydrator.errors.PublishError` when the collector cannot be queried or a merge
        cannot be delivered."""
        cycle_bytes, self._cycle_bytes = self._cycle_bytes, 0
        current = dict(self._current)
        if not self.config.merge_slots or not current:
            return RepairReport(cycle_merge_bytes=cycle_bytes)
        now_s = now.timestamp()
        found = self._stale_slots(current, now_s)
        backoff = (interval_s, max(interval_s, MAX_REPAIR_BACKOFF_S))
        held = held_by_budget(found, current, rendered, self._budget, now_s)
        plan = plan_repairs(found, current, self._pending, now_s, backoff, held=held)
        self._pending = dict(plan.pending)
        refresh = refreshes_due(self._refresh, rendered, {s.name for s in found})
        self._refresh = []
        return self._repair(plan, refresh, rendered, now_s, (len(found), cycle_bytes))

    def _repair(
        self,
        plan: RepairPlan,
        refresh: Sequence[Target],
        rendered: Mapping[Site, Rendered],
        now_s: float,
        counts: tuple[int, int],
    ) -> RepairReport:
        """The look's merges: the slots ``plan`` repairs and the slim ``refresh`` merges a
        cycle handed over. ``counts``: slot ads the query returned, bytes the cycles merged
        since the last report."""
        returned, cycle_bytes = counts
        targets = [
            Target(r.slot.name, Site(str(r.slot.site)), r.slot.digest, r.slot.updated)
            for r in plan.merge
        ]
        targets += refresh
        delays: dict[Site, list[float]] = {}
        merged: dict[Site, int] = {}
        sizes: dict[Site, int] = {}
        started = time.monotonic()
        for site, group in by_site(targets).items():
            count, size = self._merge(group, rendered, now_s)
            merged[site], sizes[site] = count, size
        merge_s = time.monotonic() - started
        for repair in plan.merge:
            site = Site(str(repair.slot.site))
            delays.setdefault(site, []).append(max(0.0, now_s - repair.since_s))
        return RepairReport(
            looked=True,
            returned=returned,
            plan=plan,
            merged=merged,
            merge_bytes=sizes,
            delays_s={site: tuple(d) for site, d in delays.items()},
            coverage={
                s: c
                for s, c in after_look(self._census, plan.uncovered, plan.held).items()
                if s in rendered
            },
            without_site=self._strays[0],
            unknown_site=self._strays[1],
            cycle_merge_bytes=cycle_bytes,
            merge_s=merge_s,
        )
