"""Rucio events as hints (hydrator.core.event_plan), table by table: what a message asks to re-read,
what is dropped, the bounded batch, when the full read is due, and an event cycle's plan."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from hydrator.core.event_plan import (
    Batch,
    Hint,
    Ignored,
    ListenerStatus,
    ReconcilePolicy,
    RucioEvent,
    Triage,
    full_read_due,
    hint_of,
    inexact,
    keep_read_times,
    lag_seconds,
    patched,
    reread,
    restated,
    unchanged,
)
from hydrator.core.plan import Policy, plan_cycle
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
DS2 = DatasetId("ska", "obs2")


@pytest.mark.parametrize(
    ("event", "expected"),
    [
        (RucioEvent("transfer-done", dataset=DS, file=("ska", "f1")), Hint(frozenset({DS}))),
        (RucioEvent("transfer-failed", dataset=DS), Hint(frozenset({DS}))),
        # a file moved, its dataset not in the message: the next full read covers it
        (RucioEvent("transfer-done", file=("ska", "f1")), Hint(reconcile=True)),
        (
            RucioEvent("deletion-done", file=("ska", "f1"), rse="R1"),
            Hint(files=frozenset({("ska", "f1")})),  # its datasets looked up
        ),
        (RucioEvent("deletion-done", rse="R1"), Hint(reconcile=True)),  # no file named
        (RucioEvent("datasetlock_ok", dataset=DS, rse="R1"), Hint(frozenset({DS}))),
        (RucioEvent("rule_ok", dataset=DS), Hint(frozenset({DS}))),
        (RucioEvent("rule_progress", dataset=DS), Hint(frozenset({DS}))),
        (RucioEvent("erase", dataset=DS), Hint(frozenset({DS}))),
        (RucioEvent("datasetlock_ok"), Ignored.MALFORMED),  # no (valid) scope:name
        (RucioEvent("transfer-queued", dataset=DS), Ignored.IRRELEVANT),
        (RucioEvent("create_dts", dataset=DS), Ignored.IRRELEVANT),
        (RucioEvent("email"), Ignored.IRRELEVANT),
    ],
)
def test_hint_of(event: RucioEvent, expected: Hint | Ignored) -> None:
    assert hint_of(event) == expected


def test_labels_are_bounded() -> None:
    assert RucioEvent("datasetlock_ok").label == "datasetlock_ok"
    assert RucioEvent("anything-a-broker-sends").label == "other"


def test_triage_drops_duplicates_old_messages_and_other_scopes() -> None:
    triage = Triage(scopes=frozenset({"ska"}), remember=2, full_read_started=t(10))
    first = RucioEvent("rule_ok", t(11), DS, key="k1")
    assert triage.judge(first) == Hint(frozenset({DS}))
    assert triage.judge(first) is Ignored.DUPLICATE
    # out of date: created over 5 minutes before the last full read began
    assert triage.judge(RucioEvent("rule_ok", t(4), DS, key="k2")) is Ignored.OUT_OF_DATE
    assert triage.judge(RucioEvent("rule_ok", t(6), DS2, key="k4")) == Hint(frozenset({DS2}))
    other = RucioEvent("rule_ok", t(11), DatasetId("cms", "x"), key="k3")
    assert triage.judge(other) is Ignored.OUT_OF_SCOPE
    # the memory is bounded: k1 was pushed out by k2, k4 and k3, so it counts as new again
    assert triage.judge(first) == Hint(frozenset({DS}))


def test_batch_is_bounded_and_marks_the_rest_for_the_next_full_read() -> None:
    batch = Batch(capacity=2)
    batch.add(Hint(frozenset({DS})), t(2))
    batch.add(Hint(frozenset({DS2})), t(1))
    batch.add(Hint(frozenset({DatasetId("ska", "obs3")})), t(3))  # over capacity
    assert batch.overflow == 1
    read, created, reconcile = batch.take(limit=1)
    assert read == [DS2]  # the oldest hint first
    assert created == [t(1)]
    assert reconcile  # obs3 (overflow) and obs1 (over the limit) wait for the full read
    assert not batch
    batch.add(Hint(frozenset({DS})), None)
    assert batch.take(limit=5) == ([DS], [], False)


def test_files_for_a_parent_lookup_are_taken_a_cycle_at_a_time_and_bounded() -> None:
    batch = Batch(capacity=5, file_capacity=3)
    batch.add(Hint(files=frozenset({("ska", "f1")})), t(1))
    batch.add(Hint(files=frozenset({("ska", "f1")})), t(2))  # the same file: held once
    batch.add(Hint(files=frozenset({("ska", "f2")})), t(3))
    assert batch.take_files(limit=1) == ([("ska", "f1")], [t(1)])  # the first held first
    assert batch  # f2 waits for the next cycle, not for a full read
    assert batch.take(limit=5) == ([], [], False)
    assert batch.take_files(limit=1) == ([("ska", "f2")], [t(3)])
    assert not batch
    for i in range(3, 7):  # four files, three held at most
        batch.add(Hint(files=frozenset({("ska", f"f{i}")})), t(i))
    assert batch.take_files(limit=5) == (
        [("ska", "f3"), ("ska", "f4"), ("ska", "f5")],
        [
            t(3),
            t(4),
            t(5),
        ],
    )
    assert batch.take(limit=5) == ([], [], True)  # f6 waits for the full read
    none = Batch(capacity=5)  # max_parent_lookups_per_cycle = 0: every deletion marks
    none.add(Hint(files=frozenset({("ska", "f1")})), t(1))
    assert none.take_files(limit=0) == ([], [])
    assert none.take(limit=5) == ([], [], True)


def test_a_deletion_out_of_the_sources_scopes_is_dropped() -> None:
    triage = Triage(scopes=frozenset({"ska"}))
    kept = RucioEvent("deletion-done", file=("ska", "f1"), rse="R1")
    other = RucioEvent("deletion-done", file=("atlas", "f1"), rse="R1")
    assert triage.judge(kept) == Hint(files=frozenset({("ska", "f1")}))
    assert triage.judge(other) is Ignored.OUT_OF_SCOPE


POLICY = ReconcilePolicy(interval_s=60, reconcile_interval_s=1800, silence_s=600)


@pytest.mark.parametrize(
    ("now", "last", "status", "due"),
    [
        (0, None, ListenerStatus(), True),  # start-up: once
        (100, 50, ListenerStatus(True, 60, 99), True),  # reconnected after the last read
        (100, 50, ListenerStatus(True, 10, 99), False),  # events flow: wait for reconcile
        (1900, 50, ListenerStatus(True, 10, 1899), True),  # the reconcile interval passed
        (200, 50, ListenerStatus(False, 10, 150), True),  # disconnected: the normal interval
        (100, 50, ListenerStatus(False, 10, 99), False),  # ... not yet
        (800, 700, ListenerStatus(True, 10, 20), True),  # silent for 780 s > 600 s
        (800, 750, ListenerStatus(True, 10, 20), False),  # silent, but read 50 s ago
        (500, 50, ListenerStatus(True, 10, None), False),  # nothing yet, not silent long
    ],
)
def test_full_read_due(now: float, last: float | None, status: ListenerStatus, due: bool) -> None:
    assert full_read_due(now, last, status, POLICY) is due


def test_reconnects_cost_at_most_one_full_read_per_interval() -> None:
    """A broker dropping each subscription: the first reconnect reads at once, the next ones
    within ``interval_s`` of that read wait for it (whether that read succeeded or not)."""
    again = ListenerStatus(True, 105, 105)  # reconnected at 105, after the read of 100
    assert full_read_due(106, 100, again, POLICY, reconnect_read=None)
    assert not full_read_due(106, 100, again, POLICY, reconnect_read=100)
    assert not full_read_due(159, 40, again, POLICY, reconnect_read=100)  # that read failed
    assert full_read_due(160, 100, again, POLICY, reconnect_read=100)


def test_a_marked_full_read_comes_at_the_normal_interval() -> None:
    flowing = ListenerStatus(True, 10, 99)
    assert full_read_due(120, 50, flowing, POLICY, marked=True)
    assert not full_read_due(100, 50, flowing, POLICY, marked=True)


def test_reread_replaces_exactly_the_datasets_read() -> None:
    before = {rep("A", "obs1"), rep("B", "obs1"), rep("A", "obs2")}
    after = reread(before, [DS], [rep("C", "obs1"), rep("C", "obs2")])
    # obs1 leaves A and B (read nowhere there) and is at C; obs2 is untouched (not read)
    assert after == {rep("C", "obs1"), rep("A", "obs2")}


def test_an_event_cycle_keeps_the_full_reads_time_and_other_sources_as_they_were() -> None:
    first = {
        "rucio": snap("rucio", rep("A", "obs1"), sites=("A", "B")),
        "static": snap("static", rep("C", "obs2"), sites=("C",)),
    }
    state = plan_cycle(State(), first, t(0), Policy()).state
    replicas = reread(state.sources["rucio"].replicas, [DS], [rep("B", "obs1")])
    outcomes = {
        "rucio": snap("rucio", *replicas, sites=("A", "B")),
        "static": unchanged(state.sources["static"]),
    }
    plan = keep_read_times(plan_cycle(state, outcomes, t(5), Policy()), state)
    assert [str(d) for d in plan.sites[Site("B")].available] == ["ska:obs1"]
    assert plan.sites[Site("A")].available == ()
    assert [str(d) for d in plan.sites[Site("C")].available] == ["ska:obs2"]
    assert plan.state.sources["rucio"].last_success == t(0)
    assert plan.sites[Site("B")].updated == t(0)  # as of the last full read, not the event
    assert {s.last_success for s in plan.sources} == {t(0)}


GUARDED = Policy(
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
    plan = keep_read_times(plan_cycle(state, outcomes, t(minute), GUARDED), state)
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
    state = plan_cycle(State(), first, t(0), Policy()).state
    outcomes: dict[str, SourceOutcome] = {
        "dmapi": unchanged(state.sources["dmapi"]),
        "rucio": patched(state.sources["rucio"], state.sources["rucio"].replicas, {Site("A")}),
    }
    plan = keep_read_times(plan_cycle(state, outcomes, t(5), Policy(), [drain]), state)
    assert plan.sites[Site("C")].unavailable == ("RSE C_DISK: availability_read false",)
    assert plan.sites[Site("A")].available == ()  # drained
    assert plan.sites[Site("A")].updated == t(0)


def test_lag_is_never_negative() -> None:
    assert lag_seconds([t(0), t(2)], t(1)) == [60.0, 0.0]
    assert lag_seconds([t(0)], t(0) + timedelta(seconds=1.5)) == [1.5]


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
