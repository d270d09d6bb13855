"""The scheduled job of a daemon whose Rucio sources follow their event streams
(docs/events.md): every ``[daemon] interval_s``, a full read when one is due, else a
*refresh cycle*, which reads every source's storage statuses, the drains and the queues
again, and no dataset (:class:`FullReadGate`; its answers:
:func:`~hydrator.runtime.refresh_answers.read_and_restate`). The event cycles themselves run
in :mod:`hydrator.runtime.event_worker`; :func:`hydrator.runtime.wiring.start_events` starts
them and builds the gate.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from hydrator.core.ports import FetchContext, Source
from hydrator.domain import Snapshot, State
from hydrator.runtime.event_worker import EventCycles
from hydrator.runtime.metrics import Metrics
from hydrator.runtime.observe import record_full_read_skipped, record_refresh_cycle
from hydrator.runtime.refresh_answers import RefreshAnswers, read_and_restate
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
    read applies exactly. ``service`` runs the cycles; ``metrics`` is what the gate reports
    to; ``sources`` are the service's, whose storage statuses a refresh cycle reads."""

    def __init__(
        self,
        service: Service,
        cycles: Sequence[EventCycles],
        poll_all: bool,
        subscribe_wait_s: float = SUBSCRIBE_WAIT_S,
        *,
        metrics: Metrics,
        sources: Sequence[Source],
    ) -> None:
        self.service, self.cycles, self.poll_all = service, list(cycles), poll_all
        self._metrics, self._sources = metrics, tuple(sources)
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
                record_full_read_skipped(self._metrics)
                return
            log.info("storage %s changed availability: a full read follows", ", ".join(inexact))
        started = [(cycles, cycles.begin_full_read()) for cycles in self.cycles]
        report = self.service.run_cycle()
        for cycles, at in started:
            cycles.after_full_read(report, at)

    def refresh(self) -> list[str]:
        """A refresh cycle instead of the skipped full read (docs/events.md): an event-style
        cycle that reads no dataset but every source's storage statuses where it can
        (:func:`read_and_restate`), the queues afresh (scheduled) and the drains at the current
        time; counted in ``hydrator_refresh_cycles_total`` and logged in one line. Returns
        the storage elements whose new availability only a full read applies exactly
        (:func:`~hydrator.core.between_reads.inexact`)."""
        taken: list[RefreshAnswers] = []  # the cycle's answers, once it has read them

        def answers(state: State, context: FetchContext) -> dict[str, Snapshot]:
            refreshed = read_and_restate(
                state,
                context,
                sources=self._sources,
                metrics=self._metrics,
                busy=self.service.busy_sources,
            )
            taken.append(refreshed)
            return refreshed.outcomes

        report = self.service.run_refresh_cycle(answers)
        read = taken[-1].exact_only if taken else {}
        record_refresh_cycle(self._metrics, report.outcome)
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
