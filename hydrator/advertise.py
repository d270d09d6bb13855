"""What to advertise: the core's full site views, narrowed to what queued jobs need.

Every attribute is copied into every slot ad and shipped to the negotiator each cycle (FACTS.md:
keep lists to hundreds of names per slot), so a big site's full list is costly. Two knobs
(``[classad]``):

* ``advertise = "demand"``: only datasets that queued jobs declare in ``RequiredDatasets``.
* ``max_datasets_per_site``: a budget on names per site ad (all three lists together). Over
  it, the most-demanded datasets win, then the better state (available > partial >
  replicating), then the name, so the cut is deterministic.
* ``max_ad_bytes``: the execute-node hook refuses an answer larger than this (STARTD_CRON reads
  its output into a 64 KiB line buffer), and would then keep publishing its old copy. An ad
  that would be larger is cut to the longest prefix, in the same order, that fits.

The full truth stays in the state, ``hydrator once --json`` and the ``hydrator_datasets``
metric; ``hydrator_datasets_unadvertised{reason}`` counts what the ads leave out. Pure.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from hydrator.domain import DatasetId, Replica, ReplicaState, Site, SiteView, content_digest


@dataclass(frozen=True)
class AdvertisePolicy:
    demand_only: bool = False
    max_datasets_per_site: int = 0  # 0: no budget
    max_ad_bytes: int = 0  # 0: no size limit

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


_Entry = tuple[DatasetId, float, ReplicaState]
_ADVERTISABLE = (ReplicaState.AVAILABLE, ReplicaState.PARTIAL, ReplicaState.REPLICATING)
# Bytes a name costs in an old-syntax list at most: its two quotes and a comma
_PER_NAME_BYTES = 3

Size = Callable[[SiteView], int]


def advertise(
    view: SiteView,
    wanted: Mapping[DatasetId, int],
    policy: AdvertisePolicy,
    held: Mapping[tuple[Site, DatasetId], Replica],
    size: Size | None = None,
) -> Advertised:
    """Narrow ``view`` by demand, budget and size; the view itself when nothing is left out.

    ``held`` is the state's (site, dataset) -> replica index, so the cost grows with the
    demanded datasets and the budget, not with the names a site holds. ``size`` gives the
    bytes of a view's published ad, or any number on the same side of ``max_ad_bytes`` (it is
    only compared with it); without it, or without ``max_ad_bytes``, size is not checked.
    """
    narrowed = _by_demand_and_budget(view, wanted, policy, held)
    limit = policy.max_ad_bytes
    if size is None or not limit or size(narrowed.view) <= limit:
        return narrowed
    entries, _ = _ranked(view, wanted, policy, held)
    keep = _fitting(view, entries, size, limit)
    return Advertised(
        _narrowed(view, entries[:keep]),
        narrowed.not_demanded,
        narrowed.over_budget,
        len(entries) - keep,
    )


def _by_demand_and_budget(
    view: SiteView,
    wanted: Mapping[DatasetId, int],
    policy: AdvertisePolicy,
    held: Mapping[tuple[Site, DatasetId], Replica],
) -> Advertised:
    if not policy.narrows:
        return Advertised(view)
    entries, candidates = _ranked(view, wanted, policy, held)
    total = len(view.available) + len(view.partial) + len(view.replicating)
    not_demanded, over_budget = total - candidates, candidates - len(entries)
    if not_demanded == 0 and over_budget == 0:
        return Advertised(view)
    return Advertised(_narrowed(view, entries), not_demanded, over_budget)


def _demanded(
    view: SiteView, wanted: Mapping[DatasetId, int], held: Mapping[tuple[Site, DatasetId], Replica]
) -> list[_Entry]:
    """The site's datasets that queued jobs want, most-demanded first, then state, then name."""
    demanded: list[_Entry] = []
    for dataset in wanted:
        replica = held.get((view.site, dataset))
        if replica is not None and replica.state in _ADVERTISABLE:
            demanded.append((dataset, replica.fraction, replica.state))
    demanded.sort(key=lambda e: (-wanted[e[0]], -e[2].rank, e[0]))
    return demanded


def _ranked(
    view: SiteView,
    wanted: Mapping[DatasetId, int],
    policy: AdvertisePolicy,
    held: Mapping[tuple[Site, DatasetId], Replica],
) -> tuple[list[_Entry], int]:
    """What demand and budget let into the ad, in the order they win (demanded first), and
    how many candidates there were before the budget."""
    demanded = _demanded(view, wanted, held)
    total = len(view.available) + len(view.partial) + len(view.replicating)
    candidates = len(demanded) if policy.demand_only else total
    budget = policy.max_datasets_per_site or candidates
    entries = demanded[:budget]
    if not policy.demand_only and len(entries) < budget:
        entries += _fill(view, {e[0] for e in demanded}, budget - len(entries))
    return entries, candidates


def _fitting(view: SiteView, entries: list[_Entry], size: Size, limit: int) -> int:
    """How many of ``entries`` (a prefix) fit in ``limit`` bytes; a few renderings only.

    Each name costs at most its length + 3 bytes over the empty ad, so that estimate fits; the
    few bytes it overestimates are then won back one name at a time, and should the estimate
    ever be wrong the prefix is bisected with real sizes.
    """
    spent, keep = size(_narrowed(view, [])), 0
    for dataset, _, _ in entries:
        spent += len(dataset.scope) + len(dataset.name) + 1 + _PER_NAME_BYTES
        if spent > limit:
            break
        keep += 1

    def fits(count: int) -> bool:
        return size(_narrowed(view, entries[:count])) <= limit

    if keep and not fits(keep):
        low, high = 0, keep  # fits(low), not fits(high)
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (middle, high) if fits(middle) else (low, middle)
        return low
    while keep < len(entries) and fits(keep + 1):
        keep += 1
    return keep


def _fill(view: SiteView, taken: set[DatasetId], count: int) -> list[_Entry]:
    """The next ``count`` undemanded entries in budget order: better state, then name (the
    view's lists are already sorted by name)."""
    out: list[_Entry] = []
    lists: list[list[_Entry]] = [
        [(d, 1.0, ReplicaState.AVAILABLE) for d in view.available[: count + len(taken)]],
        [(d, f, ReplicaState.PARTIAL) for d, f in view.partial[: count + len(taken)]],
        [(d, f, ReplicaState.REPLICATING) for d, f in view.replicating[: count + len(taken)]],
    ]
    for entries in lists:
        for entry in entries:
            if len(out) == count:
                return out
            if entry[0] not in taken:
                out.append(entry)
    return out


def _narrowed(view: SiteView, entries: list[_Entry]) -> SiteView:
    available = tuple(sorted(d for d, _, s in entries if s is ReplicaState.AVAILABLE))
    partial = tuple(sorted((d, f) for d, f, s in entries if s is ReplicaState.PARTIAL))
    replicating = tuple(sorted((d, f) for d, f, s in entries if s is ReplicaState.REPLICATING))
    digest = content_digest(view.site, available, partial, replicating)
    return replace(
        view, available=available, partial=partial, replicating=replicating, digest=digest
    )
