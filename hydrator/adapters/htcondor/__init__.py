"""The HTCondor adapter: everything that talks to the pool through ``htcondor2``.

``collector.py`` publishes: it pushes the rendered site ads where the matchmaker sees them,
behind :class:`Publisher` (the HTTP endpoint, pull for the execute-node hook, is not a
publisher: it serves the saved state). ``condor_queue.py`` reads queued jobs and slots (demand,
matchmaking metrics); ``schedd_jobs.py`` reads and edits idle jobs (job annotation).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from hydrator.domain import Site, SiteView


@dataclass(frozen=True)
class PublishReport:
    """What a publisher did this cycle. ``sent`` counts updates by kind (e.g. ``merge``)."""

    sent: Mapping[str, int] = field(default_factory=dict)
    failed: Mapping[str, int] = field(default_factory=dict)
    skipped_current: int = 0  # targets already up to date, sent nothing
    deferred: int = 0  # targets not up to date, left for a later cycle (rate limits)


class Publisher(Protocol):
    @property
    def name(self) -> str: ...

    def publish(
        self, sites: Mapping[Site, SiteView], removed: frozenset[Site], now: datetime
    ) -> PublishReport:
        """Bring the target in line with ``sites``; withdraw ``removed``. Raise PublishError."""
        ...

    def close(self) -> None: ...
