"""The core's incremental memo: :class:`Model`, of a :class:`~hydrator.domain.State`, that
the runtime carries from cycle to cycle. It holds the core's incremental tricks, listed
below; every other fast path of the core has an entry in docs/performance.md, "Where the
fast paths are".

A model answers what the plain computation over the state answers (merge every source's
replicas, diff everything, rebuild every site: ``tests/benchmarks/test_core_equivalence.py``
is its contract), at the cost of the cycle's changes instead of its replicas. Its parts are
the merged index, which sources cover each site, each site's view and its last refresh, and
per source (:class:`_SourceModel`) its index and its count of replicas per site; each is built
on first use or handed over from the previous cycle's model patched by the delta, set at
most once and never mutated after. None of it is persisted, and none of it lives on the
frozen state. The entry is :class:`Model`: :meth:`Model.of` (the model of a state, the held
one if it is that state's), :meth:`Model.delta` and :meth:`Model.site_counts` (what the plan
asks of a source), :meth:`Model.apply` (the next state's model and the changes); and what
the core's other modules read of a state through it: :attr:`Model.contents`,
:meth:`Model.served_now` and :attr:`Model.entries` (the plan), :meth:`Model.stamped_views`
(a restart), :meth:`Model.sharing` and :attr:`Model.site_updated` (a cycle between full
reads). The runtime holds it between cycles (typed through :mod:`hydrator.core.plan`, which
exports it) and reads only its state.

The tricks, and what each saves at a million replicas and 50 sites (the record:
benchmarks/results/model_tricks.json unless a bullet names another; machine, conditions and
earlier runs: benchmarks/RESULTS.md). The helpers that patch an index, a view or the site
counts by a delta are :mod:`hydrator.core.model_patch`'s; which to patch, and when, is
decided here.

* Patching instead of rebuilding: the merged index and the touched sites' views are patched
  by the cycle's changes (:func:`~hydrator.core.model_patch.patched_view`), the rest
  shared: the touched sites' views (a 1 % churn touches all 50) patched in 0.58 s against
  1.81 s rebuilt from the replicas.
* No index for one source: a one-source daemon works from its set and its delta and holds
  no index (42.8 B a replica); the first plan takes 1.65 s without it against 2.18 s with
  it built (24.36 % saved).
* Site counts built once, for the site guard, then patched by each delta: 4.2 ms against
  261 ms to count them again (1 % churn).
* Identity reuse in the delta: a source that hands back last cycle's very set gets an
  empty delta at no cost (``before is after``): 14 us, against 0.086 s for the two set
  differences.
* Identity reuse in the index: it is patched, not rebuilt, when the answer holds the held
  objects (:func:`~hydrator.core.model_patch.holds_objects_of` samples a few for identity):
  0.099 s against 0.89 s. The daemon then holds one object a replica, not two.
* Two set differences, never a symmetric one: ``after ^ before`` copies a whole operand
  first: 32 MiB more at the churn peak (a whole-cycle run, benchmarks/RESULTS.md).
* A first cycle's changes made only while iterated (:meth:`Changes.all_added
  <hydrator.core.changes.Changes.all_added>`): the daemon only counts them, in 35 us, against
  3.96 s to build and hold them.
* Site views of a loaded state built from the rows in the order read (:meth:`Model.of`'s
  ``as_read``; a set's hash order visits memory at random): startup 3.2 s against 3.9 s
  (a whole-cycle run, benchmarks/RESULTS.md).
* Available replicas with no detail (most) go straight into their list in :func:`views_of`,
  not through a call: 10.22 % saved (the median over the record's runs).

Not a trick: the loops over every replica (:func:`index_of`, :func:`views_of`) read a
replica's fields by name; by position they saved 2.94 % and 2.45 % (the same medians).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import replace
from datetime import datetime
from itertools import chain
from typing import NamedTuple

from hydrator.core.changes import Changes, SourceDelta
from hydrator.core.index import Index, each_replica, index_size, merge_replicas, replica_key
from hydrator.core.model_patch import (
    NO_SITE,
    holds_objects_of,
    patched_index,
    patched_view,
    recounted,
    remerged,
)
from hydrator.core.storage import Drain, served_views
from hydrator.core.views import SiteLists
from hydrator.domain import (
    Change,
    ChangeKind,
    DatasetId,
    Replica,
    ReplicaState,
    Site,
    SiteView,
    SourceState,
    State,
    site_of,
)

Key = tuple[Site, DatasetId]


class _SourceModel:
    """One source's derived data, of ``replicas``: :attr:`index` and :attr:`site_counts`,
    each built on first use or given at construction (equal to what it would build; held in
    ``built_index`` and ``built_counts``, None until built). Never mutated once built."""

    __slots__ = ("built_counts", "built_index", "replicas")

    def __init__(
        self,
        replicas: AbstractSet[Replica],
        index: Index | None = None,
        counts: Mapping[Site, int] | None = None,
    ) -> None:
        self.replicas = replicas
        self.built_index = index
        self.built_counts = counts

    @property
    def index(self) -> Index:
        """Site -> dataset -> this source's replica (of :attr:`replicas`' own objects); the
        core reads it only where several sources merge, and from then on hands it from
        cycle to cycle, patched by each delta."""
        if self.built_index is None:
            self.built_index = index_of(self.replicas)
        return self.built_index

    @property
    def site_counts(self) -> Mapping[Site, int]:
        """Site -> how many of :attr:`replicas` are there; built on first use (one pass)
        and from then on handed from cycle to cycle, patched by each delta."""
        if self.built_counts is None:
            self.built_counts = Counter(map(site_of, self.replicas))
        return self.built_counts

    def moved_to(self, replicas: AbstractSet[Replica]) -> _SourceModel:
        """The same derived data for ``replicas``, which must be equal to :attr:`replicas`
        (the same answer kept by a new state value)."""
        return _SourceModel(replicas, self.built_index, self.built_counts)


class Built(NamedTuple):
    """What a model has built so far, None where it has not (:meth:`Model.built_for_tests`)."""

    merged: Index | None  # the merged index
    indexes: dict[str, Index | None]  # per source of the state, its index
    counts: dict[str, Mapping[Site, int] | None]  # per source of the state, its site counts


class Model:
    """A :class:`~hydrator.domain.State` (``state``) and what the core derives from it: its
    merged index, which sources cover each site, :attr:`contents`, :attr:`site_updated` and
    per source its :class:`_SourceModel`. Each is built on first use or given at
    construction (then equal to what it would build), and never mutated afterwards."""

    __slots__ = ("_covering", "_index", "_sources", "_updated", "_views", "state")

    def __init__(
        self,
        state: State,
        sources: Mapping[str, _SourceModel] | None = None,
        *,
        merged: Index | None = None,
        covering: dict[Site, frozenset[str]] | None = None,
        contents: dict[Site, SiteView] | None = None,
    ) -> None:
        self.state = state
        self._sources = dict(sources or {})
        self._index = merged
        self._covering = covering
        self._views = contents
        self._updated: dict[Site, datetime] | None = None

    @classmethod
    def of(
        cls,
        state: State,
        held: Model | None = None,
        *,
        as_read: Mapping[str, Sequence[Replica]] | None = None,
    ) -> Model:
        """The model of ``state``: ``held`` if it is ``state``'s own model (the one the
        runtime carries), else a new one. ``as_read``: per source, its replicas (equal to its
        set) in the order a store read them; a one-source state's site views are built from
        them."""
        if isinstance(held, Model) and held.state is state:
            return held
        model = cls(state)
        (only,) = state.sources if len(state.sources) == 1 else (None,)
        rows = None if as_read is None or only is None else as_read.get(only)
        if rows is not None:  # its views from the rows in the order read
            covering = model._covering_sources
            model = cls(state, covering=covering, contents=views_of(rows, frozenset(covering)))
        return model

    def delta(self, name: str, replicas: AbstractSet[Replica]) -> SourceDelta:
        """Source ``name``'s replicas in this state (none for a source it lacks) moved to
        ``replicas``: what was added and what removed."""
        return _delta(self._source(name).replicas, replicas)

    def site_counts(self, name: str) -> Mapping[Site, int]:
        """How many of source ``name``'s replicas are at each site: counted on first use,
        then carried to the next state's model patched by the source's delta."""
        return self._source(name).site_counts

    def apply(self, state: State, deltas: Mapping[str, SourceDelta]) -> tuple[Model, Changes]:
        """The model of ``state``, this model's state with each source's replicas moved by
        its ``deltas`` entry (non-empty; a source without one holds the same replicas), and
        the changes of the merged view: this model's merged view and site views as they are
        where no source moved, else patched by the changes. Several sources carry their
        indexes on; a one-source state holds none (its views come from its set and delta)."""
        merging = len(state.sources) > 1
        sources: dict[str, _SourceModel] = {}
        for name, after in state.sources.items():
            known = self._source(name)
            if not merging:
                known = _SourceModel(known.replicas, counts=known.built_counts)
            delta = deltas.get(name)
            if delta is None:
                sources[name] = known.moved_to(after.replicas)
            else:
                sources[name] = _moved(known, delta, after.replicas)
        return _derive(self, state, sources, deltas)

    def sharing(self, state: State) -> Model:
        """The model of ``state``, whose sources hold the same replicas and sites as
        :attr:`state`'s (read times may differ: :attr:`site_updated` is not shared)."""
        return _shared(self, state)

    @property
    def contents(self) -> dict[Site, SiteView]:
        """Per covered site, its published lists and digest (``updated`` left None)."""
        if self._views is None:
            self._views = views_of(self._merged_replicas, frozenset(self._covering_sources))
        return self._views

    @property
    def site_updated(self) -> dict[Site, datetime]:
        """Site -> its last successful refresh: the oldest last success of the sources that
        cover it, so everything the site's ad says was confirmed at or after this time."""
        if self._updated is None:
            sources = self.state.sources
            updated: dict[Site, datetime] = {}
            for site, names in self._covering_sources.items():
                known = [t for n in names if (t := sources[n].last_success) is not None]
                if known:
                    updated[site] = min(known)
            self._updated = updated
        return self._updated

    def stamped_views(self) -> dict[Site, SiteView]:
        """Per covered site, its published lists with ``updated`` set (:attr:`site_updated`)."""
        updated = self.site_updated
        return {s: replace(v, updated=updated.get(s)) for s, v in self.contents.items()}

    def served_now(self, drains: Iterable[Drain], now: datetime) -> dict[Site, SiteView]:
        """The views as the sites' ads say them (:func:`~hydrator.core.storage.served_views`,
        which reads a source's index at a site only where some source's storage there is
        down: a one-source daemon never builds one)."""

        def held_at(name: str, site: Site) -> Mapping[DatasetId, Replica]:
            return self._source(name).index.get(site, {})

        views, covering = self.stamped_views(), self._covering_sources
        return served_views(views, self.state, covering, held_at, drains=drains, now=now)

    @property
    def entries(self) -> int:
        """How many (site, dataset) pairs the merged view holds."""
        if len(self.state.sources) == 1:
            (only,) = self.state.sources.values()
            return len(only.replicas)
        return index_size(self._merged)

    def built_for_tests(self) -> Built:
        """Test-facing only (the core never calls it): what this model has built so far,
        building nothing. No answer of the model shows these, yet the contract test and the
        plan's tests check them: the merged index and each source's index equal the plain
        merge and hold the state's own objects (memory: one object a replica), a one-source
        model builds no index, and site counts carried from cycle to cycle equal a count."""
        found = {name: self._sources.get(name) for name in self.state.sources}
        return Built(
            self._index,
            {n: None if s is None else s.built_index for n, s in found.items()},
            {n: None if s is None else s.built_counts for n, s in found.items()},
        )

    def _source(self, name: str) -> _SourceModel:
        """The model of source ``name``: of no replicas for a source this state lacks."""
        found = self._sources.get(name)
        if found is None:
            held = self.state.sources.get(name)
            found = _SourceModel(frozenset() if held is None else held.replicas)
            self._sources[name] = found
        return found

    @property
    def _merged(self) -> Index:
        """Site -> dataset -> all sources' reports combined (:func:`merge_replicas`; for one
        source, its index). The core reads it only where several sources merge: with one, a
        cycle works from its set and its delta."""
        if self._index is None:
            names = sorted(self.state.sources)
            if len(names) == 1:
                self._index = self._source(names[0]).index
            else:
                sources = self.state.sources
                self._index = merge_replicas(r for n in names for r in sources[n].replicas)
        return self._index

    @property
    def _covering_sources(self) -> dict[Site, frozenset[str]]:
        """Site -> names of the sources that cover it."""
        if self._covering is None:
            covered: dict[Site, set[str]] = {}
            for name, state in self.state.sources.items():
                for site in state.sites:
                    covered.setdefault(site, set()).add(name)
            self._covering = {site: frozenset(names) for site, names in covered.items()}
        return self._covering

    @property
    def _merged_replicas(self) -> Collection[Replica]:
        """The merged replicas, one per (site, dataset): one source's own set as it is (no
        index built), else the merged index's values."""
        if len(self.state.sources) == 1:
            (only,) = self.state.sources.values()
            return only.replicas
        return list(each_replica(self._merged))


def _shared(held: Model, state: State, sources: Mapping[str, _SourceModel] | None = None) -> Model:
    """The model of ``state``, whose sources hold the same replicas and sites as ``held``'s
    state (read times may differ: ``site_updated`` is not shared); ``sources``: its sources'
    models (default: ``held``'s, where made)."""
    if sources is None:
        sources = {
            name: found.moved_to(state.sources[name].replicas)
            for name, found in held._sources.items()
            if name in state.sources and name in held.state.sources
        }
    views = held._views
    return Model(state, sources, merged=held._index, covering=held._covering, contents=views)


def _derive(
    held: Model,
    state: State,
    sources: Mapping[str, _SourceModel],
    deltas: Mapping[str, SourceDelta],
) -> tuple[Model, Changes]:
    """What is derived from ``state`` (``sources``: its sources' derived data) and its
    changes against ``held``: ``held``'s merged view and site views as they are where no
    source moved, else the merged view and the site views patched by the changes."""
    if not deltas and _same_sites(held.state.sources, state.sources):
        return _shared(held, state, sources), Changes()
    first = not any(s.replicas for s in held.state.sources.values())  # all pairs are added
    merged, changes = _merge(held, Model(state, sources), deltas, first)
    fresh = Model(state, sources, merged=merged)
    contents = _contents(held, fresh, merged, None if first else changes)
    new = Model(state, sources, merged=merged, covering=fresh._covering_sources, contents=contents)
    return new, changes


def _same_sites(a: Mapping[str, SourceState], b: Mapping[str, SourceState]) -> bool:
    return a.keys() == b.keys() and all(a[n].sites == b[n].sites for n in a)


def _moved(known: _SourceModel, delta: SourceDelta, replicas: AbstractSet[Replica]) -> _SourceModel:
    """``known`` moved by a non-empty ``delta`` to ``replicas``: the site counts patched once
    the site guard needed them, and the index carried on where built (several sources
    merge), holding ``replicas``' own objects: the state keeps the answer's set as it is (a
    source that keeps its answer between fetches shares it, so the daemon holds one set and
    one object per replica, not two). Patched, where the answer holds the held objects
    (the untouched sites' dicts shared); built afresh where it is made of new objects (a
    source that builds them every fetch, or the first answer after a restart), the old
    objects then dying with the old state."""
    index, counts = known.built_index, known.built_counts
    if index is not None:
        reused = holds_objects_of(index, delta, replicas)
        index = patched_index(index, delta) if reused else index_of(replicas)
    return _SourceModel(replicas, index, None if counts is None else recounted(counts, delta))


def _delta(before: AbstractSet[Replica], after: AbstractSet[Replica]) -> SourceDelta:
    """``after - before`` and ``before - after``: a set operation reuses the stored element
    hashes, so only equal pairs cost a comparison (C-level: a replica is a tuple), and none
    where the source handed back last cycle's very objects. Two differences, each building
    only its (small) result: ``after ^ before`` copies a whole operand first, at the cycle's
    peak."""
    if before is after:
        return SourceDelta()
    if not before or not after:  # a first answer, or an emptied one: no set to build
        return SourceDelta(added=after, removed=before)
    return SourceDelta(added=after - before, removed=before - after)


def _merge(
    previous: Model, state: Model, deltas: Mapping[str, SourceDelta], first: bool
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
    old = previous._merged
    parts = (part for d in deltas.values() for part in (d.added, d.removed))
    touched = sorted(set(map(replica_key, chain.from_iterable(parts))))  # Change's order
    if len(ordered) == 1:
        new = state._source(names[0]).index
    elif not ordered:
        new = {}
    else:
        new = remerged(old, [state._source(name).index for name in names], touched)
    return new, _changes(_at(old, touched), _at(new, touched), touched)


def _at(index: Index, keys: list[Key]) -> dict[Key, Replica]:
    """``index``'s replicas at ``keys``, by key."""
    found = ((key, index.get(key[0], NO_SITE).get(key[1])) for key in keys)
    return {key: replica for key, replica in found if replica is not None}


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
    previous: Model, state: Model, merged: Index | None, changes: Changes | None
) -> dict[Site, SiteView]:
    """Site views: the previous one for a site no change touched, the previous one patched
    with its changes for a touched site, a full build for a site not seen before, and for
    every site with ``changes`` None (a first cycle: its changes are not even built).
    ``merged``: the new merged view if derived (else the state's replicas are read)."""
    old = previous.contents if changes is not None else {}
    touched: dict[Site, list[Change]] = {}
    for change in changes or ():
        touched.setdefault(change.site, []).append(change)
    sites = sorted(state._covering_sources)
    new_sites = frozenset(s for s in sites if s not in old)
    replicas = state._merged_replicas if merged is None else each_replica(merged)
    built = views_of(replicas, new_sites) if new_sites else {}
    return {
        s: built[s]
        if s in new_sites
        else patched_view(old[s], touched[s])
        if s in touched
        else old[s]
        for s in sites
    }


def index_of(replicas: Iterable[Replica]) -> Index:
    """The :data:`Index` of ``replicas``, which hold one replica per (site, dataset)."""
    index: Index = {}
    at_site = index.get
    for replica in replicas:
        found = at_site(replica.site)
        if found is None:
            found = index[replica.site] = {}
        found[replica.dataset] = replica
    return index


def views_of(replicas: Iterable[Replica], sites: frozenset[Site]) -> dict[Site, SiteView]:
    """The site views of ``replicas`` (one per (site, dataset)) at ``sites``, as
    :func:`~hydrator.core.views.site_contents` builds them from an index, in one pass."""
    lists = {site: SiteLists() for site in sites}
    at_site, available = lists.get, ReplicaState.AVAILABLE
    for replica in replicas:
        found = at_site(replica.site)
        if found is None:
            continue
        if replica.state is available and replica.detail is None:
            # Most replicas, added without a call. The rule is views.py's: such a replica
            # makes its dataset in available and nothing else (SiteLists.entries_of, whose
            # table in tests/unit/core/test_views.py has that row).
            found.available.append(replica.dataset)
        else:
            found.add(replica.dataset, replica)
    return {site: lists[site].view(site) for site in sorted(sites)}
