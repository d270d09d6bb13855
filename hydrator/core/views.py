"""A site's view (:class:`~hydrator.domain.SiteView`): the sorted lists its ClassAd carries
and their digest, built from replicas (:func:`site_contents`, the plain computation, with
:class:`SiteLists`); the digests that let publishers skip a site whose ad says nothing new
(:func:`content_digest`; :func:`extended_digest` folds in what an ad carries beyond the
lists, each attribute under its own tag, :data:`DIGEST_TAGS`).

The views the daemon holds between cycles, built faster and patched by each cycle's changes,
are :mod:`hydrator.core.model`'s; what each ad then carries (demand, size) is
:mod:`hydrator.core.advertise`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from operator import itemgetter
from typing import Literal, get_args

from hydrator.core.index import Index, each_replica
from hydrator.domain import DatasetId, Replica, ReplicaState, Site, SiteView, Transfer

_first = itemgetter(0)  # a (dataset, share) pair's dataset


def site_contents(merged: Index, sites: frozenset[Site]) -> dict[Site, SiteView]:
    """Per site of ``sites``, the sorted lists that make its ClassAd, and their digest
    (``merged``: an :data:`Index`; its replicas at other sites are left out). The plain
    computation: :mod:`hydrator.core.model` builds the same views from a set of replicas
    (no index) and patches them with each cycle's changes."""
    lists = {site: SiteLists() for site in sites}
    for replica in each_replica(merged):
        found = lists.get(replica.site)
        if found is not None:
            found.add(replica.dataset, replica)
    return {site: lists[site].view(site) for site in sorted(sites)}


ListName = Literal["available", "partial", "partial_bytes", "replicating", "incoming", "stuck"]
"""A list of a site's view: the name of its field on :class:`~hydrator.domain.SiteView` and
on :class:`SiteLists`."""

Entry = DatasetId | tuple[DatasetId, float]
"""One entry of a list: a dataset, or a (dataset, share or progress) pair."""

LISTS: tuple[ListName, ...] = get_args(ListName)
"""Every list of a site's view."""


class SiteLists:
    """One site's datasets by list while a view is collected (:func:`site_contents`, and
    :mod:`hydrator.core.model`'s builds and patches): :meth:`add` each replica, then
    :meth:`view`. Which lists a replica goes into is :meth:`entries_of`, and only there."""

    __slots__ = ("available", "incoming", "partial", "partial_bytes", "replicating", "stuck")

    def __init__(self) -> None:
        self.available: list[DatasetId] = []
        self.partial: list[tuple[DatasetId, float]] = []
        self.partial_bytes: list[tuple[DatasetId, float]] = []
        self.replicating: list[tuple[DatasetId, float]] = []
        self.incoming: list[tuple[DatasetId, float]] = []
        self.stuck: list[DatasetId] = []

    @staticmethod
    def entries_of(dataset: DatasetId, replica: Replica) -> tuple[tuple[ListName, Entry], ...]:
        """The entries ``replica`` (of ``dataset``) makes in its site's lists, as (list,
        entry) pairs: the one statement of which lists a replica goes into (:meth:`add` adds
        them; the model's patches remove an old replica's again). Presence first: complete
        in ``available``; partial in ``partial`` with its share of files, and in
        ``partial_bytes`` with its share of bytes where that differs; absent with an active
        transfer in ``replicating`` with the transfer's progress, and nowhere else. Then the
        transfer of any other: stuck in ``stuck``, active in ``incoming`` with its progress.
        An available replica with no detail (most of them) makes its dataset in
        ``available`` alone."""
        state, detail = replica.state, replica.detail
        present: tuple[tuple[ListName, Entry], ...]
        if state is ReplicaState.AVAILABLE:
            present = (("available", dataset),)
        elif state is ReplicaState.PARTIAL:
            present = (("partial", (dataset, replica.fraction)),)
            if detail is not None and detail.bytes_fraction != replica.fraction:
                present += (("partial_bytes", (dataset, detail.bytes_fraction)),)
        elif state is ReplicaState.REPLICATING:
            return (("replicating", (dataset, replica.progress)),)
        else:  # stuck: absent, listed by its transfer alone
            present = ()
        if detail is None or detail.transfer is Transfer.NONE:
            return present
        if detail.transfer is Transfer.STUCK:
            return (*present, ("stuck", dataset))
        return (*present, ("incoming", (dataset, detail.progress)))

    def add(self, dataset: DatasetId, replica: Replica) -> None:
        """Add the entries ``replica`` (of ``dataset``) makes (:meth:`entries_of`)."""
        for name, entry in self.entries_of(dataset, replica):
            getattr(self, name).append(entry)

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


STUCK_TAG = b"S"
"""The stuck transfers (:func:`stuck_digest`)."""
UNAVAILABLE_TAG = b"U"
"""The reasons a site's storage cannot serve (:func:`~hydrator.core.storage.unavailable_digest`)."""
NEAR_TAG = b"N"
"""The near sites (:func:`~hydrator.core.near.with_near`)."""
DIGEST_TAGS = (STUCK_TAG, UNAVAILABLE_TAG, NEAR_TAG)
"""Every :func:`extended_digest` tag, one byte per attribute folded in: a new attribute whose
value can change takes an unused one here (distinct tags keep two extensions of the same
digest apart)."""


def extended_digest(digest: str, tag: bytes, parts: Iterable[str]) -> str:
    """``digest`` extended with an attribute's value (``tag``, one of :data:`DIGEST_TAGS`,
    then each of ``parts`` after a newline): always different from ``digest``, even with no
    parts. Persisted in the collector's ads: its bytes must never change."""
    h = hashlib.sha256(digest.encode() + b"\0" + tag)
    for part in parts:
        h.update(b"\n" + part.encode())
    return h.hexdigest()[:16]


def stuck_digest(digest: str, stuck: Iterable[DatasetId]) -> str:
    """``digest`` extended with the stuck transfers, for ads that also list those (always
    different from ``digest``, so turning the list on re-sends every ad once)."""
    return extended_digest(digest, STUCK_TAG, (f"{d.scope}:{d.name}" for d in stuck))
