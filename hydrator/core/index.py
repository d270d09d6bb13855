"""Replicas indexed by site, then dataset (:data:`Index`), and several reports of one
(site, dataset) merged into one (:func:`merge_replicas`, by :func:`~hydrator.domain.combine`).

The core builds an index only where several sources merge, or where a source's replicas
must be looked up by site (:mod:`hydrator.core.derived` holds them between cycles); a
one-source daemon works from its set and its delta, and holds none (issue 15).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from itertools import chain

from hydrator.domain import DatasetId, Replica, Site, combine

Index = dict[Site, dict[DatasetId, Replica]]
"""Site -> dataset -> replica: at most one replica per (site, dataset), and no site without
one (no empty inner dict), so two indexes of the same replicas are equal. Keyed per site
rather than by a ``(site, dataset)`` tuple: no key object per replica (the dataset is the
replica's own), smaller tables, a site's replicas at hand for its view (issue 15)."""


def index_of(replicas: Iterable[Replica]) -> Index:
    """The :data:`Index` of ``replicas``, which hold one replica per (site, dataset)."""
    index: Index = {}
    at_site = index.get
    for replica in replicas:  # indexing by position: no attribute lookup per replica
        found = at_site(replica[1])
        if found is None:
            found = index[replica[1]] = {}
        found[replica[0]] = replica
    return index


def index_size(index: Mapping[Site, Mapping[DatasetId, Replica]]) -> int:
    """How many replicas ``index`` holds."""
    return sum(map(len, index.values()))


def each_replica(index: Index) -> Iterator[Replica]:
    """Every replica of ``index``, site by site (a C-level chain: ``dict.values``)."""
    return chain.from_iterable(map(dict.values, index.values()))


def merge_replicas(replicas: Iterable[Replica]) -> Index:
    """Collapse reports to one per (site, dataset) with :func:`~hydrator.domain.combine`."""
    index: Index = {}
    for r in replicas:
        found = index.get(r.site)
        if found is None:
            found = index[r.site] = {}
        old = found.get(r.dataset)
        found[r.dataset] = r if old is None else combine(old, r)
    return index
