"""Event cycles: the daemon's side of a Rucio source's event stream (docs/events.md).

:class:`EventCycles` is, for one Rucio source with ``[sources.events] enabled``, the threads
and the lock around its :class:`~hydrator.core.event_hints.Backlog`, where the decisions are:

* the :class:`~hydrator.core.ports.EventSink` its listener calls (listener threads):
  each message is counted, judged (:class:`~hydrator.core.event_hints.Triage`) and its hint added
  to a bounded :class:`~hydrator.core.event_hints.Batch`;
* a worker thread that runs an *event cycle* at most ``event_debounce_s`` after the first hint
  of a batch: the batch's datasets (at most ``max_event_reads_per_cycle``) are re-read exactly
  through the source's deep path (:class:`TargetedReads`), and the service plans, saves and
  publishes as in any cycle (:meth:`Service.run_event_cycle`); nothing is published
  from a message alone;
* the gate of the scheduled full read (:class:`~.full_read_gate.FullReadGate`, every
  ``[daemon] interval_s``): a full read runs when
  :func:`~hydrator.core.event_hints.full_read_due` says so (start-up, after a reconnect, the
  listener away or silent, hints marked for it, the reconcile interval). A full read reads
  every source: a daemon with other sources beside event-driven Rucio ones reads them all at
  the reconcile interval while events flow, and at ``interval_s`` otherwise; when none is
  due, a *refresh cycle* reads the storage statuses, drains and queues again, and no dataset
  (both: :mod:`hydrator.runtime.full_read_gate`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from functools import partial

from hydrator.config import DEFAULT_DEADLINE_S, RucioEventsConfig
from hydrator.core.between_reads import event_outcomes
from hydrator.core.event_hints import (
    LOOKUP_CYCLES_HELD,
    Backlog,
    Batch,
    Ignored,
    ListenerStatus,
    ReconcilePolicy,
    RucioEvent,
    Triage,
    full_read_due,
    lag_seconds,
)
from hydrator.core.ports import (
    EventListener,
    FetchContext,
    ParentLookups,
    RunsThread,
    TargetedReads,
)
from hydrator.domain import DatasetId, Replica, Snapshot, State
from hydrator.errors import SourceError, TransientSourceError
from hydrator.redact import redact
from hydrator.runtime.metrics import Metrics
from hydrator.runtime.observe import (
    EventCycleRecord,
    calls_of,
    forget_listener,
    record_event_cycle,
    record_hints_covered,
    record_listener,
    record_message,
    record_read_calls,
)
from hydrator.runtime.outcome import CycleReport
from hydrator.runtime.service import Service

log = logging.getLogger(__name__)

STOP_MARGIN_S = 30.0  # beyond the deadlines, for a stopping event cycle to save and publish
ListenerFactory = Callable[[RucioEventsConfig, str, "EventCycles"], EventListener]


class EventCycles:
    """One event-driven source: sink, worker and full-read gate (see the module docstring)
    over one :class:`Backlog`, guarded by one lock. ``service`` runs its cycles;
    ``metrics`` is what it reports to; ``deadlines_s`` is every source's ``deadline_s``
    (source name -> seconds, as :class:`~hydrator.runtime.parts.Catalogue` holds them),
    which bounds how long :meth:`stop` waits. ``clock`` gives monotonic seconds, ``utcnow``
    the wall clock for lags."""

    def __init__(
        self,
        service: Service,
        source: TargetedReads,
        config: RucioEventsConfig,
        policy: ReconcilePolicy,
        scopes: Iterable[str] = (),
        *,
        metrics: Metrics,
        deadlines_s: Mapping[str, float] | None = None,
        clock: Callable[[], float] = time.monotonic,
        utcnow: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.service, self.source, self.config, self.policy = service, source, config, policy
        self.metrics = metrics
        self._deadlines_s = tuple((deadlines_s or {}).values())
        self._clock, self._utcnow = clock, utcnow
        self._lock = threading.Lock()  # guards the backlog: listener, worker and gate threads
        lookups = config.max_parent_lookups_per_cycle
        batch = Batch(config.max_pending_datasets, file_capacity=LOOKUP_CYCLES_HELD * lookups)
        self._backlog = Backlog(Triage(scopes=frozenset(scopes)), batch)
        self._full_read_calls = 0
        self._read_last_cycle = 0  # datasets the last event cycle re-read
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.listener: EventListener | None = None
        self.subscribed = threading.Event()  # set while the listener is subscribed
        self._label = source.name
        self.on_change: Callable[[], None] | None = None  # the listener's state changed
        record_listener(self.metrics, self._label, connected=False, now=time.time())

    # -- the sink (listener threads) ------------------------------------------------------

    def event(self, event: RucioEvent) -> None:
        received = time.time()
        with self._lock:
            dropped = self._backlog.add(event, self._clock())
        ignored = None if dropped is None else dropped.value
        record_message(self.metrics, self._label, event.label, ignored, received)
        if ignored is None:
            self._wake.set()

    def ignored(self, label: str, reason: Ignored) -> None:
        record_message(self.metrics, self._label, label, reason.value, time.time())

    def connection(self, connected: bool) -> None:
        if connected:
            self.subscribed.set()
        else:
            self.subscribed.clear()
        record_listener(self.metrics, self._label, connected, time.time())
        self._wake.set()  # a reconnect makes the full read due at once
        if self.on_change is not None:
            self.on_change()  # the served metrics show it now, not after the next cycle

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        """Start the worker, then the listener (if one was attached)."""
        self._start_worker()
        if self.listener is not None:
            self.listener.start()

    def _start_worker(self) -> None:
        self._thread = threading.Thread(target=self._work, name=f"events-worker-{self._label}")
        self._thread.daemon = True
        self._thread.start()

    def threads(self) -> list[tuple[str, Callable[[], bool], Callable[[], None]]]:
        """The threads to supervise (:class:`~hydrator.runtime.supervise.Supervisor`): name,
        whether it runs, how to start it again: the worker, and the listener."""
        label = self._label
        return [
            (f"events-worker-{label}", self.worker_alive, self._restart_worker),
            (f"events-listener-{label}", self.listener_alive, self._restart_listener),
        ]

    def worker_alive(self) -> bool:
        """The worker runs (or was never started: nothing to supervise)."""
        thread = self._thread
        return thread is None or thread.is_alive() or self._stop.is_set()

    def listener_alive(self) -> bool:
        """The listener's thread runs (:class:`RunsThread`; a listener that cannot say is
        taken as running)."""
        listener = self.listener
        if listener is None or self._stop.is_set():
            return True
        return listener.alive() if isinstance(listener, RunsThread) else True

    def _restart_worker(self) -> None:
        if not self.worker_alive():
            self._start_worker()

    def _restart_listener(self) -> None:
        if self.listener is not None and not self.listener_alive():
            self.listener.start()

    def stop(self) -> None:
        """Stop the listener and the worker; the listener's gauges of this source are
        removed (a reload that turns events off leaves no "connected" nor an alerting
        "disconnected since"; a listener started again sets them anew)."""
        if self.listener is not None:
            self.listener.stop()
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(self._stop_wait_s())
            if self._thread.is_alive():
                log.warning("events %s: the event cycle did not end; stopping anyway", self._label)
        self.subscribed.clear()
        forget_listener(self.metrics, self._label)

    def _stop_wait_s(self) -> float:
        """How long :meth:`stop` waits for a running event cycle (seconds): a reload closes
        the service next. A cycle may wait for a full read, then make its parent lookups and
        its re-reads, each ending by its source's ``deadline_s``: three of the largest, and
        :data:`STOP_MARGIN_S` for saving and publishing."""
        return 3 * max(self._deadlines_s, default=DEFAULT_DEADLINE_S) + STOP_MARGIN_S

    def status(self) -> ListenerStatus:
        return self.listener.status() if self.listener is not None else ListenerStatus()

    # -- full reads --------------------------------------------------------------------------

    def full_read_due(self) -> bool:
        """:func:`~hydrator.core.event_hints.full_read_due`; while the worker is down (nothing
        applies messages) as if the listener were disconnected: at ``interval_s``."""
        with self._lock:
            backlog = self._backlog
            marked, last, again = backlog.marked, backlog.last_full_read, backlog.reconnect_read
        status = self.status()
        if not self.worker_alive():
            status = replace(status, connected=False)
        return full_read_due(
            self._clock(), last, status, self.policy, marked=marked, reconnect_read=again
        )

    def begin_full_read(self) -> float:
        """A full read begins now: the hints held so far are what it covers. Returns this
        source's monotonic clock (seconds), what :meth:`after_full_read` takes."""
        now = self._clock()
        reconnected = self._reconnected()
        with self._lock:
            self._backlog.full_read_begins(now, reconnected)
        return now

    def full_read(self) -> CycleReport:
        """A normal cycle (every source read), then :meth:`after_full_read`."""
        started = self.begin_full_read()
        report = self.service.run_cycle()
        self.after_full_read(report, started)
        return report

    def after_full_read(self, report: CycleReport, started: float) -> None:
        """On this source's success in a full read begun at ``started`` (monotonic): the
        start of the next reconcile period, the time before which messages are out of date
        (the read saw their effect), and the hints held since before it began dropped
        (:meth:`~hydrator.core.event_hints.Batch.drop_covered`, counted); those that arrived
        while it ran are read by the next event cycle."""
        fresh = report.plan is not None and any(
            s.name == self._label and s.fresh for s in report.plan.sources
        )
        if not fresh or report.outcome not in ("ok", "degraded"):
            return
        calls = calls_of(self.source)
        with self._lock:
            if calls is not None:
                self._full_read_calls = sum(calls.values())
            covered = self._backlog.full_read_succeeded(started, report.started, self._clock())
        record_hints_covered(self.metrics, self._label, covered)
        self._wake.set()

    # -- event cycles (the worker thread) -----------------------------------------------------

    def _work(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(timeout=1.0)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self._step()
            except Exception:  # a bug in one cycle must not end event processing
                log.exception(
                    "events %s: a cycle raised an unexpected error; what it should have read"
                    " is left to the next full read",
                    self._label,
                )
                record_event_cycle(self.metrics, EventCycleRecord(self._label, "failed"))
                with self._lock:
                    self._backlog.marked = True

    def _step(self) -> None:
        """One wake of the worker: the full read after a reconnect, or the event cycle once
        the batch's debounce is over."""
        if self._reconnected() and self.full_read_due():
            self.full_read()  # after a reconnect: what was missed while away
            return
        with self._lock:
            first = self._backlog.first_hint
        if first is None:
            return
        delay = first + self.config.event_debounce_s - self._clock()
        if delay > 0 and self._stop.wait(delay):
            return
        self.event_cycle()

    def _reconnected(self) -> bool:
        """Subscribed again since the last full read (the first full read is the scheduler's;
        the other reasons for one are the scheduled gate's)."""
        with self._lock:
            read = self._backlog.last_full_read
        status = self.status()
        at = status.connected_at
        return read is not None and status.connected and at is not None and at >= read

    def event_cycle(self) -> CycleReport | None:
        """Re-read the batch's datasets and publish; None when there was nothing to read, or
        a full read is marked: it covers the batch (held until it begins and dropped once it
        succeeded, :meth:`after_full_read`), so nothing is re-read meanwhile."""
        reads, lookups = (
            self.config.max_event_reads_per_cycle,
            self.config.max_parent_lookups_per_cycle,
        )
        with self._lock:
            taken = self._backlog.take(reads, lookups, self._clock())
        if taken is None:
            return None
        datasets, files, created = taken
        self._read_last_cycle = 0
        report = self.service.run_event_cycle(partial(self._answers, datasets, files))
        record = EventCycleRecord(self._label, report.outcome)
        if report.outcome in ("ok", "degraded"):
            reads = self._read_last_cycle
            saved = max(0, self._full_read_calls - reads - len(files))
            lags = lag_seconds(created, self._utcnow())
            record = replace(record, reads=reads, saved=saved, lags_s=tuple(lags))
        else:
            with self._lock:
                self._backlog.marked = True  # what it should have read waits for the full read
        record_event_cycle(self.metrics, record)
        self.service.notify_listeners()  # the metrics above into the served files now
        log.info(
            "event cycle %s: %d dataset(s) re-read, %s in %.2f s",
            self._label,
            self._read_last_cycle,
            report.outcome,
            report.duration_s,
        )
        return report

    def _answers(
        self,
        datasets: Sequence[DatasetId],
        files: Sequence[tuple[str, str]],
        state: State,
        context: FetchContext,
    ) -> dict[str, Snapshot]:
        """The event cycle's answers (a :data:`~hydrator.runtime.service.Rereader`): this
        source's last answer in ``state`` with ``datasets`` (and the datasets ``files`` belong
        to) read again, every other source's as it stands."""
        name = self._label
        held = state.sources.get(name)
        if held is None or held.last_success is None:
            raise TransientSourceError(f"events {name}: no full read yet to patch")
        if name in self.service.busy_sources():  # it shares the source's book and wire
            raise TransientSourceError(f"events {name}: its abandoned full read still runs")
        if files:
            datasets = list(dict.fromkeys([*datasets, *self._parents(files)]))
        self._read_last_cycle = len(datasets)  # the parents included (the worker's own)
        return event_outcomes(state, name, datasets, self._read(datasets, context))

    def _read(self, datasets: Sequence[DatasetId], context: FetchContext) -> list[Replica]:
        """The targeted read of ``datasets``. An unexpected error (an answer the parser
        rejects in a way it did not foresee, an adapter's bug) is handled as a failed read, as
        a full read handles it: logged once with its traceback, raised as a
        :class:`TransientSourceError` (the cycle fails, the next full read covers it)."""
        try:
            return list(self.source.read_datasets(datasets, context))
        except SourceError:
            raise
        except Exception as exc:
            log.exception("events %s: the targeted read raised an unexpected error", self._label)
            reason = redact(f"events {self._label}: unexpected {type(exc).__name__}: {exc}")
            raise TransientSourceError(reason) from exc
        finally:
            self._count_calls()

    def _parents(self, files: Sequence[tuple[str, str]]) -> list[DatasetId]:
        """The datasets ``files`` belong to (:class:`ParentLookups`); when the source cannot
        say, finds none, or the lookup fails, the next full read covers them (marked)."""
        try:
            if isinstance(self.source, ParentLookups):
                try:
                    found = self.source.parent_datasets(files)
                finally:
                    self._count_calls()
                if found:
                    return found
        except SourceError as exc:
            log.warning(
                "events %s: parent lookup failed, left to the full read: %s", self._label, exc
            )
        with self._lock:
            self._backlog.marked = True
        return []

    def _count_calls(self) -> None:
        record_read_calls(self.metrics, self._label, self.source)
