"""deploy/prometheus: promtool accepts the scrape config and rules, and the rule unit tests pass.

promtool comes from Debian's ``prometheus`` package (installed by the fixture if missing).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import yaml

from tests.support.deploy import DEPLOY

PROMETHEUS = DEPLOY / "prometheus"
RULES = PROMETHEUS / "hydrator.rules.yml"
# What the daemon exports (runtime/metrics.py, including the matchmaking-quality metrics: data-local
# jobs, idle data-bound jobs, unclaimed slots with data);
# histograms also expose _bucket/_sum/_count.
EXPORTED = {
    "hydrator_cycle_duration_seconds",
    "hydrator_cycles_total",
    "hydrator_last_successful_cycle_timestamp_seconds",
    "hydrator_source_requests_total",
    "hydrator_source_errors_total",
    "hydrator_source_fetch_duration_seconds",
    "hydrator_source_staleness_seconds",
    "hydrator_source_stale",
    "hydrator_source_last_success_timestamp_seconds",
    "hydrator_datasets",
    "hydrator_changes_total",
    "hydrator_invalid_records_total",
    "hydrator_unmapped_storage_elements",
    "hydrator_collector_updates_total",
    "hydrator_classad_size_bytes",
    "hydrator_jobs_running_data_local_ratio",
    "hydrator_jobs_running",
    "hydrator_jobs_idle_data_bound",
    "hydrator_sites_unclaimed_slots_with_data",
    "hydrator_http_front_restarts_total",
    "hydrator_http_requests_total",
    "hydrator_http_connections",
    "hydrator_source_invalid_records",
    "hydrator_datasets_unadvertised",
    "hydrator_state_rejected_rows",
    "hydrator_job_schedd_failures_total",
    "hydrator_site_held",
    "hydrator_storage_available",
    "hydrator_storage_unavailable_wanted_datasets",
    "hydrator_drains",
    "hydrator_events_listener_connected",
    "hydrator_thread_alive",
    "hydrator_thread_restarts_total",
    "hydrator_site_remote_readers",
    "hydrator_remote_budget",
    "hydrator_slot_coverage_ratio",
}


def _promtool(promtool: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool, *args], capture_output=True, text=True, cwd=PROMETHEUS, check=False
    )


def test_scrape_config_is_valid(promtool: str) -> None:
    result = _promtool(promtool, "check", "config", "prometheus.yml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_rules_are_valid(promtool: str) -> None:
    result = _promtool(promtool, "check", "rules", RULES.name)
    assert result.returncode == 0, result.stdout + result.stderr


def test_rule_unit_tests_pass(promtool: str) -> None:
    result = _promtool(promtool, "test", "rules", "hydrator.rules.test.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_rule_unit_tests_can_fail(promtool: str, tmp_path: Path) -> None:
    # Guards the test above: a rule that no longer fires makes promtool exit non-zero.
    broken = RULES.read_text().replace("> 900", "> 90000")
    (tmp_path / RULES.name).write_text(broken)
    tests = (PROMETHEUS / "hydrator.rules.test.yml").read_text()
    (tmp_path / "hydrator.rules.test.yml").write_text(tests)
    result = subprocess.run(
        [promtool, "test", "rules", "hydrator.rules.test.yml"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=False,
    )
    assert result.returncode != 0
    assert "HydratorSourceStale" in result.stdout + result.stderr


def test_every_alert_is_unit_tested_and_uses_exported_metrics() -> None:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    rules = [rule for group in groups for rule in group["rules"]]
    tests = yaml.safe_load((PROMETHEUS / "hydrator.rules.test.yml").read_text())["tests"]
    tested = {
        case["alertname"]
        for test in tests
        for case in test["alert_rule_test"]
        if case["exp_alerts"]
    }
    assert {rule["alert"] for rule in rules} == tested
    for rule in rules:
        names = set(re.findall(r"\bhydrator_[a-z_]+", rule["expr"]))
        assert names <= EXPORTED, rule["alert"]
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}
