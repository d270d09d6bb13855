"""A cycle's take of the schedds' queues: read afresh, or the last snapshot reused by an event
cycle while it is young (the decision: :mod:`hydrator.core.queue_reuse`; docs/events.md).

:class:`QueueReads` wraps the :class:`~hydrator.core.ports.QueueReader` for the service: a
cycle calls :meth:`~QueueReads.begin` (scheduled or event), then :meth:`~QueueReads.take` as
often as its parts need the snapshot (at most one read per cycle), then
:meth:`~QueueReads.edited` with the annotator's report; :attr:`~QueueReads.outcome` says how
the cycle got it (``CycleReport.queue``, metric ``hydrator_queue_reads_total``).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from hydrator.config import Config
from hydrator.core.jobs import JobsReport
from hydrator.core.ports import QueueReader
from hydrator.core.queue import QueueSnapshot
from hydrator.core.queue_reuse import QueueRead, read_due, read_outcome, with_edits
from hydrator.runtime.metrics import Metrics
from hydrator.runtime.observe import record_queue_read


def queue_max_age_s(config: Config) -> float:
    """``[collector] queue_max_age_s``, by default ``[daemon] interval_s`` (seconds)."""
    age = config.collector.queue_max_age_s
    return config.daemon.interval_s if age is None else age


class QueueReads:
    """The last snapshot read, its read time (``clock``: monotonic seconds), and this cycle's
    take. With no ``reader`` (no queue configured), :meth:`take` is never due and
    :attr:`outcome` stays None."""

    def __init__(
        self,
        reader: QueueReader | None,
        max_age_s: float,
        metrics: Metrics,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.reader, self.max_age_s, self.metrics, self._clock = reader, max_age_s, metrics, clock
        self._snapshot: QueueSnapshot | None = None
        self._read_at: float | None = None
        self._scheduled = True
        self._taken: QueueSnapshot | None = None  # this cycle's
        self.outcome: QueueRead | None = None  # this cycle's

    @property
    def present(self) -> bool:
        """A queue is configured (for the demand and the probe, or annotation alone)."""
        return self.reader is not None

    @property
    def pool(self) -> bool:
        """The reads cover the demand and the probe (:attr:`QueueReader.pool`)."""
        return self.reader is not None and self.reader.pool

    def begin(self, *, scheduled: bool) -> None:
        """A new cycle: ``scheduled`` (a full one) always reads, an event cycle may reuse."""
        self._scheduled, self._taken, self.outcome = scheduled, None, None

    def take(self) -> QueueSnapshot | None:
        """This cycle's snapshot (None without a reader): the one already taken this cycle,
        else the last one while :func:`read_due` says it may be reused, else a fresh read.
        Counted once per cycle."""
        if self.reader is None or self._taken is not None:
            return self._taken
        now = self._clock()
        age = None if self._read_at is None else now - self._read_at
        if self._snapshot is None or read_due(
            scheduled=self._scheduled, age_s=age, max_age_s=self.max_age_s
        ):
            self._snapshot, self._read_at = self.reader.read(), now
            self.outcome = read_outcome(self._snapshot)
        else:
            self.outcome = QueueRead.REUSED
        record_queue_read(self.metrics, self.outcome.value)
        self._taken = self._snapshot
        return self._taken

    def edited(self, jobs: JobsReport | None) -> None:
        """The annotator's edits of this cycle, written into the held snapshot
        (:func:`~hydrator.core.queue_reuse.with_edits`), so that reusing it does not edit
        the same jobs again."""
        if jobs is not None and jobs.applied and self._snapshot is not None:
            self._snapshot = with_edits(self._snapshot, jobs.applied)
