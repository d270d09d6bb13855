"""Per-step HTCondor submit lines for Toil: the batch system ``htcondor_steps``.

Toil's own ``htcondor`` batch system adds ``TOIL_HTCONDOR_PARAMS`` to every job of a run, and
nothing in the job ad it submits tells one CWL step from another (``ToilJobName`` is the job's
class, ``CWLJob``, for every step; the job store path in ``Arguments`` is ``kind-CWLJob/...``):
docs/jobs.md. This plugin is Toil's ``htcondor`` batch system plus two things:

* ``ToilJobName`` is the job's unit name, the dotted CWL path Toil logs
  (``workflow.cwl.image.image.cwl``; a scattered step's jobs are ``workflow.cwl.<i>.<tool>``);
* ``TOIL_HTCONDOR_STEP_PARAMS`` names a JSON file ``{"<key>": "<pairs>", ...}``: a job whose
  unit name is ``<key>`` or ends with ``.<key>`` (e.g. the tool's file name ``calibrate.cwl``)
  gets those pairs, in ``TOIL_HTCONDOR_PARAMS``' form (``name = value; ...``), on top of the
  run-wide ones (a step's pair replaces a run-wide pair of the same name). The first matching
  key in the file's order wins; a job no key matches gets the run-wide pairs only.

Install into Toil's environment (``pip install deploy/toil``; Toil loads every top-level module
named ``toil_batch_system_*``) and run ``toil-cwl-runner --batchSystem htcondor_steps``.
Written against Toil 9.6.0 (src/toil/batchSystems/htcondor.py).
"""

from __future__ import annotations

import json
import os
from typing import Any

from toil.batchSystems.registry import add_batch_system_factory

STEP_PARAMS_ENV = "TOIL_HTCONDOR_STEP_PARAMS"


def parse_pairs(text: str) -> dict[str, str]:
    """``name = value; ...`` as Toil parses ``TOIL_HTCONDOR_PARAMS`` (split on ``;``, then on the
    first ``=``), but an empty piece (a trailing ``;``) is skipped and a piece without ``=`` is
    an error naming it, where Toil 9.6.0 fails with a bare unpacking ValueError."""
    pairs: dict[str, str] = {}
    for piece in text.split(";"):
        if not piece.strip():
            continue
        name, sep, value = piece.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"{STEP_PARAMS_ENV}: {piece.strip()!r} is not 'name = value'")
        pairs[name.strip()] = value.strip()
    return pairs


def load_step_params(path: str) -> list[tuple[str, dict[str, str]]]:
    """The file ``path`` as (key, pairs) in file order; one clear error for a bad file."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    if not isinstance(data, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in data.items()
    ):
        raise ValueError(f"{STEP_PARAMS_ENV}: {path} must map step keys to strings")
    return [(key, parse_pairs(value)) for key, value in data.items()]


def pairs_for(unit_name: str, steps: list[tuple[str, dict[str, str]]]) -> dict[str, str]:
    """The pairs of the first key ``unit_name`` is or ends with (after a dot); else none."""
    for key, pairs in steps:
        if unit_name == key or unit_name.endswith("." + key):
            return pairs
    return {}


def classad_string(text: str) -> str:
    """``text`` as a ClassAd string literal (new syntax: backslash escapes)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _factory() -> type:
    from toil.batchSystems.htcondor import HTCondorBatchSystem  # noqa: PLC0415

    class _UnitNamed:
        """A job description whose ``jobName`` reads as its unit name (all else delegated)."""

        def __init__(self, job: Any) -> None:
            self._job = job
            self.jobName = job.unitName or job.jobName

        def __getattr__(self, name: str) -> Any:
            return getattr(self._job, name)

    class StepsBatchSystem(HTCondorBatchSystem):  # type: ignore[misc]
        """Toil's HTCondor batch system with per-step submit lines (module docstring)."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            path = os.environ.get(STEP_PARAMS_ENV)
            self.step_params = load_step_params(path) if path else []
            super().__init__(*args, **kwargs)

        def issueBatchJob(self, command: str, jobNode: Any, job_environment: Any = None) -> int:
            local = jobNode.local and not self.config.run_local_jobs_on_workers
            named = jobNode if local else _UnitNamed(jobNode)  # local: Toil's leader runs it
            return int(super().issueBatchJob(command, named, job_environment))

        class GridEngineThread(HTCondorBatchSystem.GridEngineThread):  # type: ignore[misc]
            def prepareSubmission(
                self, cpu: int, memory: int, disk: int, jobID: int, jobName: str, *rest: Any
            ) -> Any:
                submit = super().prepareSubmission(cpu, memory, disk, jobID, jobName, *rest)
                # Toil writes f'"{jobName}"' unescaped; unit names come from CWL file names
                submit["+ToilJobName"] = classad_string(jobName)
                for name, value in pairs_for(jobName, self.boss.step_params).items():
                    submit[name] = value
                return submit

    return StepsBatchSystem


add_batch_system_factory("htcondor_steps", _factory)
