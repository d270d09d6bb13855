"""RSE availability on the real Rucio server: an RSE whose availability_read
is false contributes nothing to its site within one cycle, explicitly (the shrink guard does
not hold it back), a dataset also complete at another RSE of the site stays, and restoring it
brings everything back within one cycle with no churn beyond the site."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from hydrator.adapters.sources.rucio import RucioSource
from hydrator.config import parse_config
from hydrator.core.ports import FetchContext
from hydrator.core.storage import Drain
from hydrator.domain import DatasetId, Site
from hydrator.runtime.cli import main as cli_main
from hydrator.runtime.json_views import site_json
from hydrator.runtime.metrics import Metrics
from hydrator.runtime.service import Service
from hydrator.runtime.wiring import build_service
from tests.support.rucio_server import RucioAdmin, RucioServer, source_config, unique

pytestmark = pytest.mark.rucio


def site_doc(service: Service, site: str) -> dict[str, Any]:
    """``/v1/sites/<site>`` as the daemon serves it."""
    return site_json(service.published.ads[Site(site)].view)


def test_an_rse_read_disabled_leaves_its_site_at_once_and_comes_back(
    metrics: Metrics,
    running_rucio: RucioServer,
    rucio_admin: RucioAdmin,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    tag = unique("av").lower()
    site_a, site_b = f"SITE-A-{tag}", f"SITE-B-{tag}"
    fed = {"fed": tag}
    a1, a2 = rucio_admin.rse(site_a, attributes=fed), rucio_admin.rse(site_a, attributes=fed)
    b1 = rucio_admin.rse(site_b, attributes=fed)
    scope = rucio_admin.scope()
    only_a1 = [rucio_admin.dataset(scope, 2, at=[a1]) for _ in range(12)]
    both = rucio_admin.dataset(scope, 2, at=[a1, a2])
    at_b1 = rucio_admin.dataset(scope, 2, at=[b1])
    for name in only_a1:
        rucio_admin.rule(scope, name, a1)
    rucio_admin.rule(scope, both, a1)
    rucio_admin.rule(scope, both, a2)
    rucio_admin.rule(scope, at_b1, b1)
    running_rucio.run_abacus()
    config = parse_config(
        {
            "daemon": {"state_path": str(tmp_path / "state.sqlite")},
            # a drop of half the entries would be held back for 10 cycles if unexplained
            "safety": {"max_drop_fraction": 0.5, "drop_min_entries": 4},
            "sources": [
                source_config(running_rucio, rse_expression=f"rse_type=DISK&fed={tag}").model_dump(
                    mode="json", exclude_none=True
                )
            ],
        },
        tmp_path,
    )
    # `hydrator show` reads the state file alone (its sources are not asked)
    shown = tmp_path / "show.toml"
    shown.write_text(
        '[daemon]\nstate_path = "state.sqlite"\n[[sources]]\ntype = "static"\npath = "-"\n'
    )
    service = build_service(config, metrics)
    try:
        first = service.run_cycle()
        assert first.outcome == "ok", first
        held = {f"{scope}:{n}" for n in [*only_a1, both]}
        assert set(site_doc(service, site_a)["available"]) == held
        assert all(s["available"] for s in site_doc(service, site_a)["storages"])

        rucio_admin.client.update_rse(a1, {"availability_read": False})
        down = service.run_cycle()
        assert down.outcome == "ok" and down.plan is not None
        assert down.plan.sources[0].outcome == "ok", "an explained drop is not held back"
        doc = site_doc(service, site_a)
        assert doc["available"] == [f"{scope}:{both}"], "also complete at a2: stays"
        assert doc["unavailable"] == [f"RSE {a1}: availability_read false"]
        storages = {s["storage"]: s for s in doc["storages"]}
        assert storages[a1]["available"] is False and storages[a2]["available"] is True
        assert site_doc(service, site_b)["available"] == [f"{scope}:{at_b1}"]
        assert {c.site for c in down.plan.changes} == {site_a}, "no churn beyond the site"
        ad = service.published.ads[Site(site_a)].body.decode()
        assert f'DataLocalityUnavailable = "RSE {a1}: availability_read false"' in ad
        assert cli_main(["show", site_a, "--config", str(shown)]) == 0
        text = capsys.readouterr().out
        assert f'DataLocalityUnavailable = "RSE {a1}: availability_read false"' in text
        assert f"# RSE {a1}: unavailable (availability_read false)" in text
        assert f"# RSE {a2}" not in text, "storage that serves is not listed"
        assert only_a1[0] not in text and both in text
        m = metrics.registry.get_sample_value
        assert m("hydrator_storage_available", {"site": site_a, "storage": a1}) == 0
        assert m("hydrator_storage_available", {"site": site_a, "storage": a2}) == 1

        rucio_admin.client.update_rse(a1, {"availability_read": True})
        back = service.run_cycle()
        assert back.outcome == "ok"
        assert set(site_doc(service, site_a)["available"]) == held
        assert site_doc(service, site_a)["unavailable"] == []
        assert back.plan is not None and {c.site for c in back.plan.changes} == {site_a}
    finally:
        service.close()
        rucio_admin.client.update_rse(a1, {"availability_read": True})


def test_a_drained_rse_and_one_gone_from_the_expression_leave_explicitly(
    running_rucio: RucioServer, rucio_admin: RucioAdmin
) -> None:
    """``hydrator drain SITE --storage RSE`` reaches the source as a drain; an RSE that leaves
    the expression (here: its ``fed`` attribute removed) is stated gone for one fetch."""
    tag = unique("dr").lower()
    site = Site(f"SITE-{tag}")
    fed = {"fed": tag}
    r1, r2 = rucio_admin.rse(site, attributes=fed), rucio_admin.rse(site, attributes=fed)
    scope = rucio_admin.scope()
    on_r1, on_r2 = rucio_admin.dataset(scope, 1, at=[r1]), rucio_admin.dataset(scope, 1, at=[r2])
    rucio_admin.rule(scope, on_r1, r1)
    rucio_admin.rule(scope, on_r2, r2)
    running_rucio.run_abacus()
    config = source_config(running_rucio, rse_expression=f"rse_type=DISK&fed={tag}")
    source = RucioSource(config, {})
    try:
        now = datetime.now(UTC)
        first = source.fetch(FetchContext(now=now))
        assert {r.dataset.name for r in first.replicas} == {on_r1, on_r2}
        drain = Drain(site, r1, "checksum errors", now)
        drained = source.fetch(FetchContext(now=now, drains=[drain]))
        assert {r.dataset.name for r in drained.replicas} == {on_r2}
        (status,) = [s for s in drained.storages if s.storage == r1]
        assert (status.available, status.reason) == (
            False,
            "drained by the operator: checksum errors",
        )
        assert source.fetch(FetchContext(now=now)).replicas == first.replicas, "undrained"

        rucio_admin.client.delete_rse_attribute(r2, "fed")
        gone = source.fetch(FetchContext(now=now))
        assert {r.dataset.name for r in gone.replicas} == {on_r1}
        (status,) = [s for s in gone.storages if s.storage == r2]
        assert not status.available and status.reason is not None
        assert status.reason.startswith("no longer listed by rse_expression")
        assert site in gone.sites
        later = source.fetch(FetchContext(now=now))
        assert [s.storage for s in later.storages] == [r1], "stated gone for one fetch only"
    finally:
        source.close()


def test_an_rse_already_down_at_a_restart_counts_the_wanted_datasets_it_holds(
    running_rucio: RucioServer, rucio_admin: RucioAdmin
) -> None:
    """The alert on storage holding data idle jobs want (``HydratorStorageUnavailableWithDemand``,
    fed by ``wanted``) must not wait after a restart: a source started while an RSE is
    read-disabled reads what its summary table lists once (Rucio leaves it as it was)."""
    tag = unique("rs").lower()
    site = f"SITE-{tag}"
    a1, a2 = (rucio_admin.rse(site, attributes={"fed": tag}) for _ in range(2))
    scope = rucio_admin.scope()
    at_a1 = [rucio_admin.dataset(scope, 2, at=[a1]) for _ in range(3)]
    at_a2 = rucio_admin.dataset(scope, 2, at=[a2])
    for name in at_a1:
        rucio_admin.rule(scope, name, a1)
    rucio_admin.rule(scope, at_a2, a2)
    running_rucio.run_abacus()
    wanted = {DatasetId(scope, n): 2 for n in (*at_a1[:2], at_a2)}  # two of a1's, a2's one
    now = datetime.now(UTC)

    def statuses(source: RucioSource) -> dict[str, tuple[bool, int]]:
        snapshot = source.fetch(FetchContext(now=now, wanted=wanted))
        return {s.storage: (s.available, s.wanted) for s in snapshot.storages}

    config = source_config(running_rucio, rse_expression=f"rse_type=DISK&fed={tag}")
    before = RucioSource(config, {})
    try:
        assert statuses(before) == {a1: (True, 0), a2: (True, 0)}
        rucio_admin.client.update_rse(a1, {"availability_read": False})
        assert statuses(before) == {a1: (False, 2), a2: (True, 0)}
    finally:
        before.close()
    restarted = RucioSource(config, {})
    try:
        assert statuses(restarted) == {a1: (False, 2), a2: (True, 0)}, "counted at once"
        calls = restarted.calls_last_fetch["list_datasets_per_rse"]
        assert calls == 2, "a2's, and a1's once"
        assert statuses(restarted) == {a1: (False, 2), a2: (True, 0)}
        assert restarted.calls_last_fetch["list_datasets_per_rse"] == 1, "a1's kept"
    finally:
        restarted.close()
        rucio_admin.client.update_rse(a1, {"availability_read": True})
