"""Core benchmark at one scale, run in a fresh process so its peak RSS is its own.

Two steps, each its own process (``python -m benchmarks.core_bench STEP --replicas N ...``):

``import``  generate the federation, run the first cycle from an empty state (every replica
            added), write the state database. Prints JSON: timings, rows, DB size, peak RSS.
``steady``  regenerate the same federation (deterministic), load the database as the daemon
            does at startup (load + site views + render every ad), then run ``--cycles``
            cycles with 1 % churn and one cycle with no change, each split by phase exactly as
            :meth:`Service._cycle` (runtime.service) sequences them: ``plan_cycle`` -> ``save``
            -> ``render_ads``. Prints JSON.

The phase ``source`` (building the fresh :class:`~hydrator.domain.Snapshot` a source would
return) is measured but is not part of the core's cycle time: it is the source adapter's work.
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import classad2

from benchmarks.generate import SOURCE, Federation, Scale
from hydrator.adapters.state.sqlite import SqliteStateStore
from hydrator.config import ClassAdConfig, CollectorConfig
from hydrator.core.plan import Plan, Policy, plan_cycle
from hydrator.domain import Site, SiteView, State
from hydrator.runtime.service import render_ads

if TYPE_CHECKING:  # not at run time: --code runs this with an older hydrator
    from hydrator.core.derived import Derived

T = TypeVar("T")
T0 = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
INTERVAL = timedelta(seconds=60)
POLICY = Policy()
ATTRS = ClassAdConfig()


class GcClock:
    """Seconds spent in the cyclic garbage collector (via ``gc.callbacks``), by generation."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.full_collections = 0
        self._t0 = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._t0
            self.full_collections += info["generation"] == 2

    def take(self) -> tuple[float, int]:
        """Seconds and full collections since the last call."""
        out = (self.seconds, self.full_collections)
        self.seconds, self.full_collections = 0.0, 0
        return out


GC = GcClock()


def timed(fn: Callable[[], T]) -> tuple[T, float]:
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def peak_rss_bytes() -> int:
    """Peak resident set size of this process (Linux ru_maxrss is in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def current_rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def db_bytes(path: Path) -> int:
    """The database plus its WAL (checkpointed on close, so usually the file alone)."""
    return sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))


class CollectorModel:
    """What the collector adapter's :class:`CollectorPublisher` would send, from its own
    pure planning functions (``plan_merges``, ``plan_site_ads``), against a pool whose slots
    and site ads carry what the previous cycle sent. Not modelled: the startd's own updates,
    which wipe merged attributes (FACTS.md), so a real pool also re-merges the slots whose
    startd re-advertised since the last cycle."""

    def __init__(self, fed: Federation, views: Mapping[Site, SiteView], now: datetime) -> None:
        from hydrator.adapters.htcondor import collector

        self.c = collector
        self.refresh_s = CollectorConfig().refresh_s
        rendered = self._rendered(views)
        self.slots = [self._carrying(name, Site(site), rendered) for name, site in fed.slots]
        self.site_ads = [self._carrying(site, site, rendered, now) for site in rendered]

    def _rendered(self, views: Mapping[Site, SiteView]) -> dict[Site, Any]:
        res = ATTRS.updated_resolution_s
        return {
            site: self.c.Rendered(
                classad2.ClassAd(),  # the planners read only digest and updated
                v.digest,
                int(v.updated.timestamp()) // res * res if v.updated else 0,
            )
            for site, v in views.items()
        }

    def _carrying(
        self, name: str, site: Site, rendered: Mapping[Site, Any], heard: datetime | None = None
    ) -> Any:
        want = rendered.get(site)
        return self.c.Target(
            name,
            site,
            want.digest if want else None,
            want.updated if want else None,
            int(heard.timestamp()) if heard else None,
        )

    def cycle(self, views: Mapping[Site, SiteView], now: datetime) -> tuple[int, int]:
        """(slot merges, site ads sent) this cycle; the pool then carries what was sent."""
        rendered = self._rendered(views)
        now_s = now.timestamp()
        todo, _ = self.c.plan_merges(self.slots, rendered, now_s, self.refresh_s)
        send, gone, _ = self.c.plan_site_ads(self.site_ads, rendered, now_s, self.refresh_s)
        merged = {t.name for t in todo}
        self.slots = [
            self._carrying(t.name, t.site, rendered) if t.name in merged else t for t in self.slots
        ]
        sent = set(send)
        self.site_ads = [
            self._carrying(t.site, t.site, rendered, now) if t.site in sent else t
            for t in self.site_ads
            if t.site not in gone
        ]
        return len(todo), len(send) + len(gone)


def cycle(
    fed: Federation,
    store: SqliteStateStore,
    previous: State | Derived,
    now: datetime,
    pool: CollectorModel | None = None,
) -> tuple[Plan, dict[str, Any]]:
    """One cycle, phase by phase, as the service runs it (fetch is the fresh snapshot)."""
    GC.take()  # collections caused by the generator's churn are nobody's cost
    snapshot, t_source = timed(fed.snapshot)
    gc_source = GC.take()
    plan, t_plan = timed(lambda: plan_cycle(previous, {SOURCE: snapshot}, now, POLICY))
    gc_plan = GC.take()
    rows, t_save = timed(lambda: store.save(plan))
    ads, t_render = timed(lambda: render_ads(plan.sites, ATTRS))
    gc_rest = GC.take()
    replica_rows = sum(len(d.added) + len(d.removed) for d in plan.source_deltas.values())
    record = {
        "source_s": t_source,
        "plan_s": t_plan,
        "save_s": t_save,
        "render_s": t_render,
        "core_s": t_plan + t_save + t_render,
        "gc_source_s": gc_source[0],
        "gc_core_s": gc_plan[0] + gc_rest[0],
        "gc_core_full_collections": gc_plan[1] + gc_rest[1],
        "rows_written": rows,
        "replica_rows_written": replica_rows,
        "changes": len(plan.changes),
        "changed_sites": len(plan.changed_sites),
        "changed_sites_slots": sum(1 for _, site in fed.slots if site in plan.changed_sites),
        "collector_updates_naive": len(fed.slots),
        "ad_bytes_total": sum(len(ad.body) for ad in ads.values()),
        "ad_bytes_max": max((len(ad.body) for ad in ads.values()), default=0),
    }
    if pool is not None:
        merges, site_ads = pool.cycle(plan.sites, now)
        record["collector_merges"] = merges
        record["collector_site_ads"] = site_ads
    return plan, record


def step_import(args: argparse.Namespace) -> dict[str, Any]:
    fed, t_gen = timed(lambda: Federation(Scale(args.replicas), args.seed))
    baseline = current_rss_bytes()
    store = SqliteStateStore(args.db)
    _, record = cycle(fed, store, State(), T0)
    store.close()
    return {
        "generate_s": t_gen,
        "harness_rss_bytes": baseline,
        "initial": record,
        "db_bytes": db_bytes(args.db),
        "peak_rss_bytes": peak_rss_bytes(),
    }


def startup(store: SqliteStateStore) -> tuple[Derived, dict[Site, SiteView], dict[str, float]]:
    """What :class:`~hydrator.runtime.service.Service` does when it starts: load, views, render."""
    state, t_load = timed(store.load)

    def views() -> dict[Site, SiteView]:
        updated = state.site_updated  # as hydrator.runtime.service._stamped
        return {s: replace(v, updated=updated.get(s)) for s, v in state.contents.items()}

    contents, t_views = timed(views)
    _, t_render = timed(lambda: render_ads(contents, ATTRS))
    return (
        state,
        contents,
        {
            "load_s": t_load,
            "views_s": t_views,
            "render_s": t_render,
            "total_s": t_load + t_views + t_render,
        },
    )


def step_steady(args: argparse.Namespace) -> dict[str, Any]:
    fed = Federation(Scale(args.replicas), args.seed)
    baseline = current_rss_bytes()
    store = SqliteStateStore(args.db)
    GC.take()
    state, views, start = startup(store)
    start["gc_s"] = GC.take()[0]
    pool = CollectorModel(fed, views, T0)
    if args.gc_freeze:
        gc.freeze()
    now = T0
    steady, churns = [], []
    for _ in range(args.cycles):
        churns.append(vars(fed.churn()))
        now += INTERVAL
        plan, record = cycle(fed, store, state, now, pool)
        state = plan.derived
        del plan
        if args.gc_freeze:  # what Service could do after each cycle (see ANALYSIS.md)
            gc.freeze()
        steady.append(record)
    now += INTERVAL
    _, idle = cycle(fed, store, state, now, pool)
    store.close()
    return {
        "harness_rss_bytes": baseline,
        "startup": start,
        "churn": churns,
        "steady": steady,
        "no_change": idle,
        "db_bytes": db_bytes(args.db),
        "peak_rss_bytes": peak_rss_bytes(),
        "gc_freeze": args.gc_freeze,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("step", choices=["import", "steady"])
    parser.add_argument("--replicas", type=int, required=True)
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--db", type=Path, required=True)
    parser.add_argument("--cycles", type=int, default=3)
    parser.add_argument(
        "--gc-freeze", action="store_true", help="gc.freeze() after startup and each cycle"
    )
    args = parser.parse_args()
    result = step_import(args) if args.step == "import" else step_steady(args)
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
