"""``hydrator run`` with ``[sources.events]`` on the real stack: the daemon subscribes at start,
reads everything once, then follows the stream between its (long) scheduled runs; what the
server's hermes sends reaches the HTTP ad within seconds; SIGTERM stops listener and daemon."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.support.activemq import DESTINATION, Broker
from tests.support.hermes import Hermes
from tests.support.prometheus import die_with_parent, free_port, stop, wait_for
from tests.support.rucio_server import RucioAdmin, RucioServer, unique

pytestmark = [pytest.mark.rucio, pytest.mark.activemq, pytest.mark.slow]

CONFIG = """\
[daemon]
interval_s = 600
jitter_s = 0
state_path = "{dir}/state.sqlite"

[http]
listen = "127.0.0.1:{port}"

[[sources]]
type = "rucio"
name = "rucio"
rucio_host = "{url}"
auth_host = "{url}"
account = "root"
auth_type = "userpass"
username = "{username}"
password_file = "{password_file}"
rse_expression = "rse_type=DISK&fed={tag}"
timeout_s = 5

[sources.events]
enabled = true
brokers = ["127.0.0.1:{broker_port}"]
destination = "{destination}"
client_id = "{client_id}"
username = "hydrator"
password_file = "{broker_password}"
heartbeat_s = 2
reconnect_initial_s = 0.2
reconnect_max_s = 1
event_debounce_s = 0.5
"""


@dataclass
class Running:
    base: str
    proc: subprocess.Popen[bytes]
    log: Path
    site: str
    dst: str
    src: str
    scope: str

    def get(self, path: str) -> Any:
        return requests.get(self.base + path, timeout=5).json()

    def metric(self, line: str) -> bool:
        return line in requests.get(self.base + "/metrics", timeout=5).text

    def value(self, series: str) -> float:
        """A sample's value in ``/metrics`` (0 when absent)."""
        for line in requests.get(self.base + "/metrics", timeout=5).text.splitlines():
            if line.startswith(series + " "):
                return float(line.split()[-1])
        return 0.0


@pytest.fixture()
def running(
    rucio_server: RucioServer,
    rucio_admin: RucioAdmin,
    running_activemq: Broker,
    tmp_path: Path,
) -> Iterator[Running]:
    tag = unique("d").lower()
    site, attrs = f"SITE-D-{tag}", {"fed": tag}
    dst, src = (
        rucio_admin.rse(site, attributes=attrs),
        rucio_admin.rse(f"SRC-{tag}", attributes=attrs),
    )
    port = free_port()
    config = tmp_path / "hydrator.toml"
    config.write_text(
        CONFIG.format(
            dir=tmp_path,
            port=port,
            url=rucio_server.url,
            username=rucio_server.username,
            password_file=rucio_server.password_file,
            tag=tag,
            broker_port=running_activemq.port,
            destination=DESTINATION,
            client_id=unique("hydrator-"),
            broker_password=running_activemq.password_file("hydrator"),
        )
    )
    log = tmp_path / "daemon.log"
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [*die_with_parent(), sys.executable, "-m", "hydrator", "run", "--config", str(config)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    made = Running(f"http://127.0.0.1:{port}", proc, log, site, dst, src, rucio_admin.scope())
    try:
        wait_for("ready", lambda: requests.get(made.base + "/readyz", timeout=2).ok, 60)
        yield made
    finally:
        stop(proc)


def test_the_daemon_follows_the_stream_between_full_reads(
    running: Running, rucio_admin: RucioAdmin, hermes: Hermes
) -> None:
    connected = 'hydrator_events_listener_connected{source="rucio"} 1.0'
    wait_for("subscribed", lambda: running.metric(connected), 30)
    name = rucio_admin.dataset(running.scope, 2, at=[running.src])
    rucio_admin.rule(running.scope, name, running.dst, notify="Y")
    did = f"{running.scope}:{name}"
    rucio_admin.set_file_states(
        running.dst, running.scope, rucio_admin.files(running.scope, name), "A"
    )
    sent = time.monotonic()
    hermes.run_once()

    def published() -> bool:
        return did in running.get(f"/v1/sites/{running.site}")["available"]

    wait_for("the dataset in the HTTP ad", published, 30)
    took = time.monotonic() - sent
    (entry,) = [s for s in running.get("/v1/sites")["sites"] if s["site"] == running.site]
    assert entry["origin"] == "event"
    assert took < 15, took  # interval_s is 600: only the event path can explain it
    assert running.value('hydrator_event_cycles_total{outcome="ok",source="rucio"}') >= 1
    assert running.value('hydrator_event_lag_seconds_count{source="rucio"}') >= 1
    running.proc.send_signal(15)
    assert running.proc.wait(30) == 0
    text = running.log.read_text()
    assert text.count("subscribed to /topic/rucio.events") == 1
    assert "Traceback" not in text
