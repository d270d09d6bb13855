"""The state store: the last good state, in one SQLite file (stdlib ``sqlite3``).

One transaction per cycle (``BEGIN IMMEDIATE`` … ``COMMIT``) in WAL mode, so a kill at any
moment leaves the old state or the new one, never a mix. A cycle writes only what changed:
the replica rows in the plan's source deltas, the first-seen rows of added/removed entries,
and one status row per source. A cycle with no change writes no replica rows.

Schema version 2::

    meta(key, value)                      schema_version
    sources(name, last_success, last_attempt, stale, error, held_cycles, sites)
    replicas(source, site, scope, name, state, fraction,      last good snapshot per source
             transfer, progress, bytes_fraction)
    first_seen(site, scope, name, at)

Rows are written in the tables' key order (a B-tree filled in order touches each page once;
a set's hash order costs about three times as much on a large save) and built by C-level
iterators. A load reads each replica row joined with its first-seen row in one pass, builds
each source's index as it goes, and shares the (site, dataset) key tuples between that index
and ``first_seen``; the ``first_seen`` table is read on its own only when the join did not
account for all its rows (rows of no replica, invalid rows).

One writer: a writer holds an exclusive ``flock`` on ``<state>.lock`` (:class:`StateLock`, the
file holds its PID; the kernel drops the lock when the process ends, even by SIGKILL). Readers
(``hydrator show``, ``once --dry-run``) open the database read-only and take no lock.

Nothing read back is trusted: every row is checked with the rules fresh input meets
(:class:`~hydrator.domain.DatasetId`, :func:`~hydrator.domain.check_site`); a row that fails is
counted in :attr:`SqliteStateStore.rejected_rows`, logged once per load, and never used. A file
that exists but is empty or not a hydrator database is an error, never an empty start.

Version 1 (up to f139dde) had one state per replica that mixed presence and transfer:
``replicating``/``stuck`` rows carried the rule's progress in ``fraction``. Opening such a file
migrates it in one transaction (:func:`_migrate_v1`): those rows become absent-with-a-transfer
(``fraction`` 0, ``progress`` the old fraction), partial rows get ``bytes_fraction`` = their
file fraction. Every advertised list, and so every site digest, stays as it was: the first
cycle after an upgrade sends updates only where the sources' answer changes a list.
"""

from __future__ import annotations

import fcntl
import json
import logging
import math
import os
import sqlite3
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from itertools import repeat
from operator import attrgetter
from pathlib import Path
from typing import Any, Protocol

from hydrator.config import SOURCE_NAME_PATTERN
from hydrator.domain import (
    ChangeKind,
    DatasetId,
    Detail,
    InvalidNameError,
    Plan,
    Replica,
    ReplicaState,
    Site,
    SourceState,
    State,
    Transfer,
    check_site,
)
from hydrator.errors import StateError

log = logging.getLogger(__name__)

Key = tuple[Site, DatasetId]

SCHEMA_VERSION = 2

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS sources (
    name TEXT PRIMARY KEY, last_success REAL, last_attempt REAL, stale INTEGER NOT NULL,
    error TEXT, held_cycles INTEGER NOT NULL, sites TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS replicas (
    source TEXT NOT NULL, site TEXT NOT NULL, scope TEXT NOT NULL, name TEXT NOT NULL,
    state TEXT NOT NULL, fraction REAL NOT NULL,
    transfer TEXT NOT NULL DEFAULT 'none', progress REAL NOT NULL DEFAULT 0,
    bytes_fraction REAL NOT NULL DEFAULT 1,
    PRIMARY KEY (source, site, scope, name)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS first_seen (
    site TEXT NOT NULL, scope TEXT NOT NULL, name TEXT NOT NULL, at REAL NOT NULL,
    PRIMARY KEY (site, scope, name)) WITHOUT ROWID;
"""
TABLES = ("replicas", "sources", "first_seen")
WHAT_TO_DO = "move it away (keep it to inspect) or start `hydrator run|once --reset-state`"


class StateStore(Protocol):
    def load(self) -> State: ...

    @property
    def rejected_rows(self) -> Mapping[str, int]:
        """Rows the last :meth:`load` ignored as invalid, by table (every table listed)."""
        ...

    def save(self, plan: Plan) -> int:
        """Persist the plan's state in one transaction; return the number of rows written."""
        ...

    def close(self) -> None: ...


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
    the next open starts empty; return the new name, or None if there was no file. Call it only
    while holding the :class:`StateLock`."""
    if not path.exists():
        return None
    kept = path.with_name(f"{path.name}.reset-{now.strftime('%Y%m%dT%H%M%SZ')}")
    try:
        for suffix in ("-wal", "-shm", ""):  # the database last: its name marks completion
            side = path.with_name(path.name + suffix)
            if side.exists():
                side.rename(kept.with_name(kept.name + suffix))
    except OSError as exc:
        raise StateError(f"state database {path}: cannot move it aside: {exc.strerror}") from exc
    log.warning("state database %s moved to %s (--reset-state): starting empty", path, kept)
    return kept


class SqliteStateStore:
    """:class:`StateStore` on a SQLite file; the parent directory must exist and be writable.

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
        self._v1 = False  # a version-1 file opened read-only: its rows are read as version 2
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
        assert self._db is not None
        tables = {r[0] for r in self._db.execute("SELECT name FROM sqlite_master")}
        if not {"meta", *TABLES} <= tables:
            raise StateError(f"state database {self.path} is not a hydrator state; {WHAT_TO_DO}")
        row = self._db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        if row is not None and row[0] == "1":
            self._v1 = True  # read as version 2 (see _V1_AS_V2); a writer migrates it
            if not self.read_only:
                _migrate_v1(self._db)
                self._v1 = False
        elif row is None or row[0] != str(SCHEMA_VERSION):
            raise StateError(
                f"state database {self.path} has schema version {row and row[0]}; "
                f"this hydrator reads version {SCHEMA_VERSION} (and upgrades version 1)"
            )

    @property
    def rejected_rows(self) -> Mapping[str, int]:
        return dict(self._rejected)

    def load(self) -> State:
        """The saved state (empty on a new database); invalid rows are left out."""
        if self._db is None:
            return State()
        try:
            loader = _Loader()
            state = loader.load(self._db, _V1_REPLICAS if self._v1 else _REPLICAS)
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
        written = 0
        db.execute("BEGIN IMMEDIATE")
        for source, delta in plan.source_deltas.items():
            written += _delete(db, source, delta.removed)
            written += _insert(db, source, delta.added)
        written += self._save_first_seen(db, plan)
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
        db.execute("COMMIT")
        return written

    def _save_first_seen(self, db: sqlite3.Connection, plan: Plan) -> int:
        """The first-seen rows of the plan's added/removed entries, in the changes' order
        (the core sorts them by site, scope, name: the table's key order)."""
        added, removed = ChangeKind.ADDED, ChangeKind.REMOVED  # locals: read once, not per row
        gone = [c for c in plan.changes if c.kind is removed]
        new = [c for c in plan.changes if c.kind is added]
        db.executemany("DELETE FROM first_seen WHERE site=? AND scope=? AND name=?", _rows(gone))
        when = map(plan.state.first_seen.__getitem__, map(_PAIR, new))
        epochs = map(_Epochs().__getitem__, when)
        db.executemany("INSERT OR REPLACE INTO first_seen VALUES (?, ?, ?, ?)", _rows(new, epochs))
        return len(gone) + len(new)

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None
        if self._lock is not None:
            self._lock.release()
            self._lock = None


# Row columns read at C speed (no Python call per row): a replica's or change's key, its
# presence, its detail. ``_value_`` is the documented attribute behind ``Enum.value`` (a
# Python-level descriptor).
_KEY = (attrgetter("site"), attrgetter("dataset.scope"), attrgetter("dataset.name"))
_PAIR = attrgetter("site", "dataset")
_PRESENCE = (attrgetter("state._value_"), attrgetter("fraction"))
_DETAIL = tuple(
    attrgetter(f"detail.{c}") for c in ("transfer._value_", "progress", "bytes_fraction")
)
_INSERT_PLAIN = "INSERT OR REPLACE INTO replicas VALUES (?, ?, ?, ?, ?, ?, 'none', 0.0, ?)"
_INSERT_DETAILED = "INSERT OR REPLACE INTO replicas VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"


class _Epochs(dict[datetime, float]):
    """datetime -> epoch seconds, computed once per distinct time (a cycle's new entries all
    share one); ``__getitem__`` stays the C-level dict lookup."""

    def __missing__(self, when: datetime) -> float:
        epoch = self[when] = when.timestamp()
        return epoch


def _rows(
    items: Sequence[Any],
    *extra: Iterable[Any],
    lead: tuple[Any, ...] = (),
    getters: Iterable[Callable[[Any], Any]] = _KEY,
) -> Iterator[tuple[Any, ...]]:
    """One row per item: the ``lead`` constants, one column per getter, then one per ``extra``
    iterable (one element per item); built by C-level iterators, not a Python loop per row."""
    columns = [*(repeat(value) for value in lead), *(map(get, items) for get in getters), *extra]
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


def _delete(db: sqlite3.Connection, source: str, replicas: Iterable[Replica]) -> int:
    ordered = _in_key_order(replicas)
    db.executemany(
        "DELETE FROM replicas WHERE source=? AND site=? AND scope=? AND name=?",
        _rows(ordered, lead=(source,)),
    )
    return len(ordered)


def _insert(db: sqlite3.Connection, source: str, replicas: Iterable[Replica]) -> int:
    """Write ``replicas`` as rows of ``source``; a plain record (no :class:`Detail`) is stored
    as its properties read: no transfer, progress 0, bytes share = files share."""
    ordered = _in_key_order(replicas)
    plain = [r for r in ordered if r.detail is None]
    detailed = [r for r in ordered if r.detail is not None]
    own = (*_KEY, *_PRESENCE)
    db.executemany(_INSERT_PLAIN, _rows(plain, lead=(source,), getters=(*own, _PRESENCE[1])))
    db.executemany(_INSERT_DETAILED, _rows(detailed, lead=(source,), getters=(*own, *_DETAIL)))
    return len(ordered)


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


class _Loader:
    """Rows -> :class:`State`, each row checked as fresh input is; rejects counted by table.

    One object per distinct site name, dataset, fraction and time, as SQLite hands out a new
    str/float per row (~190 MB of duplicates at a million replicas); names are checked once
    per distinct value, so the checks cost little.
    """

    def __init__(self) -> None:
        self.rejected = dict.fromkeys(TABLES, 0)
        self.first_problem: str | None = None
        self.times: dict[Any, datetime] = {}  # epoch -> time, one object per value
        self._datasets: dict[tuple[str, str], DatasetId] = {}
        self._sites: dict[str, Site] = {}
        self._fractions: dict[float, float] = {}
        self._states = {s.value: s for s in ReplicaState}  # not Enum(value): a Python call
        self._transfers = {t.value: t for t in Transfer}
        self._details: dict[tuple[Any, Any, Any], Detail] = {}

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
        raises ValueError (or OverflowError/OSError from datetime) for anything else."""
        if value is None:
            return None
        found = self.times.get(value)
        if found is None:
            if not (isinstance(value, float | int) and math.isfinite(value)):
                raise ValueError(f"invalid time {value!r}")
            found = self.times[value] = datetime.fromtimestamp(value, tz=UTC)
        return found

    def checked_time(self, value: Any) -> datetime | None:
        """:meth:`time`, or None for a value that is no time."""
        try:
            return self.time(value)
        except (ValueError, TypeError, OverflowError, OSError):
            return None

    def load(self, db: sqlite3.Connection, query: str) -> State:
        indexes, first_seen = self.replicas(db, query)
        sources: dict[str, SourceState] = {}
        for row in db.execute("SELECT * FROM sources ORDER BY name"):
            index = indexes.get(row[0], {})
            try:
                sources[row[0]] = self.source(row, index.values()).adopt_index(index)
            except (ValueError, TypeError, OverflowError, OSError) as exc:
                self.reject("sources", exc)
        (stored,) = db.execute("SELECT count(*) FROM first_seen").fetchone()
        if len(first_seen) != stored:  # a row the join left out, or one that failed
            first_seen = self.first_seen(db)
        return State(sources=sources, first_seen=first_seen)

    def first_seen(self, db: sqlite3.Connection) -> dict[Key, datetime]:
        """Every ``first_seen`` row on its own, each checked; only when the join of
        :meth:`replicas` did not account for every row (invalid rows, or rows of no replica)."""
        first_seen: dict[Key, datetime] = {}
        for site, scope, name, at in db.execute("SELECT * FROM first_seen"):
            try:
                when = self.time(at)
                if when is None:
                    raise ValueError("no time")
                first_seen[(self.site(site), self.dataset(scope, name))] = when
            except (ValueError, TypeError, OverflowError, OSError) as exc:
                self.reject("first_seen", exc)
        return first_seen

    def replicas(
        self, db: sqlite3.Connection, query: str
    ) -> tuple[dict[str, dict[Key, Replica]], dict[Key, datetime]]:
        """Source -> its index of the replica rows that pass the checks, and the first-seen
        times of their (site, dataset) keys (the row's join; a time that fails is left out for
        :meth:`load` to notice). One key tuple per replica, shared by the index and the
        first-seen map. The hot loop: locals, no Python call but Replica's own checks (which
        cover every share's 0..1 range) where the caches know the values already."""
        indexes: dict[str, dict[Key, Replica]] = {}
        first_seen: dict[Key, datetime] = {}
        datasets, sites, times = self._datasets.get, self._sites.get, self.times.get
        states, fractions = self._states, self._fractions
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
                plain = transfer == "none" and size == fraction  # rows are written canonical
                replica = Replica(
                    dataset,
                    site,
                    states[state],
                    fractions.setdefault(fraction, fraction),
                    None if plain else self.detail(transfer, progress, size),
                )
            except KeyError:
                self.reject("replicas", f"invalid replica state {state!r} or transfer {transfer!r}")
                continue
            except (ValueError, TypeError) as exc:  # InvalidNameError is a ValueError
                self.reject("replicas", exc)
                continue
            key = (site, dataset)
            index = indexes.get(source)
            if index is None:
                index = indexes[source] = {}
            index[key] = replica
            when = times(at)
            if when is None and at is not None:
                when = self.checked_time(at)
            if when is not None:
                first_seen[key] = when
        return indexes, first_seen

    def detail(self, transfer: Any, progress: Any, size: Any) -> Detail:
        """One object per distinct detail, as for fractions."""
        key = (transfer, progress, size)
        found = self._details.get(key)
        if found is None:
            found = self._details[key] = Detail(self._transfers[transfer], progress, size)
        return found

    def source(self, row: tuple[Any, ...], replicas: Iterable[Replica]) -> SourceState:
        """One ``sources`` row; an invalid name in its ``sites`` list is dropped and counted."""
        name, last_success, last_attempt, stale, error, held, sites = row
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
        )


# Version 1 rows as version 2 (the migration's one definition): replicating/stuck rows carried
# the rule's progress in ``fraction`` and become absent with a transfer; partial rows get the
# bytes share = their file share.
_MOVING = "state IN ('replicating', 'stuck')"
_V1_AS_V2 = {
    "fraction": f"CASE WHEN {_MOVING} THEN 0 ELSE fraction END",
    "transfer": f"CASE WHEN {_MOVING} THEN state ELSE 'none' END",
    "progress": f"CASE WHEN {_MOVING} THEN fraction ELSE 0 END",
    "bytes_fraction": (
        f"CASE WHEN {_MOVING} THEN 0 WHEN state = 'partial' THEN fraction ELSE 1 END"
    ),
}
# Each replica row with its (site, dataset)'s first-seen time: one pass over both tables.
_WITH_FIRST_SEEN = (
    ", f.at FROM replicas AS r LEFT JOIN first_seen AS f"
    " ON f.site = r.site AND f.scope = r.scope AND f.name = r.name"
)
_REPLICAS = (
    "SELECT r.source, r.site, r.scope, r.name, r.state, r.fraction, r.transfer, r.progress,"
    " r.bytes_fraction" + _WITH_FIRST_SEEN
)
_V1_REPLICAS = (
    "SELECT r.source, r.site, r.scope, r.name, r.state, "
    + ", ".join(_V1_AS_V2[c] for c in ("fraction", "transfer", "progress", "bytes_fraction"))
    + _WITH_FIRST_SEEN
)


def _migrate_v1(db: sqlite3.Connection) -> None:
    """Schema 1 -> 2 in one transaction (a kill leaves version 1, migrated again next start);
    a reader of a version-1 file reads its rows through the same expressions
    (:data:`_V1_REPLICAS`) and writes nothing.
    """
    db.execute("BEGIN IMMEDIATE")
    try:
        for column in (
            "transfer TEXT NOT NULL DEFAULT 'none'",
            "progress REAL NOT NULL DEFAULT 0",
            "bytes_fraction REAL NOT NULL DEFAULT 1",
        ):
            db.execute(f"ALTER TABLE replicas ADD COLUMN {column}")
        # every right-hand side reads the row's old values (SQL UPDATE semantics)
        assignments = ", ".join(f"{column} = {expr}" for column, expr in _V1_AS_V2.items())
        db.execute(f"UPDATE replicas SET {assignments} WHERE {_MOVING} OR state = 'partial'")
        db.execute("UPDATE meta SET value = '2' WHERE key = 'schema_version'")
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise
