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
  of the sources covering it (:attr:`~hydrator.core.model.Model.site_updated`).
* Storage stated unavailable (:mod:`hydrator.core.storage`): a source leaves out what it
  holds, and the shrink guards do not count what it held last time (that drop is explained,
  so it takes effect at once; the rest of its site is guarded as ever, by the site's count
  where the element's is known, and by each available element's count); a drained site's
  view lists nothing, and so does a site whose every source there says all its storage
  there cannot serve. The site views carry their storage elements and the reasons
  (:meth:`~hydrator.core.model.Model.served_now`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from functools import partial
from typing import NamedTuple

from hydrator.core.changes import Changes, SourceDelta
from hydrator.core.guards import (
    GuardPolicy,
    guard_sites,
    shrunken_sites,
    suspicious_drop,
    without_case_twins,
)
from hydrator.core.model import Model
from hydrator.core.storage import (
    Drain,
    count_outside,
    explained_entries,
)
from hydrator.domain import (
    Site,
    SiteView,
    Snapshot,
    SourceFailure,
    SourceOutcome,
    SourceState,
    State,
)

__all__ = [
    "GuardPolicy",
    "Model",
    "Plan",
    "Planned",
    "SourceDelta",
    "SourceStatus",
    "plan_cycle",
    "planned",
]


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
    """The pure core's answer: the new state, what changed, and what to write."""

    state: State  # what the store saves and the next cycle starts from
    changes: Changes
    sources: tuple[SourceStatus, ...]
    source_deltas: Mapping[str, SourceDelta]
    sites: Mapping[Site, SiteView]
    changed_sites: frozenset[Site]  # sites whose published content (digest) changed
    removed_sites: frozenset[Site]  # sites no source covers any more
    now: datetime  # the cycle's time: the first-seen time of the pairs it adds
    entries: int = 0  # (site, dataset) pairs the merged view holds
    # each covered site's lists before storage and drains (what LastAdvertised compares)
    contents: Mapping[Site, SiteView] = field(default_factory=dict)


class Planned(NamedTuple):
    """A plan and the :class:`~hydrator.core.model.Model` of its state, which the runtime
    holds and hands back to the next cycle's :func:`planned` as ``model``, so that the cycle
    costs its changes, not its replicas (the runtime reads only its ``state``)."""

    plan: Plan
    model: Model


def plan_cycle(
    previous: State,
    outcomes: Mapping[str, SourceOutcome],
    now: datetime,
    policy: GuardPolicy,
    drains: Sequence[Drain] = (),
) -> Plan:
    """Decide this cycle over plain values: ``previous``, the saved state; ``outcomes``, one
    entry per configured source; ``drains``, the operator's. The same plan as
    :func:`planned`'s, which the daemon calls with the model it holds: this plain entry is
    for tests and benchmarks, nothing in the daemon calls it."""
    return planned(previous, outcomes, now, policy, drains).plan


def planned(
    previous: State,
    outcomes: Mapping[str, SourceOutcome],
    now: datetime,
    policy: GuardPolicy,
    drains: Sequence[Drain] = (),
    *,
    model: Model | None = None,
) -> Planned:
    """Decide this cycle, and the model of the new state. ``outcomes`` has one entry per
    configured source; ``drains`` are the operator's (those of whole sites empty the site's
    view while active). ``previous``: the saved state. ``model``: the last cycle's
    :attr:`Planned.model` (or the :class:`~hydrator.core.startup.Startup`'s), which makes
    the cycle cost its changes; any other (or none) is ignored and the model of ``previous``
    built afresh: the plan is the same either way.

    Sources in ``previous`` that are no longer configured are dropped with their replicas.
    """
    held = Model.of(previous, model)
    sources: dict[str, SourceState] = {}
    statuses: list[SourceStatus] = []
    deltas: dict[str, SourceDelta] = {}
    old_contents = held.contents  # its sites are the covered ones
    outcomes, refused = without_case_twins(previous, old_contents.keys(), outcomes)
    for name in sorted(outcomes):
        before = previous.sources.get(name, SourceState(name))
        after, status, delta = _advance_source(before, outcomes[name], now, held, policy)
        if name in refused:
            status = replace(status, refused_sites=refused[name])
        sources[name] = after
        statuses.append(status)
        if delta.added or delta.removed:
            deltas[name] = delta
    for name in sorted(set(previous.sources) - set(outcomes)):
        deltas[name] = SourceDelta(removed=previous.sources[name].replicas)
    new, changes = held.apply(State(sources=sources), deltas)
    changed_sites = frozenset(
        site
        for site, view in new.contents.items()
        if site not in old_contents or old_contents[site].digest != view.digest
    )
    plan = Plan(
        state=new.state,
        changes=changes,
        sources=tuple(statuses),
        source_deltas=deltas,
        sites=new.served_now(drains, now),
        changed_sites=changed_sites,
        removed_sites=frozenset(old_contents) - frozenset(new.contents),
        now=now,
        entries=new.entries,
        contents=new.contents,
    )
    return Planned(plan, new)


def _advance_source(
    before: SourceState, outcome: SourceOutcome, now: datetime, model: Model, policy: GuardPolicy
) -> tuple[SourceState, SourceStatus, SourceDelta]:
    """``before`` moved by ``outcome``: the new source state, its status and its delta (empty
    when it failed or was held back). ``model``, of the state before, gives the
    delta and, only when a site is a candidate for the site guard, the site counts."""
    if isinstance(outcome, SourceFailure):
        after = replace(before, last_attempt=now, stale=True, error=outcome.error)
        kind = "permanent_error" if outcome.permanent else "transient_error"
        status = _status(after, kind, reason=outcome.error)
        return after, status, SourceDelta()
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
        return after, status, SourceDelta()
    delta = model.delta(before.name, outcome.replicas)
    counts = partial(model.site_counts, before.name)
    shrunk = shrunken_sites(before, counts, outcome, delta, policy=policy, explained=explained)
    guard = guard_sites(before, outcome, delta, shrunk, policy)
    delta = guard.delta
    changed = bool(delta.added or delta.removed)
    after = SourceState(
        name=before.name,
        replicas=guard.replicas if changed else before.replicas,
        sites=guard.sites,
        last_success=now,
        last_attempt=now,
        held_sites=guard.counts,
        elements=guard.elements,
        storages=outcome.storages,
    )
    status = replace(_status(after, "ok", snapshot=outcome), held_sites=guard.reasons)
    return after, status, delta


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
