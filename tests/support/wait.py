"""The one way tests wait: :func:`wait_for`.

Contract: call ``probe()`` every ``interval_s`` seconds until ``done(value)`` is truthy (by default
the value itself) and return that value; once ``timeout_s`` seconds (monotonic) have passed
without it, raise ``AssertionError`` naming ``what`` and the last value seen. Exceptions of the
types in ``ignore`` (e.g. a server not listening yet) count as a value that is not done; any
other exception propagates at once. The probe runs at least once, also with ``timeout_s = 0``.

Tests poll because most effects are not acknowledged: e.g. the collector may answer a query (in
a forked worker) before it has read every ad of the connection a publish just closed, so what a
publish sent is visible a moment later, not at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(
    what: str,
    probe: Callable[[], T],
    *,
    timeout_s: float,
    done: Callable[[T], object] = bool,
    ignore: tuple[type[BaseException], ...] = (),
    interval_s: float = 0.25,
) -> T:
    """The first value of ``probe()`` that is ``done``; AssertionError naming ``what`` and the
    last value (or ignored exception) after ``timeout_s`` seconds. See the module docstring."""
    deadline = time.monotonic() + timeout_s
    last: object = "(not called)"
    while True:
        try:
            value = probe()
        except ignore as exc:
            last = exc
        else:
            if done(value):
                return value
            last = value
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what}: not within {timeout_s}s; last value: {last!r}")
        time.sleep(interval_s)
