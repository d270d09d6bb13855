"""What a cycle between two full reads answers for each source (pure): an event cycle
(docs/events.md) re-reads a few datasets of one source, a refresh cycle reads storage
statuses only; every other part of each source's answer is its last full read's, and so are
the read times a site's ``updated`` and the guards go by.

* :func:`event_outcomes`: an event cycle's answers, one source's datasets re-read
  (:func:`reread`, :func:`patched`), every other source :func:`unchanged`;
* :func:`refresh_outcomes`: a refresh cycle's answers, each source's snapshot with the storage
  statuses read now (:func:`restated`), and which changes of availability only a full read
  applies exactly (:func:`inexact`);
* :func:`planned_between`: such a cycle planned (:func:`~hydrator.core.plan.planned`), with
  every source's read times, staleness and guard counts as the last full read left them
  (:func:`keep_read_times`).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import replace
from datetime import datetime

from hydrator.core.model import Model
from hydrator.core.plan import GuardPolicy, Planned, SourceStatus, planned
from hydrator.core.storage import Drain, unavailable_storages
from hydrator.domain import (
    DatasetId,
    Replica,
    Site,
    Snapshot,
    SourceOutcome,
    SourceState,
    State,
    StorageStatus,
)


def event_outcomes(
    state: State, name: str, datasets: Collection[DatasetId], read: Sequence[Replica]
) -> dict[str, Snapshot]:
    """An event cycle's answers: source ``name``'s last good snapshot with ``datasets``
    replaced by what was ``read`` (the sites read joining its sites), every other source's
    :func:`unchanged`."""
    held = state.sources[name]
    replicas = reread(held.replicas, datasets, read)
    sites = held.sites | {r.site for r in read}
    outcomes = {other: unchanged(s) for other, s in state.sources.items() if other != name}
    outcomes[name] = patched(held, replicas, sites)
    return outcomes


def refresh_outcomes(
    state: State, statuses: Mapping[str, tuple[StorageStatus, ...] | None]
) -> tuple[dict[str, Snapshot], dict[str, tuple[str, ...]]]:
    """A refresh cycle's answers: each source's last good snapshot with the storage
    ``statuses`` it has just read (None or missing: the last good ones stay,
    :func:`restated`); and per source that read them, the storage elements whose change only
    a full read applies exactly (:func:`inexact`)."""
    outcomes: dict[str, Snapshot] = {}
    exact_only: dict[str, tuple[str, ...]] = {}
    for name, held in state.sources.items():
        read = statuses.get(name)
        if read is not None:
            exact_only[name] = inexact(held, read)
        outcomes[name] = restated(held, read)
    return outcomes, exact_only


def planned_between(
    previous: State,
    outcomes: Mapping[str, SourceOutcome],
    now: datetime,
    policy: GuardPolicy,
    drains: Sequence[Drain] = (),
    *,
    model: Model | None = None,
) -> Planned:
    """A cycle between two full reads planned over ``outcomes`` (:func:`planned`, ``model``
    as there), every source's read times, failure and guard state kept as the last full read
    left them (:func:`keep_read_times`)."""
    decided = planned(previous, outcomes, now, policy, drains, model=model)
    return keep_read_times(decided, previous)


def reread(
    previous: AbstractSet[Replica], datasets: Collection[DatasetId], read: Iterable[Replica]
) -> set[Replica]:
    """A source's replicas with those of ``datasets`` replaced by what was ``read`` (exact
    reads of exactly those datasets: a dataset read nowhere leaves every site)."""
    wanted = frozenset(datasets)
    kept = {r for r in previous if r.dataset not in wanted}
    kept.update(r for r in read if r.dataset in wanted)
    return kept


def unchanged(state: SourceState) -> Snapshot:
    """An event cycle's answer for a source it did not read: its last good snapshot, the
    same set object (the core compares it by identity and finds no change), with the storage
    statuses and element counts of that snapshot (else an event cycle would bring back what
    unavailable storage holds, or look like every storage element emptied)."""
    return patched(state, state.replicas, state.sites)


def patched(
    state: SourceState, replicas: AbstractSet[Replica], sites: AbstractSet[Site]
) -> Snapshot:
    """``state``'s last good snapshot with ``replicas`` and ``sites`` instead (an event
    cycle's answer for the source it re-read), its storage statuses and element counts kept."""
    snapshot = Snapshot.of(state.name, replicas, sites, sites_named=True, storages=state.storages)
    return replace(snapshot, elements=state.elements)


def restated(state: SourceState, storages: tuple[StorageStatus, ...] | None) -> Snapshot:
    """A refresh cycle's answer for a source (docs/events.md): its last good snapshot, as
    :func:`unchanged`, with the storage statuses it has just read instead; with ``None`` (it
    cannot read them, or the read failed) the last good statuses stay (unknown is not
    unavailable)."""
    kept = unchanged(state)
    return kept if storages is None else replace(kept, storages=storages)


def inexact(state: SourceState, statuses: Iterable[StorageStatus]) -> tuple[str, ...]:
    """The storage elements, by name, whose change of availability read by a refresh cycle
    (``statuses`` against ``state``'s) only a full read applies exactly, the refresh cycle
    keeping the replicas it does not read: one gone down that held entries at the last full
    read (:attr:`~hydrator.domain.SourceState.elements`; unknown counts as held) at a site
    where another one still serves (a site with none left lists nothing at once:
    :func:`~hydrator.core.storage.with_storage`), and one back that the last full read did
    not count (it was down then: what it holds is not in the state)."""
    statuses = tuple(statuses)
    was = unavailable_storages(state.storages)
    now = unavailable_storages(statuses)
    serving = {s.site for s in statuses if s.available}
    out: list[str] = []
    for status in statuses:
        name, count = status.storage, state.elements.get(status.storage)
        if name in now and name not in was:
            if status.site in serving and (count is None or count.entries > 0):
                out.append(name)
        elif name in was and name not in now and count is None:
            out.append(name)
    return tuple(sorted(out))


def keep_read_times(decided: Planned, previous: State) -> Planned:
    """``decided`` (an event or refresh cycle's plan, and its state's model) with every
    source's read times, failure and guard state as ``previous`` had them (:func:`_kept`):
    such a cycle read a few datasets or statuses, not a source, so a site's ``updated`` time
    (everything in its ad confirmed at or after it) stays that of the last full read, a
    failing source stays stale with its error, and the shrink guards count full reads only
    (such a cycle neither advances nor resets them). The site views keep the plan's storage
    elements and reasons, stamped again."""
    plan = decided.plan
    sources: dict[str, SourceState] = {}
    for name, after in plan.state.sources.items():
        before = previous.sources.get(name)
        sources[name] = after if before is None else _kept(after, before)
    model = Model.of(plan.state, decided.model).sharing(State(sources=sources))
    statuses = tuple(_kept_status(s, previous.sources.get(s.name), sources) for s in plan.sources)
    updated = model.site_updated
    sites = {s: replace(v, updated=updated.get(s)) for s, v in plan.sites.items()}
    kept = replace(plan, state=model.state, sources=statuses, sites=sites)
    return Planned(kept, model)


def _kept(after: SourceState, before: SourceState) -> SourceState:
    """``after`` (this event cycle's) with ``before``'s read times, guard counts and, unless
    this cycle held the answer back itself, its staleness and error."""
    held_now = after.stale  # the source guard held this cycle's answer (the re-read source)
    return replace(
        after,
        last_success=before.last_success,
        last_attempt=before.last_attempt,
        stale=held_now or before.stale,
        error=after.error if held_now else before.error,
        held_cycles=before.held_cycles,
        held_sites=before.held_sites,
    )


def _kept_status(
    status: SourceStatus, before: SourceState | None, sources: Mapping[str, SourceState]
) -> SourceStatus:
    """``status`` as of the source's last full read: not fresh with its reason while it is
    stale; the sites its guard holds still named."""
    if before is None or status.name not in sources:
        return status
    held = dict(status.held_sites)
    for site, cycle in before.held_sites.items():
        held.setdefault(
            site,
            f"site {site}: answer of source {status.name} held back at the last full read "
            f"(cycle {cycle})",
        )
    fresh = status.fresh and not before.stale
    reason = status.reason if status.reason is not None or fresh else before.error
    return replace(
        status,
        fresh=fresh,
        reason=reason,
        held_sites=held,
        last_success=sources[status.name].last_success,
    )
