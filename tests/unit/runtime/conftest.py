"""Fixtures of the runtime's unit tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from hydrator.adapters.state.sqlite import SqliteStateStore
from hydrator.config import RucioEventsConfig, parse_config
from hydrator.core.event_plan import ListenerStatus, ReconcilePolicy
from hydrator.runtime.event_worker import EventCycles
from hydrator.runtime.metrics import Metrics
from hydrator.runtime.wiring import assemble
from tests.support.event_cycles import Catalogue, Listening
from tests.unit.factories import rep


@pytest.fixture
def setup(tmp_path: Path) -> Any:
    config = parse_config(
        {
            "daemon": {"state_path": "s.sqlite", "interval_s": 60},
            "sources": [{"type": "static", "path": "unused.toml"}],
        },
        tmp_path,
    )
    catalogue = Catalogue(rep("A", "obs1"))
    metrics = Metrics(CollectorRegistry())
    service = assemble(
        config,
        sources=[catalogue],
        store=SqliteStateStore(tmp_path / "s.sqlite"),
        metrics=metrics,
    )
    events = RucioEventsConfig(
        enabled=True, brokers=["127.0.0.1:1"], event_debounce_s=0.2, max_event_reads_per_cycle=2
    )
    now = [1000.0]
    cycles = EventCycles(
        service, catalogue, events, ReconcilePolicy(60, 1800, 600), clock=lambda: now[0]
    )
    cycles.listener = Listening(ListenerStatus(True, 999.0, 999.0))
    yield service, catalogue, cycles, metrics, now
    service.close()
