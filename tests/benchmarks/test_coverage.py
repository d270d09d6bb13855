"""The coverage scenario (benchmarks/coverage.py) still runs end to end on the real pool and
Rucio server, on either publication path: a short window with glideins joining and leaving and
a dataset coming and going gives every figure the record holds. Figures are not asserted: they
are the benchmark's."""

from __future__ import annotations

import argparse

import pytest

from benchmarks.coverage import Catalogue, Step, misses, segment
from tests.support.pool import Pool
from tests.support.rucio_server import RucioServer
from tests.support.wait import wait_for

pytestmark = [pytest.mark.pool, pytest.mark.rucio, pytest.mark.slow]

FIGURES = {
    "path", "hook_period_s", "update_interval_s", "hydrator", "revision", "window_s",
    "glideins_started", "data_changes",
    "slot_samples", "coverage", "coverage_strict", "bare_fraction", "longest_bad_s", "new_slots",
    "new_slot_never_carried", "new_slot_wait_p50_s", "new_slot_wait_max_s", "new_slot_waits_s",
    "load_per_minute", "harness_queries_per_minute", "daemon_coverage_metrics",
}  # fmt: skip


@pytest.mark.parametrize(
    "step", [Step("collector", 30, "new", None), Step("hook", 30, "new", None, 2)]
)
def test_a_short_window_gives_every_figure(
    condor_pool: Pool, rucio_server: RucioServer, step: Step
) -> None:
    catalogue = Catalogue(rucio_server)
    args = argparse.Namespace(duration_s=20, period_s=1.0, glidein_every_s=6, data_every_s=10)
    result = segment(args, catalogue, condor_pool, step)
    assert set(result) == FIGURES
    assert (result["path"], result["hook_period_s"]) == (step.path, step.hook_period_s)
    assert result["hydrator"].endswith("hydrator/__init__.py")
    assert result["glideins_started"] >= 2 and result["data_changes"] >= 1
    assert result["new_slots"] >= 1  # the glideins' slots, judged from their first sample
    assert result["slot_samples"] >= 4 * 15  # the pool's four slots, about once a second
    assert 0.0 <= result["coverage_strict"] <= result["coverage"] <= 1.0
    assert "collector_UpdatesTotal_Slot" in result["load_per_minute"]
    if step.path == "hook":  # the hooks' fetches, counted by the daemon's HTTP server
        answers = result["load_per_minute"]
        assert answers.get("hydrator_http_requests_total,code=200,route=classad", 0) > 0
        assert not any(k.startswith("hydrator_collector") and v for k, v in answers.items())
    assert isinstance(misses(result), list)

    def glidein_slots() -> list[str]:
        return [str(ad["Name"]) for ad in condor_pool.slot_ads() if str(ad["Name"]).count("@") > 1]

    wait_for("the glideins' slots withdrawn", glidein_slots, done=lambda s: not s, timeout_s=30)
