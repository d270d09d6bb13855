"""Supervision of the threads the daemon relies on (docs/events.md, "Supervised threads").

The :class:`Supervisor` is driven by the daemon's main thread (:meth:`Supervisor.check`,
about once a second and whenever :meth:`Supervisor.poke` wakes it). Each watched thread is
looked at; one found dead is logged once through the logging handlers, shown as down
(``hydrator_thread_alive{thread} 0``, ``/readyz`` not ready naming it: :meth:`down`) and
started again after the waits of ``[daemon] thread_restart_backoff_s``
(:func:`hydrator.core.restart_backoff.step`), each restart counted in
``hydrator_thread_restarts_total{thread}``. :meth:`poke` also asks for the served status
files to be written at once (:attr:`Supervisor.publish`): a listener's connection change
reaches ``/metrics`` without waiting for a cycle.

:func:`log_thread_deaths` routes an exception that ends any thread through the logging
handlers (the formatter, redaction) instead of :func:`threading.excepthook`'s bare stderr.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from hydrator.core.restart_backoff import Verdict, Watch, first_wait_s, step
from hydrator.runtime.metrics import Metrics
from hydrator.runtime.observe import forget_thread, record_thread, record_thread_restart

log = logging.getLogger(__name__)


@dataclass
class _Watched:
    alive: Callable[[], bool]
    restart: Callable[[], None]
    watch: Watch


class Supervisor:
    """Watches named threads (see the module docstring). ``clock``: monotonic seconds;
    ``publish`` writes the served metrics and status files (the HTTP endpoint's), or None."""

    def __init__(
        self,
        metrics: Metrics,
        backoff_s: Sequence[float],
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.metrics = metrics
        self.backoff_s = tuple(backoff_s) or (1.0,)
        self.publish: Callable[[], None] | None = None
        self._clock = clock
        self._lock = threading.Lock()
        self._watched: dict[str, _Watched] = {}
        self._wake = threading.Event()
        self._poked = False

    def watch(self, name: str, alive: Callable[[], bool], restart: Callable[[], None]) -> None:
        """Supervise the thread ``name``: ``alive`` says whether it runs, ``restart`` starts
        it again (called from :meth:`check`'s thread)."""
        with self._lock:
            self._watched[name] = _Watched(alive, restart, Watch(up_since=self._clock()))
        record_thread(self.metrics, name, alive=True)

    def forget(self, name: str) -> None:
        """Stop supervising ``name`` (it was stopped on purpose: a reload); its series go."""
        with self._lock:
            self._watched.pop(name, None)
        forget_thread(self.metrics, name)

    def down(self) -> list[str]:
        """The supervised threads now down, by name (sorted)."""
        with self._lock:
            return sorted(n for n, w in self._watched.items() if w.watch.down_since is not None)

    def poke(self) -> None:
        """Ask for the served status files to be written at once (any thread; never blocks)."""
        self._poked = True
        self._wake.set()

    def wait(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` seconds, or until :meth:`poke`."""
        self._wake.wait(timeout_s)
        self._wake.clear()

    def check(self) -> None:
        """Look at every watched thread and act on what was found; then, when something
        changed or :meth:`poke` asked for it, write the served files (:attr:`publish`)."""
        changed, self._poked = self._poked, False
        with self._lock:
            watched = list(self._watched.items())
        for name, item in watched:
            changed |= self._look(name, item)
        if changed and self.publish is not None:
            try:
                self.publish()
            except Exception:  # the status files are best effort; the next check tries again
                log.exception("cannot write the served status files")

    def _look(self, name: str, item: _Watched) -> bool:
        """One look at the thread ``name``; True when its state changed."""
        now = self._clock()
        item.watch, verdict = step(item.watch, item.alive(), now, self.backoff_s)
        if verdict is Verdict.DIED:
            wait = first_wait_s(item.watch, self.backoff_s)
            log.error("thread %s is not running: restarting it in %g s", name, wait)
            record_thread(self.metrics, name, alive=False)
        elif verdict is Verdict.RESTART:
            log.warning("restarting thread %s (restart %d in a row)", name, item.watch.attempts)
            record_thread_restart(self.metrics, name)
            try:
                item.restart()
            except Exception:  # a failed restart waits for the next step of the backoff
                log.exception("thread %s could not be restarted", name)
        elif verdict is Verdict.BACK:
            log.info("thread %s is running again", name)
            record_thread(self.metrics, name, alive=True)
        return verdict in (Verdict.DIED, Verdict.RESTART, Verdict.BACK)


def log_thread_deaths() -> None:
    """From now on an exception that ends a thread is logged through the logging handlers
    (one error record with its traceback), not printed raw by :func:`threading.excepthook`."""
    threading.excepthook = _log_thread_death


def _log_thread_death(args: threading.ExceptHookArgs) -> None:
    if args.exc_type is SystemExit:
        return
    name = args.thread.name if args.thread is not None else "unknown"
    exc_info = (args.exc_type, args.exc_value or args.exc_type(), args.exc_traceback)
    log.error("thread %s ended with an unexpected error", name, exc_info=exc_info)
