"""Each source's fetch in a thread of its own, awaited up to the source's deadline.

Why threads that may be abandoned, rather than a pool that is waited for: a
catalogue can hold a request open for ever while sending a byte now and then (a status line,
then one header line a second): per-read timeouts never fire, and a cycle that waits for every
source would wait for ever, delaying every other source's changes and SIGTERM. So a fetch runs
in a daemon thread; the cycle waits for it until the source's ``deadline_s`` (plus
``GRACE_S``, so that an adapter enforcing the deadline itself reports its own reason first),
then records the source as failed (transient: its last good answer is kept) and goes on with
the others. Python cannot stop a thread, so an abandoned fetch runs on; its result is
ignored, and the source is not fetched again until it ends (an adapter is not safe to fetch
twice at once), each cycle meanwhile failing it at once with that reason.

Adapters that can end their own work at the deadline do (the DMAPI and Rucio sources cut
their connections); this is the bound for those that cannot, or do not in time. At shutdown
a source whose fetch still runs is not closed, unless it has an ``abandon`` method that ends
that fetch without blocking (the Rucio source's: its private token directory goes too).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from hydrator.core.ports import Source
from hydrator.domain import SourceFailure, SourceOutcome

log = logging.getLogger(__name__)

GRACE_S = 1.0  # past the deadline, before a fetch is abandoned
POLL_S = 0.25  # how often a wait looks at the stop event


@dataclass
class _Fetch:
    """One fetch in flight: its thread, when it started and (once done) its outcome."""

    source: str
    started: float
    done: threading.Event = field(default_factory=threading.Event)
    outcome: SourceOutcome | None = None


class FetchThreads:
    """Runs fetches, one daemon thread per source per cycle; see the module docstring.

    ``deadline_of(name)`` is the deadline of the source of that name, seconds; ``stop`` ends
    every wait at once (the daemon is stopping). Used by one cycle at a time.
    """

    def __init__(self, deadline_of: Callable[[str], float], stop: threading.Event) -> None:
        self._deadline_of = deadline_of
        self._stop = stop
        self._abandoned: dict[str, _Fetch] = {}

    def fetch_all(
        self, sources: Sequence[Source], fetch: Callable[[Source], SourceOutcome]
    ) -> dict[str, SourceOutcome]:
        """Each source's outcome: ``fetch(source)``'s, or a SourceFailure for a source past
        its deadline, still busy with an abandoned fetch, or not done when ``stop`` is set."""
        outcomes: dict[str, SourceOutcome] = {}
        running: list[_Fetch] = []
        for source in sources:
            busy = self._still_busy(source.name)
            if busy is not None:
                outcomes[source.name] = busy
                continue
            running.append(self._start(source, fetch))
        for job in running:
            outcomes[job.source] = self._await(job)
        return {s.name: outcomes[s.name] for s in sources}

    def busy(self) -> list[str]:
        """Sources whose abandoned fetch is still running."""
        return sorted(name for name, job in self._abandoned.items() if not job.done.is_set())

    def _start(self, source: Source, fetch: Callable[[Source], SourceOutcome]) -> _Fetch:
        job = _Fetch(source.name, time.monotonic())

        def run() -> None:
            try:
                job.outcome = fetch(source)
            finally:
                job.done.set()

        # daemon: an abandoned fetch must not keep the process alive at exit
        threading.Thread(target=run, name=f"fetch-{source.name}", daemon=True).start()
        return job

    def _await(self, job: _Fetch) -> SourceOutcome:
        deadline_s = self._deadline_of(job.source)
        until = job.started + deadline_s + GRACE_S
        while not job.done.is_set():
            left = until - time.monotonic()
            if left <= 0 or self._stop.is_set():
                self._abandoned[job.source] = job
                if self._stop.is_set():
                    return SourceFailure(job.source, "abandoned: the daemon is stopping")
                reason = (
                    f"no answer within deadline_s = {deadline_s:g} s; fetch abandoned "
                    "(raise deadline_s if this catalogue is this slow when healthy)"
                )
                log.warning("source %s failed: %s", job.source, reason)
                return SourceFailure(job.source, reason)
            job.done.wait(min(left, POLL_S))
        if job.outcome is None:  # fetch() raised past its own handlers: a bug, logged there
            return SourceFailure(job.source, "the fetch ended without an answer")
        return job.outcome

    def _still_busy(self, name: str) -> SourceFailure | None:
        job = self._abandoned.get(name)
        if job is None:
            return None
        if job.done.is_set():
            del self._abandoned[name]
            return None
        reason = (
            f"its fetch started {time.monotonic() - job.started:.0f} s ago and abandoned at "
            "its deadline is still running; not fetched again until it ends"
        )
        log.warning("source %s failed: %s", name, reason)
        return SourceFailure(name, reason)
