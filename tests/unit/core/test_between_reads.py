"""What a cycle between two full reads answers for each source (hydrator.core.between_reads):
an event cycle's re-read source beside the others unchanged, a refresh cycle's restated storage
statuses, and the read times, failures and guards the last full read left."""

from __future__ import annotations

from dataclasses import replace

from hydrator.core.between_reads import (
    inexact,
    keep_read_times,
    patched,
    reread,
    restated,
    unchanged,
)
from hydrator.core.plan import GuardPolicy, plan_cycle, planned
from hydrator.core.storage import Drain
from hydrator.domain import (
    DatasetId,
    ElementCount,
    Site,
    SourceOutcome,
    SourceState,
    State,
    StorageStatus,
)
from tests.unit.factories import fail, rep, snap, t

DS = DatasetId("ska", "obs1")


def test_an_event_cycle_keeps_the_full_reads_time_and_other_sources_as_they_were() -> None:
    first = {
        "rucio": snap("rucio", rep("A", "obs1"), sites=("A", "B")),
        "static": snap("static", rep("C", "obs2"), sites=("C",)),
    }
    state = plan_cycle(State(), first, t(0), GuardPolicy()).state
    replicas = reread(state.sources["rucio"].replicas, [DS], [rep("B", "obs1")])
    outcomes = {
        "rucio": snap("rucio", *replicas, sites=("A", "B")),
        "static": unchanged(state.sources["static"]),
    }
    plan = keep_read_times(planned(state, outcomes, t(5), GuardPolicy()), state).plan
    assert [str(d) for d in plan.sites[Site("B")].available] == ["ska:obs1"]
    assert plan.sites[Site("A")].available == ()
    assert [str(d) for d in plan.sites[Site("C")].available] == ["ska:obs2"]
    assert plan.state.sources["rucio"].last_success == t(0)
    assert plan.sites[Site("B")].updated == t(0)  # as of the last full read, not the event
    assert {s.last_success for s in plan.sources} == {t(0)}


GUARDED = GuardPolicy(
    max_drop_fraction=0.5,
    drop_min_entries=4,
    accept_drop_after_cycles=3,
    site_max_drop_fraction=0.5,
    site_drop_min_entries=2,
    accept_site_drops=("D",),  # static's drop: the source guard's alone
)


def _full(state: State, minute: int, first: bool = False) -> State:
    """A full read: rucio answers without site A (a held site), static answers one entry of
    four (a held answer), dmapi fails (after its first answer)."""
    at_b = [rep("B", f"b{i}") for i in range(4)]
    at_a = [] if not first else [rep("A", f"a{i}") for i in range(4)]
    outcomes: dict[str, SourceOutcome] = {
        "rucio": snap("rucio", *at_a, *at_b, sites=("A", "B")),
        "static": snap("static", *[rep("D", f"s{i}") for i in range(4 if first else 1)]),
        "dmapi": snap("dmapi", rep("C", "c0")) if first else fail("dmapi", "DMAPI: HTTP 503"),
    }
    return plan_cycle(state, outcomes, t(minute), GUARDED).state


def _event(state: State, minute: int) -> State:
    """An event cycle as the runtime's: rucio's b0 read again, every other source unchanged."""
    held = state.sources["rucio"]
    replicas = reread(held.replicas, [DatasetId("ska", "b0")], [rep("B", "b0")])
    outcomes: dict[str, SourceOutcome] = {
        name: unchanged(s) for name, s in state.sources.items() if name != "rucio"
    }
    outcomes["rucio"] = patched(held, replicas, held.sites)
    plan = keep_read_times(planned(state, outcomes, t(minute), GUARDED), state).plan
    for name, before in state.sources.items():  # nobody's failure or guard state moves
        assert plan.state.sources[name] == before, name
    by_name = {s.name: s for s in plan.sources}
    assert not by_name["dmapi"].fresh and by_name["dmapi"].reason == "DMAPI: HTTP 503"
    assert not by_name["static"].fresh and "held back" in (by_name["static"].reason or "")
    assert set(by_name["rucio"].held_sites) == {Site("A")}  # still shown as held
    return plan.state


def test_an_event_cycle_neither_resets_nor_advances_failures_and_guards() -> None:
    """A failing source stays stale with its error through an event cycle, and the source and
    site guards count full reads only: with events flowing between them, the drop is accepted
    at the ``accept_drop_after_cycles``-th full read, as without events."""
    state = _full(State(), 0, first=True)
    state = _full(state, 10)  # A held (1), static held (1), dmapi failed
    assert state.sources["rucio"].held_sites == {Site("A"): 1}
    assert state.sources["static"].held_cycles == 1
    state = _event(state, 11)
    state = _event(state, 12)
    state = _full(state, 20)  # held (2)
    assert state.sources["rucio"].held_sites == {Site("A"): 2}
    assert state.sources["static"].held_cycles == 2
    state = _event(state, 21)
    state = _full(state, 30)  # the third full read in a row: accepted
    assert not state.sources["rucio"].held_sites
    assert {r.site for r in state.sources["rucio"].replicas} == {Site("B")}
    assert len(state.sources["static"].replicas) == 1 and not state.sources["static"].stale
    assert state.sources["dmapi"].stale and state.sources["dmapi"].error == "DMAPI: HTTP 503"


def test_an_event_cycle_keeps_the_storage_reasons_and_drains_in_the_site_views() -> None:
    """The site views of an event cycle still say why storage cannot serve, and a drained
    site still lists nothing (they were built without the storage statuses and drains)."""
    down = StorageStatus(
        Site("C"), "C_DISK", "RSE", available=False, reason="availability_read false"
    )
    first = {
        "rucio": snap("rucio", rep("A", "obs1"), sites=("A",)),
        "dmapi": replace(snap("dmapi", rep("C", "c0"), sites=("C",)), storages=(down,)),
    }
    drain = Drain(Site("A"), None, "maintenance", since=t(0))
    state = plan_cycle(State(), first, t(0), GuardPolicy()).state
    outcomes: dict[str, SourceOutcome] = {
        "dmapi": unchanged(state.sources["dmapi"]),
        "rucio": patched(state.sources["rucio"], state.sources["rucio"].replicas, {Site("A")}),
    }
    plan = keep_read_times(planned(state, outcomes, t(5), GuardPolicy(), [drain]), state).plan
    assert plan.sites[Site("C")].unavailable == ("RSE C_DISK: availability_read false",)
    assert plan.sites[Site("A")].available == ()  # drained
    assert plan.sites[Site("A")].updated == t(0)


def _rse(site: str, name: str, up: bool = True) -> StorageStatus:
    return StorageStatus(Site(site), name, "RSE", available=up, reason=None if up else "off")


def test_a_refresh_answer_carries_the_new_statuses_or_keeps_the_last_on_failure() -> None:
    state = SourceState("rucio", frozenset({rep("A", "x")}), storages=(_rse("A", "A1"),))
    down = (_rse("A", "A1", up=False),)
    assert restated(state, down).storages == down
    assert restated(state, down).replicas is state.replicas  # no dataset read
    assert restated(state, None).storages == state.storages  # unknown is not unavailable


def test_which_availability_changes_only_a_full_read_applies_exactly() -> None:
    counted = {
        "A1": ElementCount(Site("A"), 3),
        "A2": ElementCount(Site("A"), 1),
        "B1": ElementCount(Site("B"), 2),
        "C2": ElementCount(Site("C"), 0),
    }
    before = (_rse("A", "A1"), _rse("A", "A2"), _rse("B", "B1"), _rse("C", "C1"), _rse("C", "C2"))
    state = SourceState("rucio", frozenset(), elements=counted, storages=before)
    # B1 alone at B: the site lists nothing at once; A1 shares A with A2: a full read
    now = (_rse("A", "A1", False), _rse("A", "A2"), _rse("B", "B1", False), *before[3:])
    assert inexact(state, now) == ("A1",)
    # C2 held nothing at the last full read: nothing to take out
    assert inexact(state, (*before[:4], _rse("C", "C2", False))) == ()
    assert inexact(state, before) == ()
    # back: counted by the last full read (down and back between full reads) or not
    gone = replace(state, storages=now)
    assert inexact(gone, before) == ()
    assert inexact(replace(gone, elements={}), before) == ("A1", "B1")


def test_reread_replaces_exactly_the_datasets_read() -> None:
    before = {rep("A", "obs1"), rep("B", "obs1"), rep("A", "obs2")}
    after = reread(before, [DS], [rep("C", "obs1"), rep("C", "obs2")])
    # obs1 leaves A and B (read nowhere there) and is at C; obs2 is untouched (not read)
    assert after == {rep("C", "obs1"), rep("A", "obs2")}
