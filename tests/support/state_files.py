"""State files of earlier releases (tests/unit/adapters/state/data), with the configuration that
wrote them: the demo inventories as two static sources and their [sites]; and a schema-2 copy of
any later state file (:func:`downgrade_to_schema_2`, also the migration benchmark's)."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

DATA = Path(__file__).parents[1] / "unit" / "adapters" / "state" / "data"


def old_state_config(tmp_path: Path, state_file: str) -> Path:
    """``state_file`` (e.g. ``state-v2.sqlite``) copied to ``tmp_path/state.sqlite`` with its
    inventories, and the path of a config like the one that wrote it."""
    shutil.copy(DATA / state_file, tmp_path / "state.sqlite")
    for name in ("inventory.toml", "inventory-extra.toml"):
        shutil.copy(DATA / name, tmp_path / name)
    path = tmp_path / "hydrator.toml"
    path.write_text(
        '[daemon]\nstate_path = "state.sqlite"\n'
        '[[sources]]\ntype = "static"\nname = "demo"\npath = "inventory.toml"\n'
        '[[sources]]\ntype = "static"\nname = "extra"\npath = "inventory-extra.toml"\n'
        '[sites]\nCH_DISK = "SRCNET_CH"\nUK_DISK = "SRCNET_UK"\nUK_SCRATCH = "SRCNET_UK"\n'
        'ES_DISK = "SRCNET_ES"\n'
    )
    return path


# Schema 2 as the release before schema 3 (befc475) created it, and its rows from a schema-3
# file: each pair's time in a first_seen row of its own, replica rows without the column.
_SCHEMA_2 = """
CREATE TABLE replicas_v2 (
    source TEXT NOT NULL, site TEXT NOT NULL, scope TEXT NOT NULL, name TEXT NOT NULL,
    state TEXT NOT NULL, fraction REAL NOT NULL,
    transfer TEXT NOT NULL DEFAULT 'none', progress REAL NOT NULL DEFAULT 0,
    bytes_fraction REAL NOT NULL DEFAULT 1,
    PRIMARY KEY (source, site, scope, name)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS first_seen (
    site TEXT NOT NULL, scope TEXT NOT NULL, name TEXT NOT NULL, at REAL NOT NULL,
    PRIMARY KEY (site, scope, name)) WITHOUT ROWID;
INSERT INTO first_seen SELECT site, scope, name, min(first_seen) FROM replicas
    WHERE first_seen IS NOT NULL GROUP BY site, scope, name ORDER BY site, scope, name;
INSERT INTO replicas_v2 SELECT source, site, scope, name, state, fraction, transfer, progress,
    bytes_fraction FROM replicas;
DROP TABLE replicas;
ALTER TABLE replicas_v2 RENAME TO replicas;
DROP TABLE IF EXISTS drains;
DROP TABLE IF EXISTS storages;
UPDATE meta SET value = '2' WHERE key = 'schema_version';
"""


def downgrade_to_schema_2(path: Path) -> None:
    """Rewrite the schema-4 file ``path`` (closed) as the schema-2 file of the same state."""
    db = sqlite3.connect(path, isolation_level=None)
    try:
        db.executescript(f"BEGIN; {_SCHEMA_2} COMMIT;")
        db.execute("VACUUM")
    finally:
        db.close()
