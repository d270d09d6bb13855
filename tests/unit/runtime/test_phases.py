"""A cycle's report says where its time went (hydrator.runtime.phases), as the benchmark and
the ``hydrator_cycle_phase_seconds`` metric read it."""

from __future__ import annotations

import gc
import logging
import time
from pathlib import Path

import pytest

from hydrator.config import parse_config
from hydrator.runtime.phases import GC, OTHER, Phases, phase, recording
from hydrator.runtime.wiring import build_service


def test_each_phase_counts_its_own_time_and_the_rest_is_other() -> None:
    with recording() as phases:
        time.sleep(0.02)
        with phase("fetch"):
            time.sleep(0.05)
            with phase("plan"):  # nested: taken off fetch
                time.sleep(0.03)
        taken = phases.taken()
    assert set(taken) == {OTHER, "fetch", "plan"}
    assert 0.05 <= taken["fetch"].wall_s < 0.075
    assert 0.03 <= taken["plan"].wall_s < 0.055
    assert 0.02 <= taken[OTHER].wall_s < 0.045
    assert taken["fetch"].cpu_s < 0.02  # sleeping is no CPU
    total = sum(t.wall_s for t in taken.values())
    assert 0.1 <= total < 0.14


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
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "inv.toml").write_text('[storage.A]\nsite = "A"\navailable = ["ska:x"]\n')
    config = parse_config(
        {"daemon": {"state_path": "s.sqlite"}, "sources": [{"type": "static", "path": "inv.toml"}]},
        tmp_path,
    )
    service = build_service(config)
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
    sample = service.metrics.registry.get_sample_value
    assert sample("hydrator_cycle_phase_seconds_count", {"phase": "plan"}) == 1
    logged = [r.getMessage() for r in caplog.records if r.getMessage().startswith("cycle phases")]
    assert len(logged) == 1 and " plan=" in logged[0]
