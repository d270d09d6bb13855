"""The guards of the core (:mod:`hydrator.core.plan`'s module doc states their rules): the
source guard (an answer that shrank suspiciously is held back), the site guard (a site's or a
storage element's drop is held back per site) and the refusal of site names that differ only
in case. Pure; each function states its cost.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, replace
from itertools import chain

from hydrator.core.changes import SourceDelta
from hydrator.core.storage import unavailable_storages
from hydrator.domain import (
    ElementCount,
    Replica,
    Site,
    Snapshot,
    SourceFailure,
    SourceOutcome,
    SourceState,
    State,
    site_of,
)


@dataclass(frozen=True)
class GuardPolicy:
    """The thresholds of the guards above (``[safety]`` in the config)."""

    max_drop_fraction: float = 0.5
    drop_min_entries: int = 20
    accept_drop_after_cycles: int = 10
    site_max_drop_fraction: float = 0.5
    site_drop_min_entries: int = 20
    accept_site_drops: Collection[str] = ()


@dataclass(frozen=True)
class Guarded:
    """A source's answer after the site guard: what the state keeps (``replicas``,
    ``sites``, ``elements``), its delta against the previous answer, and per held site its
    count of consecutive held cycles and the reason."""

    replicas: AbstractSet[Replica]
    sites: frozenset[Site]
    delta: SourceDelta
    counts: Mapping[Site, int]
    reasons: Mapping[Site, str]
    elements: Mapping[str, ElementCount]


def guard_sites(
    before: SourceState,
    outcome: Snapshot,
    delta: SourceDelta,
    found: Mapping[Site, str],
    policy: GuardPolicy,
) -> Guarded:
    """The site guard (module doc) on an answer the source guard let through, given the sites
    whose drop it holds and how each shrank (``found``: :func:`shrunken_sites`): they keep
    ``before``'s replicas (and storage element counts) unless held long enough, and leave
    ``delta``. Costs O(delta + elements) per cycle, and one copy of the answer in a cycle that
    holds a site."""
    accept_after = policy.accept_drop_after_cycles
    held: dict[Site, int] = {}
    reasons: dict[Site, str] = {}
    for site, shrink in sorted(found.items()):
        cycle = before.held_sites.get(site, 0) + 1
        if accept_after and cycle >= accept_after:
            continue  # held long enough: accepted this cycle
        held[site] = cycle
        reasons[site] = (
            f"site {site}: answer of source {before.name} held back: {shrink} (cycle {cycle} "
            f"of {accept_after or 'unlimited'}); to accept it at once, add the site to "
            "[safety] accept_site_drops and reload"
        )
    if not held:
        return Guarded(outcome.replicas, outcome.sites, delta, {}, {}, outcome.elements)
    out = [r for r in delta.added if r.site in held]
    back = [r for r in delta.removed if r.site in held]
    replicas = set(outcome.replicas)
    replicas.difference_update(out)
    replicas.update(back)
    kept = SourceDelta(
        added=frozenset(r for r in delta.added if r.site not in held),
        removed=frozenset(r for r in delta.removed if r.site not in held),
    )
    sites = outcome.sites | (before.sites & held.keys())
    elements = {e: c for e, c in outcome.elements.items() if c.site not in held}
    elements.update((e, c) for e, c in before.elements.items() if c.site in held)
    return Guarded(replicas, sites, kept, held, reasons, elements)


def shrunken_sites(
    before: SourceState,
    site_counts: Callable[[], Mapping[Site, int]],
    outcome: Snapshot,
    delta: SourceDelta,
    *,
    policy: GuardPolicy,
    explained: Mapping[Site, int | None],
) -> dict[Site, str]:
    """Site -> how it shrank, for each site whose drop the site guard holds (before the count
    of cycles decides): the site's own entries (:func:`_suspicious_sites`; less those that
    storage stated unavailable explains, ``explained``, and not at all where that is not
    known), else one of its available storage elements' (where the source reports them) at a
    site that lost entries. Only the entries of unavailable storage are explained, not the
    whole site's. Costs O(delta) per cycle; ``site_counts`` (``before``'s entries per site)
    is asked only when a site loses enough to be a candidate (the model counts them then,
    and carries the counts on: O(sites + delta) a cycle)."""
    if not delta.removed:
        return {}
    found = {
        s: f"{new} entries against {old} last time"
        for s, (old, new) in _suspicious_sites(site_counts, delta, policy, explained).items()
    }
    touched = frozenset(map(site_of, delta.removed))
    down = unavailable_storages(outcome.storages)  # their entries leave at once
    now = outcome.elements
    for element, (site, old) in sorted(before.elements.items()):
        if site in found or site not in touched or site in policy.accept_site_drops:
            continue
        new = now[element].entries if element in now else 0
        if element not in down and _shrank(old, new, policy):
            found[site] = f"storage element {element}: {new} entries against {old} last time"
    return found


def _shrank(old: int, new: int, policy: GuardPolicy) -> bool:
    """Whether ``old`` entries becoming ``new`` is a drop the site guard holds."""
    if old < max(policy.site_drop_min_entries, 1) or new >= old:
        return False
    return new == 0 or new < old * (1.0 - policy.site_max_drop_fraction)


def _suspicious_sites(
    site_counts: Callable[[], Mapping[Site, int]],
    delta: SourceDelta,
    policy: GuardPolicy,
    explained: Mapping[Site, int | None],
) -> dict[Site, tuple[int, int]]:
    """Site -> (entries before on storage still available, entries now) of each site whose
    own entries shrank enough (:func:`_shrank`), from ``delta``, the ``explained`` entries
    (storage stated unavailable) not counted as lost; a site whose explained entries are not
    known is not judged here. ``site_counts`` is asked only when a site lost enough to be a
    candidate."""
    lost = Counter(map(site_of, delta.removed))
    lost.subtract(Counter(map(site_of, delta.added)))
    floor = policy.site_drop_min_entries * policy.site_max_drop_fraction
    accepted = policy.accept_site_drops
    candidates = {
        s
        for s, n in lost.items()
        if n > 0 and n >= floor and s not in accepted and explained.get(s, 0) is not None
    }
    if not candidates:
        return {}
    was = site_counts()
    found: dict[Site, tuple[int, int]] = {}
    for site in candidates:
        old = was.get(site, 0)
        base = old - (explained.get(site) or 0)
        if _shrank(base, old - lost[site], policy):
            found[site] = (base, old - lost[site])
    return found


def without_case_twins(
    previous: State, held: AbstractSet[Site], outcomes: Mapping[str, SourceOutcome]
) -> tuple[dict[str, SourceOutcome], dict[str, dict[Site, str]]]:
    """``outcomes`` without the sites whose names differ only in case from a name kept (the
    one already ``held``, the sites the state covers, else the first in sorted order), and
    per source the names refused and why; ``previous``: the saved state. Looks at the
    answers' sites and at those a failed source keeps; a refused site's records are counted
    invalid. O(sites), plus a copy of an answer that names a twin."""
    kept_sites = [o.sites for o in outcomes.values() if isinstance(o, Snapshot)]
    kept_sites += [
        previous.sources[n].sites
        for n, o in outcomes.items()
        if isinstance(o, SourceFailure) and n in previous.sources
    ]
    spellings: dict[str, set[Site]] = {}
    for site in chain.from_iterable(kept_sites):
        spellings.setdefault(site.casefold(), set()).add(site)
    kept_of: dict[Site, Site] = {}
    for group in spellings.values():
        if len(group) > 1:
            kept = min(group, key=lambda s: (s not in held, s))
            kept_of.update((s, kept) for s in group if s != kept)
    if not kept_of:
        return dict(outcomes), {}
    out: dict[str, SourceOutcome] = {}
    refused: dict[str, dict[Site, str]] = {}
    for name, outcome in outcomes.items():
        twins = kept_of.keys() & outcome.sites if isinstance(outcome, Snapshot) else set()
        if not twins or not isinstance(outcome, Snapshot):
            out[name] = outcome
            continue
        dropped = Counter(r.site for r in outcome.replicas if r.site in twins)
        out[name] = replace(
            outcome,
            replicas=frozenset(r for r in outcome.replicas if r.site not in twins),
            sites=outcome.sites - twins,
            invalid=outcome.invalid + sum(dropped.values()),
        )
        refused[name] = {
            s: f"site name {s} differs only in case from {kept_of[s]} (ClassAd == ignores "
            f"case): refused, its {dropped[s]} record(s) skipped"
            for s in sorted(twins)
        }
    return out, refused


def suspicious_drop(before: int, now: int, policy: GuardPolicy) -> bool:
    if before == 0 or before < policy.drop_min_entries:
        return False
    return now < before * (1.0 - policy.max_drop_fraction)
