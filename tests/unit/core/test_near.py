"""Near sites from network distances, table by table: the site distances (nearest pair of
elements), the near lists, and every kind of bad input keeping what was last good."""

from __future__ import annotations

import pytest

from hydrator.core.near import (
    ElementDistances,
    NearTable,
    checked_pairs,
    near_sites,
    operator_distances,
    refresh,
    site_distances,
    with_near,
)
from hydrator.core.views import content_digest
from hydrator.domain import Site, SiteView

A, B, C, D = (Site(f"SITE_{x}") for x in "ABCD")
ELEMENTS = {"A_DISK": A, "A_TAPE": A, "B_DISK": B, "C_DISK": C}


def view(site: Site) -> SiteView:
    return SiteView(site, (), (), (), (), None, content_digest(site, (), (), ()))


def read(*entries: tuple[str, str, object]) -> ElementDistances:
    return ElementDistances(ELEMENTS, list(entries))


def both(a: str, b: str, value: object) -> list[tuple[str, str, object]]:
    return [(a, b, value), (b, a, value)]


@pytest.mark.parametrize(
    ("entries", "expected"),
    [
        # the nearest pair of elements makes the site distance
        (both("A_DISK", "B_DISK", 5) + both("A_TAPE", "B_DISK", 2), {(A, B): 2, (B, A): 2}),
        # one direction stated is a link both ways
        ([("A_DISK", "C_DISK", 3)], {(A, C): 3, (C, A): 3}),
        # no link (None) and pairs within one site count not
        (both("A_DISK", "B_DISK", None) + both("A_DISK", "A_TAPE", 0), {}),
        # zero is a distance like any other
        (both("B_DISK", "C_DISK", 0), {(B, C): 0, (C, B): 0}),
    ],
    ids=["nearest-pair", "one-way", "no-link-and-same-site", "zero"],
)
def test_site_distances(
    entries: list[tuple[str, str, object]], expected: dict[tuple[Site, Site], int]
) -> None:
    pairs, problems = checked_pairs(read(*entries), {})
    assert problems == []
    assert site_distances(pairs, ELEMENTS) == expected


def test_near_sites_within_max_distance_inclusive_and_sorted() -> None:
    distances = {(A, B): 2, (B, A): 2, (A, C): 3, (C, A): 3, (B, C): 9, (C, B): 9}
    assert near_sites(distances, 3) == {A: (B, C), B: (A,), C: (A,)}
    assert near_sites(distances, 1) == {A: (), B: (), C: ()}


BAD = [
    (("A_DISK", "B_DISK", -1), "negative"),
    (("A_DISK", "B_DISK", "7"), "not_a_number"),
    (("A_DISK", "B_DISK", 2.5), "not_a_number"),
    (("A_DISK", "B_DISK", True), "not_a_number"),
    (("A_DISK", "X_DISK", 1), "unknown_element"),
]


@pytest.mark.parametrize(("entry", "kind"), BAD, ids=[f"{k}-{e[2]!r}" for e, k in BAD])
def test_bad_entry_is_one_problem_and_keeps_the_last_good_value(
    entry: tuple[str, str, object], kind: str
) -> None:
    last = {("A_DISK", "B_DISK"): 1}
    pairs, problems = checked_pairs(read(entry), last)
    assert [p.kind for p in problems] == [kind]
    assert problems[0].subject == f"{entry[0]} -> {entry[1]}"
    if kind == "unknown_element":
        assert pairs == {}  # nothing of an unknown element is kept
    else:
        assert pairs == last


def test_bad_entry_without_a_last_good_value_is_no_link() -> None:
    pairs, problems = checked_pairs(read(("A_DISK", "B_DISK", -3)), {})
    assert pairs == {} and [p.kind for p in problems] == ["negative"]


@pytest.mark.parametrize("back", [9, None], ids=["other-value", "no-link-back"])
def test_asymmetric_pair_is_one_problem_and_keeps_the_last_good_values(back: object) -> None:
    last = {("A_DISK", "B_DISK"): 1, ("B_DISK", "A_DISK"): 1}
    entries = [("A_DISK", "B_DISK", 1), ("B_DISK", "A_DISK", back)]
    pairs, problems = checked_pairs(read(*entries), last)
    assert [(p.kind, p.subject) for p in problems] == [("asymmetric", "A_DISK <-> B_DISK")]
    assert pairs == last
    pairs, _ = checked_pairs(read(*entries), {})
    assert pairs == {}  # never a guess between the two


def test_refresh_builds_near_lists_for_every_site_of_the_table() -> None:
    table, problems = refresh(read(*both("A_DISK", "B_DISK", 1)), NearTable(), 2, [A, B, C])
    assert problems == []
    assert table.near == {A: (B,), B: (A,), C: ()}


def test_unmapped_site_is_a_problem_and_keeps_its_last_near_list() -> None:
    last = NearTable(near={D: (A,)})
    table, problems = refresh(read(*both("A_DISK", "B_DISK", 1)), last, 2, [A, D])
    assert [(p.kind, p.subject) for p in problems] == [("unmapped_site", "SITE_D")]
    assert table.near[D] == (A,)
    table, _ = refresh(read(), NearTable(), 2, [D])
    assert D not in table.near  # unknown: no attribute rather than an empty list


def test_a_bad_read_after_a_good_one_keeps_the_near_lists() -> None:
    good, _ = refresh(read(*both("A_DISK", "B_DISK", 1)), NearTable(), 2, [A, B])
    bad, problems = refresh(read(*both("A_DISK", "B_DISK", -1)), good, 2, [A, B])
    assert {p.kind for p in problems} == {"negative"}
    assert bad.near == good.near == {A: (B,), B: (A,), C: ()}


def test_operator_table_reads_sites_as_elements() -> None:
    distances = operator_distances({"SITE_A": {"SITE_B": 1}, "SITE_B": {"SITE_A": 1}})
    table, problems = refresh(distances, NearTable(), 1, [A, B])
    assert problems == [] and table.near == {A: (B,), B: (A,)}
    distances = operator_distances({"SITE_A": {"SITE_D": 1}})  # named as a destination only
    table, problems = refresh(distances, NearTable(), 1, [A, B])
    assert table.near == {A: (D,), D: (A,)}
    assert [(p.kind, p.subject) for p in problems] == [("unmapped_site", "SITE_B")]


def test_with_near_extends_the_digest_only_when_it_carries_a_list() -> None:
    plain = view(A)
    assert with_near(plain, None) is plain
    carried = with_near(plain, (B,))
    assert carried.near == (B,) and carried.digest != plain.digest
    assert with_near(plain, ()).digest not in {plain.digest, carried.digest}
    assert with_near(carried, (B,)) is carried


def test_the_ad_carries_the_near_sites_only_when_known() -> None:
    from hydrator.config import ClassAdConfig
    from hydrator.core.render import site_classad

    attrs = ClassAdConfig()
    assert "DataLocalityNearSites" not in site_classad(view(A), attrs)
    ad = site_classad(with_near(view(A), (B, C)), attrs)
    assert list(ad["DataLocalityNearSites"]) == ["SITE_B", "SITE_C"]
    assert list(site_classad(with_near(view(A), ()), attrs)["DataLocalityNearSites"]) == []
