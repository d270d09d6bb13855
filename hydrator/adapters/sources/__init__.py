"""Catalogue sources: each turns one external system into a :class:`~hydrator.domain.Snapshot`.

A source is one adapter module (``static``, ``rucio``, ``dmapi``); only that module imports its
library. It raises :class:`~hydrator.errors.TransientSourceError` or
:class:`~hydrator.errors.PermanentSourceError` when it has no usable answer; it never returns a
partial answer as if it were complete. Records it cannot use (malformed, invalid names, storage
elements with no site) are counted in ``Snapshot.invalid`` / ``Snapshot.unmapped`` and skipped.
The helpers below are what the sources share for that: :func:`site_or_none` for a site name read
from an untrusted record, :class:`OnceLog` to log each such problem once.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from hydrator.core.storage import Drain
from hydrator.domain import DatasetId, InvalidNameError, Replica, Site, Snapshot, check_site

MAX_REMEMBERED_PROBLEMS = 10_000


@dataclass(frozen=True)
class FetchContext:
    """What a source may use in one cycle.

    ``now`` is the cycle's start (UTC). ``wanted`` counts, per dataset, the queued jobs that
    declare it in ``RequiredDatasets`` (empty when no demand provider is configured).
    ``previous`` maps a source's name to the replicas of its last good answer as the daemon
    holds them (loaded from the state after a restart; absent or empty when there are none).
    Read-only: a source that has no answer of its own to compare with (its first fetch, or the
    one after a failure) may return these very objects for the pairs whose replica is equal,
    so that the daemon holds one object per replica instead of a loaded and a fetched one.
    ``drains`` are the operator's (``hydrator drain``): a source that knows storage elements
    treats a drained one as unavailable while the drain is active
    (:func:`hydrator.core.storage.judge`).
    """

    now: datetime
    wanted: Mapping[DatasetId, int] = field(default_factory=dict)
    previous: Mapping[str, AbstractSet[Replica]] = field(default_factory=dict)
    drains: Sequence[Drain] = ()


class Source(Protocol):
    """A catalogue adapter."""

    @property
    def name(self) -> str: ...

    def fetch(self, context: FetchContext) -> Snapshot:
        """Answer for this cycle, or raise a SourceError subclass."""
        ...

    def close(self) -> None:
        """Release connections; called once at shutdown."""
        ...


def site_or_none(name: object) -> Site | None:
    """``name`` as a :data:`Site`, or None when it is not a string or not a valid site name
    (the caller decides whether that record is unmapped or invalid, and logs it)."""
    if not isinstance(name, str):
        return None
    try:
        return check_site(name)
    except InvalidNameError:
        return None


class OnceLog:
    """Logs a warning about a record the first time its ``key`` is seen, so that a bad record
    repeated in every answer is logged once per process, not once per cycle.

    Thread-safe. Memory is bounded: after ``limit`` distinct keys, new problems are no longer
    logged (they are still counted by the caller).
    """

    def __init__(self, logger: logging.Logger, limit: int = MAX_REMEMBERED_PROBLEMS) -> None:
        self._logger = logger
        self._limit = limit
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def warn(self, key: str, message: str, *args: object) -> None:
        """``logger.warning(message, *args)`` unless ``key`` was seen before (or the limit hit)."""
        with self._lock:
            if key in self._seen or len(self._seen) >= self._limit:
                return
            self._seen.add(key)
        self._logger.warning(message, *args)
