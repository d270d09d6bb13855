"""Event cycles reuse a young queue snapshot, scheduled cycles read it afresh
(:mod:`hydrator.runtime.queue_reads`): a service with a scripted queue reader."""

from __future__ import annotations

from functools import partial
from pathlib import Path

from prometheus_client import CollectorRegistry

from hydrator.adapters.sources.static import StaticSource
from hydrator.adapters.state.sqlite import SqliteStateStore
from hydrator.config import parse_config
from hydrator.core.between_reads import unchanged
from hydrator.core.jobs import AnnotateSettings
from hydrator.core.plan import Plan
from hydrator.core.ports import FetchContext
from hydrator.core.queue import IDLE, QueueJob, QueueSnapshot, ScheddRead
from hydrator.core.queue_reuse import QueueRead
from hydrator.domain import Site, Snapshot, State
from hydrator.runtime.annotate_jobs import Annotator
from hydrator.runtime.metrics import Metrics
from hydrator.runtime.queue_reads import QueueReads
from hydrator.runtime.refresh_answers import read_and_restate
from hydrator.runtime.service import Rereader, Service
from hydrator.runtime.wiring import Assembly, assemble
from tests.support.scripted import ScriptedQueue


class Reader:  # a QueueReader (``pool`` a plain attribute here)
    """A QueueReader answering from a script (the last answer repeats), counting reads."""

    def __init__(self, *answers: QueueSnapshot) -> None:
        self.answers, self.reads, self.pool = list(answers), 0, True

    def read(self) -> QueueSnapshot:
        self.reads += 1
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


def wanting(*names: str) -> QueueSnapshot:
    jobs = tuple(QueueJob(f"1.{i}", IDLE, (n,)) for i, n in enumerate(names))
    return QueueSnapshot((ScheddRead("s1", jobs),))


def service(
    tmp_path: Path, reader: Reader, max_age_s: float | None = None, metrics: Metrics | None = None
) -> Service:
    return assembly(tmp_path, reader, max_age_s, metrics).service


def assembly(
    tmp_path: Path, reader: Reader, max_age_s: float | None = None, metrics: Metrics | None = None
) -> Assembly:
    (tmp_path / "inv.toml").write_text('[storage.A]\nsite = "A"\navailable = ["ska:x", "ska:y"]\n')
    collector = {} if max_age_s is None else {"queue_max_age_s": max_age_s}
    config = parse_config(
        {
            "daemon": {"state_path": "s.sqlite", "interval_s": 3600},
            "sources": [{"type": "static", "path": "inv.toml", "settle_s": 0}],
            "classad": {"advertise": "demand"},
            "collector": collector,
        },
        tmp_path,
    )
    return assemble(
        config,
        sources=[StaticSource("static", tmp_path / "inv.toml", {})],
        store=SqliteStateStore(config.daemon.state_path),
        queue=reader,
        metrics=metrics,
    )


def planner_of(svc: Service) -> Rereader:
    """An event cycle's answers that re-read nothing (every source as it stands)."""

    def planner(state: State, context: FetchContext) -> dict[str, Snapshot]:
        return {name: unchanged(s) for name, s in state.sources.items()}

    return planner


def event(svc: Service) -> Plan:
    """An event cycle that re-reads nothing."""
    plan = svc.run_event_cycle(planner_of(svc)).plan
    assert plan is not None
    return plan


def advertised(svc: Service) -> list[str]:
    return [str(d) for d in svc.published.ads[Site("A")].view.available]


def reads(metrics: Metrics, outcome: str) -> float | None:
    return metrics.registry.get_sample_value("hydrator_queue_reads_total", {"outcome": outcome})


def test_event_cycles_within_the_age_reuse_and_a_scheduled_cycle_reads(
    tmp_path: Path, metrics: Metrics
) -> None:
    reader = Reader(wanting("ska:x"), wanting("ska:y"))
    svc = service(tmp_path, reader, metrics=metrics)  # the age: [daemon] interval_s, an hour
    assert svc.run_cycle().queue is QueueRead.READ
    assert advertised(svc) == ["ska:x"]

    for _ in range(5):
        event(svc)
    assert reader.reads == 1, "event cycles within the age ask no schedd"
    assert advertised(svc) == ["ska:x"], "the demand cut works off the reused snapshot"

    report = svc.run_cycle()
    assert reader.reads == 2 and report.queue is QueueRead.READ
    assert advertised(svc) == ["ska:y"]
    assert (reads(metrics, "read"), reads(metrics, "reused"), reads(metrics, "failed")) == (2, 5, 0)
    svc.close()


def test_an_age_of_0_reads_every_cycle_and_a_failed_read_keeps_the_demand(
    tmp_path: Path, metrics: Metrics
) -> None:
    reader = Reader(wanting("ska:x"), QueueSnapshot(error="collector down"), wanting("ska:y"))
    svc = service(tmp_path, reader, max_age_s=0, metrics=metrics)
    svc.run_cycle()
    svc.run_cycle()  # fails
    event(svc)
    assert reader.reads == 3
    assert (reads(metrics, "read"), reads(metrics, "reused"), reads(metrics, "failed")) == (2, 0, 1)
    assert advertised(svc) == ["ska:y"]
    svc.close()


def test_a_failed_read_is_reused_as_a_failure_the_last_good_demand_standing(
    tmp_path: Path,
) -> None:
    reader = Reader(wanting("ska:x"), QueueSnapshot(error="collector down"), wanting("ska:y"))
    svc = service(tmp_path, reader)
    svc.run_cycle()
    assert svc.run_cycle().queue is QueueRead.FAILED
    event(svc)  # within the age: the failing pool is not asked again
    assert reader.reads == 2 and advertised(svc) == ["ska:x"]
    svc.close()


def test_the_age_is_measured_from_the_read() -> None:
    now = [0.0]
    reader = Reader(wanting("ska:x"))
    reads_ = QueueReads(reader, 10.0, Metrics(CollectorRegistry()), clock=lambda: now[0])
    for at, scheduled, outcome in [
        (0.0, False, QueueRead.READ),  # no snapshot yet: even an event cycle reads
        (9.9, False, QueueRead.REUSED),
        (10.0, False, QueueRead.READ),
        (12.0, True, QueueRead.READ),
        (13.0, False, QueueRead.REUSED),
    ]:
        now[0] = at
        reads_.begin(scheduled=scheduled)
        assert reads_.take() is reads_.take()  # one take per cycle, however many ask
        assert reads_.outcome is outcome, at
    assert reader.reads == 3


def test_annotation_alone_reuses_after_the_ads_and_edits_each_job_once(tmp_path: Path) -> None:
    (tmp_path / "inv.toml").write_text('[storage.A]\nsite = "A"\navailable = ["ska:x"]\n')
    config = parse_config(
        {
            "daemon": {"state_path": "s.sqlite"},
            "sources": [{"type": "static", "path": "inv.toml", "settle_s": 0}],
        },
        tmp_path,
    )
    reader = Reader(QueueSnapshot((ScheddRead("s1", (annotated_job(),), annotate=True),)))
    reader.pool = False  # read for annotation alone, after the ads
    edits = ScriptedQueue()
    svc = assemble(
        config,
        sources=[StaticSource("static", tmp_path / "inv.toml", {})],
        store=SqliteStateStore(config.daemon.state_path),
        queue=reader,
        annotator=Annotator(edits, AnnotateSettings()),
    ).service
    first = svc.run_cycle()
    assert first.queue is QueueRead.READ and first.jobs is not None and first.jobs.edits == 1
    later = [svc.run_event_cycle(planner_of(svc)) for _ in range(3)]
    assert [r.queue for r in later] == [QueueRead.REUSED] * 3
    assert reader.reads == 1
    assert len(edits.applied) == 1, "the held snapshot carries the first cycle's edit"
    assert [r.jobs.seen for r in later if r.jobs is not None] == [1, 1, 1]
    svc.close()


def annotated_job() -> QueueJob:
    return QueueJob("1.0", IDLE, ("ska:x",), annotate=True)


def test_a_refresh_cycle_is_scheduled_so_it_reads_the_queues_afresh(tmp_path: Path) -> None:
    """The refresh cycle the events gate runs instead of a skipped full read refreshes the
    demand (new jobs, their annotation) as a full cycle would, within the age too."""
    reader = Reader(wanting("ska:x"), wanting("ska:y"))
    built = assembly(tmp_path, reader)  # the age: an hour
    svc, sources, metrics = built.service, built.catalogue.sources, built.instruments.metrics
    svc.run_cycle()
    refreshed = partial(read_and_restate, sources=sources, metrics=metrics, busy=svc.busy_sources)
    report = svc.run_refresh_cycle(lambda state, context: refreshed(state, context).outcomes)
    assert reader.reads == 2 and report.queue is QueueRead.READ
    assert advertised(svc) == ["ska:y"]
    event(svc)
    assert reader.reads == 2, "an event cycle after it reuses its read"
    svc.close()
