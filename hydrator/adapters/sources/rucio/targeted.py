"""Targeted reads for event cycles (docs/events.md): the exact replicas of a few named
datasets, through the deep checks' path (:meth:`.deep.DeepChecks.exact_outcomes`: one
``list_dataset_replicas(deep=True)`` per dataset, or ``list_replicas`` where a site has rows
at several RSEs), at every site the last full read mapped, with the rules' transfers as that
read left them.

The book is read, never changed: the next full read settles from its own answers (the
published state equals a full read after it, whatever the events said).
"""

from __future__ import annotations

from collections.abc import Sequence

from hydrator.adapters.sources.rucio.book import Book, Cycle, Dataset
from hydrator.adapters.sources.rucio.deep import DeepChecks
from hydrator.domain import DatasetId, Replica
from hydrator.errors import TransientSourceError


def read_datasets(deep: DeepChecks, book: Book, datasets: Sequence[DatasetId]) -> list[Replica]:
    """This source's replicas of exactly ``datasets`` (none for a dataset found nowhere);
    raises a SourceError as a fetch does, or TransientSourceError before any full read."""
    if not book.rses.sites:
        raise TransientSourceError("rucio: no full read yet to re-read datasets against")
    cycle = Cycle(book.rses)
    sites = sorted(set(cycle.sites.values()))
    found: list[Replica] = []
    for dataset_id in datasets:
        dataset = book.datasets.get(dataset_id) or Dataset(dataset_id, dataset_id)
        for _site, _dataset, replica in deep.exact_outcomes(dataset, sites, book, cycle):
            if replica is not None:
                found.append(replica)
    return found
