"""Fixtures of the event-stream tests: the real broker, the real Rucio server and its hermes."""

from __future__ import annotations

import pytest

from tests.support.activemq import Broker, activemq_broker, running_activemq  # noqa: F401
from tests.support.hermes import Hermes
from tests.support.rucio_server import RucioServer, rucio_admin, rucio_server  # noqa: F401


@pytest.fixture(scope="session")
def hermes(rucio_server: RucioServer, activemq_broker: Broker) -> Hermes:  # noqa: F811
    """The session Rucio server's ``rucio-hermes``, delivering to the session broker."""
    daemon = Hermes(rucio_server, activemq_broker)
    daemon.setup()
    return daemon
