"""The daemon loop under a cycle that runs longer than the interval (a real APScheduler)."""

from __future__ import annotations

import logging
import re
import threading
import time
from datetime import UTC

import pytest
from apscheduler.schedulers.background import BackgroundScheduler

from hydrator.runtime.scheduler import schedule_cycles


def test_a_long_cycle_is_reported_once_with_its_duration_not_every_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Two cycles of 1.2 s with an interval of 0.2 s: APScheduler skips some five runs during
    each; the log says so once per long cycle, with how long it took."""
    runs: list[float] = []
    done = threading.Event()

    def slow_cycle() -> None:
        runs.append(time.monotonic())
        time.sleep(1.2)
        if len(runs) == 2:
            done.set()

    scheduler = BackgroundScheduler(timezone=UTC)
    caplog.set_level(logging.INFO)
    schedule_cycles(scheduler, slow_cycle, interval_s=0.2, jitter_s=0)
    scheduler.start()
    try:
        assert done.wait(10)
        time.sleep(0.1)  # the second cycle's report follows its end
    finally:
        scheduler.shutdown(wait=True)

    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    took = [m for m in warnings if m.startswith("a cycle took")]
    assert len(took) >= 2 and len(warnings) == len(took), warnings
    pattern = re.compile(r"a cycle took (\d+\.\d) s, longer than interval_s = 0.2 s: (\d+)")
    for message in took[:2]:
        match = pattern.match(message)
        assert match, message
        assert 1.1 <= float(match[1]) <= 2.0 and int(match[2]) >= 3
    notices = [r.getMessage() for r in caplog.records if "still running after" in r.getMessage()]
    assert len(notices) == len(took), "one notice when a cycle first runs long"
