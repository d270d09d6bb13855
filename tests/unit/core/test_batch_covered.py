"""A full read covers the batch (hydrator.core.event_hints.Batch.drop_covered): what was named
before it began is dropped, what was named (again) while it ran stays for an event cycle."""

from __future__ import annotations

from datetime import UTC, datetime

from hydrator.core.event_hints import Batch, Hint
from hydrator.domain import DatasetId

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
