"""The pure core: (saved state, source outcomes, now) -> :class:`Plan`.

No I/O, no clock, no globals. The rules it enforces:

* A source that failed keeps its last good snapshot and is marked stale.
* A source whose answer shrank suspiciously (fewer than ``1 - max_drop_fraction`` of its
  previous entries, when it had at least ``drop_min_entries``) is held back the same way, until
  the same shrunken answer has come ``accept_drop_after_cycles`` cycles in a row (0: never).
* The same per site (the site guard): a site at which a source that answered held at least
  ``site_drop_min_entries`` entries, and now holds none or fewer than
  ``1 - site_max_drop_fraction`` of them, keeps that source's previous entries there until the
  drop has come ``accept_drop_after_cycles`` cycles in a row (one storage element missing from
  an answer looks exactly like that); a site named in ``accept_site_drops`` is never held.
* Hence a dataset leaves a site only when every source that reported it answered successfully
  this cycle without it.
* Site names that differ only in case (ClassAd ``==`` ignores case, so a collector
  invalidation by ``Name == "..."`` hits both) are refused: one spelling is kept (the one
  already held, else the first in sorted order), the other's records are counted invalid.
* Several sources merge deterministically, each fact on its own: per (site, dataset) the
  presence of the report holding more (complete > partial, by files then bytes > absent) and
  the transfer of the report with the more urgent one (stuck > replicating > none)
  (:func:`~hydrator.core.presence.combine`).
* A site is known while any source covers it; its ``updated`` time is the oldest last success
  of the sources covering it (:attr:`~hydrator.core.derived.Derived.site_updated`).
* Storage stated unavailable (:mod:`hydrator.core.storage`): a source leaves out what it
  holds, and the shrink guards do not count what it held last time (that drop is explained,
  so it takes effect at once; the rest of its site is guarded as ever, by the site's count
  where the element's is known, and by each available element's count); a drained site's
  view lists nothing, and so does a site whose every source there says all its storage
  there cannot serve. The site views carry their storage elements and the reasons
  (:func:`~hydrator.core.storage.served_views`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, replace
from datetime import datetime
from functools import reduce
from itertools import chain, filterfalse, islice

from hydrator.core.changes import Changes
from hydrator.core.derived import Derived, SourceDerived
from hydrator.core.guards import (
    Policy,
    SourceDelta,
    guard_sites,
    recounted,
    shrunken_sites,
    suspicious_drop,
    without_case_twins,
)
from hydrator.core.index import Index, each_replica, index_of, merge_replicas, replica_key
from hydrator.core.presence import combine
from hydrator.core.storage import (
    Drain,
    count_outside,
    explained_entries,
    served_views,
)
from hydrator.core.views import patch_view, views_of
from hydrator.domain import (
    Change,
    ChangeKind,
    DatasetId,
    Replica,
    Site,
    SiteView,
    Snapshot,
    SourceFailure,
    SourceOutcome,
    SourceState,
    State,
)

__all__ = ["Plan", "Policy", "SourceDelta", "SourceStatus", "plan_cycle"]

Key = tuple[Site, DatasetId]


@dataclass(frozen=True, slots=True)
class SourceStatus:
    """How a source fared this cycle, for reports, logs and metrics."""

    name: str
    fresh: bool  # its answer was used this cycle
    entries: int  # replicas in the snapshot now in effect
    invalid: int = 0
    unmapped: frozenset[str] = frozenset()
    reason: str | None = None  # why it is stale: the error, or a held-back drop
    last_success: datetime | None = None
    outcome: str = "ok"  # ok, transient_error, permanent_error, held
    unmapped_more: int = 0  # storage elements with no site, counted but not in ``unmapped``
    held_sites: Mapping[Site, str] = field(default_factory=dict)
    """Sites whose shrunken part of this answer is held back (the site guard) -> why."""
    refused_sites: Mapping[Site, str] = field(default_factory=dict)
    """Site names of this answer refused because they differ only in case from the name
    kept (ClassAd ``==`` ignores case) -> why; their records are counted in ``invalid``."""

    @property
    def unmapped_count(self) -> int:
        """Every storage element with no site, listed or not."""
        return len(self.unmapped) + self.unmapped_more


@dataclass(frozen=True, slots=True)
class Plan:
    """The pure core's answer: the new state with what is derived from it, what changed, and
    what to write."""

    derived: Derived  # the new state (:attr:`state`) and its indexes and views
    changes: Changes
    sources: tuple[SourceStatus, ...]
    source_deltas: Mapping[str, SourceDelta]
    sites: Mapping[Site, SiteView]
    changed_sites: frozenset[Site]  # sites whose published content (digest) changed
    removed_sites: frozenset[Site]  # sites no source covers any more
    now: datetime  # the cycle's time: the first-seen time of the pairs it adds

    @property
    def state(self) -> State:
        """The new state (what the store saves and the next cycle starts from)."""
        return self.derived.state


def plan_cycle(
    previous: State | Derived,
    outcomes: Mapping[str, SourceOutcome],
    now: datetime,
    policy: Policy,
    drains: Sequence[Drain] = (),
) -> Plan:
    """Decide this cycle. ``outcomes`` has one entry per configured source; ``drains`` are
    the operator's (those of whole sites empty the site's view while active). ``previous``:
    the saved state, with what was derived from it (carried on: a cycle then costs O(changes))
    or alone (derived again where needed).

    Sources in ``previous`` that are no longer configured are dropped with their replicas.
    """
    held = previous if isinstance(previous, Derived) else Derived(previous)
    old = held.state
    sources: dict[str, SourceState] = {}
    derived: dict[str, SourceDerived] = {}
    statuses: list[SourceStatus] = []
    deltas: dict[str, SourceDelta] = {}
    merging = len(outcomes) > 1  # several sources: their indexes are kept from cycle to cycle
    outcomes, refused = without_case_twins(held, outcomes)
    for name in sorted(outcomes):
        before = old.sources.get(name, SourceState(name))
        known = held.source(name) if name in old.sources else SourceDerived(before.replicas)
        advanced = _advance_source(
            before, known, outcomes[name], now, policy=policy, merging=merging
        )
        after, derived[name], status, delta = advanced
        if name in refused:
            status = replace(status, refused_sites=refused[name])
        sources[name] = after
        statuses.append(status)
        if delta.added or delta.removed:
            deltas[name] = delta
    for name in sorted(set(old.sources) - set(outcomes)):
        deltas[name] = SourceDelta(removed=old.sources[name].replicas)
    new, changes = _derive(held, State(sources=sources), derived, deltas)
    old_contents = held.contents
    changed_sites = frozenset(
        site
        for site, view in new.contents.items()
        if site not in old_contents or old_contents[site].digest != view.digest
    )
    return Plan(
        derived=new,
        changes=changes,
        sources=tuple(statuses),
        source_deltas=deltas,
        sites=served_views(new, drains, now),
        changed_sites=changed_sites,
        removed_sites=frozenset(held.coverage) - frozenset(new.coverage),
        now=now,
    )


def _derive(
    held: Derived,
    state: State,
    sources: Mapping[str, SourceDerived],
    deltas: Mapping[str, SourceDelta],
) -> tuple[Derived, Changes]:
    """What is derived from ``state`` (``sources``: its sources' derived data) and its
    changes against ``held``: ``held``'s merged view and site views as they are where no
    source moved, else the merged view and the site views patched by the changes."""
    if not deltas and _same_sites(held.state.sources, state.sources):
        return held.sharing(state, sources), Changes()
    first = not any(s.replicas for s in held.state.sources.values())  # all pairs are added
    merged, changes = _merge(held, Derived(state, sources), deltas, first)
    fresh = Derived(state, sources, merged=merged)
    contents = _contents(held, fresh, merged, None if first else changes)
    new = Derived(state, sources, merged=merged, coverage=fresh.coverage, contents=contents)
    return new, changes


def _same_sites(a: Mapping[str, SourceState], b: Mapping[str, SourceState]) -> bool:
    return a.keys() == b.keys() and all(a[n].sites == b[n].sites for n in a)


def _advance_source(
    before: SourceState,
    known: SourceDerived,
    outcome: SourceOutcome,
    now: datetime,
    *,
    policy: Policy,
    merging: bool,
) -> tuple[SourceState, SourceDerived, SourceStatus, SourceDelta]:
    """``before`` (``known``: what is derived from it) moved by ``outcome``; its index (if
    built) handed on only when ``merging`` (one source alone needs none: a one-source daemon
    holds no index), its site counts (if built) always."""
    if not merging:
        known = SourceDerived(before.replicas, counts=known.built_counts)
    if isinstance(outcome, SourceFailure):
        after = replace(before, last_attempt=now, stale=True, error=outcome.error)
        kind = "permanent_error" if outcome.permanent else "transient_error"
        status = _status(after, kind, reason=outcome.error)
        return after, known.moved_to(after.replicas), status, SourceDelta()
    explained = explained_entries(before.storages, before.elements, outcome.storages)
    held = suspicious_drop(len(before.replicas), len(outcome.replicas), policy)
    if held and explained:  # what storage newly stated unavailable held is explained
        unknown = frozenset(site for site, n in explained.items() if n is None)
        counted = sum(n for n in explained.values() if n is not None)
        held = suspicious_drop(
            count_outside(before.replicas, unknown) - counted,
            count_outside(outcome.replicas, unknown),
            policy,
        )
    accept_after = policy.accept_drop_after_cycles
    if held and (accept_after == 0 or before.held_cycles + 1 < accept_after):
        reason = (
            f"answer held back: {len(outcome.replicas)} entries against "
            f"{len(before.replicas)} last time (cycle {before.held_cycles + 1} of "
            f"{accept_after or 'unlimited'})"
        )
        after = replace(
            before,
            last_attempt=now,
            stale=True,
            error=reason,
            held_cycles=before.held_cycles + 1,
        )
        status = _status(after, "held", reason=reason, snapshot=outcome)
        return after, known.moved_to(after.replicas), status, SourceDelta()
    delta = _delta(before.replicas, outcome.replicas)
    shrunk = shrunken_sites(before, known, outcome, delta, policy=policy, explained=explained)
    guard = guard_sites(before, outcome, delta, shrunk, policy)
    delta = guard.delta
    moved = bool(delta.added or delta.removed)
    after = SourceState(
        name=before.name,
        replicas=guard.replicas if moved else before.replicas,
        sites=guard.sites,
        last_success=now,
        last_attempt=now,
        held_sites=guard.counts,
        elements=guard.elements,
        storages=outcome.storages,
    )
    status = replace(_status(after, "ok", snapshot=outcome), held_sites=guard.reasons)
    return after, _moved(known, delta, after.replicas) if moved else known, status, delta


def _moved(
    known: SourceDerived, delta: SourceDelta, replicas: AbstractSet[Replica]
) -> SourceDerived:
    """``known`` moved by a non-empty ``delta`` to ``replicas``: the index carried on where
    built (several sources merge), the site counts once the site guard needed them."""
    index = known.built_index
    counts = known.built_counts
    return SourceDerived(
        replicas,
        None if index is None else _patched(known, delta, replicas),
        None if counts is None else recounted(counts, delta),
    )


def _status(
    state: SourceState, outcome: str, reason: str | None = None, snapshot: Snapshot | None = None
) -> SourceStatus:
    return SourceStatus(
        name=state.name,
        fresh=outcome == "ok",
        outcome=outcome,
        entries=len(state.replicas),
        invalid=snapshot.invalid if snapshot else 0,
        unmapped=snapshot.unmapped if snapshot else frozenset(),
        unmapped_more=snapshot.unmapped_more if snapshot else 0,
        reason=reason,
        last_success=state.last_success,
    )


def _delta(before: AbstractSet[Replica], after: AbstractSet[Replica]) -> SourceDelta:
    """``after - before`` and ``before - after``: a set operation reuses the stored element
    hashes, so only equal pairs cost a comparison (C-level: a replica is a tuple), and none
    where the source handed back last cycle's very objects. Two differences, each building
    only its (small) result: ``after ^ before`` copies a whole operand first (32 MiB at a
    million replicas, at the cycle's peak)."""
    if before is after:
        return SourceDelta()
    if not before or not after:  # a first answer, or an emptied one: no set to build
        return SourceDelta(added=after, removed=before)
    return SourceDelta(added=after - before, removed=before - after)


def _patched(before: SourceDerived, delta: SourceDelta, replicas: AbstractSet[Replica]) -> Index:
    """The index of ``replicas`` (``before``'s replicas moved by a non-empty ``delta``), holding
    ``replicas``' own objects: the state keeps the answer's set as it is (a source that keeps
    its answer between fetches shares it, so the daemon holds one set and one object per
    replica, not two). ``before``'s index is kept: a site's dict is copied when the delta
    touches the site, the others are shared (never mutated). Where the answer is made of new
    objects (a source that builds them every fetch, or the first answer after a restart), the
    index is built afresh; the old objects then die with the old state. Only for a ``before``
    whose index was built (several sources merge)."""
    added = delta.added
    held = before.index
    kept = islice(filterfalse(added.__contains__, replicas), _SAMPLE)  # unchanged ones
    if any(held[r.site][r.dataset] is not r for r in kept):
        return index_of(replicas)
    index = dict(held)
    own: set[Site] = set()  # the sites whose dict is this index's own copy
    for replica in delta.removed:
        del _own(index, own, replica.site)[replica.dataset]
    for replica in added:
        _own(index, own, replica.site)[replica.dataset] = replica
    return _without_empty(index, own)


def _without_empty(index: Index, own: set[Site]) -> Index:
    """``index`` without the sites of ``own`` (its own copies) that were emptied: an index
    has no empty site."""
    for site in own:
        if not index[site]:
            del index[site]
    return index


def _own(index: Index, own: set[Site], site: Site) -> dict[DatasetId, Replica]:
    """``index``'s dict of ``site``, copied first unless ``own`` says it was (then in ``own``)."""
    if site in own:
        return index[site]
    own.add(site)
    found = index[site] = dict(index.get(site, _NONE))  # a C-level copy, hashes kept
    return found


_SAMPLE = 8  # unchanged replicas looked at to tell whether an answer reuses the held objects
_NONE: Mapping[DatasetId, Replica] = {}  # a site no index holds (never mutated)


def _merge(
    previous: Derived, state: Derived, deltas: Mapping[str, SourceDelta], first: bool
) -> tuple[Index | None, Changes]:
    """The new merged view (None: not derived) and its changes. One source (now, and the
    only one before, if any): its delta is the change, no index. Several: the merged view
    is derived again only at the keys some delta touched (elsewhere every source reports
    what it reported before, so the merge is unchanged)."""
    names = sorted(state.state.sources)
    ordered = [state.state.sources[name] for name in names]
    if len(ordered) == 1 and previous.state.sources.keys() <= state.state.sources.keys():
        (name,) = names
        if first:
            return None, Changes.all_added(ordered[0].replicas)
        delta = deltas.get(name, SourceDelta())
        before = dict(zip(map(replica_key, delta.removed), delta.removed, strict=True))
        after = dict(zip(map(replica_key, delta.added), delta.added, strict=True))
        return None, _changes(before, after, sorted(before.keys() | after.keys()))
    if first:  # nothing before: everything is added, nothing to diff
        new = merge_replicas(r for s in ordered for r in s.replicas)
        return new, Changes.all_added(list(each_replica(new)))
    old = previous.merged
    parts = (part for d in deltas.values() for part in (d.added, d.removed))
    touched = sorted(set(map(replica_key, chain.from_iterable(parts))))  # Change's order
    if len(ordered) == 1:
        new = state.source(names[0]).index
    elif not ordered:
        new = {}
    else:
        new = _remerged(old, [state.source(name).index for name in names], touched)
    return new, _changes(_at(old, touched), _at(new, touched), touched)


def _at(index: Index, keys: list[Key]) -> dict[Key, Replica]:
    """``index``'s replicas at ``keys``, by key."""
    found = ((key, index.get(key[0], _NONE).get(key[1])) for key in keys)
    return {key: replica for key, replica in found if replica is not None}


def _remerged(old: Index, indexes: list[Index], touched: list[Key]) -> Index:
    """``old`` merged again at the ``touched`` keys from the sources' ``indexes`` (in
    :func:`merge_replicas`' order); a copy sharing the untouched sites' dicts."""
    new = dict(old)
    own: set[Site] = set()
    for site, dataset in touched:
        reports = [r for i in indexes if (r := i.get(site, _NONE).get(dataset)) is not None]
        if reports:
            _own(new, own, site)[dataset] = reduce(combine, reports)
        elif dataset in new.get(site, _NONE):
            del _own(new, own, site)[dataset]
    return _without_empty(new, own)


def _changes(old: Mapping[Key, Replica], new: Mapping[Key, Replica], keys: list[Key]) -> Changes:
    """The changes at ``keys`` (sorted: Change's order) from the replicas there before and now."""
    out: list[Change] = []
    for key in keys:
        prior, replica = old.get(key), new.get(key)
        if prior is None:
            if replica is not None:
                out.append(Change(key[0], key[1], ChangeKind.ADDED, None, replica))
        elif replica is None:
            out.append(Change(key[0], key[1], ChangeKind.REMOVED, prior, None))
        elif prior != replica:
            out.append(Change(key[0], key[1], ChangeKind.CHANGED, prior, replica))
    return Changes(out)


def _contents(
    previous: Derived, state: Derived, merged: Index | None, changes: Changes | None
) -> dict[Site, SiteView]:
    """Site views: the previous one for a site no change touched, the previous one patched
    with its changes for a touched site, a full build for a site not seen before, and for
    every site with ``changes`` None (a first cycle: its changes are not even built).
    ``merged``: the new merged view if derived (else the state's replicas are read)."""
    old = previous.contents if changes is not None else {}
    touched: dict[Site, list[Change]] = {}
    for change in changes or ():
        touched.setdefault(change.site, []).append(change)
    sites = sorted(state.coverage)
    new_sites = frozenset(s for s in sites if s not in old)
    replicas = state.merged_replicas if merged is None else each_replica(merged)
    built = views_of(replicas, new_sites) if new_sites else {}
    return {
        s: built[s]
        if s in new_sites
        else patch_view(old[s], touched[s])
        if s in touched
        else old[s]
        for s in sites
    }
