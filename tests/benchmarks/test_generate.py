"""The benchmark's synthetic federation has the requested sizes and is deterministic."""

from __future__ import annotations

import random

from benchmarks.generate import CompactHoldings, Federation, Scale


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


def test_compact_holdings_keep_what_a_dict_keeps_in_its_order() -> None:
    """The federation's store answers as a ``dict`` would after the same writes and deletions,
    in the same order (a key deleted and written again moves last): churn samples by position,
    so the order is the federation."""
    rng = random.Random(3)
    compact, plain = CompactHoldings(50), dict[int, int]()
    for _ in range(5000):
        key = rng.randrange(3000)
        if key in plain and rng.random() < 0.4:
            del compact[key], plain[key]
        else:
            compact[key] = plain[key] = rng.randrange(4) | rng.randrange(101) << 2
        if rng.random() < 0.01:
            assert list(compact.items()) == list(plain.items())
    assert list(compact.items()) == list(plain.items()) and len(compact) == len(plain)
