"""The Rucio source's book: what it keeps between fetches, so that a fetch costs what changed,
and how a new answer's rows move it.

* **Rows are small.** Per dataset, one flat tuple of its rows at mapped RSEs
  (:attr:`Dataset.at`: ``(rse, row, ...)``); a row that says complete is just the
  :class:`Dataset` (one object per dataset, hashed by identity), others a :class:`Partial`
  tuple of counts. No parsed record outlives its batch.
* **Dirty pairs only.** Each row added, changed or gone marks its (site, dataset) dirty
  (:class:`Dirty`); so do a change of the rules' transfer towards a site, of the RSE -> site
  map (:func:`remap`) and of a deep check. Only dirty pairs are settled again.
* **All or nothing.** A fetch that fails half way replaces the book by an empty one: the next
  fetch reads everything, as the first does, and nothing partial is ever returned.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, replace
from datetime import datetime
from operator import itemgetter
from typing import Any, NamedTuple, cast

from hydrator.adapters.sources.rucio.listing import Lines, Mark
from hydrator.adapters.sources.rucio.sites import RseTable
from hydrator.core.presence import RuleTransfers, SiteTransfer, bytes_share, files_share, towards
from hydrator.domain import DatasetId, Replica, Site, StorageStatus, Transfer


class Dataset:
    """One dataset known to the source: one object per dataset while it has summary rows, so
    the source's tables key on it by identity (a C-level hash, unlike :class:`DatasetId`'s).

    ``at`` holds its summary rows at mapped RSEs, flat: ``(rse, row, rse, row, ...)`` (the
    dataset is "listed" while it is not empty). One tuple per dataset instead of an entry
    per row in a table per RSE (less memory a row: docs/performance.md). A row is never
    equal to an RSE name, so ``in`` and ``index`` find an RSE at an even position (the names
    are interned: those comparisons stop at identity)."""

    __slots__ = ("at", "id", "key")

    def __init__(self, dataset: DatasetId, key: tuple[str, str]) -> None:
        self.id = dataset
        self.key = key  # (scope, name) (the id itself), shared by the tables keyed by text
        self.at: tuple[str | RowValue, ...] = ()

    def row(self, rse: str) -> RowValue | None:
        """Its summary row at ``rse``, if any."""
        at = self.at
        if rse not in at:
            return None
        return cast(RowValue, at[at.index(rse) + 1])

    def put(self, rse: str, value: RowValue) -> bool:
        """Set its row at ``rse``; True when it had none there."""
        at = self.at
        if rse not in at:
            self.at = at + (rse, value)  # noqa: RUF005  (one more rse, value pair)
            return True
        i = at.index(rse) + 1
        self.at = (*at[:i], value, *at[i + 1 :])
        return False

    def drop(self, rse: str) -> None:
        """Remove its row at ``rse`` (which it has)."""
        at = self.at
        i = at.index(rse)
        self.at = at[:i] + at[i + 2 :]


class Partial(NamedTuple):
    """A summary row that does not say complete: its files, files present, and share of
    bytes present. A row that says complete is kept as its :class:`Dataset` alone: its
    counts are never needed (8 bytes a row)."""

    dataset: Dataset
    length: int
    available: int
    bytes_share: float  # available_bytes / bytes; without bytes, the files share

    @classmethod
    def of(cls, dataset: Dataset, length: int, available: int, size: int, present: int) -> Partial:
        """The row of ``available`` of ``length`` files and ``present`` of ``size`` bytes."""
        return cls(dataset, length, available, bytes_share(available, length, present, size))

    @property
    def files_share(self) -> float:
        return files_share(self.available, self.length)


RowValue = Dataset | Partial  # one dataset's summary row at one RSE


def dataset_of(value: RowValue) -> Dataset:
    return value if type(value) is Dataset else value.dataset  # type: ignore[union-attr]


def listed(values: list[RowValue | Mark]) -> list[Dataset]:
    """The dataset of each row among a listing's ``values`` (marks left out): those saying
    complete, then the others."""
    found: list[Dataset] = [v for v in values if type(v) is Dataset]
    found += [v.dataset for v in values if type(v) is Partial]
    return found


class Rule(NamedTuple):
    """An active or stuck dataset rule, as the source uses it."""

    key: tuple[str, str]  # (scope, name) of its dataset
    expression: str
    transfer: Transfer  # REPLICATING or STUCK
    progress: float  # OK locks / all locks


Outcome = tuple[Site, Dataset, Replica | None]  # a pair's replica this fetch (None: none)
FIRST: Callable[[tuple[Any, ...]], Any] = itemgetter(0)  # an outcome's site, a row's RSE


class Check(NamedTuple):
    """A deep check's answer, reused while its inputs stand and it is young enough."""

    at: datetime  # the cycle (``FetchContext.now``) whose fetch made the call
    outcomes: tuple[Outcome, ...]  # a replica (or None) for each pending site of the dataset


class PendingOrder(NamedTuple):
    """The pending datasets as :func:`~hydrator.core.check_order.deep_check_order` takes
    them, kept while ``pending`` and its rules stand: each by its id, whether a rule's locks
    vouch for it, and their order without demand."""

    datasets: dict[DatasetId, Dataset]
    vouched: dict[DatasetId, bool]
    standing: list[DatasetId]


@dataclass
class Book:
    """Everything the source keeps between fetches, so that a fetch costs what changed.

    The RSEs of the last fetch and their sites (``rses``); the lines of each RSE's summary
    table and the rows they gave (``listings``; the rows are also kept per dataset,
    :attr:`Dataset.at`); the rules per dataset (``rules_of``, from the lines in
    ``rule_lines``); the rules' transfer per dataset and site (``moving``) and the RSEs each
    expression covered (``resolved``); the pairs waiting for a deep check (``pending``), the
    datasets checked last time (``checked``) and the answers of those checks while their
    inputs stand (``checks``); and the answer itself: all replicas as one set (never changed
    once handed out), and per site, dataset -> replica for those that say more than
    "complete" (:func:`~.answer.record`). Replaced by an empty book when a fetch fails.
    """

    rses: RseTable = field(default_factory=RseTable)
    listings: dict[str, Lines[RowValue | Mark]] = field(default_factory=dict)
    datasets: dict[tuple[str, str], Dataset] = field(default_factory=dict)
    rule_lines: dict[str, Lines[Rule | Mark]] = field(default_factory=dict)
    rules_of: dict[tuple[str, str], list[Rule]] = field(default_factory=dict)
    resolved: dict[str, frozenset[str]] = field(default_factory=dict)
    moving: dict[Dataset, RuleTransfers] = field(default_factory=dict)
    pending: dict[Dataset, tuple[Site, ...]] = field(default_factory=dict)
    checked: set[Dataset] = field(default_factory=set)
    checks: dict[Dataset, Check] = field(default_factory=dict)
    answer: dict[Site, dict[Dataset, Replica]] = field(default_factory=dict)
    replicas: AbstractSet[Replica] = frozenset()
    order: PendingOrder | None = None  # ``pending`` for the deep-check order, while it stands
    forced: dict[Site, set[Dataset]] = field(default_factory=dict)  # :func:`forced_pairs`

    def moving_to(self, dataset: Dataset, site: Site) -> SiteTransfer | None:
        """The rules' transfer of ``dataset`` towards ``site``, if any."""
        return towards(self.moving.get(dataset), site)


@dataclass
class Cycle:
    """What one fetch has learned so far (mutable scratch space, not shared): its RSEs and
    the records it could not use (``invalid``, counted in the snapshot)."""

    table: RseTable
    invalid: int = 0

    @property
    def sites(self) -> dict[str, Site]:
        """Mapped RSE -> site."""
        return self.table.sites


@dataclass
class Dirty:
    """What changed in one fetch: the (site, dataset) pairs to settle again, and the datasets
    whose rules must be re-applied (their rules changed, or they gained or lost every row)."""

    pairs: dict[Site, set[Dataset]] = field(default_factory=dict)
    # RSE tables read whole the first time: every dataset in them is dirty at the site (kept
    # as the listings' values until the site is settled: a first fetch would copy every pair)
    filled: dict[Site, list[list[RowValue | Mark]]] = field(default_factory=dict)
    datasets: set[Dataset] = field(default_factory=set)
    rule_keys: set[tuple[str, str]] = field(default_factory=set)
    remapped: bool = False  # the RSE -> site map changed

    def add(self, site: Site, dataset: Dataset) -> None:
        found = self.pairs.get(site)
        if found is None:
            found = self.pairs[site] = set()
        found.add(dataset)

    def pop(self) -> tuple[Site, set[Dataset]]:
        """A site with dirty pairs and its dirty datasets, no longer held here."""
        site = next(iter(self.filled)) if self.filled else next(iter(self.pairs))
        datasets = self.pairs.pop(site, set())
        for values in self.filled.pop(site, ()):
            datasets.update(listed(values))
        return site, datasets

    def each(self) -> Iterator[Dataset]:
        """Every dataset with a dirty pair (once per site it is dirty at)."""
        for datasets in self.pairs.values():
            yield from datasets
        for tables in self.filled.values():
            for values in tables:
                yield from listed(values)


# -- rows ----------------------------------------------------------------------------------


def repeats(added: list[RowValue | Mark], gone: list[RowValue | Mark], rse: str) -> bool:
    """True when the new lines name a dataset twice, or one that a kept line (at ``rse``)
    names."""
    new = [dataset_of(v) for v in added if not isinstance(v, Mark)]
    leaving = {dataset_of(v) for v in gone if not isinstance(v, Mark)}
    return len(set(new)) != len(new) or any(rse in d.at and d not in leaving for d in new)


def first_only(values: list[RowValue | Mark]) -> bool:
    """Keep the first row of each dataset of one answer, marking later ones invalid (Rucio
    keeps one row per dataset and RSE); return whether every dataset came once."""
    seen: set[Dataset] = set()
    unique = True
    for i, value in enumerate(values):
        if isinstance(value, Mark):
            continue
        dataset = dataset_of(value)
        if dataset in seen:
            values[i] = Mark.INVALID
            unique = False
        seen.add(dataset)
    return unique


def fill_rows(rse: str, values: list[RowValue | Mark], site: Site, dirty: Dirty) -> bool:
    """:func:`first_only` and :func:`apply_rows` in one pass, for an RSE read the first
    time (no row at ``rse`` yet, nothing gone): what they would do, at half the cost a row,
    with the values themselves noted as dirty at ``site`` (:attr:`Dirty.filled`). A row
    put here is its dataset's last, so a second line of a dataset finds ``rse`` last."""
    unique = True
    for i, value in enumerate(values):
        if isinstance(value, Mark):
            continue
        dataset = value if isinstance(value, Dataset) else value.dataset
        at = dataset.at
        if at and at[-2] == rse:
            values[i] = Mark.INVALID
            unique = False
            continue
        dataset.at = at + (rse, value)  # noqa: RUF005  (one more rse, value pair)
        if not at:
            dirty.datasets.add(dataset)
    if values:
        dirty.filled.setdefault(site, []).append(values)
    return unique


def apply_rows(
    rse: str,
    added: Iterable[RowValue | Mark],
    gone: Iterable[RowValue | Mark],
    site: Site,
    dirty: Dirty,
) -> None:
    """The rows at ``rse`` with ``gone`` taken out where still current, then ``added`` put in
    (a row that says complete is its dataset object, so a changed line goes before its
    successor comes). Each dataset touched is dirty at ``site``; one that gained its first
    or lost its last row anywhere has its rules applied again."""
    emptied: set[Dataset] = set()
    for value in gone:
        if isinstance(value, Mark):
            continue
        dataset = dataset_of(value)
        if dataset.row(rse) is value:  # (the very row object: not one that replaced it)
            dataset.drop(rse)
            if not dataset.at:
                emptied.add(dataset)
            dirty.add(site, dataset)
    for value in added:
        if isinstance(value, Mark):
            continue
        dataset = dataset_of(value)
        if dataset.put(rse, value):
            if len(dataset.at) == 2 and dataset not in emptied:
                dirty.datasets.add(dataset)
            emptied.discard(dataset)
        dirty.add(site, dataset)
    dirty.datasets |= emptied


def remap(book: Book, table: RseTable, dirty: Dirty) -> None:
    """Apply the changes of the RSE -> site map (``book.rses`` -> ``table``, which becomes
    ``book.rses``): an RSE no longer mapped takes its rows away; one mapped to another site
    makes each of its datasets dirty at both sites."""
    new_sites = table.sites
    for rse, old in book.rses.sites.items():
        new = new_sites.get(rse)
        if new == old:
            continue
        dirty.remapped = True
        listing = book.listings.get(rse)
        values = listing.values if listing is not None else []
        if new is None:
            apply_rows(rse, (), values, old, dirty)
            book.listings.pop(rse, None)
            continue
        for dataset in listed(values):
            dirty.add(old, dataset)
            dirty.add(new, dataset)
    if new_sites.keys() - book.rses.sites.keys():
        dirty.remapped = True
    book.rses = table


def rows_at(rses: tuple[str, ...], dataset: Dataset) -> list[tuple[str, RowValue]]:
    """(RSE, row) of ``dataset`` at each of ``rses`` (sorted) that has one, in that order."""
    at = dataset.at  # names only, by index: a dataset has a few rows
    found: list[tuple[str, RowValue]] = []
    for i in range(0, len(at), 2):
        if at[i] in rses:
            found.append((at[i], at[i + 1]))  # type: ignore[arg-type]  # (names at even i)
    if len(found) > 1:
        found.sort(key=FIRST)  # by RSE name: in the order of ``rses`` (sorted)
    return found


def complete_at(dataset: Dataset, rses: tuple[str, ...]) -> bool:
    """True when a row of ``dataset`` at one of ``rses`` says complete (is the dataset)."""
    at = dataset.at
    if dataset not in at:  # (C level: most datasets with a partial row have no complete one)
        return False
    for i in range(1, len(at), 2):  # noqa: SIM110  (any() over a generator: slower)
        if at[i] is dataset and at[i - 1] in rses:
            return True
    return False


def plainly_complete(
    tables: Iterable[list[RowValue | Mark]], datasets: set[Dataset], exempt: set[Dataset]
) -> list[Dataset]:
    """Those of ``datasets`` that a row at one of a site's RSEs (``tables``: their listings'
    values) says complete, but not ``exempt`` ones (:func:`moving_or_pending` at the site):
    their replica there says only "complete", as the pair-by-pair settling would find (the
    others are left to it). For a site most of whose pairs are dirty."""
    complete: set[Dataset] = set()
    for values in tables:
        complete.update([v for v in values if type(v) is Dataset])
    complete.intersection_update(datasets)
    complete.difference_update(exempt)
    return list(complete)


def moving_or_pending(book: Book) -> dict[Site, set[Dataset]]:
    """Site -> the datasets some rule moves towards it or pending there: the pairs whose
    replica is not told by their summary rows alone. (Settling one pair changes the pending
    sites of its dataset at its own site only: a site's set stands until it is settled.)"""
    out: dict[Site, set[Dataset]] = {}
    for dataset, covered in book.moving.items():
        for moving in covered:
            out.setdefault(moving.site, set()).add(dataset)
    for dataset, sites in book.pending.items():
        for site in sites:
            out.setdefault(site, set()).add(dataset)
    return out


def move(book: Book, dataset: Dataset, covered: RuleTransfers, dirty: Dirty) -> None:
    """Put a dataset's new rule transfers in the book; each site whose transfer changed is
    dirty."""
    old = {moving.site: moving for moving in book.moving.get(dataset, ())}
    new = {moving.site: moving for moving in covered}
    for site in old.keys() | new.keys():
        if old.get(site) != new.get(site):
            dirty.add(site, dataset)
    if covered:
        book.moving[dataset] = covered
    else:
        book.moving.pop(dataset, None)


def drop_stale_checks(book: Book, dirty: Dirty) -> None:
    """Forget the deep checks whose inputs changed this fetch: every check after a change
    of the RSE -> site map; else those of a dataset with a dirty pair at any site (a summary
    row, its pending sites or its transfer towards a site changed) or whose rule lines
    changed (lock counts follow the files, even where the transfer reads the same)."""
    if not book.checks:
        return
    if dirty.remapped:
        book.checks.clear()
        return
    for dataset in dirty.each():
        book.checks.pop(dataset, None)
    for dataset in dirty.datasets:
        book.checks.pop(dataset, None)
    for key in dirty.rule_keys:
        found = book.datasets.get(key)
        if found is not None:
            book.checks.pop(found, None)


def forget_unlisted(book: Book, dirty: Dirty) -> None:
    """Drop the datasets left without a summary row (nothing else refers to them now)."""
    for dataset in dirty.datasets:
        if not dataset.at and book.datasets.get(dataset.key) is dataset:
            del book.datasets[dataset.key]


BadKey = tuple[str, str, str]  # (scope, name, RSE) of a file replica a bad listing names
Key = tuple[str, str]  # (scope, name) of a DID


def forced_pairs(
    listed: Iterable[BadKey],
    parents: Mapping[Key, tuple[Key, ...]],
    datasets: Mapping[Key, Dataset],
    sites: Mapping[str, Site],
) -> dict[Site, set[Dataset]]:
    """Site -> the datasets to check exactly there, whatever their summary rows say: each
    known dataset (``datasets``: those with summary rows) holding a ``listed`` file (by
    ``parents``: file -> its datasets; a file not looked up yet counts for none) at a mapped
    RSE (``sites``) of the site. Rucio's summary row keeps saying complete for a BAD replica
    until the necromancer has run, for a TEMPORARY_UNAVAILABLE one always (docs/platform.md)."""
    out: dict[Site, set[Dataset]] = {}
    for scope, name, rse in listed:
        site = sites.get(rse)
        if site is None:
            continue
        for key in parents.get((scope, name), ()):
            dataset = datasets.get(key)
            if dataset is not None:
                out.setdefault(site, set()).add(dataset)
    return out


def changed_pairs(
    new: Mapping[Site, set[Dataset]], old: Mapping[Site, set[Dataset]]
) -> Iterator[tuple[Site, Dataset]]:
    """The pairs forced in only one of ``new`` and ``old``: those settled again this fetch (a
    pair that stays forced keeps its pending check; one that left is settled once more from
    its rows, its check dropped)."""
    for site in new.keys() | old.keys():
        for dataset in new.get(site, set()) ^ old.get(site, set()):
            yield site, dataset


class HeldWhileDown:
    """The datasets each unavailable RSE held when it went down (its summary rows, which
    leave the book then), kept while it stays down, to count those queued jobs want
    (:attr:`~hydrator.domain.StorageStatus.wanted`: the alert on storage holding wanted data).
    In memory: an RSE already down when the source starts (a restart) has no rows in the
    book, so its summary table is read once (``read``): Rucio leaves it as it was when the
    RSE went read-disabled (docs/platform.md), one ``list_datasets_per_rse`` call per such RSE."""

    def __init__(self) -> None:
        self._held: dict[str, frozenset[DatasetId]] = {}

    def update(
        self,
        book: Book,
        table: RseTable,
        wanted: Mapping[DatasetId, int],
        read: Callable[[str], frozenset[DatasetId]],
    ) -> tuple[StorageStatus, ...]:
        """``table``'s statuses with their wanted counts; call before the book is remapped
        (an RSE going down still has its rows there). ``read(rse)``: the datasets an RSE's
        summary table lists, for one down with no rows in the book."""
        down = table.down
        for rse in down - self._held.keys():
            listing = book.listings.get(rse)
            if listing is None:
                self._held[rse] = read(rse)
                continue
            self._held[rse] = frozenset(d.id for d in listed(listing.values))
        for rse in self._held.keys() - down:
            del self._held[rse]
        return tuple(
            s
            if s.available
            else replace(s, wanted=sum(1 for d in self._held.get(s.storage, ()) if d in wanted))
            for s in table.statuses
        )
