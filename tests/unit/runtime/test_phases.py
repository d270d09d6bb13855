"""A cycle's report says where its time went (hydrator.runtime.phases), as the benchmark and
the ``hydrator_cycle_phase_seconds`` metric read it."""

from __future__ import annotations

import gc
import logging
import time
from pathlib import Path

import pytest

from hydrator.config import parse_config
from hydrator.runtime.metrics import Metrics
from hydrator.runtime.phases import GC, OTHER, Phases, PhaseTime, phase, recording
from hydrator.runtime.wiring import build_service


class Clock:
    """Wall and CPU seconds that move only when the test says (``advance``)."""

    def __init__(self) -> None:
        self.wall, self.cpu = 1000.0, 7.0

    def __call__(self) -> tuple[float, float]:
        return self.wall, self.cpu

    def advance(self, wall_s: float, cpu_s: float = 0.0) -> None:
        self.wall += wall_s
        self.cpu += cpu_s


def test_each_phase_counts_its_own_time_and_the_rest_is_other() -> None:
    clock = Clock()
    with recording(clock) as phases:
        clock.advance(2.0, cpu_s=1.0)
        with phase("fetch"):
            clock.advance(5.0)  # waiting: wall time, no CPU
            with phase("plan"):  # nested: taken off fetch
                clock.advance(3.0, cpu_s=3.0)
            clock.advance(1.0, cpu_s=0.5)  # fetch again after plan closed
        clock.advance(4.0)
        taken = phases.taken()
        clock.advance(100.0)  # after taken(): not counted
    assert taken == {
        OTHER: PhaseTime(6.0, 1.0),
        "fetch": PhaseTime(6.0, 0.5),
        "plan": PhaseTime(3.0, 3.0),
    }
    assert sum(t.wall_s for t in taken.values()) == 15.0  # the recorded stretch, all of it


def test_a_collection_inside_a_phase_is_taken_off_it() -> None:
    clock = Clock()
    with recording(clock) as phases, phase("plan"):
        clock.advance(1.0)
        phases._on_gc("start", {})
        clock.advance(2.0, cpu_s=2.0)
        phases._on_gc("stop", {})
        clock.advance(4.0)
        taken = phases.taken()
    assert taken == {
        OTHER: PhaseTime(0.0, 0.0),
        "plan": PhaseTime(5.0, 0.0),
        GC: PhaseTime(2.0, 2.0),
    }


def test_the_process_clock_gives_wall_time_and_cpu_time() -> None:
    with recording() as phases:
        with phase("fetch"):
            time.sleep(0.05)
        taken = phases.taken()
    assert taken["fetch"].wall_s >= 0.05  # a sleep lasts at least what it asked
    assert taken["fetch"].cpu_s < taken["fetch"].wall_s  # sleeping is no CPU


def test_the_collectors_passes_are_their_own_phase() -> None:
    with recording() as phases, phase("plan"):
        garbage: list[list[object]] = [[] for _ in range(100_000)]
        for item in garbage:
            item.append(item)  # cycles, so the collection has work
        del garbage, item
        gc.collect()
    taken = phases.taken()
    assert taken[GC].wall_s > 0
    assert gc.callbacks.count(phases._on_gc) == 0  # unhooked after the block


def test_a_phase_outside_a_recording_records_nothing() -> None:
    other = Phases()
    with phase("plan"):
        pass
    assert set(other.taken()) == {OTHER}


def test_a_cycle_reports_its_phases_and_exports_them(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, metrics: Metrics
) -> None:
    (tmp_path / "inv.toml").write_text('[storage.A]\nsite = "A"\navailable = ["ska:x"]\n')
    config = parse_config(
        {"daemon": {"state_path": "s.sqlite"}, "sources": [{"type": "static", "path": "inv.toml"}]},
        tmp_path,
    )
    service = build_service(config, metrics)
    try:
        with caplog.at_level(logging.DEBUG, logger="hydrator.cycle"):
            report = service.run_cycle()
    finally:
        service.close()
    assert report.outcome == "ok"
    assert {"queue", "fetch", "plan", "save", "advertise", "render", "publish", "jobs"} <= set(
        report.phases
    )
    assert sum(t.wall_s for t in report.phases.values()) >= report.duration_s
    sample = metrics.registry.get_sample_value
    assert sample("hydrator_cycle_phase_seconds_count", {"phase": "plan"}) == 1
    logged = [r.getMessage() for r in caplog.records if r.getMessage().startswith("cycle phases")]
    assert len(logged) == 1 and " plan=" in logged[0]
