"""The state store: the last good state, in one SQLite file (stdlib ``sqlite3``).

One transaction per cycle (``BEGIN IMMEDIATE`` … ``COMMIT``) in WAL mode, so a kill at any
moment leaves the old state or the new one, never a mix. A cycle writes only what changed: the
replica rows in the plan's source deltas and one status row per source. A cycle with no change
writes no replica rows.

One writer: a writer holds an exclusive ``flock`` on ``<state>.lock`` (:class:`StateLock`, the
file holds its PID; the kernel drops the lock when the process ends, even by SIGKILL). Readers
(``hydrator show``, ``once --dry-run``) open the database read-only and take no lock.

The schema and its upgrades are in :mod:`~hydrator.adapters.state.schema`, what a save writes
in :mod:`~hydrator.adapters.state.writer`, what a load reads back (every row checked) in
:mod:`~hydrator.adapters.state.loader`, the operator's drains and ``--reset-state`` in
:mod:`~hydrator.adapters.state.drains`.
"""

from __future__ import annotations

import fcntl
import logging
import os
import sqlite3
import urllib.parse
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path

from hydrator.adapters.state.loader import Key, Loader
from hydrator.adapters.state.schema import (
    ROWS_OF,
    SCHEMA,
    SCHEMA_VERSION,
    TABLES,
    VERSION_TABLES,
    WHAT_TO_DO,
    migrate,
)
from hydrator.adapters.state.writer import write_plan
from hydrator.core.plan import Plan
from hydrator.core.storage import Drain
from hydrator.domain import Replica, State
from hydrator.errors import StateError

log = logging.getLogger(__name__)


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
                check_file(path, writable=not read_only)
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
            raise StateError(f"state database {path}: {reason_of(exc)}; {WHAT_TO_DO}") from exc
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
                f"BEGIN; {SCHEMA} INSERT INTO meta VALUES "
                f"('schema_version', '{SCHEMA_VERSION}'); COMMIT;"
            )
        finally:
            db.close()
        for suffix in ("-wal", "-shm"):  # left by a deleted database: never replay them here
            self.path.with_name(self.path.name + suffix).unlink(missing_ok=True)
        temporary.rename(self.path)

    def _check_schema(self) -> None:
        """Refuse a file that is no hydrator state or of an unknown version; a writer
        migrates an older version (:func:`migrate`), a reader reads it as it is."""
        assert self._db is not None
        tables = {r[0] for r in self._db.execute("SELECT name FROM sqlite_master")}
        if not {"meta", "sources", "replicas"} <= tables:
            raise StateError(f"state database {self.path} is not a hydrator state; {WHAT_TO_DO}")
        row = self._db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        version = None if row is None else row[0]
        if version not in VERSION_TABLES:
            raise StateError(
                f"state database {self.path} has schema version {version}; this hydrator "
                f"reads version {SCHEMA_VERSION} (and upgrades versions 1 to 3)"
            )
        if not VERSION_TABLES[version] <= tables:
            raise StateError(f"state database {self.path} is not a hydrator state; {WHAT_TO_DO}")
        self._version = version
        if version != str(SCHEMA_VERSION) and not self.read_only:
            migrate(self._db, version, self.path)
            self._version = str(SCHEMA_VERSION)

    @property
    def rejected_rows(self) -> Mapping[str, int]:
        return dict(self._rejected)

    def load(self) -> State:
        """The saved state (empty on a new database); invalid rows are left out."""
        return self.load_in_order()[0]

    def load_in_order(self) -> tuple[State, Mapping[str, Sequence[Replica]]]:
        """:meth:`load`, and each source's replicas in the order read
        (:class:`~hydrator.core.ports.LoadsInOrder`)."""
        if self._db is None:
            return State(), {}
        try:
            loader = Loader()
            state, as_read = loader.load(self._db, ROWS_OF[self._version])
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
        return state, as_read

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
        """One transaction: every row the plan changes (:func:`write_plan`). Returns the
        replica rows written."""
        db.execute("BEGIN IMMEDIATE")
        written = write_plan(db, plan)
        db.execute("COMMIT")
        return written

    def first_seen(self) -> dict[Key, datetime]:
        """(site, dataset) -> its first-seen time, for every pair whose rows hold a valid one
        (the earliest; rows checked as :meth:`load` checks them, invalid ones left out). For
        inspection: it reads every row, the daemon never calls it."""
        if self._db is None:
            return {}
        try:
            return Loader().replicas(self._db, ROWS_OF[self._version], collect=True)[1]
        except (sqlite3.Error, ValueError, KeyError) as exc:
            raise StateError(f"state database {self.path} unreadable: {exc}; {WHAT_TO_DO}") from exc

    def drains(self) -> list[Drain]:
        """The operator's drains as saved (expired ones too: the core ignores them); none
        in a file of an older version (read-only) or a missing one. Invalid rows are left
        out and counted in :attr:`rejected_rows`; raises :class:`StateError` if unreadable."""
        if self._db is None or self._version != str(SCHEMA_VERSION):
            return []
        loader = Loader()
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


def check_file(path: Path, writable: bool) -> None:
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


def reason_of(exc: BaseException) -> str:
    """What went wrong, without the errno prefix of an OSError."""
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.strerror}" + (f": {exc.filename}" if exc.filename else "")
    return str(exc)
