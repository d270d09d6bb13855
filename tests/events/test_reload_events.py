"""SIGHUP with a Rucio source that follows events, on the real stack (the test Rucio server, its
own ``rucio-hermes``, Debian's ActiveMQ, ``hydrator run`` as a subprocess).

A reload that keeps events on stops the listener with the old service and subscribes again
with the new one: a change the server's hermes sends afterwards reaches the HTTP ad in an event
cycle. A reload that turns events off leaves no STOMP connection to the broker and no
"connected" gauge behind.
"""

from __future__ import annotations

import signal
import subprocess
import time

import pytest
import requests

from tests.support.hermes import EventDaemon, Hermes
from tests.support.rucio_server import RucioAdmin
from tests.support.wait import wait_for

pytestmark = [pytest.mark.rucio, pytest.mark.activemq, pytest.mark.slow]

CONNECTED = 'hydrator_events_listener_connected{source="rucio"}'
FULL_READS = 'hydrator_source_fetch_duration_seconds_count{source="rucio"}'


def broker_connections(pid: int, port: int) -> int:
    """Established TCP connections of process ``pid`` to the broker's port (``ss -p``)."""
    out = subprocess.run(
        ["ss", "-Htnp", "state", "established", f"( dport = :{port} )"],
        capture_output=True,
        text=True,
        check=True,
        timeout=10,
    ).stdout
    return sum(f"pid={pid}," in line for line in out.splitlines())


def reload(daemon: EventDaemon, old: str, new: str, count: int) -> None:
    """Edit the configuration file, send SIGHUP, wait for the ``count``-th "reloaded" line."""
    text = daemon.config.read_text()
    assert old in text
    daemon.config.write_text(text.replace(old, new))
    assert daemon.proc is not None
    daemon.proc.send_signal(signal.SIGHUP)
    wait_for(
        "reloaded",
        lambda: daemon.log.read_text().count("reloaded: "),
        done=lambda got: got == count,
        timeout_s=60.0,
        ignore=(requests.RequestException,),
    )


def test_a_reload_keeps_following_the_stream_and_one_without_events_disconnects(
    running: EventDaemon, rucio_admin: RucioAdmin, hermes: Hermes
) -> None:
    running.wait_subscribed()
    wait_for(
        "the start-up full read",
        lambda: running.value(FULL_READS),
        done=lambda got: got == 1,
        timeout_s=60.0,
        ignore=(requests.RequestException,),
    )
    assert running.proc is not None
    pid, port = running.proc.pid, hermes.broker.port
    assert broker_connections(pid, port) == 1

    reload(running, "timeout_s = 5", "timeout_s = 6", 1)
    running.wait_subscribed()  # the new service's listener (the old one's gauge is gone)
    wait_for(
        "the reload's first full read",
        lambda: running.value(FULL_READS),
        done=lambda got: got == 2,
        timeout_s=60.0,
        ignore=(requests.RequestException,),
    )
    assert broker_connections(pid, port) == 1  # the old listener's connection is closed

    did = running.lock_ok(rucio_admin)
    sent = time.monotonic()
    hermes.run_once()  # the server's datasetlock_ok and rule_ok go to the broker

    def published() -> bool:
        return did in running.get(f"/v1/sites/{running.site}")["available"]

    wait_for(
        "the dataset in the HTTP ad after the reload",
        published,
        timeout_s=30.0,
        ignore=(requests.RequestException,),
    )
    took = time.monotonic() - sent
    (entry,) = [s for s in running.get("/v1/sites")["sites"] if s["site"] == running.site]
    assert entry["origin"] == "event"
    assert running.value(FULL_READS) == 2  # interval_s is 600: only an event cycle read it
    assert running.value('hydrator_event_cycles_total{outcome="ok",source="rucio"}') >= 1
    assert took < 15, took

    reload(running, "[sources.events]\nenabled = true", "[sources.events]\nenabled = false", 2)
    wait_for(
        "no STOMP connection left",
        lambda: broker_connections(pid, port),
        done=lambda got: got == 0,
        timeout_s=30.0,
        ignore=(requests.RequestException,),
    )
    assert not running.metric(CONNECTED)  # no "connected" series for an alert
    assert did in running.get(f"/v1/sites/{running.site}")["available"]  # still served
    running.proc.send_signal(signal.SIGTERM)
    assert running.proc.wait(30) == 0
    text = running.log.read_text()
    assert text.count("subscribed to /topic/rucio.events") == 2
    assert "Traceback" not in text
