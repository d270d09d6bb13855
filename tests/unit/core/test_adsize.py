"""The ad-size measure (hydrator.core.adsize)."""

from __future__ import annotations

import pytest

from hydrator.config import ClassAdConfig
from hydrator.core.adsize import ad_size
from hydrator.core.advertise import MIN_NAME_BYTES
from hydrator.core.render import render_cron
from hydrator.domain import Site, SiteView
from tests.unit.factories import sized_view

ATTRS = ClassAdConfig()
SITE = Site("S")


def rendered(v: SiteView) -> int:
    return len(render_cron(v, ATTRS).encode("utf-8"))


@pytest.mark.parametrize("count", [0, 1, 3, 10, 40, 200])
@pytest.mark.parametrize("name_length", [1, 8, 60])
def test_the_measure_is_on_the_same_side_of_the_limit_as_the_rendered_ad(
    count: int, name_length: int
) -> None:
    v = sized_view(count, name_length)
    real = rendered(v)
    for limit in (real - 1, real, real + 1, real // 2, real * 2, 10, 1_000_000):
        assert (ad_size(v, ATTRS, limit) <= limit) == (real <= limit), (limit, real)


def test_between_the_bounds_the_ad_is_rendered() -> None:
    v = sized_view(30, 20)
    assert ad_size(v, ATTRS, rendered(v)) == rendered(v)  # the limit lies between the bounds


def test_far_from_the_limit_a_bound_answers() -> None:
    v = sized_view(30, 20)
    assert rendered(v) <= ad_size(v, ATTRS, 1_000_000) <= rendered(v) + 30  # upper bound
    assert ad_size(v, ATTRS, 100) <= rendered(v)  # lower bound, over the limit
    assert ad_size(v, ATTRS, 100) > 100


def test_too_many_names_for_the_limit_whatever_their_length() -> None:
    v = sized_view(100, 1)
    assert ad_size(v, ATTRS, 99 * MIN_NAME_BYTES) == 100 * MIN_NAME_BYTES
