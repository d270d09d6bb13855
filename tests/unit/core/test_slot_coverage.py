"""Slot coverage and repair decisions, table-driven (hydrator.core.slot_coverage)."""

from __future__ import annotations

import classad2
import htcondor2  # noqa: F401  (registers the functions a constraint may use)
import pytest

from hydrator.core.slot_coverage import (
    Current,
    Pending,
    SiteCoverage,
    SlotSeen,
    after_look,
    census,
    plan_repairs,
    since_s,
    stale_constraint,
)
from hydrator.domain import Site

A, B = Site("SITE_A"), Site("SITE_B")
NOW = 10_000.0
CURRENT = {A: Current("da", 9_000.0), B: Current("db", 9_500.0)}
BACKOFF = (2.0, 60.0)


def slot(name: str, site: str | None, digest: str | None, heard: int | None = 9_900) -> SlotSeen:
    return SlotSeen(name, site, digest, merged_s=None, heard_s=heard)


@pytest.mark.parametrize(
    ("seen", "want"),
    [
        (slot("s", "SITE_A", None, heard=9_990), 9_990.0),  # bare: since its startd's update
        (slot("s", "SITE_A", None, heard=None), NOW),  # bare, update unknown: now
        (slot("s", "SITE_A", "old", heard=8_000), 9_000.0),  # stale: since the digest changed
        (slot("s", "SITE_A", "old", heard=9_800), 9_800.0),  # stale: updated after the change
        (slot("s", "SITE_A", "old", heard=None), 9_000.0),
    ],
)
def test_since_when_a_slot_went_without_its_lists(seen: SlotSeen, want: float) -> None:
    assert since_s(seen, CURRENT[A], NOW) == want


def ad(site: object, digest: object = None, merged: object = None) -> classad2.ClassAd:
    values = {"GLIDEIN_Site": site, "DataLocalityDigest": digest, "DataLocalityMerged": merged}
    return classad2.ClassAd({k: v for k, v in values.items() if v is not None})


@pytest.mark.parametrize(
    ("slot_ad", "deferred_after", "selected"),
    [
        (ad("SITE_A"), None, True),  # bare
        (ad("SITE_A", "da"), None, False),  # current
        (ad("SITE_A", "old"), None, True),  # stale
        (ad("SITE_A", "old", merged=9_000), 8_000, False),  # stale, merged recently: deferred
        (ad("SITE_A", "old", merged=7_000), 8_000, True),  # stale, merged long ago
        (ad("SITE_A", None, merged=9_000), 8_000, True),  # wiped of its digest: bare
        (ad("site_a"), None, False),  # another spelling is another site
        (ad("SITE_X"), None, False),  # not ours
        (ad(None), None, False),  # no site attribute
        (ad(7), None, False),  # not a string
        (ad("SITE_B", "da"), None, True),  # SITE_A's digest is not SITE_B's
    ],
)
def test_the_stale_constraint_selects_exactly_the_uncovered_slots_of_our_sites(
    slot_ad: classad2.ClassAd, deferred_after: int | None, selected: bool
) -> None:
    text = stale_constraint(
        "GLIDEIN_Site", "DataLocalityDigest", "DataLocalityMerged", CURRENT, deferred_after
    )
    assert classad2.ExprTree(text).eval(slot_ad) is selected


def test_the_stale_constraint_quotes_hostile_values_and_checks_names() -> None:
    hostile = {Site('A" || true || "'): Current('x" || true || "', 0.0)}
    text = stale_constraint("S", "D", "M", hostile, None)
    assert classad2.ExprTree(text).eval(classad2.ClassAd({"S": "other"})) is False
    with pytest.raises(ValueError, match="attribute name"):
        stale_constraint("S || true", "D", "M", hostile, None)
    assert stale_constraint("S", "D", "M", {}, None) == "false"


def test_a_look_merges_every_uncovered_slot_once_and_counts_each_episode() -> None:
    found = [
        slot("a1", "SITE_A", None),
        slot("a2", "SITE_A", "old"),
        slot("b1", "SITE_B", None),
        slot("x1", "SITE_X", None),  # not ours
        slot("n1", None, None),  # no site
        slot("a3", "SITE_A", "da"),  # current after all (repaired meanwhile)
    ]
    plan = plan_repairs(found, CURRENT, {}, NOW, BACKOFF)
    assert [r.slot.name for r in plan.merge] == ["a1", "a2", "b1"]
    assert plan.found_bare == {A: 1, B: 1}
    assert plan.found_stale == {A: 1}
    assert plan.uncovered == {A: (1, 1), B: (1, 0)}
    assert plan.unknown == 2 and plan.refused == {} and plan.backed_off == 0
    assert set(plan.pending) == {"a1", "a2", "b1"}


def test_slots_the_merge_budget_holds_are_left_for_a_later_look_as_deferred() -> None:
    found = [slot("a1", "SITE_A", None), slot("a2", "SITE_A", "old"), slot("a3", "SITE_A", "old")]
    plan = plan_repairs(found, CURRENT, {}, NOW, BACKOFF, held=frozenset({"a3"}))
    assert [r.slot.name for r in plan.merge] == ["a1", "a2"]
    assert plan.found_stale == {A: 1}  # a3's episode starts when it is merged
    assert plan.uncovered == {A: (1, 1)}
    assert plan.held == {A: 1}  # a3: deferred at this look
    assert set(plan.pending) == {"a1", "a2"}


@pytest.mark.parametrize(
    ("before", "heard", "merged", "refused", "counted", "waiting"),
    [
        # merged last look, found again without an update since: not kept, counted once,
        # merged again after the first back-off
        (Pending(9_900, 1, NOW - 1, "da"), 9_900, True, 1, 0, 0),
        (Pending(9_900, 1, NOW + 1, "da"), 9_900, False, 1, 0, 1),
        # a later failure: no new count, waits out its longer back-off
        (Pending(9_900, 3, NOW + 5, "da"), 9_900, False, 0, 0, 1),
        (Pending(9_900, 3, NOW - 5, "da"), 9_900, True, 0, 0, 0),
        # wiped again by a newer update: a new episode, merged at once
        (Pending(9_900, 3, NOW + 50, "da"), 9_950, True, 0, 1, 0),
        # the site's lists changed since the merge: a new episode, merged at once
        (Pending(9_900, 3, NOW + 50, "older"), 9_900, True, 0, 1, 0),
    ],
)
def test_a_repair_the_collector_did_not_keep_is_retried_with_back_off(
    before: Pending, heard: int, merged: bool, refused: int, counted: int, waiting: int
) -> None:
    plan = plan_repairs([slot("a1", "SITE_A", None, heard)], CURRENT, {"a1": before}, NOW, BACKOFF)
    assert bool(plan.merge) is merged
    assert plan.refused.get(A, 0) == refused
    assert plan.found_bare.get(A, 0) == counted
    assert plan.backed_off == waiting
    kept = plan.pending["a1"]
    if merged and not counted:
        assert kept.attempts == before.attempts + 1
        assert kept.retry_s == NOW + min(BACKOFF[1], BACKOFF[0] * 2**before.attempts)


def test_a_slot_found_covered_or_gone_is_forgotten() -> None:
    plan = plan_repairs([], CURRENT, {"a1": Pending(1, 1, NOW)}, NOW, BACKOFF)
    assert plan.pending == {}


def test_census_counts_each_site_by_state_and_the_strays() -> None:
    seen = [
        slot("a1", "SITE_A", "da"),
        slot("a2", "SITE_A", None),
        slot("a3", "SITE_A", "old"),
        slot("a4", "SITE_A", "old"),
        slot("x", "SITE_X", "da"),
        slot("n", None, None),
    ]
    coverage, no_site, unknown = census(seen, CURRENT, {A: 1})
    assert coverage[A] == SiteCoverage(slots=4, current=1, bare=1, stale=1, deferred=1)
    assert coverage[A].ratio == 0.25
    assert coverage[B] == SiteCoverage() and coverage[B].ratio == 1.0
    assert (no_site, unknown) == (1, 1)


@pytest.mark.parametrize(
    ("last", "uncovered", "want"),
    [
        (SiteCoverage(4, 4), (0, 0), SiteCoverage(4, 4)),
        (SiteCoverage(4, 4), (1, 0), SiteCoverage(4, 3, 1)),
        (SiteCoverage(4, 2, 0, 0, 2), (1, 1), SiteCoverage(4, 0, 1, 1, 2)),
        (SiteCoverage(2, 2), (3, 0), SiteCoverage(3, 0, 3)),  # new slots since the census
        (SiteCoverage(), (1, 0), SiteCoverage(1, 0, 1)),
    ],
)
def test_a_look_updates_coverage_from_the_last_census(
    last: SiteCoverage, uncovered: tuple[int, int], want: SiteCoverage
) -> None:
    assert after_look({A: last}, {A: uncovered}) == {A: want}


@pytest.mark.parametrize(
    ("last", "uncovered", "held", "want"),
    [
        # the cycle handed a change of all 4 slots to the looks; the budget held 3 of them
        (SiteCoverage(4, 0, 0, 4), (0, 1), 3, SiteCoverage(4, 0, 0, 1, 3)),
        # the window held 1 at the cycle (the census), the budget 2 more at the look
        (SiteCoverage(4, 1, 0, 2, 1), (0, 0), 2, SiteCoverage(4, 1, 0, 0, 3)),
        (SiteCoverage(), (0, 0), 2, SiteCoverage(2, 0, 0, 0, 2)),  # new since the census
    ],
)
def test_slots_a_look_holds_under_the_budget_count_as_deferred_not_current(
    last: SiteCoverage, uncovered: tuple[int, int], held: int, want: SiteCoverage
) -> None:
    assert after_look({A: last}, {A: uncovered}, {A: held}) == {A: want}
