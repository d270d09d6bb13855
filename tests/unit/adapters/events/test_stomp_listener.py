"""The listener's pure part: the reconnect delay (:func:`reconnect_delay`); the listener itself
runs against a real broker in tests/events/."""

from __future__ import annotations

import pytest

from hydrator.adapters.events.stomp_listener import reconnect_delay


def test_the_reconnect_delay_grows_by_half_to_the_maximum_with_jitter_below_it() -> None:
    top = [reconnect_delay(n, 1.0, 5.0, 0.999999) for n in range(1, 8)]
    assert top == pytest.approx([1.0, 1.5, 2.25, 3.375, 5.0, 5.0, 5.0], rel=1e-5)
    low = [reconnect_delay(n, 1.0, 5.0, 0.0) for n in range(1, 8)]
    assert low == pytest.approx([t / 2 for t in top], rel=1e-5)
    assert reconnect_delay(10_000, 1.0, 5.0, 0.5) <= 5.0  # no overflow after a long outage
