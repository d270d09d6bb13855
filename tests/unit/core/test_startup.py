"""What a restart serves before its first cycle (hydrator.core.startup), table-driven."""

from __future__ import annotations

import pytest

from hydrator.config import ClassAdConfig
from hydrator.core.advertise import AdvertisePolicy
from hydrator.core.plan import GuardPolicy, plan_cycle
from hydrator.core.startup import saved_views, startup_from, startup_views
from hydrator.core.storage import Drain
from hydrator.domain import Site, SiteView, State
from tests.unit.factories import rep, snap, t

A, B = Site("A"), Site("B")
ATTRS = ClassAdConfig()
SAVED = plan_cycle(
    State(), {"s": snap("s", rep("A", "x"), rep("A", "y"), rep("B", "z"))}, t(0), GuardPolicy()
).state


def listed(views: dict[Site, SiteView]) -> dict[str, list[str]]:
    return {site: [d.name for d in v.available] for site, v in views.items()}


@pytest.mark.parametrize(
    ("policy", "drains", "served"),
    [
        (AdvertisePolicy(), [], {"A": ["x", "y"], "B": ["z"]}),
        (AdvertisePolicy(max_datasets_per_site=1), [], {"A": ["x"], "B": ["z"]}),
        (AdvertisePolicy(), [Drain(A, None, "maintenance", t(0))], {"A": [], "B": ["z"]}),
    ],
)
def test_startup_views(
    policy: AdvertisePolicy, drains: list[Drain], served: dict[str, list[str]]
) -> None:
    views = startup_views(saved_views(SAVED, drains, t(1)), policy, ClassAdConfig())
    assert listed(views) == served


def test_a_restart_advertises_the_saved_views_and_serves_their_full_lists() -> None:
    """The ads before the first cycle are cut to size; the JSON views keep the full lists
    with their update times, and a drained site lists nothing in either."""
    drain = Drain(B, None, "maintenance", t(0))
    started = startup_from(SAVED, [drain], t(1), AdvertisePolicy(max_datasets_per_site=1), ATTRS)
    assert listed(started.advertised) == {"A": ["x"], "B": []}
    assert listed(started.full) == {"A": ["x", "y"], "B": ["z"]}
    assert {v.updated for v in started.full.values()} == {t(0)}
    assert started.model.state is SAVED


def test_a_restart_in_demand_mode_serves_nothing_but_keeps_the_state() -> None:
    started = startup_from(SAVED, [], t(1), AdvertisePolicy(demand_only=True), ATTRS)
    assert (started.advertised, started.full) == ({}, {})
    assert started.model.state is SAVED


def test_a_restart_from_the_rows_as_read_builds_the_same_views() -> None:
    """The store's rows in the order it read them build a one-source state's views without
    sorting; the views are the ones built from the sets."""
    (only,) = SAVED.sources.values()
    rows = {only.name: sorted(only.replicas, key=lambda r: (r.site, r.dataset), reverse=True)}
    policy = AdvertisePolicy()
    from_rows = startup_from(SAVED, [], t(1), policy, ATTRS, as_read=rows)
    assert from_rows.advertised == startup_from(SAVED, [], t(1), policy, ATTRS).advertised


def test_show_prints_the_saved_views_with_the_drains_in_effect() -> None:
    drain = Drain(A, None, "maintenance", t(0), until=t(5))
    assert listed(saved_views(SAVED, [drain], t(1))) == {"A": [], "B": ["z"]}
    assert listed(saved_views(SAVED, [drain], t(6))) == {"A": ["x", "y"], "B": ["z"]}
