"""Event cycles that meet what they did not expect (hydrator.runtime.events, docs/events.md
"Faults"): an unexpected error in a targeted read is a failed read, not the end of the
worker; a full read already marked covers the batch, so event cycles stop re-reading it."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any

import pytest

from hydrator.core.events import ListenerStatus
from hydrator.core.ports import FetchContext
from hydrator.domain import DatasetId, Replica
from hydrator.runtime.events import EventCycles
from tests.unit.factories import rep
from tests.unit.runtime.test_events import Catalogue, Listening, available, ds, lock_ok
from tests.unit.runtime.test_events import setup as setup  # the fixture, by its name


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


def wait_until(check: Any, what: str, timeout_s: float = 30.0) -> None:
    """Poll ``check`` until true; fail naming ``what`` after ``timeout_s`` (a bound, not a
    measurement)."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"not seen within {timeout_s} s: {what}")
        time.sleep(0.02)


def test_an_unexpected_error_in_a_targeted_read_is_a_failed_read_and_the_worker_goes_on(
    setup: Any, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    service, _catalogue, cycles, metrics, _now = setup
    source = Rejecting(rep("A", "obs1"))
    service.sources = [source]
    cycles.full_read()
    escaped: list[str] = []  # what threading.excepthook (which bypasses the formatter) saw
    monkeypatch.setattr(threading, "excepthook", lambda args: escaped.append(args.thread.name))
    worker = EventCycles(service, source, cycles.config, cycles.policy, clock=time.monotonic)
    worker.listener = Listening(ListenerStatus(False))
    worker.start()
    failed = {"source": "rucio", "outcome": "failed"}
    sample = metrics.registry.get_sample_value
    try:
        with caplog.at_level(logging.ERROR):
            worker.event(lock_ok("obs1"))
            wait_until(lambda: sample("hydrator_event_cycles_total", failed) == 1, "failed cycle")
        source.rejecting = False  # the next answer parses: the next message is applied
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
    logged = [r for r in caplog.records if r.exc_info and r.name == "hydrator.runtime.events"]
    assert len(logged) == 1  # once, with its traceback, through the logging handlers
    assert "unexpected error" in logged[0].getMessage()
    cycle_lines = [r.getMessage() for r in caplog.records if "cycle failed" in r.getMessage()]
    assert any("unexpected ValueError: unexpected token" in m for m in cycle_lines)


def test_the_failed_cycle_leaves_what_it_should_have_read_to_the_next_full_read(
    setup: Any,
) -> None:
    service, _catalogue, cycles, _metrics, now = setup
    source = Rejecting(rep("A", "obs1"))
    service.sources = [source]
    marked = EventCycles(service, source, cycles.config, cycles.policy, clock=lambda: now[0])
    marked.listener = cycles.listener
    marked.full_read()
    before = service.published.ads
    marked.event(lock_ok("obs1"))
    report = marked.event_cycle()
    assert report is not None and report.outcome == "failed"
    assert service.published.ads == before
    now[0] += 61  # interval_s, not the reconcile interval: the full read is marked
    assert marked.full_read_due()
