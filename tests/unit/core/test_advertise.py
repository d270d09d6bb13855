"""Demand-driven advertising and the per-site budget, table-driven."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hydrator.core.advertise import AdvertisePolicy, advertise
from hydrator.core.ranking import STATE_RANK
from hydrator.core.views import content_digest
from hydrator.domain import DatasetId, ReplicaState, Site, SiteView

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


@pytest.mark.parametrize("size", [12, 400])  # demand against a small site; a big one
def test_budget_order_matches_a_full_sort(size: int) -> None:
    """The fast path (demanded first, then fill from the sorted lists) equals sorting every
    entry by (-demand, -state rank, name), whether the demanded datasets are looked up one
    by one (few of them) or found by scanning the site's lists."""
    import random

    rng = random.Random(5)
    for _ in range(200):
        pool = [DatasetId("ska", f"n{i:03d}") for i in range(size)]
        states = {d: rng.choice(list(ReplicaState)[:3]) for d in pool}
        av = tuple(sorted(d for d in pool if states[d] is ReplicaState.AVAILABLE))
        pa = tuple(sorted((d, 0.5) for d in pool if states[d] is ReplicaState.PARTIAL))
        rp = tuple(sorted((d, 0.1) for d in pool if states[d] is ReplicaState.REPLICATING))
        view = SiteView(SITE, av, pa, rp, (), None, content_digest(SITE, av, pa, rp))
        others = [DatasetId("lsst", f"n{i}") for i in range(3)]  # wanted, held nowhere here
        wanted = {d: rng.randint(1, 3) for d in rng.sample(pool, 4) + others}
        budget = rng.randint(1, 12)
        policy = AdvertisePolicy(max_datasets_per_site=budget)
        result = advertise(view, wanted, policy)
        rank = {d: (-wanted.get(d, 0), -STATE_RANK[states[d]], d) for d in pool}
        expected = sorted(pool, key=rank.__getitem__)[:budget]
        assert sorted(names(result.view)) == sorted(d.name for d in expected)
        shares = dict(pa + rp)
        assert all(shares[d] == share for d, share in result.view.partial)
        assert all(shares[d] == share for d, share in result.view.replicating)


def _big_view(count: int) -> SiteView:
    """``count`` available datasets with long names (about 60 bytes each in the ad)."""
    datasets = tuple(DatasetId("ska", f"observation_{i:05d}_" + "x" * 40) for i in range(count))
    return SiteView(SITE, datasets, (), (), (), None, content_digest(SITE, datasets, (), ()))


@pytest.mark.parametrize("limit", [1024, 5000, 60000])
def test_an_ad_over_max_ad_bytes_is_cut_to_fit_most_demanded_first(limit: int) -> None:
    from hydrator.config import ClassAdConfig
    from hydrator.core.render import render_cron

    attrs = ClassAdConfig()

    def size(view: SiteView) -> int:
        return len(render_cron(view, attrs).encode())

    view = _big_view(2000)
    assert size(view) > limit
    wanted = {view.available[-1]: 5, view.available[-2]: 1}  # the last names, by name order
    result = advertise(view, wanted, AdvertisePolicy(max_ad_bytes=limit), size)

    kept = result.view.available
    assert size(result.view) <= limit
    assert limit - size(result.view) < 70, "one more name would have fitted"
    assert {view.available[-1], view.available[-2]} <= set(kept), "most demanded first"
    assert set(kept) - set(wanted) == set(view.available[: len(kept) - 2]), "then by name"
    assert (result.over_size, result.over_budget, result.not_demanded) == (2000 - len(kept), 0, 0)
    assert result.view.digest == content_digest(SITE, kept, (), ())


def test_an_ad_under_max_ad_bytes_is_left_alone() -> None:
    view = _big_view(10)
    result = advertise(view, {}, AdvertisePolicy(max_ad_bytes=60000), lambda v: 900)
    assert result.view is view and result.over_size == 0


def test_size_composes_with_demand_and_budget() -> None:
    view = _big_view(50)
    wanted = {d: 1 for d in view.available[:30]}
    policy = AdvertisePolicy(demand_only=True, max_datasets_per_site=20, max_ad_bytes=1000)

    def size(v: SiteView) -> int:  # a model: 100 bytes of frame, 60 per name
        return 100 + 60 * len(v.available)

    result = advertise(view, wanted, policy, size)
    assert result.view.available == view.available[:15]
    assert (result.not_demanded, result.over_budget, result.over_size) == (20, 10, 5)


def test_stuck_transfers_reach_the_digest_only_when_advertised() -> None:
    view = replace(VIEW, stuck=(E,))
    off = advertise(view, {}, AdvertisePolicy()).view
    on = advertise(view, {}, AdvertisePolicy(stuck=True)).view
    assert off.digest == VIEW.digest and on.digest != VIEW.digest
    other = advertise(replace(view, stuck=(D,)), {}, AdvertisePolicy(stuck=True)).view
    assert other.digest != on.digest, "a change of the stuck list reaches the ads"
    narrowed = advertise(view, {D: 1}, AdvertisePolicy(demand_only=True, stuck=True)).view
    assert narrowed.stuck == () and [d for d, _ in narrowed.partial] == [D]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(1, 12), min_size=1, max_size=80),  # name lengths
    st.integers(0, 40),  # the frame's bytes
    st.integers(0, 6),  # bytes a name costs besides its characters (a model may break 2..3)
    st.floats(0.0, 1.0),  # the limit, as a share of the names' bytes over the frame
    st.lists(st.integers(0, 79), max_size=30),  # demanded names, by position
)
def test_an_over_size_ad_keeps_the_longest_prefix_that_fits(
    lengths: list[int], frame: int, extra: int, share: float, demanded: list[int]
) -> None:
    """The cut is the longest prefix of the ranking (most demanded first, then by name) that
    fits, whatever a name costs in the size model (at least its characters), and every
    entry left out is counted, though only those that could fit are built."""
    datasets = tuple(sorted(DatasetId("s", f"{i:02d}" + "x" * n) for i, n in enumerate(lengths)))
    view = SiteView(SITE, datasets, (), (), (), None, content_digest(SITE, datasets, (), ()))
    wanted = {datasets[i]: 1 + i % 3 for i in demanded if i < len(datasets)}

    def size(v: SiteView) -> int:
        return frame + sum(len(str(d)) + extra for d in v.available)

    limit = max(1, frame + int(share * (size(view) - frame)))
    result = advertise(view, wanted, AdvertisePolicy(max_ad_bytes=limit), size)
    ranking = sorted(wanted, key=lambda d: (-wanted[d], d))
    ranking += [d for d in datasets if d not in wanted]
    fitting = [
        n
        for n in range(len(ranking) + 1)
        if size(replace(view, available=tuple(sorted(ranking[:n])))) <= limit
    ]
    expected = max(fitting, default=0) if size(view) > limit else len(datasets)
    assert result.view.available == tuple(sorted(ranking[:expected]))
    assert result.over_size == len(datasets) - expected
