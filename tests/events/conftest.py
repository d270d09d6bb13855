"""Fixtures of the event-stream tests: the real broker, the real Rucio server and its hermes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.activemq import (  # noqa: F401
    Broker,
    activemq_broker,
    running_activemq,
)
from tests.support.hermes import EventDaemon, Hermes, running_event_daemon
from tests.support.rucio_server import (
    RucioAdmin,
    RucioServer,
    unique,
)


@pytest.fixture(scope="session")
def hermes(rucio_server: RucioServer, activemq_broker: Broker) -> Hermes:  # noqa: F811
    """The session Rucio server's ``rucio-hermes``, delivering to the session broker."""
    daemon = Hermes(rucio_server, activemq_broker)
    daemon.setup()
    return daemon


@pytest.fixture()
def daemon_site() -> str:
    """The site of the daemon's destination RSE (the pool tests use a slot's site)."""
    return f"SITE-D-{unique('s').lower()}"


@pytest.fixture()
def daemon_extra_config() -> str:
    """TOML appended to the daemon's configuration."""
    return ""


@pytest.fixture()
def running(
    rucio_server: RucioServer,
    rucio_admin: RucioAdmin,
    running_activemq: Broker,  # noqa: F811
    tmp_path: Path,
    daemon_site: str,
    daemon_extra_config: str,
) -> Iterator[EventDaemon]:
    """``hydrator run`` with events on (:func:`running_event_daemon`)."""
    with running_event_daemon(
        rucio_admin, running_activemq, tmp_path, daemon_site, daemon_extra_config
    ) as daemon:
        yield daemon
