"""What a load reads back: rows to a :class:`~hydrator.domain.State`, each row checked.

Nothing read back is trusted: every row is checked with the rules fresh input meets
(:class:`~hydrator.domain.DatasetId`, :func:`~hydrator.domain.check_site`); a row that fails is
counted in :attr:`~.sqlite.SqliteStateStore.rejected_rows`, logged once per load, and never used (a
replica row whose only fault is its first-seen time keeps its replica and counts under
``first_seen``). A file that exists but is empty or not a hydrator database is an error, never
an empty start.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any

from hydrator.adapters.state.schema import EARLIEST, LATEST, TABLES, stated_storages
from hydrator.config import SOURCE_NAME_PATTERN
from hydrator.core.storage import Drain, clean_text
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
from hydrator.names import STORAGE_PATTERN, InvalidNameError

Key = tuple[Site, DatasetId]

_SHAPES = 65_536  # the loader's bound on distinct replica shapes kept (a few dozen in practice)


class Loader:
    """Rows -> :class:`State`, each row checked as fresh input is; rejects counted by table.

    One object per distinct site name, dataset, fraction, detail and time, as SQLite hands out
    a new str/float per row (a duplicate per row otherwise); names and replica
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
        :data:`~.schema.VALID_FIRST_SEEN` leaves out, and more)."""
        if value is None:
            return None
        found = self.times.get(value)
        if found is None:
            if not (isinstance(value, float | int) and EARLIEST <= value < LATEST):
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

    def load(self, db: sqlite3.Connection, query: str) -> tuple[State, dict[str, list[Replica]]]:
        """The state of ``db``'s rows, and each source's replicas in row order."""
        loaded = self.replicas(db, query)[0]
        sources: dict[str, SourceState] = {}
        stated = stated_storages(db)
        for row in db.execute("SELECT * FROM sources ORDER BY name"):
            try:
                with_stated = (*row, stated.get(row[0], "[]"))
                sources[row[0]] = self.source(with_stated, loaded.get(row[0], ()))
            except (ValueError, TypeError, OverflowError, OSError) as exc:
                self.reject("sources", exc)
        return State(sources=sources), {n: loaded.get(n, []) for n in sources}

    def replicas(
        self, db: sqlite3.Connection, query: str, *, collect: bool = False
    ) -> tuple[dict[str, list[Replica]], dict[Key, datetime]]:
        """Source -> the replicas of its rows that pass the checks, and with ``collect``
        the first-seen times of their (site, dataset) keys: the earliest valid time of the
        pair's rows (without, an empty map: each row's time is checked, an invalid one
        counted, and none kept). The hot loop: locals, and no conversion where the caches
        know the values already (a row of a known shape reuses the shape's state and detail
        objects)."""
        loaded: dict[str, list[Replica]] = {}
        first_seen: dict[Key, datetime] = {}
        datasets, sites, times = self._datasets.get, self._sites.get, self.times.get
        earliest, shapes = first_seen.setdefault, self._shapes.get
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
                    replica = Replica(dataset, site, *shape)
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
        (every field after the site) kept for the next rows of the same values. At most
        :data:`_SHAPES` shapes are kept."""
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
                out.append(status_of(item, self.site, self.time))
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
                out.append(drain_of(self.site(site), (storage, reason, since, until), self.time))
            except (ValueError, TypeError, OverflowError, OSError) as exc:
                self.reject("drains", exc)
        return out


TimeOf = Callable[[Any], datetime | None]


def status_of(item: Any, site_of: Callable[[str], Site], time_of: TimeOf) -> StorageStatus:
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


def drain_of(site: Site, row: tuple[Any, ...], time_of: TimeOf) -> Drain:
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
