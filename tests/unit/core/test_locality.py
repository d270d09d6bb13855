"""Matchmaking-quality classification, table-driven."""

from __future__ import annotations

from hydrator.core.locality import PoolJob, PoolSlot, locality_report
from hydrator.domain import DatasetId, Site, SiteView

X, Y, Z, W, V = (DatasetId("ska", n) for n in "xyzwv")
VIEWS = {
    Site("A"): SiteView(Site("A"), (X, Y), (), (), (), None, "a"),
    Site("B"): SiteView(Site("B"), (X,), ((V, 0.3), (Y, 0.5)), ((Z, 0.1),), (), None, "b"),
    Site("C"): SiteView(Site("C"), (Z,), (), (), (), None, "c"),
}


def job(*datasets: DatasetId, site: str | None = None) -> PoolJob:
    return PoolJob(frozenset(datasets), running=site is not None, site=Site(site) if site else None)


def test_running_jobs_are_local_only_where_all_their_data_is_complete() -> None:
    report = locality_report(
        [job(X, Y, site="A"), job(X, Y, site="B"), job(X, site="B"), job(W, site="UNKNOWN")],
        [],
        VIEWS,
    )
    assert (report.running_local, report.running_remote) == (2, 2)
    assert report.local_ratio == 0.5
    assert report.running_by_site[(Site("B"), "remote")] == 1


def test_idle_jobs_are_classified_by_the_best_site() -> None:
    slots = [PoolSlot(Site("A"), unclaimed=False), PoolSlot(Site("C"), unclaimed=True)]
    report = locality_report(
        [job(X, Y), job(Z), job(V, X), job(X, Y, Z), job(X, Z), job(W), job(V, Z)], slots, VIEWS
    )
    assert report.idle == {
        "waiting_local": 1,  # X,Y complete at A, whose only slot is claimed
        "missed_locality": 1,  # Z complete at C, which has a free slot
        "partial_only": 1,  # V,X: B has X and part of V
        "replicating_only": 3,  # X,Y,Z / X,Z / V,Z: best is B, with Z still replicating there
        "nowhere": 1,  # W
    }
    assert report.missed_by_site == {Site("C"): 1}


def test_no_running_jobs_means_no_ratio() -> None:
    assert locality_report([], [], VIEWS).local_ratio is None


def test_running_jobs_away_from_their_data_are_near_or_remote_and_count_as_its_readers() -> None:
    near = {Site("B"): (Site("A"),), Site("C"): ()}
    report = locality_report(
        [
            job(X, Y, site="A"),  # local
            job(X, Y, site="B"),  # near: reads from A, which is near B
            job(X, Y, site="C"),  # remote: reads from A, which is not near C
            job(Z, site="B"),  # remote: reads from C
            job(W, site="B"),  # remote, its data nowhere: nobody's reader
        ],
        [],
        VIEWS,
        near,
    )
    assert (report.running_local, report.running_near, report.running_remote) == (1, 1, 3)
    assert report.local_ratio == 0.2
    assert report.running_by_site[(Site("B"), "near")] == 1
    assert report.remote_readers == {Site("A"): 2, Site("C"): 1}
    without = locality_report([job(X, Y, site="B")], [], VIEWS)
    assert (without.running_near, without.running_remote) == (0, 1)
