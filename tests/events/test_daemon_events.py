"""``hydrator run`` with ``[sources.events]`` on the real stack: the daemon subscribes at start,
reads everything once, then follows the stream between its (long) scheduled runs; what the
server's hermes sends reaches the HTTP ad within seconds; SIGTERM stops listener and daemon."""

from __future__ import annotations

import time

import pytest
import requests

from tests.support.hermes import EventDaemon, Hermes
from tests.support.rucio_server import RucioAdmin
from tests.support.wait import wait_for

pytestmark = [pytest.mark.rucio, pytest.mark.activemq, pytest.mark.slow]


def test_the_daemon_follows_the_stream_between_full_reads(
    running: EventDaemon, rucio_admin: RucioAdmin, hermes: Hermes
) -> None:
    running.wait_subscribed()
    did = running.lock_ok(rucio_admin)
    sent = time.monotonic()
    hermes.run_once()

    def published() -> bool:
        return did in running.get(f"/v1/sites/{running.site}")["available"]

    wait_for(
        "the dataset in the HTTP ad", published, timeout_s=30.0, ignore=(requests.RequestException,)
    )
    took = time.monotonic() - sent
    (entry,) = [s for s in running.get("/v1/sites")["sites"] if s["site"] == running.site]
    assert entry["origin"] == "event"
    assert took < 15, took  # interval_s is 600: only the event path can explain it
    assert running.value('hydrator_event_cycles_total{outcome="ok",source="rucio"}') >= 1
    assert running.value('hydrator_event_lag_seconds_count{source="rucio"}') >= 1
    assert running.proc is not None
    running.proc.send_signal(15)
    assert running.proc.wait(30) == 0
    text = running.log.read_text()
    assert text.count("subscribed to /topic/rucio.events") == 1
    assert "Traceback" not in text
