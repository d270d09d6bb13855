"""The Rucio source's bad-replica decisions: which (site, dataset) pairs a
listed bad or unavailable replica forces to an exact check, which pairs change, that forced
datasets are checked first, and the bounds of the reader (records and parent lookups)."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from hydrator.adapters.sources.rucio.badlist import BadReplicas
from hydrator.adapters.sources.rucio.book import (
    Book,
    Cycle,
    Dataset,
    Dirty,
    changed_pairs,
    forced_pairs,
)
from hydrator.adapters.sources.rucio.deep import deep_order
from hydrator.adapters.sources.rucio.sites import Rse, RseTable
from hydrator.config import RucioSourceConfig
from hydrator.domain import DatasetId, Site

X, Y = Site("SITE-X"), Site("SITE-Y")
SITES = {"X_DISK": X, "X_TAPE": X, "Y_DISK": Y}


def dataset(name: str) -> Dataset:
    did = DatasetId("ska", name)
    return Dataset(did, ("ska", name))


def test_a_listed_file_forces_each_known_dataset_holding_it_at_its_rses_site() -> None:
    d1, d2 = dataset("d1"), dataset("d2")
    datasets = {("ska", "d1"): d1, ("ska", "d2"): d2}
    parents = {
        ("ska", "f1"): (("ska", "d1"), ("ska", "d2")),  # a file in two datasets
        ("ska", "f2"): (("ska", "unknown"),),  # a dataset with no summary row: none
    }
    listed = [
        ("ska", "f1", "X_DISK"),
        ("ska", "f2", "X_DISK"),
        ("ska", "f1", "UNMAPPED"),  # an RSE that maps to no site: none
        ("ska", "f3", "Y_DISK"),  # not looked up yet: none
    ]
    assert forced_pairs(listed, parents, datasets, SITES) == {X: {d1, d2}}


def test_only_pairs_forced_or_released_since_the_last_fetch_change() -> None:
    d1, d2, d3 = dataset("d1"), dataset("d2"), dataset("d3")
    old = {X: {d1, d2}}
    new = {X: {d2}, Y: {d3}}
    assert set(changed_pairs(new, old)) == {(X, d1), (Y, d3)}
    assert list(changed_pairs(old, old)) == []


def test_forced_datasets_are_checked_first_even_past_the_limit() -> None:
    book = Book()
    names = [dataset(f"d{i}") for i in range(5)]
    for d in names:
        book.datasets[d.key] = d
        book.pending[d] = (X,)
    book.forced = {X: {names[4]}, Y: {names[3]}}  # d3 forced at Y but pending only at X
    wanted = {names[2].id: 7}
    assert deep_order(book, wanted, 2) == [names[3], names[4]]
    assert deep_order(book, wanted, 3) == [names[3], names[4], names[2]]
    book.forced = {}
    book.order = None
    assert deep_order(book, wanted, 2) == [names[2], names[0]], "as before without any"


class Wire:
    """The two calls the reader makes, answered from fixed records; calls are counted."""

    def __init__(self, listed: dict[str, list[Any]], parents: dict[str, list[Any]]) -> None:
        self.listed, self.parents = listed, parents
        self.calls: list[tuple[str, Any]] = []

    def bad_replicas(self, state: str, limit: int) -> list[Any]:
        self.calls.append(("bad", (state, limit)))
        return self.listed.get(state, [])[:limit]

    def parent_dids(self, scope: str, name: str) -> list[Any]:
        self.calls.append(("parents", name))
        return self.parents.get(name, [])


def config(**overrides: Any) -> RucioSourceConfig:
    return RucioSourceConfig(type="rucio", **overrides)


def cycle() -> Cycle:
    return Cycle(RseTable({rse: Rse(rse, site) for rse, site in SITES.items()}))


def test_the_reader_is_bounded_keeps_parents_and_counts_malformed_records(
    caplog: pytest.LogCaptureFixture,
) -> None:
    d1 = dataset("d1")
    book = Book(datasets={("ska", "d1"): d1})
    bad = [{"scope": "ska", "name": f"f{i}", "rse": "X_DISK"} for i in range(3)]
    bad.append({"scope": "ska", "name": "elsewhere", "rse": "OTHER"})  # never looked up
    wire = Wire(
        {"B": [*bad, "junk", {"scope": 1}], "T": []},
        {f"f{i}": [{"scope": "ska", "name": "d1", "type": "DATASET"}] for i in range(3)},
    )
    reader = BadReplicas(config(bad_replicas_max=5, bad_parent_lookups_max=2))
    scratch, dirty = cycle(), Dirty()
    with caplog.at_level(logging.WARNING):
        reader.read(wire, book, scratch, dirty)
    assert ("bad", ("B", 6)) in wire.calls and ("bad", ("T", 6)) in wire.calls
    assert "more than bad_replicas_max=5 replicas listed in state B" in caplog.text
    assert scratch.invalid == 1, "the one malformed record read (the other is past the limit)"
    assert [c for c in wire.calls if c[0] == "parents"] == [("parents", "f0"), ("parents", "f1")]
    assert reader.unresolved == 1 and book.forced == {X: {d1}} and dirty.pairs == {X: {d1}}

    wire.calls.clear()
    dirty = Dirty()
    reader.read(wire, book, cycle(), dirty)
    assert [c for c in wire.calls if c[0] == "parents"] == [("parents", "f2")], "kept"
    assert dirty.pairs == {}, "still forced: not settled again"

    wire.listed = {}
    reader.read(wire, book, cycle(), dirty)
    assert book.forced == {} and dirty.pairs == {X: {d1}} and reader.parents == {}


def test_zero_reads_nothing() -> None:
    wire = Wire({"B": [{"scope": "ska", "name": "f", "rse": "X_DISK"}]}, {})
    BadReplicas(config(bad_replicas_max=0)).read(wire, Book(), cycle(), Dirty())
    assert wire.calls == []
