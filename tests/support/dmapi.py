"""What the DMAPI source's tests share (tests/sources/dmapi/): a clock moved by hand and the
type of the source factory (the fixtures, the fake SRCNet running and the factory itself, are
in tests/sources/dmapi/conftest.py)."""

from __future__ import annotations

from collections.abc import Callable

from hydrator.adapters.sources.dmapi import DmapiSource


class FakeClock:
    """A monotonic clock the test moves by hand (seconds)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


MakeSource = Callable[..., DmapiSource]
