"""The Rucio source: which datasets each site holds, from a Rucio server via rucio-clients.

One :meth:`RucioSource.fetch` makes these calls (through :mod:`.wire`, the only module that
imports ``rucio`` and ``requests``):

1. ``list_rses(rse_expression)``: the RSEs that count (default ``rse_type=DISK``: data only on
   tape is not available to a job), and ``list_rse_attributes(rse)`` for each RSE not named in
   ``[sites]`` whose site attribute is ``rse_attributes_max_age_s`` old (:mod:`.sites`);
2. ``list_datasets_per_rse(rse)`` for each mapped RSE: the dataset summary table
   (``collection_replicas``: state, length, available_length per dataset and RSE); the next
   RSE's table is read by a worker thread while this one is parsed (one request at a time,
   the wait for the server's bytes overlapping the parse: :func:`.summaries.read_ahead`);
3. ``list_replication_rules`` for the REPLICATING and STUCK rules, and ``list_rses(expr)`` for
   their expressions (:mod:`.rules`);
4. ``GET /replicas/bad/states`` for the BAD and the TEMPORARY_UNAVAILABLE replicas (two
   requests, up to ``bad_replicas_max`` records each), and ``list_parent_dids`` for each newly
   listed file (up to ``bad_parent_lookups_max``): the datasets they name are checked exactly
   at those RSEs' sites while listed, as the summary rows say complete meanwhile
   (:mod:`.badlist`);
5. for at most ``deep_check_limit`` datasets, one exact listing each, none for a dataset whose
   last check still stands (:mod:`.deep`).

So the number of calls grows with the number of RSEs (and distinct rule expressions, and the
bounded deep checks), not with the number of datasets; :attr:`RucioSource.calls_last_fetch`
counts them by method (``connect`` counts client constructions, ``auth`` token requests).

Incremental design: a fetch costs what changed, not what exists. The source keeps a
:class:`~.book.Book` between fetches and reads each answer against it: an RSE answer
byte-identical to the last (SHA-256) costs its transfer and a hash; otherwise only its new lines
are parsed (:mod:`.listing`) and its rows updated by the lines added and gone
(:mod:`.summaries`); only the (site, dataset) pairs whose inputs changed are settled again
(:mod:`.settling`, by the pure decisions of :mod:`hydrator.core.presence`); the answer is the
last one moved by the delta (:mod:`.answer`). A fetch that fails half way forgets the book:
the next one reads everything.

The trade-off (docs/platform.md): the summary table is filled by the
``rucio-abacus-collection-replica`` daemon and lags. A new rule's row reads ``UNAVAILABLE 0/0``
until abacus ran, which costs a
deep check (bounded) until then; a file lost or deleted from a dataset whose row says AVAILABLE
is noticed only when abacus updates the row (usually minutes); when the last file goes abacus
deletes the row and the dataset leaves the site. Checking every dataset deeply every cycle would
be exact but one call per dataset. A reused deep check misses what changes neither the
dataset's rows nor its rules' locks (a file lost, or arriving with no lock, before abacus
rewrites the row; a container rule's locks, which are not read) for at most
``deep_check_max_age_s`` (default 600 s, the order of abacus' own lag that complete rows are
trusted across); a row abacus rewrites or a lock of a dataset rule that moves re-checks the
dataset in the next cycle. Only datasets placed by a dataset (or container) rule have
summary rows; files registered without any rule are not seen. ``deep=True`` leaves out RSEs
where every file is still COPYING: such a site holds nothing of the dataset yet.

Known limits: a dataset left over ``deep_check_limit`` that is spread over several RSEs of one
site is judged by its best RSE (a lower bound).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from hydrator.adapters.sources.rucio.answer import Reuse, held_ids, record
from hydrator.adapters.sources.rucio.badlist import BadReplicas
from hydrator.adapters.sources.rucio.book import (
    Book,
    Cycle,
    Dirty,
    HeldWhileDown,
    forget_unlisted,
    remap,
)
from hydrator.adapters.sources.rucio.deep import DeepChecks
from hydrator.adapters.sources.rucio.rules import apply_rules, read_rules
from hydrator.adapters.sources.rucio.settling import BULK_SHARE, settle
from hydrator.adapters.sources.rucio.sites import RseTable, SiteMap, availability
from hydrator.adapters.sources.rucio.summaries import Summaries
from hydrator.adapters.sources.rucio.targeted import parent_datasets, read_datasets
from hydrator.adapters.sources.rucio.wire import ClientFactory, RucioWire
from hydrator.config import RucioSourceConfig
from hydrator.core.ports import FetchContext
from hydrator.domain import (
    DatasetId,
    ElementCount,
    Replica,
    Site,
    Snapshot,
    StorageStatus,
    check_site,
)
from hydrator.errors import PermanentSourceError, TransientSourceError


def build(config: RucioSourceConfig, sites: Mapping[str, str]) -> RucioSource:
    """The factory the service uses for ``type = "rucio"``; ``sites`` is ``Config.sites``."""
    return RucioSource(config, sites)


class RucioSource:
    """A :class:`~hydrator.core.ports.Source` reading one Rucio server.

    ``sleep`` is the backoff clock (seconds); ``client_factory`` replaces building a
    rucio-clients ``Client`` (tests; see :class:`~.wire.RucioWire`); ``bulk_share`` is the
    share of a site's rows that, dirty, makes it settle its plainly complete pairs in one
    batch (:func:`.settling.settle`). After each fetch, ``calls_last_fetch`` maps client
    method -> API calls made (retries included) and ``deep_checks_last_fetch`` /
    ``deep_checks_reused_last_fetch`` / ``deep_checks_skipped_last_fetch`` count exact checks
    made (one call each), answered by an earlier check whose inputs stand (no call), and left
    out because of ``deep_check_limit``; ``calls_last_read`` maps client method -> API calls
    of the last targeted read (:meth:`read_datasets`, :meth:`parent_datasets`).
    """

    def __init__(
        self,
        config: RucioSourceConfig,
        sites: Mapping[str, str],
        *,
        sleep: Callable[[float], None] = time.sleep,
        client_factory: ClientFactory | None = None,
        bulk_share: int = BULK_SHARE,
    ) -> None:
        self.site_overrides = {rse: check_site(site) for rse, site in sites.items()}
        self.wire = RucioWire(config, sleep=sleep, client_factory=client_factory)
        self._sites = SiteMap(config, self.site_overrides)
        self._deep = DeepChecks(config, self.wire)
        self._bad = BadReplicas(config)  # bad and unavailable replicas
        self._summaries = Summaries(config, self.wire)  # the RSEs' summary tables
        self._bulk_share = bulk_share
        self._book = Book()  # what the last fetch learned (the incremental design)
        self._held_while_down = HeldWhileDown()  # what unavailable RSEs held
        self.calls_last_fetch: dict[str, int] = {}
        self.calls_last_read: dict[str, int] = {}  # of the last read_datasets/parent_datasets
        self.deep_checks_last_fetch = 0
        self.deep_checks_reused_last_fetch = 0
        self.deep_checks_skipped_last_fetch = 0
        self.config = config

    @property
    def config(self) -> RucioSourceConfig:
        return self._config

    @config.setter
    def config(self, config: RucioSourceConfig) -> None:
        """A new configuration, used from the next fetch on."""
        self._config = self.wire.config = self._sites.config = self._deep.config = config
        self._bad.config = self._summaries.config = config

    @property
    def deferred_last_fetch(self) -> int:
        """Deep checks left to later cycles (the lagging summary was used instead)."""
        return self.deep_checks_skipped_last_fetch

    @property
    def reused_last_fetch(self) -> int:
        """Deep checks answered by an earlier one whose inputs stand (no call made)."""
        return self.deep_checks_reused_last_fetch

    @property
    def name(self) -> str:
        return self.config.name

    def close(self) -> None:
        """Drop the client and remove the private token directory; safe (and not blocking)
        while a fetch runs, which it cuts short (:meth:`.wire.RucioWire.close`)."""
        self.wire.close()

    abandon = close  # the daemon stops while a fetch runs: see Service.close

    # -- the cycle -----------------------------------------------------------------------

    def fetch(self, context: FetchContext) -> Snapshot:
        """This cycle's snapshot, or raise Transient/PermanentSourceError (nothing partial).

        Incremental (see the module docstring): only lines new since the last fetch are parsed
        and only the pairs they touch are settled again. A fetch that fails half way forgets
        what the source kept, so the next one reads everything as a first fetch does. It
        ends by itself within ``deadline_s`` (TransientSourceError: :meth:`.wire.RucioWire.begin`).
        """
        self.wire.begin(self.config.deadline_s)
        self._deep.begin()
        book = self._book
        self._summaries.held_ids = held_ids(book, context.previous.get(self.name))
        try:
            self.wire.refresh()
            table = self._sites.read(self.wire, book.rses, context.now, context.drains)
            cycle = Cycle(table, invalid=table.invalid)
            dirty = Dirty()
            held_at = self._summaries.held_at
            statuses = self._held_while_down.update(book, table, context.wanted, held_at)
            remap(book, cycle.table, dirty)
            self._summaries.read(book, cycle, dirty)
            read_rules(self.wire, book, cycle, dirty)
            apply_rules(self.wire, book, cycle, dirty)
            self._bad.read(self.wire, book, cycle, dirty)
            settled = settle(
                book, cycle, dirty, context, deep=self._deep, bulk_share=self._bulk_share
            )
            record(book, settled, Reuse.of(book, context.previous.get(self.name)))
            forget_unlisted(book, dirty)
        except BaseException as exc:
            self._book = Book()
            if isinstance(exc, PermanentSourceError):
                self.wire.forget_client()  # rebuilt (password file re-read) next cycle
            raise
        finally:
            self.calls_last_fetch = self.wire.calls
            self.deep_checks_last_fetch = self._deep.made
            self.deep_checks_reused_last_fetch = self._deep.reused
            self.deep_checks_skipped_last_fetch = self._deep.skipped
            self._summaries.held_ids = {}
            self.wire.end()
        answer = Snapshot.of(  # one replica per (site, dataset): the book is keyed by pair
            self.name,
            book.replicas,
            sites=cycle.table.covered,  # with the sites whose RSEs cannot serve
            invalid=cycle.invalid,
            unmapped=cycle.table.unmapped,
            sites_named=True,  # every pair's site is one an RSE maps to (remap drops others)
            storages=statuses,
        )
        return replace(answer, elements=element_counts(book, cycle.sites))

    def read_datasets(self, datasets: Sequence[DatasetId], context: FetchContext) -> list[Replica]:
        """The exact replicas of ``datasets`` at every mapped site, for an event cycle
        (:mod:`.targeted`). Ends within ``deadline_s`` like a full read
        (:meth:`RucioWire.begin`)."""
        self.wire.begin(self.config.deadline_s)
        try:
            self.wire.refresh()
            return read_datasets(self._deep, self._book, datasets)
        finally:
            self.calls_last_read = self.wire.calls
            self.wire.end()

    def parent_datasets(self, files: Sequence[tuple[str, str]]) -> list[DatasetId]:
        """The datasets that contain ``files`` (scope, name), for an event cycle after a
        ``deletion-done`` (:func:`.targeted.parent_datasets`), within ``deadline_s`` from
        now (its own deadline, not the last read's)."""
        self.wire.begin(self.config.deadline_s)
        try:
            self.wire.refresh()
            return parent_datasets(self.wire, files)
        finally:
            self.calls_last_read = self.wire.calls
            self.wire.end()

    def read_storages(self, context: FetchContext) -> tuple[StorageStatus, ...]:
        """The mapped RSEs' statuses now, for a refresh cycle (docs/events.md): one
        ``list_rses()`` (:func:`.sites.availability`) over the RSEs and sites the last full
        read mapped, judged at ``context.now`` with its drains, with the wanted counts of
        what an RSE down held; the book is not changed. Ends within ``deadline_s``."""
        table = self._book.rses
        if not table.rses:
            raise TransientSourceError("rucio: no full read yet to read storage against")
        self.wire.begin(self.config.deadline_s)
        try:
            self.wire.refresh()
            statuses = availability(self.wire, table.rses, table, context.now, context.drains)
            now = RseTable(table.rses, table.invalid, statuses)
            # an RSE down with no rows in the book has its summary read once (a request)
            held_at = self._summaries.held_at
            return self._held_while_down.update(self._book, now, context.wanted, held_at)
        finally:
            self.calls_last_read = self.wire.calls
            self.wire.end()


def element_counts(book: Book, sites: Mapping[str, Site]) -> dict[str, ElementCount]:
    """Per RSE that can serve (``sites``: RSE -> site) and was read, its site and the datasets
    its summary lists (rows complete or not; malformed and out-of-scope lines not counted),
    for the plan's per-storage-element guard: an RSE whose rows vanish holds its site back
    even when the site as a whole shrinks less than the site guard's share (each listing's
    count is kept with it: :attr:`~.listing.Lines.listed`)."""
    listings = book.listings
    return {
        rse: ElementCount(site, listings[rse].listed)
        for rse, site in sites.items()
        if rse in listings
    }
