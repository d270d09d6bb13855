"""The daemon: APScheduler triggers :meth:`Service.run_cycle`; signals set the stop event.

One interval job with jitter, ``max_instances=1`` and ``coalesce=True``: a slow cycle delays the
next instead of stacking up. On SIGTERM/SIGINT the running cycle finishes, or is abandoned
before it saves anything, and the process exits 0. SIGHUP reloads the configuration
(:class:`Daemon`).

APScheduler logs a warning each time the trigger fires while the cycle still runs (every
``interval_s`` of a long cycle). :class:`LongCycles` says it once instead: a line when the
first scheduled run is skipped, and a warning with the cycle's duration and the number of
skipped runs when it ends. APScheduler's scheduler logger is set to errors only: its warnings
are that repeating line and a failing job store, and the in-memory store here cannot fail.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from types import FrameType

from apscheduler.events import EVENT_JOB_MAX_INSTANCES, JobSubmissionEvent
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.schedulers.base import BaseScheduler
from apscheduler.triggers.interval import IntervalTrigger

from hydrator.config import Config
from hydrator.errors import ConfigError, HydratorError
from hydrator.runtime.full_read_gate import FullReadGate
from hydrator.runtime.http_endpoint import HttpEndpoint
from hydrator.runtime.metrics import Metrics
from hydrator.runtime.observe import record_sources_removed
from hydrator.runtime.repair import schedule_repairs
from hydrator.runtime.reschedule_after_cycle import install as install_reschedule
from hydrator.runtime.service import Service
from hydrator.runtime.supervise import Supervisor, log_thread_deaths
from hydrator.runtime.wiring import Assembly, event_listener, start_events

log = logging.getLogger(__name__)


class LongCycles:
    """The cycle job, wrapped to report once per long cycle instead of once per skipped run.

    ``run`` is the cycle; ``clock`` gives monotonic seconds. Register :meth:`skipped` as the
    scheduler's listener for ``EVENT_JOB_MAX_INSTANCES``.
    """

    def __init__(
        self,
        run: Callable[[], object],
        interval_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._run, self._interval_s, self._clock = run, interval_s, clock
        self._lock = threading.Lock()
        self._started: float | None = None
        self._skipped = 0

    def __call__(self) -> None:
        with self._lock:
            self._started, self._skipped = self._clock(), 0
        try:
            self._run()
        finally:
            with self._lock:
                started, skipped, self._started = self._started, self._skipped, None
            if skipped:
                log.warning(
                    "a cycle took %.1f s, longer than interval_s = %g s: %d scheduled run(s) "
                    "skipped meanwhile",
                    self._clock() - (started or 0.0),
                    self._interval_s,
                    skipped,
                )

    def skipped(self, event: JobSubmissionEvent) -> None:
        with self._lock:
            self._skipped += 1
            first, started = self._skipped == 1, self._started
        if first and started is not None:
            log.info(
                "the cycle is still running after %.1f s (interval_s = %g s): skipping scheduled"
                " runs until it ends",
                self._clock() - started,
                self._interval_s,
            )


def schedule_cycles(
    scheduler: BaseScheduler, run: Callable[[], object], interval_s: float, jitter_s: float
) -> LongCycles:
    """Add the cycle job (first run at once) and the once-per-long-cycle reporting."""
    cycles = LongCycles(run, interval_s)
    # APScheduler 3.x warns on this logger only of a skipped run (said by LongCycles instead)
    # and of a job store that fails (the in-memory one cannot); its errors still show
    logging.getLogger("apscheduler.scheduler").setLevel(logging.ERROR)
    scheduler.add_listener(cycles.skipped, EVENT_JOB_MAX_INSTANCES)
    scheduler.add_job(
        cycles,
        IntervalTrigger(seconds=interval_s, jitter=jitter_s),
        id="cycle",
        max_instances=1,
        coalesce=True,
        misfire_grace_time=None,
        next_run_time=datetime.now(UTC),
    )
    return cycles


def catch_reloads() -> threading.Event:
    """From now on SIGHUP sets the returned event instead of ending the process (its default):
    a reload asked for while the daemon starts (``systemctl reload`` right after ``start``)
    is kept for :class:`Daemon` to carry out once it runs."""
    asked = threading.Event()
    signal.signal(signal.SIGHUP, lambda _signum, _frame: asked.set())
    return asked


class Daemon:
    """``hydrator run``: the cycle loop, the HTTP endpoint and the signals.

    SIGTERM/SIGINT stop it (the running cycle finishes or is abandoned, exit 0). SIGHUP reloads
    the configuration: ``load`` reads and validates it first; one that is invalid (a bad key,
    or a service that cannot be built from it) is refused with one error line naming the
    problem, and the running configuration goes on. A valid one replaces the service between
    cycles (the running cycle ends and saves first; the state's lock is released and taken
    again, the state read again, the metrics kept; the old state is let go only afterwards,
    so for a moment the daemon holds two); its first cycle runs at once. A source the new
    configuration no longer names is gone entirely: its fetch threads and connections with the
    old service, its labelled series from ``/metrics``. ``[http]`` and the
    logging keys are read at start only (the listener and its server stay; a change is
    logged as needing a restart).

    ``assembly`` is the service and the parts it was built over
    (:class:`~hydrator.runtime.wiring.Assembly`): the daemon hands each part beside the
    service what it uses from there, and takes a reload's new assembly (``build``, over the
    same metrics) as a whole, so nothing keeps a part of the service it replaced."""

    def __init__(
        self,
        config: Config,
        assembly: Assembly,
        load: Callable[[], Config] | None = None,
        build: Callable[[Config, Metrics], Assembly] | None = None,
        reloads: threading.Event | None = None,
    ) -> None:
        self.config, self.assembly = config, assembly
        self._metrics = assembly.instruments.metrics  # the daemon's, kept across reloads
        self._load, self._build = load, build
        self._stop = threading.Event()
        self._reload = reloads if reloads is not None else threading.Event()
        self.endpoint: HttpEndpoint | None = None
        self._scheduler: BaseScheduler | None = None
        self._gate: FullReadGate | None = None
        self._closed = False  # the service is closed (a reload that could rebuild none)
        backoff = config.daemon.thread_restart_backoff_s
        self.supervisor = Supervisor(self._metrics, backoff)  # driven by run()'s loop

    @property
    def service(self) -> Service:
        """The service running now (a reload replaces it)."""
        return self.assembly.service

    def _signal(self, signum: int, _frame: FrameType | None) -> None:
        if signum == signal.SIGHUP:
            self._reload.set()
            return
        log.info("received %s, stopping", signal.Signals(signum).name)
        self._stop.set()
        self.service.stop()
        self.supervisor.poke()  # wakes run()'s loop

    def _start_cycles(self) -> None:
        """Start the event listeners of the sources that follow events (their gate then runs
        the scheduled full reads, :func:`~hydrator.runtime.wiring.start_events`) and the
        scheduler."""
        daemon = self.config.daemon
        # None: no source follows events
        self._gate = start_events(self.config, self.assembly, event_listener)
        for cycles in self._gate.cycles if self._gate is not None else ():
            cycles.on_change = self.supervisor.poke
            for name, alive, restart in cycles.threads():
                self.supervisor.watch(name, alive, restart)
        run = self.service.run_cycle if self._gate is None else self._gate
        self._scheduler = BackgroundScheduler(timezone=UTC)
        schedule_cycles(self._scheduler, run, daemon.interval_s, daemon.jitter_s)
        written = self.endpoint.write if self.endpoint is not None else lambda: None
        repair_s = self.config.collector.repair_interval_s
        watch = schedule_repairs(
            self._scheduler,
            self.assembly.pool.publishers,
            repair_s,
            written,
            metrics=self._metrics,
            clock=self.assembly.instruments.clock,
        )
        if self.endpoint is not None:
            self.endpoint.coverage = (lambda: watch.coverage) if watch is not None else dict
        install_reschedule(self.service, self.config)  # a fresh service each start: added once
        self._scheduler.start()

    def _stop_cycles(self) -> None:
        """Stop the listeners and event cycles first (they run cycles too), then the
        scheduler (the running cycle ends and saves first)."""
        if self._gate is not None:
            for cycles in self._gate.cycles:  # stopped on purpose: not supervised any more
                for name, _alive, _restart in cycles.threads():
                    self.supervisor.forget(name)
            self._gate.stop()
            self._gate = None
        if self._scheduler is not None and self._scheduler.running:
            self._scheduler.shutdown(wait=True)

    def run(self) -> int:
        if self.config.http.enabled:
            wedged_after_s = max(5 * self.config.daemon.interval_s, 300.0)
            try:
                self.endpoint = HttpEndpoint(
                    self.service, self.config.http, wedged_after_s, metrics=self._metrics
                )
            except ConfigError:  # the listen address is busy: one line, exit 2
                self.service.close()
                raise
            self.endpoint.start()
            self.endpoint.threads_down = self.supervisor.down
            self.supervisor.publish = self.endpoint.write_status
            endpoint = self.endpoint
            self.supervisor.watch("http-watcher", endpoint.watcher_alive, endpoint.restart_watcher)
        log_thread_deaths()
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, self._signal)
        try:
            self._start_cycles()
        except BaseException:
            self._stop_cycles()
            if self.endpoint is not None:
                self.endpoint.stop()
            self.service.close()
            raise
        log.info(
            "hydrator running: %d source(s), every %.0fs, state %s",
            len(self.assembly.catalogue.sources),
            self.config.daemon.interval_s,
            self.config.daemon.state_path,
        )
        try:
            while not self._stop.is_set():
                self.supervisor.wait(1.0)  # or until poked: a listener's change, a signal
                if self._stop.is_set():
                    break
                if self._reload.is_set():
                    self._reload.clear()
                    self.reload()
                self.supervisor.check()
        finally:
            self._stop_cycles()
            if self.endpoint is not None:
                self.endpoint.stop()
            if not self._closed:
                self.service.close()
        log.info("stopped")
        return 0

    def reload(self) -> None:
        """Read the configuration again and, if valid, swap the service (see the class doc)."""
        if self._load is None or self._build is None:
            log.warning("received SIGHUP: no configuration file to reload; ignored")
            return
        log.info("received SIGHUP: reloading the configuration")
        try:
            config = self._load()
        except ConfigError as exc:
            log.error("reload refused, keeping the running configuration: %s", exc)
            return
        if config == self.config:
            log.info("reload: the configuration is unchanged")
            return
        if config.http != self.config.http:
            log.warning("reload: [http] changes take effect at the next restart")
        old = self.config.daemon
        if (config.daemon.log_format, config.daemon.log_level) != (old.log_format, old.log_level):
            log.warning("reload: [daemon] log_format and log_level take effect at the next restart")
        self._stop_cycles()  # the running cycle ends (and saves) first
        if self._stop.is_set():  # SIGTERM meanwhile: stopping, nothing to swap
            return
        self._swap(config)
        if self._stop.is_set():  # SIGTERM during the swap: the new service stops too
            self.service.stop()
            return
        self._start_cycles()

    def _swap(self, config: Config) -> None:
        """Close the running service and build one from ``config``; if that fails, log it and
        build the running configuration's again (its failure ends the daemon: exit 2)."""
        old, metrics = self.service, self._metrics
        if self.endpoint is not None:
            self.endpoint.detach()
        old.close()  # releases the state's lock for the new service
        self._closed = True
        assert self._build is not None
        try:
            self.assembly = self._build(config, metrics)
        except HydratorError as exc:
            log.error("reload refused, keeping the running configuration: %s", exc)
            self.assembly = self._build(self.config, metrics)  # raises: the daemon ends, exit 2
            self._closed = False
        else:
            self._closed = False
            kept = {source.name for source in config.sources}
            record_sources_removed(metrics, sorted({s.name for s in self.config.sources} - kept))
            self.config = config
            log.info(
                "reloaded: %d source(s), every %.0fs, state %s",
                len(self.assembly.catalogue.sources),
                config.daemon.interval_s,
                config.daemon.state_path,
            )
        if self.endpoint is not None:
            self.endpoint.attach(self.service)


def run_daemon(
    config: Config,
    assembly: Assembly,
    load: Callable[[], Config] | None = None,
    build: Callable[[Config, Metrics], Assembly] | None = None,
    reloads: threading.Event | None = None,
) -> int:
    """Run until SIGTERM/SIGINT (:class:`Daemon`); ``load`` and ``build`` serve SIGHUP,
    ``reloads`` (:func:`catch_reloads`) carries one asked for before."""
    return Daemon(config, assembly, load, build, reloads).run()
