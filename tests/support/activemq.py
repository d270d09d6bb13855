"""A real ActiveMQ broker (Debian's ``activemq`` 5.17, installed by ``scripts/activemq install``)
with a STOMP connector on 127.0.0.1, for the event-stream tests.

Each broker runs in a private temporary directory (its ``activemq.xml``, log and KahaDB data,
so durable subscriptions and queued messages survive :meth:`Broker.restart`) on a free port,
in its own process group; :meth:`Broker.stop` stops the JVM (SIGTERM, then SIGKILL) and
``setpriv --pdeathsig`` stops it if the test process dies. Two users, with the ACL that
docs/events.md recommends: ``hermes`` may only write the events topic (Rucio's side),
``hydrator`` may only read it (a durable subscriber; it can neither write nor create it).

Use from any test directory::

    from tests.support.activemq import activemq_broker  # noqa: F401  (session fixture)

Run ``python -m tests.support.activemq`` (or ``scripts/activemq serve``) for a broker in the
foreground.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import stomp

from tests.support.ports import free_port
from tests.support.process import die_with_parent, serve_in_foreground, stop_group

REPO = Path(__file__).resolve().parents[2]
JAR = Path("/usr/share/activemq/bin/activemq.jar")
TOPIC = "rucio.events"  # Rucio's destination at large instances: /topic/rucio.events
DESTINATION = f"/topic/{TOPIC}"
START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 20.0

ACTIVEMQ_XML = """\
<beans xmlns="http://www.springframework.org/schema/beans"
  xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"
  xsi:schemaLocation="http://www.springframework.org/schema/beans
    http://www.springframework.org/schema/beans/spring-beans-2.0.xsd
    http://activemq.apache.org/schema/core
    http://activemq.apache.org/schema/core/activemq-core.xsd">
  <broker xmlns="http://activemq.apache.org/schema/core" useJmx="false"
          brokerName="hydrator-test" dataDirectory="{dir}/data" schedulerSupport="false">
    <destinations><topic physicalName="{topic}"/></destinations>
    <persistenceAdapter><kahaDB directory="{dir}/data/kahadb"/></persistenceAdapter>
    <systemUsage><systemUsage>
      <memoryUsage><memoryUsage limit="32 mb"/></memoryUsage>
      <storeUsage><storeUsage limit="1 gb"/></storeUsage>
      <tempUsage><tempUsage limit="256 mb"/></tempUsage>
    </systemUsage></systemUsage>
    <plugins>
      <simpleAuthenticationPlugin anonymousAccessAllowed="false">
        <users>
          <authenticationUser username="hermes" password="{hermes}" groups="writers"/>
          <authenticationUser username="hydrator" password="{hydrator}" groups="readers"/>
        </users>
      </simpleAuthenticationPlugin>
      <authorizationPlugin><map><authorizationMap><authorizationEntries>
        <authorizationEntry topic="{topic}" read="readers" write="writers" admin="writers"/>
        <authorizationEntry topic="ActiveMQ.Advisory.>"
            read="readers,writers" write="readers,writers" admin="readers,writers"/>
      </authorizationEntries></authorizationMap></map></authorizationPlugin>
    </plugins>
    <transportConnectors>
      <transportConnector name="stomp" uri="stomp://127.0.0.1:{port}"/>
    </transportConnectors>
  </broker>
</beans>
"""

LOG4J = """\
log4j.rootLogger=INFO, file
log4j.appender.file=org.apache.log4j.FileAppender
log4j.appender.file.File={dir}/activemq.log
log4j.appender.file.layout=org.apache.log4j.PatternLayout
log4j.appender.file.layout.ConversionPattern=%d | %-5p | %m | %c%n
"""


def ensure_activemq() -> None:
    """Install Debian's activemq if missing (``scripts/activemq install``; quick when there)."""
    subprocess.run([str(REPO / "scripts" / "activemq"), "install"], check=True)


@dataclass
class Broker:
    """One broker JVM with its own directory, port and users' passwords."""

    dir: Path
    port: int = field(default_factory=free_port)
    passwords: dict[str, str] = field(
        default_factory=lambda: {u: secrets.token_urlsafe(12) for u in ("hermes", "hydrator")}
    )
    process: subprocess.Popen[bytes] | None = None
    start_s: float = 0.0  # how long the last start took, seconds

    def setup(self) -> None:
        """Write the configuration and the users' password files (mode 0600)."""
        (self.dir / "data").mkdir(parents=True, exist_ok=True)
        xml = ACTIVEMQ_XML.format(dir=self.dir, topic=TOPIC, port=self.port, **self.passwords)
        (self.dir / "activemq.xml").write_text(xml)
        (self.dir / "log4j.properties").write_text(LOG4J.format(dir=self.dir))
        for user, password in self.passwords.items():
            path = self.password_file(user)
            path.write_text(password + "\n")
            path.chmod(0o600)

    def password_file(self, user: str) -> Path:
        return self.dir / f"{user}-password"

    def start(self) -> None:
        """Start the JVM and wait until the STOMP port accepts connections (~5-15 s)."""
        if self.process is not None:
            raise RuntimeError("broker already running")
        started = time.monotonic()
        d = self.dir
        command = [
            *die_with_parent(),
            "java",
            "-Xms64M",
            "-Xmx128M",
            "-Djava.awt.headless=true",
            f"-Dactivemq.base={d}",
            "-Dactivemq.home=/usr/share/activemq",
            f"-Dactivemq.conf={d}",
            f"-Dactivemq.data={d}/data",
            f"-Dlog4j.configuration=file:{d}/log4j.properties",
            "-jar",
            str(JAR),
            "start",
            f"xbean:file:{d}/activemq.xml",
        ]
        with (d / "stdout.log").open("ab") as out:
            self.process = subprocess.Popen(
                command,
                cwd=d,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        try:
            self._wait_ready(started)
        except BaseException:
            self.stop()
            raise
        self.start_s = time.monotonic() - started

    def _wait_ready(self, started: float) -> None:
        assert self.process is not None
        while time.monotonic() - started < START_TIMEOUT_S:
            if self.process.poll() is not None:
                raise RuntimeError(f"broker exited ({self.process.returncode}):\n{self.log_tail()}")
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), 1),
            ):
                return
            time.sleep(0.2)
        raise RuntimeError(f"broker not listening after {START_TIMEOUT_S} s:\n{self.log_tail()}")

    def stop(self) -> None:
        """Stop the JVM and its process group; idempotent. The data directory stays."""
        process, self.process = self.process, None
        if process is not None:
            stop_group(process, STOP_TIMEOUT_S)

    def restart(self) -> None:
        self.stop()
        self.start()

    def log_tail(self, chars: int = 3000) -> str:
        text = ""
        for name in ("stdout.log", "activemq.log"):
            path = self.dir / name
            if path.exists():
                text += path.read_text(errors="replace")[-chars:]
        return text

    def connect(self, user: str, **headers: str) -> stomp.Connection12:
        """A connected stomp-py client as ``user`` (the caller disconnects it)."""
        conn = stomp.Connection12([("127.0.0.1", self.port)], heartbeats=(0, 0))
        conn.connect(user, self.passwords[user], wait=True, headers=headers)
        return conn

    def publish_as_hermes(self, messages: Sequence[Mapping[str, Any]]) -> None:
        """Send ``messages`` as ``rucio-hermes`` 41.5.1 does (``deliver_to_activemq``): body
        ``{"event_type": <lowercased>, "payload": {...}, "created_at": str(datetime)}``,
        headers ``persistent: true`` and ``event_type``. For events the test server cannot
        emit (``transfer-*`` needs FTS, ``deletion-*`` the reaper on real storage): tests
        that use it say so."""
        conn = self.connect("hermes")
        try:
            for message in messages:
                event_type = str(message["event_type"]).lower()
                body = {
                    "event_type": event_type,
                    "payload": message["payload"],
                    "created_at": str(message["created_at"]),
                }
                conn.send(
                    body=json.dumps(body),
                    destination=DESTINATION,
                    headers={"persistent": "true", "event_type": event_type},
                )
        finally:
            conn.disconnect()


def make_broker() -> Broker:
    """Create, set up and start a broker in a new private directory (caller stops it and
    removes ``broker.dir``)."""
    ensure_activemq()
    directory = Path(tempfile.mkdtemp(prefix="hydrator-activemq-"))
    directory.chmod(0o700)
    broker = Broker(directory)
    try:
        broker.setup()
        broker.start()
    except BaseException:
        broker.stop()
        shutil.rmtree(directory, ignore_errors=True)
        raise
    return broker


@contextlib.contextmanager
def running_broker() -> Iterator[Broker]:
    """A private broker; stopped and its directory removed when the context exits."""
    broker = make_broker()
    try:
        yield broker
    finally:
        broker.stop()
        shutil.rmtree(broker.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def activemq_broker() -> Iterator[Broker]:
    """A running broker for the whole session (tests that stop it start it again)."""
    with running_broker() as broker:
        yield broker


@pytest.fixture()
def running_activemq(activemq_broker: Broker) -> Iterator[Broker]:
    """The session broker, guaranteed running before and after the test (outage tests)."""
    if activemq_broker.process is None:
        activemq_broker.start()
    yield activemq_broker
    if activemq_broker.process is None:
        activemq_broker.start()


def main(argv: Sequence[str] | None = None) -> int:
    """Serve in the foreground until interrupted; print how to reach the broker."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=None)
    args = parser.parse_args(argv)
    ensure_activemq()
    directory = Path(tempfile.mkdtemp(prefix="hydrator-activemq-"))
    broker = Broker(directory, **({"port": args.port} if args.port else {}))
    return serve_in_foreground(
        broker,
        directory,
        lambda: (
            f"ActiveMQ STOMP at 127.0.0.1:{broker.port}, destination {DESTINATION} "
            f"(started in {broker.start_s:.1f} s)\n"
            f"users: hermes (write) {broker.password_file('hermes')}, "
            f"hydrator (read) {broker.password_file('hydrator')}"
        ),
    )


if __name__ == "__main__":
    sys.exit(main())
