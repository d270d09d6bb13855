"""Which lists of a site's view a replica goes into (hydrator.core.views.SiteLists)."""

from __future__ import annotations

from dataclasses import fields

import pytest

from hydrator.core.views import LISTS, Entry, ListName, SiteLists, site_contents
from hydrator.domain import DatasetId, Detail, Replica, ReplicaState, Site, SiteView, Transfer

D = DatasetId("ska", "d")
S = Site("S")
AVAILABLE, PARTIAL = ReplicaState.AVAILABLE, ReplicaState.PARTIAL
REPLICATING, STUCK = ReplicaState.REPLICATING, ReplicaState.STUCK

# Each kind of replica -> the entries it makes, as (list, entry) pairs.
TABLE: list[tuple[Replica, set[tuple[ListName, Entry]]]] = [
    # complete, nothing moving: its dataset in available alone (model.views_of relies on it)
    (Replica(D, S, AVAILABLE), {("available", D)}),
    (Replica(D, S, AVAILABLE, 1.0, Detail(Transfer.NONE, 0.0, 1.0)), {("available", D)}),
    (
        Replica(D, S, AVAILABLE, 1.0, Detail(Transfer.REPLICATING, 0.4, 1.0)),
        {("available", D), ("incoming", (D, 0.4))},
    ),
    (
        Replica(D, S, AVAILABLE, 1.0, Detail(Transfer.STUCK, 0.2, 1.0)),
        {("available", D), ("stuck", D)},
    ),
    # partial: its share of files, and its share of bytes only where that differs
    (Replica(D, S, PARTIAL, 0.5), {("partial", (D, 0.5))}),
    (Replica(D, S, PARTIAL, 0.5, Detail(Transfer.NONE, 0.0, 0.5)), {("partial", (D, 0.5))}),
    (
        Replica(D, S, PARTIAL, 0.5, Detail(Transfer.NONE, 0.0, 0.7)),
        {("partial", (D, 0.5)), ("partial_bytes", (D, 0.7))},
    ),
    (
        Replica(D, S, PARTIAL, 0.5, Detail(Transfer.REPLICATING, 0.3, 0.6)),
        {("partial", (D, 0.5)), ("partial_bytes", (D, 0.6)), ("incoming", (D, 0.3))},
    ),
    (
        Replica(D, S, PARTIAL, 0.5, Detail(Transfer.STUCK, 0.2, 0.5)),
        {("partial", (D, 0.5)), ("stuck", D)},
    ),
    # absent: replicating with its progress and nowhere else; stuck in stuck alone
    (
        Replica(D, S, REPLICATING, 0.0, Detail(Transfer.REPLICATING, 0.3, 0.0)),
        {("replicating", (D, 0.3))},
    ),
    (Replica(D, S, STUCK, 0.0, Detail(Transfer.STUCK, 0.1, 0.0)), {("stuck", D)}),
]


@pytest.mark.parametrize(("replica", "expected"), TABLE)
def test_each_kind_of_replica_makes_its_entries(
    replica: Replica, expected: set[tuple[ListName, Entry]]
) -> None:
    made = SiteLists.entries_of(replica.dataset, replica)
    assert len(made) == len(set(made))  # at most one entry per list
    assert set(made) == expected


@pytest.mark.parametrize(("replica", "expected"), TABLE)
def test_add_puts_those_entries_in_the_view(
    replica: Replica, expected: set[tuple[ListName, Entry]]
) -> None:
    (view,) = site_contents({S: {D: replica}}, frozenset({S})).values()
    found = {(name, entry) for name in LISTS for entry in getattr(view, name)}
    assert found == expected


def test_the_lists_are_the_views_fields() -> None:
    names = {f.name for f in fields(SiteView)}
    assert set(LISTS) <= names
    assert set(SiteLists.__slots__) == set(LISTS)
