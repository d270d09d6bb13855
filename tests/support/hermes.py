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

import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.support.activemq import DESTINATION, Broker
from tests.support.rucio_server import RucioServer

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
