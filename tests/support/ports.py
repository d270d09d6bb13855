"""The one way tests pick a port: :func:`free_port` (:mod:`benchmarks.local_servers`, which
the benchmarks share)."""

from __future__ import annotations

from benchmarks.local_servers import free_port

__all__ = ["free_port"]
