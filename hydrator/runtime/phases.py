"""Where a cycle's time goes: wall and CPU seconds per phase, for the cycle's own report.

:meth:`~hydrator.runtime.service.Service.run_cycle` records a cycle inside
:func:`recording`; the service's steps mark their phases with ``with phase("plan"):``. The
result, :attr:`~hydrator.runtime.outcome.CycleReport.phases`, is logged at debug level and
exported as ``hydrator_cycle_phase_seconds{phase}`` (:mod:`.observe`), and is what
``benchmarks/cycle.py`` reports per phase (so the benchmark measures the code as it runs).

Contracts:

- A phase's time is its own: a phase opened inside another is taken off the outer one, and
  the garbage collector's passes (``gc.callbacks``, any thread) go to :data:`GC`, not to the
  phase they interrupted.
- :data:`OTHER` is the rest of the recorded stretch (what no phase marks), so the phases of a
  report add up to the time from :func:`recording`'s start to :meth:`Phases.taken`.
- ``phase`` outside :func:`recording`, or in another thread than the recording one (a
  source's fetch thread), records nothing: the recorder is a :class:`~contextvars.ContextVar`.
- Cost: two clock reads per boundary (a few microseconds); a cycle has about ten.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

GC = "gc"
OTHER = "other"
Clock = Callable[[], tuple[float, float]]
"""Wall and CPU seconds now (any origin: only differences are used)."""


def process_clock() -> tuple[float, float]:
    """:func:`time.perf_counter` and this process's CPU time (:func:`time.process_time`)."""
    return time.perf_counter(), time.process_time()


@dataclass(frozen=True)
class PhaseTime:
    """One phase's share of a cycle: wall seconds and this process's CPU seconds (every
    thread's; a fetch's wall time includes waiting for the catalogue, its CPU time does not)."""

    wall_s: float
    cpu_s: float


class Phases:
    """The recorder of one cycle: a stack of open phases and the seconds each has taken."""

    def __init__(self, clock: Clock = process_clock) -> None:
        self._clock = clock
        self._wall: dict[str, float] = {}
        self._cpu: dict[str, float] = {}
        self._open: list[str] = [OTHER]
        self._since = clock()
        self._done = False  # taken: later collections (the collector is on again) are not ours

    def _switch(self, to: str | None) -> None:
        """Charge the time since the last boundary to the open phase; open ``to`` (None:
        close the innermost)."""
        now = self._clock()
        name = self._open[-1]
        self._wall[name] = self._wall.get(name, 0.0) + now[0] - self._since[0]
        self._cpu[name] = self._cpu.get(name, 0.0) + now[1] - self._since[1]
        self._since = now
        if to is None:
            self._open.pop()
        else:
            self._open.append(to)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        self._switch(name)
        try:
            yield
        finally:
            self._switch(None)

    def _on_gc(self, event: str, _info: Mapping[str, Any]) -> None:
        if self._done:
            return
        if event == "start":
            self._switch(GC)
        elif self._open[-1] == GC:
            self._switch(None)

    def taken(self) -> dict[str, PhaseTime]:
        """Each phase's time so far, :data:`OTHER` included (phases still open are charged up
        to now); the collector's passes after this are not counted."""
        self._switch(self._open[-1])  # charge the open phase, keep it open
        self._open.pop()
        self._done = True
        return {name: PhaseTime(self._wall[name], self._cpu[name]) for name in self._wall}


_CURRENT: ContextVar[Phases | None] = ContextVar("hydrator_cycle_phases", default=None)


@contextmanager
def recording(clock: Clock = process_clock) -> Iterator[Phases]:
    """Record the phases marked in this block (this thread) and the collector's passes, on
    ``clock``."""
    phases = Phases(clock)
    token = _CURRENT.set(phases)
    gc.callbacks.append(phases._on_gc)
    try:
        yield phases
    finally:
        gc.callbacks.remove(phases._on_gc)
        _CURRENT.reset(token)


@contextmanager
def phase(name: str) -> Iterator[None]:
    """Mark the block as phase ``name`` of the cycle being recorded (nothing if none is)."""
    phases = _CURRENT.get()
    if phases is None:
        yield
        return
    with phases.phase(name):
        yield
