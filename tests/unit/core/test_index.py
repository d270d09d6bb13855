"""Several reports of one (site, dataset) as one: a source's answer merged."""

from __future__ import annotations

from hydrator.core.index import merged_snapshot
from hydrator.core.presence import holding
from hydrator.domain import DatasetId, Site


def test_two_reports_of_one_pair_merge_to_the_better() -> None:
    dataset = DatasetId("ska", "a")
    half = holding(dataset, Site("SITE_A"), 0.5, 0.5)
    full = holding(dataset, Site("SITE_A"), 1.0, 1.0)
    assert half is not None and full is not None
    snapshot = merged_snapshot("rucio", [half, full], [Site("SITE_B")])
    assert snapshot.replicas == {full}
    assert snapshot.sites == {"SITE_A", "SITE_B"}  # the given sites and the replicas' sites
