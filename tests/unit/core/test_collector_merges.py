"""Which slots and site ads the collector publisher updates: the pure decisions
(hydrator.core.collector_merges)."""

from __future__ import annotations

import classad2
import pytest

from hydrator.core.collector_merges import (
    Rendered,
    Target,
    cycle_share,
    defer_merges,
    is_current,
    may_merge_now,
    merge_groups,
    merged_value,
    plan_merges,
    plan_site_ads,
    refreshes_due,
    slim_merge,
    within_budget,
)
from hydrator.core.merge_budget import MergeBudget
from hydrator.core.slot_coverage import Current
from hydrator.domain import Site

NOW = 1_800_000_000.0
REFRESH = 900.0
WANT = Rendered(classad2.ClassAd(), digest="d1", updated=int(NOW) - 300)


def slot(
    name: str,
    site: str = "SITE_A",
    digest: str | None = "d1",
    updated: int | None = int(NOW) - 300,
    heard: int | None = None,
    merged: int | None = None,
) -> Target:
    return Target(name, Site(site), digest, updated, heard, merged)


@pytest.mark.parametrize(
    ("target", "current"),
    [
        (slot("s", digest="d1"), True),
        (slot("s", digest=None), False),  # wiped by the startd's update
        (slot("s", digest="d0"), False),  # content changed
        (slot("s", updated=None), False),
        (slot("s", updated=int(NOW) - 300), True),  # same as ours
        (slot("s", updated=int(NOW) - 600), True),  # older than ours, within refresh_s
        (slot("s", updated=int(NOW) - 1000), False),  # older than refresh_s, ours is newer
    ],
)
def test_is_current(target: Target, current: bool) -> None:
    assert is_current(target, WANT, NOW, REFRESH) is current


def test_an_old_updated_value_is_not_resent_when_we_have_nothing_newer() -> None:
    stale_site = Rendered(classad2.ClassAd(), digest="d1", updated=int(NOW) - 5000)
    assert is_current(slot("s", updated=int(NOW) - 5000), stale_site, NOW, REFRESH)


def test_plan_merges_picks_exactly_the_slots_not_current() -> None:
    slots = [
        slot("slot1@a"),
        slot("slot2@a", digest=None),
        slot("slot3@b", site="SITE_B", digest="x"),
        slot("slot4@c", site="SITE_UNKNOWN", digest=None),  # no such site: left alone
    ]
    rendered = {Site("SITE_A"): WANT, Site("SITE_B"): WANT}
    todo, current = plan_merges(slots, rendered, NOW, REFRESH)
    assert [t.name for t in todo] == ["slot2@a", "slot3@b"]
    assert current == 1


def test_plan_site_ads_sends_missing_changed_and_unheard_and_withdraws_unknown() -> None:
    existing = [
        Target("SITE_A", Site("SITE_A"), "d1", WANT.updated, int(NOW) - 10),  # current
        Target("SITE_B", Site("SITE_B"), "d1", WANT.updated, int(NOW) - 1000),  # not heard
        Target("SITE_C", Site("SITE_C"), "d0", WANT.updated, int(NOW) - 10),  # changed
        Target("SITE_X", Site("SITE_X"), "d1", WANT.updated, int(NOW) - 10),  # gone
    ]
    rendered = {Site(s): WANT for s in ("SITE_A", "SITE_B", "SITE_C", "SITE_D")}
    send, gone, current = plan_site_ads(existing, rendered, NOW, REFRESH)
    assert send == ["SITE_B", "SITE_C", "SITE_D"]
    assert gone == ["SITE_X"]
    assert current == 1


def test_slim_merge_only_when_the_slot_carries_the_same_digest_and_an_updated_value() -> None:
    assert slim_merge(slot("s", digest="d1", updated=int(NOW) - 5000), WANT)
    assert not slim_merge(slot("s", digest="d0"), WANT)  # lists changed: send them
    assert not slim_merge(slot("s", digest=None), WANT)  # wiped: send everything
    assert not slim_merge(slot("s", digest="d1", updated=None), WANT)


INTERVAL = 300.0
WANT2 = Rendered(classad2.ClassAd(), digest="d2", updated=int(NOW))


@pytest.mark.parametrize(
    ("target", "now"),
    [
        (slot("s", digest="d1", merged=int(NOW) - 299), False),  # merged 299 s ago: waits
        (slot("s", digest="d1", merged=int(NOW) - 300), True),  # the interval has passed
        (slot("s", digest="d1", merged=None), True),  # no merge of ours (hook, old version)
        (slot("s", digest=None, merged=None), True),  # wiped by its startd, or a new slot
        (slot("s", digest="d2", updated=None, merged=int(NOW) - 10), True),  # same lists
        (slot("s", digest="d1", merged=int(NOW) + 60), True),  # in the future: not trusted
        # refresh_s still holds: its updated value is older than refresh_s, ours newer
        (slot("s", digest="d1", updated=int(NOW) - 900, merged=int(NOW) - 10), True),
        (slot("s", digest="d1", updated=None, merged=int(NOW) - 10), True),
    ],
)
def test_may_merge_now(target: Target, now: bool) -> None:
    assert may_merge_now(target, WANT2, NOW, REFRESH, INTERVAL) is now


def test_defer_merges_keeps_order_and_counts_and_zero_defers_none() -> None:
    recent = int(NOW) - 60
    todo = [
        slot("slot1@a", digest="d1", merged=recent),
        slot("slot2@a", digest=None),
        slot("slot3@a", digest="d1", merged=int(NOW) - 400),
        slot("slot4@a", digest="d0", merged=recent),
    ]
    rendered = {Site("SITE_A"): WANT2}
    now, deferred = defer_merges(todo, rendered, NOW, REFRESH, INTERVAL)
    assert [t.name for t in now] == ["slot2@a", "slot3@a"]
    assert deferred == 2
    assert defer_merges(todo, rendered, NOW, REFRESH, 0.0) == (todo, 0)


def test_a_bare_slot_is_merged_with_its_lists_own_time_and_a_changed_one_with_now() -> None:
    """Re-sending the current lists to a wiped or new slot starts no merge_min_interval_s
    window; replacing other lists does."""
    current = {Site("SITE_A"): Current("d1", NOW - 200)}
    assert merged_value(slot("bare", digest=None, updated=None), current, NOW) == int(NOW) - 200
    assert merged_value(slot("older", digest="d0"), current, NOW) == int(NOW)
    assert merged_value(slot("other", "SITE_X", digest=None), current, NOW) == int(NOW)
    future = {Site("SITE_A"): Current("d1", NOW + 50)}  # the clock went back: never ahead
    assert merged_value(slot("bare", digest=None, updated=None), future, NOW) == int(NOW)


def test_merge_groups_split_by_kind_and_merge_time() -> None:
    current = {Site("SITE_A"): Current("d1", NOW - 200)}
    slots = [
        slot("bare", digest=None, updated=None),
        slot("older", digest="d0"),
        slot("same", digest="d1"),
        slot("bare2", digest=None, updated=None),
    ]
    groups = merge_groups(slots, {Site("SITE_A"): WANT}, current, NOW)
    assert groups == {
        (Site("SITE_A"), False, int(NOW) - 200): ["bare", "bare2"],
        (Site("SITE_A"), False, int(NOW)): ["older"],
        (Site("SITE_A"), True, 0): ["same"],
    }


def test_the_budget_charges_only_merges_that_replace_other_lists() -> None:
    """Bare slots (wiped or new) and slim merges (same lists, newer updated value) go
    whatever the budget; merges replacing an older digest are charged the ad's bytes, in
    order, and the rest wait."""
    want = Rendered(classad2.ClassAd({"AvailableDatasets": ["ska:obs_1"]}), "d1", int(NOW))
    size = want.size_bytes
    todo = [
        slot("old1", digest="d0"),
        slot("bare", digest=None),
        slot("old2", digest="d0"),
        slot("slim", digest="d1", updated=int(NOW) - 1000),
    ]
    budget = MergeBudget(rate=1.5 * size / 60)  # a minute's worth: one ad and a half
    now, held = within_budget(todo, {Site("SITE_A"): want}, budget, NOW)
    assert ([t.name for t in now], held) == (["bare", "slim", "old1"], 1)
    again, held = within_budget(todo, {Site("SITE_A"): want}, MergeBudget(rate=0), NOW)
    assert (len(again), held) == (4, 0)


def test_a_cycle_that_handed_merges_to_the_looks_merges_none_and_charges_nothing() -> None:
    """Handed over, every due slot (bare, slim or a change) is left to the looks and the
    budget stays full for them; not handed over, the cycle merges under the budget."""
    want = Rendered(classad2.ClassAd({"AvailableDatasets": ["x" * 100]}), "d1", int(NOW))
    rendered = {Site("SITE_A"): want}
    due = [slot("bare", digest=None), slot("slim"), slot("old1", digest="d0")]
    budget = MergeBudget(rate=1.0)  # a minute's worth: 60 bytes, under one ad
    assert cycle_share(due, rendered, budget, NOW, True) == ([], 0, due)
    assert budget.tokens is None  # untouched: full for the next look
    todo, held, handed = cycle_share(due, rendered, budget, NOW, False)
    assert ([t.name for t in todo], held, handed) == (["bare", "slim", "old1"], 0, [])
    assert cycle_share(due, rendered, budget, NOW, False)[1:] == (1, [])  # now spent


def test_the_look_after_a_cycle_sends_the_refreshes_it_handed_over() -> None:
    """A look's query returns only slots lacking the current digest: the slots that carry
    it and need a newer updated value are merged (slim) from the cycle's list, unless their
    site's lists changed since or the look found them (wiped: merged in full)."""
    handed = [slot("bare", digest=None), slot("slim1"), slot("slim2"), slot("b", site="SITE_B")]
    rendered = {Site("SITE_A"): WANT, Site("SITE_B"): WANT}
    due = refreshes_due(handed, rendered, {"slim2"})
    assert [t.name for t in due] == ["slim1", "b"]
    changed = {Site("SITE_A"): Rendered(classad2.ClassAd(), "d2", int(NOW))}
    assert refreshes_due(handed, changed, set()) == []
