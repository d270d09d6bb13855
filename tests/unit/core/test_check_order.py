"""Which datasets a bounded budget checks first (hydrator.core.check_order): the Rucio
source's exact checks and the DMAPI source's relocates of known datasets."""

from __future__ import annotations

from hydrator.core.check_order import (
    Relocations,
    deep_check_order,
    relocate_order,
    standing_order,
)
from hydrator.domain import DatasetId

A, B, C, D, E = (DatasetId("ska", name) for name in ("a", "b", "c", "d", "e"))
NOBODY_VOUCHES = dict.fromkeys((A, B, C, D, E), False)


# -- the deep checks --------------------------------------------------------------------------


def test_without_demand_those_nothing_vouches_for_go_first_then_by_name() -> None:
    vouched = {A: True, B: False, C: True, D: False, DatasetId("other", "a"): False}
    assert standing_order(vouched) == [DatasetId("other", "a"), B, D, A, C]
    assert deep_check_order(vouched, (), {}, 3) == [DatasetId("other", "a"), B, D]


def test_a_listed_bad_dataset_is_checked_before_a_wanted_one() -> None:
    assert deep_check_order(NOBODY_VOUCHES, {E}, {D: 5}, 1) == [E]
    assert deep_check_order(NOBODY_VOUCHES, {E}, {D: 5}, 3) == [E, D, A]


def test_the_most_wanted_dataset_is_checked_first() -> None:
    wanted = {C: 1, D: 9, B: 4}
    assert deep_check_order(NOBODY_VOUCHES, (), wanted, 5) == [D, B, C, A, E]


def test_a_wanted_dataset_is_checked_before_one_nothing_vouches_for() -> None:
    vouched = {A: False, B: True}
    assert deep_check_order(vouched, (), {B: 1}, 1) == [B]
    assert deep_check_order(vouched, (), {}, 1) == [A]


def test_ties_of_demand_and_listed_bad_ones_follow_the_order_without_demand() -> None:
    vouched = {A: True, B: False, C: False, D: True}
    assert deep_check_order(vouched, {D, C}, {A: 2, B: 2}, 4) == [C, D, B, A]


def test_only_pending_datasets_are_checked_and_no_more_than_the_limit() -> None:
    vouched = {A: False, B: False}
    other = DatasetId("ska", "not_pending")
    assert deep_check_order(vouched, {other}, {other: 9, B: 0}, 5) == [A, B]
    assert deep_check_order(NOBODY_VOUCHES, {E, D}, {C: 1}, 2) == [D, E]
    assert deep_check_order(NOBODY_VOUCHES, {E}, {}, 0) == []


def test_a_kept_standing_order_gives_the_same_answer() -> None:
    vouched = {A: True, B: False, C: False, D: True, E: False}
    standing = standing_order(vouched)
    for listed, wanted in (((), {}), ({D}, {A: 3}), ({B, C}, {E: 1, A: 1})):
        assert deep_check_order(vouched, listed, wanted, 4, standing) == deep_check_order(
            vouched, listed, wanted, 4
        )


# -- the relocates ----------------------------------------------------------------------------


def test_a_dataset_never_located_is_located_before_any_known_one() -> None:
    assert relocate_order([A, B, C], {B: 1}, 1) == Relocations([A, C, B], 0)


def test_the_longest_unchecked_known_datasets_are_relocated_within_the_budget() -> None:
    located_in = {A: 3, B: 1, C: 2, D: 1}
    assert relocate_order([A, B, C, D, E], located_in, 2) == Relocations([E, B, D], 2)
    assert relocate_order([A, B, C, D], located_in, 3) == Relocations([B, D, C], 1)


def test_a_budget_of_zero_or_above_the_known_ones_relocates_all() -> None:
    located_in = {A: 2, B: 1}
    assert relocate_order([A, B], located_in, 0) == Relocations([B, A], 0)
    assert relocate_order([A, B], located_in, 5) == Relocations([B, A], 0)


def test_a_dataset_no_longer_wanted_is_not_located() -> None:
    assert relocate_order([B], {A: 1, B: 2}, 1) == Relocations([B], 0)
