"""Domain values: building a snapshot."""

from __future__ import annotations

from hydrator.domain import DatasetId, Site, Snapshot, holding
from tests.unit.factories import rep


def test_a_snapshot_of_unique_replicas_keeps_the_given_objects() -> None:
    a = rep("SITE_A", "a", "available")
    b = rep("SITE_B", "a", "partial", 0.5)
    given = frozenset({a, b})
    snapshot = Snapshot.of("rucio", given, sites=[Site("SITE_C")], unique=True)
    assert snapshot.replicas is given  # no copy: the core can compare by identity
    assert snapshot.sites == {"SITE_A", "SITE_B", "SITE_C"}


def test_without_unique_two_reports_of_one_pair_merge_to_the_better() -> None:
    dataset = DatasetId("ska", "a")
    half = holding(dataset, Site("SITE_A"), 0.5, 0.5)
    full = holding(dataset, Site("SITE_A"), 1.0, 1.0)
    assert half is not None and full is not None
    snapshot = Snapshot.of("rucio", [half, full])
    assert snapshot.replicas == {full}
