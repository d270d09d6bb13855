"""The operator's drains in the state file, and ``--reset-state``, which keeps them.

``drains`` is the one table written by another process than the daemon: ``hydrator drain`` and
``undrain`` write it in a transaction of their own (:func:`set_drain`, :func:`remove_drain`)
without the writer lock, which the running daemon holds; the daemon reads it at the start of
every cycle (:meth:`SqliteStateStore.drains`), so a drain takes effect within one cycle and
outlives restarts, also ``--reset-state``, which moves the file aside but keeps the drains
(:func:`reset_state`).
"""

from __future__ import annotations

import json
import logging
import sqlite3
import urllib.parse
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from hydrator.adapters.state.schema import SCHEMA_VERSION, stated_storages
from hydrator.adapters.state.sqlite import SqliteStateStore, StateLock, reason_of
from hydrator.adapters.state.writer import epoch
from hydrator.core.storage import Drain, clean_text
from hydrator.domain import Site
from hydrator.errors import StateError

log = logging.getLogger("hydrator.adapters.state.sqlite")


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
                    epoch(drain.until),
                ),
            )
        finally:
            db.close()
    except (sqlite3.Error, OSError) as exc:
        raise StateError(f"state database {path}: drain not saved: {reason_of(exc)}") from exc


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
        raise StateError(f"state database {path}: drain not removed: {reason_of(exc)}") from exc


def reported_targets(path: Path) -> tuple[set[str], set[tuple[str, str]]]:
    """The sites the sources' last good answers cover, and the (site, storage element) of
    every storage status they hold, read from ``path`` alone (no replica row): what the drain
    command checks a name against. Both empty when there is no file yet."""
    if not path.exists():
        return set(), set()
    try:
        db = sqlite3.connect(f"file:{urllib.parse.quote(str(path))}?mode=ro", uri=True)
        try:
            texts = list(stated_storages(db).values())
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
