"""What a save writes, every row of it (:func:`write_plan`, inside the transaction of
:meth:`~hydrator.adapters.state.sqlite.SqliteStateStore.save`): replica rows in key order with
their first-seen times (the hot path), one status row per source (``sources``) and each
source's storage statuses as stored (``storages``).

``first_seen`` (epoch seconds, or NULL) is the (site, dataset)'s first-seen time, which belongs to
the pair across sources and lives only here (the daemon never holds it in memory): a save writes the
row of a pair that no row of a source the plan knows held before with the plan's
:attr:`~hydrator.core.plan.Plan.now`, and any other row (a second source's row of the pair, a row
rewritten because its replica changed, a pair moving between sources) with the earliest valid time
the pair's rows already hold (NULL if they hold none), so every source's row of a pair holds the
same time, and a pair gone from every source loses it with its last row.
:meth:`~.sqlite.SqliteStateStore.first_seen` reads them back (the earliest valid time of each pair's
rows; a row's NULL or invalid time counts as none).

Rows are written in the table's key order (a B-tree filled in order touches each page once;
a set's hash order rewrites pages all over the file: docs/performance.md), built by C-level
iterators; a save into an empty table (a first cycle) stamps every row with the plan's time
without looking up its pair, and writes :data:`ROWS_PER_INSERT` rows to a statement. A load
reads the replica rows in one pass (no join) and builds each source's index as it goes; it
checks each row's first-seen time (an invalid one is counted) but keeps none.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import datetime
from itertools import chain, filterfalse, islice, repeat
from operator import attrgetter
from typing import Any

from hydrator.adapters.state.schema import VALID_FIRST_SEEN
from hydrator.core.index import replica_key
from hydrator.core.plan import Plan, SourceDelta
from hydrator.domain import Replica, SourceState, StorageStatus


def epoch(when: datetime | None) -> float | None:
    return None if when is None else when.timestamp()


# Row columns read at C speed (no Python call per row): a replica's key, its presence, its
# detail; an enum as its value, through the members' plain ``text`` attribute.
_KEY = (attrgetter("site"), attrgetter("dataset.scope"), attrgetter("dataset.name"))
_PRESENCE = (attrgetter("state.text"), attrgetter("fraction"))
_DETAIL_OF = attrgetter("detail")
_DETAIL = tuple(attrgetter(f"detail.{c}") for c in ("transfer.text", "progress", "bytes_fraction"))
# A row's own parameters; a plain record's bytes share is its ``fraction`` parameter again
_PLAIN_COLUMNS = (*_KEY, *_PRESENCE)
_DETAILED_COLUMNS = (*_KEY, *_PRESENCE, *_DETAIL)
ROWS_PER_INSERT = 100
"""Rows per ``INSERT`` statement (a multi-row ``VALUES`` list): one statement step binds and
writes them all, where one row per step spends as much again in ``executemany``'s per-row
round (docs/performance.md)."""


def write_plan(db: sqlite3.Connection, plan: Plan) -> int:
    """Write what ``plan`` changes, in the caller's transaction: every source's new replica
    rows first (each takes its pair's time from the rows still there: a pair moving from one
    source to another, or a replica that changed, keeps it), then the rows of the replicas
    gone, then the ``sources`` and ``storages`` rows anew. Returns the replica rows written; a
    changed replica counts two (its old row's delete and its new row's insert, done as one
    replace)."""
    written = 0
    deltas = plan.source_deltas
    empty = db.execute("SELECT 1 FROM replicas LIMIT 1").fetchone() is None
    stamp = FirstSeen(plan.now, None if empty else sorted({*plan.state.sources, *deltas}))
    for source, delta in deltas.items():
        written += insert_replicas(db, source, delta.added, stamp)
    for source, delta in deltas.items():
        written += delete_replicas(db, source, delta)
    write_sources(db, plan.state.sources.values())
    write_storages(db, plan.state.sources.values())
    return written


class FirstSeen:
    """The ``INSERT`` statements of a save's new rows, with their first-seen column: the
    cycle's time (``now``, epoch seconds) for a pair no row holds yet, else the earliest valid
    time the pair's rows hold (NULL where they hold none). ``sources``: the sources whose rows
    may hold the pair (an ``IN`` list, so that each lookup is a few probes of the table's
    key); None for an empty table, where every row is new (no lookup).

    A statement's parameters: :meth:`shared` (the rows' source, ``now``, the source names),
    then each row's own columns in turn (:data:`_PLAIN_COLUMNS` or :data:`_DETAILED_COLUMNS`)."""

    def __init__(self, now: datetime, sources: Sequence[str] | None) -> None:
        self._now = now.timestamp()
        self._sources = sources

    def shared(self, source: str) -> tuple[Any, ...]:
        return (source, self._now, *(self._sources or ()))

    @property
    def rows_per_insert(self) -> int:
        """Rows to a statement: :data:`ROWS_PER_INSERT` into an empty table; one where each
        row looks its pair up (many such rows to a statement are slower: docs/performance.md)."""
        return ROWS_PER_INSERT if self._sources is None else 1

    def insert(self, detailed: bool, rows: int) -> str:
        """An ``INSERT OR REPLACE`` of ``rows`` rows of one kind (plain or ``detailed``)."""
        width = len(_DETAILED_COLUMNS if detailed else _PLAIN_COLUMNS)
        first = len(self.shared("")) + 1
        values = []
        for row in range(rows):
            p = [f"?{first + row * width + i}" for i in range(width)]
            transfer = p[5:8] if detailed else ["'none'", "0.0", p[4]]
            values.append(f"(?1, {', '.join(p[:5])}, {', '.join(transfer)}, {self._at(*p[:3])})")
        return "INSERT OR REPLACE INTO replicas VALUES " + ", ".join(values)

    def _at(self, site: str, scope: str, name: str) -> str:
        """The first-seen column of the row whose key is the parameters named."""
        if self._sources is None:
            return "?2"
        names = ", ".join(f"?{3 + i}" for i in range(len(self._sources)))
        return (
            f"(SELECT CASE WHEN count(*) THEN min({VALID_FIRST_SEEN}) ELSE ?2 END"
            f" FROM replicas WHERE source IN ({names}) AND site = {site} AND scope = {scope}"
            f" AND name = {name})"
        )


def rows(
    items: Sequence[Any],
    lead: tuple[Any, ...] = (),
    getters: Iterable[Callable[[Any], Any]] = _KEY,
) -> Iterator[tuple[Any, ...]]:
    """One row per item: the ``lead`` constants, then one column per getter; built by C-level
    iterators, not a Python loop per row."""
    columns = [*(repeat(value) for value in lead), *(map(get, items) for get in getters)]
    return zip(*columns, strict=False)  # the repeats never end; the items' columns do


def in_key_order(replicas: Iterable[Replica]) -> list[Replica]:
    """``replicas`` sorted as the table's key (site, scope, name): a B-tree filled in key order
    touches each page once, while a set's hash order rewrites pages all over the file. Three
    stable sorts by one attribute each, whose keys
    are the strings the replicas hold already."""
    ordered = sorted(replicas, key=_KEY[2])
    ordered.sort(key=_KEY[1])
    ordered.sort(key=_KEY[0])
    return ordered


def delete_replicas(db: sqlite3.Connection, source: str, delta: SourceDelta) -> int:
    """Delete the rows of ``delta``'s removed replicas, after its added ones were written:
    a row a changed replica's new one replaced stays. Returns the removed replicas' count."""
    gone: Iterable[Replica] = delta.removed
    if delta.added and delta.removed:
        written = set(map(replica_key, delta.added))
        gone = [r for r in delta.removed if replica_key(r) not in written]
    ordered = in_key_order(gone)
    db.executemany(
        "DELETE FROM replicas WHERE source=? AND site=? AND scope=? AND name=?",
        rows(ordered, lead=(source,)),
    )
    return len(delta.removed)


def insert_replicas(
    db: sqlite3.Connection, source: str, replicas: Iterable[Replica], stamp: FirstSeen
) -> int:
    """Write ``replicas`` as rows of ``source``, each with its pair's first-seen time
    (:class:`FirstSeen`); a plain record (no :class:`~hydrator.domain.Detail`) is stored as its
    properties read: no transfer, progress 0, bytes share = files share."""
    ordered = in_key_order(replicas)
    plain = list(filterfalse(_DETAIL_OF, ordered))  # a Detail is a non-empty tuple: true
    detailed = list(filter(_DETAIL_OF, ordered))
    _insert_rows(db, stamp, source, plain, detailed=False)
    _insert_rows(db, stamp, source, detailed, detailed=True)
    return len(ordered)


def _insert_rows(
    db: sqlite3.Connection,
    stamp: FirstSeen,
    source: str,
    replicas: Sequence[Replica],
    *,
    detailed: bool,
) -> None:
    """``replicas`` (all plain or all ``detailed``) in statements of
    :attr:`FirstSeen.rows_per_insert` rows and one of the rest; their parameters flattened by
    C-level iterators (a Python step per statement, none per row)."""
    getters = _DETAILED_COLUMNS if detailed else _PLAIN_COLUMNS
    shared = stamp.shared(source)
    per = stamp.rows_per_insert
    if per == 1:  # one row to a statement: its parameters are the row
        db.executemany(stamp.insert(detailed, 1), rows(replicas, shared, getters))
        return
    flat = chain.from_iterable(rows(replicas, getters=getters))
    full, rest = divmod(len(replicas), per)
    if full:
        statements = ((*shared, *islice(flat, len(getters) * per)) for _ in range(full))
        db.executemany(stamp.insert(detailed, per), statements)
    if rest:
        db.execute(stamp.insert(detailed, rest), (*shared, *flat))


def write_sources(db: sqlite3.Connection, sources: Iterable[SourceState]) -> None:
    """Replace the ``sources`` rows, one per source of the state (a handful of rows; dropped
    sources go too)."""
    db.execute("DELETE FROM sources")
    for s in sources:
        db.execute(
            "INSERT OR REPLACE INTO sources VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                s.name,
                epoch(s.last_success),
                epoch(s.last_attempt),
                int(s.stale),
                s.error,
                s.held_cycles,
                json.dumps(sorted(s.sites)),
            ),
        )


def write_storages(db: sqlite3.Connection, sources: Iterable[SourceState]) -> None:
    """Replace the ``storages`` rows: one per source with storage statuses, as JSON."""
    db.execute("DELETE FROM storages")
    db.executemany(
        "INSERT INTO storages VALUES (?, ?)",
        [
            (s.name, json.dumps([status_json(status) for status in s.storages]))
            for s in sources
            if s.storages
        ],
    )


def status_json(status: StorageStatus) -> dict[str, Any]:
    """A storage status as stored: one element of a ``storages`` row's ``statuses`` list."""
    return {
        "site": status.site,
        "storage": status.storage,
        "kind": status.kind,
        "available": status.available,
        "reason": status.reason,
        "until": epoch(status.until),
        "upcoming": status.upcoming,
        "wanted": status.wanted,
    }
