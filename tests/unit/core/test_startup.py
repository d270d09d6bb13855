"""What a restart serves before its first cycle (hydrator.core.startup), table-driven."""

from __future__ import annotations

import pytest

from hydrator.config import ClassAdConfig
from hydrator.core.advertise import AdvertisePolicy
from hydrator.core.model import Model
from hydrator.core.plan import Policy, plan_cycle
from hydrator.core.startup import startup_views
from hydrator.core.storage import Drain
from hydrator.domain import Site, SiteView, State
from tests.unit.factories import rep, snap, t

A, B = Site("A"), Site("B")
SAVED = plan_cycle(
    State(), {"s": snap("s", rep("A", "x"), rep("A", "y"), rep("B", "z"))}, t(0), Policy()
).state


def listed(views: dict[Site, SiteView]) -> dict[str, list[str]]:
    return {site: [d.name for d in v.available] for site, v in views.items()}


@pytest.mark.parametrize(
    ("policy", "drains", "served"),
    [
        (AdvertisePolicy(), [], {"A": ["x", "y"], "B": ["z"]}),
        (AdvertisePolicy(demand_only=True), [], {}),  # the demand is not known yet
        (AdvertisePolicy(max_datasets_per_site=1), [], {"A": ["x"], "B": ["z"]}),
        (AdvertisePolicy(), [Drain(A, None, "maintenance", t(0))], {"A": [], "B": ["z"]}),
    ],
)
def test_startup_views(
    policy: AdvertisePolicy, drains: list[Drain], served: dict[str, list[str]]
) -> None:
    views = startup_views(Model(SAVED).served_views(drains, t(1)), policy, ClassAdConfig())
    assert listed(views) == served
