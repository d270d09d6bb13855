"""Replicas indexed by site, then dataset (:data:`Index`), and several reports of one
(site, dataset) merged into one (:func:`merge_replicas`, by
:func:`~hydrator.core.presence.combine`; :func:`merged_snapshot`, a source's answer).

The indexes the daemon holds between cycles are :mod:`hydrator.core.model`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from itertools import chain
from operator import attrgetter

from hydrator.core.presence import combine
from hydrator.domain import DatasetId, Replica, Site, Snapshot, StorageStatus

Index = dict[Site, dict[DatasetId, Replica]]
"""Site -> dataset -> replica: at most one replica per (site, dataset), and no site without
one (no empty inner dict), so two indexes of the same replicas are equal. Keyed per site
rather than by a ``(site, dataset)`` tuple: no key object per replica (the dataset is the
replica's own), smaller tables, a site's replicas at hand for its view."""


replica_key: Callable[[Replica], tuple[Site, DatasetId]] = attrgetter("site", "dataset")
"""``replica_key(r) == (r.site, r.dataset)``, without a Python call: for loops over every
replica."""


def index_size(index: Mapping[Site, Mapping[DatasetId, Replica]]) -> int:
    """How many replicas ``index`` holds."""
    return sum(map(len, index.values()))


def each_replica(index: Index) -> Iterator[Replica]:
    """Every replica of ``index``, site by site (a C-level chain: ``dict.values``)."""
    return chain.from_iterable(map(dict.values, index.values()))


def merge_replicas(replicas: Iterable[Replica]) -> Index:
    """Collapse reports to one per (site, dataset) with :func:`~hydrator.core.presence.combine`."""
    index: Index = {}
    for r in replicas:
        held = index.setdefault(r.site, {})
        old = held.get(r.dataset)
        held[r.dataset] = r if old is None else combine(old, r)
    return index


def merged_snapshot(
    source: str,
    replicas: Iterable[Replica],
    sites: Iterable[Site] = (),
    invalid: int = 0,
    unmapped: Iterable[str] = (),
    *,
    unmapped_more: int = 0,
    storages: Iterable[StorageStatus] = (),
) -> Snapshot:
    """:meth:`Snapshot.of <hydrator.domain.Snapshot.of>` for ``replicas`` that may report a
    (site, dataset) more than once: merged to one per pair first (:func:`merge_replicas`).
    ``sites`` and the sites of the replicas are the sites the snapshot covers."""
    index = merge_replicas(replicas)
    return Snapshot.of(
        source,
        frozenset(each_replica(index)),
        frozenset(sites).union(index),
        invalid,
        unmapped,
        sites_named=True,
        unmapped_more=unmapped_more,
        storages=storages,
    )
