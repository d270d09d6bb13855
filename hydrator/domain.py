"""Domain types shared by every layer: immutable, validated at construction.

A *dataset* is a Rucio DID ``scope:name`` (DMAPI calls the scope a namespace). A *site* is the
name HTCondor knows a resource by (``GLIDEIN_Site``). A *replica* says how much of a dataset a
site holds (presence) and whether a transfer towards the site is active or stuck (transfer):
two independent facts, of which presence decides the advertised list. Sources produce
:class:`Snapshot` objects; the core (:mod:`hydrator.core.plan`) turns the saved :class:`State` plus
this cycle's snapshots into a plan. Values only: every dataclass here is frozen with slots (no
instance ``__dict__``) and holds no cache; what the core derives from a state (indexes, site
views) it holds beside it (:mod:`hydrator.core.model`). The values a cycle handles by the
million (:class:`DatasetId`, :class:`Replica`, :class:`Change`) are named tuples instead,
validated in ``__new__``: as immutable, and hashed and compared by C code rather than by
generated Python methods. Names are checked by the rules of :mod:`hydrator.names`.
"""

from __future__ import annotations

import enum
import sys
from collections.abc import Callable, Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from datetime import datetime
from operator import attrgetter
from typing import NamedTuple, NewType

from hydrator.names import (
    NAME_PATTERN,
    SCOPE_PATTERN,
    SITE_PATTERN,
    STORAGE_PATTERN,
    InvalidNameError,
    shown,
)

Site = NewType("Site", str)


def check_site(name: str) -> Site:
    """Return ``name`` as a :data:`Site`, or raise :class:`InvalidNameError`."""
    if not isinstance(name, str) or not SITE_PATTERN.fullmatch(name):
        raise InvalidNameError(f"invalid site name {shown(name)}")
    return Site(name)


class _DatasetIdFields(NamedTuple):
    scope: str
    name: str


class DatasetId(_DatasetIdFields):
    """A dataset identifier; ``str(d)`` is the ``scope:name`` form published in ClassAds.

    A validated tuple ``(scope, name)``: immutable, ordered by scope then name, and hashed and
    compared by C code (a million of them are hashed and compared every cycle).
    """

    __slots__ = ()

    def __new__(cls, scope: str, name: str) -> DatasetId:
        if not isinstance(scope, str) or not SCOPE_PATTERN.fullmatch(scope):
            raise InvalidNameError(f"invalid dataset scope {shown(scope)} (name {shown(name)})")
        if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
            raise InvalidNameError(f"invalid dataset name {shown(scope)}:{shown(name)}")
        # A catalogue has a few scopes and a million rows: one string per scope, not per row
        # (a parsed answer gives every row its own copy; the bytes saved: docs/performance.md).
        return tuple.__new__(cls, (sys.intern(scope), name))

    def __str__(self) -> str:
        return f"{self[0]}:{self[1]}"

    @classmethod
    def parse(cls, text: str) -> DatasetId:
        """Parse ``scope:name``; raise :class:`InvalidNameError` if it is not a valid DID."""
        if not isinstance(text, str) or ":" not in text:
            raise InvalidNameError(f"invalid dataset id {shown(text)} (expected scope:name)")
        scope, _, name = text.partition(":")
        return cls(scope, name)


class ReplicaState(enum.Enum):
    """Which list a (site, dataset) goes into: presence first, then the transfer.

    Presence (how much of the dataset is at the site) decides whenever files are there; only
    a dataset absent from the site is classed by its transfer. Best first (the ranking that
    orders and budgets entries: :data:`hydrator.core.ranking.STATE_RANK`).
    """

    AVAILABLE = "available"  # every file is at the site, whatever any rule says
    PARTIAL = "partial"  # some files are at the site (``fraction`` < 1), whatever any rule says
    REPLICATING = "replicating"  # no file at the site yet; an active transfer towards it
    STUCK = "stuck"  # no file at the site; the transfer towards it is stuck (never advertised)

    # Members are singletons compared by identity; Enum's own __hash__ (of the name) is a
    # Python call, paid for every replica a set or dict hashes (docs/performance.md).
    __hash__ = object.__hash__

    def __init__(self, text: str) -> None:
        self.text = text
        """The value as a plain attribute, which ``attrgetter`` reads without a Python call
        (``value`` is a property): the state store writes it for every row."""


class Transfer(enum.Enum):
    """The transfer towards a site, independent of what is already there (which one is more
    urgent: :data:`hydrator.core.ranking.TRANSFER_RANK`)."""

    NONE = "none"  # nothing is being moved there (or the source cannot tell: DMAPI)
    REPLICATING = "replicating"  # an active rule/transfer towards the site
    STUCK = "stuck"  # a rule towards the site is stuck (a stuck rule wins over an active one)

    __hash__ = object.__hash__  # by identity, in C (see ReplicaState)

    def __init__(self, text: str) -> None:
        self.text = text
        """The value as a plain attribute (see :attr:`ReplicaState.text`)."""


class Detail(NamedTuple):
    """What a plain record leaves out: the transfer towards the site with its progress (0..1:
    the rule's files done), and the share of bytes present (0..1)."""

    transfer: Transfer
    progress: float
    bytes_fraction: float


class _ReplicaFields(NamedTuple):
    dataset: DatasetId
    site: Site
    state: ReplicaState
    fraction: float = 1.0
    detail: Detail | None = None


class Replica(_ReplicaFields):
    """One site's holding of one dataset, as one source reports it: two facts in one record.

    Presence: ``state`` AVAILABLE (complete), PARTIAL (``fraction`` of the files and
    :attr:`bytes_fraction` of the bytes present, 0..1) or absent (REPLICATING or STUCK,
    shares 0). Transfer: :attr:`transfer` with :attr:`progress`. ``state`` is the list the
    pair is advertised in, derived from both; an absent dataset with no transfer is no replica.

    Most records (complete or partial, nothing moving, bytes share = files share) carry no
    :class:`Detail` (``detail`` None), so a million of them cost one slot more than a record of
    presence alone, and hash as fast. Build anything else with
    :func:`hydrator.core.presence.holding`, which keeps one form per meaning (equal facts,
    equal records).

    A validated tuple ``(dataset, site, state, fraction, detail)``: immutable, and hashed and
    compared by C code (snapshots of a million replicas are hashed and diffed every cycle).
    """

    __slots__ = ()

    def __new__(
        cls,
        dataset: DatasetId,
        site: Site,
        state: ReplicaState,
        fraction: float = 1.0,
        detail: Detail | None = None,
    ) -> Replica:
        if not 0.0 <= fraction <= 1.0:
            raise ValueError(f"replica fraction {fraction!r} outside 0..1 for {dataset}")
        absent = state is ReplicaState.REPLICATING or state is ReplicaState.STUCK
        if detail is None:
            if absent:
                raise ValueError(f"replica of {dataset} at {site}: {state.value} needs a transfer")
        elif not (0.0 <= detail.progress <= 1.0 and 0.0 <= detail.bytes_fraction <= 1.0):
            raise ValueError(f"replica of {dataset} at {site}: {detail} outside 0..1")
        elif absent and detail.transfer.value != state.value:
            raise ValueError(
                f"replica of {dataset} at {site}: state {state.value} "
                f"needs a {state.value} transfer, not {detail.transfer.value}"
            )
        return tuple.__new__(cls, (dataset, site, state, fraction, detail))

    @property
    def present(self) -> bool:
        """True when some or all files are at the site (AVAILABLE or PARTIAL)."""
        return self.state is ReplicaState.AVAILABLE or self.state is ReplicaState.PARTIAL

    @property
    def transfer(self) -> Transfer:
        return Transfer.NONE if self.detail is None else self.detail.transfer

    @property
    def progress(self) -> float:
        """The transfer's share of files done, 0..1 (0 without a transfer)."""
        return 0.0 if self.detail is None else self.detail.progress

    @property
    def bytes_fraction(self) -> float:
        """Share of the dataset's bytes present, 0..1."""
        return self.fraction if self.detail is None else self.detail.bytes_fraction


site_of: Callable[[Replica], Site] = attrgetter("site")
"""A replica's site, as a C-level getter for ``map`` over many replicas."""


class ElementCount(NamedTuple):
    """A storage element's site and the (site, dataset) entries it reported in one answer."""

    site: Site
    entries: int


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What one source answered in one cycle.

    ``replicas`` holds at most one replica per (site, dataset) (build with :meth:`of`, or
    :func:`hydrator.core.index.merged_snapshot` to merge several reports of a pair).
    ``sites`` are the sites the source covers, including those where it found nothing, so an
    emptied site keeps an (empty) ad instead of vanishing. ``invalid`` counts records skipped
    because they were malformed or named an unknown storage element or an invalid dataset.
    """

    source: str
    replicas: AbstractSet[Replica]  # a frozenset, or a set nobody changes any more (see of())
    sites: frozenset[Site]
    invalid: int = 0
    unmapped: frozenset[str] = frozenset()  # storage elements with no site
    unmapped_more: int = 0  # storage elements with no site beyond those in ``unmapped``
    elements: Mapping[str, ElementCount] = field(default_factory=dict)
    """Where the source knows them: per storage element (RSE, storage area, inventory table)
    its site and how many (site, dataset) entries it reported, for the site guard (an element
    missing from an answer holds its site back). Empty: not known. Set it with
    ``dataclasses.replace(Snapshot.of(...), elements=...)``."""
    storages: tuple[StorageStatus, ...] = ()  # what the source states of its storage elements

    @classmethod
    def of(
        cls,
        source: str,
        replicas: Iterable[Replica],
        sites: Iterable[Site] = (),
        invalid: int = 0,
        unmapped: Iterable[str] = (),
        *,
        sites_named: bool = False,
        unmapped_more: int = 0,
        storages: Iterable[StorageStatus] = (),
    ) -> Snapshot:
        """The snapshot of ``replicas``, which hold at most one replica per (site, dataset):
        the caller vouches for it (a source that keeps its answer keyed by pair; reports to
        merge first go through :func:`hydrator.core.index.merged_snapshot`).

        A ``frozenset``, or a ``set`` that the caller hands over and never changes again, is
        used as it is, so a source that hands back last cycle's objects where nothing changed
        costs no hashing here and lets the core compare snapshots by identity (a ``set`` saves
        the copy that freezing it costs: a source building its next answer from its last
        copies that one anyway).

        ``sites_named``: the caller vouches that ``sites`` names the site of every replica (a
        source that makes replicas only at the sites it maps), so no pass over the replicas
        collects their sites (docs/performance.md).

        ``unmapped_more``: storage elements with no site that a source counted but did not
        list in ``unmapped`` (a bounded list).

        ``storages``: the source's storage elements with their availability
        (:class:`StorageStatus`); the replicas leave out what unavailable ones hold.
        """
        stated = tuple(sorted(storages, key=attrgetter("site", "storage")))
        kept = replicas if isinstance(replicas, frozenset | set) else frozenset(replicas)
        covered = frozenset(sites)
        if not sites_named:
            covered = covered.union(map(site_of, kept))  # C-level loop
        return cls(
            source, kept, covered, invalid, frozenset(unmapped), unmapped_more, storages=stated
        )


@dataclass(frozen=True, slots=True)
class SourceFailure:
    """A source that gave no usable answer this cycle. ``permanent`` mirrors the error class."""

    source: str
    error: str
    permanent: bool = False


SourceOutcome = Snapshot | SourceFailure


@dataclass(frozen=True, slots=True)
class SourceState:
    """What the state remembers of a source between cycles.

    ``replicas``/``sites`` are the last *good* snapshot. ``stale`` is true while the source
    failed or was held back since then. ``held_cycles`` counts consecutive cycles whose answer
    was held back as a suspicious drop. What the core derives from it (its index, its counts
    per site) is held beside it, in :class:`hydrator.core.model.Model`.
    """

    name: str
    replicas: AbstractSet[Replica] = frozenset()  # as Snapshot.replicas: never changed
    sites: frozenset[Site] = frozenset()
    last_success: datetime | None = None
    last_attempt: datetime | None = None
    stale: bool = False
    error: str | None = None
    held_cycles: int = 0
    held_sites: Mapping[Site, int] = field(default_factory=dict)
    """Site -> consecutive cycles its shrunken answer was held back (the site guard); kept
    in memory only: after a restart a held site is counted from 1 again."""
    elements: Mapping[str, ElementCount] = field(default_factory=dict)
    """The last good answer's :attr:`Snapshot.elements` (a held site's from before); kept in
    memory only."""
    storages: tuple[StorageStatus, ...] = ()  # as Snapshot.storages, of the last good answer


@dataclass(frozen=True, slots=True)
class State:
    """Everything persisted between cycles that a cycle reads: each source's last good
    answer and how it fared.

    Not in it: each (site, dataset)'s first-seen time, which nothing in a cycle reads; the
    state store keeps it with the pair's rows, from the ``now`` of the plan that added the
    pair (:mod:`hydrator.adapters.state.sqlite`). What the core derives from it (merged
    index, site views) is held beside it: :class:`hydrator.core.model.Model`.
    """

    sources: Mapping[str, SourceState] = field(default_factory=dict)


class ChangeKind(enum.Enum):
    ADDED = "added"
    REMOVED = "removed"
    CHANGED = "changed"  # state, a fraction, or the transfer changed


class Change(NamedTuple):
    """One (site, dataset) whose merged view changed this cycle.

    A tuple (a first cycle makes one per replica): ordered by site, then dataset, as the
    core lists them (a plan holds one change per pair, so the other fields never decide).
    """

    site: Site
    dataset: DatasetId
    kind: ChangeKind
    old: Replica | None = None
    new: Replica | None = None


@dataclass(frozen=True, slots=True)
class SiteView:
    """One site as published: the lists of a site ClassAd, sorted by dataset, plus when and
    what. Presence first: ``available`` (complete), ``partial`` (some files; share of files)
    and ``replicating`` (no file yet, an active transfer; its progress) are disjoint and are
    what the ClassAd lists. The transfers are reported beside them: ``stuck`` lists every
    stuck transfer, whatever is present; ``incoming`` the active transfers towards datasets
    already (partly) present, with progress (the others are ``replicating``).
    ``partial_bytes`` holds the share of bytes present of the ``partial`` datasets where it
    differs from the share of files (memory: most are equal or unknown).
    ``digest`` covers the three advertised lists only.
    """

    site: Site
    available: tuple[DatasetId, ...]
    partial: tuple[tuple[DatasetId, float], ...]
    replicating: tuple[tuple[DatasetId, float], ...]
    stuck: tuple[DatasetId, ...]
    updated: datetime | None
    digest: str
    partial_bytes: tuple[tuple[DatasetId, float], ...] = ()
    incoming: tuple[tuple[DatasetId, float], ...] = ()
    storages: tuple[StorageStatus, ...] = ()  # the site's storage elements, as stated
    unavailable: tuple[str, ...] = ()  # why some of its storage cannot serve, one line each
    near: tuple[Site, ...] | None = None  # the sites it reads from cheaply; None: not known


@dataclass(frozen=True, slots=True)
class StorageStatus:
    """One storage element of a site (a Rucio RSE, an SRCNet storage area) and whether it can
    serve its replicas now, as its catalogue or the operator stated it.

    ``kind`` names what it is in messages ("RSE", "storage area"). An unavailable one
    (``available`` false) contributes nothing to its site's presence; ``reason`` says why in
    one line (what the catalogue said, the downtime, the drain), ``until`` when that ends if
    known (UTC). ``upcoming`` reports a future downtime, not applied. ``wanted``: while it is
    unavailable, the datasets it holds that queued jobs declare (0 when available or unknown).
    Only an explicit statement makes a storage element unavailable: a source that cannot read
    its catalogue keeps its last good statuses with its last good replicas.
    """

    site: Site
    storage: str
    kind: str = "storage"
    available: bool = True
    reason: str | None = None
    until: datetime | None = None
    upcoming: str | None = None
    wanted: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.storage, str) or not STORAGE_PATTERN.fullmatch(self.storage):
            raise InvalidNameError(f"invalid storage element name {shown(self.storage)}")

    @property
    def label(self) -> str:
        """``RSE X_DISK``: how messages and ads name it."""
        return f"{self.kind} {self.storage}"
