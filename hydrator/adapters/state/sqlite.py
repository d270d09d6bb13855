"""The state store: the last good state, in one SQLite file (stdlib ``sqlite3``).

One transaction per cycle (``BEGIN IMMEDIATE`` … ``COMMIT``) in WAL mode, so a kill at any
moment leaves the old state or the new one, never a mix. A cycle writes only what changed: the
replica rows in the plan's source deltas and one status row per source. A cycle with no change
writes no replica rows.

Schema version 4::

    meta(key, value)                      schema_version
    sources(name, last_success, last_attempt, stale, error, held_cycles, sites)
    storages(source, statuses)            the last good answer's storage statuses (JSON)
    replicas(source, site, scope, name, state, fraction,      last good snapshot per source
             transfer, progress, bytes_fraction, first_seen)
    drains(site, storage, reason, since, until)      operator drains (``hydrator drain``)

``drains`` is the one table written by another process than the daemon: ``hydrator drain`` and
``undrain`` write it in a transaction of their own (:func:`set_drain`, :func:`remove_drain`)
without the writer lock, which the running daemon holds; the daemon reads it at the start of
every cycle (:meth:`SqliteStateStore.drains`), so a drain takes effect within one cycle and
outlives restarts, also ``--reset-state``, which moves the file aside but keeps the drains
(:func:`reset_state`).

``first_seen`` (epoch seconds, or NULL) is the (site, dataset)'s first-seen time, which
belongs to the pair across sources and lives only here (the daemon never holds it in memory):
a save writes the row of a pair that no row of a source the plan knows held before with the
plan's :attr:`~hydrator.core.plan.Plan.now`, and any other row (a second source's row of the
pair, a row rewritten because its replica changed, a pair moving between sources) with the
earliest valid time the pair's rows already hold (NULL if they hold none), so every
source's row of a pair holds the same time, and a pair gone from every source loses it with
its last row. :meth:`SqliteStateStore.first_seen` reads them back (the earliest valid time of
each pair's rows; a row's NULL or invalid time counts as none).

Rows are written in the table's key order (a B-tree filled in order touches each page once;
a set's hash order costs about three times as much on a large save), built by C-level
iterators; a save into an empty table (a first cycle) stamps every row with the plan's time
without looking up its pair, and writes :data:`_ROWS_PER_INSERT` rows to a statement. A load
reads the replica rows in one pass (no join) and builds each source's index as it goes; it
checks each row's first-seen time (an invalid one is counted) but keeps none.

One writer: a writer holds an exclusive ``flock`` on ``<state>.lock`` (:class:`StateLock`, the
file holds its PID; the kernel drops the lock when the process ends, even by SIGKILL). Readers
(``hydrator show``, ``once --dry-run``) open the database read-only and take no lock.

Nothing read back is trusted: every row is checked with the rules fresh input meets
(:class:`~hydrator.domain.DatasetId`, :func:`~hydrator.domain.check_site`); a row that fails is
counted in :attr:`SqliteStateStore.rejected_rows`, logged once per load, and never used (a
replica row whose only fault is its first-seen time keeps its replica and counts under
``first_seen``). A file that exists but is empty or not a hydrator database is an error, never
an empty start.

Older files are upgraded when a writer opens them, in one transaction (:func:`_migrate`: a
kill or an error leaves the old file as it was, migrated again at the next start); a reader
reads their rows through the same query (:data:`_ROWS_OF`) and writes nothing.

* Version 3 (up to the issue-24 release) had no ``drains`` and ``storages`` tables: both are
  added empty (no drain; the next answer of each source states its storage).
* Version 2 (up to befc475) kept first-seen times in a table of their own,
  ``first_seen(site, scope, name, at)``: each replica row takes its pair's time; a time of no
  replica row (a pair no source reports) is dropped, as the core never reads it.
* Version 1 (up to f139dde) had one state per replica that mixed presence and transfer:
  ``replicating``/``stuck`` rows carried the rule's progress in ``fraction``. They become
  absent-with-a-transfer (``fraction`` 0, ``progress`` the old fraction), partial rows get
  ``bytes_fraction`` = their file fraction. Every advertised list, and so every site digest,
  stays as it was: the first cycle after an upgrade sends updates only where the sources'
  answer changes a list.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import sqlite3
import time
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from itertools import chain, filterfalse, islice, repeat
from operator import attrgetter
from pathlib import Path
from typing import Any

from hydrator.config import SOURCE_NAME_PATTERN
from hydrator.core.derived import Derived
from hydrator.core.index import replica_key
from hydrator.core.plan import Plan, SourceDelta
from hydrator.core.storage import Drain, clean_text
from hydrator.core.views import views_of
from hydrator.domain import (
    DatasetId,
    Detail,
    Replica,
    ReplicaState,
    Site,
    SourceState,
    State,
    StorageStatus,
    Transfer,
    check_site,
)
from hydrator.errors import StateError
from hydrator.names import STORAGE_PATTERN, InvalidNameError

log = logging.getLogger(__name__)

Key = tuple[Site, DatasetId]

SCHEMA_VERSION = 4

_REPLICAS_TABLE = """
CREATE TABLE {name} (
    source TEXT NOT NULL, site TEXT NOT NULL, scope TEXT NOT NULL, name TEXT NOT NULL,
    state TEXT NOT NULL, fraction REAL NOT NULL,
    transfer TEXT NOT NULL DEFAULT 'none', progress REAL NOT NULL DEFAULT 0,
    bytes_fraction REAL NOT NULL DEFAULT 1, first_seen REAL,
    PRIMARY KEY (source, site, scope, name)) WITHOUT ROWID;
"""
_STORAGE_TABLES = """
CREATE TABLE IF NOT EXISTS drains (
    site TEXT NOT NULL, storage TEXT NOT NULL, reason TEXT NOT NULL, since REAL NOT NULL,
    until REAL, PRIMARY KEY (site, storage));
CREATE TABLE IF NOT EXISTS storages (source TEXT PRIMARY KEY, statuses TEXT NOT NULL);
"""
_SCHEMA = (
    """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE sources (
    name TEXT PRIMARY KEY, last_success REAL, last_attempt REAL, stale INTEGER NOT NULL,
    error TEXT, held_cycles INTEGER NOT NULL, sites TEXT NOT NULL);
"""
    + _REPLICAS_TABLE.format(name="replicas")
    + _STORAGE_TABLES
)
# What rejected_rows counts, by table: ``first_seen`` counts the invalid first-seen times of
# replica rows (the table of schema 2; the label stays for the metric's series).
TABLES = ("replicas", "sources", "first_seen", "drains")
# The tables each schema version has (the versions this hydrator reads)
_VERSION_TABLES = {
    "1": {"meta", "sources", "replicas", "first_seen"},
    "2": {"meta", "sources", "replicas", "first_seen"},
    "3": {"meta", "sources", "replicas"},
    str(SCHEMA_VERSION): {"meta", "sources", "replicas", "drains", "storages"},
}
WHAT_TO_DO = "move it away (keep it to inspect) or start `hydrator run|once --reset-state`"


def _epoch(when: datetime | None) -> float | None:
    return None if when is None else when.timestamp()


class StateLock:
    """The one-writer lock: an exclusive ``flock`` on ``<state>.lock``, which holds the PID.

    Raises :class:`StateError` naming the holder's PID when another process holds it. The lock
    file stays (removing it would let two processes lock two different files); the lock itself
    goes with the file descriptor: :meth:`release`, process exit, or SIGKILL.
    """

    def __init__(self, state_path: Path) -> None:
        self.path = state_path.with_name(state_path.name + ".lock")
        try:
            self._fd: int | None = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise StateError(f"state lock {self.path}: cannot open: {exc.strerror}") from exc
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(self._fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
            self.release()
            raise StateError(
                f"state {state_path} is in use by another hydrator (pid {holder}, lock "
                f"{self.path}): stop it first; `hydrator show` and `once --dry-run` only read"
            ) from None
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, f"{os.getpid()}\n".encode(), 0)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def reset_state(path: Path, now: datetime) -> Path | None:
    """Move the state file (and its ``-wal``/``-shm``) aside to ``<path>.reset-<UTC time>``, so
    the next open starts with no replica state; return the new name, or None if there was no
    file. The operator's drains are kept (written into a new state file): resetting what the
    catalogues said does not undo what the operator decided. Drains that cannot be read (a
    damaged file) are lost, with a warning. Call it only while holding the :class:`StateLock`."""
    if not path.exists():
        return None
    drains = _readable_drains(path)
    kept = path.with_name(f"{path.name}.reset-{now.astimezone(UTC).strftime('%Y%m%dT%H%M%SZ')}")
    try:
        for suffix in ("-wal", "-shm", ""):  # the database last: its name marks completion
            side = path.with_name(path.name + suffix)
            if side.exists():
                side.rename(kept.with_name(kept.name + suffix))
    except OSError as exc:
        raise StateError(f"state database {path}: cannot move it aside: {exc.strerror}") from exc
    if drains:
        SqliteStateStore(path).close()  # a new empty state, under the caller's lock
        for drain in drains:
            set_drain(path, drain)
    log.warning(
        "state database %s moved to %s (--reset-state): starting empty, %d operator drain(s) kept",
        path,
        kept,
        len(drains),
    )
    return kept


def _readable_drains(path: Path) -> list[Drain]:
    """The drains saved in the state at ``path``; none (with a warning) if it is unreadable."""
    try:
        store = SqliteStateStore(path, read_only=True)
        try:
            return store.drains()
        finally:
            store.close()
    except StateError as exc:
        log.warning("--reset-state: the operator's drains cannot be read, not kept: %s", exc)
        return []


class SqliteStateStore:
    """:class:`~hydrator.core.ports.StateStore` on a SQLite file; the parent directory must
    exist and be writable.

    ``read_only``: opened with ``mode=ro`` (a missing file loads as an empty state and is not
    created; :meth:`save` raises). ``lock``: the writer's :class:`StateLock`, released by
    :meth:`close`. A new database is built under a temporary name and renamed into place, so
    a crash while creating it never leaves an empty file behind.
    """

    def __init__(
        self, path: Path, *, read_only: bool = False, lock: StateLock | None = None
    ) -> None:
        self.path = path
        self.read_only = read_only
        self._lock = lock
        self._rejected = dict.fromkeys(TABLES, 0)
        self._db: sqlite3.Connection | None = None
        self._version = str(SCHEMA_VERSION)  # an older file opened read-only stays older
        try:
            if path.exists():
                _check_file(path, writable=not read_only)
            if read_only:
                if path.exists():
                    self._db = self._connect(f"file:{urllib.parse.quote(str(path))}?mode=ro")
                    self._check_schema()
                return
            if not path.exists():
                self._create()
            self._db = self._connect(str(path))
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._check_schema()
        except (sqlite3.Error, OSError) as exc:
            raise StateError(f"state database {path}: {_reason(exc)}; {WHAT_TO_DO}") from exc
        except StateError:
            self.close()
            raise

    @staticmethod
    def _connect(target: str) -> sqlite3.Connection:
        uri = target.startswith("file:")
        return sqlite3.connect(target, isolation_level=None, check_same_thread=False, uri=uri)

    def _create(self) -> None:
        """A complete, empty database at :attr:`path`, appearing at once (rename)."""
        temporary = self.path.with_name(f".{self.path.name}.new-{os.getpid()}")
        temporary.unlink(missing_ok=True)
        db = self._connect(str(temporary))
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.executescript(
                f"BEGIN; {_SCHEMA} INSERT INTO meta VALUES "
                f"('schema_version', '{SCHEMA_VERSION}'); COMMIT;"
            )
        finally:
            db.close()
        for suffix in ("-wal", "-shm"):  # left by a deleted database: never replay them here
            self.path.with_name(self.path.name + suffix).unlink(missing_ok=True)
        temporary.rename(self.path)

    def _check_schema(self) -> None:
        """Refuse a file that is no hydrator state or of an unknown version; a writer
        migrates an older version (:func:`_migrate`), a reader reads it as it is."""
        assert self._db is not None
        tables = {r[0] for r in self._db.execute("SELECT name FROM sqlite_master")}
        if not {"meta", "sources", "replicas"} <= tables:
            raise StateError(f"state database {self.path} is not a hydrator state; {WHAT_TO_DO}")
        row = self._db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        version = None if row is None else row[0]
        if version not in _VERSION_TABLES:
            raise StateError(
                f"state database {self.path} has schema version {version}; this hydrator "
                f"reads version {SCHEMA_VERSION} (and upgrades versions 1 to 3)"
            )
        if not _VERSION_TABLES[version] <= tables:
            raise StateError(f"state database {self.path} is not a hydrator state; {WHAT_TO_DO}")
        self._version = version
        if version != str(SCHEMA_VERSION) and not self.read_only:
            _migrate(self._db, version, self.path)
            self._version = str(SCHEMA_VERSION)

    @property
    def rejected_rows(self) -> Mapping[str, int]:
        return dict(self._rejected)

    def load(self) -> Derived:
        """The saved state (empty on a new database); invalid rows are left out."""
        if self._db is None:
            return Derived(State())
        try:
            loader = _Loader()
            state = loader.load(self._db, _ROWS_OF[self._version])
        except (sqlite3.Error, ValueError, KeyError) as exc:
            raise StateError(f"state database {self.path} unreadable: {exc}; {WHAT_TO_DO}") from exc
        self._rejected = loader.rejected
        total = sum(loader.rejected.values())
        if total:
            counts = ", ".join(f"{t}: {n}" for t, n in loader.rejected.items() if n)
            log.warning(
                "state database %s: %d invalid row(s) ignored (%s), e.g. %s",
                self.path,
                total,
                counts,
                loader.first_problem,
            )
        return state

    def save(self, plan: Plan) -> int:
        if self._db is None or self.read_only:
            raise StateError(f"state database {self.path} is open read-only")
        try:
            return self._save(self._db, plan)
        except sqlite3.Error as exc:
            self._rollback()
            raise StateError(f"state database {self.path} not written: {exc}") from exc
        except BaseException:  # a bug or an interrupt mid-write: the open transaction goes too
            self._rollback()
            raise

    def _rollback(self) -> None:
        if self._db is not None and self._db.in_transaction:
            self._db.execute("ROLLBACK")

    def _save(self, db: sqlite3.Connection, plan: Plan) -> int:
        """Every source's new rows first (each takes its pair's time from the rows still
        there: a pair moving from one source to another, or a replica that changed, keeps
        it), then the rows of the replicas gone. A changed replica counts two rows written
        (its old row's delete and its new row's insert, done as one replace)."""
        written = 0
        db.execute("BEGIN IMMEDIATE")
        deltas = plan.source_deltas
        empty = db.execute("SELECT 1 FROM replicas LIMIT 1").fetchone() is None
        stamp = _FirstSeen(plan.now, None if empty else sorted({*plan.state.sources, *deltas}))
        for source, delta in deltas.items():
            written += _insert(db, source, delta.added, stamp)
        for source, delta in deltas.items():
            written += _delete(db, source, delta)
        db.execute("DELETE FROM sources")  # a handful of rows; dropped sources go too
        for s in plan.state.sources.values():
            db.execute(
                "INSERT OR REPLACE INTO sources VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    s.name,
                    _epoch(s.last_success),
                    _epoch(s.last_attempt),
                    int(s.stale),
                    s.error,
                    s.held_cycles,
                    json.dumps(sorted(s.sites)),
                ),
            )
        db.execute("DELETE FROM storages")
        db.executemany(
            "INSERT INTO storages VALUES (?, ?)",
            [
                (s.name, json.dumps([_status_json(status) for status in s.storages]))
                for s in plan.state.sources.values()
                if s.storages
            ],
        )
        db.execute("COMMIT")
        return written

    def first_seen(self) -> dict[Key, datetime]:
        """(site, dataset) -> its first-seen time, for every pair whose rows hold a valid one
        (the earliest; rows checked as :meth:`load` checks them, invalid ones left out). For
        inspection: it reads every row, the daemon never calls it."""
        if self._db is None:
            return {}
        try:
            return _Loader().replicas(self._db, _ROWS_OF[self._version], collect=True)[1]
        except (sqlite3.Error, ValueError, KeyError) as exc:
            raise StateError(f"state database {self.path} unreadable: {exc}; {WHAT_TO_DO}") from exc

    def drains(self) -> list[Drain]:
        """The operator's drains as saved (expired ones too: the core ignores them); none
        in a file of an older version (read-only) or a missing one. Invalid rows are left
        out and counted in :attr:`rejected_rows`; raises :class:`StateError` if unreadable."""
        if self._db is None or self._version != str(SCHEMA_VERSION):
            return []
        loader = _Loader()
        try:
            drains = loader.drains(self._db)
        except sqlite3.Error as exc:
            raise StateError(f"state database {self.path}: drains unreadable: {exc}") from exc
        self._rejected["drains"] = loader.rejected["drains"]
        return drains

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None
        if self._lock is not None:
            self._lock.release()
            self._lock = None


# Row columns read at C speed (no Python call per row): a replica's key, its presence, its
# detail. ``_value_`` is the documented attribute behind ``Enum.value`` (a
# Python-level descriptor).
_KEY = (attrgetter("site"), attrgetter("dataset.scope"), attrgetter("dataset.name"))
_PRESENCE = (attrgetter("state._value_"), attrgetter("fraction"))
_DETAIL_OF = attrgetter("detail")
_DETAIL = tuple(
    attrgetter(f"detail.{c}") for c in ("transfer._value_", "progress", "bytes_fraction")
)
# A row's own parameters; a plain record's bytes share is its ``fraction`` parameter again
_PLAIN_COLUMNS = (*_KEY, *_PRESENCE)
_DETAILED_COLUMNS = (*_KEY, *_PRESENCE, *_DETAIL)
# The valid first-seen epochs: what ``datetime.fromtimestamp`` takes (years 1 to 9999)
_EARLIEST, _LATEST = -62_135_596_800, 253_402_300_800
_VALID_FIRST_SEEN = (
    "CASE WHEN typeof(first_seen) IN ('real', 'integer') AND first_seen >= "
    f"{_EARLIEST} AND first_seen < {_LATEST} THEN first_seen END"
)
_ROWS_PER_INSERT = 100
"""Rows per ``INSERT`` statement (a multi-row ``VALUES`` list): one statement step binds and
writes them all, where one row per step spends as much again in ``executemany``'s per-row
round (a first save of a million rows took 3.9 s one row to a statement, 3.3 s
with 100; 400 measured the same)."""


class _FirstSeen:
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
        """Rows to a statement: :data:`_ROWS_PER_INSERT` into an empty table; one where each
        row looks its pair up (100 such rows to a statement measured 15 % slower)."""
        return _ROWS_PER_INSERT if self._sources is None else 1

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
            f"(SELECT CASE WHEN count(*) THEN min({_VALID_FIRST_SEEN}) ELSE ?2 END"
            f" FROM replicas WHERE source IN ({names}) AND site = {site} AND scope = {scope}"
            f" AND name = {name})"
        )


def _rows(
    items: Sequence[Any],
    lead: tuple[Any, ...] = (),
    getters: Iterable[Callable[[Any], Any]] = _KEY,
) -> Iterator[tuple[Any, ...]]:
    """One row per item: the ``lead`` constants, then one column per getter; built by C-level
    iterators, not a Python loop per row."""
    columns = [*(repeat(value) for value in lead), *(map(get, items) for get in getters)]
    return zip(*columns, strict=False)  # the repeats never end; the items' columns do


def _in_key_order(replicas: Iterable[Replica]) -> list[Replica]:
    """``replicas`` sorted as the table's key (site, scope, name): a B-tree filled in key order
    touches each page once, while a set's hash order rewrites pages all over the file (about
    3x the time of a large first save). Three stable sorts by one attribute each, whose keys
    are the strings the replicas hold already."""
    ordered = sorted(replicas, key=_KEY[2])
    ordered.sort(key=_KEY[1])
    ordered.sort(key=_KEY[0])
    return ordered


def _delete(db: sqlite3.Connection, source: str, delta: SourceDelta) -> int:
    """Delete the rows of ``delta``'s removed replicas, after its added ones were written:
    a row a changed replica's new one replaced stays. Returns the removed replicas' count."""
    gone: Iterable[Replica] = delta.removed
    if delta.added and delta.removed:
        written = set(map(replica_key, delta.added))
        gone = [r for r in delta.removed if replica_key(r) not in written]
    ordered = _in_key_order(gone)
    db.executemany(
        "DELETE FROM replicas WHERE source=? AND site=? AND scope=? AND name=?",
        _rows(ordered, lead=(source,)),
    )
    return len(delta.removed)


def _insert(
    db: sqlite3.Connection, source: str, replicas: Iterable[Replica], stamp: _FirstSeen
) -> int:
    """Write ``replicas`` as rows of ``source``, each with its pair's first-seen time
    (:class:`_FirstSeen`); a plain record (no :class:`Detail`) is stored as its properties
    read: no transfer, progress 0, bytes share = files share."""
    ordered = _in_key_order(replicas)
    plain = list(filterfalse(_DETAIL_OF, ordered))  # a Detail is a non-empty tuple: true
    detailed = list(filter(_DETAIL_OF, ordered))
    _insert_rows(db, stamp, source, plain, detailed=False)
    _insert_rows(db, stamp, source, detailed, detailed=True)
    return len(ordered)


def _insert_rows(
    db: sqlite3.Connection,
    stamp: _FirstSeen,
    source: str,
    replicas: Sequence[Replica],
    *,
    detailed: bool,
) -> None:
    """``replicas`` (all plain or all ``detailed``) in statements of
    :attr:`_FirstSeen.rows_per_insert` rows and one of the rest; their parameters flattened by
    C-level iterators (a Python step per statement, none per row)."""
    getters = _DETAILED_COLUMNS if detailed else _PLAIN_COLUMNS
    shared = stamp.shared(source)
    per = stamp.rows_per_insert
    if per == 1:  # one row to a statement: its parameters are the row
        db.executemany(stamp.insert(detailed, 1), _rows(replicas, shared, getters))
        return
    flat = chain.from_iterable(_rows(replicas, getters=getters))
    full, rest = divmod(len(replicas), per)
    if full:
        statements = ((*shared, *islice(flat, len(getters) * per)) for _ in range(full))
        db.executemany(stamp.insert(detailed, per), statements)
    if rest:
        db.execute(stamp.insert(detailed, rest), (*shared, *flat))


def _check_file(path: Path, writable: bool) -> None:
    """Refuse a state file this process may not open (as a writer: for writing) or that is
    empty, before SQLite would take it for a new database or fail on the first write."""
    try:
        with path.open("r+b" if writable else "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
    except OSError as exc:
        access = "read and write" if writable else "read"
        raise StateError(
            f"state database {path}: cannot open: {exc.strerror} (the hydrator's user must "
            f"{access} it)"
        ) from exc
    if size == 0:
        raise StateError(f"state database {path} is empty (0 bytes); {WHAT_TO_DO}")


def _reason(exc: BaseException) -> str:
    """What went wrong, without the errno prefix of an OSError."""
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.strerror}" + (f": {exc.filename}" if exc.filename else "")
    return str(exc)


_SHAPES = 65_536  # the loader's bound on distinct replica shapes kept (a few dozen in practice)


class _Loader:
    """Rows -> :class:`State`, each row checked as fresh input is; rejects counted by table.

    One object per distinct site name, dataset, fraction, detail and time, as SQLite hands out
    a new str/float per row (~190 MB of duplicates at a million replicas); names and replica
    shapes are checked once per distinct value, so the checks cost little.
    """

    def __init__(self) -> None:
        self.rejected = dict.fromkeys(TABLES, 0)
        self.first_problem: str | None = None
        self.times: dict[Any, datetime] = {}  # epoch -> time, one object per value
        self._datasets: dict[tuple[str, str], DatasetId] = {}
        self._sites: dict[str, Site] = {}
        self._states = {s.value: s for s in ReplicaState}  # not Enum(value): a Python call
        self._transfers = {t.value: t for t in Transfer}
        # (state, fraction, transfer, progress, bytes_fraction) as read -> a checked
        # replica's fields after the site: one object per distinct fraction and detail
        self._shapes: dict[tuple[Any, ...], tuple[Any, ...]] = {}

    def reject(self, table: str, problem: object) -> None:
        self.rejected[table] += 1
        if self.first_problem is None:
            self.first_problem = f"{table}: {problem}"

    def dataset(self, scope: str, name: str) -> DatasetId:
        found = self._datasets.get((scope, name))
        if found is None:
            found = self._datasets[(scope, name)] = DatasetId(scope, name)
        return found

    def site(self, name: str) -> Site:
        found = self._sites.get(name)
        if found is None:
            found = self._sites[name] = check_site(name)
        return found

    def time(self, value: Any) -> datetime | None:
        """The aware UTC time of an epoch (None for NULL), one object per distinct value;
        raises ValueError (or OverflowError/OSError from datetime) for anything else (what
        :data:`_VALID_FIRST_SEEN` leaves out, and more)."""
        if value is None:
            return None
        found = self.times.get(value)
        if found is None:
            if not (isinstance(value, float | int) and _EARLIEST <= value < _LATEST):
                raise ValueError(f"invalid time {value!r}")
            found = self.times[value] = datetime.fromtimestamp(value, tz=UTC)
        return found

    def first_seen(self, value: Any, source: Any, key: Key) -> datetime | None:
        """:meth:`time` of the first-seen column of ``source``'s row of ``key`` (checked), or
        None for NULL; a value that is no time is counted under ``first_seen`` and read as
        None (the replica stays)."""
        try:
            return self.time(value)
        except (ValueError, TypeError, OverflowError, OSError) as exc:
            self.reject("first_seen", f"{source!r} row of {key[1]} at {key[0]}: {exc}")
            return None

    def load(self, db: sqlite3.Connection, query: str) -> Derived:
        loaded = self.replicas(db, query)[0]
        sources: dict[str, SourceState] = {}
        stated = _stated(db)
        for row in db.execute("SELECT * FROM sources ORDER BY name"):
            try:
                with_stated = (*row, stated.get(row[0], "[]"))
                sources[row[0]] = self.source(with_stated, loaded.get(row[0], ()))
            except (ValueError, TypeError, OverflowError, OSError) as exc:
                self.reject("sources", exc)
        derived = Derived(State(sources=sources))
        if len(sources) == 1:  # its views from the rows in memory order: a set's is 2x slower
            (only,) = sources
            coverage = derived.coverage
            views = views_of(loaded.get(only, ()), frozenset(coverage))
            derived = Derived(derived.state, coverage=coverage, contents=views)
        return derived

    def replicas(
        self, db: sqlite3.Connection, query: str, *, collect: bool = False
    ) -> tuple[dict[str, list[Replica]], dict[Key, datetime]]:
        """Source -> the replicas of its rows that pass the checks, and with ``collect``
        the first-seen times of their (site, dataset) keys: the earliest valid time of the
        pair's rows (without, an empty map: each row's time is checked, an invalid one
        counted, and none kept). The hot loop: locals, no Python call where the caches know
        the values already (a row of a known shape is built with ``Replica._make``: its
        checks passed on the shape's first row)."""
        loaded: dict[str, list[Replica]] = {}
        first_seen: dict[Key, datetime] = {}
        datasets, sites, times = self._datasets.get, self._sites.get, self.times.get
        earliest, shapes, make = first_seen.setdefault, self._shapes.get, Replica._make
        for (
            source,
            site_name,
            scope,
            name,
            state,
            fraction,
            transfer,
            progress,
            size,
            at,
        ) in db.execute(query):
            try:
                dataset = datasets((scope, name)) or self.dataset(scope, name)
                site = sites(site_name) or self.site(site_name)
                values = (state, fraction, transfer, progress, size)
                shape = shapes(values)
                if shape is None:
                    replica = self.replica(dataset, site, values)
                else:
                    replica = make((dataset, site, *shape))
            except KeyError:
                self.reject("replicas", f"invalid replica state {state!r} or transfer {transfer!r}")
                continue
            except (ValueError, TypeError) as exc:  # InvalidNameError is a ValueError
                self.reject("replicas", exc)
                continue
            found = loaded.get(source)
            if found is None:
                found = loaded[source] = []
            found.append(replica)  # no index: the core builds one only if sources merge
            when = times(at)
            if when is None and at is not None:
                when = self.first_seen(at, source, (site, dataset))
            if when is None or not collect:
                continue
            key = (site, dataset)  # a tuple per row only where the times are kept
            held = earliest(key, when)
            if held is not when and when < held:  # a pair's rows hold one time, unless edited
                first_seen[key] = when
        return loaded, first_seen

    def replica(self, dataset: DatasetId, site: Site, values: tuple[Any, ...]) -> Replica:
        """A row's replica built and checked by :class:`Replica` itself from its ``values``
        (state, fraction, transfer, progress, bytes_fraction as read; raises KeyError for an
        unknown state or transfer, ValueError/TypeError for a value it refuses), its shape
        (every field after the site) kept for the next rows of the same values: a replica's
        checks read the shape only. At most :data:`_SHAPES` shapes are kept."""
        state, fraction, transfer, progress, size = values
        plain = transfer == "none" and size == fraction  # rows are written canonical
        detail = None if plain else Detail(self._transfers[transfer], progress, size)
        replica = Replica(dataset, site, self._states[state], fraction, detail)
        if len(self._shapes) < _SHAPES:
            self._shapes[values] = replica[2:]
        return replica

    def source(self, row: tuple[Any, ...], replicas: Iterable[Replica]) -> SourceState:
        """One ``sources`` row with its ``storages`` row's text (``"[]"`` for none); an invalid
        name in its ``sites`` list, or an invalid storage status, is dropped and counted."""
        name, last_success, last_attempt, stale, error, held, sites, stated = row
        if not isinstance(name, str) or not SOURCE_NAME_PATTERN.fullmatch(name):
            raise InvalidNameError(f"invalid source name {name!r}")
        if stale not in (0, 1) or not isinstance(held, int) or held < 0:
            raise ValueError(f"source {name}: invalid stale/held_cycles {stale!r}/{held!r}")
        if error is not None and not isinstance(error, str):
            raise ValueError(f"source {name}: invalid error {error!r}")
        names = json.loads(sites)
        if not isinstance(names, list):
            raise ValueError(f"source {name}: sites is not a list")
        covered: set[Site] = set()
        for site in names:
            try:
                covered.add(self.site(site))
            except InvalidNameError as exc:
                self.reject("sources", f"source {name}: {exc}")
        return SourceState(
            name=name,
            replicas=frozenset(replicas),
            sites=frozenset(covered),
            last_success=self.time(last_success),
            last_attempt=self.time(last_attempt),
            stale=bool(stale),
            error=error,
            held_cycles=held,
            storages=self.storages(name, stated),
        )

    def storages(self, source: str, text: Any) -> tuple[StorageStatus, ...]:
        """A ``storages`` column: the statuses that pass the checks (others counted)."""
        items = json.loads(text) if isinstance(text, str) else None
        if not isinstance(items, list):
            raise ValueError(f"source {source}: storages is not a list")
        out: list[StorageStatus] = []
        for item in items:
            try:
                out.append(_status_of(item, self.site, self.time))
            except (ValueError, TypeError, KeyError, OverflowError, OSError) as exc:
                self.reject("sources", f"source {source}: storage {item!r:.80}: {exc}")
        return tuple(out)

    def drains(self, db: sqlite3.Connection) -> list[Drain]:
        """The ``drains`` rows that pass the checks (others counted under ``drains``)."""
        out: list[Drain] = []
        for site, storage, reason, since, until in db.execute(
            "SELECT site, storage, reason, since, until FROM drains ORDER BY site, storage"
        ):
            try:
                out.append(_drain_of(self.site(site), (storage, reason, since, until), self.time))
            except (ValueError, TypeError, OverflowError, OSError) as exc:
                self.reject("drains", exc)
        return out


# The replica rows of a file of each version as rows of version 3, in key order: how a reader
# reads an older file and what its migration writes (one definition for both).
_COLUMNS = "source, site, scope, name, state, fraction, transfer, progress, bytes_fraction"
# Version 1 rows as version 2: replicating/stuck rows carried the rule's progress in
# ``fraction`` and become absent with a transfer; partial rows get the bytes share = their
# file share.
_MOVING = "state IN ('replicating', 'stuck')"
_V1_AS_V2 = {
    "fraction": f"CASE WHEN {_MOVING} THEN 0 ELSE fraction END",
    "transfer": f"CASE WHEN {_MOVING} THEN state ELSE 'none' END",
    "progress": f"CASE WHEN {_MOVING} THEN fraction ELSE 0 END",
    "bytes_fraction": (
        f"CASE WHEN {_MOVING} THEN 0 WHEN state = 'partial' THEN fraction ELSE 1 END"
    ),
}
# Versions 1 and 2: each replica row with its (site, dataset)'s time from the first_seen table
_WITH_FIRST_SEEN = (
    ", f.at FROM replicas AS r LEFT JOIN first_seen AS f"
    " ON f.site = r.site AND f.scope = r.scope AND f.name = r.name"
    " ORDER BY r.source, r.site, r.scope, r.name"
)
_ROWS_OF = {
    str(SCHEMA_VERSION): f"SELECT {_COLUMNS}, first_seen FROM replicas",
    "3": f"SELECT {_COLUMNS}, first_seen FROM replicas",
    "2": "SELECT " + ", ".join(f"r.{c}" for c in _COLUMNS.split(", ")) + _WITH_FIRST_SEEN,
    "1": "SELECT r.source, r.site, r.scope, r.name, r.state, "
    + ", ".join(_V1_AS_V2[c] for c in ("fraction", "transfer", "progress", "bytes_fraction"))
    + _WITH_FIRST_SEEN,
}


def _migrate(db: sqlite3.Connection, version: str, path: Path) -> None:
    """Upgrade a file of an older ``version`` to :data:`SCHEMA_VERSION` in one transaction: a
    new replica table filled in key order from :data:`_ROWS_OF` (each row with its
    first-seen time), the old tables dropped. A kill or an error at any point leaves the old
    file untouched (rolled back; a kill's journal is rolled back at the next open), and the
    next start migrates it again."""
    started = time.monotonic()
    db.execute("BEGIN IMMEDIATE")
    try:
        if version in ("1", "2"):
            db.execute(_REPLICAS_TABLE.format(name="replicas_new"))
            db.execute(f"INSERT INTO replicas_new {_ROWS_OF[version]}")
            db.execute("DROP TABLE replicas")
            db.execute("DROP TABLE first_seen")
            db.execute("ALTER TABLE replicas_new RENAME TO replicas")
        for statement in _STORAGE_TABLES.split(";")[:2]:
            db.execute(statement)
        db.execute(f"UPDATE meta SET value = '{SCHEMA_VERSION}' WHERE key = 'schema_version'")
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise
    log.info(
        "state database %s upgraded from schema version %s to %d in %.1f s",
        path,
        version,
        SCHEMA_VERSION,
        time.monotonic() - started,
    )


# --------------------------------------------------------------------------- storage, drains


def _stated(db: sqlite3.Connection) -> dict[Any, Any]:
    """Source name -> its ``storages`` row's text; none in a file of version 3 or older."""
    tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if "storages" not in tables:
        return {}
    return dict(db.execute("SELECT source, statuses FROM storages").fetchall())


def _status_json(status: StorageStatus) -> dict[str, Any]:
    """A storage status as stored in ``sources.storages``."""
    return {
        "site": status.site,
        "storage": status.storage,
        "kind": status.kind,
        "available": status.available,
        "reason": status.reason,
        "until": _epoch(status.until),
        "upcoming": status.upcoming,
        "wanted": status.wanted,
    }


TimeOf = Callable[[Any], datetime | None]


def _status_of(item: Any, site_of: Callable[[str], Site], time_of: TimeOf) -> StorageStatus:
    """A stored storage status, checked as fresh input (raises ValueError/TypeError/KeyError)."""
    if not isinstance(item, dict):
        raise TypeError("not an object")
    texts = [item["kind"], item["reason"], item["upcoming"]]
    if not isinstance(item["available"], bool) or not isinstance(item["wanted"], int):
        raise TypeError("invalid available/wanted")
    if not all(t is None or isinstance(t, str) for t in texts) or item["kind"] is None:
        raise TypeError("invalid kind/reason/upcoming")
    return StorageStatus(
        site_of(item["site"]),
        item["storage"],
        clean_text(item["kind"], 40),
        item["available"],
        None if item["reason"] is None else clean_text(item["reason"]),
        time_of(item["until"]),
        None if item["upcoming"] is None else clean_text(item["upcoming"]),
        max(0, item["wanted"]),
    )


def _drain_of(site: Site, row: tuple[Any, ...], time_of: TimeOf) -> Drain:
    """A ``drains`` row's (storage, reason, since, until), checked (raises ValueError/TypeError)."""
    storage, reason, since, until = row
    if not isinstance(storage, str) or not isinstance(reason, str):
        raise TypeError(f"drain of {site}: invalid storage/reason")
    if storage and not STORAGE_PATTERN.fullmatch(storage):
        raise ValueError(f"drain of {site}: invalid storage element {storage!r}")
    started = time_of(since)
    if started is None:
        raise ValueError(f"drain of {site}: no start time")
    return Drain(site, storage or None, clean_text(reason), started, time_of(until))


def _drain_db(path: Path) -> sqlite3.Connection:
    """A connection to the state at ``path`` for the drain commands: a missing file or one of
    an older version is created or upgraded first, under the writer lock (a running daemon
    holds it, and has upgraded the file already)."""
    connect_to_current = path.exists()
    if connect_to_current:
        db = sqlite3.connect(str(path), isolation_level=None, timeout=30)
        row = db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        if row is not None and row[0] == str(SCHEMA_VERSION):
            return db
        db.close()
    SqliteStateStore(path, lock=StateLock(path)).close()  # creates or migrates
    return sqlite3.connect(str(path), isolation_level=None, timeout=30)


def set_drain(path: Path, drain: Drain) -> None:
    """Save ``drain`` (replacing one of the same site and storage element) in its own
    transaction; the daemon applies it from its next cycle. Raises :class:`StateError`."""
    try:
        db = _drain_db(path)
        try:
            db.execute(
                "INSERT OR REPLACE INTO drains VALUES (?, ?, ?, ?, ?)",
                (
                    drain.site,
                    drain.storage or "",
                    clean_text(drain.reason),
                    drain.since.timestamp(),
                    _epoch(drain.until),
                ),
            )
        finally:
            db.close()
    except (sqlite3.Error, OSError) as exc:
        raise StateError(f"state database {path}: drain not saved: {_reason(exc)}") from exc


def remove_drain(path: Path, site: Site, storage: str | None) -> int:
    """Remove the drain of ``site`` (``storage`` None: the whole-site drain) or of one of its
    storage elements; returns how many were removed (0 or 1). Raises :class:`StateError`."""
    if not path.exists():
        return 0
    try:
        db = _drain_db(path)
        try:
            cursor = db.execute(
                "DELETE FROM drains WHERE site = ? AND storage = ?", (site, storage or "")
            )
            return cursor.rowcount
        finally:
            db.close()
    except (sqlite3.Error, OSError) as exc:
        raise StateError(f"state database {path}: drain not removed: {_reason(exc)}") from exc


def reported_targets(path: Path) -> tuple[set[str], set[tuple[str, str]]]:
    """The sites the sources' last good answers cover, and the (site, storage element) of
    every storage status they hold, read from ``path`` alone (no replica row): what the drain
    command checks a name against. Both empty when there is no file yet."""
    if not path.exists():
        return set(), set()
    try:
        db = sqlite3.connect(f"file:{urllib.parse.quote(str(path))}?mode=ro", uri=True)
        try:
            texts = list(_stated(db).values())
            covered = [r[0] for r in db.execute("SELECT sites FROM sources")]
        finally:
            db.close()
    except sqlite3.Error as exc:
        raise StateError(f"state database {path} unreadable: {exc}") from exc
    stated: set[tuple[str, str]] = set()
    for items in map(_json_list, texts):
        stated.update(
            (str(i.get("site")), str(i.get("storage"))) for i in items if isinstance(i, dict)
        )
    sites = {str(name) for names in map(_json_list, covered) for name in names}
    return sites | {site for site, _ in stated}, stated


def _json_list(text: object) -> list[Any]:
    """``text`` as a JSON list; empty for anything else (the drain command's read only)."""
    try:
        items = json.loads(text) if isinstance(text, str) else []
    except ValueError:
        return []
    return items if isinstance(items, list) else []
