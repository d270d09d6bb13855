"""The listener's state is live in ``/metrics`` whatever the cycles do (docs/events.md,
"Supervised threads"): ``hydrator run`` (a process, interval_s 600) on the real broker; the
broker is stopped, and ``hydrator_events_listener_connected`` reads 0 within 5 s with no
cycle run meanwhile, then 1 again once the broker is back."""

from __future__ import annotations

import pytest
import requests

from tests.support.activemq import Broker
from tests.support.hermes import EventDaemon
from tests.support.wait import wait_for

pytestmark = [pytest.mark.rucio, pytest.mark.activemq, pytest.mark.slow]

CONNECTED = 'hydrator_events_listener_connected{source="rucio"}'
CYCLES = ("ok", "degraded", "failed", "abandoned")


def cycles_run(daemon: EventDaemon) -> float:
    """Every cycle the daemon ran (full reads and event cycles), from its ``/metrics``."""
    full = sum(daemon.value(f'hydrator_cycles_total{{outcome="{o}"}}') for o in CYCLES)
    return full + daemon.value('hydrator_refresh_cycles_total{outcome="ok"}')


def test_a_broker_outage_shows_in_metrics_within_5_s_without_a_cycle(
    running: EventDaemon, running_activemq: Broker
) -> None:
    running.wait_subscribed()
    assert running.metric('hydrator_thread_alive{thread="events-worker-rucio"} 1.0')
    assert running.metric('hydrator_thread_alive{thread="events-listener-rucio"} 1.0')
    before = cycles_run(running)
    running_activemq.stop()
    wait_for(
        "the listener gauge at 0 in /metrics",
        lambda: running.metric(f"{CONNECTED} 0.0"),
        timeout_s=5.0,
        ignore=(requests.RequestException,),
    )
    assert cycles_run(running) == before  # no cycle wrote it: the connection change did
    assert (
        running.value(
            'hydrator_events_listener_disconnected_since_timestamp_seconds{source="rucio"}'
        )
        > 0
    )
    running_activemq.start()
    wait_for(
        "the listener gauge at 1 again",
        lambda: running.metric(f"{CONNECTED} 1.0"),
        timeout_s=60.0,  # the listener's reconnect backoff, not this promise's bound
        ignore=(requests.RequestException,),
    )
