"""The near sites the ads carry: the distances read at most once per ``[distances]
refresh_s`` (a catalogue's through a :class:`~hydrator.core.ports.DistanceReader`, or the
operator's table), checked and turned into near lists by :mod:`hydrator.core.near`.

A failed read (the catalogue refused or failed it) is a ``refused`` problem and keeps the last
good lists; it is tried again ``refresh_s`` later. Each problem is logged and counted once,
when it appears (again after it went away), not at every refresh.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping

from hydrator.config import DistancesConfig
from hydrator.core.near import NearTable, Problem, operator_distances, refresh
from hydrator.core.ports import DistanceReader
from hydrator.domain import Site
from hydrator.errors import SourceError
from hydrator.logs import ProblemLog
from hydrator.redact import redact
from hydrator.runtime.metrics import Metrics
from hydrator.runtime.observe import record_near_problem, record_near_read

log = logging.getLogger(__name__)


class NearSites:
    """Each site's near sites, refreshed when due. ``reader`` None: the operator table of
    ``config.sites``. ``clock`` is monotonic seconds."""

    def __init__(
        self,
        config: DistancesConfig,
        metrics: Metrics,
        reader: DistanceReader | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.metrics = metrics
        self.reader = reader
        self.clock = clock
        self.table = NearTable()
        self._read_at: float | None = None
        # by (kind, subject): the problems of the last read, each logged when it appeared
        self._problems: ProblemLog[tuple[str, str]] = ProblemLog(log)

    def current(self, sites: Iterable[Site]) -> Mapping[Site, tuple[Site, ...]]:
        """The near lists (a site without one is unknown: its ad leaves the attribute out),
        read again first when ``refresh_s`` has passed since the last read."""
        now = self.clock()
        if self._read_at is None or now - self._read_at >= self.config.refresh_s:
            self._read_at = now
            self._refresh(sites)
        return self.table.near

    def _refresh(self, sites: Iterable[Site]) -> None:
        try:
            if self.reader is None:
                read = operator_distances(self.config.sites)
            else:
                read = self.reader.read_distances()
        except SourceError as exc:
            record_near_read(self.metrics, ok=False)
            line = f"cannot read the distances, keeping the last near lists: {redact(str(exc))}"
            self._note([Problem("refused", "read", line)], keep_others=True)
            return
        record_near_read(self.metrics, ok=True)
        self.table, problems = refresh(read, self.table, self.config.max_distance, sites)
        self._note(problems)

    def _note(self, problems: list[Problem], keep_others: bool = False) -> None:
        """Log and count each problem not present at the last read."""
        seen = {(p.kind, p.subject) for p in problems}
        known = self._problems.failing()
        for problem in problems:
            key = (problem.kind, problem.subject)
            if key not in known:
                self._problems.problem(key, "near sites: %s", problem.line)
                record_near_problem(self.metrics, problem)
        if keep_others:  # a failed read says nothing about the table's own problems
            seen |= {key for key in known if key[0] != "refused"}
        self._problems.forget_all_but(seen)

    def close(self) -> None:
        if self.reader is not None:
            self.reader.close()


def offline_near(
    config: DistancesConfig, sites: Iterable[Site]
) -> tuple[Mapping[Site, tuple[Site, ...]], list[str]]:
    """The near lists ``hydrator show`` can give without asking a catalogue: the operator
    table's (with a comment line per problem in it), or none and a line saying that the
    daemon reads them (``[distances] source`` set, or ``[distances]`` off: no line)."""
    if not config.enabled:
        return {}, []
    if config.source is not None:
        line = f"# near sites: read from source {config.source!r} by the daemon (GET /v1/sites)\n"
        return {}, [line]
    table, problems = refresh(
        operator_distances(config.sites), NearTable(), config.max_distance, sites
    )
    return table.near, [f"# near sites: {p.line}\n" for p in problems]
