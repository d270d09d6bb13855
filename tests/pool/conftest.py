"""Tests on the real HTCondor pool: the ``condor_pool`` session fixture is defined once for
the whole run in ``tests/conftest.py`` (``tests/support/pool.py``)."""
