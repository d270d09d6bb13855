"""A flapping storage element (down one cycle, up the next) must not re-merge every slot of its
site every cycle: the core's digest follows it, and the collector's existing
``merge_min_interval_s`` bounds the merges. Counted over an hour of 60 s cycles, with slots
that keep what was merged (no startd update wipes them in between: the worst case)."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import classad2
import pytest

from hydrator.config import ClassAdConfig
from hydrator.core.advertise import AdvertisePolicy, advertise
from hydrator.core.collector_merges import Rendered, Target, defer_merges, plan_merges
from hydrator.core.index import merged_snapshot
from hydrator.core.plan import GuardPolicy, plan_cycle
from hydrator.core.render import published_updated
from hydrator.domain import Site, Snapshot, State, StorageStatus
from tests.unit.factories import rep, t

SLOTS_PER_SITE = 100
CYCLES = 60
CYCLE = timedelta(seconds=60)
A, B = Site("SITE_A"), Site("SITE_B")


def answer(down: bool) -> Snapshot:
    """SITE_A: d1 on X_DISK only, d2 on Y_DISK; SITE_B: b on B_DISK. X_DISK flaps."""
    x = StorageStatus(A, "X_DISK", "RSE", not down, "availability_read false" if down else None)
    statuses = (x, StorageStatus(A, "Y_DISK", "RSE"), StorageStatus(B, "B_DISK", "RSE"))
    held = [rep("SITE_A", "d2"), rep("SITE_B", "b")] + ([] if down else [rep("SITE_A", "d1")])
    return merged_snapshot("rucio", held, [A, B], storages=statuses)


def merges_in_an_hour(min_interval_s: float) -> dict[Site, int]:
    """Full merges sent per site over ``CYCLES`` cycles of a storage flapping every cycle."""
    attrs = ClassAdConfig()
    slots = [Target(f"slot{i}@{s}", s, None, None) for s in (A, B) for i in range(SLOTS_PER_SITE)]
    state, sent = State(), {A: 0, B: 0}
    for cycle in range(CYCLES):
        now = t(0) + cycle * CYCLE
        plan = plan_cycle(state, {"rucio": answer(down=cycle % 2 == 1)}, now, GuardPolicy())
        state = plan.state
        rendered = {}
        for site, view in plan.sites.items():
            shown = advertise(view, {}, AdvertisePolicy()).view
            rendered[site] = Rendered(
                classad2.ClassAd(), shown.digest, published_updated(shown, attrs)
            )
        todo, _ = plan_merges(slots, rendered, now.timestamp(), 900.0)
        chosen, _ = defer_merges(todo, rendered, now.timestamp(), 900.0, min_interval_s)
        merged = {s.name for s in chosen}
        for site in (A, B):
            sent[site] += sum(1 for s in chosen if s.site == site)
        stamp = int(now.timestamp())
        slots = [
            replace(
                s, digest=rendered[s.site].digest, updated=rendered[s.site].updated, merged_s=stamp
            )
            if s.name in merged
            else s
            for s in slots
        ]
    return sent


@pytest.mark.parametrize(("interval_s", "per_slot_at_most"), [(0.0, CYCLES), (300.0, 13)])
def test_a_flapping_storage_re_merges_its_site_at_most_once_per_merge_interval(
    interval_s: float, per_slot_at_most: int
) -> None:
    sent = merges_in_an_hour(interval_s)
    print(f"merge_min_interval_s={interval_s:g}: {sent[A]} merges at SITE_A, {sent[B]} at SITE_B")
    assert sent[A] <= per_slot_at_most * SLOTS_PER_SITE
    # the other site's slots: only the refresh_s (900 s) refreshes of DataLocalityUpdated
    assert sent[B] == CYCLES * 60 // 900 * SLOTS_PER_SITE
    if interval_s == 0:
        assert sent[A] == CYCLES * SLOTS_PER_SITE, "unbounded: every slot, every cycle"
    else:
        assert sent[A] >= (CYCLES * 60 // int(interval_s)) * SLOTS_PER_SITE, "yet it follows"
