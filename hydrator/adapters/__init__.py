"""Adapters: one sub-package per external system, each translating its errors at the boundary.

``sources`` (catalogues: Rucio, DMAPI, static file), ``htcondor`` (collector, queues, schedds),
``state`` (the SQLite state file), ``http`` (the aiohttp server process), ``events`` (Rucio's
event stream over STOMP); ``retry.py`` is the bounded retries the sources share (the one module
importing tenacity). Adapters import the core and the domain, never each other and never
:mod:`hydrator.runtime` (``lint-imports``).
"""
