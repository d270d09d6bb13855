"""How many bytes of *change* merges the collector takes (pure): a token bucket over bytes.

A change merge gives a slot ad its site's new lists (a full ad, up to ``max_ad_bytes``); when
a site's lists change every slot of that site needs one. Merges into bare slots (wiped by
their startd's update, or new) are not charged: they restore what the startd removed, at the
startds' pace, and coverage comes first. The bucket refills at ``rate`` bytes per second up to
:data:`BURST_S` seconds' worth, so an isolated change, even of a large site, goes out at once,
and under changes at every site all the time the collector takes ``rate`` on average; what
does not fit waits for the next look or cycle (docs/coverage.md, "The merge budget").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

BURST_S = 60.0
"""The bucket holds this many seconds of ``rate``: one site's change in a pool of thousands of
slots fits whole, a change of every site in a very large pool is spread over minutes."""


@dataclass
class MergeBudget:
    """Bytes per second of change merges, ``rate`` (0: no bound); full at first."""

    rate: float
    tokens: float | None = None
    at_s: float | None = None

    def allow(self, costs: Sequence[int], now_s: float) -> int:
        """How many of ``costs`` (bytes, in order) may be sent at ``now_s`` (epoch seconds);
        those are charged. The first that does not fit stops the count (order is kept). A
        cost over the whole bucket goes when the bucket is full (and empties it below 0),
        so no ad is held back for ever."""
        if self.rate <= 0:
            return len(costs)
        capacity = self.rate * BURST_S
        elapsed = 0.0 if self.at_s is None else max(0.0, now_s - self.at_s)
        tokens = (
            capacity if self.tokens is None else min(capacity, self.tokens + elapsed * self.rate)
        )
        allowed = 0
        for cost in costs:
            if tokens < min(cost, capacity):
                break
            tokens -= cost
            allowed += 1
        self.tokens, self.at_s = tokens, now_s
        return allowed
