"""The arrival scenario (benchmarks/arrival.py): how it attributes a sample of slot1's ad to a
change, and a tiny run end to end on the real stack (Rucio server, its hermes, ActiveMQ,
``hydrator run``, the test pool). Figures are not asserted: they are the benchmark's."""

from __future__ import annotations

from contextlib import ExitStack

import pytest

from benchmarks import arrival
from tests.support.pool import Pool

A, B = "s:a", "s:b"


def carrying(available: set[str], replicating: set[str] | None = None) -> arrival.Lists:
    """slot1's lists as a sample has them (every list present, most empty)."""
    lists = dict.fromkeys(arrival.LISTS, frozenset[str]())
    return lists | {
        "AvailableDatasets": frozenset(available),
        "ReplicatingDatasets": frozenset(replicating or ()),
    }


def test_an_addition_is_seen_at_the_first_sample_listing_it() -> None:
    samples: list[arrival.Seen] = [(1.0, carrying({B})), (2.0, None), (3.0, carrying({A}))]
    assert arrival.added_at(samples, A, 0.5) == 2.5
    assert arrival.added_at(samples, A, 3.5) is None  # nothing sampled after the change


def test_a_deletion_is_seen_once_no_later_sample_names_it_in_any_list() -> None:
    samples: list[arrival.Seen] = [
        (1.0, carrying({A})),
        (2.0, None),  # wiped: bare, not a deletion
        (3.0, carrying(set(), replicating={A})),  # left available for replicating: still there
        (4.0, None),
        (5.0, carrying({B})),
        (6.0, carrying(set())),
    ]
    assert arrival.removed_at(samples, A, 0.0) == 5.0
    assert arrival.removed_at(samples, B, 0.0) == 6.0
    assert arrival.removed_at(samples[:3], A, 0.0) is None  # the last carrying one names it


@pytest.mark.pool
@pytest.mark.rucio
@pytest.mark.activemq
@pytest.mark.slow
def test_a_tiny_run_gives_every_figure(condor_pool: Pool) -> None:
    args = arrival.parse(
        ["--changes", "3", "--keep", "0", "--delete-batch", "2", "--arrivals", "2"]
    )
    with ExitStack() as stack:
        admin, broker, _ = arrival.real_stack(stack)
        side = arrival.side("new", None, admin, broker, condor_pool, args)
    assert side["side"] == "new" and side["hydrator"].endswith("hydrator/__init__.py")
    assert side["slot"]["add_slot"]["n"] == side["slot"]["del_slot"]["n"] == 3
    assert side["slot"]["samples"] > 0
    assert side["arrival"]["all"]["n"] == 2
    assert side["arrival"]["plain"]["n"] == side["arrival"]["reschedule"]["n"] == 1
    assert side["counters"]["received"] > 0
    assert isinstance(arrival.missed("new", side), list)
