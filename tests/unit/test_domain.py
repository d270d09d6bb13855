"""Domain values: building a snapshot."""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hydrator.core.views import content_digest
from hydrator.domain import DatasetId, Site, Snapshot, check_site
from hydrator.names import InvalidNameError
from tests.unit.factories import rep

DATASETS = [DatasetId(s, n) for s in ("ska", "lsst") for n in ("a", "b/c#1", "d.e", "f")]


def test_a_snapshot_of_unique_replicas_keeps_the_given_objects() -> None:
    a = rep("SITE_A", "a", "available")
    b = rep("SITE_B", "a", "partial", 0.5)
    given = frozenset({a, b})
    snapshot = Snapshot.of("rucio", given, sites=[Site("SITE_C")])
    assert snapshot.replicas is given  # no copy: the core can compare by identity
    assert snapshot.sites == {"SITE_A", "SITE_B", "SITE_C"}


def _digest_as_specified(site: str, lists: list[list[DatasetId]]) -> str:
    """The digest's bytes as published since version 1 (ads in collectors carry it)."""
    h = hashlib.sha256(site.encode())
    for label, names in zip((b"A", b"P", b"R"), lists, strict=True):
        h.update(b"\0" + label)
        for d in names:
            h.update(b"\n" + f"{d.scope}:{d.name}".encode())
    return h.hexdigest()[:16]


@given(
    st.lists(st.lists(st.sampled_from(DATASETS), unique=True).map(sorted), min_size=3, max_size=3)
)
def test_the_site_digest_keeps_its_bytes(lists: list[list[DatasetId]]) -> None:
    available, partial, replicating = lists
    digest = content_digest(
        Site("SRCNET_CH"),
        tuple(available),
        tuple((d, 0.5) for d in partial),
        tuple((d, 0.1) for d in replicating),
    )
    assert digest == _digest_as_specified("SRCNET_CH", lists)


@pytest.mark.parametrize(
    "make",
    [
        lambda: DatasetId("ska", "obs_$1"),
        lambda: DatasetId("ska", "$ENV(HOME)"),
        lambda: DatasetId("ska", "a$(FULL_HOSTNAME)"),
        lambda: DatasetId("$ska", "a"),
        lambda: DatasetId.parse("ska$:a"),
        lambda: check_site("SITE_$A"),
        lambda: check_site("$(SITE)"),
    ],
)
def test_a_name_holding_a_dollar_is_invalid(make: Callable[[], object]) -> None:
    """HTCondor expands $(...) and $ENV(...) in configuration, which the glidein hook writes
    (a name could inject one there): no dataset or site name may hold a `$`."""
    with pytest.raises(InvalidNameError):
        make()
