"""Answers reused across fetches on a real Rucio server: deep checks while what they read
stands, site attributes while they are young.

A deep check (``list_dataset_replicas(deep=True)``) is reused when the dataset's summary rows
and rules, and the RSE -> site map, are unchanged and it is younger than
``deep_check_max_age_s``. These tests change what the server sends (a summary row as abacus
would rewrite it, a lock count moving as a file arrives) and check that exactly the changed
dataset is listed again, and that the age bound re-lists all of them. An RSE's site
attribute is read again once older than ``rse_attributes_max_age_s``.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from hydrator.adapters.sources.rucio import RucioSource
from hydrator.core.ports import FetchContext
from hydrator.domain import ReplicaState, Transfer
from tests.support.rucio_server import RucioAdmin, RucioServer, source_config, unique

pytestmark = pytest.mark.rucio


def checks(source: RucioSource) -> tuple[int, int]:
    """(deep checks made, deep checks reused) in the last fetch."""
    made, reused = source.deep_checks_last_fetch, source.deep_checks_reused_last_fetch
    assert source.reused_last_fetch == reused  # what hydrator_source_reused_checks shows
    assert source.calls_last_fetch.get("list_dataset_replicas", 0) == made
    return made, reused


def one_rse(admin: RucioAdmin, prefix: str, datasets: int) -> tuple[str, str, list[str]]:
    """A federation of its own: one RSE at one site holding ``datasets`` datasets, each with
    a rule there (summary rows say 0/0 until abacus runs: a deep check each); returns
    (tag, RSE, dataset names)."""
    tag = unique(prefix).lower()
    rse = admin.rse(f"SITE-A-{tag}", attributes={"fed": tag})
    return tag, rse, admin.many_datasets(admin.scope(), datasets, rse)


def test_a_deep_check_is_reused_until_a_row_changes_or_it_is_too_old(
    rucio_admin: RucioAdmin, rucio_server: RucioServer
) -> None:
    tag, _, names = one_rse(rucio_admin, "r", 3)
    site = f"SITE-A-{tag}"
    config = source_config(rucio_server, rse_expression=f"fed={tag}", deep_check_max_age_s=600)
    source = RucioSource(config, {})
    t0 = datetime.now(UTC)
    try:
        first = source.fetch(FetchContext(now=t0))
        assert checks(source) == (3, 0)
        again = source.fetch(FetchContext(now=t0 + timedelta(seconds=60)))
        assert checks(source) == (0, 3)
        assert again.replicas is first.replicas and len(first.replicas) == 3

        # one row rewritten (as abacus would, half way): that dataset alone is listed again
        sql = "UPDATE collection_replicas SET length = 2, available_replicas_cnt = 1 WHERE name = ?"
        assert rucio_server.execute_sql(sql, (names[0],)) == 1
        changed = source.fetch(FetchContext(now=t0 + timedelta(seconds=120)))
        assert checks(source) == (1, 2)
        assert changed.replicas == first.replicas  # the files say complete: still available

        # past deep_check_max_age_s every check is made again, whatever changed
        source.fetch(FetchContext(now=t0 + timedelta(seconds=720)))
        assert checks(source) == (3, 0)
    finally:
        source.close()
    assert {r.state for r in changed.replicas} == {ReplicaState.AVAILABLE}
    assert {(r.site, r.dataset.name) for r in changed.replicas} == {(site, n) for n in names}


def test_a_moving_lock_count_lists_its_dataset_again(
    rucio_admin: RucioAdmin, rucio_server: RucioServer
) -> None:
    """The dataset is complete at a source RSE (row 0/0: a deep check for that site) and
    replicating to X; a file arriving at X moves the rule's OK locks, and the dataset is
    listed again at once, though its source site's answer reads the same."""
    tag = unique("l").lower()
    src = rucio_admin.rse(f"SITE-S-{tag}", attributes={"fed": tag})
    x1 = rucio_admin.rse(f"SITE-X-{tag}", attributes={"fed": tag})
    scope = rucio_admin.scope()
    name = rucio_admin.dataset(scope, 2, at=[src])
    rucio_admin.rule(scope, name, src)
    rucio_admin.rule(scope, name, x1)  # its files COPYING at x1: REPLICATING
    source = RucioSource(source_config(rucio_server, rse_expression=f"fed={tag}"), {})
    t0 = datetime.now(UTC)
    try:
        source.fetch(FetchContext(now=t0))
        assert checks(source) == (1, 0)
        source.fetch(FetchContext(now=t0 + timedelta(seconds=30)))
        assert checks(source) == (0, 1)
        rucio_admin.set_file_states(x1, scope, rucio_admin.files(scope, name)[:1], "A")
        snapshot = source.fetch(FetchContext(now=t0 + timedelta(seconds=60)))
        assert checks(source) == (1, 0)
    finally:
        source.close()
    found = {(str(r.site), r.dataset.name): r for r in snapshot.replicas}
    assert found[(f"SITE-S-{tag}", name)].state is ReplicaState.AVAILABLE
    at_x = found[(f"SITE-X-{tag}", name)]
    assert (at_x.state, at_x.fraction, at_x.transfer) == (
        ReplicaState.PARTIAL,
        0.5,
        Transfer.REPLICATING,
    )


def test_with_a_max_age_of_zero_every_fetch_lists_again(
    rucio_admin: RucioAdmin, rucio_server: RucioServer
) -> None:
    tag, _, _ = one_rse(rucio_admin, "z", 2)
    config = source_config(rucio_server, rse_expression=f"fed={tag}", deep_check_max_age_s=0)
    source = RucioSource(config, {})
    try:
        for _ in range(2):
            source.fetch(FetchContext(now=datetime.now(UTC)))
            assert checks(source) == (2, 0)
    finally:
        source.close()


def test_a_changed_site_attribute_is_seen_once_the_last_read_is_too_old(
    rucio_admin: RucioAdmin, rucio_server: RucioServer
) -> None:
    tag, rse, _ = one_rse(rucio_admin, "a", 1)
    rucio_server.run_abacus()
    config = source_config(rucio_server, rse_expression=f"fed={tag}", rse_attributes_max_age_s=600)
    source = RucioSource(config, {})
    t0 = datetime.now(UTC)
    try:
        first = source.fetch(FetchContext(now=t0))
        assert source.calls_last_fetch["list_rse_attributes"] == 1
        rucio_admin.client.delete_rse_attribute(rse, "site")
        rucio_admin.client.add_rse_attribute(rse, "site", f"SITE-B-{tag}")
        young = source.fetch(FetchContext(now=t0 + timedelta(seconds=599)))
        assert "list_rse_attributes" not in source.calls_last_fetch
        old = source.fetch(FetchContext(now=t0 + timedelta(seconds=600)))
        assert source.calls_last_fetch["list_rse_attributes"] == 1
    finally:
        source.close()
    assert {r.site for r in first.replicas} == {r.site for r in young.replicas} == {f"SITE-A-{tag}"}
    assert {r.site for r in old.replicas} == {f"SITE-B-{tag}"}
