"""Session fixtures shared by several test directories, defined once for the whole run.

A session fixture imported into two conftest files (or a conftest and a test module) is two
fixtures to pytest: the second ``condor_pool`` would wait, up to 900 s, for the pool lock the
first one holds, and the second ``rucio_server`` would start a server of its own. Here each is
one fixture: one pool and one Rucio server per run (``tests/support/pool.py``,
``tests/support/rucio_server.py``). Beside them, ``metrics``: the daemon's metrics on a
registry of their own, for a test to hand to what it builds and read back.
"""

import pytest
from prometheus_client import CollectorRegistry

from hydrator.runtime.metrics import Metrics
from tests.support.pool import condor_pool  # noqa: F401  (session fixture)
from tests.support.rucio_server import rucio_admin, rucio_server  # noqa: F401  (session fixtures)


@pytest.fixture
def metrics() -> Metrics:
    """Fresh metrics (their own registry): the service, the event cycles and the HTTP
    endpoint a test builds are handed these, and the test reads them."""
    return Metrics(CollectorRegistry())
