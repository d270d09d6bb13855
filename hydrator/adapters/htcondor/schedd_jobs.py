"""Read and edit idle jobs on the schedds (the one module that edits jobs with htcondor2).

:class:`ScheddJobs` is the :class:`~hydrator.core.ports.QueueAdapter` of
:mod:`hydrator.runtime.annotate_jobs`:

* **read**: the annotation's part (:func:`~hydrator.core.jobs.annotation_reads`) of a
  :class:`~hydrator.adapters.htcondor.condor_queue.CondorQueue` read, the one queue read of a
  cycle that the demand and the matchmaking probe share: the schedds named in
  ``[jobs] schedds``, or every schedd the collector knows; their idle jobs matching the
  configured constraint, always ANDed with ``JobStatus == 1`` (never a running or held job),
  with the job id, ``RequiredDatasets`` and the attributes the annotator owns. A schedd that
  cannot be located or read is a :class:`~hydrator.core.jobs.ScheddFailure`, never an empty
  queue. The cycle hands its snapshot to
  :meth:`~hydrator.runtime.annotate_jobs.Annotator.run`; :meth:`read` reads one of its own (for
  a caller that annotates alone).
* **apply**: one ``Schedd.edit(["c.p", ...], attr, value)`` per changed attribute of a group.
  An id-list edit is one transaction: a job that left the queue since the read (or a job the
  identity may not edit) fails the whole call (seen on 25.14: "Modifying attribute ... in
  nonexistent job"). So after a failed call the group's jobs are read again and the call is
  retried once with those still idle; a second failure is the schedd's refusal
  (:class:`~hydrator.errors.PoolError`).

Who may edit: an identity in the schedd's ``QUEUE_SUPER_USERS`` with a user record
(``condor_qusers -add``); docs/provisioning.md gives the settings. The IDTOKEN comes from
``[collector] token_dir`` (``SEC_TOKEN_DIRECTORY``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import classad2
import htcondor2

from hydrator.adapters.htcondor import condor_queue
from hydrator.adapters.htcondor.condor_queue import HTCONDOR_ERRORS, CondorQueue, job_attributes
from hydrator.config import CollectorConfig, JobsConfig
from hydrator.core.jobs import (
    FieldEdit,
    GroupEdit,
    ScheddFailure,
    ScheddQueue,
    Value,
    annotation_reads,
)
from hydrator.core.queue import IDLE
from hydrator.errors import PoolError

log = logging.getLogger(__name__)


def expression(value: Value) -> classad2.ExprTree | str:
    """``value`` as the ClassAd expression ``Schedd.edit`` parses (never string concatenation)."""
    if isinstance(value, tuple):
        ad = classad2.ClassAd({"v": list(value)})
        return ad.lookup("v")
    if isinstance(value, int):
        return str(value)
    return classad2.quote(value)


class ScheddJobs:
    """The schedds of one pool; see the module docstring."""

    def __init__(self, config: JobsConfig, reader: CondorQueue) -> None:
        self.config = config
        self.reader = reader
        self._attrs = job_attributes(config)
        self.constraint = f"JobStatus == {IDLE} && ({config.constraint})"

    def read(self) -> list[ScheddQueue | ScheddFailure]:
        """A read of the reader's own (the cycle hands the annotator its shared snapshot)."""
        return annotation_reads(self.reader.read())

    # -- edit ----------------------------------------------------------------------------------

    def apply(self, edit: GroupEdit) -> int:
        location = self.reader.location(edit.schedd)
        if location is None:
            raise PoolError(f"schedd {edit.schedd} has no collector ad")
        schedd = htcondor2.Schedd(location)
        made = 0
        for call in edit.calls:
            if call.field not in self._attrs:
                continue  # DESIRED_Sites planned while the attribute is off: a bug, never data
            self._edit(schedd, edit.schedd, call)
            made += 1
        return made

    def _edit(self, schedd: htcondor2.Schedd, name: str, call: FieldEdit) -> None:
        attr, value = self._attrs[call.field], expression(call.value)
        try:
            schedd.edit(list(call.job_ids), attr, value)
            return
        except HTCONDOR_ERRORS as first:
            still = self._still_idle(schedd, call.job_ids)
            if not still:
                return  # every job left the queue or started: nothing to edit
            try:
                schedd.edit(still, attr, value)
            except HTCONDOR_ERRORS as exc:
                raise PoolError(f"{attr} on {len(still)} jobs: {exc}") from exc
            log.debug("schedd %s: edit retried without departed jobs (%s)", name, first)

    def _still_idle(self, schedd: htcondor2.Schedd, job_ids: Sequence[str]) -> list[str]:
        """Those of ``job_ids`` still idle and matching the constraint."""
        clusters = sorted({int(j.split(".")[0]) for j in job_ids})
        where = " || ".join(f"ClusterId == {c}" for c in clusters)
        try:
            ads = schedd.query(
                constraint=f"({self.constraint}) && ({where})", projection=["ClusterId", "ProcId"]
            )
        except HTCONDOR_ERRORS as exc:
            raise PoolError(f"cannot read the queue again: {exc}") from exc
        wanted = set(job_ids)
        return [i for ad in ads if (i := f"{ad['ClusterId']}.{ad['ProcId']}") in wanted]

    def close(self) -> None:
        pass


def build(
    config: JobsConfig, collector: CollectorConfig, reader: CondorQueue | None = None
) -> ScheddJobs:
    """The adapter editing through ``reader`` (the cycle's shared queue reader, which must
    cover annotation); without one, a reader of its own on ``[collector] pool``
    (:func:`~hydrator.adapters.htcondor.condor_queue.build`; raises ConfigError)."""
    if reader is None:
        reader = condor_queue.build(collector, config, pool=False, running=False)
    return ScheddJobs(config, reader)
