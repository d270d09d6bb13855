"""The presence and transfer decisions (``hydrator.core.presence``), one table per decision.

Each row is a case a catalogue can produce, named by what a user of the ads would notice."""

from __future__ import annotations

from typing import NamedTuple

import pytest

from hydrator.core.presence import (
    NOTHING,
    Counts,
    SiteTransfer,
    Wait,
    bytes_share,
    exact,
    fallback,
    files_share,
    lock_progress,
    merge_transfers,
    rule_transfer,
    rule_transfers,
    says_complete,
    settled,
    towards,
    vouched,
)
from hydrator.domain import DatasetId, Detail, Replica, ReplicaState, Site, Transfer

D = DatasetId("ska", "obs_1")
A, B = Site("SITE_A"), Site("SITE_B")
NONE, REPL, STUCK = Transfer.NONE, Transfer.REPLICATING, Transfer.STUCK


def moving(
    transfer: Transfer, progress: float, floor: float = 0.0, only: set[str] | None = None
) -> SiteTransfer:
    return SiteTransfer(A, transfer, progress, floor, None if only is None else frozenset(only))


# -- a summary row's verdict ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "length", "available", "complete"),
    [
        ("AVAILABLE", 4, 4, True),  # every file present
        ("AVAILABLE", 4, 5, True),  # more counted than listed (abacus lag): still complete
        ("AVAILABLE", 4, 3, False),  # a file missing: partial
        ("UNAVAILABLE", 4, 4, False),  # abacus has not said AVAILABLE
        ("AVAILABLE", 0, 0, False),  # an empty row (abacus not run yet) is no holding
        ("COPYING", 4, 0, False),
    ],
)
def test_a_summary_row_says_complete_only_when_available_with_every_file(
    state: str, length: int, available: int, complete: bool
) -> None:
    assert says_complete(state, length, available) is complete


@pytest.mark.parametrize(
    ("available", "length", "present", "size", "files", "bytes_"),
    [
        (1, 4, 100, 1000, 0.25, 0.1),
        (0, 0, 0, 0, 0.0, 0.0),  # no files: nothing present
        (2, 4, 0, 0, 0.5, 0.5),  # no bytes known: the files share stands in
    ],
)
def test_shares_of_files_and_bytes(
    available: int, length: int, present: int, size: int, files: float, bytes_: float
) -> None:
    assert files_share(available, length) == files
    assert bytes_share(available, length, present, size) == bytes_
    counts = Counts(length, available, size, present)
    assert (counts.files_share, counts.bytes_share) == (files, bytes_)


@pytest.mark.parametrize(
    ("a", "b", "more"),
    [
        (Counts(4, 3, 0, 0), Counts(4, 2, 0, 0), True),  # more files
        (Counts(4, 2, 10, 9), Counts(4, 2, 10, 5), True),  # as many files, more bytes
        (Counts(4, 2, 10, 9), Counts(4, 3, 10, 1), False),  # files first
        (Counts(4, 2, 10, 5), Counts(4, 2, 10, 5), False),  # equal: not more
    ],
)
def test_of_two_rses_of_a_site_the_one_holding_more_counts(
    a: Counts, b: Counts, more: bool
) -> None:
    assert a.holds_more_than(b) is more


# -- a rule's transfer ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ok", "replicating", "stuck", "listed_stuck", "transfer", "progress"),
    [
        (2, 1, 1, False, STUCK, 0.5),  # one stuck lock makes the rule stuck, whatever its state
        (2, 2, 0, True, REPL, 0.5),  # locks moving again: replicating though listed STUCK
        (3, 0, 0, False, NONE, 1.0),  # every lock OK: done before the judge re-evaluates
        (0, 0, 0, False, REPL, 0.0),  # no locks yet: its listed state
        (0, 0, 0, True, STUCK, 0.0),
    ],
)
def test_a_rule_transfer_follows_its_lock_counts_before_its_listed_state(
    ok: int, replicating: int, stuck: int, listed_stuck: bool, transfer: Transfer, progress: float
) -> None:
    assert rule_transfer(ok, replicating, stuck, listed_stuck=listed_stuck) is transfer
    assert lock_progress(ok, replicating, stuck) == progress


@pytest.mark.parametrize(
    ("a", "b", "winner"),
    [
        ((STUCK, 0.1), (REPL, 0.9), (STUCK, 0.1)),  # stuck wins over replicating: needs an operator
        ((REPL, 0.9), (STUCK, 0.1), (STUCK, 0.1)),  # (order-free)
        ((REPL, 0.2), (REPL, 0.7), (REPL, 0.7)),  # two replicating: the further one
        ((STUCK, 0.2), (STUCK, 0.6), (STUCK, 0.6)),
    ],
)
def test_two_rules_towards_one_site_the_more_urgent_transfer_wins(
    a: tuple[Transfer, float], b: tuple[Transfer, float], winner: tuple[Transfer, float]
) -> None:
    merged = merge_transfers(moving(*a, floor=a[1], only={"X"}), moving(*b, floor=b[1]))
    assert (merged.transfer, merged.progress) == winner
    assert merged.floor == max(a[1], b[1])  # the larger proof of files present counts
    assert merged.only is None  # two rules: neither counts the site's files alone


class Rule(NamedTuple):
    expression: str
    transfer: Transfer
    progress: float


SITES = {"A1": A, "A2": A, "B1": B}
RESOLVED = {"A1": frozenset({"A1"}), "A1|A2": frozenset({"A1", "A2"}), "A1|B1": {"A1", "B1"}}


@pytest.mark.parametrize(
    ("rules", "expected"),
    [
        ([], ()),
        (  # a rule on one site's RSEs vouches for its OK locks there
            [Rule("A1|A2", REPL, 0.5)],
            (SiteTransfer(A, REPL, 0.5, 0.5, frozenset({"A1", "A2"})),),
        ),
        (  # a rule spread over two sites: its locks prove nothing about either alone
            [Rule("A1|B1", REPL, 0.5)],
            (SiteTransfer(A, REPL, 0.5), SiteTransfer(B, REPL, 0.5)),
        ),
        (  # two rules towards one site: merged
            [Rule("A1", REPL, 0.9), Rule("A1|A2", STUCK, 0.2)],
            (SiteTransfer(A, STUCK, 0.2, 0.9),),
        ),
    ],
)
def test_rule_transfers_are_each_rule_as_the_transfer_towards_each_site_it_reaches(
    rules: list[Rule], expected: tuple[SiteTransfer, ...]
) -> None:
    resolved = {k: frozenset(v) for k, v in RESOLVED.items()}
    got = rule_transfers(rules, resolved, SITES)
    assert sorted(got, key=lambda m: m.site) == list(expected)
    assert towards(got, B) == next((m for m in expected if m.site == B), None)


@pytest.mark.parametrize(
    ("covered", "sites", "expected"),
    [
        (None, [A], False),
        ((moving(REPL, 0.5),), [A], False),  # a rule, but no OK lock at one site
        ((moving(REPL, 0.5, floor=0.5),), [A], True),
        ((moving(REPL, 0.5, floor=0.5),), [B], False),  # not at a pending site
    ],
)
def test_a_pair_is_vouched_for_when_ok_locks_prove_files_at_a_pending_site(
    covered: tuple[SiteTransfer, ...] | None, sites: list[Site], expected: bool
) -> None:
    assert vouched(covered, sites) is expected


# -- the pair's replica --------------------------------------------------------------------


def plain(state: ReplicaState, fraction: float = 1.0, detail: Detail | None = None) -> Replica:
    return Replica(D, A, state, fraction, detail)


AVAILABLE, PARTIAL = ReplicaState.AVAILABLE, ReplicaState.PARTIAL


@pytest.mark.parametrize(
    ("complete", "rses", "move", "expected"),
    [
        (True, ["A1"], None, plain(AVAILABLE)),  # complete: advertised
        (  # complete while a stuck rule points there: presence wins, the rule beside it
            True,
            ["A1", "A2"],
            moving(STUCK, 0.3),
            plain(AVAILABLE, 1.0, Detail(STUCK, 0.3, 1.0)),
        ),
        (  # one rule holding every row of the site: its OK locks count the files exactly
            False,
            ["A1"],
            moving(REPL, 0.5, floor=0.5, only={"A1", "A2"}),
            plain(PARTIAL, 0.5, Detail(REPL, 0.5, 0.5)),
        ),
        (  # no file yet, one rule replicating towards the site
            False,
            [],
            moving(REPL, 0.0, floor=0.0, only={"A1"}),
            plain(ReplicaState.REPLICATING, 0.0, Detail(REPL, 0.0, 0.0)),
        ),
        (False, [], None, None),  # nothing there, nothing moving: no replica
        (False, ["A1"], None, Wait.PENDING),  # a partial row: needs an exact count
        (False, ["A2"], moving(REPL, 0.5, only={"A1"}), Wait.PENDING),  # a row beyond the rule
        (False, [], moving(STUCK, 0.5), Wait.PENDING),  # a rule over two sites: count exactly
    ],
)
def test_a_pair_is_settled_by_its_rows_where_they_tell(
    complete: bool, rses: list[str], move: SiteTransfer | None, expected: object
) -> None:
    assert settled(D, A, complete, rses, move) == expected


class Row(NamedTuple):
    available: int
    files_share: float
    bytes_share: float


half = moving(REPL, 0.5, floor=0.5)  # a rule whose OK locks prove half the files there


@pytest.mark.parametrize(
    ("rows", "move", "expected"),
    [
        ([Row(1, 0.25, 0.2), Row(3, 0.75, 0.6)], None, plain(PARTIAL, 0.75, Detail(NONE, 0, 0.6))),
        ([Row(1, 0.25, 0.25)], half, plain(PARTIAL, 0.5, Detail(REPL, 0.5, 0.5))),  # locks: more
        ([Row(3, 0.75, 0.75)], half, plain(PARTIAL, 0.75, Detail(REPL, 0.5, 0.75))),  # row: more
        ([], None, None),  # no row, no rule: nothing
        ([], moving(STUCK, 0.0), plain(ReplicaState.STUCK, 0.0, Detail(STUCK, 0.0, 0.0))),
    ],
)  # fmt: skip
def test_without_an_exact_count_the_best_row_or_the_locks_whichever_shows_more(
    rows: list[Row], move: SiteTransfer | None, expected: Replica | None
) -> None:
    assert fallback(D, A, rows, move) == expected


@pytest.mark.parametrize(
    ("counts", "move", "expected"),
    [
        (Counts(4, 4, 40, 40), None, plain(AVAILABLE)),
        (Counts(4, 2, 40, 10), None, plain(PARTIAL, 0.5, Detail(NONE, 0.0, 0.25))),
        (NOTHING, None, None),  # the site holds none of it
        (NOTHING, moving(REPL, 0.4), plain(ReplicaState.REPLICATING, 0.0, Detail(REPL, 0.4, 0.0))),
    ],
)
def test_an_exact_count_decides_presence(
    counts: Counts, move: SiteTransfer | None, expected: Replica | None
) -> None:
    assert exact(D, A, counts, move) == expected
