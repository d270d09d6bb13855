"""Service sequencing: failures degrade a cycle, never lose the last good state."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime
from pathlib import Path

import pytest

from hydrator.adapters.sources.static import StaticSource
from hydrator.adapters.state.sqlite import SqliteStateStore
from hydrator.config import Config, StaticSourceConfig, parse_config
from hydrator.core.index import merged_snapshot
from hydrator.core.locality import PoolJob, PoolSlot
from hydrator.core.plan import Plan
from hydrator.core.ports import FetchContext, Publisher, PublishReport, Source
from hydrator.core.queue import QueueSnapshot
from hydrator.domain import DatasetId, Site, SiteView, Snapshot
from hydrator.errors import PoolError, PublishError, StateError, TransientSourceError
from hydrator.runtime.metrics import Metrics
from hydrator.runtime.service import Service
from hydrator.runtime.wiring import assemble
from tests.unit.factories import t

Step = Snapshot | BaseException | Callable[[], Snapshot]
Clock = Callable[[], datetime]


class ScriptedSource(Source):
    """A source following a script: a Snapshot, an exception, or a callable per cycle."""

    def __init__(self, name: str, script: Sequence[Step]) -> None:
        self._name, self.script = name, list(script)

    @property
    def name(self) -> str:
        return self._name

    def fetch(self, context: FetchContext) -> Snapshot:
        step = self.script.pop(0)
        if isinstance(step, BaseException):
            raise step
        if isinstance(step, Snapshot):
            return step
        return step()

    def close(self) -> None:
        pass


class Recorder(Publisher):
    name = "recorder"

    def __init__(self, fail: bool = False) -> None:
        self.calls: list[tuple[set[str], set[str]]] = []
        self.fail = fail

    def publish(
        self, sites: Mapping[Site, SiteView], removed: frozenset[Site], now: datetime
    ) -> PublishReport:
        self.calls.append((set(sites), set(removed)))
        if self.fail:
            raise PublishError("collector 127.0.0.1:9618 did not answer")
        return PublishReport(sent={"merge": len(sites)})

    def close(self) -> None:
        pass


@pytest.fixture
def config(tmp_path: Path) -> Config:
    (tmp_path / "inv.toml").write_text('[storage.A]\nsite = "A"\navailable = ["ska:x"]\n')
    return parse_config(
        {"daemon": {"state_path": "s.sqlite"}, "sources": [{"type": "static", "path": "inv.toml"}]},
        tmp_path,
    )


@pytest.fixture
def clock() -> Iterator[Clock]:
    ticks = iter(range(1000))
    yield lambda: t(next(ticks))


def make(
    config: Config,
    sources: Sequence[Source],
    clock: Clock,
    publishers: Sequence[Publisher] = (),
    metrics: Metrics | None = None,
) -> Service:
    return assemble(
        config,
        sources=sources,
        store=SqliteStateStore(config.daemon.state_path),
        publishers=publishers,
        clock=clock,
        metrics=metrics,
    ).service


def good(config: Config) -> Snapshot:
    inventory = config.sources[0]
    assert isinstance(inventory, StaticSourceConfig)
    return StaticSource("s", inventory.path, {}).fetch(FetchContext(t(0)))


class Counting(ScriptedSource):
    """A source that also says what its last fetch deferred, called and reused, as the DMAPI
    and Rucio sources do (the capabilities of ``core/ports.py``)."""

    def __init__(self, name: str, script: Sequence[Step]) -> None:
        super().__init__(name, script)
        self.deferred_last_fetch = 0
        self.calls_last_fetch: dict[str, int] = {}
        self.reused_last_fetch = 0


def test_source_errors_degrade_the_cycle_and_keep_the_data(
    metrics: Metrics, config: Config, clock: Clock
) -> None:
    source = ScriptedSource(
        "s", [good(config), TransientSourceError("HTTP 503"), ZeroDivisionError("bug")]
    )
    service = make(config, [source], clock, metrics=metrics)
    assert service.run_cycle().outcome == "ok"
    for _ in range(2):
        report = service.run_cycle()
        assert report.outcome == "degraded" and report.plan is not None
        assert report.plan.changes == ()
        assert [str(d) for d in report.plan.sites[Site("A")].available] == ["ska:x"]
    m = metrics.registry.get_sample_value
    assert m("hydrator_source_stale", {"source": "s"}) == 1
    assert m("hydrator_source_staleness_seconds", {"source": "s"}) == 120  # 2 minutes of ticks
    assert m("hydrator_cycles_total", {"outcome": "degraded"}) == 2
    assert m("hydrator_source_requests_total", {"source": "s", "outcome": "transient_error"}) == 2
    assert m("hydrator_source_errors_total", {"source": "s", "kind": "transient"}) == 2


def test_work_a_source_defers_and_its_calls_are_exported(
    metrics: Metrics, config: Config, clock: Clock
) -> None:
    source = Counting("s", [good(config), good(config)])
    source.deferred_last_fetch = 7
    source.calls_last_fetch = {"locate": 3}
    source.reused_last_fetch = 4
    service = make(config, [source], clock, metrics=metrics)
    service.run_cycle()
    assert metrics.registry.get_sample_value("hydrator_source_reused_checks", {"source": "s"}) == 4
    source.deferred_last_fetch = 0  # caught up
    source.reused_last_fetch = 0
    service.run_cycle()
    m = metrics.registry.get_sample_value
    assert m("hydrator_source_deferred_checks", {"source": "s"}) == 0
    assert m("hydrator_source_reused_checks", {"source": "s"}) == 0
    assert m("hydrator_source_api_calls_total", {"source": "s", "method": "locate"}) == 6
    assert m("hydrator_source_deferred_checks", {"source": "other"}) is None


def test_slots_handed_to_the_looks_are_exported_apart_from_those_held_back(
    metrics: Metrics, config: Config, clock: Clock
) -> None:
    """A publisher whose repair looks deliver the slot merges: the cycle's report says how
    many it handed to them, not counted as held back by a rate limit."""

    class Handing(Recorder):
        def publish(
            self, sites: Mapping[Site, SiteView], removed: frozenset[Site], now: datetime
        ) -> PublishReport:
            return PublishReport(sent={"site_ad": 1}, deferred=2, handed=5)

    service = make(
        config, [ScriptedSource("s", [good(config)])], clock, [Handing()], metrics=metrics
    )
    assert service.run_cycle().outcome == "ok"
    m = metrics.registry.get_sample_value
    assert m("hydrator_collector_merges_handed") == 5
    assert m("hydrator_collector_merges_deferred") == 2


def test_a_publisher_failure_degrades_but_the_state_is_saved(config: Config, clock: Clock) -> None:
    recorder = Recorder(fail=True)
    service = make(config, [ScriptedSource("s", [good(config)])], clock, [recorder])
    report = service.run_cycle()
    assert report.outcome == "degraded" and "did not answer" in report.publish_errors["recorder"]
    assert recorder.calls == [({"A"}, set())]
    assert SqliteStateStore(config.daemon.state_path).load().sources["s"].replicas


def test_a_state_write_failure_fails_the_cycle_and_changes_nothing(
    config: Config, clock: Clock
) -> None:
    class Full(SqliteStateStore):
        def save(self, plan: Plan) -> int:
            raise StateError("disk full")

    service = assemble(
        config,
        sources=[ScriptedSource("s", [good(config)])],
        store=Full(config.daemon.state_path),
        clock=clock,
    ).service
    report = service.run_cycle()
    assert report.outcome == "failed" and report.error == "disk full"
    assert service.state.sources == {} and service.published.ads == {}
    assert service.readiness() == (False, "no successful answer yet from source(s): s")


def test_stop_during_fetch_abandons_without_saving(config: Config, clock: Clock) -> None:
    service: Service

    def slow() -> Snapshot:
        service.stop()  # SIGTERM arrives while the source is answering
        return good(config)

    service = make(config, [ScriptedSource("s", [slow])], clock)
    assert service.run_cycle().outcome == "abandoned"
    assert SqliteStateStore(config.daemon.state_path).load().sources == {}


def test_a_restart_serves_the_saved_state_before_its_first_cycle(
    config: Config, clock: Clock
) -> None:
    make(config, [ScriptedSource("s", [good(config)])], clock).run_cycle()
    restarted = make(config, [ScriptedSource("s", [TransientSourceError("down")])], clock)
    assert [str(d) for d in restarted.published.ads[Site("A")].view.available] == ["ska:x"]
    assert restarted.readiness()[0], "the saved state is last-known-good: ready at once"
    assert restarted.run_cycle().outcome == "degraded"
    assert [str(d) for d in restarted.published.ads[Site("A")].view.available] == ["ska:x"]


def test_readiness_needs_every_source_answered_once_now_or_in_the_saved_state(
    config: Config, clock: Clock
) -> None:
    down = TransientSourceError("down")
    service = make(
        config,
        [ScriptedSource("s", [down, good(config)]), ScriptedSource("t", [good(config)] * 2)],
        clock,
    )
    assert service.readiness() == (False, "no successful answer yet from source(s): s, t")
    service.run_cycle()  # t answers, s does not
    assert service.readiness() == (False, "no successful answer yet from source(s): s (down)")
    service.run_cycle()
    assert service.readiness()[0]
    restarted = make(config, [ScriptedSource("s", [down]), ScriptedSource("t", [down])], clock)
    assert restarted.readiness()[0], "the saved state holds last-known-good for both"


def test_cycles_never_overlap(config: Config, clock: Clock) -> None:
    entered = threading.Event()
    release = threading.Event()
    inside: list[int] = []

    def blocking() -> Snapshot:
        inside.append(1)
        entered.set()
        release.wait(5)
        return good(config)

    service = make(config, [ScriptedSource("s", [blocking, blocking])], clock)
    first = threading.Thread(target=service.run_cycle)
    first.start()
    entered.wait(5)
    second = threading.Thread(target=service.run_cycle)
    second.start()
    second.join(0.3)
    assert len(inside) == 1, "the second cycle waits for the first"
    release.set()
    first.join(5)
    second.join(5)
    assert len(inside) == 2


class Probe:  # a PoolProbe (its counter is a plain attribute here)
    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.invalid_last_query = 0 if fail else 2  # names its jobs declare, skipped

    def jobs_and_slots(
        self, queue: QueueSnapshot | None = None
    ) -> tuple[list[PoolJob], list[PoolSlot]]:
        if self.fail:
            raise PoolError("schedd did not answer")
        x = frozenset({DatasetId("ska", "x")})
        jobs = [PoolJob(x, True, Site("A")), PoolJob(x, True, Site("B")), PoolJob(x, False)]
        return jobs, [PoolSlot(Site("A"), unclaimed=True)]


def test_matchmaking_quality_is_measured_each_cycle(
    metrics: Metrics, config: Config, clock: Clock
) -> None:
    probe = Probe()
    service = assemble(
        config,
        sources=[ScriptedSource("s", [good(config), good(config)])],
        store=SqliteStateStore(config.daemon.state_path),
        probe=probe,
        clock=clock,
        metrics=metrics,
    ).service
    service.run_cycle()
    m = metrics.registry.get_sample_value
    assert m("hydrator_jobs_running_data_local_ratio") == 0.5
    assert m("hydrator_jobs_running", {"locality": "remote"}) == 1
    assert m("hydrator_jobs_idle_data_bound", {"reason": "missed_locality"}) == 1
    assert m("hydrator_sites_unclaimed_slots_with_data", {"site": "A"}) == 1
    invalid = {"source": "RequiredDatasets"}  # the jobs' invalid names, counted per read
    assert m("hydrator_invalid_records_total", invalid) == 2
    probe.fail, probe.invalid_last_query = True, 0  # as Probe(fail=True)
    assert service.run_cycle().outcome == "ok", "a pool that cannot be read is not a data problem"
    assert m("hydrator_pool_queries_total", {"outcome": "error"}) == 1
    assert m("hydrator_invalid_records_total", invalid) == 2


def test_unchanged_site_ads_are_reused_not_re_rendered(config: Config, clock: Clock) -> None:
    from tests.unit.factories import rep, snap

    a = snap("s", rep("A", "x"), rep("B", "y"))
    b = snap("s", rep("A", "x"), rep("B", "y"), rep("B", "z"))
    service = make(config, [ScriptedSource("s", [a, a, b])], clock)
    service.run_cycle()
    first = service.published.ads
    service.run_cycle()
    second = service.published.ads
    assert second[Site("A")].body is first[Site("A")].body, "same content: same bytes object"
    service.run_cycle()
    third = service.published.ads
    assert third[Site("A")].body is first[Site("A")].body
    assert third[Site("B")].etag != first[Site("B")].etag and b'"ska:z"' in third[Site("B")].body


def test_without_a_pool_probe_the_local_ratio_is_unknown_not_zero(
    metrics: Metrics, config: Config, clock: Clock
) -> None:
    import math

    service = make(config, [ScriptedSource("s", [good(config)])], clock, metrics=metrics)
    service.run_cycle()
    ratio = metrics.registry.get_sample_value("hydrator_jobs_running_data_local_ratio")
    assert ratio is not None and math.isnan(ratio)


def test_demand_mode_never_publishes_from_an_unknown_or_failed_demand(
    tmp_path: Path, clock: Clock
) -> None:
    from hydrator.domain import DatasetId
    from hydrator.errors import PoolError as QueueError

    (tmp_path / "inv.toml").write_text('[storage.A]\nsite = "A"\navailable = ["ska:x", "ska:y"]\n')
    config = parse_config(
        {
            "daemon": {"state_path": "s.sqlite"},
            "sources": [{"type": "static", "path": "inv.toml"}],
            "classad": {"advertise": "demand"},
        },
        tmp_path,
    )
    answers: list[QueueError | dict[DatasetId, int]] = [
        QueueError("schedd down"),
        {DatasetId("ska", "x"): 2},
        QueueError("x"),
    ]

    def demand() -> dict[DatasetId, int]:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    source = StaticSource("static", tmp_path / "inv.toml", {})
    service = assemble(
        config,
        sources=[source],
        store=SqliteStateStore(config.daemon.state_path),
        demand=demand,
        clock=clock,
    ).service
    assert service.published.ads == {}
    first = service.run_cycle()
    assert first.outcome == "degraded" and service.published.ads == {}, "unknown demand: nothing"
    service.run_cycle()
    assert [str(d) for d in service.published.ads[Site("A")].view.available] == ["ska:x"]
    service.run_cycle()  # the queue query fails: the last good demand stays in force
    assert [str(d) for d in service.published.ads[Site("A")].view.available] == ["ska:x"]
    service.close()

    restarted = assemble(
        config, sources=[source], store=SqliteStateStore(config.daemon.state_path), demand=demand
    ).service
    assert restarted.published.ads == {}, "a restart in demand mode waits for the queues"


def test_a_site_ad_over_max_ad_bytes_is_cut_counted_and_warned_once(
    metrics: Metrics, config: Config, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    from tests.unit.factories import rep, snap

    big = snap("s", *(rep("A", f"observation_{i:05d}_{'x' * 40}") for i in range(2000)))
    small = snap("s", *(rep("A", f"n{i:04d}") for i in range(1200)))  # not a suspicious drop
    service = make(config, [ScriptedSource("s", [big, big, small])], clock, metrics=metrics)
    unadvertised = {"site": "A", "reason": "over_size"}
    m = metrics.registry.get_sample_value

    with caplog.at_level("INFO", logger="hydrator.runtime.advertising"):
        for _ in range(2):
            service.run_cycle()
            body = service.published.ads[Site("A")].body
            assert 59_900 < len(body) <= 60_000 == config.classad.max_ad_bytes
            kept = len(service.published.ads[Site("A")].view.available)
            assert m("hydrator_datasets_unadvertised", unadvertised) == 2000 - kept
        warnings = [r for r in caplog.records if "max_ad_bytes" in r.getMessage()]
        assert len(warnings) == 1 and warnings[0].levelname == "WARNING"
        service.run_cycle()
    assert m("hydrator_datasets_unadvertised", unadvertised) == 0
    assert "site A: its ad fits max_ad_bytes = 60000 again" in caplog.text


def test_an_unchanged_over_size_site_is_cut_again_by_this_cycles_demand_and_time(
    config: Config, clock: Clock
) -> None:
    """The cut of an unchanged site is reused across cycles only while the demand is the
    same: a newly demanded dataset enters the ad at once, with this cycle's time."""
    from hydrator.domain import DatasetId
    from tests.unit.factories import rep, snap

    big = snap("s", *(rep("A", f"observation_{i:05d}_{'x' * 40}") for i in range(2000)))
    last = DatasetId("ska", f"observation_01999_{'x' * 40}")  # sorts last: cut without demand
    answers: list[dict[DatasetId, int]] = [{}, {}, {last: 3}, {last: 3}]
    service = assemble(
        config,
        sources=[ScriptedSource("s", [big] * 4)],
        store=SqliteStateStore(config.daemon.state_path),
        demand=lambda: answers.pop(0),
        clock=clock,
    ).service
    listed = []
    for _ in range(4):
        report = service.run_cycle()
        assert report.plan is not None
        ad = service.published.ads[Site("A")]
        assert ad.view.updated == report.plan.sites[Site("A")].updated == report.started
        assert len(ad.body) <= 60_000 < 2000 * 57
        listed.append(last in ad.view.available)
    assert listed == [False, False, True, True]
    service.close()


def test_invalid_records_of_the_last_answer_are_a_gauge_kept_while_the_source_fails(
    metrics: Metrics, config: Config, clock: Clock
) -> None:
    from tests.unit.factories import rep

    def answer(invalid: int) -> Snapshot:
        return merged_snapshot("s", [rep("A", "x")], [], invalid, frozenset())

    script: list[Step] = [answer(1), answer(1), TransientSourceError("HTTP 503"), answer(3)]
    service = make(config, [ScriptedSource("s", script)], clock, metrics=metrics)
    m = metrics.registry.get_sample_value
    seen = []
    for _ in script:
        service.run_cycle()
        seen.append(m("hydrator_source_invalid_records", {"source": "s"}))
    assert seen == [1, 1, 1, 3]
    assert m("hydrator_invalid_records_total", {"source": "s"}) == 5  # per answer


# ---- one slow source never holds the cycle past its deadline


@pytest.fixture
def two_sources(tmp_path: Path) -> Config:
    (tmp_path / "inv.toml").write_text('[storage.A]\nsite = "A"\navailable = ["ska:x"]\n')
    static = {"type": "static", "path": "inv.toml", "settle_s": 0}
    return parse_config(
        {
            "daemon": {"state_path": "s.sqlite"},
            "sources": [{**static, "name": "fast"}, {**static, "name": "slow", "deadline_s": 1}],
        },
        tmp_path,
    )


def test_a_source_past_its_deadline_fails_and_the_cycle_goes_on(
    two_sources: Config, clock: Clock
) -> None:
    release = threading.Event()

    def hang() -> Snapshot:
        release.wait(60)  # a server sending one header line a second, for ever
        return merged_snapshot("slow", [], ())

    fast = ScriptedSource("fast", [lambda: merged_snapshot("fast", good(two_sources).replicas)] * 3)
    slow = ScriptedSource("slow", [hang, hang])
    service = make(two_sources, [fast, slow], clock)
    try:
        t0 = time.monotonic()
        report = service.run_cycle()
        assert time.monotonic() - t0 < 4  # deadline_s = 1, plus the grace second
        assert report.plan is not None
        reasons = {s.name: s.reason for s in report.plan.sources}
        assert "no answer within deadline_s = 1 s" in str(reasons["slow"])
        assert reasons["fast"] is None
        assert [str(d) for d in report.plan.sites[Site("A")].available] == ["ska:x"]
        assert service.busy_sources() == ["slow"]

        t0 = time.monotonic()
        second = service.run_cycle()  # still busy: failed at once, not fetched twice
        assert time.monotonic() - t0 < 1
        assert second.plan is not None
        assert "still running" in str({s.name: s.reason for s in second.plan.sources}["slow"])
        assert len(slow.script) == 1
    finally:
        release.set()
    time.sleep(0.2)
    assert service.busy_sources() == []
    service.close()


def test_stopping_ends_a_cycle_waiting_for_a_source_at_once(
    two_sources: Config, clock: Clock
) -> None:
    release = threading.Event()

    def blocked() -> Snapshot:
        release.wait(60)
        return good(two_sources)

    fast = ScriptedSource("fast", [lambda: good(two_sources)])
    slow = ScriptedSource("slow", [blocked])
    service = make(two_sources, [fast, slow], clock)
    threading.Timer(0.3, service.stop).start()
    t0 = time.monotonic()
    assert service.run_cycle().outcome == "abandoned"
    assert time.monotonic() - t0 < 1
    release.set()
    service.close()
