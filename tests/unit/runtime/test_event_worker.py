"""Event cycles (hydrator.runtime.event_worker) over the real service and state store, with an
in-memory catalogue as the source (the runtime's batching, debounce and gating do not depend
on Rucio; tests/events/ runs the same path on the real server, broker and hermes)."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from hydrator.adapters.state.drains import remove_drain, set_drain
from hydrator.core.event_hints import ListenerStatus, RucioEvent
from hydrator.core.storage import Drain
from hydrator.domain import DatasetId, Replica, Site, StorageStatus
from hydrator.runtime.event_worker import EventCycles
from hydrator.runtime.full_read_gate import FullReadGate
from hydrator.runtime.json_views import sites_json
from tests.support.event_cycles import (
    Catalogue,
    Listening,
    available,
    build,
    ds,
    lock_ok,
    wait_until,
)
from tests.unit.factories import rep


def test_an_event_cycle_rereads_exactly_the_named_datasets(setup: Any) -> None:
    service, catalogue, cycles, metrics, _now = setup
    assert cycles.full_read_due()  # start-up
    cycles.full_read()
    assert not cycles.full_read_due()  # events flow: the next full read is the reconcile
    # the catalogue changes twice; only obs1's change is named by a message
    catalogue.replicas = {rep("A", "obs1"), rep("B", "obs1"), rep("B", "obs2")}
    cycles.event(lock_ok("obs1"))
    report = cycles.event_cycle()
    assert report is not None and report.outcome == "ok"
    assert catalogue.targeted == [[ds("obs1")]]
    assert catalogue.full_reads == 1
    assert available(service, "B") == ["ska:obs1"]  # obs2 waits for the reconcile
    sites = {s["site"]: s for s in sites_json(service.published)["sites"]}
    assert sites["B"]["origin"] == "event"
    assert sites["A"]["origin"] == "full_read"
    # the site's "updated" stays the full read's: only obs1 was confirmed since
    assert sites["B"]["updated"] == sites["A"]["updated"]
    sample = metrics.registry.get_sample_value
    assert sample("hydrator_event_reads_total", {"source": "rucio"}) == 1
    assert sample("hydrator_event_reads_saved_total", {"source": "rucio"}) == 39
    calls = {"source": "rucio", "method": "list_dataset_replicas"}
    assert sample("hydrator_source_api_calls_total", calls) == 1  # the event cycle's read
    assert (
        sample("hydrator_events_applied_total", {"source": "rucio", "type": "datasetlock_ok"}) == 1
    )


def test_duplicates_and_irrelevant_messages_cost_no_read(setup: Any) -> None:
    _service, catalogue, cycles, metrics, _now = setup
    cycles.full_read()
    cycles.event(lock_ok("obs1", key="same"))
    cycles.event(lock_ok("obs1", key="same"))
    cycles.event(RucioEvent("transfer-queued", None, ds("obs1"), key="q"))
    cycles.event_cycle()
    assert catalogue.targeted == [[ds("obs1")]]
    assert cycles.event_cycle() is None  # nothing left
    sample = metrics.registry.get_sample_value
    labels = {"source": "rucio", "type": "datasetlock_ok", "reason": "duplicate"}
    assert sample("hydrator_events_ignored_total", labels) == 1
    labels = {"source": "rucio", "type": "other", "reason": "irrelevant"}
    assert sample("hydrator_events_ignored_total", labels) == 1


def test_a_flood_is_cut_and_the_rest_left_to_a_full_read_at_the_normal_interval(
    setup: Any,
) -> None:
    _service, catalogue, cycles, _metrics, now = setup
    cycles.full_read()
    for i in range(5):
        cycles.event(lock_ok(f"obs{i}"))
    cycles.event_cycle()
    assert len(catalogue.targeted[0]) == 2  # max_event_reads_per_cycle
    assert cycles.event_cycle() is None  # the other three are not held any more
    now[0] += 30
    assert not cycles.full_read_due()
    now[0] += 31  # interval_s after the full read: marked, so due before the reconcile
    assert cycles.full_read_due()


def test_a_failed_reread_keeps_the_published_state(setup: Any) -> None:
    service, catalogue, cycles, _metrics, now = setup
    cycles.full_read()
    before = service.published.ads
    catalogue.fail = True
    cycles.event(lock_ok("obs1"))
    report = cycles.event_cycle()
    assert report is not None and report.outcome == "failed"
    assert service.published.ads == before
    now[0] += 61
    assert cycles.full_read_due()  # what it should have read: the next full read


def test_the_worker_runs_an_event_cycle_within_the_debounce(setup: Any) -> None:
    service, catalogue, cycles, metrics, _now = setup
    cycles.full_read()
    real = EventCycles(
        service, catalogue, cycles.config, cycles.policy, metrics=metrics, clock=time.monotonic
    )
    real.listener = Listening(ListenerStatus(False))
    real.start()
    try:
        catalogue.replicas.add(rep("B", "obs1"))
        sent = time.monotonic()
        real.event(lock_ok("obs1"))
        real.event(lock_ok("obs9"))  # in the same batch
        deadline = sent + 10
        while not catalogue.targeted and time.monotonic() < deadline:
            time.sleep(0.02)
        took = time.monotonic() - sent
    finally:
        real.stop()
    assert sorted(catalogue.targeted[0]) == [ds("obs1"), ds("obs9")]
    assert 0.2 <= took < 8  # the debounce first; a loaded machine may add seconds
    assert available(service, "B") == ["ska:obs1"]


def test_a_broker_dropping_each_subscription_costs_one_full_read_per_interval(
    setup: Any,
) -> None:
    """The first reconnect reads at once; the next ones within ``interval_s`` (60 s here) of
    that read leave it to the interval, and the worker goes on with event cycles meanwhile
    (before, it ran a full read at every reconnect, and again every second while one failed)."""
    service, catalogue, cycles, _metrics, now = setup
    cycles.full_read()  # at 1000
    now[0] = 1005.0
    cycles.listener = Listening(ListenerStatus(True, 1005.0, 1005.0))
    assert cycles.full_read_due()
    cycles.full_read()  # the reconnect's read
    now[0] = 1010.0
    cycles.listener = Listening(ListenerStatus(True, 1010.0, 1010.0))  # dropped, back again
    assert not cycles.full_read_due()
    cycles.start()
    try:
        for _ in range(3):
            cycles.connection(True)  # each wakes the worker
        catalogue.replicas.add(rep("B", "obs2"))
        cycles.event(lock_ok("obs2"))
        wait_until(lambda: catalogue.targeted, "the event cycle after the reconnects")
    finally:
        cycles.stop()
    assert catalogue.full_reads == 2
    assert available(service, "B") == ["ska:obs2"]
    now[0] = 1065.0
    assert cycles.full_read_due()


def test_the_gate_skips_full_reads_while_events_flow_unless_other_sources_need_polling(
    setup: Any,
) -> None:
    service, catalogue, cycles, metrics, _now = setup
    gate = FullReadGate(
        service, [cycles], poll_all=False, subscribe_wait_s=0, metrics=metrics, sources=[catalogue]
    )
    gate()  # start-up: due
    gate()  # events flow: skipped
    assert catalogue.full_reads == 1
    assert metrics.registry.get_sample_value("hydrator_full_reads_skipped_total") == 1
    FullReadGate(
        service, [cycles], poll_all=True, subscribe_wait_s=0, metrics=metrics, sources=[catalogue]
    )()  # no events: always
    assert catalogue.full_reads == 2


def test_the_first_full_read_waits_for_the_subscription(setup: Any) -> None:
    """Subscribe, then read: no gap between the start-up read and the stream."""
    service, catalogue, cycles, metrics, _now = setup
    gate = FullReadGate(
        service,
        [cycles],
        poll_all=False,
        subscribe_wait_s=30,
        metrics=metrics,
        sources=[catalogue],
    )
    subscribed: list[float] = []

    def subscribe() -> None:
        subscribed.append(time.monotonic())
        cycles.connection(True)

    timer = threading.Timer(0.3, subscribe)
    timer.start()
    gate()
    assert catalogue.full_reads == 1
    assert subscribed and catalogue.fetched_at[0] >= subscribed[0]


def test_no_event_cycle_while_the_sources_abandoned_full_read_runs(
    setup: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The event cycle would share the running fetch's book and wire: it fails instead,
    and what it should have read waits for the next full read."""
    service, catalogue, cycles, _metrics, now = setup
    cycles.full_read()
    monkeypatch.setattr(service, "busy_sources", lambda: ["rucio"])
    cycles.event(lock_ok("obs1"))
    report = cycles.event_cycle()
    assert report is not None and report.outcome == "failed"
    assert catalogue.targeted == []  # no read made beside the running fetch
    now[0] += 61
    assert cycles.full_read_due()


def test_a_drain_or_undrain_runs_a_full_read_at_the_next_gate(setup: Any, tmp_path: Path) -> None:
    """With events flowing, a drain, an undrain and a drain's ``until`` passing each make
    the next scheduled gate a full read (not the reconcile interval later)."""
    service, catalogue, cycles, metrics, _now = setup
    gate = FullReadGate(
        service, [cycles], poll_all=False, subscribe_wait_s=0, metrics=metrics, sources=[catalogue]
    )
    gate()  # start-up
    gate()  # events flow, nothing changed: skipped
    assert catalogue.full_reads == 1
    state = tmp_path / "s.sqlite"
    since = datetime.now(UTC)
    set_drain(state, Drain(Site("A"), "A_DISK", "disk swap", since))
    gate()
    assert catalogue.full_reads == 2
    gate()  # applied: skipped again
    assert catalogue.full_reads == 2
    remove_drain(state, Site("A"), "A_DISK")
    gate()
    assert catalogue.full_reads == 3
    set_drain(state, Drain(Site("B"), None, "short", since, since + timedelta(seconds=0.5)))
    gate()
    assert catalogue.full_reads == 4
    time.sleep(0.6)  # its until passes
    gate()
    assert catalogue.full_reads == 5
    gate()
    assert catalogue.full_reads == 5


def test_a_skipped_full_read_is_a_refresh_cycle_that_reads_storage_and_no_dataset(
    setup: Any,
) -> None:
    """Storage set unavailable (no message says so) leaves the ads at the next
    scheduled gate, not the reconcile interval later; it comes back when available again;
    a failed storage read keeps the last statuses (unknown is not unavailable)."""
    service, catalogue, cycles, metrics, _now = setup
    gate = FullReadGate(
        service, [cycles], poll_all=False, subscribe_wait_s=0, metrics=metrics, sources=[catalogue]
    )
    gate()  # start-up: a full read
    assert (catalogue.full_reads, catalogue.storage_reads) == (1, 0)
    down = StorageStatus(
        Site("A"), "A_DISK", "RSE", available=False, reason="availability_read false"
    )
    catalogue.storages = (down,)
    gate()  # not due: a refresh cycle
    assert (catalogue.full_reads, catalogue.storage_reads, catalogue.targeted) == (1, 1, [])
    assert available(service, "A") == []
    origins = {s["site"]: s["origin"] for s in sites_json(service.published)["sites"]}
    assert origins == {"A": "refresh", "B": "full_read"}, "its storage read emptied A only"
    assert service.published.ads[Site("A")].view.unavailable == (
        "RSE A_DISK: availability_read false",
    )
    catalogue.fail = True
    gate()  # the read fails: still down, not back
    assert available(service, "A") == []
    catalogue.fail = False
    catalogue.storages = (StorageStatus(Site("A"), "A_DISK", "RSE"),)
    gate()
    assert available(service, "A") == ["ska:obs1"]
    assert catalogue.full_reads == 1
    sample = metrics.registry.get_sample_value
    assert sample("hydrator_full_reads_skipped_total") == 3
    assert sample("hydrator_refresh_cycles_total", {"outcome": "ok"}) == 3
    calls = {"source": "rucio", "method": "list_rses"}
    assert sample("hydrator_source_api_calls_total", calls) == 3  # the failed one too


class WithParents(Catalogue):
    """The catalogue, answering parent lookups: file ``<dataset>.f`` belongs to ``<dataset>``."""

    def __init__(self, *replicas: Replica) -> None:
        super().__init__(*replicas)
        self.lookups: list[int] = []  # files asked, per call

    def parent_datasets(self, files: Sequence[tuple[str, str]]) -> list[DatasetId]:
        self.lookups.append(len(files))
        return [DatasetId(scope, name.removesuffix(".f")) for scope, name in files]


def deletion(name: str) -> RucioEvent:
    return RucioEvent("deletion-done", file=("ska", f"{name}.f"), rse="B_DISK", key=f"d-{name}")


def test_a_burst_of_deletions_is_looked_up_over_the_next_cycles_without_a_full_read(
    tmp_path: Path,
) -> None:
    """Five deleted files with two lookups a cycle: three event cycles, each within the
    debounce of the last, remove all five datasets; no full read is marked, so an addition
    named meanwhile is read at once, not held for it."""
    held = {rep("B", f"obs{i}") for i in range(5)}
    service, catalogue, cycles, _metrics, now = build(
        tmp_path, WithParents(*held), max_parent_lookups_per_cycle=2
    )
    try:
        cycles.full_read()
        assert len(available(service, "B")) == 5
        catalogue.replicas = {rep("B", "new")}  # all five deleted, one added
        for i in range(5):
            cycles.event(deletion(f"obs{i}"))
        cycles.event_cycle()
        assert catalogue.lookups == [2]
        cycles.event(lock_ok("new"))
        cycles.event_cycle()
        cycles.event_cycle()
        assert catalogue.lookups == [2, 2, 1]
        assert cycles.event_cycle() is None  # nothing left
        assert available(service, "B") == ["ska:new"]
        assert catalogue.full_reads == 1
        now[0] += 61
        assert not cycles.full_read_due()  # nothing was marked
    finally:
        service.close()
