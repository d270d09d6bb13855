"""The Rucio source's answer: each settled pair's replica put in the book, one set handed out.

* **Identity.** A pair whose new replica equals the last keeps the last object; the answer is
  one set, built from the last one by delta (:func:`record`: a copy, never changed once
  handed over with ``Snapshot.of(...)``), so an unchanged fetch returns the very
  same set and the core compares by identity. A replica that says only "complete" (most of
  them) is kept in that set alone and found there by value; the others also per site and
  dataset (``Book.answer``).
* **Reuse after a restart.** A fetch with no answer of its own behind it (the first, after a
  restart or a failed fetch) takes the objects of the daemon's last good answer
  (``FetchContext.previous``, after a restart those loaded from the state) for every replica
  equal to one of them, found site by site (:class:`Reuse`), and names each dataset by the
  object those replicas use (:func:`held_ids`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from collections.abc import Set as AbstractSet
from itertools import filterfalse, repeat
from operator import attrgetter
from typing import NamedTuple

from hydrator.adapters.sources.rucio.book import Book, Dataset, Outcome
from hydrator.domain import DatasetId, Replica, ReplicaState, Site

_DATASET_ID: Callable[[Dataset], DatasetId] = attrgetter("id")
_REPLICA_DATASET: Callable[[Replica], DatasetId] = attrgetter("dataset")


def complete_replicas(datasets: Iterable[DatasetId], site: Site) -> list[Replica]:
    """``Replica(dataset, site, ReplicaState.AVAILABLE)`` for each of ``datasets`` (a first
    fetch builds most of its replicas here)."""
    return list(map(Replica, datasets, repeat(site), repeat(ReplicaState.AVAILABLE)))


def complete(dataset: DatasetId, site: Site) -> Replica:
    """The replica of a dataset complete at a site, with nothing moving there."""
    return Replica(dataset, site, ReplicaState.AVAILABLE)


class Plain(NamedTuple):
    """A batch of outcomes: the replica of each of ``datasets`` at ``site`` says only
    "complete" (:func:`~.book.plainly_complete`)."""

    site: Site
    datasets: list[Dataset]

    def replicas(self) -> list[Replica]:
        """Their replicas (:func:`complete_replicas`)."""
        return complete_replicas(map(_DATASET_ID, self.datasets), self.site)


def is_plain(replica: Replica) -> bool:
    """True for a replica that says only "complete" (the form
    :func:`~hydrator.core.presence.holding` gives it)."""
    return (
        replica.detail is None
        and replica.state is ReplicaState.AVAILABLE
        and replica.fraction == 1.0
    )


def held_ids(book: Book, previous: AbstractSet[Replica] | None) -> dict[tuple[str, str], DatasetId]:
    """The datasets of the daemon's held replicas (``FetchContext.previous``), each mapped to
    itself, when the book knows no dataset yet (the first fetch, after a restart or a failed
    fetch); else empty. The source names a dataset it reads with the object those replicas
    already use (checked when they were made): after a restart, one object per dataset
    instead of a loaded and a read one. C-level passes; lives for one fetch."""
    if book.datasets or not previous:
        return {}
    ids = map(_REPLICA_DATASET, previous)
    return dict(zip(ids, map(_REPLICA_DATASET, previous), strict=True))


class Reuse:
    """The daemon's replicas of this source's last good answer (``FetchContext.previous``),
    to answer with where a new replica equals one of them, when the book holds no answer to
    reuse objects from (the first fetch, after a restart or a failed fetch).

    Grouped by site (a list of references, for one fetch), and a lookup table (replica ->
    itself) for one site at a time: outcomes come site by site (the source settles site by
    site), so a fetch builds each site's table once or twice instead of one table of every
    replica, held beside the new answer."""

    def __init__(self, previous: AbstractSet[Replica]) -> None:
        groups: dict[Site, list[Replica]] = {}
        for replica in previous:
            site = replica.site
            group = groups.get(site)
            if group is None:
                groups[site] = [replica]
            else:
                group.append(replica)
        self._groups = groups
        self._site: Site | None = None
        self._table: dict[Replica, Replica] = {}

    @classmethod
    def of(cls, book: Book, previous: AbstractSet[Replica] | None) -> Reuse | None:
        """One for a book without an answer and a non-empty ``previous``, else None."""
        if book.replicas or not previous:
            return None
        return cls(previous)

    def at(self, site: Site) -> dict[Replica, Replica]:
        """The table of ``site``'s replicas (the last site's is let go)."""
        if site != self._site:
            self._table = {}  # first let the last one go
            group = self._groups.get(site, ())
            self._site, self._table = site, dict(zip(group, group, strict=True))
        return self._table


def record(book: Book, outcomes: Iterable[Outcome | Plain], reuse: Reuse | None) -> None:
    """Put each pair's replica in the book. A pair whose replica equals the last one keeps
    that object, and the answer set is the last one moved by the delta: one C-level copy
    reusing the stored hashes (the last set is the daemon's until its next state, so the
    two are both alive for a moment; ``difference().union()`` made a third), so the core
    compares unchanged pairs by identity. A replica equal to one in ``reuse`` is that
    object instead.

    Most replicas say just "complete" (:func:`is_plain`): those are kept in the set alone,
    found there by value; ``book.answer`` holds the others by pair (a pair has at most one
    replica, so a plain one in the set is the pair's)."""
    removed: list[Replica] = []
    added: list[Replica] = []
    for outcome in outcomes:
        if isinstance(outcome, Plain):
            _record_plain(book, outcome, reuse, removed, added)
        else:
            _record_pair(book, outcome, reuse, removed, added)
    if removed or added:
        answer = set(book.replicas)
        answer.difference_update(removed)
        answer.update(added)
        book.replicas = answer  # handed out with the snapshot: never changed after this


def _record_pair(
    book: Book,
    outcome: Outcome,
    reuse: Reuse | None,
    removed: list[Replica],
    added: list[Replica],
) -> None:
    """:func:`record` for one pair: its last replica (if any, and not the same) to
    ``removed``, its new one (if any, and not the same) to ``added``."""
    site, dataset, new = outcome
    if reuse is not None and new is not None:
        new = reuse.at(site).get(new, new)
    answer = book.answer.get(site)
    old = None if answer is None else answer.get(dataset)
    replicas = book.replicas
    if old is None:
        if new is not None and is_plain(new):
            if new not in replicas:  # else unchanged
                added.append(new)  # no replica or a plain one before (the same: in the set)
            return
        if replicas:
            plain = complete(dataset.id, site)
            old = plain if plain in replicas else None
    elif old == new:
        return
    else:
        del answer[dataset]  # type: ignore[union-attr]  # old came from it
    if old is not None:
        removed.append(old)
    if new is not None:
        added.append(new)
        if not is_plain(new):
            book.answer.setdefault(site, {})[dataset] = new


def _record_plain(
    book: Book,
    batch: Plain,
    reuse: Reuse | None,
    removed: list[Replica],
    added: list[Replica],
) -> None:
    """:func:`record` for a batch of plain replicas, at C level: a pair that had a replica
    saying more loses it; one whose plain replica is in the answer already keeps it."""
    answer = book.answer.get(batch.site)
    if answer:
        removed += map(answer.pop, answer.keys() & batch.datasets)
    new = batch.replicas()
    found = new if reuse is None else map(reuse.at(batch.site).get, new, new)
    added.extend(filterfalse(book.replicas.__contains__, found))
