"""What the core derives from a :class:`~hydrator.domain.State` and carries from cycle to
cycle: :class:`Derived` (the merged index, which sources cover each site, each site's view
and its last refresh) and, per source, :class:`SourceDerived` (its index and its count of
replicas per site).

The state is a frozen value, persisted; none of this is persisted, and none of it lives on
the state. Whoever holds a state holds its :class:`Derived` beside it: the service (from the
store's load, then from each plan), a plan (:attr:`hydrator.core.plan.Plan.derived`). Each
part is built on first use or handed over by the core (which patches the previous cycle's
by its delta, so a cycle costs O(changes), not O(replicas)), set at most once and never
mutated after. A one-source daemon builds no index (~30 MB a million replicas,
twice while a cycle patches it).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import replace
from datetime import datetime

from hydrator.core.index import Index, each_replica, index_of, index_size, merge_replicas
from hydrator.core.views import views_of
from hydrator.domain import Replica, Site, SiteView, State, site_of


class SourceDerived:
    """One source's derived data, of its :attr:`~hydrator.domain.SourceState.replicas`
    (``replicas``): :attr:`index` and :attr:`site_counts`, each built on first use or given
    at construction (equal to what it would build). Never mutated once built."""

    __slots__ = ("_counts", "_index", "replicas")

    def __init__(
        self,
        replicas: AbstractSet[Replica],
        index: Index | None = None,
        counts: Mapping[Site, int] | None = None,
    ) -> None:
        self.replicas = replicas
        self._index = index
        self._counts = counts

    @property
    def index(self) -> Index:
        """Site -> dataset -> this source's replica (of :attr:`replicas`' own objects); the
        core reads it only where several sources merge, and from then on hands it from
        cycle to cycle, patched by each delta."""
        if self._index is None:
            self._index = index_of(self.replicas)
        return self._index

    @property
    def built_index(self) -> Index | None:
        """:attr:`index` if it was built, else None (never builds it)."""
        return self._index

    @property
    def site_counts(self) -> Mapping[Site, int]:
        """Site -> how many of :attr:`replicas` are there; built on first use (one pass,
        ~0.5 s at a million replicas) and from then on handed from cycle to cycle by the core,
        patched by each delta."""
        if self._counts is None:
            self._counts = Counter(map(site_of, self.replicas))
        return self._counts

    @property
    def built_counts(self) -> Mapping[Site, int] | None:
        """:attr:`site_counts` if built, else None (never builds them)."""
        return self._counts

    def moved_to(self, replicas: AbstractSet[Replica]) -> SourceDerived:
        """The same derived data for ``replicas``, which must be equal to :attr:`replicas`
        (the same answer kept by a new state value)."""
        return SourceDerived(replicas, self._index, self._counts)


class Derived:
    """A :class:`~hydrator.domain.State` (``state``) and what the core derives from it:
    :attr:`merged`, :attr:`coverage`, :attr:`contents`, :attr:`site_updated` and per source
    its :class:`SourceDerived` (:meth:`source`). Each is built on first use or given at
    construction (then equal to what it would build), and never mutated afterwards."""

    __slots__ = ("_contents", "_coverage", "_merged", "_site_updated", "_sources", "state")

    def __init__(
        self,
        state: State,
        sources: Mapping[str, SourceDerived] | None = None,
        *,
        merged: Index | None = None,
        coverage: dict[Site, frozenset[str]] | None = None,
        contents: dict[Site, SiteView] | None = None,
    ) -> None:
        self.state = state
        self._sources = dict(sources or {})
        self._merged = merged
        self._coverage = coverage
        self._contents = contents
        self._site_updated: dict[Site, datetime] | None = None

    def source(self, name: str) -> SourceDerived:
        """The derived data of source ``name`` (one of ``state.sources``)."""
        found = self._sources.get(name)
        if found is None:
            found = self._sources[name] = SourceDerived(self.state.sources[name].replicas)
        return found

    def sharing(self, state: State, sources: Mapping[str, SourceDerived] | None = None) -> Derived:
        """The derived data of ``state``, whose sources hold the same replicas and sites as
        :attr:`state`'s (read times may differ: :attr:`site_updated` is not shared);
        ``sources``: its sources' derived data (default: this one's, where made)."""
        if sources is None:
            sources = {
                name: found.moved_to(state.sources[name].replicas)
                for name, found in self._sources.items()
                if name in state.sources
            }
        return Derived(
            state,
            sources,
            merged=self._merged,
            coverage=self._coverage,
            contents=self._contents,
        )

    @property
    def merged(self) -> Index:
        """Site -> dataset -> all sources' reports combined (:func:`merge_replicas`; for one
        source, its :attr:`SourceDerived.index`). The core reads it only where several
        sources merge: with one, a cycle works from its set and its delta."""
        if self._merged is None:
            names = sorted(self.state.sources)
            if len(names) == 1:
                self._merged = self.source(names[0]).index
            else:
                sources = self.state.sources
                self._merged = merge_replicas(r for n in names for r in sources[n].replicas)
        return self._merged

    @property
    def built_merged(self) -> Index | None:
        """:attr:`merged` if it was built or given, else None (never builds it)."""
        return self._merged

    @property
    def coverage(self) -> dict[Site, frozenset[str]]:
        """Site -> names of the sources that cover it."""
        if self._coverage is None:
            covered: dict[Site, set[str]] = {}
            for name, state in self.state.sources.items():
                for site in state.sites:
                    covered.setdefault(site, set()).add(name)
            self._coverage = {site: frozenset(names) for site, names in covered.items()}
        return self._coverage

    @property
    def merged_replicas(self) -> Collection[Replica]:
        """The merged replicas, one per (site, dataset): one source's own set as it is (no
        index built), else :attr:`merged`'s values."""
        if len(self.state.sources) == 1:
            (only,) = self.state.sources.values()
            return only.replicas
        return list(each_replica(self.merged))

    @property
    def contents(self) -> dict[Site, SiteView]:
        """Per covered site, its published lists and digest (``updated`` left None)."""
        if self._contents is None:
            self._contents = views_of(self.merged_replicas, frozenset(self.coverage))
        return self._contents

    @property
    def site_updated(self) -> dict[Site, datetime]:
        """Site -> its last successful refresh: the oldest last success of the sources that
        cover it, so everything the site's ad says was confirmed at or after this time."""
        if self._site_updated is None:
            sources = self.state.sources
            updated: dict[Site, datetime] = {}
            for site, names in self.coverage.items():
                known = [t for n in names if (t := sources[n].last_success) is not None]
                if known:
                    updated[site] = min(known)
            self._site_updated = updated
        return self._site_updated

    def stamped_views(self) -> dict[Site, SiteView]:
        """Per covered site, its published lists with ``updated`` set (:attr:`site_updated`)."""
        updated = self.site_updated
        return {s: replace(v, updated=updated.get(s)) for s, v in self.contents.items()}

    @property
    def entries(self) -> int:
        """How many (site, dataset) pairs the merged view holds."""
        if len(self.state.sources) == 1:
            (only,) = self.state.sources.values()
            return len(only.replicas)
        return index_size(self.merged)
