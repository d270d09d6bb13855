"""The scheduled job of a daemon whose Rucio sources follow their event streams
(docs/events.md): every ``[daemon] interval_s``, a full read when one is due, else a
*refresh cycle*, which reads every source's storage statuses, the drains and the queues
again, and no dataset (:class:`FullReadGate`; its plan: :func:`refresh_answers`). What each
source answers in a refresh cycle is decided in :mod:`hydrator.core.between_reads`; the
event cycles themselves run in :mod:`hydrator.runtime.event_worker`; :func:`start_events`
starts them and builds the gate.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from functools import partial

from hydrator.config import Config, RucioSourceConfig
from hydrator.core.between_reads import refresh_outcomes
from hydrator.core.event_hints import ReconcilePolicy
from hydrator.core.ports import FetchContext, ReadsStorages, Source, TargetedReads
from hydrator.domain import Snapshot, State, StorageStatus
from hydrator.errors import ConfigError, SourceError
from hydrator.runtime.event_worker import EventCycles, ListenerFactory
from hydrator.runtime.observe import (
    record_full_read_skipped,
    record_read_calls,
    record_refresh_cycle,
)
from hydrator.runtime.service import Service

log = logging.getLogger(__name__)

SUBSCRIBE_WAIT_S = 10.0  # the start-up full read waits this long at most for the listeners


class FullReadGate:
    """The scheduled job (every ``[daemon] interval_s``) when some source has events: a full
    cycle when one of them says it is due (:meth:`EventCycles.full_read_due`) or the active
    drains changed since the last full read (:meth:`Service.drains_changed`), or always when
    a source without events is configured (it is polled at the normal interval: such a daemon
    gains freshness from events, not fewer reads). Otherwise a refresh cycle
    (:meth:`refresh`), followed by the full read when it found a storage change only a full
    read applies exactly."""

    def __init__(
        self,
        service: Service,
        cycles: Sequence[EventCycles],
        poll_all: bool,
        subscribe_wait_s: float = SUBSCRIBE_WAIT_S,
    ) -> None:
        self.service, self.cycles, self.poll_all = service, list(cycles), poll_all
        self._subscribe_wait_s = subscribe_wait_s  # before the first full read

    def __call__(self) -> None:
        if self._subscribe_wait_s:
            # Subscribe first, then read: a start-up read that began before the subscription
            # would leave a gap, closed only by a second full read after it.
            deadline = time.monotonic() + self._subscribe_wait_s
            for cycles in self.cycles:
                cycles.subscribed.wait(max(0.0, deadline - time.monotonic()))
            self._subscribe_wait_s = 0.0
        due = self.poll_all or any(c.full_read_due() for c in self.cycles)
        if not due and not self.service.drains_changed():
            inexact = self.refresh()
            if not inexact:
                record_full_read_skipped(self.service.metrics)
                return
            log.info("storage %s changed availability: a full read follows", ", ".join(inexact))
        started = [(cycles, cycles.begin_full_read()) for cycles in self.cycles]
        report = self.service.run_cycle()
        for cycles, at in started:
            cycles.after_full_read(report, at)

    def refresh(self) -> list[str]:
        """A refresh cycle instead of the skipped full read (docs/events.md): an event-style
        cycle that reads no dataset but every source's storage statuses where it can
        (:func:`refresh_answers`), the queues afresh (scheduled) and the drains at the current
        time; counted in ``hydrator_refresh_cycles_total`` and logged in one line. Returns
        the storage elements whose new availability only a full read applies exactly
        (:func:`~hydrator.core.between_reads.inexact`)."""
        read: dict[str, tuple[str, ...]] = {}
        report = self.service.run_refresh_cycle(partial(refresh_answers, self.service, read))
        record_refresh_cycle(self.service.metrics, report.outcome)
        self.service.notify_listeners()
        log.info(
            "refresh cycle (no full read due): storage of %s read again, %s in %.2f s",
            ", ".join(read) or "no source",
            report.outcome,
            report.duration_s,
        )
        return [name for names in read.values() for name in names]

    def stop(self) -> None:
        for cycles in self.cycles:
            cycles.stop()


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


def start_events(
    config: Config, service: Service, listener: ListenerFactory
) -> FullReadGate | None:
    """Start an :class:`EventCycles` (worker and listener) per Rucio source with events on;
    the gate for the scheduler, or None when no source has events. ``listener`` builds a
    listener (the daemon's: :func:`hydrator.runtime.wiring.event_listener`, STOMP)."""
    chosen = event_sources(config, service)
    if not chosen:
        return None
    cycles: list[EventCycles] = []
    for source_config, source in chosen:
        if not isinstance(source, TargetedReads):
            raise ConfigError(
                f"sources.{source_config.name}.events", "this source cannot re-read datasets"
            )
        events = source_config.events
        policy = ReconcilePolicy(
            config.daemon.interval_s, events.reconcile_interval_s, events.silence_s
        )
        made = EventCycles(service, source, events, policy, source_config.scopes)
        made.listener = listener(events, source_config.name, made)
        made.start()
        cycles.append(made)
    poll_all = len(chosen) < len(service.sources)
    return FullReadGate(service, cycles, poll_all)


def event_sources(config: Config, service: Service) -> list[tuple[RucioSourceConfig, Source]]:
    """The configured Rucio sources with ``[sources.events] enabled``, with their adapters."""
    by_name = {s.name: s for s in service.sources}
    return [
        (c, by_name[c.name])
        for c in config.sources
        if isinstance(c, RucioSourceConfig) and c.events.enabled and c.name in by_name
    ]
