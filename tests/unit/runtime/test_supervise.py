"""Supervised threads (hydrator.runtime.supervise, docs/events.md "Supervised threads"): an
event-cycle worker that dies is logged through the logging handlers, shown in /readyz and
/metrics (served by the real HTTP server child), restarted after the configured wait and
counted; meanwhile the scheduled full read is due at interval_s."""

from __future__ import annotations

import logging
import threading
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import pytest

from hydrator.config import HttpConfig
from hydrator.core.event_hints import ListenerStatus
from hydrator.core.ports import FetchContext
from hydrator.domain import DatasetId, Replica
from hydrator.runtime.event_worker import EventCycles
from hydrator.runtime.http_endpoint import HttpEndpoint
from hydrator.runtime.supervise import Supervisor, log_thread_deaths
from tests.support.event_cycles import Catalogue, Listening, available, lock_ok, wait_until
from tests.unit.factories import rep


class Crash(BaseException):
    """What no ``except Exception`` stops: it ends the thread it is raised in."""


class Crashing(Catalogue):
    """A catalogue whose first targeted read ends the thread that makes it."""

    def __init__(self, *replicas: Replica) -> None:
        super().__init__(*replicas)
        self.crash = True

    def read_datasets(
        self, datasets: Sequence[DatasetId], context: FetchContext
    ) -> Iterable[Replica]:
        if self.crash:
            self.crash = False
            raise Crash("the worker ends here")
        return super().read_datasets(datasets, context)


class Threaded(Listening):
    """A subscribed listener whose thread the test ends (``running``); counts its starts."""

    def __init__(self) -> None:
        super().__init__(ListenerStatus(True, 999.0, 999.0))
        self.starts = 0
        self.running = False

    def start(self) -> None:
        self.starts += 1
        self.running = True

    def alive(self) -> bool:
        return self.running


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.fixture
def endpoint(setup: Any) -> Iterator[HttpEndpoint]:
    service, metrics = setup[0], setup[3]
    made = HttpEndpoint(service, HttpConfig(listen="127.0.0.1:0"), 300.0, metrics=metrics)
    made.start()
    yield made
    made.stop()


@pytest.mark.parametrize("setup", [Crashing(rep("A", "obs1"))], indirect=True)
def test_a_dead_worker_is_logged_shown_restarted_counted_and_polling_resumes(
    setup: Any,
    endpoint: HttpEndpoint,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    service, source, cycles, metrics, now = setup
    monkeypatch.setattr(threading, "excepthook", threading.excepthook)  # restored after
    log_thread_deaths()
    worker = EventCycles(
        service, source, cycles.config, cycles.policy, metrics=metrics, clock=lambda: now[0]
    )
    worker.listener = Threaded()
    supervisor = Supervisor(metrics, [1.0, 5.0], clock=lambda: now[0])
    supervisor.publish = endpoint.write_status
    endpoint.threads_down = supervisor.down
    for name, running, restart in worker.threads():
        supervisor.watch(name, running, restart)
    worker.full_read()
    worker.start()
    try:
        with caplog.at_level(logging.INFO):
            worker.event(lock_ok("obs1"))
            wait_until(lambda: not worker.worker_alive(), "the worker's end")
            supervisor.check()
            alive = {"thread": "events-worker-rucio"}  # the series' labels
            sample = metrics.registry.get_sample_value
            assert sample("hydrator_thread_alive", alive) == 0
            code, text = get(endpoint.port, "/readyz")
            assert code == 503 and "events-worker-rucio" in text
            assert (
                'hydrator_thread_alive{thread="events-worker-rucio"} 0.0'
                in (get(endpoint.port, "/metrics")[1])
            )
            # until it is back, the full read is due at interval_s, not the reconcile interval
            now[0] += 61
            assert worker.full_read_due()
            now[0] -= 61
            supervisor.check()  # before the first wait: not yet
            assert sample("hydrator_thread_restarts_total", alive) is None
            now[0] += 1.0
            supervisor.check()  # restarted
            wait_until(worker.worker_alive, "the restarted worker")
            supervisor.check()  # seen back
        assert sample("hydrator_thread_restarts_total", alive) == 1
        assert sample("hydrator_thread_alive", alive) == 1
        code, text = get(endpoint.port, "/readyz")
        assert code == 200, text
        # the restarted worker applies what comes next
        source.replicas.add(rep("B", "obs2"))
        worker.event(lock_ok("obs2"))
        wait_until(lambda: available(service, "B") == ["ska:obs2"], "obs2 at B")
    finally:
        worker.stop()
    deaths = [r for r in caplog.records if "ended with an unexpected error" in r.getMessage()]
    assert len(deaths) == 1 and deaths[0].exc_info is not None
    assert "events-worker-rucio" in deaths[0].getMessage()
    lines = [r.getMessage() for r in caplog.records if r.name == "hydrator.runtime.supervise"]
    assert lines == [
        "thread events-worker-rucio ended with an unexpected error",
        "thread events-worker-rucio is not running: restarting it in 1 s",
        "restarting thread events-worker-rucio (restart 1 in a row)",
        "thread events-worker-rucio is running again",
    ]


def test_a_listener_whose_thread_ends_is_started_again(setup: Any) -> None:
    service, catalogue, cycles, metrics, now = setup

    listener = Threaded()
    watched = EventCycles(
        service, catalogue, cycles.config, cycles.policy, metrics=metrics, clock=lambda: now[0]
    )
    watched.listener = listener
    supervisor = Supervisor(metrics, [2.0], clock=lambda: now[0])
    for name, alive, restart in watched.threads():
        supervisor.watch(name, alive, restart)
    watched.start()
    try:
        listener.running = False  # its thread ended
        supervisor.check()
        assert supervisor.down() == ["events-listener-rucio"]
        now[0] += 2
        supervisor.check()
        assert listener.starts == 2
        supervisor.check()
        assert supervisor.down() == []
        labels = {"thread": "events-listener-rucio"}
        assert metrics.registry.get_sample_value("hydrator_thread_restarts_total", labels) == 1
    finally:
        watched.stop()
