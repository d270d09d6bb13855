"""A plan's changes (:class:`Changes`): the :class:`~hydrator.domain.Change` of every (site,
dataset) whose merged view changed, counted by kind; a first cycle's made only when listed.
And a source's rows to write (:class:`SourceDelta`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from itertools import repeat, starmap
from operator import attrgetter
from typing import overload

from hydrator.domain import Change, ChangeKind, DatasetId, Replica, Site


@dataclass(frozen=True, slots=True)
class SourceDelta:
    """Rows to write for one source: its last good snapshot moved from ``removed`` to ``added``."""

    added: AbstractSet[Replica] = frozenset()
    removed: AbstractSet[Replica] = frozenset()


class Changes(Sequence[Change]):
    """A plan's changes in :class:`Change`'s order (by site, then dataset), with their
    :attr:`counts` by kind; equal to a tuple of the same changes.

    Either held as built (a cycle that moved some pairs), or, for a plan that adds every
    replica of a collection (a first cycle), made only while iterated, from that collection
    (never mutated): the daemon only counts a first cycle's changes (logs, metrics), so they
    are never all held at once (:mod:`hydrator.core.model` says what it saves); ``hydrator
    once`` lists them.
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
        sort of every (site, dataset) key costs several times as much)."""
        by_site: dict[Site, list[Replica]] = {}
        for replica in replicas:
            by_site.setdefault(replica.site, []).append(replica)
        added = ChangeKind.ADDED
        for site in sorted(by_site):
            held = by_site.pop(site)
            held.sort(key=_dataset_of)  # a site holds one replica per dataset
            fields = zip(repeat(site), map(_dataset_of, held), repeat(added), repeat(None), held)
            yield from starmap(Change, fields)

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


_kind_of: Callable[[Change], ChangeKind] = attrgetter("kind")
_dataset_of: Callable[[Replica], DatasetId] = attrgetter("dataset")
