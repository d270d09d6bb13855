"""The Rucio source's deep checks: exact presence of a dataset at the sites its summary rows
cannot settle, one call per dataset.

For at most ``deep_check_limit`` pending datasets (listed bad first, then most wanted, then
those no rule's locks vouch for, then by scope and name: :mod:`hydrator.core.check_order`,
through :func:`deep_order`), one exact listing each
(:meth:`DeepChecks.check_datasets`): ``list_dataset_replicas(scope, name, deep=True)`` (per
RSE), or ``list_replicas`` (per file) when the dataset has summary rows at two or more RSEs
of one pending site (the union needs to know which files they share). The other pending pairs
use the lagging summary or the rules' locks (:func:`hydrator.core.presence.fallback`).

**Deep checks reused.** A chosen dataset checked before is answered from that check, with no
call, while everything the check read stands: no summary row, pending site or rule transfer
of the dataset changed (no dirty pair at any site), none of its rule lines changed (lock
counts follow its files), the RSE -> site map is the same (:func:`~.book.drop_stale_checks`),
and the check is younger than ``deep_check_max_age_s`` (by ``FetchContext.now``; 0: never
reused). Otherwise it is listed again at once.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Mapping
from datetime import datetime
from functools import partial

from hydrator.adapters.sources.rucio.book import (
    Book,
    Check,
    Cycle,
    Dataset,
    Outcome,
    Partial,
    PendingOrder,
    rows_at,
)
from hydrator.adapters.sources.rucio.listing import (
    DEEP_LINES,
    DeepLine,
    Mark,
    parse_file,
    parse_lines,
)
from hydrator.adapters.sources.rucio.sites import younger
from hydrator.adapters.sources.rucio.wire import RucioWire
from hydrator.config import RucioSourceConfig
from hydrator.core.check_order import deep_check_order, standing_order
from hydrator.core.presence import NOTHING, Counts, exact, fallback, vouched
from hydrator.domain import DatasetId, Site

log = logging.getLogger("hydrator.adapters.sources.rucio")


class DeepChecks:
    """The deep checks of one source; after each fetch ``made``, ``reused`` and ``skipped``
    count the exact checks made (one call each), answered by an earlier check whose inputs
    stand (no call), and left out because of ``deep_check_limit``."""

    def __init__(self, config: RucioSourceConfig, wire: RucioWire) -> None:
        self.config = config
        self.wire = wire
        self.made = self.reused = self.skipped = 0

    def begin(self) -> None:
        """Start counting the checks of a new fetch."""
        self.made = self.reused = self.skipped = 0

    def run(
        self,
        book: Book,
        cycle: Cycle,
        waiting: dict[Dataset, set[Site]],
        now: datetime,
        wanted: Mapping[DatasetId, int],
    ) -> list[Outcome]:
        """Exact presence for the pending pairs, up to ``deep_check_limit`` datasets
        (:func:`deep_order`); the others use the lagging summary (or the locks, where they
        prove more), recomputed only for the ``waiting`` pairs and those checked last time
        (the rest kept their inputs, so their replicas stand)."""
        limit = self.config.deep_check_limit
        chosen = deep_order(book, wanted, limit)
        checked = set(chosen)
        self.skipped = max(0, len(book.pending) - limit)
        if self.skipped:
            log.warning(
                "rucio: %d datasets over deep_check_limit=%d used the lagging summary",
                self.skipped,
                limit,
            )
        for dataset in book.checked - checked:
            if dataset in book.pending:
                waiting.setdefault(dataset, set()).update(book.pending[dataset])
        site_rses = cycle.table.site_rses
        out: list[Outcome] = []
        for dataset, sites in waiting.items():
            if dataset not in checked:
                for site in sites:
                    rows = rows_at(site_rses.get(site, ()), dataset)
                    partial_rows = [v for _, v in rows if isinstance(v, Partial)]
                    moving = book.moving_to(dataset, site)
                    out.append((site, dataset, fallback(dataset.id, site, partial_rows, moving)))
        checks = self.check_datasets(chosen, book, cycle, now)
        for check in checks.values():
            out += check.outcomes
        book.checked, book.checks = checked, checks
        return out

    def check_datasets(
        self, datasets: Iterable[Dataset], book: Book, cycle: Cycle, now: datetime
    ) -> dict[Dataset, Check]:
        """The exact presence of each of ``datasets`` at its pending sites (``book.pending``):
        its last check while that still stands and is younger than ``deep_check_max_age_s``
        (no call; counted in ``reused``), else one exact listing now (``made``). Each check
        holds an outcome per pending site; the caller records them."""
        checks: dict[Dataset, Check] = {}
        for dataset in datasets:
            last = book.checks.get(dataset)
            if last is not None and younger(last.at, now, self.config.deep_check_max_age_s):
                self.reused += 1
                checks[dataset] = last
                continue
            sites = book.pending[dataset]
            checks[dataset] = Check(now, tuple(self.exact_outcomes(dataset, sites, book, cycle)))
            self.made += 1
        return checks

    def exact_outcomes(
        self, dataset: Dataset, sites: Iterable[Site], book: Book, cycle: Cycle
    ) -> list[Outcome]:
        """One exact listing for ``dataset`` (:meth:`exact_counts`), and its replica at each of
        ``sites`` with the rules' transfer there as the book has it."""
        sites = tuple(sites)
        counted = self.exact_counts(dataset, sites, cycle)
        out: list[Outcome] = []
        for site in sites:
            counts = counted.get(site, NOTHING)
            moving = book.moving_to(dataset, site)
            out.append((site, dataset, exact(dataset.id, site, counts, moving)))
        return out

    def exact_counts(
        self, dataset: Dataset, sites: tuple[Site, ...], cycle: Cycle
    ) -> dict[Site, Counts]:
        """Site -> files and bytes of ``dataset`` present there, from one exact listing (one
        call): per file when one of ``sites`` has summary rows at two or more of its RSEs
        (the union needs to know which files they share), else per RSE."""
        site_rses = cycle.table.site_rses
        if any(len(rows_at(site_rses.get(s, ()), dataset)) > 1 for s in sites):
            return self._file_union(dataset.id, cycle)
        return self._deep_counts(dataset.id, cycle)

    def _deep_counts(self, dataset: DatasetId, cycle: Cycle) -> dict[Site, Counts]:
        """Site -> files and bytes of one dataset present there, from the file replicas
        (``list_dataset_replicas(deep=True)``, per RSE; several RSEs of a site: the best, a
        lower bound, as this listing cannot tell which files they share)."""
        what = f"the replicas of {dataset} (list_dataset_replicas)"
        rows = self.wire.dataset_replicas(dataset, partial(parse_lines, DEEP_LINES, what=what))
        counts: dict[Site, Counts] = {}
        for row in rows:
            if isinstance(row, Mark):
                cycle.invalid += 1  # malformed (no blank line is left to skip)
                continue
            site = cycle.sites.get(row["rse"])
            if site is None:
                continue
            found = _counts(row)
            old = counts.get(site)
            if old is None or found.holds_more_than(old):
                counts[site] = found
        return counts

    def _file_union(self, dataset: DatasetId, cycle: Cycle) -> dict[Site, Counts]:
        """Site -> files and bytes of one dataset present there, a file counting once when
        any RSE of the site holds it AVAILABLE (``list_replicas(all_states=True)``: one call,
        one record per file with its state at each RSE)."""
        records = self.wire.file_replicas(dataset)
        length = size = 0
        files: Counter[Site] = Counter()
        sizes: Counter[Site] = Counter()
        for record in records:
            row = parse_file(record)
            if row is None:
                cycle.invalid += 1
                continue
            length += 1
            size += row.bytes or 0
            for site in {
                found
                for rse, state in row.states.items()
                if state == "AVAILABLE" and (found := cycle.sites.get(rse)) is not None
            }:
                files[site] += 1
                sizes[site] += row.bytes or 0
        return {site: Counts(length, files[site], size, sizes[site]) for site in files}


def _counts(row: DeepLine) -> Counts:
    return Counts(
        row.get("length") or 0,
        row.get("available_length") or 0,
        row.get("bytes") or 0,
        row.get("available_bytes") or 0,
    )


def deep_order(book: Book, wanted: Mapping[DatasetId, int], limit: int) -> list[Dataset]:
    """The first ``limit`` pending datasets to check exactly, in
    :func:`~hydrator.core.check_order.deep_check_order` (listed bad first, then most wanted,
    then those no rule's locks vouch for at a pending site, then by scope and name). It is
    handed the pending datasets by id, whether the rules' locks vouch for each, and the ids
    :attr:`~.book.Book.forced` holds. Those first two and the order without demand are kept
    in the book until a pair is settled again (only that can change ``pending`` or a pending
    pair's rules), so a fetch in which nothing changed sorts only the wanted datasets."""
    if book.order is None:
        by_id = {dataset.id: dataset for dataset in book.pending}
        vouched_for = {
            dataset.id: vouched(book.moving.get(dataset), sites)
            for dataset, sites in book.pending.items()
        }
        book.order = PendingOrder(by_id, vouched_for, standing_order(vouched_for))
    order = book.order
    listed_bad = {d.id for held in book.forced.values() for d in held}
    chosen = deep_check_order(order.vouched, listed_bad, wanted, limit, order.standing)
    return [order.datasets[did] for did in chosen]
