"""Job annotation fed by the real Rucio source: a dataset replicated to a new site and removed
from its old one moves the idle jobs' DataLocalitySites with it (no restart, no resubmit)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.pool.annotating import Annotating, annotated, jobs_of, submit_idle
from tests.support.pool import EDITOR_IDENTITY, IDLE, Pool
from tests.support.rucio_server import RucioAdmin, RucioServer, unique

pytestmark = [pytest.mark.pool, pytest.mark.rucio]


def rucio_source(server: RucioServer, expression: str) -> str:
    return (
        '[[sources]]\ntype = "rucio"\nname = "rucio"\n'
        f'rucio_host = "{server.url}"\nauth_host = "{server.url}"\naccount = "root"\n'
        f'auth_type = "userpass"\nusername = "{server.username}"\n'
        f'password_file = "{server.password_file}"\nrse_expression = "{expression}"\n'
    )


def test_jobs_follow_a_dataset_moved_between_sites_in_rucio(
    condor_pool: Pool,
    rucio_server: RucioServer,
    rucio_admin: RucioAdmin,
    tmp_path: Path,
) -> None:
    admin, pool = rucio_admin, condor_pool
    tag = unique("j").lower()
    rse_a = admin.rse("SITE_A", attributes={"fed": tag})
    rse_b = admin.rse("SITE_B", attributes={"fed": tag})
    scope = admin.scope()
    name = admin.dataset(scope, 2, at=[rse_a])
    rule_a = admin.rule(scope, name, rse_a)
    rucio_server.run_abacus()
    pool.remove_all_jobs()
    cluster = submit_idle(pool, f'{{"{scope}:{name}"}}', count=2)
    pool.wait_for_job_state(cluster, [IDLE])
    token = pool.token_dir_for(EDITOR_IDENTITY, tmp_path / "editor")
    hydrator = Annotating(tmp_path, pool, token, rucio_source(rucio_server, f"fed={tag}"))
    try:
        first = hydrator.once()
        assert first["jobs"]["edits"] == 1, first
        assert [annotated(ad) for ad in jobs_of(pool, [cluster])] == [(["SITE_A"], [])] * 2

        # replicated to SITE_B: one file arrived so far, then both; then gone from SITE_A
        admin.rule(scope, name, rse_b)
        files = admin.files(scope, name)
        admin.set_file_states(rse_b, scope, files[:1], "A")
        rucio_server.run_abacus()
        hydrator.once()
        assert annotated(jobs_of(pool, [cluster])[0]) == (["SITE_A"], ["SITE_B"])
        admin.set_file_states(rse_b, scope, files[1:], "A")
        admin.remove_rule_now(rule_a, rse_a)
        moved = hydrator.once()
        assert moved["jobs"]["edits"] == 1
        assert [annotated(ad) for ad in jobs_of(pool, [cluster])] == [(["SITE_B"], [])] * 2
    finally:
        pool.remove_all_jobs()
