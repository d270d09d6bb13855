"""How :mod:`hydrator.core.model` patches what it derives from a state by a cycle's delta or
changes, sharing what they do not touch: a source's index (:func:`patched_index`, where
:func:`holds_objects_of` says the answer is made of the held objects), the merged index
(:func:`remerged`), a site's view (:func:`patched_view`) and a source's site counts
(:func:`recounted`). Each gives what a build from scratch would give; nothing given is
mutated (a site's dict or list the patch changes is copied first). Which to patch, and what
each trick saves, is the model's (its module docstring keeps the figures).
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet
from functools import reduce
from itertools import filterfalse, islice

from hydrator.core.changes import SourceDelta
from hydrator.core.index import Index
from hydrator.core.presence import combine
from hydrator.core.views import LISTS, Entry, ListName, SiteLists
from hydrator.domain import Change, DatasetId, Replica, Site, SiteView, site_of

NO_SITE: Mapping[DatasetId, Replica] = {}
"""The replicas of a site an index does not hold (never mutated)."""

_SAMPLE = 8  # unchanged replicas looked at to tell whether an answer reuses the held objects


def holds_objects_of(held: Index, delta: SourceDelta, replicas: AbstractSet[Replica]) -> bool:
    """Whether ``replicas`` (the replicas of ``held`` moved by ``delta``) keep ``held``'s own
    objects where unchanged, as a source that keeps its answer between fetches does; told
    from a few of them (identity, not equality)."""
    kept = islice(filterfalse(delta.added.__contains__, replicas), _SAMPLE)  # unchanged ones
    return all(held[r.site][r.dataset] is r for r in kept)


def patched_index(held: Index, delta: SourceDelta) -> Index:
    """``held`` moved by ``delta``, holding the delta's added objects: a site's dict is copied
    when the delta touches the site, the others are shared."""
    index = dict(held)
    own: set[Site] = set()  # the sites whose dict is this index's own copy
    for replica in delta.removed:
        del _own(index, own, replica.site)[replica.dataset]
    for replica in delta.added:
        _own(index, own, replica.site)[replica.dataset] = replica
    return _without_empty(index, own)


def remerged(old: Index, indexes: list[Index], touched: list[tuple[Site, DatasetId]]) -> Index:
    """``old`` merged again at the ``touched`` keys from the sources' ``indexes`` (in
    :func:`~hydrator.core.index.merge_replicas`' order); a copy sharing the untouched sites'
    dicts."""
    new = dict(old)
    own: set[Site] = set()
    for site, dataset in touched:
        reports = [r for i in indexes if (r := i.get(site, NO_SITE).get(dataset)) is not None]
        if reports:
            _own(new, own, site)[dataset] = reduce(combine, reports)
        elif dataset in new.get(site, NO_SITE):
            del _own(new, own, site)[dataset]
    return _without_empty(new, own)


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
    found = index[site] = dict(index.get(site, NO_SITE))  # a C-level copy, hashes kept
    return found


def recounted(counts: Mapping[Site, int], delta: SourceDelta) -> dict[Site, int]:
    """``counts`` moved by ``delta`` (a copy; O(sites + delta)); no site at 0."""
    moved = Counter(counts)
    moved.update(map(site_of, delta.added))
    moved.subtract(map(site_of, delta.removed))
    return {site: n for site, n in moved.items() if n > 0}


def patched_view(view: SiteView, changes: Iterable[Change]) -> SiteView:
    """``view`` (``updated`` left None) with its site's ``changes`` applied: equal to
    rebuilding it (:func:`~hydrator.core.views.site_contents`), at the cost of the changes
    plus a C-level copy and a sort of nearly sorted lists, not a loop over every replica.
    An old replica's entries are removed and a new one's added as
    :meth:`SiteLists.entries_of <hydrator.core.views.SiteLists.entries_of>` says."""
    lists = SiteLists()
    gone: dict[ListName, list[Entry]] = {name: [] for name in LISTS}
    for change in changes:
        if change.old is not None:
            for name, entry in SiteLists.entries_of(change.dataset, change.old):
                gone[name].append(entry)
        if change.new is not None:
            lists.add(change.dataset, change.new)
    for name, removed in gone.items():
        getattr(lists, name).extend(_without(getattr(view, name), removed))
    return lists.view(view.site)


def _without(entries: tuple[Entry, ...], removed: list[Entry]) -> list[Entry]:
    """``entries`` (a view's list: sorted, one entry per dataset) without the ``removed``
    ones, each of which it holds."""
    if not removed:
        return list(entries)
    cuts: list[int] = []
    for entry in removed:
        cut = bisect_left(entries, entry)
        if cut == len(entries) or entries[cut] != entry:
            raise RuntimeError(f"site view out of step: {entry} not listed")  # a bug, never data
        cuts.append(cut)
    cuts.sort()
    out: list[Entry] = []
    start = 0
    for cut in cuts:
        out += entries[start:cut]
        start = cut + 1
    out += entries[start:]
    return out
