"""The one way tests wait: :func:`wait_for` (its contract is in
:mod:`benchmarks.local_servers`, which the benchmarks share)."""

from __future__ import annotations

from benchmarks.local_servers import wait_for

__all__ = ["wait_for"]
