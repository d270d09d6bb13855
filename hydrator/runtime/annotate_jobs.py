"""The job annotator: one annotation cycle sequenced over the
:class:`~hydrator.core.ports.QueueAdapter` port, remembering each schedd's last good read and
whether it is failing between cycles, and logging each change of that. What to write, into
which jobs, and the demand per site are the pure decisions of :mod:`hydrator.core.jobs`; the
adapter reads and edits. Held by the service's :class:`~hydrator.runtime.parts.Pool`, built by
:func:`hydrator.runtime.wiring.build_annotator`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from hydrator.core.jobs import (
    AnnotateSettings,
    EditPlan,
    GroupEdit,
    JobsReport,
    ScheddFailure,
    ScheddQueue,
    annotate_values,
    annotation_reads,
    plan_edits,
    site_demand,
    state_epoch,
)
from hydrator.core.ports import QueueAdapter
from hydrator.core.queue import QueueSnapshot
from hydrator.domain import Site, SiteView
from hydrator.errors import PoolError
from hydrator.logs import ProblemLog

log = logging.getLogger(__name__)


class Annotator:
    """Sequences one annotation cycle over a :class:`QueueAdapter` and remembers, per schedd,
    its last good read (a schedd that fails is counted from it in the demand, never read as
    "no jobs") and whether it is failing (logged once per change of state, with its name)."""

    def __init__(self, adapter: QueueAdapter, settings: AnnotateSettings) -> None:
        self.adapter = adapter
        self.settings = settings
        self._last_good: dict[str, ScheddQueue] = {}
        self._failing: ProblemLog[str] = ProblemLog(log)  # per schedd; cause: the failing step

    def run(
        self, views: Mapping[Site, SiteView], now_s: int, queue: QueueSnapshot | None = None
    ) -> JobsReport:
        """Decide and edit for the jobs of ``queue`` (the cycle's shared read; without one,
        the adapter reads). Never raises for schedd or collector failures."""
        try:
            reads = self.adapter.read() if queue is None else annotation_reads(queue)
        except PoolError as exc:
            self._note("(collector)", "collector", f"cannot list the schedds: {exc}")
            stale = list(self._last_good.values())
            wanted = annotate_values(views, (j.required for q in stale for j in q.jobs))
            demand = site_demand(stale, wanted, [q.schedd for q in stale])
            names = tuple(self._last_good) or ("(collector)",)
            return JobsReport(failed_schedds=names, demand=demand, error=str(exc))
        self._note("(collector)", "collector", None)
        fresh = [r for r in reads if isinstance(r, ScheddQueue)]
        failed = [r for r in reads if isinstance(r, ScheddFailure)]
        for r in fresh:
            self._note(r.schedd, "read", None)
            self._last_good[r.schedd] = r
        for f in failed:
            self._note(f.schedd, "read", f"cannot read its queue: {f.error}")
        known = {r.schedd for r in reads}
        self._last_good = {k: v for k, v in self._last_good.items() if k in known}
        stale = [self._last_good[f.schedd] for f in failed if f.schedd in self._last_good]
        wanted = annotate_values(views, (j.required for q in [*fresh, *stale] for j in q.jobs))
        plan = plan_edits(fresh, wanted, self.settings, state_epoch(views, now_s))
        report = self._apply(plan)
        demand = site_demand([*fresh, *stale], wanted, [q.schedd for q in stale])
        return JobsReport(
            seen=sum(len(q.jobs) for q in fresh),
            edits=report.edits,
            edit_calls=report.edit_calls,
            jobs_edited=report.jobs_edited,
            deferred=plan.deferred,
            failed_schedds=tuple(sorted({f.schedd for f in failed} | set(report.refused_schedds))),
            refused_schedds=report.refused_schedds,
            demand=demand,
            applied=report.applied,
        )

    def _apply(self, plan: EditPlan) -> JobsReport:
        """Make the planned edits; a schedd that refuses one gets no more this cycle."""
        edits = calls = jobs = 0
        refused: dict[str, str] = {}
        applied: list[GroupEdit] = []
        for edit in plan.edits:
            if edit.schedd in refused:
                continue
            try:
                calls += self.adapter.apply(edit)
            except PoolError as exc:
                refused[edit.schedd] = str(exc)
                continue
            edits, jobs = edits + 1, jobs + edit.jobs
            applied.append(edit)
        for schedd in {e.schedd for e in plan.edits}:
            problem = refused.get(schedd)
            self._note(schedd, "edit", f"edit refused or failed: {problem}" if problem else None)
        return JobsReport(
            edits=edits,
            edit_calls=calls,
            jobs_edited=jobs,
            refused_schedds=tuple(sorted(refused)),
            applied=tuple(applied),
        )

    def _note(self, schedd: str, kind: str, problem: str | None) -> None:
        """Log a change of state once: failing (warning, with the schedd's name) or recovered
        (info). ``kind`` (read, edit, collector) says which step; success clears only its own
        kind, so a schedd whose reads work but whose edits are refused stays failing."""
        if problem is None:
            self._failing.recovered(
                schedd, "schedd %s: job annotation works again", schedd, cause=kind
            )
        else:
            self._failing.problem(
                schedd,
                "schedd %s: %s; counted as failed until it recovers",
                schedd,
                problem,
                cause=kind,
            )

    def close(self) -> None:
        self.adapter.close()
