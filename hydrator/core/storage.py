"""Storage that cannot serve: which storage elements count towards a site's presence. Pure.

A dataset "at a site" helps a job only if the site's storage can serve it now. A storage
element (a Rucio RSE, an SRCNet storage area) is **unavailable** when, and only when, someone
said so explicitly:

* its catalogue: Rucio's ``availability_read`` false or a deleted RSE, SRCNet's
  ``is_force_disabled`` on the storage area, its storage or its site (a :class:`Statement`'s
  ``disabled``);
* a downtime in effect now (SRCNet ``downtime`` periods; one that has not started is reported
  as ``upcoming``, not applied; one that ended is ignored);
* an operator drain (``hydrator drain``) not yet expired (:class:`Drain`).

The first that applies gives the reason, in that order. A source that cannot read its
catalogue this cycle states nothing new: it fails, and the daemon keeps its last good answer
(replicas and statuses alike), so an outage of the catalogue never empties a site.

An unavailable storage element contributes nothing to its site's presence: a source builds a
site's replica from its *available* storage elements only (:func:`present_at`), so a dataset
held only there leaves the site's lists while one also complete at another storage element of
the site stays. The site's ad says why (:func:`site_reasons`), the shrink guard does not hold
what such storage held back (:func:`explained_entries`: that part of the drop is explained,
not the rest of the site's), and a drained site advertises nothing (:func:`with_storage`).
A source whose every storage element stated at a site cannot serve counts for nothing there
(:func:`down_sources`; :func:`served_views` leaves its entries out); another
source's entries at that site, on storage nobody said is down (it states none there, or
some that serves), stay.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from functools import reduce

from hydrator.core.index import merge_replicas
from hydrator.core.presence import combine
from hydrator.core.views import UNAVAILABLE_TAG, content_digest, extended_digest, site_contents
from hydrator.domain import (
    DatasetId,
    ElementCount,
    Replica,
    Site,
    SiteView,
    State,
    StorageStatus,
)

MAX_REASON_CHARS = 200
"""A reason is cut to this many characters: it goes into every slot ad of its site."""
MAX_REASONS_CHARS = 1000
"""The site's whole ``DataLocalityUnavailable`` value is cut to this many characters."""
_UNSAFE = re.compile(r"[^\x20-\x7e]|[\"\\$]")
"""What could break a ClassAd string or a log line, or make the execute-node hook refuse the
answer: control and non-ASCII characters, quote, backslash, and ``$`` (HTCondor expands
``$(...)`` in config, so the hook refuses any value holding one)."""


def clean_text(text: str, limit: int = MAX_REASON_CHARS) -> str:
    """``text`` from a catalogue or an operator made safe for an ad: printable ASCII, no quote,
    backslash or ``$`` (each replaced by a space), runs of spaces folded, cut to ``limit``."""
    cleaned = " ".join(_UNSAFE.sub(" ", text).split())
    return cleaned if len(cleaned) <= limit else cleaned[: limit - 3] + "..."


def stamp(when: datetime) -> str:
    """A time in reasons: ``2026-11-26T14:00Z`` (minutes), converted to UTC first: a time
    given with another offset is never printed as its local time with a ``Z``."""
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%MZ")


@dataclass(frozen=True)
class Drain:
    """An operator's drain of a site (``storage`` None) or of one storage element of it, with
    why, since when and until when (None: until undrained). UTC times."""

    site: Site
    storage: str | None
    reason: str
    since: datetime
    until: datetime | None = None

    def active(self, now: datetime) -> bool:
        """In effect at ``now``: not expired."""
        return self.until is None or now < self.until

    @property
    def text(self) -> str:
        """``drained by the operator until T: reason`` (one line, safe for an ad)."""
        until = f" until {stamp(self.until)}" if self.until else ""
        return clean_text(f"drained by the operator{until}: {self.reason}")


@dataclass(frozen=True)
class Downtime:
    """A downtime period ``[start, end)`` (UTC) with its type (SRCNet: Planned, Unplanned)
    and reason, and what it was declared on (e.g. ``site SKAOSRC``; empty: the element
    itself)."""

    start: datetime
    end: datetime
    kind: str = ""
    reason: str = ""
    on: str = ""

    def text(self, upcoming: bool = False) -> str:
        """One line: ``downtime (Planned) of site X until T: reason``."""
        kind = f" ({self.kind})" if self.kind else ""
        on = f" of {self.on}" if self.on else ""
        when = (
            f"from {stamp(self.start)} to {stamp(self.end)}"
            if upcoming
            else f"until {stamp(self.end)}"
        )
        reason = f": {self.reason}" if self.reason else ""
        return clean_text(f"downtime{kind}{on} {when}{reason}")


@dataclass(frozen=True)
class Statement:
    """What a catalogue says about one storage element of a site: ``disabled`` is an explicit
    statement that it cannot serve (one line, e.g. ``availability_read false``), ``downtimes``
    the periods it (or an element above it) is down."""

    site: Site
    storage: str
    kind: str = "storage"
    disabled: str | None = None
    downtimes: tuple[Downtime, ...] = ()


MAX_DRAIN = timedelta(days=366)
"""How far ahead ``hydrator drain --until`` may end a drain: a longer one is an open drain,
ended by ``hydrator undrain``."""
MAX_LISTED = 10
"""Names a refusal lists at most (the known sites, the storage stated at a site)."""


def drain_refusal(
    site: Site,
    storage: str | None,
    sites: AbstractSet[str],
    stated: AbstractSet[tuple[str, str]],
) -> str | None:
    """Why a drain of ``site`` (``storage`` None) or of its storage element ``storage`` could
    not do what it says, in one line; None when it can. ``sites`` are the sites known (some
    source reported them, or ``[sites]`` names them); ``stated`` the (site, storage element)
    pairs some source states (or will state: a ``[sites]`` element a source maps). A drain of
    anything else would be saved and never apply."""
    if site not in sites:
        known = ", ".join(sorted(sites)[:MAX_LISTED]) or "none yet"
        return (
            f"unknown site {site}: no source has reported it and [sites] does not name it "
            f"(known: {known}); check the name, or run `hydrator once` first"
        )
    if storage is None or (site, storage) in stated:
        return None
    there = sorted(name for at, name in stated if at == site)
    listed = ", ".join(there[:MAX_LISTED]) or "none: no source states storage at this site"
    return (
        f"no source states a storage element {storage} at site {site}, so its drain would "
        f"never apply (stated there: {listed})"
    )


def judge(
    statement: Statement,
    drains: Iterable[Drain],
    now: datetime,
    wanted: int = 0,
) -> StorageStatus:
    """The status of ``statement``'s storage element at ``now``: unavailable by the
    catalogue's statement, else by a downtime in effect (the one ending last), else by an
    active drain of this storage element (``drains``: any; those of other elements are
    ignored); available otherwise. The next downtime not started yet is reported as
    ``upcoming``. ``wanted`` is kept only when unavailable."""
    current = [d for d in statement.downtimes if d.start <= now < d.end]
    future = sorted((d for d in statement.downtimes if d.start > now), key=lambda d: d.start)
    upcoming = future[0].text(upcoming=True) if future else None
    base = StorageStatus(statement.site, statement.storage, statement.kind, upcoming=upcoming)
    if statement.disabled is not None:
        return replace(base, available=False, reason=clean_text(statement.disabled), wanted=wanted)
    if current:
        last = max(current, key=lambda d: d.end)
        return replace(base, available=False, reason=last.text(), until=last.end, wanted=wanted)
    drain = next((d for d in drains if _drains(d, statement) and d.active(now)), None)
    if drain is not None:
        return replace(base, available=False, reason=drain.text, until=drain.until, wanted=wanted)
    return base


def _drains(drain: Drain, statement: Statement) -> bool:
    return drain.storage == statement.storage and drain.site == statement.site


def unavailable_storages(statuses: Iterable[StorageStatus]) -> frozenset[str]:
    """Names of the storage elements that cannot serve."""
    return frozenset(s.storage for s in statuses if not s.available)


def present_at(
    holdings: Iterable[tuple[str, Replica]], unavailable: AbstractSet[str]
) -> Replica | None:
    """A site's replica of one dataset from its storage elements' ``(storage, replica)``
    reports, leaving out those of ``unavailable`` storage elements; None when no available one
    holds it. Several reports combine as sources do (:func:`~hydrator.core.presence.combine`)."""
    kept = [replica for storage, replica in holdings if storage not in unavailable]
    return reduce(combine, kept) if kept else None


def explained_entries(
    before: Iterable[StorageStatus],
    counts: Mapping[str, ElementCount],
    now: Iterable[StorageStatus],
) -> dict[Site, int | None]:
    """Site -> how many of a source's previous entries there the storage elements stated
    unavailable ``now`` (and available ``before``) explain leaving: the entries each reported
    in the previous answer (``counts``: :attr:`~hydrator.domain.SourceState.elements`; 0 for
    one it did not report). None where that is not known (a source that reports no
    per-element counts). An element unavailable before already held nothing of the previous
    answer, so it explains nothing; a site with none newly unavailable is not listed."""
    was_down = unavailable_storages(before)
    explained: dict[Site, int | None] = {}
    for status in now:
        if status.available or status.storage in was_down:
            continue
        site, count = status.site, counts.get(status.storage)
        prior = explained.get(site, 0)
        if not counts or prior is None:
            explained[site] = None
        else:
            explained[site] = prior + (count.entries if count is not None else 0)
    return explained


def count_outside(replicas: Collection[Replica], sites: AbstractSet[Site]) -> int:
    """How many of ``replicas`` are at none of ``sites`` (``len`` when ``sites`` is empty)."""
    if not sites:
        return len(replicas)
    return sum(1 for r in replicas if r.site not in sites)


def active_site_drains(drains: Iterable[Drain], now: datetime) -> dict[Site, Drain]:
    """Site -> its drain in effect at ``now`` (whole-site drains only)."""
    return {d.site: d for d in drains if d.storage is None and d.active(now)}


def site_reasons(statuses: Iterable[StorageStatus], site_drain: Drain | None) -> tuple[str, ...]:
    """Why a site's storage cannot serve, one line each: ``site X: drained ...`` first, then
    ``RSE X_DISK: availability_read false`` per unavailable storage element, by name."""
    reasons = [f"site {site_drain.site}: {site_drain.text}"] if site_drain else []
    ordered = sorted((s for s in statuses if not s.available), key=lambda s: s.storage)
    reasons += [f"{s.label}: {s.reason or 'unavailable'}" for s in ordered]
    return tuple(reasons)


def down_sources(state: State) -> dict[Site, frozenset[str]]:
    """Site -> the sources covering it whose every storage element stated there cannot serve
    (a source that states none there is not among them)."""
    stated: dict[tuple[Site, str], bool] = {}  # (site, source) -> one of them serves
    for name, source in state.sources.items():
        for status in source.storages:
            key = (status.site, name)
            stated[key] = stated.get(key, False) or status.available
    down: dict[Site, set[str]] = {}
    for (site, name), serves in stated.items():
        if not serves:
            down.setdefault(site, set()).add(name)
    return {site: frozenset(names) for site, names in down.items()}


def served_views(
    views: Mapping[Site, SiteView],
    state: State,
    covering: Mapping[Site, AbstractSet[str]],
    held_at: Callable[[str, Site], Mapping[DatasetId, Replica]],
    *,
    drains: Iterable[Drain],
    now: datetime,
) -> dict[Site, SiteView]:
    """The views as the sites' ads say them: ``views`` (every covered site's lists, stamped)
    with every source's storage statuses and the ``drains`` active at ``now`` applied
    (:func:`with_storage`), and at each site the entries of the sources whose every storage
    element stated there cannot serve left out (:func:`down_sources`; a full read has left
    them out already, a refresh cycle, which re-reads statuses but no dataset, needs this to
    take them out within one cycle). Another source's entries there stay: nobody said the
    storage holding them is down. ``covering``: site -> the sources covering it;
    ``held_at(source, site)``: what that source holds there, asked only at a site where some
    source is down."""
    sources = state.sources
    statuses = [s for name in sorted(sources) for s in sources[name].storages]
    served = dict(views)
    emptied: set[Site] = set()
    for site, down in down_sources(state).items():
        here = covering.get(site, frozenset())
        others = [n for n in here - down if held_at(n, site)]
        if not others:  # every source there is down: nothing asked of a one-source daemon
            emptied.add(site)
        elif any(held_at(n, site) for n in here & down):
            reports = (r for n in sorted(others) for r in held_at(n, site).values())
            (kept,) = site_contents(merge_replicas(reports), frozenset({site})).values()
            served[site] = replace(kept, updated=served[site].updated)
    return with_storage(served, statuses, drains, now, frozenset(emptied))


def with_storage(
    views: Mapping[Site, SiteView],
    statuses: Iterable[StorageStatus],
    drains: Iterable[Drain],
    now: datetime,
    emptied: AbstractSet[Site] = frozenset(),
) -> dict[Site, SiteView]:
    """``views`` with each site's storage elements and the reasons some cannot serve; a site
    drained as a whole, or one of ``emptied``, lists no dataset (every list empty, its digest
    that of empty lists). A site with nothing to add is the very same view object."""
    by_site: dict[Site, list[StorageStatus]] = {}
    for status in statuses:
        by_site.setdefault(status.site, []).append(status)
    drained = active_site_drains(drains, now)
    out: dict[Site, SiteView] = {}
    for site, view in views.items():
        held = tuple(sorted(by_site.get(site, ()), key=lambda s: s.storage))
        drain = drained.get(site)
        if not held and drain is None:
            out[site] = view
            continue
        stated = replace(view, storages=held, unavailable=site_reasons(held, drain))
        out[site] = _emptied(stated) if drain is not None or site in emptied else stated
    return out


def _emptied(view: SiteView) -> SiteView:
    nothing: tuple[DatasetId, ...] = ()
    return replace(
        view,
        available=nothing,
        partial=(),
        replicating=(),
        stuck=nothing,
        partial_bytes=(),
        incoming=(),
        digest=content_digest(view.site, nothing, (), ()),
    )


def unavailable_text(reasons: Iterable[str]) -> str:
    """The ``DataLocalityUnavailable`` value: the reasons joined by ``; `` ("" for none), cut to
    :data:`MAX_REASONS_CHARS`."""
    return clean_text("; ".join(reasons), MAX_REASONS_CHARS)


def unavailable_digest(digest: str, reasons: tuple[str, ...]) -> str:
    """``digest`` extended with the reasons a site's storage cannot serve, so that a change of
    them reaches the ads (``digest`` itself when there are none: ads of sites whose storage is
    all available keep their digest)."""
    if not reasons:
        return digest
    return extended_digest(digest, UNAVAILABLE_TAG, reasons)
