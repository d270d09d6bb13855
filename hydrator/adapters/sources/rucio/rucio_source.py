"""The Rucio source: which datasets each site holds, from a Rucio server via rucio-clients.

One :meth:`RucioSource.fetch` makes these calls (through :mod:`.wire`, the only module that
imports ``rucio`` and ``requests``):

1. ``list_rses(rse_expression)``: the RSEs that count (default ``rse_type=DISK``: data only on
   tape is not available to a job), and ``list_rse_attributes(rse)`` for each RSE not named in
   ``[sites]`` whose site attribute is ``rse_attributes_max_age_s`` old (:mod:`.sites`);
2. ``list_datasets_per_rse(rse)`` for each mapped RSE: the dataset summary table
   (``collection_replicas``: state, length, available_length per dataset and RSE); the next
   RSE's table is read by a worker thread while this one is parsed (one request at a time,
   the wait for the server's bytes overlapping the parse: :func:`read_ahead`);
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
are parsed (:mod:`.listing`) and its rows updated by the lines added and gone; only the (site,
dataset) pairs whose inputs changed are settled again (:meth:`RucioSource._settle`, by the pure
decisions of :mod:`hydrator.core.presence`); the answer is the last one moved by the delta
(:mod:`.answer`). A fetch that fails half way forgets the book: the next one reads everything.

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

import hashlib
import logging
import time
from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import replace
from typing import TypeVar, cast

from hydrator.adapters.sources import OnceLog
from hydrator.adapters.sources.rucio.answer import Plain, Reuse, complete, held_ids, record
from hydrator.adapters.sources.rucio.badlist import BadReplicas
from hydrator.adapters.sources.rucio.book import (
    FIRST,
    Book,
    Cycle,
    Dataset,
    Dirty,
    HeldWhileDown,
    Outcome,
    Partial,
    RowValue,
    apply_rows,
    complete_at,
    drop_stale_checks,
    fill_rows,
    first_only,
    forget_unlisted,
    moving_or_pending,
    plainly_complete,
    remap,
    repeats,
    rows_at,
)
from hydrator.adapters.sources.rucio.deep import DeepChecks
from hydrator.adapters.sources.rucio.listing import (
    SUMMARY_LINES,
    Lines,
    Mark,
    NotJsonLine,
    diff,
    new_positions,
    parse_lines,
)
from hydrator.adapters.sources.rucio.rules import apply_rules, read_rules
from hydrator.adapters.sources.rucio.sites import RseTable, SiteMap, availability
from hydrator.adapters.sources.rucio.targeted import parent_datasets, read_datasets
from hydrator.adapters.sources.rucio.wire import ClientFactory, RucioWire
from hydrator.config import RucioSourceConfig
from hydrator.core.ports import FetchContext
from hydrator.core.presence import Wait, says_complete, settled, towards
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
from hydrator.names import InvalidNameError

log = logging.getLogger("hydrator.adapters.sources.rucio")

T = TypeVar("T")
K = TypeVar("K")

_MAX_LOGGED_NAMES = 1000  # bad names logged once each, up to this many per source
BULK_SHARE = 4  # a site whose dirty pairs are a quarter of its rows or more: see _settle


def build(config: RucioSourceConfig, sites: Mapping[str, str]) -> RucioSource:
    """The factory the service uses for ``type = "rucio"``; ``sites`` is ``Config.sites``."""
    return RucioSource(config, sites)


class RucioSource:
    """A :class:`~hydrator.core.ports.Source` reading one Rucio server.

    ``sleep`` is the backoff clock (seconds); ``client_factory`` replaces building a
    rucio-clients ``Client`` (tests; see :class:`~.wire.RucioWire`); ``bulk_share`` is the
    share of a site's rows that, dirty, makes it settle its plainly complete pairs in one
    batch (:meth:`_settle`). After each fetch, ``calls_last_fetch`` maps client method ->
    API calls made (retries included) and ``deep_checks_last_fetch`` /
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
        self._bulk_share = bulk_share
        self._bad_names = OnceLog(log, _MAX_LOGGED_NAMES)
        self._book = Book()  # what the last fetch learned (the incremental design)
        self._held_while_down = HeldWhileDown()  # what unavailable RSEs held
        self._held_ids: dict[tuple[str, str], DatasetId] = {}  # during a fetch: held_ids
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
        self._bad.config = config

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
        self._held_ids = held_ids(book, context.previous.get(self.name))
        try:
            self.wire.refresh()
            table = self._sites.read(self.wire, book.rses, context.now, context.drains)
            cycle = Cycle(table, invalid=table.invalid)
            dirty = Dirty()
            statuses = self._held_while_down.update(book, table, context.wanted, self._held_at)
            remap(book, cycle.table, dirty)
            self._read_summaries(book, cycle, dirty)
            read_rules(self.wire, book, cycle, dirty)
            apply_rules(self.wire, book, cycle, dirty)
            self._bad.read(self.wire, book, cycle, dirty)
            settled = self._settle(book, cycle, dirty, context)
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
            self._held_ids = {}
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
            return self._held_while_down.update(self._book, now, context.wanted, self._held_at)
        finally:
            self.calls_last_read = self.wire.calls
            self.wire.end()

    # -- summaries -----------------------------------------------------------------------

    def _read_summaries(self, book: Book, cycle: Cycle, dirty: Dirty) -> None:
        """Every mapped RSE's summary table, compared with its last answer: an identical
        answer (same SHA-256) costs its transfer and a hash; otherwise only its new lines are
        parsed, and each row added, changed or gone marks its (site, dataset) dirty.

        The next RSE's answer is read in a thread while this one is parsed (:func:`read_ahead`):
        one request at a time as before, none left running when this returns or raises."""
        rses = sorted(cycle.sites)
        with ThreadPoolExecutor(1, thread_name_prefix="rucio-read") as reader:
            for rse, body in zip(rses, read_ahead(reader, self.wire.summary, rses), strict=True):
                self._summary(body, book, cycle, dirty, rse)

    def _summary(self, body: bytes, book: Book, cycle: Cycle, dirty: Dirty, rse: str) -> None:
        """One RSE's answer (:meth:`_read_summaries`)."""
        digest = hashlib.sha256(body).digest()
        listing = book.listings.get(rse)
        if listing is None or listing.digest != digest:
            try:
                listing = self._summary_listing(
                    body, listing, book, rse=rse, site=cycle.sites[rse], dirty=dirty
                )
            except NotJsonLine as exc:  # its position in the answer, read only now
                raise exc.at(body) from exc
            listing.digest = digest
            book.listings[rse] = listing
        cycle.invalid += listing.invalid

    def _summary_listing(
        self,
        body: bytes,
        old: Lines[RowValue | Mark] | None,
        book: Book,
        *,
        rse: str,
        site: Site,
        dirty: Dirty,
    ) -> Lines[RowValue | Mark]:
        """One RSE's new answer applied to its rows: line by line against ``old`` when that is
        exact, else read whole (the first time, or when the RSE named a dataset twice)."""
        lines = list(dict.fromkeys(filter(None, body.splitlines())))  # identical lines once
        hashes = array("q", map(hash, lines))
        changed = diff(old, hashes)
        if changed is not None and old is not None:  # (diff gives None without an old)
            values, gone = changed
            fresh = new_positions(values)
            added = self._row_values([lines[i] for i in fresh], book, dirty, rse)
            for i, value in zip(fresh, added, strict=True):
                values[i] = value
            if not repeats(added, gone, rse):
                apply_rows(rse, added, gone, site, dirty)
                listing = Lines(hashes, cast(list[RowValue | Mark], values))  # no New left
                listing.listed = old.listed + _listed(added) - _listed(gone)  # O(delta)
                return listing
        values_all = self._row_values(lines, book, dirty, rse)
        if old is None:  # a first read (no row there yet): one pass instead of the two below
            return Lines(hashes, values_all, unique=fill_rows(rse, values_all, site, dirty))
        unique = first_only(values_all)
        apply_rows(rse, values_all, old.values, site, dirty)
        return Lines(hashes, values_all, unique=unique)

    def _held_at(self, rse: str) -> frozenset[DatasetId]:
        """The datasets ``rse``'s summary table lists (in scope, valid names; one request):
        what an RSE already down when this source started holds (:class:`~.book.HeldWhileDown`)."""
        lines = list(filter(None, self.wire.summary(rse).splitlines()))
        held: set[DatasetId] = set()
        for row in parse_lines(
            SUMMARY_LINES, lines, f"the dataset summary of RSE {rse} (list_datasets_per_rse)"
        ):
            if isinstance(row, Mark) or (
                self.config.scopes and row["scope"] not in self.config.scopes
            ):
                continue
            try:
                held.add(DatasetId(row["scope"], row["name"]))
            except InvalidNameError:
                continue  # no job can want it (its name is refused there too)
        return frozenset(held)

    def _row_values(
        self, lines: list[bytes], book: Book, dirty: Dirty, rse: str
    ) -> list[RowValue | Mark]:
        """What each of RSE ``rse``'s summary lines gives: its dataset alone when the row says
        complete, its counts otherwise, or a mark (malformed or invalid: counted; out of
        scope: skipped); :class:`~.listing.NotJsonLine` for a line that is not JSON."""
        out: list[RowValue | Mark] = []
        known = book.datasets
        what = f"the dataset summary of RSE {rse} (list_datasets_per_rse)"
        for row in parse_lines(SUMMARY_LINES, lines, what):
            if isinstance(row, Mark):
                out.append(row)
                continue
            dataset = known.get((row["scope"], row["name"])) or self._known(
                row["scope"], row["name"], book, dirty
            )
            if isinstance(dataset, Mark):
                out.append(dataset)
                continue
            length, available = row.get("length") or 0, row.get("available_length") or 0
            if says_complete(row["state"], length, available):
                out.append(dataset)
            else:
                size, present = row.get("bytes") or 0, row.get("available_bytes") or 0
                out.append(Partial.of(dataset, length, available, size, present))
        return out

    def _known(self, scope: str, name: str, book: Book, dirty: Dirty) -> Dataset | Mark:
        """The one :class:`~.book.Dataset` for ``scope:name``, made on first sight (its id
        the held replicas' one, if any: :func:`~.answer.held_ids`); a mark when out of scope
        (skipped) or invalid (counted, logged once per name)."""
        key = (scope, name)
        found = book.datasets.get(key)
        if found is not None:
            return found
        if self.config.scopes and scope not in self.config.scopes:
            return Mark.SKIPPED
        try:
            dataset = self._held_ids.get(key) or DatasetId(scope, name)
        except InvalidNameError as exc:
            self._bad_names.warn(
                f"{scope}:{name}", "rucio: skipping a dataset with an invalid name: %s", exc
            )
            return Mark.INVALID
        found = book.datasets[dataset] = Dataset(dataset, dataset)  # equal to key, no copy
        dirty.datasets.add(found)  # forgotten again at the end if no row keeps it
        return found

    # -- settling pairs ------------------------------------------------------------------

    def _settle(
        self, book: Book, cycle: Cycle, dirty: Dirty, context: FetchContext
    ) -> Iterator[Outcome | Plain]:
        """The new replica of each dirty pair the summary or one rule's locks settle
        (:func:`hydrator.core.presence.settled`); the others join ``book.pending`` and are
        answered by the deep checks (:meth:`.deep.DeepChecks.run`), with the pending pairs
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
            if len(datasets) * self._bulk_share >= sum(map(len, tables)):
                exempt = moving_or_pending(book) if exempt is None else exempt
                plain = plainly_complete(tables, datasets, exempt.get(site, set()))
                yield Plain(site, plain)
                datasets.difference_update(plain)
            yield from _settle_site(book, site, rses, datasets, waiting)
        # by site, as the loop above: a restarted fetch's Reuse then builds a site's table
        # once more at most, not once per outcome
        checked = self._deep.run(book, cycle, waiting, context.now, context.wanted)
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


def _listed(values: Iterable[RowValue | Mark]) -> int:
    """How many of ``values`` are rows (not marks)."""
    return sum(not isinstance(value, Mark) for value in values)


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


def read_ahead(reader: Executor, read: Callable[[K], T], keys: Sequence[K]) -> Iterator[T]:
    """``read(key)`` for each of ``keys`` in order, the next one running in ``reader`` (one
    worker) while the caller works on this one: its wait for the server's bytes overlaps the
    caller's parsing. Only one ``read`` runs at a time, and the caller makes no call while it
    runs. A failed ``read`` raises here, in its turn; the one already started after it ends
    with ``reader`` (shut down by the caller's ``with``), and its answer is dropped."""
    if not keys:
        return
    ahead = reader.submit(read, keys[0])
    for key in keys[1:]:
        done, ahead = ahead, reader.submit(read, key)
        yield done.result()
    yield ahead.result()
