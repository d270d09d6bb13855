"""Bad and temporarily unavailable file replicas: the datasets that Rucio's
summary table still calls complete at an RSE where one of their files cannot be read.

Rucio marks a replica BAD (``declare_bad_file_replicas``) or TEMPORARY_UNAVAILABLE (minos
applying ``add_bad_pfns``) at once, and lists it at once in its bad-replicas table; the
dataset's summary row keeps saying ``AVAILABLE n/n`` until ``rucio-necromancer`` (then abacus)
has run for a BAD one, and always for a TEMPORARY_UNAVAILABLE one (docs/platform.md). So each fetch
reads that table's two current states (``GET /replicas/bad/states``, ``state=B`` and ``T``,
up to ``bad_replicas_max`` records each: two requests), finds each newly listed file's
datasets (``list_parent_dids``, at most ``bad_parent_lookups_max`` a fetch, answers kept
while the file stays listed), and forces an exact check of those datasets at the listed RSEs'
sites (:func:`~.book.forced_pairs`; :func:`.settling.settle` makes such a pair pending and the
deep checks answer it, first in their order). A replica leaving the listing (a TEMPORARY_
UNAVAILABLE one expired by ``rucio-minos-temporary-expiration``, which deletes its record; a
BAD one RECOVERED, DELETED or LOST) settles its pairs once more from their rows.

A BAD record stays ``B`` until the replica is recovered, deleted or declared lost, so the
listing holds the replicas bad now, not a history. Rucio answers it in no particular order:
past ``bad_replicas_max`` records the forced set is an arbitrary part (a warning names it).
SUSPICIOUS replicas are not read: Rucio still serves them (they stay AVAILABLE).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any, Protocol

from hydrator.adapters.sources.rucio.book import (
    BadKey,
    Book,
    Cycle,
    Dirty,
    Key,
    changed_pairs,
    forced_pairs,
)
from hydrator.config import RucioSourceConfig

log = logging.getLogger("hydrator.adapters.sources.rucio")

STATES = ("B", "T")  # BadFilesStatus.BAD, TEMPORARY_UNAVAILABLE: replicas that cannot serve


class BadListings(Protocol):
    """The two calls the reader makes (:class:`~.wire.RucioWire` has them): the bad-replicas
    table in one state, and the collections a file is attached to; both answer untrusted
    records."""

    def bad_replicas(self, state: str, limit: int) -> list[Any]: ...

    def parent_dids(self, scope: str, name: str) -> list[Any]: ...


class BadReplicas:
    """What one source knows of the bad listings between fetches: each listed file's
    datasets (``parents``), kept while the file stays listed. After each fetch ``listed``
    counts the records read and ``unresolved`` the files still waiting for a lookup."""

    def __init__(self, config: RucioSourceConfig) -> None:
        self.config = config
        self.parents: dict[Key, tuple[Key, ...]] = {}
        self.listed = self.unresolved = 0

    def read(self, wire: BadListings, book: Book, cycle: Cycle, dirty: Dirty) -> None:
        """Read the listings, put the pairs to force in ``book.forced`` and mark the pairs
        forced or released since the last fetch dirty. With ``bad_replicas_max = 0`` nothing
        is read and nothing forced."""
        limit = self.config.bad_replicas_max
        listed: set[BadKey] = set()
        if limit > 0:
            for state in STATES:
                listed |= self._listing(wire, state, limit, cycle)
        listed = {key for key in listed if key[2] in cycle.sites}  # RSEs that count only
        self.listed = len(listed)
        self._look_up(wire, {(scope, name) for scope, name, _ in listed})
        forced = forced_pairs(listed, self.parents, book.datasets, cycle.sites)
        for site, dataset in changed_pairs(forced, book.forced):
            dirty.add(site, dataset)
        book.forced = forced

    def _listing(self, wire: BadListings, state: str, limit: int, cycle: Cycle) -> set[BadKey]:
        """The (scope, name, RSE) of the replicas listed in ``state``, up to ``limit`` (at
        every RSE: the listing takes one RSE or all); a malformed record is counted invalid."""
        records = wire.bad_replicas(state, limit + 1)
        if len(records) > limit:
            log.warning(
                "rucio: more than bad_replicas_max=%d replicas listed in state %s; "
                "only %d are checked this fetch",
                limit,
                state,
                limit,
            )
        found: set[BadKey] = set()
        for record in records[:limit]:
            key = _bad_key(record)
            if key is None:
                cycle.invalid += 1
            else:
                found.add(key)
        return found

    def _look_up(self, wire: BadListings, files: set[Key]) -> None:
        """Each listed file's datasets, up to ``bad_parent_lookups_max`` new lookups (sorted,
        so the rest follow in the next fetches); files no longer listed are forgotten."""
        for gone in self.parents.keys() - files:
            del self.parents[gone]
        new = sorted(files - self.parents.keys())
        budget = self.config.bad_parent_lookups_max
        for scope, name in new[:budget]:
            self.parents[(scope, name)] = _datasets(wire.parent_dids(scope, name))
        self.unresolved = max(0, len(new) - budget)
        if self.unresolved:
            log.warning(
                "rucio: %d bad replicas' datasets left to later fetches "
                "(bad_parent_lookups_max=%d)",
                self.unresolved,
                budget,
            )


def _bad_key(record: Any) -> BadKey | None:
    """(scope, name, RSE) of one untrusted bad-replica record, or None when malformed."""
    if not isinstance(record, dict):
        return None
    scope, name, rse = record.get("scope"), record.get("name"), record.get("rse")
    if isinstance(scope, str) and isinstance(name, str) and isinstance(rse, str):
        return (scope, name, rse)
    return None


def _datasets(records: Iterable[Any]) -> tuple[Key, ...]:
    """The (scope, name) of the datasets among untrusted parent records (containers and
    malformed records left out)."""
    out: list[Key] = []
    for record in records:
        if not isinstance(record, dict) or record.get("type") not in ("DATASET", "dataset"):
            continue
        scope, name = record.get("scope"), record.get("name")
        if isinstance(scope, str) and isinstance(name, str):
            out.append((scope, name))
    return tuple(out)
