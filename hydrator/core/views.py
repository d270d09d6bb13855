"""Building a site's view (:class:`~hydrator.domain.SiteView`): the sorted lists its ClassAd
carries and their digest, from replicas (:func:`views_of`, :func:`site_contents`) or from the
previous view and the changes at its site (:func:`patch_view`); the digests that let
publishers skip a site whose ad says nothing new (:func:`content_digest`,
:func:`stuck_digest`).

The views the daemon holds between cycles are in :mod:`hydrator.core.model`; what each ad
then carries (demand, size) is :mod:`hydrator.core.advertise`.
"""

from __future__ import annotations

import hashlib
from bisect import bisect_left
from collections.abc import Callable, Iterable
from operator import itemgetter
from typing import TypeVar

from hydrator.core.index import Index, each_replica
from hydrator.domain import Change, DatasetId, Replica, ReplicaState, Site, SiteView, Transfer

_first = itemgetter(0)  # a (dataset, share) pair's dataset


def _itself(dataset: DatasetId) -> DatasetId:
    return dataset


def site_contents(merged: Index, sites: frozenset[Site]) -> dict[Site, SiteView]:
    """Per site, the sorted lists that make its ClassAd, and their digest (``merged``: an
    :data:`Index`)."""
    return views_of(each_replica(merged), sites)


def views_of(replicas: Iterable[Replica], sites: frozenset[Site]) -> dict[Site, SiteView]:
    """:func:`site_contents` of ``replicas`` (one per (site, dataset)), in one pass over them."""
    lists = {site: _SiteLists() for site in sites}
    at_site, available = lists.get, ReplicaState.AVAILABLE
    for replica in replicas:
        found = at_site(replica[1])
        if found is None:
            continue
        if replica[2] is available and replica[4] is None:  # most: no call
            found.available.append(replica[0])
        else:
            found.add(replica[0], replica)
    return {site: lists[site].view(site) for site in sorted(sites)}


def patch_view(view: SiteView, changes: Iterable[Change]) -> SiteView:
    """``view`` (``updated`` left None) with its site's ``changes`` applied: equal to
    rebuilding it with :func:`site_contents`, at the cost of the changes plus a C-level copy
    and a sort of nearly sorted lists, instead of a Python loop over every replica."""
    lists = _SiteLists()
    gone: dict[ReplicaState | Transfer, list[DatasetId]] = {
        key: [] for key in (*ReplicaState, *Transfer)
    }
    sized: list[DatasetId] = []  # partial entries with a bytes share of their own
    for change in changes:
        old = change.old
        if old is not None:
            gone[old.state].append(change.dataset)
            if old.state is not ReplicaState.REPLICATING:  # absent ones: in replicating
                gone[old.transfer].append(change.dataset)
            if old.state is ReplicaState.PARTIAL and old.bytes_fraction != old.fraction:
                sized.append(change.dataset)
        if change.new is not None:
            lists.add(change.dataset, change.new)
    lists.available += _without(view.available, gone[ReplicaState.AVAILABLE], _itself)
    lists.partial += _without(view.partial, gone[ReplicaState.PARTIAL], _first)
    lists.partial_bytes += _without(view.partial_bytes, sized, _first)
    lists.replicating += _without(view.replicating, gone[ReplicaState.REPLICATING], _first)
    lists.incoming += _without(view.incoming, gone[Transfer.REPLICATING], _first)
    lists.stuck += _without(view.stuck, gone[Transfer.STUCK], _itself)
    return lists.view(view.site)


_T = TypeVar("_T")


def _without(
    items: tuple[_T, ...], removed: list[DatasetId], key: Callable[[_T], DatasetId]
) -> list[_T]:
    """``items`` (sorted by dataset, one entry per dataset; ``key`` gives an entry's dataset)
    without the ``removed`` datasets."""
    if not removed:
        return list(items)
    cuts: list[int] = []
    for d in removed:
        cut = bisect_left(items, d, key=key)
        if cut == len(items) or key(items[cut]) != d:
            raise RuntimeError(f"site view out of step: {d} not listed")  # a bug, never data
        cuts.append(cut)
    cuts.sort()
    out: list[_T] = []
    start = 0
    for cut in cuts:
        out += items[start:cut]
        start = cut + 1
    out += items[start:]
    return out


class _SiteLists:
    """One site's datasets by list while :func:`site_contents` collects them.

    Plain attributes and identity tests, not a dict keyed by the enum, and no
    (dataset, fraction) pair for the available ones, which are most: a large share of a
    full build's time and garbage (:mod:`hydrator.core.model` keeps the figures).
    """

    __slots__ = ("available", "incoming", "partial", "partial_bytes", "replicating", "stuck")

    def __init__(self) -> None:
        self.available: list[DatasetId] = []
        self.partial: list[tuple[DatasetId, float]] = []
        self.partial_bytes: list[tuple[DatasetId, float]] = []
        self.replicating: list[tuple[DatasetId, float]] = []
        self.incoming: list[tuple[DatasetId, float]] = []
        self.stuck: list[DatasetId] = []

    def add(self, dataset: DatasetId, replica: Replica) -> None:
        state, detail = replica.state, replica.detail
        if state is ReplicaState.AVAILABLE:
            self.available.append(dataset)
        elif state is ReplicaState.PARTIAL:
            self.partial.append((dataset, replica.fraction))
            if detail is not None and detail.bytes_fraction != replica.fraction:
                self.partial_bytes.append((dataset, detail.bytes_fraction))
        elif state is ReplicaState.REPLICATING:
            self.replicating.append((dataset, replica.progress))
            return
        if detail is None or detail.transfer is Transfer.NONE:
            return
        if detail.transfer is Transfer.STUCK:
            self.stuck.append(dataset)
        else:
            self.incoming.append((dataset, detail.progress))

    def view(self, site: Site) -> SiteView:
        # DatasetId is a tuple (scope, name): sorting compares in C, in DatasetId's order; a
        # dataset appears once per site, so (dataset, share) pairs never compare the share.
        self.available.sort()
        available = tuple(self.available)
        partial = tuple(sorted(self.partial))
        replicating = tuple(sorted(self.replicating))
        return SiteView(
            site=site,
            available=available,
            partial=partial,
            replicating=replicating,
            stuck=tuple(sorted(self.stuck)),
            updated=None,
            digest=content_digest(site, available, partial, replicating),
            partial_bytes=tuple(sorted(self.partial_bytes)),
            incoming=tuple(sorted(self.incoming)),
        )


def content_digest(
    site: Site,
    available: tuple[DatasetId, ...],
    partial: tuple[tuple[DatasetId, float], ...],
    replicating: tuple[tuple[DatasetId, float], ...],
) -> str:
    """A short hash of what a site's ClassAd lists (not of its timestamp): it changes iff the
    ad's lists change, so publishers can skip targets that already carry it. Persisted in the
    collector's ads: its bytes must never change (a SHA-256 of the site, then per list a label
    and each ``scope:name`` after a newline), hashed one list at a time: a C-level join, as
    DatasetId is the tuple ``(scope, name)``."""
    h = hashlib.sha256(site.encode())
    for label, names in (
        (b"A", available),
        (b"P", map(_first, partial)),
        (b"R", map(_first, replicating)),
    ):
        h.update(b"\0" + label)
        joined = "\n".join(map(":".join, names))  # no name is empty: "" is no entry
        if joined:
            h.update(b"\n" + joined.encode())
    return h.hexdigest()[:16]


def stuck_digest(digest: str, stuck: Iterable[DatasetId]) -> str:
    """``digest`` extended with the stuck transfers, for ads that also list those (always
    different from ``digest``, so turning the list on re-sends every ad once)."""
    h = hashlib.sha256(digest.encode() + b"\0S")
    for d in stuck:
        h.update(f"\n{d.scope}:{d.name}".encode())
    return h.hexdigest()[:16]
