"""Targeted reads for event cycles (docs/events.md): the exact replicas of a few named
datasets at every site the last full read mapped, presence and transfers alike.

Per dataset, two calls: its rules as they are now (:func:`.rules.dataset_rule_transfers`:
``list_did_rules``, read first), then its files present through the deep checks' path
(:meth:`.deep.DeepChecks.exact_counts`: ``list_dataset_replicas(deep=True)``, or
``list_replicas`` where a site has rows at several RSEs). A rule done or deleted since the
last full read moves nothing: a dataset deleted at a site leaves every list there.

A ``deletion-done`` names a file, not its dataset: :func:`parent_datasets` asks
``list_parent_dids`` which datasets contain it (one call per file, at most
``MAX_PARENTS_PER_FILE`` kept), for the event cycle to re-read them.

The book is read, never changed: the next full read settles from its own answers (the
published state equals a full read after it, whatever the events said).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from hydrator.adapters.sources.rucio.book import Book, Cycle, Dataset
from hydrator.adapters.sources.rucio.deep import DeepChecks
from hydrator.adapters.sources.rucio.rules import dataset_rule_transfers
from hydrator.adapters.sources.rucio.wire import RucioWire
from hydrator.core.presence import NOTHING, exact, towards
from hydrator.domain import DatasetId, Replica
from hydrator.errors import TransientSourceError
from hydrator.names import InvalidNameError


def read_datasets(deep: DeepChecks, book: Book, datasets: Sequence[DatasetId]) -> list[Replica]:
    """This source's replicas of exactly ``datasets`` (none for a dataset found nowhere and
    moving nowhere), each with its rules' transfers as read now; raises a SourceError as a
    fetch does, or TransientSourceError before any full read."""
    if not book.rses.sites:
        raise TransientSourceError("rucio: no full read yet to re-read datasets against")
    cycle = Cycle(book.rses)
    sites = tuple(sorted(set(cycle.sites.values())))
    resolved: dict[str, frozenset[str]] = {}  # expressions resolved during this read
    found: list[Replica] = []
    for dataset_id in datasets:
        dataset = book.datasets.get(dataset_id) or Dataset(dataset_id, dataset_id)
        covered = dataset_rule_transfers(deep.wire, book, cycle, dataset_id, resolved)
        counted = deep.exact_counts(dataset, sites, cycle)
        for site in sites:
            moving = towards(covered, site)
            replica = exact(dataset_id, site, counted.get(site, NOTHING), moving)
            if replica is not None:
                found.append(replica)
    return found


MAX_PARENTS_PER_FILE = 100
"""Datasets kept per file from ``list_parent_dids`` (a file in more is an odd catalogue: the
rest are left to the full read)."""

log = logging.getLogger("hydrator.adapters.sources.rucio")


def parent_datasets(wire: RucioWire, files: Sequence[tuple[str, str]]) -> list[DatasetId]:
    """The datasets that directly contain each (scope, name) of ``files`` (containers and
    records that are not a valid dataset name are skipped); raises a SourceError."""
    found: dict[DatasetId, None] = {}
    for scope, name in files:
        kept = 0
        for record in wire.parent_dids(scope, name):
            if kept >= MAX_PARENTS_PER_FILE:
                log.warning("rucio: %s:%s is in more than %d datasets", scope, name, kept)
                break
            if not isinstance(record, dict) or str(record.get("type", "")).upper() != "DATASET":
                continue
            try:
                found[DatasetId(str(record["scope"]), str(record["name"]))] = None
            except (KeyError, InvalidNameError):
                log.warning("rucio: a parent of %s:%s is not a valid dataset name", scope, name)
                continue
            kept += 1
    return list(found)
