"""When to restart a thread the daemon relies on (pure; the runtime's
:class:`~hydrator.runtime.supervise.Supervisor` looks at the threads and acts).

A thread found dead is restarted after the first wait of the backoff sequence; each restart
that does not hold moves one step along it, the last wait repeating (bounded). A thread that
has run for the longest wait since it came back starts the sequence afresh."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, replace


class Verdict(enum.Enum):
    """What one look at a thread found."""

    RUNNING = "running"
    DIED = "died"  # found dead (it was running): log, count as down
    WAITING = "waiting"  # still dead, its restart not due yet
    RESTART = "restart"  # start it again now
    BACK = "back"  # running again after being down


@dataclass(frozen=True)
class Watch:
    """One thread's record (monotonic seconds): down since when (None: running), restarts
    made since it last ran steadily, when the next restart is due, since when it runs."""

    down_since: float | None = None
    attempts: int = 0
    restart_at: float | None = None
    up_since: float | None = None


def step(
    watch: Watch, alive: bool, now: float, backoff_s: Sequence[float]
) -> tuple[Watch, Verdict]:
    """The record after a look at ``now`` that found the thread ``alive``, and the verdict.
    ``backoff_s``: the waits before successive restarts (non-empty, seconds)."""
    if alive:
        if watch.down_since is not None:
            return replace(watch, down_since=None, restart_at=None, up_since=now), Verdict.BACK
        steady = watch.up_since is not None and now - watch.up_since >= backoff_s[-1]
        return (replace(watch, attempts=0) if steady and watch.attempts else watch), Verdict.RUNNING
    if watch.down_since is None:
        wait = backoff_s[min(watch.attempts, len(backoff_s) - 1)]
        return replace(watch, down_since=now, restart_at=now + wait), Verdict.DIED
    if watch.restart_at is not None and now >= watch.restart_at:
        attempts = watch.attempts + 1
        wait = backoff_s[min(attempts, len(backoff_s) - 1)]
        return replace(watch, attempts=attempts, restart_at=now + wait), Verdict.RESTART
    return watch, Verdict.WAITING


def first_wait_s(watch: Watch, backoff_s: Sequence[float]) -> float:
    """The wait before the restart a :data:`Verdict.DIED` scheduled (for its log line)."""
    return backoff_s[min(watch.attempts, len(backoff_s) - 1)]
