"""Which lists of a site's view a replica goes into (hydrator.core.views.SiteLists), and the
bytes of the digest's extensions (hydrator.core.views.extended_digest)."""

from __future__ import annotations

from dataclasses import fields

import pytest

from hydrator.core.near import with_near
from hydrator.core.storage import unavailable_digest
from hydrator.core.views import (
    DIGEST_TAGS,
    LISTS,
    NEAR_TAG,
    STUCK_TAG,
    UNAVAILABLE_TAG,
    Entry,
    ListName,
    SiteLists,
    extended_digest,
    site_contents,
    stuck_digest,
)
from hydrator.domain import DatasetId, Detail, Replica, ReplicaState, Site, SiteView, Transfer

D = DatasetId("ska", "d")
S = Site("S")
AVAILABLE, PARTIAL = ReplicaState.AVAILABLE, ReplicaState.PARTIAL
REPLICATING, STUCK = ReplicaState.REPLICATING, ReplicaState.STUCK

# Each kind of replica -> the entries it makes, as (list, entry) pairs.
TABLE: list[tuple[Replica, set[tuple[ListName, Entry]]]] = [
    # complete, nothing moving: its dataset in available alone (model.views_of relies on it)
    (Replica(D, S, AVAILABLE), {("available", D)}),
    (Replica(D, S, AVAILABLE, 1.0, Detail(Transfer.NONE, 0.0, 1.0)), {("available", D)}),
    (
        Replica(D, S, AVAILABLE, 1.0, Detail(Transfer.REPLICATING, 0.4, 1.0)),
        {("available", D), ("incoming", (D, 0.4))},
    ),
    (
        Replica(D, S, AVAILABLE, 1.0, Detail(Transfer.STUCK, 0.2, 1.0)),
        {("available", D), ("stuck", D)},
    ),
    # partial: its share of files, and its share of bytes only where that differs
    (Replica(D, S, PARTIAL, 0.5), {("partial", (D, 0.5))}),
    (Replica(D, S, PARTIAL, 0.5, Detail(Transfer.NONE, 0.0, 0.5)), {("partial", (D, 0.5))}),
    (
        Replica(D, S, PARTIAL, 0.5, Detail(Transfer.NONE, 0.0, 0.7)),
        {("partial", (D, 0.5)), ("partial_bytes", (D, 0.7))},
    ),
    (
        Replica(D, S, PARTIAL, 0.5, Detail(Transfer.REPLICATING, 0.3, 0.6)),
        {("partial", (D, 0.5)), ("partial_bytes", (D, 0.6)), ("incoming", (D, 0.3))},
    ),
    (
        Replica(D, S, PARTIAL, 0.5, Detail(Transfer.STUCK, 0.2, 0.5)),
        {("partial", (D, 0.5)), ("stuck", D)},
    ),
    # absent: replicating with its progress and nowhere else; stuck in stuck alone
    (
        Replica(D, S, REPLICATING, 0.0, Detail(Transfer.REPLICATING, 0.3, 0.0)),
        {("replicating", (D, 0.3))},
    ),
    (Replica(D, S, STUCK, 0.0, Detail(Transfer.STUCK, 0.1, 0.0)), {("stuck", D)}),
]


@pytest.mark.parametrize(("replica", "expected"), TABLE)
def test_each_kind_of_replica_makes_its_entries(
    replica: Replica, expected: set[tuple[ListName, Entry]]
) -> None:
    made = SiteLists.entries_of(replica.dataset, replica)
    assert len(made) == len(set(made))  # at most one entry per list
    assert set(made) == expected


@pytest.mark.parametrize(("replica", "expected"), TABLE)
def test_add_puts_those_entries_in_the_view(
    replica: Replica, expected: set[tuple[ListName, Entry]]
) -> None:
    (view,) = site_contents({S: {D: replica}}, frozenset({S})).values()
    found = {(name, entry) for name in LISTS for entry in getattr(view, name)}
    assert found == expected


def test_the_lists_are_the_views_fields() -> None:
    names = {f.name for f in fields(SiteView)}
    assert set(LISTS) <= names
    assert set(SiteLists.__slots__) == set(LISTS)


# ---- the digest's extensions

BASE_DIGEST = "0123456789abcdef"
STUCK_IDS = (DatasetId("user.alice", "data.2024"), DatasetId("mc", "run_7"))
REASONS = ("RSE_X: drained until 2026-12-01", "RSE_Y: disabled (déjà)")
NEAR = (Site("SITE_B"), Site("SITE_C"))


def test_each_extension_keeps_its_bytes() -> None:
    """The digests are persisted in the collector's ads: each extension's bytes are pinned
    (values computed by the code before extended_digest existed)."""
    plain = SiteView(Site("SITE_A"), (), (), (), (), None, BASE_DIGEST)
    assert stuck_digest(BASE_DIGEST, STUCK_IDS) == "7e52a0b1de75d12b"
    assert stuck_digest(BASE_DIGEST, ()) == "79c4bb492d3df538"
    assert unavailable_digest(BASE_DIGEST, REASONS) == "9731f3b6ebd20994"
    assert with_near(plain, NEAR).digest == "70be8ef07f6c0fd1"
    assert with_near(plain, ()).digest == "c5470a45ab473c64"
    names = (f"{d.scope}:{d.name}" for d in STUCK_IDS)
    assert extended_digest(BASE_DIGEST, STUCK_TAG, names) == "7e52a0b1de75d12b"
    assert extended_digest(BASE_DIGEST, UNAVAILABLE_TAG, REASONS) == "9731f3b6ebd20994"
    assert extended_digest(BASE_DIGEST, NEAR_TAG, NEAR) == "70be8ef07f6c0fd1"


def test_the_extensions_have_distinct_tags() -> None:
    assert len(set(DIGEST_TAGS)) == len(DIGEST_TAGS)
    assert all(len(tag) == 1 for tag in DIGEST_TAGS)
