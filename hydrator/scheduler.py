"""The daemon: APScheduler triggers :meth:`Service.run_cycle`; signals set the stop event.

One interval job with jitter, ``max_instances=1`` and ``coalesce=True``: a slow cycle delays the
next instead of stacking up. On SIGTERM/SIGINT the running cycle finishes, or is abandoned
before it saves anything, and the process exits 0.
"""

from __future__ import annotations

import logging
import signal
from datetime import UTC, datetime
from types import FrameType

from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.interval import IntervalTrigger

from hydrator.config import Config
from hydrator.errors import ConfigError
from hydrator.http import HttpEndpoint
from hydrator.service import Service

log = logging.getLogger(__name__)


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
    scheduler = BackgroundScheduler(timezone=UTC)
    scheduler.add_job(
        service.run_cycle,
        IntervalTrigger(seconds=config.daemon.interval_s, jitter=config.daemon.jitter_s),
        id="cycle",
        max_instances=1,
        coalesce=True,
        misfire_grace_time=None,
        next_run_time=datetime.now(UTC),
    )

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
        scheduler.shutdown(wait=True)
        if endpoint is not None:
            endpoint.stop()
        service.close()
    log.info("stopped")
    return 0
