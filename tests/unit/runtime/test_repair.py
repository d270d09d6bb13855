"""The repair watch's loop: metrics from each look, one line per fault, back-off while the
collector fails; the coverage in /v1/sites (the looks themselves are tested on the real pool:
tests/pool/test_coverage.py)."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import pytest
from apscheduler.schedulers.background import BackgroundScheduler
from prometheus_client import CollectorRegistry

from hydrator.config import ClassAdConfig
from hydrator.core.ports import Publisher, PublishReport, RepairsSlots
from hydrator.core.slot_coverage import RepairPlan, RepairReport, SiteCoverage
from hydrator.domain import Site, SiteView
from hydrator.errors import PublishError
from hydrator.runtime import repair
from hydrator.runtime.json_views import sites_json
from hydrator.runtime.metrics import Metrics
from hydrator.runtime.outcome import Published, render_ads
from hydrator.runtime.repair import RepairWatch
from tests.pool.views import views

A = Site("SITE_A")


class Repairing(Publisher, RepairsSlots):
    """A publisher with the RepairsSlots capability, answering from a list of outcomes."""

    name = "collector"

    def __init__(self, *outcomes: RepairReport | PublishError) -> None:
        self.outcomes = list(outcomes)
        self.calls = 0
        self.handed = False

    def publish(
        self, sites: Mapping[Site, SiteView], removed: frozenset[Site], now: datetime
    ) -> PublishReport:
        raise AssertionError("not called")

    def close(self) -> None:
        pass

    def hand_merges_to_repairs(self) -> None:
        self.handed = True

    def repair(self, now: datetime, interval_s: float) -> RepairReport:
        self.calls += 1
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, PublishError):
            raise outcome
        return outcome


def looked(refused: Mapping[Site, int] | None = None, **changes: Any) -> RepairReport:
    report = RepairReport(
        looked=True,
        returned=1,
        plan=RepairPlan(found_bare={A: 1}, refused=refused or {}),
        merged={A: 1},
        merge_bytes={A: 500},
        delays_s={A: (1.5,)},
        coverage={A: SiteCoverage(4, 3, 1)},
        cycle_merge_bytes=100,
    )
    return dataclasses.replace(report, **changes)


def watch(publisher: Repairing, clock: list[float]) -> tuple[RepairWatch, Metrics, list[object]]:
    metrics = Metrics(CollectorRegistry())
    written: list[object] = []
    w = RepairWatch(
        [publisher],
        metrics,
        2.0,
        lambda: datetime.fromtimestamp(clock[0], UTC),
        written=lambda: written.append(1),
    )
    return w, metrics, written


def value(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def test_a_look_is_recorded_in_the_metrics_and_served(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [0.0]
    monkeypatch.setattr("hydrator.runtime.repair.time.monotonic", lambda: now[0])
    publisher = Repairing(looked(), looked(merged={}, delays_s={}, plan=RepairPlan()))
    w, metrics, written = watch(publisher, [0.0])
    w()
    assert value(metrics, "hydrator_slots_found_bare_total", site=A) == 1
    assert value(metrics, "hydrator_slot_repairs_total", site=A) == 1
    assert value(metrics, "hydrator_slot_repair_bytes_total", site=A) == 500
    assert value(metrics, "hydrator_slot_bare_seconds_count", site=A) == 1
    assert value(metrics, "hydrator_slot_bare_seconds_sum", site=A) == 1.5
    assert value(metrics, "hydrator_slot_coverage_ratio", site=A) == 0.75
    assert value(metrics, "hydrator_slot_coverage_slots", site=A, state="bare") == 1
    assert value(metrics, "hydrator_slot_repair_queries_total", outcome="ok") == 1
    assert value(metrics, "hydrator_collector_merge_bytes_total") == 100
    assert written == [1] and w.coverage == {A: SiteCoverage(4, 3, 1)}
    now[0] += 2.0
    w()  # nothing changed: nothing written again
    assert publisher.calls == 2 and written == [1]


def test_a_failing_collector_is_said_once_and_looked_at_with_back_off(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    now = [100.0]
    monkeypatch.setattr("hydrator.runtime.repair.time.monotonic", lambda: now[0])
    down = PublishError("collector 127.0.0.1:9618: query failed: connection refused")
    publisher = Repairing(down, down, down, looked())
    w, metrics, _ = watch(publisher, now)
    with caplog.at_level(logging.INFO, logger="hydrator.runtime.repair"):
        w()  # fails: next look in 4 s
        for _ in range(10):
            w()  # every call within the back-off is skipped: no tight loop
        assert publisher.calls == 1
        now[0] += 4.0
        w()  # fails again: 8 s
        now[0] += 7.9
        w()
        assert publisher.calls == 2
        now[0] += 0.1
        w()  # third failure: 16 s
        now[0] += 16.0
        w()  # answers
    assert publisher.calls == 4
    assert value(metrics, "hydrator_slot_repair_queries_total", outcome="error") == 3
    lines = [r.getMessage() for r in caplog.records]
    assert sum("connection refused" in line for line in lines) == 1
    assert sum("answers again (3 failed)" in line for line in lines) == 1


def test_the_back_off_stops_at_its_maximum(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [0.0]
    monkeypatch.setattr("hydrator.runtime.repair.time.monotonic", lambda: now[0])
    publisher = Repairing(*[PublishError("down")] * 10)
    w, _, _ = watch(publisher, now)
    for _ in range(10):
        w()
        now[0] += repair.MAX_BACKOFF_S
    assert publisher.calls == 10


def test_slow_looks_come_less_often_than_the_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    """A look that takes long (a collector scanning many slot ads) is followed by a pause of
    at least its duration / MAX_LOOK_SHARE: the collector's share of time on looks stays
    bounded whatever repair_interval_s says."""
    now = [0.0]
    monkeypatch.setattr("hydrator.runtime.repair.time.monotonic", lambda: now[0])

    class Slow(Repairing):
        def repair(self, at: datetime, interval_s: float) -> RepairReport:
            now[0] += 0.3  # the look's own time
            return super().repair(at, interval_s)

    publisher = Slow(*[looked()] * 3)
    w, _, _ = watch(publisher, now)
    w()
    pause = 0.3 / repair.MAX_LOOK_SHARE
    now[0] = pause - 0.01
    w()  # the scheduler calls again within the pause: skipped
    assert publisher.calls == 1
    now[0] = pause
    w()
    assert publisher.calls == 2


def test_the_time_a_look_spends_merging_does_not_pace_the_looks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A look that merged a change for 2 s after a 0.1 s query: the next comes after
    0.1 s / MAX_LOOK_SHARE, not after 2.1 s / MAX_LOOK_SHARE (the looks deliver every slot
    merge; their merges are owed whoever sends them)."""
    now = [0.0]
    monkeypatch.setattr("hydrator.runtime.repair.time.monotonic", lambda: now[0])

    class Merging(Repairing):
        def repair(self, at: datetime, interval_s: float) -> RepairReport:
            now[0] += 2.1
            return dataclasses.replace(super().repair(at, interval_s), merge_s=2.0)

    publisher = Merging(*[looked()] * 2)
    w, _, _ = watch(publisher, now)
    w()
    now[0] = 0.1 / repair.MAX_LOOK_SHARE + 1e-9
    w()
    assert publisher.calls == 2


def test_scheduling_the_watch_hands_the_slot_merges_to_its_looks() -> None:
    """``hydrator run`` with repair_interval_s > 0: the publishers that repair are told once
    that their looks deliver the slot merges; with 0 (no watch) they are not."""
    for interval_s, handed in ((0.5, True), (0.0, False)):
        publisher = Repairing()
        scheduled = repair.schedule_repairs(
            BackgroundScheduler(),
            [publisher],
            interval_s,
            lambda: None,
            metrics=Metrics(CollectorRegistry()),
            clock=lambda: datetime.now(UTC),
        )
        assert (scheduled is not None, publisher.handed) == (handed, handed)


def test_each_fault_is_said_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    now = [0.0]
    monkeypatch.setattr("hydrator.runtime.repair.time.monotonic", lambda: now[0])
    strays: dict[str, Any] = {"without_site": 2, "unknown_site": 1}
    publisher = Repairing(
        looked(refused={A: 1}, **strays),
        looked(refused={A: 1}, **strays),
        looked(),
        looked(**strays),
    )
    w, metrics, _ = watch(publisher, [0.0])
    with caplog.at_level(logging.WARNING, logger="hydrator.runtime.repair"):
        for _ in range(4):
            w()
            now[0] += 2.0  # the next interval
    lines = [r.getMessage() for r in caplog.records]
    assert sum("did not keep" in line for line in lines) == 1  # once per site
    assert sum("no [collector] slot_site_attribute" in line for line in lines) == 2  # came back
    assert sum("does not publish" in line for line in lines) == 2
    assert value(metrics, "hydrator_slot_repair_refused_total", site=A) == 2
    assert value(metrics, "hydrator_slots_without_site") == 2


def test_v1_sites_gives_each_sites_coverage_at_the_last_look() -> None:
    published = Published(render_ads(views({A: ["ska:x"], "SITE_B": []}), ClassAdConfig()))
    body = sites_json(published, {A: SiteCoverage(4, 3, 1)})
    doc = {s["site"]: s["coverage"] for s in body["sites"]}
    assert doc == {
        A: {"slots": 4, "current": 3, "bare": 1, "stale": 0, "deferred": 0, "ratio": 0.75},
        "SITE_B": None,  # not looked at yet
    }
