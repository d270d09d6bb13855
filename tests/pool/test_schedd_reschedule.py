"""The reschedule step's call on the real pool: the pool's schedd accepts the request with
the daemon's token; a schedd that cannot be located is a PoolError naming it."""

from __future__ import annotations

import pytest

from hydrator.adapters.htcondor.schedd_reschedule import ScheddReschedule
from hydrator.config import CollectorConfig
from hydrator.errors import PoolError
from tests.support.pool import Pool

pytestmark = pytest.mark.pool


def config(pool: Pool) -> CollectorConfig:
    return CollectorConfig(enabled=True, pool=pool.collector_address, token_dir=pool.token_dir)


def test_every_schedd_the_collector_knows_is_asked(condor_pool: Pool) -> None:
    assert ScheddReschedule(config(condor_pool))() == 1
    assert ScheddReschedule(config(condor_pool), [condor_pool.schedd_name()])() == 1


def test_a_schedd_that_cannot_be_located_is_named(condor_pool: Pool) -> None:
    with pytest.raises(PoolError, match="no-such-schedd@nowhere: not in the collector"):
        ScheddReschedule(config(condor_pool), ["no-such-schedd@nowhere"])()
