"""Domain types shared by every layer: immutable, validated at construction.

A *dataset* is a Rucio DID ``scope:name`` (DMAPI calls the scope a namespace). A *site* is the
name HTCondor knows a resource by (``GLIDEIN_Site``). A *replica* says how much of a dataset a
site holds (presence) and whether a transfer towards the site is active or stuck (transfer):
two independent facts, of which presence decides the advertised list. Sources produce
:class:`Snapshot` objects; the core (:mod:`hydrator.core.plan`) turns the saved :class:`State` plus
this cycle's snapshots into a :class:`Plan`. Every dataclass here is frozen with slots (no
instance ``__dict__``); the only mutable parts are the explicit memos of derived views
(:class:`SourceMemo`, :class:`StateMemo`). The values a cycle handles by the million
(:class:`DatasetId`, :class:`Replica`, :class:`Change`) are named tuples instead, validated
in ``__new__``: as immutable, and hashed and compared by C code rather than by generated
Python methods (issue 15).

Names are checked against strict patterns so that nothing a catalogue returns can break a
ClassAd or a string list: quotes, backslashes, whitespace, commas and control characters are
rejected; ``/ # + @ =`` (used in real catalogues, e.g. CMS block names) are allowed.
"""

from __future__ import annotations

import enum
import hashlib
import re
import sys
from bisect import bisect_left
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, replace
from datetime import datetime
from functools import partial
from itertools import chain, repeat
from operator import attrgetter, itemgetter
from typing import NamedTuple, NewType, TypeVar, overload

# Rucio's generic schema allows scopes of [A-Za-z0-9_.-]; 30 characters is Rucio's column size.
SCOPE_PATTERN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,29}")
# Names: Rucio's generic DID character set plus what experiments' schemas add (/, #, +, @, =).
# No quote, backslash, whitespace, comma, colon or control character; 250 is Rucio's limit.
NAME_PATTERN = re.compile(r"[A-Za-z0-9/_][A-Za-z0-9/_.\-+#@=]{0,249}")
# GLIDEIN_Site values seen in production: SRCNET_CH, T2_US_Nebraska, UKI-NORTHGRID-MAN-HEP.
SITE_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,99}")

Site = NewType("Site", str)


class InvalidNameError(ValueError):
    """A dataset or site name outside the allowed character set (the message quotes it safely)."""


def check_site(name: str) -> Site:
    """Return ``name`` as a :data:`Site`, or raise :class:`InvalidNameError`."""
    if not isinstance(name, str) or not SITE_PATTERN.fullmatch(name):
        raise InvalidNameError(f"invalid site name {name!r}")
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
            raise InvalidNameError(f"invalid dataset scope {scope!r} (name {name!r})")
        if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
            raise InvalidNameError(f"invalid dataset name {scope!r}:{name!r}")
        # A catalogue has a few scopes and a million rows: one string per scope, not per row
        # (a parsed answer gives every row its own copy).
        return tuple.__new__(cls, (sys.intern(scope), name))

    def __str__(self) -> str:
        return f"{self[0]}:{self[1]}"

    @classmethod
    def parse(cls, text: str) -> DatasetId:
        """Parse ``scope:name``; raise :class:`InvalidNameError` if it is not a valid DID."""
        if not isinstance(text, str) or ":" not in text:
            raise InvalidNameError(f"invalid dataset id {text!r} (expected scope:name)")
        scope, _, name = text.partition(":")
        return cls(scope, name)


class ReplicaState(enum.Enum):
    """Which list a (site, dataset) goes into: presence first, then the transfer.

    Presence (how much of the dataset is at the site) decides whenever files are there; only
    a dataset absent from the site is classed by its transfer. Best first.
    """

    AVAILABLE = "available"  # every file is at the site, whatever any rule says
    PARTIAL = "partial"  # some files are at the site (``fraction`` < 1), whatever any rule says
    REPLICATING = "replicating"  # no file at the site yet; an active transfer towards it
    STUCK = "stuck"  # no file at the site; the transfer towards it is stuck (never advertised)

    # Members are singletons compared by identity; Enum's own __hash__ (of the name) is a
    # Python call, paid for every replica a set or dict hashes.
    __hash__ = object.__hash__

    @property
    def rank(self) -> int:
        """Higher is better; used to order and budget entries deterministically."""
        return _RANK[self]


_RANK = {
    ReplicaState.AVAILABLE: 3,
    ReplicaState.PARTIAL: 2,
    ReplicaState.REPLICATING: 1,
    ReplicaState.STUCK: 0,
}


class Transfer(enum.Enum):
    """The transfer towards a site, independent of what is already there."""

    NONE = "none"  # nothing is being moved there (or the source cannot tell: DMAPI)
    REPLICATING = "replicating"  # an active rule/transfer towards the site
    STUCK = "stuck"  # a rule towards the site is stuck (a stuck rule wins over an active one)

    __hash__ = object.__hash__  # by identity, in C (see ReplicaState)

    @property
    def rank(self) -> int:
        """Higher is more urgent: STUCK (needs an operator) > REPLICATING > NONE. The one
        ranking of transfers (:func:`combine`, :func:`hydrator.core.presence.merge_transfers`)."""
        return _TRANSFER_RANK[self]


_TRANSFER_RANK = {Transfer.NONE: 0, Transfer.REPLICATING: 1, Transfer.STUCK: 2}


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
    presence alone, and hash as fast. Build anything else with :func:`holding`, which keeps
    one form per meaning (equal facts, equal records).

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
    def key(self) -> tuple[Site, DatasetId]:
        return (self.site, self.dataset)

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


replica_key: Callable[[Replica], tuple[Site, DatasetId]] = attrgetter("site", "dataset")
_site_of: Callable[[Replica], Site] = attrgetter("site")
"""``replica_key(r) == r.key``, without a Python call: for loops over a million replicas."""


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
    pa = (_RANK[a.state] if a.present else 0, a.fraction, a.bytes_fraction)
    pb = (_RANK[b.state] if b.present else 0, b.fraction, b.bytes_fraction)
    present = a if pa >= pb else b
    ta = (_TRANSFER_RANK[a.transfer], a.progress)
    tb = (_TRANSFER_RANK[b.transfer], b.progress)
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


Index = dict[Site, dict[DatasetId, Replica]]
"""Site -> dataset -> replica: at most one replica per (site, dataset), and no site without
one (no empty inner dict), so two indexes of the same replicas are equal. Keyed per site
rather than by a ``(site, dataset)`` tuple: no key object per replica (the dataset is the
replica's own), smaller tables, a site's replicas at hand for its view (issue 15)."""


def index_of(replicas: Iterable[Replica]) -> Index:
    """The :data:`Index` of ``replicas``, which hold one replica per (site, dataset)."""
    index: Index = {}
    at_site = index.get
    for replica in replicas:  # indexing by position: no attribute lookup per replica
        found = at_site(replica[1])
        if found is None:
            found = index[replica[1]] = {}
        found[replica[0]] = replica
    return index


def index_size(index: Mapping[Site, Mapping[DatasetId, Replica]]) -> int:
    """How many replicas ``index`` holds."""
    return sum(map(len, index.values()))


def each_replica(index: Index) -> Iterator[Replica]:
    """Every replica of ``index``, site by site (a C-level chain: ``dict.values``)."""
    return chain.from_iterable(map(dict.values, index.values()))


def merge_replicas(replicas: Iterable[Replica]) -> Index:
    """Collapse reports to one per (site, dataset) with :func:`combine`."""
    index: Index = {}
    for r in replicas:
        found = index.get(r.site)
        if found is None:
            found = index[r.site] = {}
        old = found.get(r.dataset)
        found[r.dataset] = r if old is None else combine(old, r)
    return index


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What one source answered in one cycle.

    ``replicas`` holds at most one replica per (site, dataset) (build with :meth:`of`).
    ``sites`` are the sites the source covers, including those where it found nothing, so an
    emptied site keeps an (empty) ad instead of vanishing. ``invalid`` counts records skipped
    because they were malformed or named an unknown storage element or an invalid dataset.
    """

    source: str
    replicas: AbstractSet[Replica]  # a frozenset, or a set nobody changes any more (see of())
    sites: frozenset[Site]
    invalid: int = 0
    unmapped: frozenset[str] = frozenset()  # storage elements with no site

    @classmethod
    def of(
        cls,
        source: str,
        replicas: Iterable[Replica],
        sites: Iterable[Site] = (),
        invalid: int = 0,
        unmapped: Iterable[str] = (),
        *,
        unique: bool = False,
        sites_named: bool = False,
    ) -> Snapshot:
        """Merge ``replicas`` to one per (site, dataset) (:func:`merge_replicas`).

        ``unique``: the caller vouches that ``replicas`` already holds at most one replica per
        (site, dataset) (a source that keeps its answer keyed by pair); a ``frozenset``, or a
        ``set`` that the caller hands over and never changes again, is then used as it is, so
        a source that hands back last cycle's objects where nothing changed costs no hashing
        here and lets the core compare snapshots by identity (a ``set`` saves the copy that
        freezing it costs: a source building its next answer from its last copies that one
        anyway).

        ``sites_named`` (with ``unique``): the caller vouches that ``sites`` names the site of
        every replica (a source that makes replicas only at the sites it maps), so no pass
        over the replicas collects their sites (2 s a cycle at ten million).
        """
        if unique:
            kept = replicas if isinstance(replicas, frozenset | set) else frozenset(replicas)
            covered = frozenset(sites)
            if not sites_named:
                covered = covered.union(map(_site_of, kept))  # C-level loop
            return cls(source, kept, covered, invalid, frozenset(unmapped))
        merged = merge_replicas(replicas)
        kept = frozenset(each_replica(merged))
        covered = frozenset(sites).union(merged)
        return cls(source, kept, covered, invalid, frozenset(unmapped))


@dataclass(frozen=True, slots=True)
class SourceFailure:
    """A source that gave no usable answer this cycle. ``permanent`` mirrors the error class."""

    source: str
    error: str
    permanent: bool = False


SourceOutcome = Snapshot | SourceFailure


class SourceMemo:
    """The one mutable part of a :class:`SourceState`: its derived :attr:`SourceState.index`,
    built on first use or handed over by the core, set at most once and never changed after.
    Not compared, not printed, never persisted."""

    __slots__ = ("index",)

    def __init__(self) -> None:
        self.index: Index | None = None


@dataclass(frozen=True, slots=True)
class SourceState:
    """What the state remembers of a source between cycles.

    ``replicas``/``sites`` are the last *good* snapshot. ``stale`` is true while the source
    failed or was held back since then. ``held_cycles`` counts consecutive cycles whose answer
    was held back as a suspicious drop. Frozen; its derived index lives in ``memo``
    (:class:`SourceMemo`), the only mutable part, which :func:`dataclasses.replace` does not
    copy (a replaced value starts with an empty memo).
    """

    name: str
    replicas: AbstractSet[Replica] = frozenset()  # as Snapshot.replicas: never changed
    sites: frozenset[Site] = frozenset()
    last_success: datetime | None = None
    last_attempt: datetime | None = None
    stale: bool = False
    error: str | None = None
    held_cycles: int = 0
    memo: SourceMemo = field(
        default_factory=SourceMemo, init=False, compare=False, repr=False, hash=False
    )

    @property
    def index(self) -> Index:
        """Site -> dataset -> this source's replica (:data:`Index`, of :attr:`replicas`' own
        objects); derived, never persisted, built on first use: the core reads it only where
        several sources merge, and from then on hands it from cycle to cycle
        (:meth:`adopt_index`) so a cycle costs O(changes), not O(replicas). Never mutated once
        built."""
        index = self.memo.index
        if index is None:
            index = self.memo.index = index_of(self.replicas)
        return index

    @property
    def built_index(self) -> Index | None:
        """:attr:`index` if it was built, else None (never builds it)."""
        return self.memo.index

    def adopt_index(self, index: Index) -> SourceState:
        """Use ``index`` as :attr:`index` (returns ``self``); only for an index equal to what
        it would build, on a value whose index was not read yet."""
        self.memo.index = index
        return self

    def inherit_index(self, other: SourceState) -> SourceState:
        """Reuse ``other``'s index if it was built (returns ``self``); only for a value with
        the same replicas."""
        if other.memo.index is not None:
            self.memo.index = other.memo.index
        return self


class StateMemo:
    """The one mutable part of a :class:`State`: its derived views, each built on first use or
    handed over by the core, set at most once and never changed after. Not compared, not
    printed, never persisted."""

    __slots__ = ("contents", "coverage", "merged", "site_updated")

    def __init__(self) -> None:
        self.merged: Index | None = None
        self.coverage: dict[Site, frozenset[str]] | None = None
        self.contents: dict[Site, SiteView] | None = None
        self.site_updated: dict[Site, datetime] | None = None


@dataclass(frozen=True, slots=True)
class State:
    """Everything persisted between cycles that a cycle reads.

    Not in it: each (site, dataset)'s first-seen time, which nothing in a cycle reads; the
    state store keeps it with the pair's rows, from the :attr:`Plan.now` of the plan that
    added the pair (:mod:`hydrator.adapters.state.sqlite`). Frozen; the derived views
    (:attr:`merged`, :attr:`coverage`, :attr:`contents`, :attr:`site_updated`) live in
    ``memo`` (:class:`StateMemo`), the only mutable part, never persisted and not copied by
    :func:`dataclasses.replace`.
    """

    sources: Mapping[str, SourceState] = field(default_factory=dict)
    memo: StateMemo = field(
        default_factory=StateMemo, init=False, compare=False, repr=False, hash=False
    )

    @property
    def site_updated(self) -> dict[Site, datetime]:
        """Site -> its last successful refresh: the oldest last success of the sources that
        cover it, so everything the site's ad says was confirmed at or after this time."""
        if self.memo.site_updated is not None:
            return self.memo.site_updated
        updated: dict[Site, datetime] = {}
        for site, names in self.coverage.items():
            times = [self.sources[n].last_success for n in names]
            known = [when for when in times if when is not None]
            if known:
                updated[site] = min(known)
        self.memo.site_updated = updated
        return updated

    def stamped_views(self) -> dict[Site, SiteView]:
        """Per covered site, its published lists with ``updated`` set (:attr:`site_updated`)."""
        updated = self.site_updated
        return {s: replace(v, updated=updated.get(s)) for s, v in self.contents.items()}

    @property
    def merged(self) -> Index:
        """Site -> dataset -> all sources' reports combined (:func:`combine`; for one source,
        its :attr:`SourceState.index`), built on first use. The core reads it only where
        several sources merge: with one, a cycle works from its set and its delta, and the
        daemon holds no index (issue 15: ~30 MB a million replicas, twice while a cycle
        patches it). Never mutated once built."""
        if self.memo.merged is not None:
            return self.memo.merged
        states = [self.sources[name] for name in sorted(self.sources)]
        if len(states) == 1:
            merged = states[0].index
        else:
            merged = merge_replicas(r for s in states for r in s.replicas)
        self.memo.merged = merged
        return merged

    @property
    def coverage(self) -> dict[Site, frozenset[str]]:
        """Site -> names of the sources that cover it."""
        if self.memo.coverage is not None:
            return self.memo.coverage
        covered: dict[Site, set[str]] = {}
        for name, state in self.sources.items():
            for site in state.sites:
                covered.setdefault(site, set()).add(name)
        coverage = {site: frozenset(names) for site, names in covered.items()}
        self.memo.coverage = coverage
        return coverage

    @property
    def merged_replicas(self) -> Collection[Replica]:
        """The merged replicas, one per (site, dataset): one source's own set as it is (no
        index built), else :attr:`merged`'s values."""
        if len(self.sources) == 1:
            (only,) = self.sources.values()
            return only.replicas
        return list(each_replica(self.merged))

    @property
    def contents(self) -> dict[Site, SiteView]:
        """Per covered site, its published lists and digest (``updated`` left None)."""
        if self.memo.contents is None:
            self.memo.contents = views_of(self.merged_replicas, frozenset(self.coverage))
        return self.memo.contents

    def inherit_derived(self, other: State) -> State:
        """Reuse ``other``'s built views (returns ``self``); only for states with identical
        sources content. ``site_updated`` is not inherited: it depends on the sources' times."""
        mine, theirs = self.memo, other.memo
        mine.merged = theirs.merged if mine.merged is None else mine.merged
        mine.coverage = theirs.coverage if mine.coverage is None else mine.coverage
        mine.contents = theirs.contents if mine.contents is None else mine.contents
        return self

    @property
    def entries(self) -> int:
        """How many (site, dataset) pairs the merged view holds."""
        if len(self.sources) == 1:
            (only,) = self.sources.values()
            return len(only.replicas)
        return index_size(self.merged)

    def adopt(self, merged: Index | None, contents: dict[Site, SiteView]) -> State:
        """Use views the core derived incrementally (returns ``self``); only for views equal
        to what :attr:`merged` (None: not derived) and :attr:`contents` would build. Never
        mutated afterwards."""
        self.memo.merged = merged
        self.memo.contents = contents
        return self


_first = itemgetter(0)  # a (dataset, share) pair's dataset


def _itself(dataset: DatasetId) -> DatasetId:
    return dataset


def site_contents(merged: Index, sites: frozenset[Site]) -> dict[Site, SiteView]:
    """Per site, the sorted lists that make its ClassAd, and their digest (``merged``: an
    :data:`Index`)."""
    return views_of(each_replica(merged), sites)


def views_of(replicas: Iterable[Replica], sites: frozenset[Site]) -> dict[Site, SiteView]:
    """:func:`site_contents` of ``replicas`` (one per (site, dataset)), in one pass over them."""
    lists = {site: _SiteLists() for site in sites}
    at_site, available = lists.get, ReplicaState.AVAILABLE
    for replica in replicas:
        found = at_site(replica[1])
        if found is None:
            continue
        if replica[2] is available and replica[4] is None:  # most: no call
            found.available.append(replica[0])
        else:
            found.add(replica[0], replica)
    return {site: lists[site].view(site) for site in sorted(sites)}


def patch_view(view: SiteView, changes: Iterable[Change]) -> SiteView:
    """``view`` (``updated`` left None) with its site's ``changes`` applied: equal to
    rebuilding it with :func:`site_contents`, at the cost of the changes plus a C-level copy
    and a sort of nearly sorted lists, instead of a Python loop over every replica."""
    lists = _SiteLists()
    gone: dict[ReplicaState | Transfer, list[DatasetId]] = {
        key: [] for key in (*ReplicaState, *Transfer)
    }
    sized: list[DatasetId] = []  # partial entries with a bytes share of their own
    for change in changes:
        old = change.old
        if old is not None:
            gone[old.state].append(change.dataset)
            if old.state is not ReplicaState.REPLICATING:  # absent ones: in replicating
                gone[old.transfer].append(change.dataset)
            if old.state is ReplicaState.PARTIAL and old.bytes_fraction != old.fraction:
                sized.append(change.dataset)
        if change.new is not None:
            lists.add(change.dataset, change.new)
    lists.available += _without(view.available, gone[ReplicaState.AVAILABLE], _itself)
    lists.partial += _without(view.partial, gone[ReplicaState.PARTIAL], _first)
    lists.partial_bytes += _without(view.partial_bytes, sized, _first)
    lists.replicating += _without(view.replicating, gone[ReplicaState.REPLICATING], _first)
    lists.incoming += _without(view.incoming, gone[Transfer.REPLICATING], _first)
    lists.stuck += _without(view.stuck, gone[Transfer.STUCK], _itself)
    return lists.view(view.site)


_T = TypeVar("_T")


def _without(
    items: tuple[_T, ...], removed: list[DatasetId], key: Callable[[_T], DatasetId]
) -> list[_T]:
    """``items`` (sorted by dataset, one entry per dataset; ``key`` gives an entry's dataset)
    without the ``removed`` datasets."""
    if not removed:
        return list(items)
    cuts: list[int] = []
    for d in removed:
        cut = bisect_left(items, d, key=key)
        if cut == len(items) or key(items[cut]) != d:
            raise RuntimeError(f"site view out of step: {d} not listed")  # a bug, never data
        cuts.append(cut)
    cuts.sort()
    out: list[_T] = []
    start = 0
    for cut in cuts:
        out += items[start:cut]
        start = cut + 1
    out += items[start:]
    return out


class _SiteLists:
    """One site's datasets by list while :func:`site_contents` collects them.

    Plain attributes and identity tests, not a dict keyed by the enum, and no
    (dataset, fraction) pair for the available ones, which are most: at a million replicas
    this is a large share of a cycle and of its garbage.
    """

    __slots__ = ("available", "incoming", "partial", "partial_bytes", "replicating", "stuck")

    def __init__(self) -> None:
        self.available: list[DatasetId] = []
        self.partial: list[tuple[DatasetId, float]] = []
        self.partial_bytes: list[tuple[DatasetId, float]] = []
        self.replicating: list[tuple[DatasetId, float]] = []
        self.incoming: list[tuple[DatasetId, float]] = []
        self.stuck: list[DatasetId] = []

    def add(self, dataset: DatasetId, replica: Replica) -> None:
        state, detail = replica.state, replica.detail
        if state is ReplicaState.AVAILABLE:
            self.available.append(dataset)
        elif state is ReplicaState.PARTIAL:
            self.partial.append((dataset, replica.fraction))
            if detail is not None and detail.bytes_fraction != replica.fraction:
                self.partial_bytes.append((dataset, detail.bytes_fraction))
        elif state is ReplicaState.REPLICATING:
            self.replicating.append((dataset, replica.progress))
            return
        if detail is None or detail.transfer is Transfer.NONE:
            return
        if detail.transfer is Transfer.STUCK:
            self.stuck.append(dataset)
        else:
            self.incoming.append((dataset, detail.progress))

    def view(self, site: Site) -> SiteView:
        # DatasetId is a tuple (scope, name): sorting compares in C, in DatasetId's order; a
        # dataset appears once per site, so (dataset, share) pairs never compare the share.
        self.available.sort()
        available = tuple(self.available)
        partial = tuple(sorted(self.partial))
        replicating = tuple(sorted(self.replicating))
        return SiteView(
            site=site,
            available=available,
            partial=partial,
            replicating=replicating,
            stuck=tuple(sorted(self.stuck)),
            updated=None,
            digest=content_digest(site, available, partial, replicating),
            partial_bytes=tuple(sorted(self.partial_bytes)),
            incoming=tuple(sorted(self.incoming)),
        )


def content_digest(
    site: Site,
    available: tuple[DatasetId, ...],
    partial: tuple[tuple[DatasetId, float], ...],
    replicating: tuple[tuple[DatasetId, float], ...],
) -> str:
    """A short hash of what a site's ClassAd lists (not of its timestamp): it changes iff the
    ad's lists change, so publishers can skip targets that already carry it. Persisted in the
    collector's ads: its bytes must never change (a SHA-256 of the site, then per list a label
    and each ``scope:name`` after a newline), hashed one list at a time: a C-level join, as
    DatasetId is the tuple ``(scope, name)``."""
    h = hashlib.sha256(site.encode())
    for label, names in (
        (b"A", available),
        (b"P", map(_first, partial)),
        (b"R", map(_first, replicating)),
    ):
        h.update(b"\0" + label)
        joined = "\n".join(map(":".join, names))  # no name is empty: "" is no entry
        if joined:
            h.update(b"\n" + joined.encode())
    return h.hexdigest()[:16]


def stuck_digest(digest: str, stuck: Iterable[DatasetId]) -> str:
    """``digest`` extended with the stuck transfers, for ads that also list those (always
    different from ``digest``, so turning the list on re-sends every ad once)."""
    h = hashlib.sha256(digest.encode() + b"\0S")
    for d in stuck:
        h.update(f"\n{d.scope}:{d.name}".encode())
    return h.hexdigest()[:16]


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


_make_change = partial(tuple.__new__, Change)  # Change._make at C level: fields already checked


class Changes(Sequence[Change]):
    """A plan's changes in :class:`Change`'s order (by site, then dataset), with their
    :attr:`counts` by kind; equal to a tuple of the same changes.

    Either held as built (a cycle that moved some pairs), or, for a plan that adds every
    replica of a collection (a first cycle), made only while iterated, from that collection
    (never mutated): a million :class:`Change` tuples cost ~80 MB and a second of a first
    cycle, and the daemon only counts them (logs, metrics); ``hydrator once`` lists them.
    Iterating that form twice makes them twice; indexing it builds every change (not kept).
    """

    __slots__ = ("_added", "_held", "counts")

    def __init__(self, changes: Iterable[Change] = ()) -> None:
        self._held = tuple(changes)
        self._added: Collection[Replica] | None = None
        self.counts: Mapping[ChangeKind, int] = Counter(map(_kind_of, self._held))
        """Kind -> how many changes of that kind; kinds without a change are left out, the
        others in the order of their first change."""

    @classmethod
    def all_added(cls, replicas: Collection[Replica]) -> Changes:
        """Every one of ``replicas`` (one per (site, dataset)) added, built while iterated."""
        changes = cls()
        changes._added = replicas
        changes.counts = {ChangeKind.ADDED: len(replicas)} if replicas else {}
        return changes

    def __iter__(self) -> Iterator[Change]:
        if self._added is None:
            return iter(self._held)
        return self._each_added(self._added)

    @staticmethod
    def _each_added(replicas: Iterable[Replica]) -> Iterator[Change]:
        """Grouped by site first, so that the sort compares datasets within a site only (a
        sort of a million (site, dataset) keys costs four times as much); each change built
        by C-level iterators, no Python call per change."""
        by_site: dict[Site, list[Replica]] = {}
        for replica in replicas:
            found = by_site.get(replica[1])
            if found is None:
                found = by_site[replica[1]] = []
            found.append(replica)
        added = ChangeKind.ADDED
        for site in sorted(by_site):
            held = by_site.pop(site)
            held.sort(key=_dataset_of)  # a site holds one replica per dataset
            fields = zip(repeat(site), map(_dataset_of, held), repeat(added), repeat(None), held)
            yield from map(_make_change, fields)

    def __len__(self) -> int:
        return len(self._held) if self._added is None else sum(self.counts.values())

    @overload
    def __getitem__(self, at: int) -> Change: ...
    @overload
    def __getitem__(self, at: slice) -> tuple[Change, ...]: ...
    def __getitem__(self, at: int | slice) -> Change | tuple[Change, ...]:
        return (self._held if self._added is None else tuple(self))[at]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Changes | tuple):
            return len(self) == len(other) and tuple(self) == tuple(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # equal to a tuple, but not one

    def __repr__(self) -> str:
        if self._added is not None:  # not built: the count only
            return f"Changes(added={len(self)})"
        return f"Changes({self._held!r})"


_kind_of: Callable[[Change], ChangeKind] = itemgetter(2)
_dataset_of: Callable[[Replica], DatasetId] = itemgetter(0)


@dataclass(frozen=True, slots=True)
class SourceDelta:
    """Rows to write for one source: its last good snapshot moved from ``removed`` to ``added``."""

    added: AbstractSet[Replica] = frozenset()
    removed: AbstractSet[Replica] = frozenset()


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


@dataclass(frozen=True, slots=True)
class Plan:
    """The pure core's answer: the new state, what changed, and what to write."""

    state: State
    changes: Changes
    sources: tuple[SourceStatus, ...]
    source_deltas: Mapping[str, SourceDelta]
    sites: Mapping[Site, SiteView]
    changed_sites: frozenset[Site]  # sites whose published content (digest) changed
    removed_sites: frozenset[Site]  # sites no source covers any more
    now: datetime  # the cycle's time: the first-seen time of the pairs it adds
