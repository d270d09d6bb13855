"""The pure core, table by table: what a cycle decides from (state, outcomes, now)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import NamedTuple

import pytest

from hydrator.core.model import Model
from hydrator.core.plan import GuardPolicy, Plan, planned
from hydrator.domain import ChangeKind, DatasetId, ElementCount, Replica, Site, SourceOutcome, State
from tests.unit.factories import fail, rep, snap, t

POLICY = GuardPolicy(max_drop_fraction=0.5, drop_min_entries=4, accept_drop_after_cycles=3)


class Decided(NamedTuple):
    plan: Plan
    model: Model  # the core's memo of the plan's state, as the service holds it


def run_planned(
    cycles: Sequence[Mapping[str, SourceOutcome]], policy: GuardPolicy = POLICY
) -> list[Decided]:
    """Each cycle's plan and model, each cycle planned with the last one's model (as the
    service carries them)."""
    state, model = State(), None
    done = []
    for i, outcomes in enumerate(cycles):
        plan, memo = planned(state, outcomes, t(i), policy, model=model)
        done.append(Decided(plan, Model.of(plan.state, memo)))
        state, model = plan.state, memo
    return done


def run(cycles: Sequence[Mapping[str, SourceOutcome]], policy: GuardPolicy = POLICY) -> list[Plan]:
    return [decided.plan for decided in run_planned(cycles, policy)]


def names(plan: Plan, site: str, attr: str = "available") -> list[str]:
    view = plan.sites[Site(site)]
    items = getattr(view, attr)
    return [str(x if isinstance(x, DatasetId) else x[0]) for x in items]


def kinds(plan: Plan) -> list[tuple[str, str, str]]:
    return [(c.site, c.dataset.name, c.kind.value) for c in plan.changes]


def test_first_cycle_adds_everything_at_its_time() -> None:
    (plan,) = run([{"r": snap("r", rep("A", "x"), rep("B", "x"), rep("B", "y", "partial", 0.5))}])
    assert kinds(plan) == [("A", "x", "added"), ("B", "x", "added"), ("B", "y", "added")]
    assert names(plan, "B") == ["ska:x"] and names(plan, "B", "partial") == ["ska:y"]
    assert plan.changed_sites == {"A", "B"}
    assert plan.now == t(0), "the store's first-seen time of the added pairs"


def test_changes_are_counted_by_kind_and_listed_alike_each_time() -> None:
    """A first cycle's changes are made while listed (a million of them at full scale); either
    way the counts, the length and every listing agree, in Change's order."""
    first = snap("r", rep("B", "y"), rep("A", "x"), rep("B", "x", "partial", 0.5))
    plan, churn = run(
        [{"r": first}, {"r": snap("r", rep("A", "x", "partial", 0.5), rep("C", "z"))}]
    )
    listed = tuple(plan.changes)
    assert [(c.site, c.dataset.name) for c in listed] == [("A", "x"), ("B", "x"), ("B", "y")]
    assert plan.changes == listed and tuple(plan.changes) == listed
    assert plan.changes[1:] == listed[1:] and len(plan.changes) == 3
    assert plan.changes.counts == {ChangeKind.ADDED: 3}
    held = {(r.site, r.dataset): r for r in plan.state.sources["r"].replicas}
    assert all(c.new is held[(c.site, c.dataset)] for c in listed), "the state's own objects"
    assert kinds(churn) == [
        ("A", "x", "changed"),
        ("B", "x", "removed"),
        ("B", "y", "removed"),
        ("C", "z", "added"),
    ]
    counts = churn.changes.counts
    assert list(counts.items()) == [
        (ChangeKind.CHANGED, 1),
        (ChangeKind.REMOVED, 2),
        (ChangeKind.ADDED, 1),
    ]


def test_one_source_is_planned_without_an_index_merging_sources_carry_theirs() -> None:
    """To save memory, one source alone is planned from its set and its delta, and no
    site -> dataset index is built; where sources merge, each one's index is built once and
    then handed on, patched, from cycle to cycle (equal to one built afresh)."""
    cycles = [{"r": snap("r", rep("A", "x"))}, {"r": snap("r", rep("A", "x"), rep("B", "y"))}]
    alone = [model.built_for_tests() for _, model in run_planned(cycles)]
    assert all(built.indexes["r"] is None and built.merged is None for built in alone)
    merging = run_planned(
        [
            {"r": snap("r", rep("A", "x")), "d": snap("d", rep("A", "x", "partial", 0.5))},
            {"r": snap("r", rep("A", "x"), rep("B", "y")), "d": snap("d")},
            {"r": snap("r", rep("B", "y")), "d": snap("d", rep("A", "z"))},
        ]
    )
    second, third = (merging[i].model.built_for_tests().indexes["r"] for i in (1, 2))
    assert second is not None and third is not None
    assert third == {Site("B"): {DatasetId("ska", "y"): rep("B", "y")}}
    assert second[Site("A")] == {DatasetId("ska", "x"): rep("A", "x")}, "kept"
    assert kinds(merging[2].plan) == [("A", "x", "removed"), ("A", "z", "added")]


def test_same_answer_again_changes_nothing_but_the_refresh_time() -> None:
    outcome = {"r": snap("r", rep("A", "x"), rep("B", "y"))}
    first, second = run([outcome, outcome])
    assert second.changes == () and second.source_deltas == {}
    assert second.changed_sites == frozenset()
    assert second.sites[Site("A")].digest == first.sites[Site("A")].digest
    assert second.sites[Site("A")].updated == t(1)


@pytest.mark.parametrize(
    ("before", "after", "expected"),
    [
        ("available", "partial", ("A", "x", "changed")),
        ("replicating", "available", ("A", "x", "changed")),
        ("replicating", "stuck", ("A", "x", "changed")),
        ("stuck", "partial", ("A", "x", "changed")),
    ],
)
def test_state_transitions_are_changes(before: str, after: str, expected: tuple[str, ...]) -> None:
    frac = {"partial": 0.5, "replicating": 0.2, "stuck": 0.2}
    plans = run(
        [
            {"r": snap("r", rep("A", "x", before, frac.get(before, 1.0)))},
            {"r": snap("r", rep("A", "x", after, frac.get(after, 1.0)))},
        ]
    )
    assert kinds(plans[1]) == [expected]  # its first-seen time: test_sqlite.py


def test_dataset_leaves_only_when_its_source_answered_without_it() -> None:
    plans = run(
        [
            {"r": snap("r", rep("A", "x"), rep("A", "y"))},
            {"r": fail("r")},
            {"r": snap("r", rep("A", "x"))},
        ]
    )
    assert plans[1].changes == () and names(plans[1], "A") == ["ska:x", "ska:y"]
    assert plans[1].sources[0].fresh is False and plans[1].state.sources["r"].stale
    assert plans[1].sites[Site("A")].updated == t(0), "a failed source does not refresh the site"
    assert kinds(plans[2]) == [("A", "y", "removed")]
    assert not plans[2].state.sources["r"].stale


def test_a_failed_source_keeps_its_datasets_while_another_source_drops_them() -> None:
    plans = run(
        [
            {"rucio": snap("rucio", rep("A", "x")), "dmapi": snap("dmapi", rep("A", "x"))},
            {"rucio": fail("rucio"), "dmapi": snap("dmapi", sites=("A",))},
        ]
    )
    assert plans[1].changes == ()
    assert names(plans[1], "A") == ["ska:x"]


def test_sources_merge_best_report_wins_whatever_the_order() -> None:
    a = {"s1": snap("s1", rep("A", "x", "partial", 0.3)), "s2": snap("s2", rep("A", "x"))}
    b = {"s2": a["s2"], "s1": a["s1"]}
    (pa,), (pb,) = run([a]), run([b])
    assert names(pa, "A") == names(pb, "A") == ["ska:x"]
    assert pa.sites == pb.sites


@pytest.mark.parametrize(
    ("first", "second", "lists", "stuck", "incoming"),
    [
        # DMAPI sees the files, Rucio's rule towards the site is stuck: both facts kept
        (rep("A", "x"), rep("A", "x", "stuck"), ("available", "", ""), ["ska:x"], []),
        (rep("A", "x", "partial", 0.6), rep("A", "x", "stuck"), ("", "partial", ""), ["ska:x"], []),
        (
            rep("A", "x", "partial", 0.3),
            rep("A", "x", "replicating", 0.5),
            ("", "partial", ""),
            [],
            [("ska:x", 0.5)],
        ),
        # a stuck transfer wins over an active one for the same site
        (
            rep("A", "x", "replicating", 0.5),
            rep("A", "x", "stuck", 0.1),
            ("", "", ""),
            ["ska:x"],
            [],
        ),
        (
            rep("A", "x", "partial", 0.3, "replicating", 0.2),
            rep("A", "x", "partial", 0.6),
            ("", "partial", ""),
            [],
            [("ska:x", 0.2)],
        ),
    ],
)
def test_sources_merge_presence_and_transfer_separately(
    first: Replica,
    second: Replica,
    lists: tuple[str, str, str],
    stuck: list[str],
    incoming: list[tuple[str, float]],
) -> None:
    for order in (("s1", "s2"), ("s2", "s1")):
        outcome = {order[0]: snap(order[0], first), order[1]: snap(order[1], second)}
        (plan,) = run([outcome])
        view = plan.sites[Site("A")]
        shown = (
            "available" if view.available else "",
            "partial" if view.partial else "",
            "replicating" if view.replicating else "",
        )
        assert shown == lists
        assert [str(d) for d in view.stuck] == stuck
        assert [(str(d), p) for d, p in view.incoming] == incoming
        if view.partial:
            assert view.partial[0][1] == max(first.fraction, second.fraction)


def test_a_transfer_change_alone_moves_no_list_and_keeps_the_digest() -> None:
    plans = run(
        [
            {"r": snap("r", rep("A", "x", "partial", 0.5, "replicating", 0.5))},
            {"r": snap("r", rep("A", "x", "partial", 0.5, "stuck", 0.5))},
        ]
    )
    assert kinds(plans[1]) == [("A", "x", "changed")]
    assert plans[1].changed_sites == frozenset()
    assert [str(d) for d in plans[1].sites[Site("A")].stuck] == ["ska:x"]
    assert plans[1].sites[Site("A")].incoming == ()


def test_suspicious_drop_is_held_then_accepted_after_the_configured_cycles() -> None:
    full = snap("r", *(rep("A", f"d{i}") for i in range(10)))
    small = snap("r", rep("A", "d0"))
    plans = run([{"r": full}, {"r": small}, {"r": small}, {"r": small}])
    for held in plans[1:3]:
        assert held.changes == () and held.state.sources["r"].stale
        assert "held back" in (held.sources[0].reason or "")
    assert len([c for c in plans[3].changes if c.kind is ChangeKind.REMOVED]) == 9
    assert plans[3].state.sources["r"].held_cycles == 0


def test_suspicious_drop_never_accepted_when_configured_so() -> None:
    full = snap("r", *(rep("A", f"d{i}") for i in range(10)))
    policy = GuardPolicy(max_drop_fraction=0.5, drop_min_entries=4, accept_drop_after_cycles=0)
    plans = run([{"r": full}] + [{"r": snap("r", sites=("A",))}] * 6, policy)
    assert all(p.changes == () for p in plans[1:])
    assert len(names(plans[-1], "A")) == 10


def test_a_recovered_answer_resets_the_hold() -> None:
    full = snap("r", *(rep("A", f"d{i}") for i in range(10)))
    plans = run([{"r": full}, {"r": snap("r", rep("A", "d0"))}, {"r": full}])
    assert plans[2].changes == () and not plans[2].state.sources["r"].stale
    assert plans[2].state.sources["r"].held_cycles == 0


@pytest.mark.parametrize(("before", "after", "held"), [(3, 0, False), (4, 1, True), (10, 5, False)])
def test_drop_threshold_table(before: int, after: int, held: bool) -> None:
    plans = run(
        [
            {"r": snap("r", *(rep("A", f"d{i}") for i in range(before)), sites=("A",))},
            {"r": snap("r", *(rep("A", f"d{i}") for i in range(after)), sites=("A",))},
        ]
    )
    assert plans[1].state.sources["r"].stale is held


def test_an_emptied_site_keeps_an_empty_ad_and_an_uncovered_site_goes() -> None:
    plans = run(
        [
            {"r": snap("r", rep("A", "x"), rep("B", "y"))},
            {"r": snap("r", rep("B", "y"), sites=("A",))},
            {"r": snap("r", rep("B", "y"))},
        ]
    )
    assert names(plans[1], "A") == [] and Site("A") in plans[1].changed_sites
    assert plans[2].removed_sites == {"A"} and Site("A") not in plans[2].sites


def test_unconfigured_source_is_dropped_with_its_replicas() -> None:
    plans = run(
        [
            {"old": snap("old", rep("A", "x")), "new": snap("new", rep("A", "y"))},
            {"new": snap("new", rep("A", "y"))},
        ]
    )
    assert kinds(plans[1]) == [("A", "x", "removed")]
    assert set(plans[1].state.sources) == {"new"}
    assert plans[1].source_deltas["old"].removed


def test_site_refresh_waits_for_every_covering_source() -> None:
    plans = run(
        [
            {"s1": snap("s1", rep("A", "x")), "s2": snap("s2", rep("B", "y"))},
            {"s1": snap("s1", rep("A", "x")), "s2": fail("s2")},
        ]
    )
    assert plans[1].sites[Site("A")].updated == t(1)
    assert plans[1].sites[Site("B")].updated == t(0)


def test_source_deltas_hold_exactly_the_rows_to_write() -> None:
    plans = run(
        [
            {"r": snap("r", rep("A", "x"), rep("A", "y", "replicating", 0.1))},
            {"r": snap("r", rep("A", "x"), rep("A", "y"))},
        ]
    )
    delta = plans[1].source_deltas["r"]
    assert delta.added == {rep("A", "y")}
    assert delta.removed == {rep("A", "y", "replicating", 0.1)}


# The site guard: a site that loses all, or more than a share, of its
# entries in one answer keeps them for the guard's cycles, although the source is "ok".
SITE_POLICY = GuardPolicy(
    max_drop_fraction=0.5,
    drop_min_entries=20,
    accept_drop_after_cycles=3,
    site_max_drop_fraction=0.5,
    site_drop_min_entries=10,
)


def two_sites(a: int, b: int, *extra: Replica) -> SourceOutcome:
    """One source: ``a`` datasets at SITE_A, ``b`` at SITE_B (plus ``extra``)."""
    at_a = (rep("SITE_A", f"a{i}") for i in range(a))
    at_b = (rep("SITE_B", f"b{i}") for i in range(b))
    return snap("r", *at_a, *at_b, *extra)


def count(plan: Plan, site: str) -> int:
    """Datasets available at ``site`` (0: the site is not published)."""
    return len(names(plan, site)) if Site(site) in plan.sites else 0


def test_a_site_emptied_by_an_ok_source_is_held_then_accepted() -> None:
    """70 + 30 datasets, SITE_B's table removed: 30% of the source, 100% of SITE_B."""
    plans = run([{"r": two_sites(70, 30)}] + [{"r": two_sites(70, 0)}] * 3, SITE_POLICY)
    for cycle, held in enumerate(plans[1:3], start=1):
        assert len(names(held, "SITE_B")) == 30, f"cycle {cycle}: SITE_B kept"
        (status,) = held.sources
        assert status.fresh and status.outcome == "ok", "the source itself is fine"
        reason = status.held_sites[Site("SITE_B")]
        assert f"0 entries against 30 last time (cycle {cycle} of 3)" in reason
        assert "accept_site_drops" in reason
        assert held.changes == ()
    accepted = plans[3]
    assert count(accepted, "SITE_B") == 0 and accepted.sources[0].held_sites == {}
    assert len(accepted.changes) == 30
    assert len(names(accepted, "SITE_A")) == 70


def test_a_held_site_does_not_hold_the_other_sites_changes() -> None:
    plans = run(
        [{"r": two_sites(70, 30)}, {"r": two_sites(71, 0)}],
        SITE_POLICY,
    )
    assert len(names(plans[1], "SITE_A")) == 71 and len(names(plans[1], "SITE_B")) == 30
    assert kinds(plans[1]) == [("SITE_A", "a70", "added")]
    assert plans[1].source_deltas["r"].removed == frozenset()


@pytest.mark.parametrize(
    ("before", "after", "held"),
    [
        (30, 0, True),  # all lost
        (30, 14, True),  # more than half lost
        (30, 15, False),  # half lost: not more than the share
        (9, 0, False),  # fewer than site_drop_min_entries before
        (10, 0, True),
        (30, 29, False),
    ],
)
def test_site_guard_threshold_table(before: int, after: int, held: bool) -> None:
    plans = run([{"r": two_sites(70, before)}, {"r": two_sites(70, after)}], SITE_POLICY)
    assert count(plans[1], "SITE_B") == (before if held else after)
    assert (Site("SITE_B") in plans[1].sources[0].held_sites) is held


def test_a_site_named_in_accept_site_drops_is_never_held() -> None:
    policy = GuardPolicy(**{**SITE_POLICY.__dict__, "accept_site_drops": ("SITE_B",)})
    plans = run([{"r": two_sites(70, 30)}, {"r": two_sites(70, 0)}], policy)
    assert count(plans[1], "SITE_B") == 0 and plans[1].sources[0].held_sites == {}


def test_a_held_site_recovering_resets_its_count() -> None:
    plans = run(
        [{"r": two_sites(70, 30)}, {"r": two_sites(70, 0)}, {"r": two_sites(70, 30)}]
        + [{"r": two_sites(70, 0)}] * 2,
        SITE_POLICY,
    )
    assert plans[2].changes == () and plans[2].sources[0].held_sites == {}
    assert "(cycle 2 of 3)" in plans[4].sources[0].held_sites[Site("SITE_B")]


def test_the_site_guard_holds_where_several_sources_merge() -> None:
    other = snap("o", rep("SITE_C", "c"))
    plans = run_planned(
        [{"r": two_sites(70, 30), "o": other}, {"r": two_sites(70, 0), "o": other}],
        SITE_POLICY,
    )
    assert len(names(plans[1].plan, "SITE_B")) == 30
    state = plans[1].plan.state
    assert sum(r.site == "SITE_B" for s in state.sources.values() for r in s.replicas) == 30


def test_site_names_differing_only_in_case_are_refused_keeping_the_held_one() -> None:
    """ClassAd ``==`` ignores case, so SITE_A and site_a are one site to a
    collector invalidation; the name already held is kept, the twin's records are invalid."""
    plans = run(
        [
            {"r": snap("r", rep("site_a", "x"))},
            {"r": snap("r", rep("site_a", "x"), rep("SITE_A", "y"), rep("SITE_A", "z"))},
        ]
    )
    assert set(plans[1].sites) == {"site_a"}
    (status,) = plans[1].sources
    assert status.invalid == 2
    assert "SITE_A differs only in case from site_a" in status.refused_sites[Site("SITE_A")]


def test_case_twins_across_sources_keep_the_first_spelling_in_sorted_order() -> None:
    (plan,) = run([{"r": snap("r", rep("Site_B", "x")), "s": snap("s", rep("SITE_B", "y"))}])
    assert set(plan.sites) == {"SITE_B"}
    assert names(plan, "SITE_B") == ["ska:y"]
    refused = {s.name: s.refused_sites for s in plan.sources}
    assert set(refused["r"]) == {"Site_B"} and refused["s"] == {}


def test_the_site_counts_the_guard_reads_are_carried_on_exactly() -> None:
    """Built once a site is a candidate, then patched by each delta (never recounted): they
    must equal a fresh count after held, accepted, grown and failed cycles."""
    cycles: list[Mapping[str, SourceOutcome]] = [
        {"r": two_sites(70, 30)},
        {"r": two_sites(70, 0)},  # held: counts built
        {"r": two_sites(75, 30)},  # back, grown
        {"r": fail("r")},
        {"r": two_sites(60, 40)},
        {"r": two_sites(60, 12)},  # 40 -> 12 at SITE_B: held, judged on carried counts
    ]
    plans = run_planned(cycles, SITE_POLICY)
    for plan, model in plans[1:]:
        carried = model.built_for_tests().counts["r"]
        assert carried == Counter(r.site for r in plan.state.sources["r"].replicas)
    held = plans[5].plan.sources[0].held_sites
    assert "12 entries against 40 last time" in held[Site("SITE_B")]


def with_elements(tape: int) -> SourceOutcome:
    """SITE_A from two storage elements: A_DISK 100 datasets, A_TAPE ``tape`` others."""
    disk = [rep("SITE_A", f"d{i}") for i in range(100)]
    on_tape = [rep("SITE_A", f"t{i}") for i in range(tape)]
    elements = {"A_DISK": ElementCount(Site("SITE_A"), 100)}
    if tape:
        elements["A_TAPE"] = ElementCount(Site("SITE_A"), tape)
    return replace(snap("r", *disk, *on_tape), elements=elements)


def test_a_storage_element_missing_from_an_answer_holds_its_site() -> None:
    """140 -> 100 at SITE_A is no site drop (29%), but A_TAPE lost all its 40 entries."""
    plans = run([{"r": with_elements(40)}] + [{"r": with_elements(0)}] * 3, SITE_POLICY)
    for cycle, held in enumerate(plans[1:3], start=1):
        assert count(held, "SITE_A") == 140 and held.changes == ()
        reason = held.sources[0].held_sites[Site("SITE_A")]
        assert f"storage element A_TAPE: 0 entries against 40 last time (cycle {cycle} of 3)" in (
            reason
        )
    assert count(plans[3], "SITE_A") == 100, "accepted after the guard's cycles"
    assert set(plans[3].state.sources["r"].elements) == {"A_DISK"}


def test_an_element_shrinking_within_the_share_or_unknown_holds_nothing() -> None:
    plans = run([{"r": with_elements(40)}, {"r": with_elements(25)}], SITE_POLICY)
    assert count(plans[1], "SITE_A") == 125 and plans[1].sources[0].held_sites == {}
    no_elements = [{"r": snap("r", *(rep("SITE_A", f"d{i}") for i in range(140)))}]
    plans = run([*no_elements, {"r": snap("r", *(rep("SITE_A", f"d{i}") for i in range(100)))}])
    assert count(plans[1], "SITE_A") == 100, "a source that reports no elements: site rule only"
