"""Demand-driven advertising and the per-site budget, table-driven."""

from __future__ import annotations

import pytest

from hydrator.advertise import AdvertisePolicy, advertise
from hydrator.domain import DatasetId, Site, SiteView, content_digest

A, B, C, D, E = (DatasetId("ska", n) for n in "abcde")
SITE = Site("S")
VIEW = SiteView(
    SITE,
    (A, B, C),
    ((D, 0.5),),
    ((E, 0.2),),
    (),
    None,
    content_digest(SITE, (A, B, C), ((D, 0.5),), ((E, 0.2),)),
)


def names(view: SiteView) -> list[str]:
    return (
        [d.name for d in view.available]
        + [d.name for d, _ in view.partial]
        + [d.name for d, _ in view.replicating]
    )


@pytest.mark.parametrize(
    ("policy", "wanted", "kept", "not_demanded", "over_budget"),
    [
        (AdvertisePolicy(), {}, "abcde", 0, 0),
        (AdvertisePolicy(demand_only=True), {C: 1, D: 3, DatasetId("ska", "z"): 9}, "cd", 3, 0),
        (AdvertisePolicy(demand_only=True), {}, "", 5, 0),
        # budget: most demanded first, then better state, then name
        (AdvertisePolicy(max_datasets_per_site=2), {E: 5, B: 1}, "be", 0, 3),
        (AdvertisePolicy(max_datasets_per_site=3), {}, "abc", 0, 2),
        (AdvertisePolicy(max_datasets_per_site=2), {D: 1, E: 1}, "de", 0, 3),
        (AdvertisePolicy(demand_only=True, max_datasets_per_site=1), {A: 1, D: 2}, "d", 3, 1),
        (AdvertisePolicy(max_datasets_per_site=9), {}, "abcde", 0, 0),
    ],
)
def test_advertise_table(
    policy: AdvertisePolicy,
    wanted: dict[DatasetId, int],
    kept: str,
    not_demanded: int,
    over_budget: int,
) -> None:
    result = advertise(VIEW, wanted, policy)
    assert "".join(names(result.view)) == kept
    assert (result.not_demanded, result.over_budget) == (not_demanded, over_budget)
    if kept == "abcde":
        assert result.view is VIEW
    else:
        assert result.view.digest != VIEW.digest, "a narrowed ad has its own digest"
