"""Presence and transfer of one dataset at one site, decided from a catalogue's counts and
rules: pure functions, no I/O (the Rucio source feeds them; ``tests/unit/core/test_presence.py``
holds their table).

Two facts per (site, dataset), each from its own listing:

* **Presence** (complete / partial with shares of files and bytes / absent), from the replica
  counts: a summary row saying ``AVAILABLE`` with ``available_length >= length > 0`` at any RSE
  of the site -> complete (:func:`says_complete`), whatever any rule does; a dataset that one
  rule places at RSEs of this site only, with no row at the site's other RSEs -> the rule's OK
  locks, which count exactly the files available there (:func:`settled`; the bytes share is
  taken to be the files share); anything else needs an exact count (:data:`Wait.PENDING`), or,
  without one, the best partial row or the locks' share, whichever shows more
  (:func:`fallback`).
* **Transfer** (none / replicating with progress / stuck), from the rules whose RSEs include
  one of the site's: any STUCK lock -> stuck, else any REPLICATING lock -> replicating, with
  progress = OK locks / all locks (:func:`rule_transfer`, :func:`lock_progress`); several
  rules towards one site: the more urgent transfer wins (stuck over replicating, then
  progress: :func:`merge_transfers`, by :data:`~hydrator.core.ranking.TRANSFER_RANK`).

Presence decides the list a pair is advertised in (:func:`holding`: which list, and so which
attribute, a pair goes into): files present are advertised whatever the rules do; a stuck rule
is reported beside them. Several reports of one pair (from several sources, or twice in one
answer) are one by :func:`combine`: presence from the one that holds more, the transfer from
the more urgent one.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from hydrator.core.ranking import STATE_RANK, TRANSFER_RANK
from hydrator.domain import DatasetId, Detail, Replica, ReplicaState, Site, Transfer

# -- presence from counts ------------------------------------------------------------------


def files_share(available: int, length: int) -> float:
    """The share of ``length`` files that ``available`` are (0 without files)."""
    return available / length if length > 0 else 0.0


def bytes_share(available: int, length: int, present: int, size: int) -> float:
    """The share of ``size`` bytes that ``present`` are; without bytes, the files share."""
    return present / size if size > 0 else files_share(available, length)


def says_complete(state: str, length: int, available: int) -> bool:
    """True when a summary row (Rucio's ``collection_replicas``: ``state``, ``length`` files,
    ``available`` of them present) says the dataset is complete at its RSE: AVAILABLE with
    every file present and at least one file. A row saying less is partial (or empty)."""
    return state == "AVAILABLE" and available >= length > 0


@dataclass(frozen=True, slots=True)
class Counts:
    """Files and bytes of a dataset, and how many of them are present (at an RSE or site)."""

    length: int
    available: int
    bytes: int
    available_bytes: int

    @property
    def files_share(self) -> float:
        return files_share(self.available, self.length)

    @property
    def bytes_share(self) -> float:
        return bytes_share(self.available, self.length, self.available_bytes, self.bytes)

    def holds_more_than(self, other: Counts) -> bool:
        """True when these counts show more present than ``other``: more files, then more
        bytes (of two RSEs of one site, the one a site is judged by without a file union)."""
        return (self.available, self.available_bytes) > (other.available, other.available_bytes)


NOTHING = Counts(0, 0, 0, 0)


class PartialRow(Protocol):
    """A row that does not say complete, as :func:`fallback` reads it."""

    @property
    def available(self) -> int: ...  # files present

    @property
    def files_share(self) -> float: ...

    @property
    def bytes_share(self) -> float: ...


# -- transfer from rules -------------------------------------------------------------------


def rule_transfer(ok: int, replicating: int, stuck: int, *, listed_stuck: bool) -> Transfer:
    """A rule's transfer from its lock counts, which the rule engine keeps current (its
    listed state waits for the judge): any stuck lock -> STUCK, else any replicating lock ->
    REPLICATING, else every lock OK -> NONE (done). Without locks, its listed state decides
    (``listed_stuck``: the rule is listed STUCK, else REPLICATING)."""
    if stuck > 0:
        return Transfer.STUCK
    if replicating > 0:
        return Transfer.REPLICATING
    if ok > 0:
        return Transfer.NONE
    return Transfer.STUCK if listed_stuck else Transfer.REPLICATING


def lock_progress(ok: int, replicating: int, stuck: int) -> float:
    """A rule's progress, 0..1: its OK locks over all its locks (0 without locks)."""
    total = ok + replicating + stuck
    return min(1.0, max(0.0, ok / total)) if total > 0 else 0.0


@dataclass(frozen=True, slots=True)
class SiteTransfer:
    """The rules' transfer towards one site (``site``) for one dataset.

    ``floor`` is the share of files the rules' OK locks prove present at the site (a lock is
    OK when its file replica is AVAILABLE), counted only for rules whose RSEs all belong to
    this site. ``only`` names that rule's RSEs when it is the one rule towards the site: then
    its locks count exactly the files present at them.
    """

    site: Site
    transfer: Transfer
    progress: float
    floor: float = 0.0
    only: frozenset[str] | None = None


RuleTransfers = tuple[SiteTransfer, ...]
"""A dataset's rules as the transfer towards each site they reach (at most one per site)."""


class RuleLike(Protocol):
    """An active or stuck rule on a dataset, as :func:`rule_transfers` reads it."""

    @property
    def expression(self) -> str: ...  # its RSE expression

    @property
    def transfer(self) -> Transfer: ...  # REPLICATING or STUCK

    @property
    def progress(self) -> float: ...  # OK locks / all locks


def merge_transfers(a: SiteTransfer, b: SiteTransfer) -> SiteTransfer:
    """Two rules towards one site as one: the more urgent transfer wins (stuck, which needs an
    operator, over replicating: :data:`TRANSFER_RANK`), then the higher progress; the larger
    floor counts. The merge of two rules is never "only" one rule. Order-free."""
    rank = TRANSFER_RANK
    a_first = (rank[a.transfer], a.progress) >= (rank[b.transfer], b.progress)
    first = a if a_first else b
    return SiteTransfer(first.site, first.transfer, first.progress, max(a.floor, b.floor))


def rule_transfers(
    rules: Iterable[RuleLike], resolved: Mapping[str, frozenset[str]], sites: Mapping[str, Site]
) -> RuleTransfers:
    """One dataset's rules as the transfer towards each site: for each rule, the sites of the
    mapped RSEs its expression covers (``resolved``: expression -> RSE names; ``sites``: RSE ->
    site); a rule whose RSEs are all at one site vouches for its OK locks there (``floor``,
    ``only``). Several rules towards one site: :func:`merge_transfers`."""
    transfers: dict[Site, SiteTransfer] = {}
    for rule in rules:
        rses = resolved[rule.expression]
        at = {sites[rse] for rse in rses}
        single = len(at) == 1  # the rule's locks are all at one site
        for site in at:
            new = SiteTransfer(
                site,
                rule.transfer,
                rule.progress,
                rule.progress if single else 0.0,
                rses if single else None,
            )
            old = transfers.get(site)
            transfers[site] = new if old is None else merge_transfers(old, new)
    return tuple(transfers.values())


def towards(transfers: RuleTransfers | None, site: Site) -> SiteTransfer | None:
    """The transfer towards ``site`` in a dataset's rule transfers, if any (a few sites: a scan;
    a tuple holds them in less memory than a small dict: docs/performance.md)."""
    if transfers:
        for moving in transfers:
            if moving.site == site:
                return moving
    return None


def vouched(transfers: RuleTransfers | None, sites: Iterable[Site]) -> bool:
    """True when some rule's OK locks prove files present at one of ``sites`` (a positive
    floor): such a pair has a lower bound without an exact count."""
    return transfers is not None and any(
        (moving := towards(transfers, site)) is not None and moving.floor > 0 for site in sites
    )


# -- the record of a pair, and several reports of it as one ---------------------------------


def holding(
    dataset: DatasetId,
    site: Site,
    files: float,
    bytes_: float,
    *,
    transfer: Transfer = Transfer.NONE,
    progress: float = 0.0,
) -> Replica | None:
    """The record for ``files``/``bytes_`` (shares present, 0..1; files 1.0 = complete) and a
    transfer, in its one canonical form; None when nothing is present and nothing moves."""
    files, bytes_ = min(1.0, max(0.0, files)), min(1.0, max(0.0, bytes_))
    progress = min(1.0, max(0.0, progress))
    if files >= 1.0:
        if transfer is Transfer.NONE:
            return Replica(dataset, site, ReplicaState.AVAILABLE)
        return Replica(dataset, site, ReplicaState.AVAILABLE, 1.0, Detail(transfer, progress, 1.0))
    if files > 0.0:
        if transfer is Transfer.NONE and bytes_ == files:
            return Replica(dataset, site, ReplicaState.PARTIAL, files)
        detail = Detail(transfer, progress if transfer is not Transfer.NONE else 0.0, bytes_)
        return Replica(dataset, site, ReplicaState.PARTIAL, files, detail)
    if transfer is Transfer.NONE:
        return None
    state = ReplicaState.STUCK if transfer is Transfer.STUCK else ReplicaState.REPLICATING
    return Replica(dataset, site, state, 0.0, Detail(transfer, progress, 0.0))


def combine(a: Replica, b: Replica) -> Replica:
    """Two reports of the same (site, dataset) as one; total and deterministic.

    Presence from the report that holds more (complete > partial by files, then bytes >
    absent); the transfer from the one with the more urgent transfer (stuck > replicating >
    none, then progress). One source's absent-and-stuck never hides another's files.
    """
    if a == b:
        return a
    pa = (STATE_RANK[a.state] if a.present else 0, a.fraction, a.bytes_fraction)
    pb = (STATE_RANK[b.state] if b.present else 0, b.fraction, b.bytes_fraction)
    present = a if pa >= pb else b
    ta = (TRANSFER_RANK[a.transfer], a.progress)
    tb = (TRANSFER_RANK[b.transfer], b.progress)
    moving = a if ta >= tb else b
    if present is moving or not present.present:  # both absent: the transfer decides
        return moving
    merged = holding(
        present.dataset,
        present.site,
        present.fraction,
        present.bytes_fraction,
        transfer=moving.transfer,
        progress=moving.progress,
    )
    assert merged is not None  # present: never None
    return merged


# -- the pair's replica --------------------------------------------------------------------


class Wait(enum.Enum):
    """The counts at hand cannot settle the pair: it needs an exact count (or the fallback)."""

    PENDING = "pending"


def replica(
    dataset: DatasetId, site: Site, files: float, bytes_: float, moving: SiteTransfer | None
) -> Replica | None:
    """The pair's record for shares ``files`` and ``bytes_`` present (0..1) and the rules'
    transfer towards the site (None: no rule), in :func:`holding`'s canonical form; None when
    nothing is present and nothing moves."""
    if moving is None:
        return holding(dataset, site, files, bytes_)
    return holding(dataset, site, files, bytes_, transfer=moving.transfer, progress=moving.progress)


def settled(
    dataset: DatasetId,
    site: Site,
    complete: bool,
    rses: Collection[str],
    moving: SiteTransfer | None,
) -> Replica | Wait | None:
    """A pair's replica from the summary rows at the site's RSEs, where they settle it.

    ``complete``: one of the rows says complete (:func:`says_complete`); ``rses``: the site's
    RSEs that have a row of the dataset; ``moving``: the rules' transfer towards the site.
    Complete -> complete (presence wins over any transfer). One rule whose RSEs hold every row
    of the site (``moving.only``) -> its OK locks' share (files and bytes). No row and no rule
    -> None. Otherwise :data:`Wait.PENDING`: rows per RSE are no union over a site's RSEs."""
    if complete:
        return replica(dataset, site, 1.0, 1.0, moving)
    if moving is not None and moving.only is not None and all(r in moving.only for r in rses):
        return replica(dataset, site, moving.floor, moving.floor, moving)
    if not rses and moving is None:
        return None
    return Wait.PENDING


def fallback(
    dataset: DatasetId, site: Site, partial: Iterable[PartialRow], moving: SiteTransfer | None
) -> Replica | None:
    """A pending pair without an exact count: the best ``partial`` row at the site's RSEs (the
    most files; a lower bound that lags), or the share of files the rules' OK locks prove
    present (``moving.floor``), whichever shows more (the locks count files, not bytes: their
    share stands in for both)."""
    best = max(partial, key=_available, default=None)
    files, bytes_ = (0.0, 0.0) if best is None else (best.files_share, best.bytes_share)
    if moving is not None and moving.floor > files:
        files = bytes_ = moving.floor
    return replica(dataset, site, files, bytes_, moving)


def exact(
    dataset: DatasetId, site: Site, counts: Counts, moving: SiteTransfer | None
) -> Replica | None:
    """A pair's replica from an exact count of the files present at the site (``NOTHING`` when
    none are) and the rules' transfer towards it."""
    return replica(dataset, site, counts.files_share, counts.bytes_share, moving)


def _available(row: PartialRow) -> int:
    return row.available
