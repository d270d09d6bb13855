"""Replicas indexed by site, then dataset (:data:`Index`), and several reports of one
(site, dataset) merged into one (:func:`merge_replicas`, by
:func:`~hydrator.core.presence.combine`; :func:`merged_snapshot`, a source's answer).

The core builds an index only where several sources merge, or where a source's replicas
must be looked up by site (:mod:`hydrator.core.model` holds them between cycles); a
one-source daemon works from its set and its delta, and holds none.
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
    """Collapse reports to one per (site, dataset) with :func:`~hydrator.core.presence.combine`."""
    index: Index = {}  # no key object per replica
    for r in replicas:  # by position: no attribute lookup per replica
        held = index.get(r[1])
        if held is None:
            held = index[r[1]] = {}
        old = held.get(r[0])
        held[r[0]] = r if old is None else combine(old, r)
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
