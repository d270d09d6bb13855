"""Read and edit idle jobs on the schedds (the one module that edits jobs with htcondor2).

:class:`ScheddJobs` is the :class:`~hydrator.core.jobs.QueueAdapter` of :mod:`hydrator.core.jobs`:

* **read**: the schedds named in ``[jobs] schedds`` (``Collector.locate``), or every schedd the
  collector knows (``locateAll``); each is asked for its idle jobs matching the configured
  constraint, always ANDed with ``JobStatus == 1`` (never a running or held job), projected to
  the job id, ``RequiredDatasets`` and the attributes the annotator owns.
  A schedd that cannot be located or read is a :class:`~hydrator.core.jobs.ScheddFailure`, never an
  empty queue. A schedd seen before that has no collector ad now (a restarting schedd has none
  for 10-20 s, FACTS.md) is reported failed until it is back, or forgotten after
  :data:`FORGET_AFTER_S`.
* **apply**: one ``Schedd.edit(["c.p", ...], attr, value)`` per changed attribute of a group.
  An id-list edit is one transaction: a job that left the queue since the read (or a job the
  identity may not edit) fails the whole call (seen on 25.14: "Modifying attribute ... in
  nonexistent job"). So after a failed call the group's jobs are read again and the call is
  retried once with those still idle; a second failure is the schedd's refusal
  (:class:`~hydrator.errors.PublishError`).

Who may edit: an identity in the schedd's ``QUEUE_SUPER_USERS`` with a user record
(``condor_qusers -add``); docs/provisioning.md gives the settings. The IDTOKEN comes from
``[collector] token_dir`` (``SEC_TOKEN_DIRECTORY``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import classad2
import htcondor2

from hydrator.adapters.htcondor.condor_queue import (
    HTCONDOR_ERRORS,
    IDLE,
    REQUIRED_ATTRIBUTE,
    required_names,
)
from hydrator.config import CollectorConfig, JobsConfig
from hydrator.core.jobs import (
    FieldEdit,
    GroupEdit,
    JobField,
    QueuedJob,
    ScheddFailure,
    ScheddQueue,
    Value,
)
from hydrator.errors import ConfigError, PublishError

log = logging.getLogger(__name__)

FORGET_AFTER_S = 900.0
"""A schedd absent from the collector this long (seconds) is no longer reported as failed."""


def _attributes(config: JobsConfig) -> dict[JobField, str]:
    names = {
        JobField.SITES: config.sites_attribute,
        JobField.PARTIAL_SITES: config.partial_sites_attribute,
        JobField.UPDATED: config.updated_attribute,
    }
    if config.desired_sites_attribute:
        names[JobField.DESIRED_SITES] = config.desired_sites_attribute
    return names


def _strings(value: Any) -> tuple[str, ...] | None:
    """A ClassAd list of strings as a tuple; anything else None (it will be overwritten)."""
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(value)
    return None


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

    def __init__(
        self,
        config: JobsConfig,
        pool: str | None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self._collector = htcondor2.Collector(pool)
        self._attrs = _attributes(config)
        self.constraint = f"JobStatus == {IDLE} && ({config.constraint})"
        self._projection = ["ClusterId", "ProcId", REQUIRED_ATTRIBUTE, *self._attrs.values()]
        self._clock = clock
        self._seen: dict[str, tuple[classad2.ClassAd, float]] = {}  # name -> (location, when)

    # -- read ----------------------------------------------------------------------------------

    def read(self) -> list[ScheddQueue | ScheddFailure]:
        out: list[ScheddQueue | ScheddFailure] = []
        for name, location in self._locate().items():
            if location is None:
                out.append(ScheddFailure(name, "no collector ad (down or restarting?)"))
                continue
            try:
                ads = htcondor2.Schedd(location).query(
                    constraint=self.constraint, projection=self._projection
                )
            except HTCONDOR_ERRORS as exc:
                out.append(ScheddFailure(name, str(exc) or type(exc).__name__))
                continue
            out.append(ScheddQueue(name, tuple(self._job(ad) for ad in ads)))
        return out

    def _locate(self) -> dict[str, classad2.ClassAd | None]:
        """Name -> location ad, or None for a schedd that should be there and is not."""
        now = self._clock()
        found: dict[str, classad2.ClassAd | None] = {}
        if self.config.schedds:
            for name in self.config.schedds:
                try:
                    found[name] = self._collector.locate(htcondor2.DaemonType.Schedd, name)
                except HTCONDOR_ERRORS:
                    found[name] = None
        else:
            try:
                ads = self._collector.locateAll(htcondor2.DaemonType.Schedd)
            except HTCONDOR_ERRORS as exc:
                raise PublishError(f"cannot list the schedds: {exc}") from exc
            found = {str(ad.get("Name")): ad for ad in ads}
            for name, (_, when) in list(self._seen.items()):
                if name not in found and now - when < FORGET_AFTER_S:
                    found[name] = None
        for name, ad in found.items():
            if ad is not None:
                self._seen[name] = (ad, now)
        self._seen = {n: v for n, v in self._seen.items() if now - v[1] < FORGET_AFTER_S}
        return found

    def _job(self, ad: classad2.ClassAd) -> QueuedJob:
        attrs = self._attrs
        updated = ad.get(attrs[JobField.UPDATED])
        desired_attr = attrs.get(JobField.DESIRED_SITES)
        desired = ad.get(desired_attr) if desired_attr else None
        return QueuedJob(
            job_id=f"{ad['ClusterId']}.{ad['ProcId']}",
            required=frozenset(required_names(ad.eval(REQUIRED_ATTRIBUTE))),
            sites=_strings(ad.get(attrs[JobField.SITES])),
            partial_sites=_strings(ad.get(attrs[JobField.PARTIAL_SITES])),
            updated=updated if isinstance(updated, int) and not isinstance(updated, bool) else None,
            desired_sites=None if desired is None else str(desired),
        )

    # -- edit ----------------------------------------------------------------------------------

    def apply(self, edit: GroupEdit) -> int:
        location = self._seen.get(edit.schedd)
        if location is None:
            raise PublishError(f"schedd {edit.schedd} has no collector ad")
        schedd = htcondor2.Schedd(location[0])
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
                raise PublishError(f"{attr} on {len(still)} jobs: {exc}") from exc
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
            raise PublishError(f"cannot read the queue again: {exc}") from exc
        wanted = set(job_ids)
        return [i for ad in ads if (i := f"{ad['ClusterId']}.{ad['ProcId']}") in wanted]

    def close(self) -> None:
        pass


def build(config: JobsConfig, collector: CollectorConfig) -> ScheddJobs:
    """The adapter on ``[collector] pool``, authenticating with the IDTOKEN in ``[collector]
    token_dir`` (set in the library's configuration: the environment is read only once, when
    the library loads); raises ConfigError for a constraint that is not a ClassAd expression."""
    try:
        classad2.ExprTree(config.constraint)
    except classad2.ClassAdException as exc:
        raise ConfigError("jobs.constraint", f"not a ClassAd expression: {exc}") from None
    if collector.token_dir is not None:
        htcondor2.param["SEC_TOKEN_DIRECTORY"] = str(collector.token_dir)
    try:
        return ScheddJobs(config, collector.pool)
    except HTCONDOR_ERRORS as exc:
        raise ConfigError("collector.pool", f"cannot use {collector.pool!r}: {exc}") from None
