"""When to ask the schedds for a negotiation cycle after a cycle (pure; docs/events.md).

A cycle that changed what a site's ads say (an event cycle most of all) can make an idle job
matchable; the negotiator would see it only at its next cycle (``NEGOTIATOR_INTERVAL``). The
runtime then asks each schedd to reschedule (:mod:`hydrator.runtime.reschedule_after_cycle`), at
most once per ``min_interval_s`` however many cycles change the ads, so a flood of catalogue
messages cannot drive the negotiator: a change inside the quiet time waits for the negotiator's own
cycle, as it would with no step at all.
"""

from __future__ import annotations

from collections.abc import Mapping

Tags = Mapping[str, str]
"""Site -> the entity tag of its published ad (any change of its lists changes it)."""


def due(
    before: Tags | None, after: Tags, last_s: float | None, now_s: float, min_interval_s: float
) -> bool:
    """True when a reschedule should be sent now: the ads changed from ``before`` (None: no
    cycle seen yet, not a change) to ``after``, the step is on (``min_interval_s`` > 0), and
    the last one was sent (``last_s``, monotonic seconds; None: never) at least
    ``min_interval_s`` before ``now_s``."""
    if min_interval_s <= 0 or before is None or dict(before) == dict(after):
        return False
    return last_s is None or now_s - last_s >= min_interval_s
