"""After a cycle that changed the published ads, ask the schedds for a negotiation cycle.

:class:`Reschedule` is an after-cycle listener of the :class:`~hydrator.runtime.service.Service`
(installed by :func:`install` when ``[collector] enabled`` and ``reschedule_min_interval_s``
> 0). It compares each site's ad entity tag with the last cycle's and, when
:func:`hydrator.core.reschedule_policy.due` says so, asks every schedd once
(:mod:`hydrator.adapters.htcondor.schedd_reschedule`), in the cycle's thread after the cycle has
merged its lists into the slot ads. A failure is logged once per cause (and once when it
answers again), never retried before the next changing cycle: the negotiator's own interval
still applies.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Protocol

from hydrator.config import Config
from hydrator.core.reschedule_policy import Tags, due
from hydrator.errors import PoolError
from hydrator.logs import ProblemLog
from hydrator.redact import redact
from hydrator.runtime.outcome import Published
from hydrator.runtime.wiring import schedd_reschedule

log = logging.getLogger(__name__)

_ASK = "ask"  # the one problem said: asking the schedds


class Reschedule:
    """The listener (see the module doc): ``tags`` gives each published site's ad entity tag
    now, ``ask`` asks every schedd and returns how many."""

    def __init__(
        self,
        tags: Callable[[], Tags],
        ask: Callable[[], int],
        min_interval_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.tags, self.ask, self.clock = tags, ask, clock
        self.min_interval_s = min_interval_s
        self.before: Tags | None = None
        self.last_s: float | None = None
        self.sent = 0  # calls made (each asks every schedd once)
        self._said: ProblemLog[str] = ProblemLog(log)  # logged again when its cause changes

    def __call__(self) -> None:
        after = self.tags()
        now = self.clock()
        go = due(self.before, after, self.last_s, now, self.min_interval_s)
        self.before = after
        if not go:
            return
        self.last_s, self.sent = now, self.sent + 1
        try:
            asked = self.ask()
        except PoolError as exc:
            cause = redact(str(exc))
            self._said.problem(_ASK, "negotiation cycle not requested: %s", cause, cause=cause)
            return
        self._said.recovered(_ASK, "negotiation cycles requested again (%d schedds)", asked)


class Publishing(Protocol):
    """What the step needs of the service: what it serves, and a call after each cycle."""

    @property
    def published(self) -> Published: ...

    def add_listener(self, listener: Callable[[], None]) -> None: ...


def install(service: Publishing, config: Config) -> Reschedule | None:
    """Add the step to ``service`` (None when ``config`` turns it or the collector path
    off)."""
    interval_s = config.collector.reschedule_min_interval_s
    if not config.collector.enabled or interval_s <= 0:
        return None

    def tags() -> Tags:
        return {str(site): ad.etag for site, ad in service.published.ads.items()}

    step = Reschedule(tags, schedd_reschedule(config), interval_s)
    service.add_listener(step)
    return step
