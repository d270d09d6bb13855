"""Builds a :class:`~hydrator.runtime.service.Service` from a :class:`~hydrator.config.Config`.

Adapters are imported only when configured, so a static-only setup never imports rucio-clients
or talks to HTCondor.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from hydrator.adapters.htcondor import Publisher
from hydrator.adapters.sources import Source
from hydrator.adapters.state.sqlite import SqliteStateStore, StateLock, reset_state
from hydrator.config import Config, SourceConfig
from hydrator.core.jobs import AnnotateSettings, Annotator
from hydrator.errors import ConfigError, StateError
from hydrator.runtime.metrics import Metrics
from hydrator.runtime.service import Demand, Service

_SOURCE_MODULES = {
    "static": "hydrator.adapters.sources.static",
    "rucio": "hydrator.adapters.sources.rucio",
    "dmapi": "hydrator.adapters.sources.dmapi",
}


def build_source(config: SourceConfig, sites: Mapping[str, str]) -> Source:
    module: Any = importlib.import_module(_SOURCE_MODULES[config.type])
    source: Source = module.build(config, sites)
    return source


def build_publishers(config: Config) -> tuple[list[Publisher], Demand | None]:
    if not config.collector.enabled:
        return [], None
    if config.collector.token_dir is not None:
        # read by the HTCondor library when it first loads its configuration
        os.environ.setdefault("_CONDOR_SEC_TOKEN_DIRECTORY", str(config.collector.token_dir))
    module: Any = importlib.import_module("hydrator.adapters.htcondor.collector")
    publisher: Publisher = module.build(config.collector, config.classad)
    demand: Demand | None = getattr(publisher, "demand", None)
    return [publisher], demand


def build_annotator(config: Config) -> Annotator | None:
    """The job annotator of ``[jobs]`` (None when off); imports htcondor2 only when on."""
    if not config.jobs.annotate:
        return None
    module: Any = importlib.import_module("hydrator.adapters.htcondor.schedd_jobs")
    settings = AnnotateSettings(
        desired_sites=bool(config.jobs.desired_sites_attribute),
        overwrite_desired_sites=config.jobs.overwrite_desired_sites,
        max_edits=config.jobs.max_edits_per_cycle,
    )
    return Annotator(module.build(config.jobs, config.collector), settings)


def build_service(
    config: Config,
    metrics: Metrics | None = None,
    *,
    read_only: bool = False,
    reset: bool = False,
) -> Service:
    """Everything a cycle needs; raises ConfigError/StateError with a one-line message.

    A writer (``read_only`` false) first takes the state's :class:`StateLock`, held until
    :meth:`Service.close`; ``reset`` then moves the existing state file aside. A reader takes
    no lock and opens the state read-only (``hydrator once --dry-run``).
    """
    path = config.daemon.state_path
    if not path.parent.is_dir():
        raise StateError(f"daemon.state_path: directory {path.parent} does not exist")
    lock = None if read_only else StateLock(path)
    try:
        if reset:
            reset_state(path, datetime.now(UTC))
        store = SqliteStateStore(path, read_only=read_only, lock=lock)
    except BaseException:
        if lock is not None:
            lock.release()
        raise
    try:
        return _service(config, store, metrics)
    except BaseException:
        store.close()
        raise


def _service(config: Config, store: SqliteStateStore, metrics: Metrics | None) -> Service:
    sources = [build_source(s, config.sites) for s in config.sources]
    publishers, demand = build_publishers(config)
    if any(getattr(s, "datasets_from_queue", False) for s in config.sources) and demand is None:
        raise ConfigError(
            "sources.datasets_from_queue", "needs [collector] enabled = true to query the queue"
        )
    if config.classad.advertise == "demand" and demand is None:
        raise ConfigError(
            "classad.advertise", '"demand" needs [collector] enabled = true to read the queues'
        )
    # the collector publisher's CondorPoolProbe feeds the matchmaking-quality metrics
    probes = [getattr(p, "probe", None) for p in publishers]
    probe = probes[0] if probes and config.collector.locality_metrics else None
    return Service(
        config,
        sources=sources,
        store=store,
        publishers=publishers,
        metrics=metrics,
        demand=demand,
        probe=probe,
        annotator=build_annotator(config),
    )
