"""What to advertise: the core's full site views, narrowed to what queued jobs need.

Every attribute is copied into every slot ad and shipped to the negotiator each cycle
(docs/platform.md: keep lists to hundreds of names per slot), so a big site's full list is costly.
Three knobs (``[classad]``):

* ``advertise = "demand"``: only datasets that queued jobs declare in ``RequiredDatasets``.
* ``max_datasets_per_site``: a budget on names per site ad (all three lists together). Over
  it, the most-demanded datasets win, then the better state (available > partial >
  replicating), then the name, so the cut is deterministic.
* ``max_ad_bytes``: the execute-node hook refuses an answer larger than this (STARTD_CRON reads
  its output into a 64 KiB line buffer), and would then keep publishing its old copy. An ad
  that would be larger is cut to the longest prefix, in the same order, that fits.

The full truth stays in the state, ``hydrator once --json`` and the ``hydrator_datasets``
metric; ``hydrator_datasets_unadvertised{reason}`` counts what the ads leave out. Pure.

With ``[classad] advertise_stuck`` the ads also carry the stuck transfers (``StuckDatasets``):
not budgeted (they claim nothing usable), narrowed to demanded datasets in demand mode, and
folded into the digest so a change of that list reaches the ads.

The reasons a site's storage cannot serve (``DataLocalityUnavailable``) are folded
into the digest too, so a storage element going down or coming back reaches the ads even when
no list changes (:func:`~hydrator.core.storage.unavailable_digest`).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from itertools import chain, compress, islice, repeat
from operator import is_, itemgetter

from hydrator.core.ranking import STATE_RANK
from hydrator.core.storage import unavailable_digest
from hydrator.core.views import content_digest, stuck_digest
from hydrator.domain import DatasetId, ReplicaState, SiteView


@dataclass(frozen=True)
class AdvertisePolicy:
    demand_only: bool = False
    max_datasets_per_site: int = 0  # 0: no budget
    max_ad_bytes: int = 0  # 0: no size limit
    stuck: bool = False  # the ads list stuck transfers too (digest covers them)

    @property
    def narrows(self) -> bool:
        return self.demand_only or self.max_datasets_per_site > 0


@dataclass(frozen=True)
class Advertised:
    """A site's advertised view and what was left out of it."""

    view: SiteView
    not_demanded: int = 0
    over_budget: int = 0
    over_size: int = 0


# One dataset as the ranking sees it: its name, its share held at the site, its state
_Ranked = tuple[DatasetId, float, ReplicaState]
# Bytes a name costs in an old-syntax list at most: its two quotes and a comma
_PER_NAME_BYTES = 3
# Bytes a name costs in an ad at least: a scope and a name of one character, the colon and
# two quotes. So no more than ``max_ad_bytes // MIN_NAME_BYTES`` names ever fit.
MIN_NAME_BYTES = 5

_first, _second = itemgetter(0), itemgetter(1)  # a (dataset, share) pair's parts
_third, _pair = itemgetter(2), itemgetter(0, 1)  # an entry's state, and its (dataset, share)
Size = Callable[[SiteView], int]
_Keep = Callable[[DatasetId], bool] | None


def advertise(
    view: SiteView,
    wanted: Mapping[DatasetId, int],
    policy: AdvertisePolicy,
    size: Size | None = None,
) -> Advertised:
    """Narrow ``view`` by demand, budget and size; the view itself when nothing is left out.

    Demanded datasets are found in the view's sorted lists (each looked up, or the lists
    filtered when many are wanted), so the cost grows with the demanded datasets (at most
    with the names a site holds) and the budget. ``size`` gives the
    bytes of a view's published ad, or any number on the same side of ``max_ad_bytes`` (it is
    only compared with it); without it, or without ``max_ad_bytes``, size is not checked. A
    name costs at least :data:`MIN_NAME_BYTES` in it, as in a real ad.
    """
    advertised = _narrow(view, wanted, policy, size)
    v = advertised.view
    digest = stuck_digest(v.digest, v.stuck) if policy.stuck else v.digest
    digest = unavailable_digest(digest, v.unavailable)  # the same digest when all can serve
    if digest == v.digest:
        return advertised
    return replace(advertised, view=replace(v, digest=digest))


def _narrow(
    view: SiteView,
    wanted: Mapping[DatasetId, int],
    policy: AdvertisePolicy,
    size: Size | None,
) -> Advertised:
    narrowed = _by_demand_and_budget(view, wanted, policy)
    limit = policy.max_ad_bytes
    if size is None or not limit or size(narrowed.view) <= limit:
        return narrowed
    # only the entries that could fit are built: a big site lists far more
    entries, _, listed = _ranked(view, wanted, policy, limit // MIN_NAME_BYTES + 1)
    keep = _kept(wanted, policy)
    count = _fitting(view, entries, size, limit, keep)
    return Advertised(
        _narrowed(view, entries[:count], keep),
        narrowed.not_demanded,
        narrowed.over_budget,
        listed - count,
    )


def _kept(wanted: Mapping[DatasetId, int], policy: AdvertisePolicy) -> _Keep:
    """Which datasets' reported transfers stay beside a narrowed view (all when None)."""
    return wanted.__contains__ if policy.demand_only else None


def _by_demand_and_budget(
    view: SiteView,
    wanted: Mapping[DatasetId, int],
    policy: AdvertisePolicy,
) -> Advertised:
    if not policy.narrows:
        return Advertised(view)
    entries, candidates, _ = _ranked(view, wanted, policy)
    total = _count(view)
    not_demanded, over_budget = total - candidates, candidates - len(entries)
    if not_demanded == 0 and over_budget == 0:
        return Advertised(view)
    return Advertised(_narrowed(view, entries, _kept(wanted, policy)), not_demanded, over_budget)


def _demanded(view: SiteView, wanted: Mapping[DatasetId, int]) -> list[_Ranked]:
    """The site's datasets that queued jobs want, most-demanded first, then state, then name.
    Few wanted against the site's names: each looked up in the view's sorted lists; else the
    lists filtered by ``wanted`` (:func:`_entries`)."""
    total = _count(view)
    if len(wanted) * _SCAN_RATIO < total:
        demanded = [e for e in map(partial(_entry, view), wanted) if e is not None]
    else:
        demanded = list(_entries(view, wanted.__contains__))
    demanded.sort(key=lambda e: (-wanted[e[0]], -STATE_RANK[e[2]], e[0]))
    return demanded


_SCAN_RATIO = 24  # names scanned that cost about one lookup (three bisections; docs/performance.md)


def _entry(view: SiteView, dataset: DatasetId) -> _Ranked | None:
    """``dataset``'s entry in the view's advertised lists (sorted by dataset), or None."""
    available = view.available
    at = bisect_left(available, dataset)
    if at < len(available) and available[at] == dataset:
        return (dataset, 1.0, ReplicaState.AVAILABLE)
    for pairs, state in ((view.partial, ReplicaState.PARTIAL), (view.replicating, _MOVING)):
        at = bisect_left(pairs, dataset, key=_first)
        if at < len(pairs) and pairs[at][0] == dataset:
            return (dataset, pairs[at][1], state)
    return None


def _count(view: SiteView) -> int:
    """How many entries the view's three advertised lists hold."""
    return len(view.available) + len(view.partial) + len(view.replicating)


def _names(view: SiteView) -> Iterator[DatasetId]:
    """The datasets of the view's three advertised lists (for counting: in list order)."""
    return chain(view.available, map(_first, view.partial), map(_first, view.replicating))


def _entries(view: SiteView, wants: Callable[[DatasetId], bool] | None = None) -> Iterator[_Ranked]:
    """The view's advertised entries: better state first, then name (C-level iterators);
    with ``wants``, only those of the datasets it accepts, each list filtered by C-level
    iterators before an entry is built (for the hits only)."""
    available: Iterable[DatasetId] = view.available
    partial: Sequence[tuple[DatasetId, float]] = view.partial
    replicating: Sequence[tuple[DatasetId, float]] = view.replicating
    if wants is not None:
        available = compress(available, map(wants, view.available))
        partial = list(compress(partial, map(wants, map(_first, partial))))
        replicating = list(compress(replicating, map(wants, map(_first, replicating))))
    lists = {
        ReplicaState.AVAILABLE: zip(available, repeat(1.0), repeat(ReplicaState.AVAILABLE)),
        ReplicaState.PARTIAL: zip(map(_first, partial), map(_second, partial), repeat(_PARTIAL)),
        _MOVING: zip(map(_first, replicating), map(_second, replicating), repeat(_MOVING)),
    }
    return chain.from_iterable(lists[state] for state in _BUDGET_ORDER)


_PARTIAL, _MOVING = ReplicaState.PARTIAL, ReplicaState.REPLICATING
# the view's three lists, best state first: the order undemanded entries are budgeted in
_BUDGET_ORDER = sorted(
    (ReplicaState.AVAILABLE, _PARTIAL, _MOVING), key=STATE_RANK.__getitem__, reverse=True
)


def _ranked(
    view: SiteView,
    wanted: Mapping[DatasetId, int],
    policy: AdvertisePolicy,
    most: int | None = None,
) -> tuple[list[_Ranked], int, int]:
    """What demand and budget let into the ad, in the order they win (demanded first): the
    first ``most`` of those entries (all when None), how many candidates there were before
    the budget, and how many entries there are in all."""
    demanded = _demanded(view, wanted)
    total = _count(view)
    candidates = len(demanded) if policy.demand_only else total
    budget = policy.max_datasets_per_site or candidates
    entries = demanded[:budget]
    listed = len(entries)
    if not policy.demand_only and listed < budget:
        taken = {e[0] for e in demanded}
        left = min(budget - listed, total - _listed(view, taken))
        entries += _fill(view, taken, left if most is None else max(0, min(left, most - listed)))
        listed += left
    return (entries if most is None else entries[:most]), candidates, listed


def _listed(view: SiteView, datasets: set[DatasetId]) -> int:
    """How many of ``datasets`` the view's three lists hold (a C-level count)."""
    if not datasets:
        return 0
    return sum(map(datasets.__contains__, _names(view)))


def _fitting(view: SiteView, entries: list[_Ranked], size: Size, limit: int, keep: _Keep) -> int:
    """How many of ``entries`` (a prefix) fit in ``limit`` bytes; a few renderings only.

    Each name costs at most its length + 3 bytes over the empty ad, so that estimate fits; the
    few bytes it overestimates are then won back one name at a time, and should the estimate
    ever be wrong the prefix is bisected with real sizes.
    """
    spent, count = size(_narrowed(view, [], keep)), 0
    for dataset, _, _ in entries:
        spent += len(dataset.scope) + len(dataset.name) + 1 + _PER_NAME_BYTES
        if spent > limit:
            break
        count += 1

    def fits(n: int) -> bool:
        return size(_narrowed(view, entries[:n], keep)) <= limit

    if count and not fits(count):
        low, high = 0, count  # fits(low), not fits(high)
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (middle, high) if fits(middle) else (low, middle)
        return low
    while count < len(entries) and fits(count + 1):
        count += 1
    return count


def _fill(view: SiteView, taken: set[DatasetId], count: int) -> list[_Ranked]:
    """The next ``count`` undemanded entries in budget order: better state, then name (the
    view's lists are already sorted by name); built by C-level iterators, as a big site's
    lists are long."""
    entries = _entries(view)
    if taken:
        entries = (e for e in entries if e[0] not in taken)
    return list(islice(entries, count))


def _narrowed(view: SiteView, entries: list[_Ranked], keep: _Keep) -> SiteView:
    """The view with only ``entries`` in its lists; the transfers reported beside them are
    kept for the datasets ``keep`` accepts (all when None)."""
    states = list(map(_third, entries))  # C-level filters: an ad takes thousands of names

    def having(state: ReplicaState) -> Iterator[bool]:
        return map(is_, states, repeat(state))

    available = tuple(sorted(compress(map(_first, entries), having(ReplicaState.AVAILABLE))))
    partial = tuple(sorted(compress(map(_pair, entries), having(ReplicaState.PARTIAL))))
    replicating = tuple(sorted(compress(map(_pair, entries), having(ReplicaState.REPLICATING))))
    digest = content_digest(view.site, available, partial, replicating)
    listed = {d for d, _ in partial}
    return replace(
        view,
        available=available,
        partial=partial,
        replicating=replicating,
        digest=digest,
        partial_bytes=tuple(p for p in view.partial_bytes if p[0] in listed),
        stuck=view.stuck if keep is None else tuple(d for d in view.stuck if keep(d)),
        incoming=view.incoming if keep is None else tuple(p for p in view.incoming if keep(p[0])),
    )
