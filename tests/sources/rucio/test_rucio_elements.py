"""The per-storage-element site guard on the real Rucio server: the source reports each RSE's
count of listed datasets (``Snapshot.elements``), so an RSE whose datasets vanish from its
summary holds its site back even when the site as a whole shrinks less than the site guard's
share."""

from __future__ import annotations

from pathlib import Path

import pytest

from hydrator.config import parse_config
from hydrator.domain import ElementCount, Site
from hydrator.runtime.wiring import build_service
from tests.support.rucio_server import RucioAdmin, RucioServer, source_config, unique

pytestmark = pytest.mark.rucio


def test_an_rse_whose_datasets_vanish_holds_its_site_though_the_site_shrinks_less(
    rucio_admin: RucioAdmin, rucio_server: RucioServer, tmp_path: Path
) -> None:
    tag = unique("e").lower()
    site = Site(f"SITE-E-{tag}")
    x = rucio_admin.rse(site, attributes={"fed": tag})
    y = rucio_admin.rse(site, attributes={"fed": tag})
    scope = rucio_admin.scope()
    on_x = rucio_admin.many_datasets(scope, 6, x)
    on_y = rucio_admin.many_datasets(scope, 14, y)
    rucio_server.run_abacus()
    config = parse_config(
        {
            "daemon": {"state_path": str(tmp_path / "state.sqlite")},
            "sources": [
                source_config(rucio_server, rse_expression=f"fed={tag}").model_dump(
                    mode="json", exclude_none=True
                )
            ],
            # the site loses 6 of 20 (30 %), under the site guard's 50 %; RSE x all of its 6
            "safety": {"site_drop_min_entries": 5, "site_max_drop_fraction": 0.5},
        },
        tmp_path,
    )
    service = build_service(config)
    try:
        first = service.run_cycle()
        assert first.outcome == "ok" and first.plan is not None
        everything = sorted(f"{scope}:{n}" for n in on_x + on_y)
        assert sorted(map(str, first.plan.sites[site].available)) == everything

        # x's summary rows vanish (a catalogue glitch: the datasets and rules are still there)
        sql = "DELETE FROM collection_replicas WHERE rse_id = (SELECT id FROM rses WHERE rse = ?)"
        assert rucio_server.execute_sql(sql, (x,)) == 6
        second = service.run_cycle()
        assert second.plan is not None
        assert sorted(map(str, second.plan.sites[site].available)) == everything, "held back"
        (status,) = second.plan.sources
        assert f"storage element {x}: 0 entries against 6" in status.held_sites[site]
        state = second.plan.state.sources["rucio"]
        assert state.elements[x] == ElementCount(site, 6), "the held site keeps x's count"
        assert state.elements[y] == ElementCount(site, 14)
    finally:
        service.close()
