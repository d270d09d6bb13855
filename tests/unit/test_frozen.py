"""Domain values are truly frozen: no instance ``__dict__`` to write a cache into, no
``object.__setattr__`` around the dataclass guard; derived views are held beside a state
(:class:`hydrator.core.model.Model`), never on it."""

from __future__ import annotations

import dataclasses
import inspect
import re
from collections.abc import Callable
from pathlib import Path

import pytest

import hydrator
from hydrator import domain
from hydrator.core.model import Model
from hydrator.domain import (
    Change,
    ChangeKind,
    DatasetId,
    Replica,
    ReplicaState,
    Site,
    SourceState,
    State,
)
from hydrator.names import InvalidNameError
from tests.unit.factories import rep

DOMAIN_DATACLASSES = [
    cls
    for _, cls in inspect.getmembers(domain, inspect.isclass)
    if cls.__module__ == domain.__name__ and dataclasses.is_dataclass(cls)
]
# Ways to write an attribute behind a frozen dataclass's back.
BYPASS = re.compile(r"__dict__\s*\[|__dict__\.(update|setdefault)|object\.__setattr__")


@pytest.mark.parametrize("cls", DOMAIN_DATACLASSES, ids=lambda c: c.__name__)
def test_every_domain_dataclass_is_frozen_without_an_instance_dict(cls: type) -> None:
    assert dataclasses.is_dataclass(cls)
    with pytest.raises(dataclasses.FrozenInstanceError):  # the generated __setattr__ refuses
        cls.__setattr__(object.__new__(cls), dataclasses.fields(cls)[0].name, None)
    assert all("__dict__" not in vars(k) for k in cls.__mro__), f"{cls.__name__} has __dict__"


def test_no_module_writes_behind_a_frozen_dataclass() -> None:
    root = Path(hydrator.__file__).parent
    found = [
        f"{path.relative_to(root)}:{number}: {line.strip()}"
        for path in sorted(root.rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if BYPASS.search(line)
    ]
    assert found == []


def test_a_state_refuses_writes_and_its_views_are_held_beside_it() -> None:
    source = SourceState("rucio", frozenset({rep("SITE_A", "d1")}), frozenset({Site("SITE_A")}))
    state = State(sources={"rucio": source})
    with pytest.raises(TypeError):  # no instance __dict__ to write a cache into
        vars(state)
    with pytest.raises(dataclasses.FrozenInstanceError):
        write(state, "sources", {})
    derived = Model.of(state)
    assert derived.contents[Site("SITE_A")].available == (rep("SITE_A", "d1").dataset,)
    assert derived.contents is derived.contents  # built once, then reused
    assert derived.entries == 1


def test_the_views_of_a_replaced_state_are_its_own() -> None:
    """A new state's derived data is built from it: views of other sources never leak."""
    before = SourceState("rucio", frozenset({rep("A", "d1")}), frozenset({Site("A")}))
    old = Model.of(State(sources={"rucio": before}))
    assert list(old.contents) == ["A"] and old.entries == 1
    assert old.contents[Site("A")].available == (rep("A", "d1").dataset,)
    source = SourceState("rucio", frozenset({rep("B", "d2")}), frozenset({Site("B")}))
    new = Model.of(dataclasses.replace(old.state, sources={"rucio": source}), old)
    assert list(new.contents) == ["B"] and new.entries == 1
    assert new.contents[Site("B")].available == (rep("B", "d2").dataset,)
    assert not any(hasattr(v, "memo") for v in (before, source, old.state))


@pytest.mark.parametrize(
    "value",
    [
        DatasetId("ska", "x"),
        rep("A", "x"),
        Change(Site("A"), DatasetId("ska", "x"), ChangeKind.ADDED, None, rep("A", "x")),
    ],
    ids=lambda v: type(v).__name__,
)
def test_the_tuple_based_domain_values_are_immutable_without_an_instance_dict(
    value: tuple[object, ...],
) -> None:
    """DatasetId, Replica and Change are tuples (hashed and compared in C): no field can be
    set or added, and equal values hash equal."""
    assert all("__dict__" not in vars(k) for k in type(value).__mro__)
    with pytest.raises(AttributeError):
        write(value, "site", Site("B"))
    with pytest.raises(AttributeError):
        write(value, "cache", 1)
    make: Callable[..., tuple[object, ...]] = type(value)  # each takes its fields positionally
    copy = make(*value)
    assert copy == value and hash(copy) == hash(value) and copy is not value


def test_a_replica_is_validated_like_before_and_equal_facts_are_equal_records() -> None:
    with pytest.raises(ValueError, match=r"outside 0\.\.1"):
        Replica(DatasetId("ska", "x"), Site("A"), ReplicaState.PARTIAL, 1.5)
    with pytest.raises(ValueError, match="needs a transfer"):
        Replica(DatasetId("ska", "x"), Site("A"), ReplicaState.STUCK, 0.0)
    with pytest.raises(InvalidNameError):
        DatasetId("ska", "bad name")
    assert Replica(DatasetId("ska", "x"), Site("A"), state=ReplicaState.AVAILABLE) == rep("A", "x")
    assert hash(ReplicaState.AVAILABLE) == hash(ReplicaState.AVAILABLE)  # by identity, in C


def write(value: object, field: str, new: object) -> None:
    """Assign as ordinary code would; a frozen value refuses (mypy needs no exception for it)."""
    setattr(value, field, new)
