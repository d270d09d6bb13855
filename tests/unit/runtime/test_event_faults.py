"""Event cycles that meet what they did not expect (hydrator.runtime.event_worker, docs/events.md
"Faults"): an unexpected error in a targeted read is a failed read, not the end of the
worker; a full read already marked covers the batch, so event cycles stop re-reading it."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any

import pytest

from hydrator.core.event_hints import ListenerStatus
from hydrator.core.ports import FetchContext
from hydrator.domain import DatasetId, Replica
from hydrator.runtime.event_worker import EventCycles
from tests.support.event_cycles import Catalogue, Listening, available, ds, lock_ok, wait_until
from tests.unit.factories import rep


class Rejecting(Catalogue):
    """A catalogue whose exact listing the parser rejects in a way it did not foresee (not a
    SourceError), until ``rejecting`` is cleared."""

    def __init__(self, *replicas: Replica) -> None:
        super().__init__(*replicas)
        self.rejecting = True

    def read_datasets(
        self, datasets: Sequence[DatasetId], context: FetchContext
    ) -> Iterable[Replica]:
        if self.rejecting:
            raise ValueError("unexpected token at line 1")
        return super().read_datasets(datasets, context)


@pytest.mark.parametrize("setup", [Rejecting(rep("A", "obs1"))], indirect=True)
def test_an_unexpected_error_in_a_targeted_read_is_a_failed_read_and_the_worker_goes_on(
    setup: Any, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    service, source, cycles, metrics, _now = setup
    cycles.full_read()
    escaped: list[str] = []  # what threading.excepthook (which bypasses the formatter) saw
    monkeypatch.setattr(threading, "excepthook", lambda args: escaped.append(args.thread.name))
    worker = EventCycles(
        service, source, cycles.config, cycles.policy, metrics=metrics, clock=time.monotonic
    )
    worker.listener = Listening(ListenerStatus(False))
    worker.start()
    failed = {"source": "rucio", "outcome": "failed"}
    sample = metrics.registry.get_sample_value
    try:
        with caplog.at_level(logging.ERROR):
            worker.event(lock_ok("obs1"))
            wait_until(lambda: sample("hydrator_event_cycles_total", failed) == 1, "failed cycle")
        source.rejecting = False  # the next answer parses
        worker.full_read()  # the full read the failure marked (the gate's, at interval_s)
        source.replicas.add(rep("B", "obs2"))
        worker.event(lock_ok("obs2"))
        wait_until(lambda: source.targeted, "the next event cycle's read")
        ok = {"source": "rucio", "outcome": "ok"}
        wait_until(lambda: sample("hydrator_event_cycles_total", ok) == 1, "the next cycle")
    finally:
        worker.stop()
    assert escaped == []
    assert source.targeted == [[ds("obs2")]]
    assert available(service, "B") == ["ska:obs2"]
    logged = [r for r in caplog.records if r.exc_info and r.name == "hydrator.runtime.event_worker"]
    assert len(logged) == 1  # once, with its traceback, through the logging handlers
    assert "unexpected error" in logged[0].getMessage()
    cycle_lines = [r.getMessage() for r in caplog.records if "cycle failed" in r.getMessage()]
    assert any("unexpected ValueError: unexpected token" in m for m in cycle_lines)


@pytest.mark.parametrize("setup", [Rejecting(rep("A", "obs1"))], indirect=True)
def test_the_failed_cycle_leaves_what_it_should_have_read_to_the_next_full_read(
    setup: Any,
) -> None:
    service, source, cycles, metrics, now = setup
    marked = EventCycles(
        service, source, cycles.config, cycles.policy, metrics=metrics, clock=lambda: now[0]
    )
    marked.listener = cycles.listener
    marked.full_read()
    before = service.published.ads
    marked.event(lock_ok("obs1"))
    report = marked.event_cycle()
    assert report is not None and report.outcome == "failed"
    assert service.published.ads == before
    now[0] += 61  # interval_s, not the reconcile interval: the full read is marked
    assert marked.full_read_due()


def test_once_a_full_read_is_marked_event_cycles_read_nothing_it_covers(setup: Any) -> None:
    """A flood of distinct datasets: one event cycle reads its bound and marks the full read;
    from then on no event cycle reads until it has run; what it covers is dropped (counted),
    what arrived while it ran is read next."""
    service, catalogue, cycles, metrics, now = setup
    cycles.full_read()
    for i in range(5):
        cycles.event(lock_ok(f"flood{i}"))
    cycles.event_cycle()
    assert len(catalogue.targeted) == 1  # max_event_reads_per_cycle (2); the rest: marked
    for i in range(5, 1005):  # the flood goes on while the full read is scheduled
        cycles.event(lock_ok(f"flood{i}"))
        if i % 100 == 0:
            assert cycles.event_cycle() is None
    assert len(catalogue.targeted) == 1  # no re-read of what the full read will cover
    fetch = catalogue.fetch

    def during(context: FetchContext) -> Any:  # a message arrives while the full read runs
        cycles.event(lock_ok("late"))
        return fetch(context)

    catalogue.fetch = during
    now[0] += 61
    assert cycles.full_read_due()
    cycles.full_read()
    catalogue.fetch = fetch
    sample = metrics.registry.get_sample_value
    assert sample("hydrator_event_hints_covered_total", {"source": "rucio"}) == 1000
    cycles.event_cycle()
    assert catalogue.targeted[1:] == [[ds("late")]]
    assert not cycles.full_read_due()  # covered: the next full read is the reconcile
    assert service.published.ads
