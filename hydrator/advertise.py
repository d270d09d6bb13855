"""What to advertise: the core's full site views, narrowed to what queued jobs need.

Every attribute is copied into every slot ad and shipped to the negotiator each cycle (FACTS.md:
keep lists to hundreds of names per slot), so a big site's full list is costly. Two knobs
(``[classad]``):

* ``advertise = "demand"``: only datasets that queued jobs declare in ``RequiredDatasets``.
* ``max_datasets_per_site``: a budget on names per site ad (all three lists together). Over
  it, the most-demanded datasets win, then the better state (available > partial >
  replicating), then the name, so the cut is deterministic.

The full truth stays in the state, ``hydrator once --json`` and the ``hydrator_datasets``
metric; ``hydrator_datasets_unadvertised{reason}`` counts what the ads leave out. Pure.

With ``[classad] advertise_stuck`` the ads also carry the stuck transfers (``StuckDatasets``):
not budgeted (they claim nothing usable), narrowed to demanded datasets in demand mode, and
folded into the digest so a change of that list reaches the ads.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from hydrator.domain import (
    DatasetId,
    Replica,
    ReplicaState,
    Site,
    SiteView,
    content_digest,
    stuck_digest,
)


@dataclass(frozen=True)
class AdvertisePolicy:
    demand_only: bool = False
    max_datasets_per_site: int = 0  # 0: no budget
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


_Entry = tuple[DatasetId, float, ReplicaState]
_ADVERTISABLE = (ReplicaState.AVAILABLE, ReplicaState.PARTIAL, ReplicaState.REPLICATING)


def advertise(
    view: SiteView,
    wanted: Mapping[DatasetId, int],
    policy: AdvertisePolicy,
    held: Mapping[tuple[Site, DatasetId], Replica],
) -> Advertised:
    """Narrow ``view`` by demand and budget; the view itself when nothing is left out.

    ``held`` is the state's (site, dataset) -> replica index, so the cost grows with the
    demanded datasets and the budget, not with the names a site holds.
    """
    advertised = _narrow(view, wanted, policy, held)
    if not policy.stuck:
        return advertised
    v = advertised.view
    return replace(advertised, view=replace(v, digest=stuck_digest(v.digest, v.stuck)))


def _narrow(
    view: SiteView,
    wanted: Mapping[DatasetId, int],
    policy: AdvertisePolicy,
    held: Mapping[tuple[Site, DatasetId], Replica],
) -> Advertised:
    if not policy.narrows:
        return Advertised(view)
    total = len(view.available) + len(view.partial) + len(view.replicating)
    demanded: list[_Entry] = []
    for dataset in wanted:
        replica = held.get((view.site, dataset))
        if replica is not None and replica.state in _ADVERTISABLE:
            moving = replica.state is ReplicaState.REPLICATING
            shown = replica.progress if moving else replica.fraction
            demanded.append((dataset, shown, replica.state))
    demanded.sort(key=lambda e: (-wanted[e[0]], -e[2].rank, e[0]))
    candidates = len(demanded) if policy.demand_only else total
    budget = policy.max_datasets_per_site or candidates
    entries = demanded[:budget]
    if not policy.demand_only and len(entries) < budget:
        entries += _fill(view, {e[0] for e in demanded}, budget - len(entries))
    not_demanded = total - candidates
    over_budget = max(0, candidates - budget)
    if not_demanded == 0 and over_budget == 0:
        return Advertised(view)
    keep = wanted.__contains__ if policy.demand_only else None
    return Advertised(_narrowed(view, entries, keep), not_demanded, over_budget)


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


def _narrowed(
    view: SiteView, entries: list[_Entry], keep: Callable[[DatasetId], bool] | None
) -> SiteView:
    """The view with only ``entries`` in its lists; the transfers reported beside them are
    kept for the datasets ``keep`` accepts (all when None)."""
    available = tuple(sorted(d for d, _, s in entries if s is ReplicaState.AVAILABLE))
    partial = tuple(sorted((d, f) for d, f, s in entries if s is ReplicaState.PARTIAL))
    replicating = tuple(sorted((d, f) for d, f, s in entries if s is ReplicaState.REPLICATING))
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
