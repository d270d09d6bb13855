"""The repair looks' own bookkeeping, with the publisher's query and merges stubbed (the looks
against a real collector: tests/pool/test_collector.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

import classad2

from hydrator.adapters.htcondor.slot_repairs import SlotRepairs
from hydrator.config import CollectorConfig
from hydrator.core.collector_merges import Rendered, Target
from hydrator.core.merge_budget import MergeBudget
from hydrator.core.slot_coverage import Current, SlotSeen
from hydrator.domain import Site

A = Site("SITE_A")
NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


class Publisher:
    """Stands in for the collector publisher: answers the look's query from ``found`` and
    records each merge it is asked for."""

    def __init__(self, found: list[SlotSeen]) -> None:
        self.found = found
        self.queries: list[dict[Site, Current]] = []
        self.merges: list[list[str]] = []

    def stale_slots(self, current: Mapping[Site, Current], now_s: float) -> list[SlotSeen]:
        self.queries.append(dict(current))
        return self.found

    def merge(
        self, slots: Sequence[Target], rendered: Mapping[Site, Rendered], now_s: float
    ) -> tuple[int, int]:
        self.merges.append([t.name for t in slots])
        return len(slots), 100 * len(slots)


def rendered(digest: str) -> dict[Site, Rendered]:
    return {A: Rendered(classad2.ClassAd({"AvailableDatasets": "ska:a"}), digest, 1000)}


def repairs(publisher: Publisher) -> SlotRepairs:
    budget = MergeBudget(CollectorConfig().merge_budget_bytes_per_s)
    return SlotRepairs(CollectorConfig(), budget, publisher.stale_slots, publisher.merge)


def test_a_site_keeps_the_time_its_digest_was_first_published() -> None:
    looks = repairs(Publisher([]))
    looks.note_current(rendered("d1"), 100.0)
    looks.note_current(rendered("d1"), 200.0)
    assert looks.current == {A: Current("d1", 100.0)}
    looks.note_current(rendered("d2"), 300.0)
    assert looks.current == {A: Current("d2", 300.0)}


def test_before_any_publish_a_look_queries_nothing_and_reports_the_cycles_bytes() -> None:
    publisher = Publisher([SlotSeen("slot1@h", "SITE_A", None)])
    looks = repairs(publisher)
    looks.count_cycle_bytes(40)
    looks.count_cycle_bytes(2)
    report = looks.look(NOW, 10.0, {})
    assert not report.looked and report.cycle_merge_bytes == 42
    assert publisher.queries == [] and publisher.merges == []
    assert looks.look(NOW, 10.0, {}).cycle_merge_bytes == 0  # reported once


def test_a_look_merges_the_bare_slots_its_query_returns_through_the_publisher() -> None:
    wiped = int(NOW.timestamp()) - 30  # the startd's update that wiped them
    found = [SlotSeen(f"slot{i}@h", "SITE_A", None, None, wiped) for i in (1, 2)]
    publisher = Publisher(found)
    looks = repairs(publisher)
    ads = rendered("d1")
    looks.note_current(ads, NOW.timestamp() - 600)
    looks.take_census(found, [], [])
    report = looks.look(NOW, 10.0, ads)
    assert publisher.queries == [{A: Current("d1", NOW.timestamp() - 600)}]
    assert publisher.merges == [["slot1@h", "slot2@h"]]
    assert report.looked and report.returned == 2
    assert report.merged == {A: 2} and report.merge_bytes == {A: 200}
    assert report.delays_s == {A: (30.0, 30.0)}
    assert set(report.plan.pending) == {"slot1@h", "slot2@h"}  # until a look sees them covered
