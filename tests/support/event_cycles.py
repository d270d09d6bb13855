"""An in-memory catalogue and listener for event-cycle tests (hydrator.runtime.event_worker): the
runtime's batching, debounce and gating do not depend on Rucio; tests/events/ runs the same
path on the real server, broker and hermes. The ``setup`` fixture
(tests/unit/runtime/conftest.py) is :func:`build` over one replica."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from hydrator.adapters.state.sqlite import SqliteStateStore
from hydrator.config import RucioEventsConfig, parse_config
from hydrator.core.event_hints import ListenerStatus, ReconcilePolicy, RucioEvent
from hydrator.core.index import merged_snapshot
from hydrator.core.ports import FetchContext
from hydrator.domain import DatasetId, ElementCount, Replica, Site, Snapshot, StorageStatus
from hydrator.errors import TransientSourceError
from hydrator.runtime.event_worker import EventCycles
from hydrator.runtime.metrics import Metrics
from hydrator.runtime.service import Service
from hydrator.runtime.wiring import assemble


class Catalogue:
    """A source whose answer is a set the test changes; counts full and targeted reads."""

    name = "rucio"

    def __init__(self, *replicas: Replica) -> None:
        self.replicas = set(replicas)
        self.full_reads = 0
        self.fetched_at: list[float] = []
        self.targeted: list[list[DatasetId]] = []
        self.fail = False
        self.calls_last_fetch = {"list_datasets_per_rse": 40}
        self.calls_last_read: dict[str, int] = {}
        self.storages = (StorageStatus(Site("A"), "A_DISK", "RSE"),)
        self.storage_reads = 0

    def fetch(self, context: FetchContext) -> Snapshot:
        self.full_reads += 1
        self.fetched_at.append(time.monotonic())
        answer = merged_snapshot(
            self.name, self.replicas, [Site("A"), Site("B")], storages=self.storages
        )
        at_a = sum(1 for r in self.replicas if r.site == Site("A"))
        return replace(answer, elements={"A_DISK": ElementCount(Site("A"), at_a)})

    def read_storages(self, context: FetchContext) -> tuple[StorageStatus, ...]:
        self.calls_last_read = {"list_rses": 1}
        if self.fail:
            raise TransientSourceError("rucio: connection refused")
        self.storage_reads += 1
        return self.storages

    def read_datasets(
        self, datasets: Sequence[DatasetId], context: FetchContext
    ) -> Iterable[Replica]:
        self.calls_last_read = {"list_dataset_replicas": len(datasets)}  # failed ones too
        if self.fail:
            raise TransientSourceError("rucio: connection refused")
        self.targeted.append(list(datasets))
        return [r for r in self.replicas if r.dataset in datasets]

    def close(self) -> None:
        pass


class Listening:
    """A listener's status, as the test sets it."""

    def __init__(self, status: ListenerStatus) -> None:
        self.state = status

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def status(self) -> ListenerStatus:
        return self.state


def ds(name: str) -> DatasetId:
    return DatasetId("ska", name)


def lock_ok(name: str, key: str = "") -> RucioEvent:
    return RucioEvent("datasetlock_ok", None, ds(name), rse="B_DISK", key=key or name)


def available(service: Service, site: str) -> list[str]:
    return [str(d) for d in service.published.ads[Site(site)].view.available]


def wait_until(check: Callable[[], object], what: str, timeout_s: float = 30.0) -> None:
    """Poll ``check`` until true; fail naming ``what`` after ``timeout_s`` (a bound, not a
    measurement)."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"not seen within {timeout_s} s: {what}")
        time.sleep(0.02)


def build(tmp_path: Path, catalogue: Catalogue, **events: Any) -> Any:
    """The service over ``catalogue`` and its event cycles (``events``: RucioEventsConfig
    fields over the tests' own), the listener subscribed, the clock at 1000 s."""
    config = parse_config(
        {
            "daemon": {"state_path": "s.sqlite", "interval_s": 60},
            "sources": [{"type": "static", "path": "unused.toml"}],
        },
        tmp_path,
    )
    metrics = Metrics(CollectorRegistry())
    service = assemble(
        config,
        sources=[catalogue],
        store=SqliteStateStore(tmp_path / "s.sqlite"),
        metrics=metrics,
    ).service
    settings: dict[str, Any] = {"event_debounce_s": 0.2, "max_event_reads_per_cycle": 2}
    settings.update(events)
    events_config = RucioEventsConfig(enabled=True, brokers=["127.0.0.1:1"], **settings)
    now = [1000.0]
    cycles = EventCycles(
        service,
        catalogue,
        events_config,
        ReconcilePolicy(60, 1800, 600),
        metrics=metrics,
        clock=lambda: now[0],
    )
    cycles.listener = Listening(ListenerStatus(True, 999.0, 999.0))
    return service, catalogue, cycles, metrics, now
