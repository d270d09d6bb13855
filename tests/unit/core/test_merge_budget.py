"""The change-merge budget (hydrator.core.merge_budget): a token bucket over bytes."""

from __future__ import annotations

from hydrator.core.merge_budget import BURST_S, MergeBudget


def test_a_full_bucket_lets_a_minutes_worth_through_at_once_then_the_rate() -> None:
    budget = MergeBudget(rate=100.0)  # 6,000 bytes a minute
    assert budget.allow([2_000, 2_000, 2_000, 1], now_s=1000.0) == 3  # in order, 6,000
    assert budget.allow([100], now_s=1000.5) == 0  # 50 bytes refilled
    assert budget.allow([100], now_s=1001.0) == 1  # 100
    assert budget.allow([1_000, 1], now_s=1011.0) == 1  # the first that does not fit stops


def test_refill_stops_at_the_burst_and_a_clock_going_back_refills_nothing() -> None:
    budget = MergeBudget(rate=10.0)
    assert budget.allow([int(10 * BURST_S)], now_s=0.0) == 1
    assert budget.allow([1], now_s=-100.0) == 0
    assert budget.allow([int(10 * BURST_S), 1], now_s=10_000.0) == 1  # a minute's worth only


def test_an_ad_larger_than_the_bucket_goes_when_it_is_full_and_none_is_held_for_ever() -> None:
    budget = MergeBudget(rate=1.0)  # 60 bytes a minute
    assert budget.allow([500, 500], now_s=0.0) == 1  # full: one goes, the bucket is below 0
    assert budget.allow([500], now_s=60.0) == 0
    assert budget.allow([500], now_s=500.0) == 1


def test_rate_zero_is_no_bound() -> None:
    assert MergeBudget(rate=0.0).allow([10**12] * 3, now_s=0.0) == 3
