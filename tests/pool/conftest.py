"""Fixtures for tests on the real HTCondor pool (``tests/support/pool.py``)."""

from tests.support.pool import condor_pool  # noqa: F401  (session fixture)
