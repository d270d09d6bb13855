"""Event cycles on the real pool reuse the last queue read while it is younger than
``[collector] queue_max_age_s``; a scheduled cycle reads afresh (docs/events.md). The schedd
queries are counted by the reader itself (:attr:`CondorQueue.queries`, one per schedd and
read) and by ``hydrator_queue_reads_total``. The pool is shared and locked: run this file alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hydrator.adapters.htcondor.condor_queue import CondorQueue
from hydrator.config import load_config
from hydrator.core.between_reads import unchanged
from hydrator.core.ports import FetchContext
from hydrator.core.queue_reuse import QueueRead
from hydrator.domain import DatasetId, Site, Snapshot, State
from hydrator.runtime.metrics import Metrics
from hydrator.runtime.outcome import CycleReport
from hydrator.runtime.service import Service
from hydrator.runtime.wiring import Assembly, build_assembly
from tests.pool.annotating import INVENTORY, annotated, demand_config, jobs_of, submit_idle
from tests.support.pool import IDLE, Pool

pytestmark = pytest.mark.pool

COMPLETE_AT_A = '{"ska:obs_1", "ska:sky"}'  # INVENTORY: complete at SITE_A, partly at SITE_B


@pytest.fixture
def make_service(condor_pool: Pool, tmp_path: Path) -> Iterator[Callable[[str], Assembly]]:
    """Demand-driven ads, matchmaking metrics and annotation, all on, in process, with the
    parts the service was built over (its queue reader, its metrics); the argument is the
    ``queue_max_age_s`` line ("" for the default, ``[daemon] interval_s``)."""
    condor_pool.remove_all_jobs()
    made: list[Assembly] = []

    def make(max_age: str) -> Assembly:
        directory = tmp_path / str(len(made))
        directory.mkdir()
        (directory / "inventory.toml").write_text(INVENTORY)
        path = directory / "hydrator.toml"
        path.write_text(demand_config(condor_pool, max_age))
        made.append(build_assembly(load_config(path)))
        return made[-1]

    yield make
    for built in made:
        built.service.close()
    condor_pool.remove_all_jobs()


def event_cycle(service: Service) -> CycleReport:
    """An event cycle (``Service.run_cycle`` with a planner) that re-reads no dataset: every
    source as it stands, as the Rucio event cycles plan the sources they did not read."""

    def planner(state: State, context: FetchContext) -> dict[str, Snapshot]:
        return {name: unchanged(s) for name, s in state.sources.items()}

    return service.run_event_cycle(planner)


def edit_calls(metrics: Metrics) -> float | None:
    return metrics.registry.get_sample_value("hydrator_job_edit_calls_total")


def test_event_cycles_within_the_age_query_no_schedd_and_edit_no_job_again(
    condor_pool: Pool, make_service: Callable[[str], Assembly]
) -> None:
    cluster = submit_idle(condor_pool, COMPLETE_AT_A, count=3)
    condor_pool.wait_for_job_state(cluster, [IDLE])
    schedd = condor_pool.schedd_name()
    built = make_service("")  # the default age: [daemon] interval_s = 60
    service, reader, metrics = built.service, built.pool.queue, built.instruments.metrics
    assert isinstance(reader, CondorQueue)

    assert service.run_cycle().queue is QueueRead.READ
    assert dict(reader.queries) == {schedd: 1}
    edits = edit_calls(metrics)
    assert edits, "the scheduled cycle annotated the jobs"

    reports = [event_cycle(service) for _ in range(10)]

    assert [r.outcome for r in reports] == ["ok"] * 10
    assert {r.queue for r in reports} == {QueueRead.REUSED}
    assert dict(reader.queries) == {schedd: 1}, "ten event cycles, no schedd query"
    assert edit_calls(metrics) == edits, "the reused snapshot carries the cycle's own edits"
    ad = service.published.ads[Site("SITE_A")]  # the demand cut off the reused snapshot
    assert set(ad.view.available) == {DatasetId("ska", "obs_1"), DatasetId("ska", "sky")}
    idle = metrics.registry.get_sample_value  # the probe off the reused snapshot
    assert idle("hydrator_jobs_idle_data_bound", {"reason": "missed_locality"}) == 3
    assert reports[-1].jobs is not None and reports[-1].jobs.seen == 3  # annotation
    assert [annotated(a) for a in jobs_of(condor_pool, [cluster])] == [(["SITE_A"], ["SITE_B"])] * 3

    more = submit_idle(condor_pool, '{"ska:obs_2"}')  # seen by the next read only
    condor_pool.wait_for_job_state(more, [IDLE])
    jobs = event_cycle(service).jobs
    assert jobs is not None and jobs.seen == 3
    report = service.run_cycle()  # scheduled: reads afresh
    assert report.queue is QueueRead.READ and report.jobs is not None and report.jobs.seen == 4
    assert dict(reader.queries) == {schedd: 2}
    sample = metrics.registry.get_sample_value
    counts = [sample("hydrator_queue_reads_total", {"outcome": o}) for o in ("read", "reused")]
    assert counts == [2, 11]


def test_schedd_queries_with_an_event_cycle_every_half_second(
    condor_pool: Pool, make_service: Callable[[str], Assembly]
) -> None:
    """Before (``queue_max_age_s = 0``, every cycle reads, as the code did) and after (a 2 s
    age) over the same 6 s of event cycles; the figures are printed for the report."""
    cluster = submit_idle(condor_pool, COMPLETE_AT_A, count=2)
    condor_pool.wait_for_job_state(cluster, [IDLE])
    schedd = condor_pool.schedd_name()
    counted: dict[str, tuple[int, int]] = {}
    for label, line in (("before", "queue_max_age_s = 0"), ("after", "queue_max_age_s = 2")):
        built = make_service(line)
        service, reader = built.service, built.pool.queue
        assert isinstance(reader, CondorQueue)
        service.run_cycle()
        cycles, end = 0, time.monotonic() + 6.0
        while time.monotonic() < end:
            event_cycle(service)
            cycles += 1
            time.sleep(0.5)
        counted[label] = (cycles, reader.queries[schedd] - 1)
    print(f"event cycles, schedd queries in 6 s: {counted}")
    before, after = counted["before"], counted["after"]
    assert before[1] == before[0], "age 0: one query per event cycle"
    assert 2 <= after[1] <= 4, "a 2 s age: one query per 2 s whatever the cycles"
