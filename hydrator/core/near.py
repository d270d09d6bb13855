"""Near sites: which sites a site can read from cheaply, from a catalogue's network distances.

A catalogue (Rucio's ``distances`` table) keeps one distance per ordered pair of storage
elements: a non-negative integer, or none (no link). Two sites are as far apart as their
nearest pair of elements, in either direction; a site's **near sites** are the other sites
within ``max_distance`` of it. Operators without such a catalogue give a site-to-site table,
read here as a table whose elements are the sites themselves (:func:`operator_distances`).

Everything read is checked (:func:`checked_pairs`); each of these is a :class:`Problem`:

* ``negative``: a distance below zero; ``not_a_number``: one that is not an integer;
* ``unknown_element``: a distance naming an element mapped to no site;
* ``asymmetric``: the two directions of a pair disagree (two values, or a value and "no link");
* ``unmapped_site``: a site the hydrator publishes that no element of the table belongs to;
* ``refused``: the catalogue refused or failed the read (reported by the caller).

A pair with a problem keeps the value it had in the last good table, if any; a site with no
element keeps its last good near list. So a bad entry or a failed read never puts garbage into
an ad, nor takes away a near list that was good. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import classad2

from hydrator.core.views import NEAR_TAG, extended_digest
from hydrator.domain import Site, SiteView

PROBLEM_KINDS = (
    "negative",
    "not_a_number",
    "unknown_element",
    "asymmetric",
    "unmapped_site",
    "refused",
)
"""Every :attr:`Problem.kind`, for metrics (a label each)."""

Pair = tuple[str, str]


@dataclass(frozen=True)
class Problem:
    """One bad input: ``kind`` (one of :data:`PROBLEM_KINDS`), ``subject`` (the pair or site it
    names: the key a caller logs it once under) and ``line`` (one line saying what is wrong)."""

    kind: str
    subject: str
    line: str


@dataclass(frozen=True)
class ElementDistances:
    """One read of a catalogue: ``sites`` maps each storage element to its site; ``entries``
    are its ``(source, destination, distance)`` rows as read. A distance is untrusted: an
    ``int`` >= 0 is a link, ``None`` is no link, anything else is a :class:`Problem`."""

    sites: Mapping[str, Site]
    entries: Sequence[tuple[str, str, object]]


@dataclass(frozen=True)
class NearTable:
    """The near sites as last computed: ``pairs`` the element distances it was built from (the
    last good value of each pair; ``None``: no link), ``distances`` the site-to-site distances
    (both directions), ``near`` each site's near sites, sorted."""

    pairs: Mapping[Pair, int | None] = field(default_factory=dict)
    distances: Mapping[tuple[Site, Site], int] = field(default_factory=dict)
    near: Mapping[Site, tuple[Site, ...]] = field(default_factory=dict)


def _value(raw: object) -> tuple[int | None, str | None]:
    """A distance as read: (value, None), or (None, problem kind)."""
    if raw is None:
        return None, None
    if isinstance(raw, bool) or not isinstance(raw, int):
        return None, "not_a_number"
    if raw < 0:
        return None, "negative"
    return raw, None


def checked_pairs(
    read: ElementDistances, last: Mapping[Pair, int | None]
) -> tuple[dict[Pair, int | None], list[Problem]]:
    """The entries of ``read`` checked: each good pair's value, each bad pair's value in
    ``last`` (if it had one), and the problems found (one per bad pair)."""
    pairs: dict[Pair, int | None] = {}
    problems: list[Problem] = []
    bad: set[Pair] = set()
    for source, destination, raw in read.entries:
        pair = (str(source), str(destination))
        subject = f"{pair[0]} -> {pair[1]}"
        unknown = [e for e in pair if e not in read.sites]
        value, kind = _value(raw)
        if unknown:
            line = f"distance {subject} names an element of no site: {', '.join(unknown)}"
            problems.append(Problem("unknown_element", subject, line))
            continue  # not ours to keep, nor to fall back on
        if kind is not None:
            problems.append(Problem(kind, subject, f"distance {subject}: {raw!r} is {kind}"))
            bad.add(pair)
            continue
        pairs[pair] = value
    for a, b in sorted(pairs):
        if a < b and (b, a) in pairs and pairs[(a, b)] != pairs[(b, a)]:
            subject = f"{a} <-> {b}"
            line = f"asymmetric distance {subject}: {pairs[(a, b)]} one way, {pairs[(b, a)]} back"
            problems.append(Problem("asymmetric", subject, line))
            bad.update({(a, b), (b, a)})
    for pair in bad:
        pairs.pop(pair, None)
        if pair in last:
            pairs[pair] = last[pair]
    return pairs, problems


def site_distances(
    pairs: Mapping[Pair, int | None], sites: Mapping[str, Site]
) -> dict[tuple[Site, Site], int]:
    """Site-to-site distances: the nearest pair of their elements, in either direction (both
    directions of each site pair are keys). Pairs within one site, and no-links, count not."""
    out: dict[tuple[Site, Site], int] = {}
    for (a, b), value in pairs.items():
        site_a, site_b = sites.get(a), sites.get(b)
        if value is None or site_a is None or site_b is None or site_a == site_b:
            continue
        for key in ((site_a, site_b), (site_b, site_a)):
            if key not in out or value < out[key]:
                out[key] = value
    return out


def near_sites(
    distances: Mapping[tuple[Site, Site], int], max_distance: int
) -> dict[Site, tuple[Site, ...]]:
    """Each site's other sites within ``max_distance`` (inclusive), sorted; every site of
    ``distances`` is a key (with ``()`` when none is near)."""
    near: dict[Site, set[Site]] = {}
    for (a, b), value in distances.items():
        near.setdefault(a, set())
        if value <= max_distance:
            near[a].add(b)
    return {site: tuple(sorted(others)) for site, others in near.items()}


def refresh(
    read: ElementDistances, last: NearTable, max_distance: int, published: Iterable[Site]
) -> tuple[NearTable, list[Problem]]:
    """The near table from a new read, with the last good values wherever the read is bad
    (:func:`checked_pairs`); ``published`` sites that no element belongs to are problems and
    keep their near list of ``last``, and their place in the other sites' lists of ``last``."""
    pairs, problems = checked_pairs(read, last.pairs)
    distances = site_distances(pairs, read.sites)
    near = near_sites(distances, max_distance)
    for site in set(read.sites.values()):
        near.setdefault(site, ())
    for site in sorted(set(published) - set(read.sites.values())):
        line = f"site {site} has no storage element in the distance table"
        problems.append(Problem("unmapped_site", str(site), line))
        if site in last.near:
            near[site] = last.near[site]
            distances.update({k: v for k, v in last.distances.items() if site in k})
            for other, was in last.near.items():
                if site in was and other in near and site not in near[other]:
                    near[other] = tuple(sorted((*near[other], site)))
    return NearTable(pairs, distances, near), problems


def operator_distances(table: Mapping[str, Mapping[str, object]]) -> ElementDistances:
    """An operator's site-to-site table (``{site: {other site: distance}}``) as a read whose
    elements are the sites it names (the configuration checked the names)."""
    sites = {name: Site(name) for row in table.items() for name in (row[0], *row[1])}
    entries = [(a, b, value) for a, row in table.items() for b, value in row.items()]
    return ElementDistances(sites, entries)


def with_near(view: SiteView, near: tuple[Site, ...] | None) -> SiteView:
    """``view`` carrying its near sites (``None``: unknown, the ad leaves the attribute out);
    its digest extended with them, so that a change reaches the ads even when no list
    changes. The same view when it already carries them, or when there are none to carry."""
    if near is None or view.near == near:
        return view
    return replace(view, near=near, digest=extended_digest(view.digest, NEAR_TAG, near))


def near_line_bytes(near: tuple[Site, ...], attribute: str) -> int:
    """Bytes the near sites add to a site's old-syntax ad (``Attr = { "A","B" }`` and its
    newline): what an ad cut to ``max_ad_bytes`` must leave room for."""
    ad = classad2.ClassAd()
    ad[attribute] = [str(site) for site in near]
    return len(ad.printOld().encode("utf-8"))
