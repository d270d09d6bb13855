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

Version 1 (up to f139dde) had one state per replica that mixed presence and transfer:
``replicating``/``stuck`` rows carried the rule's progress in ``fraction``. Opening such a file
migrates it in one transaction (:func:`_migrate_v1`): those rows become absent-with-a-transfer
(``fraction`` 0, ``progress`` the old fraction), partial rows get ``bytes_fraction`` = their
file fraction. Every advertised list, and so every site digest, stays as it was: the first
cycle after an upgrade sends updates only where the sources' answer changes a list.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

from hydrator.domain import (
    ChangeKind,
    DatasetId,
    Detail,
    Plan,
    Replica,
    ReplicaState,
    Site,
    SourceState,
    State,
    Transfer,
)
from hydrator.errors import StateError

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


class StateStore(Protocol):
    def load(self) -> State: ...

    def save(self, plan: Plan) -> int:
        """Persist the plan's state in one transaction; return the number of rows written."""
        ...

    def close(self) -> None: ...


def _epoch(when: datetime | None) -> float | None:
    return None if when is None else when.timestamp()


class _Times:
    """Epoch -> aware UTC datetime, sharing one object per distinct value (most rows share)."""

    def __init__(self) -> None:
        self._cache: dict[float, datetime] = {}

    def __call__(self, value: float | None) -> datetime | None:
        if value is None:
            return None
        found = self._cache.get(value)
        if found is None:
            found = self._cache[value] = datetime.fromtimestamp(value, tz=UTC)
        return found


class SqliteStateStore:
    """:class:`StateStore` on a SQLite file; the parent directory must exist and be writable."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._check_schema()
        except sqlite3.Error as exc:
            raise StateError(f"state database {path}: {exc}") from exc

    def _check_schema(self) -> None:
        self._db.executescript(_SCHEMA)
        row = self._db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        if row is None:
            self._db.execute(
                "INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),)
            )
        elif row[0] == "1":
            _migrate_v1(self._db)
        elif row[0] != str(SCHEMA_VERSION):
            raise StateError(
                f"state database {self.path} has schema version {row[0]}; "
                f"this hydrator reads version {SCHEMA_VERSION} (and upgrades version 1)"
            )

    def load(self) -> State:
        """The saved state (empty on a new database)."""
        try:
            return self._load()
        except (sqlite3.Error, ValueError, KeyError) as exc:
            raise StateError(f"state database {self.path} unreadable: {exc}") from exc

    def _load(self) -> State:
        times = _Times()
        datasets: dict[tuple[str, str], DatasetId] = {}

        def dataset(scope: str, name: str) -> DatasetId:
            found = datasets.get((scope, name))
            if found is None:
                found = datasets[(scope, name)] = DatasetId(scope, name)
            return found

        # One object per distinct site name and fraction, as for datasets and times: SQLite
        # hands out a new str/float per row, ~190 MB of duplicates at a million replicas.
        site_names: dict[str, Site] = {}
        fractions: dict[float, float] = {}
        states = {state.value: state for state in ReplicaState}  # not Enum(value): a Python call
        transfers = {transfer.value: transfer for transfer in Transfer}
        details: dict[tuple[str, float, float], Detail] = {}

        replicas: dict[str, list[Replica]] = {}
        query = (
            "SELECT source, site, scope, name, state, fraction, transfer, progress, bytes_fraction"
            " FROM replicas"
        )
        for row in self._db.execute(query):
            source, site, scope, name, state, fraction, transfer, progress, size = row
            fraction = fractions.setdefault(fraction, fraction)
            if transfer == "none" and size == fraction:  # rows are written canonical
                detail = None
            else:  # one object per distinct detail, as for fractions
                detail = details.get((transfer, progress, size))
                if detail is None:
                    detail = Detail(transfers[transfer], progress, size)
                    details[(transfer, progress, size)] = detail
            replicas.setdefault(source, []).append(
                Replica(
                    dataset(scope, name),
                    site_names.setdefault(site, Site(site)),
                    states[state],
                    fraction,
                    detail,
                )
            )
        sources: dict[str, SourceState] = {}
        for row in self._db.execute("SELECT * FROM sources ORDER BY name"):
            name, last_success, last_attempt, stale, error, held, sites = row
            sources[name] = SourceState(
                name=name,
                replicas=frozenset(replicas.get(name, ())),
                sites=frozenset(Site(s) for s in json.loads(sites)),
                last_success=times(last_success),
                last_attempt=times(last_attempt),
                stale=bool(stale),
                error=error,
                held_cycles=held,
            )
        first_seen = {
            (site_names.setdefault(site, Site(site)), dataset(scope, name)): times(at)
            for site, scope, name, at in self._db.execute("SELECT * FROM first_seen")
        }
        return State(sources=sources, first_seen=first_seen)  # type: ignore[arg-type]

    def save(self, plan: Plan) -> int:
        try:
            return self._save(plan)
        except sqlite3.Error as exc:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            raise StateError(f"state database {self.path} not written: {exc}") from exc

    def _save(self, plan: Plan) -> int:
        db = self._db
        written = 0
        db.execute("BEGIN IMMEDIATE")
        for source, delta in plan.source_deltas.items():
            written += _delete(db, source, delta.removed)
            written += _insert(db, source, delta.added)
        written += self._save_first_seen(plan)
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

    def _save_first_seen(self, plan: Plan) -> int:
        gone = [c for c in plan.changes if c.kind is ChangeKind.REMOVED]
        new = [c for c in plan.changes if c.kind is ChangeKind.ADDED]
        self._db.executemany(
            "DELETE FROM first_seen WHERE site=? AND scope=? AND name=?",
            [(c.site, c.dataset.scope, c.dataset.name) for c in gone],
        )
        at = plan.state.first_seen
        self._db.executemany(
            "INSERT OR REPLACE INTO first_seen VALUES (?, ?, ?, ?)",
            [
                (c.site, c.dataset.scope, c.dataset.name, _epoch(at[(c.site, c.dataset)]))
                for c in new
            ],
        )
        return len(gone) + len(new)

    def close(self) -> None:
        self._db.close()


def _delete(db: sqlite3.Connection, source: str, replicas: Iterable[Replica]) -> int:
    rows = [(source, r.site, r.dataset.scope, r.dataset.name) for r in replicas]
    db.executemany("DELETE FROM replicas WHERE source=? AND site=? AND scope=? AND name=?", rows)
    return len(rows)


def _insert(db: sqlite3.Connection, source: str, replicas: Iterable[Replica]) -> int:
    rows = [
        (
            source,
            r.site,
            r.dataset.scope,
            r.dataset.name,
            r.state.value,
            r.fraction,
            r.transfer.value,
            r.progress,
            r.bytes_fraction,
        )
        for r in replicas
    ]
    db.executemany("INSERT OR REPLACE INTO replicas VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
    return len(rows)


def _migrate_v1(db: sqlite3.Connection) -> None:
    """Schema 1 -> 2 in one transaction (a kill leaves version 1, migrated again next start).

    Adding columns with constant defaults rewrites no row (SQLite stores the default in the
    schema); only the few replicating/stuck rows and the partial rows are updated.
    """
    db.execute("BEGIN IMMEDIATE")
    try:
        for column in (
            "transfer TEXT NOT NULL DEFAULT 'none'",
            "progress REAL NOT NULL DEFAULT 0",
            "bytes_fraction REAL NOT NULL DEFAULT 1",
        ):
            db.execute(f"ALTER TABLE replicas ADD COLUMN {column}")
        db.execute(
            "UPDATE replicas SET transfer = state, progress = fraction, fraction = 0,"
            " bytes_fraction = 0 WHERE state IN ('replicating', 'stuck')"
        )
        db.execute("UPDATE replicas SET bytes_fraction = fraction WHERE state = 'partial'")
        db.execute("UPDATE meta SET value = '2' WHERE key = 'schema_version'")
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise
