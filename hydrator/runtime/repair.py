"""The repair watch: between cycles, slot ads that lost their site's lists get them back.

Every ``[collector] repair_interval_s`` the scheduler calls :class:`RepairWatch` (a job of
its own, ``max_instances=1``): each publisher with the :class:`~hydrator.core.ports.RepairsSlots`
capability makes one look (one collector query for the uncovered slots of our sites, then
merges into exactly those; docs/coverage.md). Once scheduled (:func:`schedule_repairs`)
the looks are the one path that sends slot merges: the cycles send site ads only. This
module only repeats the looks, records the metrics and says each fault once: when the
collector fails, looks back off (doubling from the interval up to :data:`MAX_BACKOFF_S`)
and one line says so, one more when it answers. Looks whose queries take long (a large
pool) come less often: :data:`MAX_LOOK_SHARE`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime

from apscheduler.schedulers.base import BaseScheduler
from apscheduler.triggers.interval import IntervalTrigger

from hydrator.config import Config
from hydrator.core.ports import Publisher, RepairsSlots
from hydrator.core.slot_coverage import RepairReport, SiteCoverage
from hydrator.domain import Site, SiteView
from hydrator.errors import PublishError
from hydrator.logs import ProblemLog
from hydrator.redact import redact
from hydrator.runtime.metrics import Metrics
from hydrator.runtime.observe import record_coverage, record_repair, record_repair_failed
from hydrator.runtime.wiring import slot_coverage

log = logging.getLogger(__name__)

_COLLECTOR = "collector"  # the key of the collector's failure
MAX_BACKOFF_S = 60.0
"""Longest pause between looks while the collector fails."""
MAX_LOOK_SHARE = 0.2
"""Looks' queries take at most this share of the time: after a look whose query took ``w``
seconds the next starts no sooner than ``w / MAX_LOOK_SHARE`` after it began. The collector
answers a look with a child that scans every slot ad, so its time grows with the pool; this
keeps the collector's work for looks bounded while ``repair_interval_s`` sets the pace of a
small pool (docs/coverage.md). The time a look spends sending merges is not counted: each of
them is owed whoever sends it (the looks deliver every slot merge of a running daemon), and
a look that merged a change must not hold back the repairs after it."""


class RepairWatch:
    """One look per call, by every publisher that repairs slots (see the module doc).
    ``coverage`` is each site's coverage at the last look, handed to ``shown`` (for
    ``/v1/sites``); ``written`` is called after a look that changed something (the HTTP
    endpoint then serves the new metrics)."""

    def __init__(
        self,
        publishers: Sequence[Publisher],
        metrics: Metrics,
        interval_s: float,
        clock: Callable[[], datetime],
        *,
        written: Callable[[], None] = lambda: None,
    ) -> None:
        self.targets = [p for p in publishers if isinstance(p, RepairsSlots)]
        self.metrics, self.interval_s, self.clock = metrics, interval_s, clock
        self.written = written
        self.coverage: Mapping[Site, SiteCoverage] = {}
        self._failures = 0
        self._resume = 0.0  # monotonic: no look before this (backing off)
        self._collector: ProblemLog[str] = ProblemLog(log)  # failing, and answering again
        self._refused: ProblemLog[str] = ProblemLog(log, once_per_process=True)  # per site
        self._uncovered: ProblemLog[str] = ProblemLog(log)  # slot ads of no site, unknown sites

    def __call__(self) -> None:
        started = time.monotonic()
        if started < self._resume:
            return
        merging_s = 0.0
        for target in self.targets:
            try:
                report = target.repair(self.clock(), self.interval_s)
            except PublishError as exc:
                self._failed(exc)
                return
            if self._failures:
                self._collector.recovered(
                    _COLLECTOR,
                    "slot repair: the collector answers again (%d failed)",
                    self._failures,
                )
                self._failures = 0
            self._record(report)
            merging_s += report.merge_s
        took = max(0.0, time.monotonic() - started - merging_s)  # the looks' queries
        self._resume = started + took / MAX_LOOK_SHARE

    def _failed(self, exc: PublishError) -> None:
        self._failures += 1
        pause = min(MAX_BACKOFF_S, self.interval_s * 2**self._failures)
        self._resume = time.monotonic() + pause
        record_repair_failed(self.metrics)
        self._collector.problem(
            _COLLECTOR,
            "slot repair: %s; looking again in %.0fs, backing off up to %.0fs while it fails",
            redact(str(exc)),
            pause,
            MAX_BACKOFF_S,
        )

    def _record(self, report: RepairReport) -> None:
        record_repair(self.metrics, report)
        if not report.looked:
            return
        changed = report.coverage != self.coverage or bool(report.merged)
        self._set_coverage(report.coverage)
        self._say(report)
        if changed:
            self.written()

    def _set_coverage(self, coverage: Mapping[Site, SiteCoverage]) -> None:
        record_coverage(self.metrics, coverage, self.coverage.keys() - coverage.keys())
        self.coverage = dict(coverage)

    def _say(self, report: RepairReport) -> None:
        """One line per cause: refused repairs (once per site while the daemon runs), slot
        ads without a site attribute, slot ads naming no site of ours (again only after a
        look without them)."""
        causes = {f"refused:{site}": n for site, n in report.plan.refused.items() if n}
        causes["no_site"] = report.without_site
        causes["unknown_site"] = report.unknown_site
        for cause, count in causes.items():
            said = self._refused if cause.startswith("refused:") else self._uncovered
            if count:
                said.problem(cause, "slot repair: %s", _explain(cause, count))
            else:
                said.forget(cause)  # a refusing site's stays said


def _explain(cause: str, count: int) -> str:
    if cause == "no_site":
        return (
            f"{count} slot ad(s) have no [collector] slot_site_attribute: never merged"
            " (hydrator_slots_without_site)"
        )
    if cause == "unknown_site":
        return (
            f"{count} slot ad(s) name a site the hydrator does not publish: never merged"
            " (hydrator_slots_unknown_site)"
        )
    site = cause.removeprefix("refused:")
    return (
        f"site {site}: the collector did not keep {count} repair merge(s) (the slot gone, or"
        " the merge refused); retrying those slots with back-off"
        " (hydrator_slot_repair_refused_total)"
    )


def schedule_repairs(
    scheduler: BaseScheduler,
    publishers: Sequence[Publisher],
    interval_s: float,
    written: Callable[[], None],
    *,
    metrics: Metrics,
    clock: Callable[[], datetime],
) -> RepairWatch | None:
    """Add the repair watch over ``publishers``, a look every ``interval_s`` (``[collector]
    repair_interval_s``), to ``scheduler`` (None when that is 0 or no publisher repairs
    slots) and hand it the slot merges of those publishers
    (:meth:`~hydrator.core.ports.RepairsSlots.hand_merges_to_repairs`: the cycles send
    site ads, the looks every slot merge). What its last look found is
    :attr:`RepairWatch.coverage` (``/v1/sites`` shows it)."""
    if interval_s <= 0:
        return None
    watch = RepairWatch(publishers, metrics, interval_s, clock, written=written)
    if not watch.targets:
        return None
    for target in watch.targets:
        target.hand_merges_to_repairs()  # the looks deliver slot merges from now on
    scheduler.add_job(
        watch,
        IntervalTrigger(seconds=interval_s),
        id="repair",
        max_instances=1,
        coalesce=True,
        misfire_grace_time=None,
    )
    return watch


def shown_coverage(config: Config, views: Mapping[Site, SiteView]) -> tuple[dict[Site, str], str]:
    """For ``hydrator show`` with ``[collector]`` enabled: one comment line per site saying
    how many of its slot ads carry its lists now (asked of the collector), and a last line
    for slot ads no site covers or for a collector that does not answer."""
    if not config.collector.enabled or not config.collector.merge_slots:
        return {}, ""
    try:
        coverage, no_site, unknown = slot_coverage(
            config, {site: view.digest for site, view in views.items()}
        )
    except PublishError as exc:
        return {}, f"# slot coverage: unknown, {redact(str(exc))}\n"
    lines = {
        site: f"# slot coverage: {c.current} of {c.slots} slot ad(s) carry these lists"
        f" ({c.bare} bare, {c.stale + c.deferred} older lists)\n"
        for site, c in coverage.items()
    }
    tail = ""
    if no_site or unknown:
        tail = (
            f"# slot ads never merged: {no_site} without {config.collector.slot_site_attribute},"
            f" {unknown} naming no site published here\n"
        )
    return lines, tail
