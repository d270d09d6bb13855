"""Rucio events as hints (hydrator.core.event_hints), table by table: what a message asks to
re-read, what is dropped, the bounded batch and what a full read covers of it, what an event
cycle reads (the backlog), when the full read is due."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from hydrator.core.event_hints import (
    Backlog,
    Batch,
    Hint,
    Ignored,
    ListenerStatus,
    ReconcilePolicy,
    RucioEvent,
    Taken,
    Triage,
    full_read_due,
    hint_of,
    lag_seconds,
    type_label,
)
from hydrator.domain import (
    DatasetId,
)
from tests.unit.factories import t

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
    # the same rule for a header the listener drops (no header: no type)
    assert type_label("deletion-done") == "deletion-done"
    assert type_label("") == "other"


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


# A full read covers the batch (Batch.drop_covered): what was named before it began is
# dropped, what was named (again) while it ran stays for an event cycle.

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def hint(*names: str) -> Hint:
    return Hint(frozenset(DatasetId("ska", n) for n in names))


def test_what_was_named_before_the_full_read_began_is_dropped_the_rest_kept() -> None:
    batch = Batch(capacity=100_000, file_capacity=10)
    for i in range(1000):
        batch.add(hint(f"obs{i}"), T0)
    batch.add(Hint(files=frozenset({("ska", "f1")})), T0)
    began = batch.arrivals  # the full read begins here
    batch.add(hint("late"), T0)  # arrives while it runs
    batch.add(hint("obs7"), T0)  # named again while it runs: its change may be after the read
    assert batch.drop_covered(began) == 1000  # 999 datasets and the file
    assert sorted(d.name for d in batch.datasets) == ["late", "obs7"]
    assert batch.files == {}
    taken, _times, _reconcile = batch.take(500)
    assert sorted(d.name for d in taken) == ["late", "obs7"]


def test_nothing_held_nothing_dropped_and_taken_hints_are_not_counted_again() -> None:
    batch = Batch(capacity=10)
    assert batch.drop_covered(batch.arrivals) == 0
    batch.add(hint("a", "b"), T0)
    batch.take(10)
    assert batch.drop_covered(batch.arrivals) == 0


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


def test_lag_is_never_negative() -> None:
    assert lag_seconds([t(0), t(2)], t(1)) == [60.0, 0.0]
    assert lag_seconds([t(0)], t(0) + timedelta(seconds=1.5)) == [1.5]


def backlog() -> Backlog:
    return Backlog(Triage(), Batch(capacity=10, file_capacity=10))


def test_the_first_hint_arms_an_event_cycle_that_reads_what_was_held() -> None:
    held = backlog()
    assert held.add(RucioEvent("rule_ok", dataset=DS, created_at=t(1)), now=5.0) is None
    assert held.add(RucioEvent("rule_ok", dataset=DS2, created_at=t(2)), now=6.0) is None
    assert held.add(RucioEvent("email"), now=7.0) is Ignored.IRRELEVANT
    assert held.first_hint == 5.0  # the debounce counts from the first
    assert held.take(max_reads=5, max_lookups=5, now=8.0) == Taken([DS, DS2], [], [t(1), t(2)])
    assert held.first_hint is None
    assert held.take(max_reads=5, max_lookups=5, now=9.0) is None  # nothing held


def test_files_left_for_later_lookups_arm_the_next_cycle_at_once() -> None:
    held = backlog()
    for name in ("f1", "f2"):
        held.add(RucioEvent("deletion-done", file=("ska", name), rse="R1"), now=1.0)
    assert held.take(max_reads=5, max_lookups=1, now=2.0) == Taken([], [("ska", "f1")], [])
    assert held.first_hint == 2.0
    assert held.take(max_reads=5, max_lookups=1, now=3.0) == Taken([], [("ska", "f2")], [])
    assert held.first_hint is None


def test_a_marked_full_read_holds_the_event_cycles_and_its_success_drops_what_it_covered() -> None:
    held = backlog()
    held.add(RucioEvent("deletion-done", rse="R1"), now=1.0)  # no file: only a full read covers
    held.add(RucioEvent("rule_ok", dataset=DS), now=2.0)
    assert held.marked
    assert held.take(max_reads=5, max_lookups=5, now=3.0) is None  # the full read covers DS
    assert held.first_hint is None
    held.full_read_begins(now=4.0, reconnected=True)
    held.add(RucioEvent("rule_ok", dataset=DS2), now=5.0)  # while it runs: not covered
    assert held.full_read_succeeded(4.0, t(4), now=6.0) == 1  # DS dropped
    assert (held.marked, held.last_full_read, held.reconnect_read) == (False, 4.0, 4.0)
    assert held.first_hint == 5.0  # DS2's arrival still arms the next cycle
    assert held.take(max_reads=5, max_lookups=5, now=7.0) == Taken([DS2], [], [])
    old = RucioEvent("rule_ok", dataset=DS, created_at=t(4) - timedelta(hours=1))
    assert held.add(old, now=8.0) is Ignored.OUT_OF_DATE  # the full read saw its effect
