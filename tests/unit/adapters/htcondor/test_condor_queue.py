"""What the queue and probe reader makes of ad values: a job's ``RequiredDatasets`` as names
(and the demand they make), a slot's site through its partitionable parent."""

from __future__ import annotations

import pytest

from hydrator.adapters.htcondor.condor_queue import required_names, slot_site
from hydrator.core.queue import demand_of_names
from hydrator.domain import Site


@pytest.mark.parametrize(
    ("value", "names"),
    [
        (["ska:a", "ska:b"], ["ska:a", "ska:b"]),
        ("ska:a, ska:b", ["ska:a", "ska:b"]),
        ("ska:a ska:b", ["ska:a", "ska:b"]),
        ("", []),
        ([1, "ska:a"], ["1", "ska:a"]),
    ],
)
def test_required_names(value: object, names: list[str]) -> None:
    assert required_names(value) == names


def test_demand_counts_a_job_once_per_dataset_and_skips_invalid_names() -> None:
    values = [["ska:a", "ska:a", "ska:b"], ["ska:a", "bad name"], 7]
    demand = demand_of_names(required_names(v) for v in values)
    assert {str(k): v for k, v in demand.counts.items()} == {"ska:a": 2, "ska:b": 1}
    assert demand.invalid == 2
    assert demand.jobs == 3


def test_slot_site_falls_back_to_the_partitionable_parent() -> None:
    sites = {"slot1@h": Site("A"), "slot4@h": Site("C"), "slot4_2@h": Site("C2")}
    assert slot_site(sites, "slot1@h") == "A"
    assert slot_site(sites, "slot4_2@h") == "C2"
    assert slot_site(sites, "slot4_1@h") == "C"  # not advertised yet
    assert slot_site(sites, "slot9_1@h") is None
    assert slot_site(sites, "slot1_1@other") is None
