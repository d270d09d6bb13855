"""Storage that cannot serve, table by table: which storage counts, why, and what
a cycle then decides."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from hydrator.core.index import merged_snapshot
from hydrator.core.plan import GuardPolicy, Plan, plan_cycle
from hydrator.core.storage import (
    Downtime,
    Drain,
    Statement,
    clean_text,
    drain_refusal,
    judge,
    present_at,
    unavailable_digest,
    unavailable_text,
    with_storage,
)
from hydrator.core.views import content_digest
from hydrator.domain import (
    ElementCount,
    Replica,
    Site,
    Snapshot,
    SourceOutcome,
    State,
    StorageStatus,
)
from hydrator.names import InvalidNameError
from tests.unit.factories import fail, rep, t

A = Site("SITE_A")
NOW = t(0)
HOUR = timedelta(hours=1)
POLICY = GuardPolicy(max_drop_fraction=0.5, drop_min_entries=4, accept_drop_after_cycles=3)


def down(start_h: float, end_h: float, on: str = "") -> Downtime:
    return Downtime(NOW + start_h * HOUR, NOW + end_h * HOUR, "Planned", "disk swap", on)


def drain(storage: str | None = "X_DISK", until_h: float | None = None) -> Drain:
    until = None if until_h is None else NOW + until_h * HOUR
    return Drain(A, storage, "RAID rebuild", NOW - HOUR, until)


@pytest.mark.parametrize(
    ("statement", "drains", "available", "reason"),
    [
        (Statement(A, "X_DISK", "RSE"), [], True, None),
        (
            Statement(A, "X_DISK", "RSE", disabled="availability_read false"),
            [],
            False,
            "availability_read false",
        ),
        (
            Statement(A, "X_DISK", "RSE", downtimes=(down(-1, 2),)),
            [],
            False,
            "downtime (Planned) until 2026-11-22T14:00Z: disk swap",
        ),
        (
            Statement(A, "X_DISK", "RSE", downtimes=(down(-1, 2, on="site SITE_A"),)),
            [],
            False,
            "downtime (Planned) of site SITE_A until 2026-11-22T14:00Z: disk swap",
        ),
        # a downtime that has not started or has ended is not applied
        (Statement(A, "X_DISK", "RSE", downtimes=(down(1, 2), down(-3, -1))), [], True, None),
        # the end is exclusive: a downtime ending now is over
        (Statement(A, "X_DISK", "RSE", downtimes=(down(-1, 0),)), [], True, None),
        (
            Statement(A, "X_DISK", "RSE"),
            [drain()],
            False,
            "drained by the operator: RAID rebuild",
        ),
        (
            Statement(A, "X_DISK", "RSE"),
            [drain(until_h=2)],
            False,
            "drained by the operator until 2026-11-22T14:00Z: RAID rebuild",
        ),
        (Statement(A, "X_DISK", "RSE"), [drain(until_h=0)], True, None),  # expired
        (Statement(A, "X_DISK", "RSE"), [drain("Y_DISK")], True, None),  # another element
        (Statement(A, "X_DISK", "RSE"), [drain(None)], True, None),  # the site: in the views
        (  # the catalogue's statement wins over a downtime and a drain
            Statement(A, "X_DISK", "RSE", disabled="deleted", downtimes=(down(-1, 1),)),
            [drain()],
            False,
            "deleted",
        ),
    ],
)
def test_a_storage_element_is_unavailable_only_when_someone_said_so(
    statement: Statement, drains: list[Drain], available: bool, reason: str | None
) -> None:
    status = judge(statement, drains, NOW, wanted=3)
    assert (status.available, status.reason) == (available, reason)
    assert status.wanted == (0 if available else 3)


def test_a_future_downtime_is_reported_not_applied() -> None:
    status = judge(Statement(A, "X_DISK", "RSE", downtimes=(down(5, 6), down(2, 3))), [], NOW)
    assert status.available
    assert status.upcoming == (
        "downtime (Planned) from 2026-11-22T14:00Z to 2026-11-22T15:00Z: disk swap"
    )
    current = judge(Statement(A, "X_DISK", "RSE", downtimes=(down(-1, 1), down(-1, 4))), [], NOW)
    assert current.until == NOW + 4 * HOUR, "the downtime ending last says until when"


def test_reasons_from_outside_cannot_break_an_ad() -> None:
    assert clean_text('a "quoted"\\ reason\n\twith\x00 control') == "a quoted reason with control"
    assert len(clean_text("x" * 500)) == 200
    assert clean_text("é and ünïcode") == "and n code"
    with pytest.raises(InvalidNameError):
        StorageStatus(A, 'bad"name')


def test_a_site_is_present_from_its_available_storage_only() -> None:
    complete, half = rep("SITE_A", "d"), rep("SITE_A", "d", "partial", 0.5)
    both = [("X_DISK", complete), ("Y_DISK", half)]
    assert present_at(both, frozenset()) == complete
    assert present_at(both, {"X_DISK"}) == half, "the other storage's share stays"
    assert present_at(both, {"Y_DISK"}) == complete
    assert present_at(both, {"X_DISK", "Y_DISK"}) is None


def unavailable(site: str, storage: str, reason: str = "availability_read false") -> StorageStatus:
    return StorageStatus(Site(site), storage, "RSE", available=False, reason=reason)


def available(site: str, storage: str) -> StorageStatus:
    return StorageStatus(Site(site), storage, "RSE")


def answer(*replicas: Replica, storages: tuple[StorageStatus, ...] = ()) -> Snapshot:
    return merged_snapshot("r", replicas, [A, Site("SITE_B")], storages=storages)


def run(
    cycles: list[dict[str, SourceOutcome]], drains: list[list[Drain]] | None = None
) -> list[Plan]:
    state, plans = State(), []
    for i, outcomes in enumerate(cycles):
        plan = plan_cycle(state, outcomes, t(i), POLICY, drains[i] if drains else ())
        plans.append(plan)
        state = plan.state
    return plans


def test_storage_going_down_empties_the_site_at_once_and_says_why() -> None:
    """Ten datasets at SITE_A leave in one cycle: the shrink guard (which holds back an answer
    that lost half its entries) does not hold an explained drop back. SITE_B is untouched."""
    held = [rep("SITE_A", f"d{i}") for i in range(10)] + [rep("SITE_B", "b")]
    ok = answer(*held, storages=(available("SITE_A", "X_DISK"), available("SITE_B", "B_DISK")))
    down_a = answer(
        rep("SITE_B", "b"),
        storages=(unavailable("SITE_A", "X_DISK"), available("SITE_B", "B_DISK")),
    )
    silent = answer(rep("SITE_B", "b"))  # the same drop, unexplained
    before, after, back = run([{"r": ok}, {"r": down_a}, {"r": ok}])
    assert len(before.sites[A].available) == 10
    assert after.sites[A].available == () and after.sources[0].outcome == "ok"
    assert after.sites[A].unavailable == ("RSE X_DISK: availability_read false",)
    assert [s.storage for s in after.sites[A].storages] == ["X_DISK"]
    assert after.sites[Site("SITE_B")].unavailable == ()
    assert after.changed_sites == {A}, "no churn beyond the affected site"
    assert len(back.sites[A].available) == 10 and back.sites[A].unavailable == ()
    _, held_back = run([{"r": ok}, {"r": silent}])
    assert held_back.sources[0].outcome == "held"
    assert len(held_back.sites[A].available) == 10


def test_a_guarded_drop_elsewhere_is_still_held_back() -> None:
    """Storage down at SITE_A explains SITE_A's drop only: a source that also lost most of
    SITE_B is held back as before."""
    many = [rep("SITE_B", f"b{i}") for i in range(10)] + [rep("SITE_A", "a")]
    ok = answer(*many)
    both = answer(rep("SITE_B", "b0"), storages=(unavailable("SITE_A", "X_DISK"),))
    _, second = run([{"r": ok}, {"r": both}])
    assert second.sources[0].outcome == "held"


def test_a_failing_source_keeps_its_last_statuses() -> None:
    """Unknown is not unavailable: a failure keeps the last good answer, statuses included."""
    stated = answer(rep("SITE_A", "a"), storages=(available("SITE_A", "X_DISK"),))
    _, failed = run([{"r": stated}, {"r": fail("r")}])
    assert failed.sites[A].available and failed.sites[A].unavailable == ()
    assert [s.storage for s in failed.sites[A].storages] == ["X_DISK"]
    down_a = answer(storages=(unavailable("SITE_A", "X_DISK"),))
    _, _, still = run([{"r": stated}, {"r": down_a}, {"r": fail("r")}])
    assert still.sites[A].available == ()
    assert still.sites[A].unavailable == ("RSE X_DISK: availability_read false",)


def test_a_drained_site_lists_nothing_until_undrained_or_expired() -> None:
    ok = answer(rep("SITE_A", "a"), rep("SITE_B", "b"))
    site_drain = Drain(A, None, "network down", t(0), until=t(2))
    plans = run([{"r": ok}] * 3, drains=[[site_drain]] * 3)
    drained, _, expired = plans
    view = drained.sites[A]
    assert view.available == () and view.digest == content_digest(A, (), (), ())
    assert view.unavailable == (
        "site SITE_A: drained by the operator until 2026-11-22T12:02Z: network down",
    )
    assert drained.sites[Site("SITE_B")].available, "other sites keep theirs"
    assert drained.state.sources["r"].replicas == ok.replicas, "the state keeps the truth"
    assert [str(d) for d in expired.sites[A].available] == ["ska:a"]


def test_views_are_the_same_objects_where_no_storage_is_stated() -> None:
    ok = answer(rep("SITE_A", "a"))
    (plan,) = run([{"r": ok}])
    views = plan.sites
    assert with_storage(views, [], [], NOW)[A] is views[A]


def test_the_unavailable_attribute_and_digest() -> None:
    reasons = ("RSE X_DISK: availability_read false", 'RSE Y: said "no"')
    assert unavailable_text(reasons) == "RSE X_DISK: availability_read false; RSE Y: said no"
    assert unavailable_text(()) == ""
    assert unavailable_digest("abc", ()) == "abc", "all available: the digest as before"
    assert unavailable_digest("abc", reasons) != unavailable_digest("abc", reasons[:1])


MAIN = [rep("SITE_A", f"a{i}") for i in range(10)]  # SITE_A's main RSE
SMALL = [rep("SITE_A", f"s{i}") for i in range(2)]  # a small one, to be disabled
AT_B = [rep("SITE_B", f"b{i}") for i in range(10)]
GUARDS = GuardPolicy(
    max_drop_fraction=0.5,
    drop_min_entries=4,
    accept_drop_after_cycles=3,
    site_max_drop_fraction=0.5,
    site_drop_min_entries=4,
)


def by_element(
    held: dict[str, list[Replica]], down: tuple[str, ...], counted: bool, b: list[Replica]
) -> Snapshot:
    """An answer from ``held`` (element -> its replicas at SITE_A) and ``b`` at SITE_B, the
    ``down`` elements stated unavailable (their replicas left out); ``counted``: with the
    per-element counts (else unknown, as from Rucio and DMAPI)."""
    up = {e: rs for e, rs in held.items() if e not in down}
    statuses = [unavailable("SITE_A", e) if e in down else available("SITE_A", e) for e in held]
    snapshot = answer(*[r for rs in up.values() for r in rs], *b, storages=tuple(statuses))
    if not counted:
        return snapshot
    elements = {e: ElementCount(A, len(rs)) for e, rs in up.items()}
    elements["B_DISK"] = ElementCount(Site("SITE_B"), len(b))
    return replace(snapshot, elements=elements)


@pytest.mark.parametrize(
    ("first_down", "second", "counted", "b_after", "expected"),
    [
        # the small RSE goes down: only its entries leave, at once
        ((), {"MAIN": MAIN, "SMALL": SMALL}, True, AT_B, "published"),
        # ... and the main one vanishes from the answer too: the site guard holds it
        ((), {"MAIN": [], "SMALL": SMALL}, True, AT_B, "site held"),
        # the small RSE was down already (explains nothing now): held, counts known or not
        (("SMALL",), {"MAIN": [], "SMALL": SMALL}, True, AT_B, "site held"),
        (("SMALL",), {"MAIN": [], "SMALL": SMALL}, False, AT_B, "site held"),
        # the site's count looks fine (another RSE holds the same), but MAIN is gone
        ((), {"MAIN": [], "OTHER": MAIN, "SMALL": SMALL}, True, AT_B, "site held"),
        # the source guard (little at SITE_B): the down RSE explains its 2 entries, not 10
        ((), {"MAIN": [], "SMALL": SMALL}, True, AT_B[:2], "source held"),
        # counts not known and the RSE newly down: the site count cannot tell (published)
        ((), {"MAIN": [], "SMALL": SMALL}, False, AT_B, "published"),
    ],
)
def test_an_unavailable_element_explains_only_its_own_entries(
    first_down: tuple[str, ...],
    second: dict[str, list[Replica]],
    counted: bool,
    b_after: list[Replica],
    expected: str,
) -> None:
    """One disabled storage element at a site does not exempt the whole site from the shrink
    guards: the site losing its main (available) element is still held back."""
    was = {e: MAIN if e in ("MAIN", "OTHER") else SMALL for e in second}
    first = by_element(was, first_down, counted, b_after)
    then = by_element(second, ("SMALL",), counted, b_after)
    state = plan_cycle(State(), {"r": first}, t(0), GUARDS).state
    plan = plan_cycle(state, {"r": then}, t(1), GUARDS)
    status = plan.sources[0]
    assert status.outcome == ("held" if expected == "source held" else "ok")
    assert (A in status.held_sites) == (expected == "site held")
    before = {str(r.dataset) for r in first.replicas if r.site == A}
    after = {str(r.dataset) for r in then.replicas if r.site == A}
    assert {str(d) for d in plan.sites[A].available} == (
        after if expected == "published" else before
    )


def source_answer(
    name: str, *replicas: Replica, storages: tuple[StorageStatus, ...] = ()
) -> Snapshot:
    return merged_snapshot(name, replicas, [A, Site("SITE_B")], storages=storages)


@pytest.mark.parametrize(
    ("r_holds", "r_storages", "s_holds", "s_storages", "lists"),
    [
        # a full read: R left out what its storage held; S states no storage at SITE_A
        ([], [unavailable("SITE_A", "X_DISK")], ["s1"], [], {"s1"}),
        # a refresh cycle: R's entries still held, its storage read down since
        (["r1"], [unavailable("SITE_A", "X_DISK")], ["s1"], [], {"s1"}),
        # S states its own storage there, available
        (["r1"], [unavailable("SITE_A", "X_DISK")], ["s1"], [available("SITE_A", "Y")], {"s1"}),
        # both state all their storage at SITE_A down: nothing
        (["r1"], [unavailable("SITE_A", "X_DISK")], ["s1"], [unavailable("SITE_A", "Y")], set()),
        # S covers SITE_A but holds nothing there: nothing
        (["r1"], [unavailable("SITE_A", "X_DISK")], [], [], set()),
        # R's other storage element serves: R's entries stay (a full read follows a refresh)
        (
            ["r1"],
            [unavailable("SITE_A", "X_DISK"), available("SITE_A", "Z_DISK")],
            ["s1"],
            [],
            {"r1", "s1"},
        ),
        # the same dataset from both: S's report of it stays, R's does not
        (["s1"], [unavailable("SITE_A", "X_DISK")], ["s1"], [], {"s1"}),
    ],
)
def test_a_source_whose_storage_at_a_site_is_all_down_loses_only_its_own_entries(
    r_holds: list[str],
    r_storages: list[StorageStatus],
    s_holds: list[str],
    s_storages: list[StorageStatus],
    lists: set[str],
) -> None:
    """Two sources at SITE_A, R stating every storage element it has there down: what S holds
    there, on storage nobody said is down, stays advertised (a site is emptied only when every
    source holding entries there says all its storage there cannot serve)."""
    r = source_answer("r", *(rep("SITE_A", d) for d in r_holds), storages=tuple(r_storages))
    s = source_answer("s", *(rep("SITE_A", d) for d in s_holds), storages=tuple(s_storages))
    (plan,) = run([{"r": r, "s": s}])
    view = plan.sites[A]
    assert {str(d.name) for d in view.available} == lists
    assert "RSE X_DISK: availability_read false" in view.unavailable
    assert view.digest == content_digest(A, tuple(sorted(view.available)), (), ())


def test_a_partial_report_from_the_other_source_stays_partial() -> None:
    r = source_answer("r", rep("SITE_A", "d"), storages=(unavailable("SITE_A", "X_DISK"),))
    s = source_answer("s", rep("SITE_A", "d", "partial", 0.5))
    (plan,) = run([{"r": r, "s": s}])
    assert plan.sites[A].available == ()
    assert [str(d.name) for d, _ in plan.sites[A].partial] == ["d"]


KNOWN_SITES = {"SITE_A", "SITE_B"}
STATED = {("SITE_A", "A_DISK"), ("SITE_A", "A_TAPE")}


@pytest.mark.parametrize(
    ("site", "storage", "refused"),
    [
        ("SITE_A", None, None),
        ("SITE_A", "A_DISK", None),
        ("SITE_B", None, None),  # a known site whose sources state no storage: whole-site only
        ("SITE_X", None, "unknown site SITE_X: "),
        ("SITE_X", "A_DISK", "unknown site SITE_X: "),
        ("SITE_A", "B_DISK", "stated there: A_DISK, A_TAPE"),
        ("SITE_B", "A_DISK", "stated there: none: no source states storage at this site"),
    ],
)
def test_a_drain_is_refused_unless_its_target_is_known(
    site: str, storage: str | None, refused: str | None
) -> None:
    why = drain_refusal(Site(site), storage, KNOWN_SITES, STATED)
    assert (why is None) == (refused is None)
    assert why is None or refused is None or refused in why
