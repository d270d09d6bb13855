"""The operator's drains as the service reads them each cycle (``hydrator drain`` writes them
in the state file while the daemon runs; :mod:`.drain_command` is that command).

:class:`DrainReads` holds the drains as last read, so that a failed read keeps them (a drain
must not lapse because the file was busy), and those active in the last full read, so that
the event gate knows when only a full read applies the drains now active.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import datetime

from hydrator.core.ports import StateStore
from hydrator.core.storage import Drain
from hydrator.errors import HydratorError
from hydrator.runtime.metrics import Metrics
from hydrator.runtime.observe import record_drains

log = logging.getLogger(__name__)


class DrainReads:
    """Reads ``store``'s drains, starting from ``drains`` (those read at start-up);
    ``clock`` is the wall clock (UTC) the drains' ``until`` is compared with."""

    def __init__(
        self,
        store: StateStore,
        metrics: Metrics,
        clock: Callable[[], datetime],
        drains: Sequence[Drain] = (),
    ) -> None:
        self._store, self._metrics, self._clock = store, metrics, clock
        self._drains: Sequence[Drain] = drains  # the operator's, as last read
        self._applied: frozenset[Drain] | None = None  # active in the last full read

    def active(self, now: datetime) -> Sequence[Drain]:
        """The drains active at ``now``, read again (on a failed read the last good ones);
        counted in the metrics."""
        try:
            self._drains = self._store.drains()
        except HydratorError as exc:
            log.warning("cannot read the drains, using the previous ones: %s", exc)
        active = [d for d in self._drains if d.active(now)]
        record_drains(self._metrics, active)
        return active

    def applied(self, drains: Sequence[Drain]) -> None:
        """A full read applies ``drains`` (what :meth:`active` gave it)."""
        self._applied = frozenset(drains)

    def changed(self) -> bool:
        """The active drains differ from those the last full read applied (a drain or
        undrain since, or an ``until`` passed): an event cycle would not apply them all (a
        storage drain needs the source's read of its storage). False when they cannot be
        read (the last good ones stand)."""
        try:
            drains = self._store.drains()
        except HydratorError:
            return False
        now = self._clock()
        return frozenset(d for d in drains if d.active(now)) != self._applied
