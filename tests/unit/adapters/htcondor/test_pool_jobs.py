"""Job ads (as the queue read translates them) -> pool jobs for the matchmaking-quality
metrics: invalid names counted, logged once."""

from __future__ import annotations

import classad2
import htcondor2
import pytest

from hydrator.adapters.htcondor import condor_queue
from hydrator.adapters.htcondor.condor_queue import CondorPoolProbe, JobQuery
from hydrator.domain import DatasetId, Site


def job(required: object, status: int = 2, host: str = "slot1@vm") -> classad2.ClassAd:
    ad = {"RequiredDatasets": required, "JobStatus": status, "RemoteHost": host}
    return classad2.ClassAd({"ClusterId": 1, "ProcId": 0, **ad})


def test_invalid_names_are_counted_logged_once_and_skipped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    probe = CondorPoolProbe(htcondor2.Collector("127.0.0.1:1"), "GLIDEIN_Site")  # never queried
    ads = [
        job(["ska:ok", "bad name"]),
        job(["bad name"]),  # nothing valid left: not a data-bound job here
        job('ska:ok, "quoted"', status=1),
    ]
    for _ in range(2):
        queued = map(JobQuery(pool=True, running=True, jobs=None).job, ads)  # as read
        jobs = probe.pool_jobs(queued, {"slot1@vm": Site("SITE_A")})
    assert [(sorted(map(str, j.required)), j.running, j.site) for j in jobs] == [
        (["ska:ok"], True, "SITE_A"),
        (["ska:ok"], False, None),
    ]
    assert probe.invalid_last_query == 3
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert sorted(warnings) == [
        "a job declares an invalid dataset name '\"quoted\"'; skipped",
        "a job declares an invalid dataset name 'bad name'; skipped",
    ]
    assert DatasetId("ska", "ok") in jobs[0].required


def test_a_job_cannot_make_long_or_endless_log_lines(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job's invalid name is logged bounded (a prefix and its length), and
    only so many distinct names are remembered and logged per process."""
    monkeypatch.setattr(condor_queue, "MAX_WARNED_NAMES", 3)
    probe = CondorPoolProbe(htcondor2.Collector("127.0.0.1:1"), "GLIDEIN_Site")  # never queried
    read = JobQuery(pool=True, running=True, jobs=None).job  # as the queue read makes them
    probe.pool_jobs([read(job(["ska:" + "x" * 10_000 + " y"]))], {})
    (line,) = [r.getMessage() for r in caplog.records]
    assert len(line) < 300 and "(10006 characters)" in line
    probe.pool_jobs([read(job([f"bad name {i}" for i in range(10)]))], {})
    assert len(caplog.records) == 3 and probe.invalid_last_query == 10
