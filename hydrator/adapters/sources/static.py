"""A static inventory in a TOML file, re-read every cycle: the demo, tests, and sites that no
catalogue covers. Format (one table per storage element)::

    [storage.CH_DISK]                 # site from the config's [sites], else ``site`` below
    site = "SRCNET_CH"
    available = ["ska:obs_1234"]
    partial = { "ska:obs_1300" = 0.4 }        # dataset -> share of files (and bytes) present
    replicating = { "ska:obs_1400" = 0.1 }    # absent, transfer active: dataset -> progress
    stuck = ["ska:obs_1500"]                  # absent, transfer stuck (list: progress 0)
    unavailable = "disk controller replaced"  # the element cannot serve now

Each key is one presence/transfer combination a catalogue reports; a list means fraction 1.0
for ``available``/``partial`` and progress 0 for ``replicating``/``stuck``. ``unavailable``
states that the element cannot serve (as Rucio's ``availability_read`` false does): what it
holds counts for nothing at its site, and the site's ad says why. An operator drain
(``hydrator drain SITE --storage ELEMENT``) does the same. Each element is reported with its
availability (:class:`~hydrator.domain.StorageStatus`).

A malformed entry or an invalid dataset name is counted in ``Snapshot.invalid`` and skipped; a
storage element with no site goes to ``Snapshot.unmapped``. A file that cannot be read or parsed
raises :class:`~hydrator.errors.PermanentSourceError` (the last good snapshot stays in use).

Replace the file atomically: write a temporary file in the same directory and rename it over
the inventory. A file rewritten in place is never used half-written: one that changed while it
was read (size, mtime or inode) raises :class:`~hydrator.errors.TransientSourceError` and is
read again next cycle. One modified less than ``settle_s`` ago is read again as soon as it has
been unmodified that long (the fetch waits, so a fresh inventory is served within ``settle_s``,
not a cycle later), unless that wait would pass the fetch's ``deadline_s``: then it raises
TransientSourceError and is read next cycle.

Only a regular file is read (a FIFO or a device raises PermanentSourceError without blocking),
and at most ``max_bytes`` of it (a larger file raises PermanentSourceError).
"""

from __future__ import annotations

import logging
import os
import time
import tomllib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from hydrator.adapters.sources import site_or_none
from hydrator.config import StaticSourceConfig
from hydrator.core.index import merged_snapshot
from hydrator.core.ports import FetchContext
from hydrator.core.presence import holding
from hydrator.core.storage import Statement, judge
from hydrator.domain import (
    DatasetId,
    ElementCount,
    Replica,
    ReplicaState,
    Site,
    Snapshot,
    StorageStatus,
    Transfer,
)
from hydrator.errors import PermanentSourceError, TransientSourceError
from hydrator.files import FileRefused, open_regular, read_at_most
from hydrator.logs import ProblemLog
from hydrator.names import STORAGE_PATTERN, shown

log = logging.getLogger(__name__)

_KEYS = {"site", "available", "partial", "replicating", "stuck", "unavailable"}
SETTLE_MARGIN_S = 1.0  # a settle wait must end this long before the deadline (to read, parse)
UNLIMITED_BYTES = 1 << 62


class StaticSource:
    """:class:`~hydrator.core.ports.Source` over an inventory file."""

    def __init__(
        self,
        name: str,
        path: Path,
        sites: Mapping[str, str],
        *,
        settle_s: float = 0.0,
        clock: Callable[[], float] = time.time,
        deadline_s: float = 0.0,
        max_bytes: int = UNLIMITED_BYTES,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        """``settle_s``: seconds a file must be unmodified before it is used (0: no wait);
        ``clock``: wall-clock seconds since the epoch, compared with the file's mtime;
        ``deadline_s``: the fetch's deadline, the bound of a wait for the file to settle
        (0: never wait); ``max_bytes``: the largest file read."""
        self._name = name
        self.path = path
        self.sites = dict(sites)
        self.settle_s = settle_s
        self.deadline_s = deadline_s
        self.max_bytes = max_bytes
        self._clock = clock
        self._sleep = sleep
        self._problems: ProblemLog[str] = ProblemLog(log, once_per_process=True)

    @property
    def name(self) -> str:
        return self._name

    def fetch(self, context: FetchContext) -> Snapshot:
        try:
            raw = tomllib.loads(self._read().decode("utf-8-sig"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise PermanentSourceError(f"{self.path}: not valid TOML: {exc}") from exc
        storage = raw.get("storage")
        if not isinstance(storage, dict):
            raise PermanentSourceError(f"{self.path}: no [storage.<name>] tables")
        replicas: list[Replica] = []
        sites: set[Site] = set()
        unmapped: set[str] = set()
        statuses: list[StorageStatus] = []
        elements: dict[str, ElementCount] = {}  # for the site guard: a table gone holds its site
        invalid = 0
        for element, entry in storage.items():
            site = self._site_of(element, entry)
            if site is None:
                unmapped.add(element)
                continue
            sites.add(site)
            held: list[Replica] = []
            for item in _entries(entry):
                replica = self._replica(element, site, item)
                if replica is None:
                    invalid += 1
                else:
                    held.append(replica)
            status = self._status(element, site, entry, held, context)
            if status is not None:
                statuses.append(status)
            if status is None or status.available:
                replicas += held
                elements[element] = ElementCount(site, len(held))
        answer = merged_snapshot(self.name, replicas, sites, invalid, unmapped, storages=statuses)
        return replace(answer, elements=elements)

    def _status(
        self,
        element: str,
        site: Site,
        entry: dict[str, Any],
        held: list[Replica],
        context: FetchContext,
    ) -> StorageStatus | None:
        """The element's availability (None for a name no status can carry: always serves)."""
        said = entry.get("unavailable")
        if said is not None and not isinstance(said, str):
            self._warn_once(f"{self.path}: storage.{element}: unavailable must be a string")
            said = "unavailable"
        if not STORAGE_PATTERN.fullmatch(element):
            return None
        wanted = sum(1 for r in held if r.present and r.dataset in context.wanted)
        stated = Statement(site, element, "storage", disabled=said)
        return judge(stated, context.drains, context.now, wanted)

    def _read(self) -> bytes:
        """The file's bytes, once it held still during the read and for ``settle_s`` before
        (waiting for that while the wait ends ``SETTLE_MARGIN_S`` before the deadline)."""
        waited_s = 0.0
        while True:
            data, age_s = self._read_once()
            wait_s = self.settle_s - abs(age_s)
            if wait_s <= 0:
                return data
            if waited_s + wait_s > self.deadline_s - SETTLE_MARGIN_S:
                raise TransientSourceError(
                    f"{self.path}: modified {age_s:.1f} s ago, less than settle_s = "
                    f"{self.settle_s:g}; re-read next cycle (write a temporary file and "
                    "rename it over this one)"
                )
            log.debug("%s: modified %.1f s ago; reading it in %.1f s", self.path, age_s, wait_s)
            self._sleep(wait_s)
            waited_s += wait_s

    def _read_once(self) -> tuple[bytes, float]:
        """The file's bytes, if it held still during the read, and its age in seconds."""
        try:
            with open_regular(self.path) as handle:
                before = os.fstat(handle.fileno())
                data = read_at_most(handle, self.max_bytes)
                after = os.fstat(handle.fileno())
        except FileRefused as exc:
            raise PermanentSourceError(f"{self.path}: cannot read: {exc}") from exc
        except OSError as exc:
            raise PermanentSourceError(f"{self.path}: cannot read: {exc.strerror}") from exc
        if _version(before) != _version(after):
            raise TransientSourceError(
                f"{self.path}: changed while being read; re-read next cycle (write a "
                "temporary file and rename it over this one)"
            )
        return data, self._clock() - after.st_mtime

    def _site_of(self, element: str, entry: Any) -> Site | None:
        """The element's site from [sites], else from its ``site`` key; None when there is none
        or it is not a valid site name (logged once)."""
        name = self.sites.get(element) or (entry.get("site") if isinstance(entry, dict) else None)
        site = site_or_none(name)
        if site is None and name is not None:
            self._warn_once(f"{self.path}: storage.{element}: invalid site name {shown(name)}")
        return site

    def _replica(
        self, element: str, site: Site, item: tuple[str | None, Any, Any]
    ) -> Replica | None:
        state, name, fraction = item
        try:
            if state is None:
                raise ValueError(f"unknown key {name!r}")
            dataset, kind = DatasetId.parse(name), ReplicaState(state)
            if kind is ReplicaState.REPLICATING or kind is ReplicaState.STUCK:
                progress = 0.0 if fraction is None else float(fraction)
                return _checked(
                    holding(
                        dataset, site, 0.0, 0.0, transfer=Transfer(kind.value), progress=progress
                    ),
                    progress,
                )
            value = 1.0 if fraction is None else float(fraction)
            return _checked(holding(dataset, site, value, value), value)
        except (ValueError, TypeError) as exc:
            self._warn_once(f"{self.path}: storage.{element}: skipped: {exc}")
            return None

    def _warn_once(self, message: str) -> None:
        self._problems.problem(message, "%s", message)

    def close(self) -> None:
        """Nothing to release."""


def _entries(entry: Any) -> Iterator[tuple[str | None, Any, Any]]:
    """(state, dataset, fraction) triples of one storage table; bad shapes yield state None."""
    if not isinstance(entry, dict):
        yield (None, "<not a table>", None)
        return
    for key, value in entry.items():
        if key not in _KEYS:
            yield (None, key, None)
        elif key in ("site", "unavailable"):
            continue
        elif isinstance(value, list):
            yield from ((key, name, None) for name in value)
        elif isinstance(value, dict):
            yield from ((key, name, fraction) for name, fraction in value.items())
        else:
            yield (None, key, None)


def _version(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _checked(replica: Replica | None, value: float) -> Replica:
    """``holding`` clamps shares to 0..1: an inventory value outside that range is an error,
    as is an entry that says nothing is there and nothing moves (a partial share of 0)."""
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"fraction {value!r} outside 0..1")
    if replica is None:
        raise ValueError("nothing present and no transfer")
    return replica


def build(config: StaticSourceConfig, sites: Mapping[str, str]) -> StaticSource:
    return StaticSource(
        config.name,
        config.path,
        sites,
        settle_s=config.settle_s,
        deadline_s=config.deadline_s,
        max_bytes=config.max_inventory_bytes,
    )
