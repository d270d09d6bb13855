"""The daemon: APScheduler triggers :meth:`Service.run_cycle`; signals set the stop event.

One interval job with jitter, ``max_instances=1`` and ``coalesce=True``: a slow cycle delays the
next instead of stacking up. On SIGTERM/SIGINT the running cycle finishes, or is abandoned
before it saves anything, and the process exits 0.

APScheduler logs a warning each time the trigger fires while the cycle still runs (every
``interval_s`` of a long cycle). :class:`LongCycles` says it once instead: a line when the
first scheduled run is skipped, and a warning with the cycle's duration and the number of
skipped runs when it ends. APScheduler's own repeating line is filtered out of its logger.
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
from hydrator.errors import ConfigError
from hydrator.runtime.events import start_events
from hydrator.runtime.http import HttpEndpoint
from hydrator.runtime.service import Service

log = logging.getLogger(__name__)
# APScheduler's message for a run skipped because the previous one still runs (3.x, in
# BaseScheduler._process_jobs); matched on its format string, never on interpolated text
_APSCHEDULER_SKIPPED = 'Execution of job "%s" skipped: maximum number of running instances'


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


def _drop_apscheduler_skip_lines(record: logging.LogRecord) -> bool:
    return not (isinstance(record.msg, str) and record.msg.startswith(_APSCHEDULER_SKIPPED))


def schedule_cycles(
    scheduler: BaseScheduler, run: Callable[[], object], interval_s: float, jitter_s: float
) -> LongCycles:
    """Add the cycle job (first run at once) and the once-per-long-cycle reporting."""
    cycles = LongCycles(run, interval_s)
    apscheduler_log = logging.getLogger("apscheduler.scheduler")
    if _drop_apscheduler_skip_lines not in apscheduler_log.filters:
        apscheduler_log.addFilter(_drop_apscheduler_skip_lines)
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


def run_daemon(config: Config, service: Service) -> int:
    endpoint = None
    if config.http.enabled:
        wedged_after_s = max(5 * config.daemon.interval_s, 300.0)
        try:
            endpoint = HttpEndpoint(service, config.http, wedged_after_s)
        except ConfigError:  # the listen address is busy: one line, exit 2
            service.close()
            raise
        endpoint.start()
    try:
        gate = start_events(config, service)  # None: no source follows events
    except BaseException:
        if endpoint is not None:
            endpoint.stop()
        service.close()
        raise
    scheduler = BackgroundScheduler(timezone=UTC)
    run = service.run_cycle if gate is None else gate
    schedule_cycles(scheduler, run, config.daemon.interval_s, config.daemon.jitter_s)

    def stop(signum: int, _frame: FrameType | None) -> None:
        log.info("received %s, stopping", signal.Signals(signum).name)
        service.stop_event.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    scheduler.start()
    log.info(
        "hydrator running: %d source(s), every %.0fs, state %s",
        len(service.sources),
        config.daemon.interval_s,
        config.daemon.state_path,
    )
    try:
        while not service.stop_event.wait(1.0):
            pass
    finally:
        if gate is not None:
            gate.stop()  # listeners and event cycles first: they run cycles too
        scheduler.shutdown(wait=True)
        if endpoint is not None:
            endpoint.stop()
        service.close()
    log.info("stopped")
    return 0
