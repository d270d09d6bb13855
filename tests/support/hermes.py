"""The test Rucio server's own ``rucio-hermes`` daemon, sending its ``messages`` table to a test
broker (:mod:`tests.support.activemq`) over STOMP, as a Rucio deployment does.

Hermes runs from the server's venv against the server's database with a configuration of its
own: a copy of the server's ``rucio.cfg`` plus ``[hermes]`` and ``[messaging-hermes]`` (the keys
``rucio/daemons/hermes/hermes.py`` 41.5.1 reads: ``services_list``; ``brokers``, ``port``,
``use_ssl``, ``nonssl_port``, ``username``, ``password``, ``destination``), so the shared
server's own file is never changed. Rules need ``notify="Y"`` for the server to queue
``datasetlock_ok`` and ``rule_ok`` (``rucio.core.rule.generate_rule_notifications``).
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import requests

from tests.support.activemq import DESTINATION, Broker
from tests.support.daemon import Daemon
from tests.support.process import die_with_parent, stop
from tests.support.rucio_server import RucioAdmin, RucioServer, unique
from tests.support.wait import wait_for

HERMES_CFG = """

[hermes]
services_list = activemq

[messaging-hermes]
brokers = 127.0.0.1
port = {port}
nonssl_port = {port}
use_ssl = False
username = hermes
password = {password}
destination = {destination}
"""


@dataclass
class Hermes:
    """``rucio-hermes`` for ``server``'s database, delivering to ``broker``."""

    server: RucioServer
    broker: Broker
    process: subprocess.Popen[bytes] | None = None  # while started as a daemon

    @property
    def config_path(self) -> Path:
        return self.broker.dir / f"rucio-hermes-{self.server.port}.cfg"

    def setup(self) -> None:
        text = self.server.config_path.read_text() + HERMES_CFG.format(
            port=self.broker.port,
            password=self.broker.passwords["hermes"],
            destination=DESTINATION,
        )
        self.config_path.write_text(text)
        self.config_path.chmod(0o600)

    def start(self, sleep_time_s: int = 1) -> None:
        """Run hermes as a daemon (``--sleep-time``: seconds between its passes) until
        :meth:`stop`; its log goes to ``hermes.log`` beside its configuration."""
        if not self.config_path.exists():
            self.setup()
        env = self.server.env()
        env["RUCIO_CONFIG"] = str(self.config_path)
        script = self.server.venv / "bin" / "rucio-hermes"
        with (self.config_path.parent / "hermes.log").open("ab") as out:
            self.process = subprocess.Popen(
                [
                    *die_with_parent(),
                    self.server.python,
                    str(script),
                    "--sleep-time",
                    str(sleep_time_s),
                ],
                env=env,
                cwd=self.server.dir,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is not None:
            stop(process)

    def run_once(self) -> str:
        """Deliver what the messages table holds (``rucio-hermes --run-once``, ~3-5 s); returns
        hermes' log. Raises when hermes fails or delivers nothing it retrieved."""
        if not self.config_path.exists():
            self.setup()
        env = self.server.env()
        env["RUCIO_CONFIG"] = str(self.config_path)
        script = self.server.venv / "bin" / "rucio-hermes"
        out = subprocess.run(
            [self.server.python, str(script), "--run-once"],
            env=env,
            cwd=self.server.dir,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=120,
            check=False,
        )
        if out.returncode != 0 or "Could not deliver" in out.stdout:
            raise RuntimeError(f"rucio-hermes failed ({out.returncode}):\n{out.stdout[-3000:]}")
        return out.stdout


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
event_debounce_s = {debounce_s}
"""


def transfer_done(scope: str, dataset: str, dst_rse: str) -> dict[str, Any]:
    """A ``transfer-done`` of ``dataset``'s first file as hermes sends it (the fields the
    hydrator reads, abridged): what the conveyor would queue, which needs FTS to happen."""
    return {
        "event_type": "transfer-done",
        "payload": {
            "scope": scope,
            "name": f"{dataset}.f000",
            "dataset": dataset,
            "datasetScope": scope,
            "dst-rse": dst_rse,
            "tool-id": "rucio-conveyor",
        },
        "created_at": datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S.%f"),
    }


@dataclass
class EventDaemon:
    """A ``hydrator run`` with events on (:meth:`start`, :meth:`stop`; the same state,
    port and durable subscription each time), and the RSEs it reads."""

    process: Daemon
    config: Path
    site: str
    dst: str
    src: str
    scope: str

    @property
    def base(self) -> str:
        return self.process.url

    @property
    def log(self) -> Path:
        return self.process.log

    @property
    def proc(self) -> subprocess.Popen[bytes] | None:
        return self.process.proc

    def start(self) -> None:
        self.process.start(self.config, ready_timeout_s=60.0)

    def stop(self) -> None:
        self.process.stop()

    def get(self, path: str) -> Any:
        return requests.get(self.base + path, timeout=5).json()

    def wait_subscribed(self) -> None:
        connected = 'hydrator_events_listener_connected{source="rucio"} 1.0'
        wait_for(
            "subscribed",
            lambda: self.metric(connected),
            timeout_s=30.0,
            ignore=(requests.RequestException,),
        )

    def lock_ok(self, admin: RucioAdmin) -> str:
        """A dataset of two files at ``src`` with a ``notify="Y"`` rule towards ``dst``, whose
        files then arrive there through the public API (the conveyor's part): the rule goes OK
        and the server queues ``datasetlock_ok`` and ``rule_ok``. Returns ``scope:name``."""
        name = admin.dataset(self.scope, 2, at=[self.src])
        admin.rule(self.scope, name, self.dst, notify="Y")
        admin.set_file_states(self.dst, self.scope, admin.files(self.scope, name), "A")
        return f"{self.scope}:{name}"

    def metric(self, line: str) -> bool:
        return line in requests.get(self.base + "/metrics", timeout=5).text

    def value(self, series: str) -> float:
        """A sample's value in ``/metrics`` (0 when absent)."""
        for line in requests.get(self.base + "/metrics", timeout=5).text.splitlines():
            if line.startswith(series + " "):
                return float(line.split()[-1])
        return 0.0


@contextlib.contextmanager
def running_event_daemon(
    admin: RucioAdmin,
    broker: Broker,
    directory: Path,
    site: str,
    extra_config: str = "",
    debounce_s: float = 0.5,
) -> Iterator[EventDaemon]:
    """``hydrator run`` (a subprocess) with ``[sources.events]`` on ``broker``, reading its own
    RSEs of ``admin``'s server (``dst`` at ``site``, ``src`` elsewhere), interval_s 600: only
    the stream explains a change seen within seconds. Stopped when the context exits."""
    server = admin.server
    tag = unique("d").lower()
    attrs = {"fed": tag}
    dst, src = admin.rse(site, attributes=attrs), admin.rse(f"SRC-{tag}", attributes=attrs)
    process = Daemon(directory)
    config = directory / "hydrator.toml"
    config.write_text(
        CONFIG.format(
            dir=directory,
            port=process.port,
            url=server.url,
            username=server.username,
            password_file=server.password_file,
            tag=tag,
            broker_port=broker.port,
            destination=DESTINATION,
            client_id=unique("hydrator-"),
            broker_password=broker.password_file("hydrator"),
            debounce_s=debounce_s,
        )
        + extra_config
    )
    made = EventDaemon(process, config, site, dst, src, admin.scope())
    try:
        made.start()
        yield made
    finally:
        made.stop()
