"""The refresh cycle's answers (docs/events.md): what each source answers in a refresh cycle,
the cycle that replaces a skipped full read (:class:`~hydrator.runtime.full_read_gate.FullReadGate`)
and reads every source's storage statuses again, and no dataset. What a source then answers
is decided in :mod:`hydrator.core.between_reads`; this module reads the statuses.
"""

from __future__ import annotations

import logging

from hydrator.core.between_reads import refresh_outcomes
from hydrator.core.ports import FetchContext, ReadsStorages
from hydrator.domain import Snapshot, State, StorageStatus
from hydrator.errors import SourceError
from hydrator.runtime.observe import record_read_calls
from hydrator.runtime.service import Service

log = logging.getLogger(__name__)


def refresh_answers(
    service: Service, read: dict[str, tuple[str, ...]], state: State, context: FetchContext
) -> dict[str, Snapshot]:
    """The refresh cycle's answers (a :data:`~hydrator.runtime.service.Rereader`): every
    source's last good answer in ``state``, with the storage statuses read now from those
    that can (:class:`ReadsStorages`; into ``read``: source -> the storage elements only a
    full read applies exactly), the last good ones from the others
    (:func:`~hydrator.core.between_reads.refresh_outcomes`)."""
    by_name = {s.name: s for s in service.sources}
    busy = set(service.busy_sources())  # an abandoned full read still uses its wire
    statuses: dict[str, tuple[StorageStatus, ...] | None] = {}
    for name, held in state.sources.items():
        source = by_name.get(name)
        if isinstance(source, ReadsStorages) and name not in busy and held.last_success is not None:
            statuses[name] = _read_storages(service, name, source, context)
    outcomes, exact_only = refresh_outcomes(state, statuses)
    read.update(exact_only)
    return outcomes


def _read_storages(
    service: Service, name: str, source: ReadsStorages, context: FetchContext
) -> tuple[StorageStatus, ...] | None:
    """``source``'s storage statuses now, or None (logged in one line) when the read
    fails: the last good ones stay. Its requests go into ``hydrator_source_calls_total``."""
    try:
        return source.read_storages(context)
    except SourceError as exc:
        log.warning("refresh %s: storage statuses not read, the last ones kept: %s", name, exc)
        return None
    finally:
        record_read_calls(service.metrics, name, source)
