"""The refresh cycle's answers (docs/events.md): what each source answers in a refresh cycle,
the cycle that replaces a skipped full read (:class:`~hydrator.runtime.full_read_gate.FullReadGate`)
and reads every source's storage statuses again, and no dataset. What a source then answers
is decided in :mod:`hydrator.core.between_reads`; this module reads the statuses and asks it
(:func:`read_and_restate`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple

from hydrator.core.between_reads import refresh_outcomes
from hydrator.core.ports import FetchContext, ReadsStorages, Source
from hydrator.domain import Snapshot, State, StorageStatus
from hydrator.errors import SourceError
from hydrator.runtime.metrics import Metrics
from hydrator.runtime.observe import record_read_calls

log = logging.getLogger(__name__)


class RefreshAnswers(NamedTuple):
    """What :func:`read_and_restate` gives: each source's answer, and per source whose
    storage statuses were read, the storage elements whose change only a full read applies
    exactly (:func:`~hydrator.core.between_reads.inexact`)."""

    outcomes: dict[str, Snapshot]
    exact_only: dict[str, tuple[str, ...]]


def read_and_restate(
    state: State,
    context: FetchContext,
    *,
    sources: Sequence[Source],
    metrics: Metrics,
    busy: Callable[[], Iterable[str]],
) -> RefreshAnswers:
    """A refresh cycle's answers: reads the storage statuses now from those of ``sources``
    that can (:class:`ReadsStorages`, their calls counted in ``metrics``) and asks the core
    for every source's last good answer in ``state`` restated with them, the last good
    statuses kept for the others (:func:`~hydrator.core.between_reads.refresh_outcomes`).
    ``busy`` names the sources whose abandoned full read still runs
    (:meth:`hydrator.runtime.service.Service.busy_sources`): they are not read."""
    by_name = {s.name: s for s in sources}
    busy_now = set(busy())  # an abandoned full read still uses its wire
    statuses: dict[str, tuple[StorageStatus, ...] | None] = {}
    for name, held in state.sources.items():
        source = by_name.get(name)
        if not isinstance(source, ReadsStorages) or name in busy_now:
            continue
        if held.last_success is not None:
            statuses[name] = _read_storages(metrics, name, source, context)
    return RefreshAnswers(*refresh_outcomes(state, statuses))


def _read_storages(
    metrics: Metrics, name: str, source: ReadsStorages, context: FetchContext
) -> tuple[StorageStatus, ...] | None:
    """``source``'s storage statuses now, or None (logged in one line) when the read
    fails: the last good ones stay. Its requests go into ``hydrator_source_calls_total``."""
    try:
        return source.read_storages(context)
    except SourceError as exc:
        log.warning("refresh %s: storage statuses not read, the last ones kept: %s", name, exc)
        return None
    finally:
        record_read_calls(metrics, name, source)
