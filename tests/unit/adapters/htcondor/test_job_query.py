"""The one query per schedd: the union of the consumers' constraints and projections, and the
``[jobs] constraint`` evaluated on each returned (projected) job ad."""

from __future__ import annotations

import classad2

from hydrator.adapters.htcondor.condor_queue import JobQuery
from hydrator.config import JobsConfig


def ad(status: int, owner: str = "alice", required: object = None) -> classad2.ClassAd:
    attrs = {"ClusterId": 3, "ProcId": 1, "JobStatus": status, "Owner": owner}
    if required is not None:
        attrs["RequiredDatasets"] = required
    return classad2.ClassAd(attrs)


def test_the_union_of_constraints_and_projections() -> None:
    jobs = JobsConfig(constraint='MY.Owner == "alice" && TARGET.Foo =!= 1')
    query = JobQuery(pool=True, running=True, jobs=jobs)
    assert query.constraint == (
        "((JobStatus == 1 || JobStatus == 2) && RequiredDatasets isnt undefined) || "
        '(JobStatus == 1 && (MY.Owner == "alice" && TARGET.Foo =!= 1))'
    )
    assert query.projection == [
        "ClusterId",
        "ProcId",
        "JobStatus",
        "RequiredDatasets",
        "RemoteHost",
        "DataLocalitySites",
        "DataLocalityPartialSites",
        "DataLocalitySitesUpdated",
        "Owner",  # what the constraint references on the job (MY.Owner), not TARGET's
    ]
    demand_only = JobQuery(pool=True, running=False, jobs=None)
    assert demand_only.constraint == "JobStatus == 1 && RequiredDatasets isnt undefined"
    assert "RemoteHost" not in demand_only.projection


def test_a_job_is_marked_for_annotation_only_when_it_matches_the_jobs_constraint() -> None:
    query = JobQuery(pool=True, running=True, jobs=JobsConfig(constraint='Owner == "alice"'))
    alice = query.job(ad(1, required=["ska:x"]))
    assert alice.job_id == "3.1" and alice.required == ("ska:x",) and alice.annotate
    assert not query.job(ad(1, owner="bob", required=["ska:x"])).annotate
    assert not query.job(ad(2, required="ska:x ska:y")).annotate, "never a running job"
    assert query.job(ad(2, required="ska:x ska:y")).required == ("ska:x", "ska:y")
    no_data = query.job(ad(1))
    assert no_data.annotate and no_data.required is None


def test_annotation_alone_marks_every_job_it_gets() -> None:
    query = JobQuery(pool=False, running=False, jobs=JobsConfig())
    assert (
        query.constraint == "JobStatus == 1 && (JobStatus == 1 && RequiredDatasets isnt undefined)"
    )
    job = query.job(ad(1, required=["ska:x"]))
    assert job.annotate and job.sites is None and job.updated is None
