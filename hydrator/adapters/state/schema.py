"""The state file's schema, its versions and their upgrades (stdlib ``sqlite3``).

Schema version 4::

    meta(key, value)                      schema_version
    sources(name, last_success, last_attempt, stale, error, held_cycles, sites)
    storages(source, statuses)            the last good answer's storage statuses (JSON)
    replicas(source, site, scope, name, state, fraction,      last good snapshot per source
             transfer, progress, bytes_fraction, first_seen)
    drains(site, storage, reason, since, until)      operator drains (``hydrator drain``)

Older files are upgraded when a writer opens them, in one transaction (:func:`migrate`: a
kill or an error leaves the old file as it was, migrated again at the next start); a reader
reads their rows through the same query (:data:`ROWS_OF`) and writes nothing.

* Version 3 had no ``drains`` and ``storages`` tables: both are
  added empty (no drain; the next answer of each source states its storage).
* Version 2 kept first-seen times in a table of their own,
  ``first_seen(site, scope, name, at)``: each replica row takes its pair's time; a time of no
  replica row (a pair no source reports) is dropped, as the core never reads it.
* Version 1 had one state per replica that mixed presence and transfer:
  ``replicating``/``stuck`` rows carried the rule's progress in ``fraction``. They become
  absent-with-a-transfer (``fraction`` 0, ``progress`` the old fraction), partial rows get
  ``bytes_fraction`` = their file fraction. Every advertised list, and so every site digest,
  stays as it was: the first cycle after an upgrade sends updates only where the sources'
  answer changes a list.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from pathlib import Path
from typing import Any

log = logging.getLogger("hydrator.adapters.state.sqlite")

SCHEMA_VERSION = 4

REPLICAS_TABLE = """
CREATE TABLE {name} (
    source TEXT NOT NULL, site TEXT NOT NULL, scope TEXT NOT NULL, name TEXT NOT NULL,
    state TEXT NOT NULL, fraction REAL NOT NULL,
    transfer TEXT NOT NULL DEFAULT 'none', progress REAL NOT NULL DEFAULT 0,
    bytes_fraction REAL NOT NULL DEFAULT 1, first_seen REAL,
    PRIMARY KEY (source, site, scope, name)) WITHOUT ROWID;
"""
STORAGE_TABLES = """
CREATE TABLE IF NOT EXISTS drains (
    site TEXT NOT NULL, storage TEXT NOT NULL, reason TEXT NOT NULL, since REAL NOT NULL,
    until REAL, PRIMARY KEY (site, storage));
CREATE TABLE IF NOT EXISTS storages (source TEXT PRIMARY KEY, statuses TEXT NOT NULL);
"""
SCHEMA = (
    """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE sources (
    name TEXT PRIMARY KEY, last_success REAL, last_attempt REAL, stale INTEGER NOT NULL,
    error TEXT, held_cycles INTEGER NOT NULL, sites TEXT NOT NULL);
"""
    + REPLICAS_TABLE.format(name="replicas")
    + STORAGE_TABLES
)
# What rejected_rows counts, by table: ``first_seen`` counts the invalid first-seen times of
# replica rows (the table of schema 2; the label stays for the metric's series).
TABLES = ("replicas", "sources", "first_seen", "drains")
# The tables each schema version has (the versions this hydrator reads)
VERSION_TABLES = {
    "1": {"meta", "sources", "replicas", "first_seen"},
    "2": {"meta", "sources", "replicas", "first_seen"},
    "3": {"meta", "sources", "replicas"},
    str(SCHEMA_VERSION): {"meta", "sources", "replicas", "drains", "storages"},
}
WHAT_TO_DO = "move it away (keep it to inspect) or start `hydrator run|once --reset-state`"


# The valid first-seen epochs: what ``datetime.fromtimestamp`` takes (years 1 to 9999)
EARLIEST, LATEST = -62_135_596_800, 253_402_300_800
VALID_FIRST_SEEN = (
    "CASE WHEN typeof(first_seen) IN ('real', 'integer') AND first_seen >= "
    f"{EARLIEST} AND first_seen < {LATEST} THEN first_seen END"
)

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
ROWS_OF = {
    str(SCHEMA_VERSION): f"SELECT {_COLUMNS}, first_seen FROM replicas",
    "3": f"SELECT {_COLUMNS}, first_seen FROM replicas",
    "2": "SELECT " + ", ".join(f"r.{c}" for c in _COLUMNS.split(", ")) + _WITH_FIRST_SEEN,
    "1": "SELECT r.source, r.site, r.scope, r.name, r.state, "
    + ", ".join(_V1_AS_V2[c] for c in ("fraction", "transfer", "progress", "bytes_fraction"))
    + _WITH_FIRST_SEEN,
}


def migrate(db: sqlite3.Connection, version: str, path: Path) -> None:
    """Upgrade a file of an older ``version`` to :data:`SCHEMA_VERSION` in one transaction: a
    new replica table filled in key order from :data:`ROWS_OF` (each row with its
    first-seen time), the old tables dropped. A kill or an error at any point leaves the old
    file untouched (rolled back; a kill's journal is rolled back at the next open), and the
    next start migrates it again."""
    started = time.monotonic()
    db.execute("BEGIN IMMEDIATE")
    try:
        if version in ("1", "2"):
            db.execute(REPLICAS_TABLE.format(name="replicas_new"))
            db.execute(f"INSERT INTO replicas_new {ROWS_OF[version]}")
            db.execute("DROP TABLE replicas")
            db.execute("DROP TABLE first_seen")
            db.execute("ALTER TABLE replicas_new RENAME TO replicas")
        for statement in STORAGE_TABLES.split(";")[:2]:
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


def stated_storages(db: sqlite3.Connection) -> dict[Any, Any]:
    """Source name -> its ``storages`` row's text; none in a file of version 3 or older."""
    tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if "storages" not in tables:
        return {}
    return dict(db.execute("SELECT source, statuses FROM storages").fetchall())
