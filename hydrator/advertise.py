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
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from hydrator.domain import DatasetId, ReplicaState, SiteView, content_digest


@dataclass(frozen=True)
class AdvertisePolicy:
    demand_only: bool = False
    max_datasets_per_site: int = 0  # 0: no budget

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


def advertise(
    view: SiteView, wanted: Mapping[DatasetId, int], policy: AdvertisePolicy
) -> Advertised:
    """Narrow ``view`` by demand and budget; the view itself when nothing is left out."""
    entries: list[_Entry] = [(d, 1.0, ReplicaState.AVAILABLE) for d in view.available]
    entries += [(d, f, ReplicaState.PARTIAL) for d, f in view.partial]
    entries += [(d, f, ReplicaState.REPLICATING) for d, f in view.replicating]
    total = len(entries)
    if policy.demand_only:
        entries = [e for e in entries if wanted.get(e[0], 0) > 0]
    not_demanded = total - len(entries)
    over_budget = 0
    budget = policy.max_datasets_per_site
    if budget and len(entries) > budget:
        entries.sort(key=lambda e: (-wanted.get(e[0], 0), -e[2].rank, e[0]))
        over_budget = len(entries) - budget
        entries = entries[:budget]
    if not_demanded == 0 and over_budget == 0:
        return Advertised(view)
    return Advertised(_narrowed(view, entries), not_demanded, over_budget)


def _narrowed(view: SiteView, entries: list[_Entry]) -> SiteView:
    available = tuple(sorted(d for d, _, s in entries if s is ReplicaState.AVAILABLE))
    partial = tuple(sorted((d, f) for d, f, s in entries if s is ReplicaState.PARTIAL))
    replicating = tuple(sorted((d, f) for d, f, s in entries if s is ReplicaState.REPLICATING))
    digest = content_digest(view.site, available, partial, replicating)
    return replace(
        view, available=available, partial=partial, replicating=replicating, digest=digest
    )
