"""The Rucio source's summary tables: each mapped RSE's ``list_datasets_per_rse`` answer
(``collection_replicas``: state, length, available_length per dataset) read against the last
one, and what its rows say put in the book.

An answer byte-identical to the last (SHA-256) costs its transfer and a hash; otherwise only
its new lines are parsed (:mod:`.listing`) and the book's rows moved by the lines added and
gone (:func:`~.book.apply_rows`), each row added, changed or gone marking its (site, dataset)
dirty. The next RSE's table is read by a worker thread while this one is parsed, one request
at a time (:func:`read_ahead`).
"""

from __future__ import annotations

import hashlib
import logging
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import TypeVar, cast

from hydrator.adapters.sources.rucio.book import (
    Book,
    Cycle,
    Dataset,
    Dirty,
    Partial,
    RowValue,
    apply_rows,
    fill_rows,
    first_only,
    repeats,
)
from hydrator.adapters.sources.rucio.listing import (
    SUMMARY_LINES,
    Lines,
    Mark,
    NotJsonLine,
    diff,
    new_positions,
    parse_lines,
)
from hydrator.adapters.sources.rucio.wire import RucioWire
from hydrator.config import RucioSourceConfig
from hydrator.core.presence import says_complete
from hydrator.domain import DatasetId, Site
from hydrator.logs import ProblemLog
from hydrator.names import InvalidNameError

log = logging.getLogger("hydrator.adapters.sources.rucio")

T = TypeVar("T")
K = TypeVar("K")

_MAX_LOGGED_NAMES = 1000  # bad names logged once each, up to this many per source


class Summaries:
    """One source's reader of the summary tables, through its ``wire`` under its ``config``
    (set anew by the source when it changes). ``held_ids``, set by the source for the length
    of a fetch: the dataset ids its held replicas use (:func:`~.answer.held_ids`), which a
    dataset seen for the first time takes."""

    def __init__(self, config: RucioSourceConfig, wire: RucioWire) -> None:
        self.config = config
        self.wire = wire
        self.held_ids: dict[tuple[str, str], DatasetId] = {}
        self._bad_names: ProblemLog[str] = ProblemLog(
            log, limit=_MAX_LOGGED_NAMES, once_per_process=True
        )

    def read(self, book: Book, cycle: Cycle, dirty: Dirty) -> None:
        """Every mapped RSE's summary table, compared with its last answer: an identical
        answer (same SHA-256) costs its transfer and a hash; otherwise only its new lines are
        parsed, and each row added, changed or gone marks its (site, dataset) dirty.

        The next RSE's answer is read in a thread while this one is parsed (:func:`read_ahead`):
        one request at a time as before, none left running when this returns or raises."""
        rses = sorted(cycle.sites)
        with ThreadPoolExecutor(1, thread_name_prefix="rucio-read") as reader:
            for rse, body in zip(rses, read_ahead(reader, self.wire.summary, rses), strict=True):
                self._summary(body, book, cycle, dirty, rse)

    def held_at(self, rse: str) -> frozenset[DatasetId]:
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

    def _summary(self, body: bytes, book: Book, cycle: Cycle, dirty: Dirty, rse: str) -> None:
        """One RSE's answer (:meth:`read`)."""
        digest = hashlib.sha256(body).digest()
        listing = book.listings.get(rse)
        if listing is None or listing.digest != digest:
            try:
                listing = self._listing(
                    body, listing, book, rse=rse, site=cycle.sites[rse], dirty=dirty
                )
            except NotJsonLine as exc:  # its position in the answer, read only now
                raise exc.at(body) from exc
            listing.digest = digest
            book.listings[rse] = listing
        cycle.invalid += listing.invalid

    def _listing(
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
            dataset = self.held_ids.get(key) or DatasetId(scope, name)
        except InvalidNameError as exc:
            self._bad_names.problem(
                f"{scope}:{name}", "rucio: skipping a dataset with an invalid name: %s", exc
            )
            return Mark.INVALID
        found = book.datasets[dataset] = Dataset(dataset, dataset)  # equal to key, no copy
        dirty.datasets.add(found)  # forgotten again at the end if no row keeps it
        return found


def _listed(values: Iterable[RowValue | Mark]) -> int:
    """How many of ``values`` are rows (not marks)."""
    return sum(not isinstance(value, Mark) for value in values)


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
