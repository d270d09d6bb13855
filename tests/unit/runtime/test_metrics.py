"""The exported metrics: every name, type and label set, as dashboards and alert rules use them."""

from __future__ import annotations

import math

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from hydrator.runtime.metrics import Metrics

# Exported name -> (type, label names in order). deploy/prometheus, deploy/grafana and docs/
# name these; a metric renamed, dropped or relabelled must change this table too.
EXPECTED = {
    "hydrator_cycle_duration_seconds": ("histogram", ()),
    "hydrator_cycles": ("counter", ("outcome",)),
    "hydrator_last_successful_cycle_timestamp_seconds": ("gauge", ()),
    "hydrator_http_front_restarts": ("counter", ()),
    "hydrator_source_requests": ("counter", ("source", "outcome")),
    "hydrator_source_errors": ("counter", ("source", "kind")),
    "hydrator_source_fetch_duration_seconds": ("histogram", ("source",)),
    "hydrator_source_staleness_seconds": ("gauge", ("source",)),
    "hydrator_source_stale": ("gauge", ("source",)),
    "hydrator_source_last_success_timestamp_seconds": ("gauge", ("source",)),
    "hydrator_source_api_calls": ("counter", ("source", "method")),
    "hydrator_source_deferred_checks": ("gauge", ("source",)),
    "hydrator_source_reused_checks": ("gauge", ("source",)),
    "hydrator_invalid_records": ("counter", ("source",)),
    "hydrator_source_invalid_records": ("gauge", ("source",)),
    "hydrator_unmapped_storage_elements": ("gauge", ("source",)),
    "hydrator_state_rejected_rows": ("gauge", ("table",)),
    "hydrator_datasets": ("gauge", ("site", "state")),
    "hydrator_transfers": ("gauge", ("site", "state")),
    "hydrator_changes": ("counter", ("kind",)),
    "hydrator_state_rows_written": ("counter", ()),
    "hydrator_collector_updates": ("counter", ("kind", "outcome")),
    "hydrator_collector_merges_deferred": ("gauge", ()),
    "hydrator_collector_merges_handed": ("gauge", ()),
    "hydrator_datasets_unadvertised": ("gauge", ("site", "reason")),
    "hydrator_classad_size_bytes": ("gauge", ("site",)),
    "hydrator_site_held": ("gauge", ("site", "source")),
    "hydrator_jobs_running": ("gauge", ("locality",)),
    "hydrator_site_jobs_running": ("gauge", ("site", "locality")),
    "hydrator_jobs_running_data_local_ratio": ("gauge", ()),
    "hydrator_jobs_idle_data_bound": ("gauge", ("reason",)),
    "hydrator_sites_unclaimed_slots_with_data": ("gauge", ("site",)),
    "hydrator_pool_queries": ("counter", ("outcome",)),
    "hydrator_job_edits": ("counter", ("outcome",)),
    "hydrator_job_edit_calls": ("counter", ()),
    "hydrator_jobs_edited": ("counter", ()),
    "hydrator_jobs_seen": ("gauge", ()),
    "hydrator_job_edits_deferred": ("gauge", ()),
    "hydrator_job_schedd_failures": ("counter", ("reason",)),
    "hydrator_jobs_idle_data_bound_at_site": ("gauge", ("site", "locality")),
    "hydrator_jobs_idle_data_nowhere": ("gauge", ()),
    "hydrator_storage_available": ("gauge", ("site", "storage")),
    "hydrator_storage_unavailable_wanted_datasets": ("gauge", ("site", "storage")),
    "hydrator_drains": ("gauge", ("site", "storage")),
    "hydrator_events_received": ("counter", ("source", "type")),
    "hydrator_events_applied": ("counter", ("source", "type")),
    "hydrator_events_ignored": ("counter", ("source", "type", "reason")),
    "hydrator_event_lag_seconds": ("histogram", ("source",)),
    "hydrator_events_listener_connected": ("gauge", ("source",)),
    "hydrator_events_listener_disconnected_since_timestamp_seconds": ("gauge", ("source",)),
    "hydrator_events_last_message_timestamp_seconds": ("gauge", ("source",)),
    "hydrator_event_reads": ("counter", ("source",)),
    "hydrator_event_reads_saved": ("counter", ("source",)),
    "hydrator_event_cycles": ("counter", ("source", "outcome")),
    "hydrator_full_reads_skipped": ("counter", ()),
    "hydrator_cycle_phase_seconds": ("histogram", ("phase",)),
    "hydrator_queue_reads": ("counter", ("outcome",)),
    "hydrator_refresh_cycles": ("counter", ("outcome",)),
    "hydrator_event_hints_covered": ("counter", ("source",)),
    "hydrator_thread_alive": ("gauge", ("thread",)),
    "hydrator_thread_restarts": ("counter", ("thread",)),
    "hydrator_near_reads": ("counter", ("outcome",)),
    "hydrator_near_problems": ("counter", ("kind",)),
    "hydrator_site_remote_readers": ("gauge", ("site",)),
    "hydrator_remote_budget": ("gauge", ()),
    "hydrator_slot_coverage_ratio": ("gauge", ("site",)),
    "hydrator_slot_coverage_slots": ("gauge", ("site", "state")),
    "hydrator_slots_found_bare": ("counter", ("site",)),
    "hydrator_slots_found_stale": ("counter", ("site",)),
    "hydrator_slot_bare_seconds": ("histogram", ("site",)),
    "hydrator_slot_repairs": ("counter", ("site",)),
    "hydrator_slot_repair_bytes": ("counter", ("site",)),
    "hydrator_slot_repair_refused": ("counter", ("site",)),
    "hydrator_slot_repair_queries": ("counter", ("outcome",)),
    "hydrator_slot_repair_query_ads": ("counter", ()),
    "hydrator_collector_merge_bytes": ("counter", ()),
    "hydrator_slots_without_site": ("gauge", ()),
    "hydrator_slots_unknown_site": ("gauge", ()),
}


def test_every_metric_is_exported_with_its_name_type_and_labels() -> None:
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    attributes = [v for v in vars(metrics).values() if isinstance(v, Counter | Gauge | Histogram)]
    for metric in attributes:  # one series each, so that the export shows its label names
        _, labels = EXPECTED[next(iter(metric.describe())).name]
        if labels:
            metric.labels(**dict.fromkeys(labels, "x"))
    exported = {
        family.name: (
            family.type,
            next(tuple(k for k in s.labels if k != "le") for s in family.samples),
        )
        for family in registry.collect()
    }
    assert exported == EXPECTED
    assert list(exported) == list(EXPECTED)  # the export keeps its order
    assert len(attributes) == len(EXPECTED)  # each one reachable as an attribute


def test_outcomes_are_exported_at_zero_before_the_first_event() -> None:
    registry = CollectorRegistry()
    Metrics(registry)
    zero = {
        "hydrator_cycles_total": ("outcome", ("ok", "degraded", "failed", "abandoned")),
        "hydrator_changes_total": ("kind", ("added", "removed", "changed")),
        "hydrator_job_edits_total": ("outcome", ("ok", "error")),
        "hydrator_job_schedd_failures_total": ("reason", ("unavailable", "refused")),
    }
    for sample, (label, values) in zero.items():
        for value in values:
            assert registry.get_sample_value(sample, {label: value}) == 0.0, (sample, value)
    ratio = registry.get_sample_value("hydrator_jobs_running_data_local_ratio")
    assert ratio is not None and math.isnan(ratio)  # unknown until the pool is read, not 0 %


def test_each_registry_gets_its_own_metrics() -> None:
    first, second = Metrics(CollectorRegistry()), Metrics(CollectorRegistry())
    first.cycles.labels("ok").inc()
    assert first.registry.get_sample_value("hydrator_cycles_total", {"outcome": "ok"}) == 1.0
    assert second.registry.get_sample_value("hydrator_cycles_total", {"outcome": "ok"}) == 0.0
