"""The benchmark's synthetic federation has the requested sizes and is deterministic."""

from __future__ import annotations

from benchmarks.generate import Federation, Scale


def test_generator_produces_the_requested_counts_deterministically() -> None:
    scale = Scale(replicas=10_000, slots=2_000)
    a, b = Federation(scale, seed=7), Federation(scale, seed=7)
    summary = a.summary()
    assert summary["replicas"] == 10_000 and summary["datasets"] == 1_000
    assert summary["sites"] == 50 and summary["rses"] == 200 and summary["slots"] == 2_000
    states = summary["states"]
    assert isinstance(states, dict) and set(states) == {
        "available",
        "partial",
        "replicating",
        "stuck",
    }
    assert a.holdings == b.holdings and a.slots == b.slots

    churn = a.churn()
    assert (churn.added, churn.removed, churn.changed) == (40, 40, 20)
    assert len(a.holdings) == 10_000 and a.holdings != b.holdings
    b.churn()
    assert a.holdings == b.holdings, "the same seed churns the same way"
    assert Federation(scale, seed=8).holdings != b.holdings

    snapshot = a.snapshot()
    assert len(snapshot.replicas) == 10_000 and len(snapshot.sites) == 50
