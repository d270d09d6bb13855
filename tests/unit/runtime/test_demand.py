"""``GET /v1/demand`` and the demand metrics, from a service whose annotator reads a scripted
queue; ``once --json``'s jobs section; the ``[jobs]`` configuration's checks."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from hydrator.adapters.state.sqlite import SqliteStateStore
from hydrator.config import parse_config
from hydrator.core.jobs import AnnotateSettings, QueuedJob, ScheddFailure, ScheddQueue
from hydrator.errors import ConfigError
from hydrator.runtime.annotate_jobs import Annotator
from hydrator.runtime.http_endpoint import HttpEndpoint
from hydrator.runtime.json_views import cycle_json
from hydrator.runtime.metrics import Metrics
from hydrator.runtime.wiring import assemble, build_source
from tests.support.scripted import ScriptedQueue

INVENTORY = (
    '[storage.A]\nsite = "SITE_A"\navailable = ["ska:x", "ska:y"]\n\n'
    '[storage.B]\nsite = "SITE_B"\navailable = ["ska:x"]\npartial = { "ska:y" = 0.4 }\n'
)
XY = frozenset({"ska:x", "ska:y"})


@pytest.fixture
def served(tmp_path: Path, metrics: Metrics) -> Iterator[tuple[str, Any, ScriptedQueue]]:
    (tmp_path / "inv.toml").write_text(INVENTORY)
    config = parse_config(
        {
            "daemon": {"state_path": "s.sqlite"},
            "sources": [{"type": "static", "path": "inv.toml", "settle_s": 0}],
            "http": {"listen": "127.0.0.1:0"},
        },
        tmp_path,
    )
    adapter = ScriptedQueue()
    service = assemble(
        config,
        sources=[build_source(s, config.sites) for s in config.sources],
        store=SqliteStateStore(config.daemon.state_path),
        annotator=Annotator(adapter, AnnotateSettings()),
        metrics=metrics,
    ).service
    http = HttpEndpoint(service, config.http, wedged_after_s=300, metrics=metrics)
    http.start()
    yield f"http://127.0.0.1:{http.port}", service, adapter
    http.stop()
    service.close()


def queue(*jobs: tuple[str, frozenset[str]]) -> ScheddQueue:
    return ScheddQueue("s1", tuple(QueuedJob(i, r) for i, r in jobs))


def test_demand_per_site_with_etag_and_metrics(
    metrics: Metrics, served: tuple[str, Any, ScriptedQueue]
) -> None:
    base, service, adapter = served
    url = f"{base}/v1/demand"
    assert requests.get(url, timeout=5).json()["jobs"] is None  # not read yet

    adapter.reads = [
        [queue(("1.0", XY), ("1.1", XY), ("2.0", frozenset({"ska:nowhere"})))],
        [queue(("1.0", XY), ("1.1", XY), ("2.0", frozenset({"ska:nowhere"})))],
        [queue(("1.0", XY))],
    ]
    report = service.run_cycle()
    doc = requests.get(url, timeout=5).json()
    assert doc["sites"] == {
        "SITE_A": {"complete": 2, "partial": 0},
        "SITE_B": {"complete": 0, "partial": 2},
    }
    assert (doc["jobs"], doc["nowhere"]) == (3, 1)
    assert cycle_json(report)["jobs"]["seen"] == 3
    metric = metrics.registry.get_sample_value
    at_b = {"site": "SITE_B", "locality": "partial"}
    assert metric("hydrator_jobs_idle_data_bound_at_site", at_b) == 2
    assert metric("hydrator_jobs_idle_data_nowhere") == 1

    tag = requests.get(url, timeout=5).headers["ETag"]
    service.run_cycle()  # the same queue: the same answer
    assert requests.get(url, headers={"If-None-Match": tag}, timeout=5).status_code == 304
    service.run_cycle()  # one job left
    changed = requests.get(url, headers={"If-None-Match": tag}, timeout=5)
    assert changed.status_code == 200 and changed.json()["sites"]["SITE_A"]["complete"] == 1


def test_a_schedd_that_stops_answering_keeps_its_jobs_in_the_demand(
    metrics: Metrics,
    served: tuple[str, Any, ScriptedQueue],
) -> None:
    base, service, adapter = served
    adapter.reads = [[queue(("1.0", XY))], [ScheddFailure("s1", "connection refused")]]
    service.run_cycle()
    report = service.run_cycle()
    assert report.outcome == "ok"  # the ads' cycle is not failed by a schedd
    assert cycle_json(report)["jobs"]["failed_schedds"] == 1
    doc = requests.get(f"{base}/v1/demand", timeout=5).json()
    assert (doc["jobs"], doc["stale_schedds"]) == (1, ["s1"])
    failures = metrics.registry.get_sample_value
    assert failures("hydrator_job_schedd_failures_total", {"reason": "unavailable"}) == 1


def test_an_annotator_bug_never_fails_the_cycle(served: tuple[str, Any, ScriptedQueue]) -> None:
    _, service, adapter = served
    adapter.reads = [[queue(("1.0", XY))]]
    adapter.refuse = set()
    adapter.broken = KeyError("a bug")
    report = service.run_cycle()
    assert report.outcome == "ok" and report.jobs is not None and report.jobs.error


@pytest.mark.parametrize(
    ("jobs", "key"),
    [
        ({"max_edits_per_cycle": 0}, "jobs.max_edits_per_cycle"),
        ({"sites_attribute": "Data Sites"}, "jobs"),
        ({"sites_attribute": "DataLocalityPartialSites"}, "jobs"),
        ({"desired_sites_attribute": "RequiredDatasets"}, "jobs"),
        ({"schedds": ['bad"name']}, "jobs.schedds"),
        ({"annotate": "sometimes"}, "jobs.annotate"),
    ],
)
def test_bad_jobs_settings_name_the_key(jobs: dict[str, Any], key: str, tmp_path: Path) -> None:
    raw = {"sources": [{"type": "static", "path": "inv.toml"}], "jobs": jobs}
    with pytest.raises(ConfigError) as caught:
        parse_config(raw, tmp_path)
    assert caught.value.key == key


def test_a_constraint_that_is_not_a_classad_expression_is_a_config_error(tmp_path: Path) -> None:
    from hydrator.adapters.htcondor import schedd_jobs

    config = parse_config(
        {"sources": [{"type": "static", "path": "i"}], "jobs": {"constraint": "JobStatus =="}},
        tmp_path,
    )
    with pytest.raises(ConfigError) as caught:
        schedd_jobs.build(config.jobs, config.collector)
    assert caught.value.key == "jobs.constraint"
