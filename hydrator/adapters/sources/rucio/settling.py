"""The Rucio source's settling: each dirty (site, dataset) pair's new replica, from its
summary rows and the rules moving it there, by the pure decisions of
:mod:`hydrator.core.presence`; a pair they cannot settle is left to the deep checks
(:mod:`.deep`).

Only the pairs whose inputs changed this fetch are settled again (the book's :class:`~.book.Dirty`
pairs), site by site; where a large share of a site's rows are dirty (a first fetch: all of
them), the plainly complete ones are told apart at C level and answered as one batch
(:class:`~.answer.Plain`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from hydrator.adapters.sources.rucio.answer import Plain, complete
from hydrator.adapters.sources.rucio.book import (
    FIRST,
    Book,
    Cycle,
    Dataset,
    Dirty,
    Outcome,
    complete_at,
    drop_stale_checks,
    moving_or_pending,
    plainly_complete,
    rows_at,
)
from hydrator.adapters.sources.rucio.deep import DeepChecks
from hydrator.core.ports import FetchContext
from hydrator.core.presence import Wait, settled, towards
from hydrator.domain import Site

BULK_SHARE = 4  # a site whose dirty pairs are a quarter of its rows or more: see settle


def settle(
    book: Book,
    cycle: Cycle,
    dirty: Dirty,
    context: FetchContext,
    *,
    deep: DeepChecks,
    bulk_share: int = BULK_SHARE,
) -> Iterator[Outcome | Plain]:
    """The new replica of each dirty pair the summary or one rule's locks settle
    (:func:`hydrator.core.presence.settled`); the others join ``book.pending`` and are
    answered by the ``deep`` checks (:meth:`.deep.DeepChecks.run`), with the pending pairs
    whose deep check starts or stops. Yielded as settled, and the dirty pairs let go site
    by site (a first fetch settles every pair: no list of a million outcomes); where a
    ``bulk_share`` of a site's rows are dirty, those that are plainly complete are told
    apart at C level and yielded as one :class:`~.answer.Plain` batch."""
    site_rses = cycle.table.site_rses
    waiting: dict[Dataset, set[Site]] = {}
    drop_stale_checks(book, dirty)
    if dirty.pairs or dirty.filled:
        book.order = None
    exempt: dict[Site, set[Dataset]] | None = None  # (for plainly_complete)
    while dirty.pairs or dirty.filled:
        site, datasets = dirty.pop()
        forced = book.forced.get(site)
        if forced:
            _force(book, site, datasets, forced, waiting)
        rses = site_rses.get(site, ())
        tables = [book.listings[rse].values for rse in rses]
        if len(datasets) * bulk_share >= sum(map(len, tables)):
            exempt = moving_or_pending(book) if exempt is None else exempt
            plain = plainly_complete(tables, datasets, exempt.get(site, set()))
            yield Plain(site, plain)
            datasets.difference_update(plain)
        yield from _settle_site(book, site, rses, datasets, waiting)
    # by site, as the loop above: a restarted fetch's Reuse then builds a site's table
    # once more at most, not once per outcome
    checked = deep.run(book, cycle, waiting, context.now, context.wanted)
    yield from sorted(checked, key=FIRST)


def _force(
    book: Book,
    site: Site,
    datasets: set[Dataset],
    forced: set[Dataset],
    waiting: dict[Dataset, set[Site]],
) -> None:
    """Take the ``forced`` ones (a bad or unavailable replica of theirs is listed at the
    site: :mod:`.badlist`) out of ``datasets`` and make them pending at ``site``: the deep
    checks count them exactly, whatever their summary rows say."""
    held = datasets & forced
    datasets -= held
    for dataset in held:
        pending = book.pending.get(dataset, ())
        if site not in pending:
            book.pending[dataset] = (*pending, site)
        waiting.setdefault(dataset, set()).add(site)


def _settle_site(
    book: Book,
    site: Site,
    rses: tuple[str, ...],
    datasets: Iterable[Dataset],
    waiting: dict[Dataset, set[Site]],
) -> Iterator[Outcome]:
    """The outcome of each of ``datasets`` at ``site`` (whose RSEs are ``rses``) that its rows
    settle (:func:`hydrator.core.presence.settled`); the others are noted pending there and
    added to ``waiting``. The common case (a row says complete, no rule moves the dataset
    there, not pending there) is answered without building the rows' list."""
    covering, waits = book.moving.get, book.pending.get  # (the loop runs once a pair)
    for dataset in datasets:
        moving = towards(covering(dataset), site)
        pending = waits(dataset, ())
        here = complete_at(dataset, rses)
        if here and moving is None and site not in pending:
            yield (site, dataset, complete(dataset.id, site))
            continue
        with_rows = [rse for rse, _ in rows_at(rses, dataset)]
        found = settled(dataset.id, site, here, with_rows, moving)
        if found is Wait.PENDING:
            if site not in pending:
                book.pending[dataset] = (*pending, site)  # a tuple: most have one site
            waiting.setdefault(dataset, set()).add(site)
            continue
        if site in pending:
            rest = tuple(s for s in pending if s != site)
            if rest:
                book.pending[dataset] = rest
            else:
                del book.pending[dataset]
        yield (site, dataset, found)
