"""Bad and temporarily unavailable replicas on the real Rucio server: a file
declared bad or set TEMPORARY_UNAVAILABLE makes its dataset partial at that RSE's site in the
next fetch, before any daemon rewrites the summary row (which says complete meanwhile); the
necromancer and abacus, run as production runs them, change nothing more than Rucio's own
view (no flapping); an expired TEMPORARY_UNAVAILABLE replica makes it complete again."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest

from hydrator.adapters.sources.rucio import RucioSource
from hydrator.core.ports import FetchContext
from hydrator.domain import ReplicaState, Snapshot
from tests.support.rucio_server import RucioAdmin, RucioServer, source_config, unique

pytestmark = pytest.mark.rucio

COMPLETE = (ReplicaState.AVAILABLE, 1.0)
TWO_OF_THREE: tuple[ReplicaState, object] = (ReplicaState.PARTIAL, pytest.approx(2 / 3))


def held(snapshot: Snapshot, site: str, name: str) -> tuple[ReplicaState, float] | None:
    """(state, files share) of dataset ``name`` at ``site``, None when not held there."""
    for replica in snapshot.replicas:
        if replica.site == site and replica.dataset.name == name:
            return replica.state, replica.fraction
    return None


def summary_row(admin: RucioAdmin, rse: str, scope: str, name: str) -> tuple[str, int, int]:
    """The dataset's summary row at ``rse`` (state, available_length, length)."""
    for row in admin.client.list_datasets_per_rse(rse):
        if (row["scope"], row["name"]) == (scope, name):
            return str(row["state"]), row["available_length"], row["length"]
    raise AssertionError(f"no summary row of {scope}:{name} at {rse}")


def test_a_file_declared_bad_makes_its_dataset_partial_at_once_and_stays_so(
    running_rucio: RucioServer, rucio_admin: RucioAdmin
) -> None:
    tag = unique("bad").lower()
    site_x, site_y = f"SITE-X-{tag}", f"SITE-Y-{tag}"
    fed = {"fed": tag}
    a, b = rucio_admin.rse(site_x, attributes=fed), rucio_admin.rse(site_y, attributes=fed)
    scope = rucio_admin.scope()
    copied = rucio_admin.dataset(scope, 3, at=[a, b])  # another copy at b: recovered
    single = rucio_admin.dataset(scope, 3, at=[a])  # no other copy: lost
    untouched = rucio_admin.dataset(scope, 3, at=[a])
    for name, rse in ((copied, a), (copied, b), (single, a), (untouched, a)):
        rucio_admin.rule(scope, name, rse)
    running_rucio.run_abacus()
    source = RucioSource(
        source_config(running_rucio, rse_expression=f"rse_type=DISK&fed={tag}"), {}
    )
    try:
        now = datetime.now(UTC)
        first = source.fetch(FetchContext(now=now))
        assert held(first, site_x, copied) == COMPLETE
        assert source.calls_last_fetch["list_bad_replicas_status"] == 2
        assert "list_parent_dids" not in source.calls_last_fetch

        rucio_admin.client.declare_bad_file_replicas(
            [
                {"scope": scope, "name": f"{copied}.f000", "rse": a},
                {"scope": scope, "name": f"{single}.f001", "rse": a},
            ],
            "checksum mismatch (hydrator test)",
        )
        assert summary_row(rucio_admin, a, scope, copied) == ("AVAILABLE", 3, 3), "row lags"
        bad = source.fetch(FetchContext(now=now))
        assert held(bad, site_x, copied) == TWO_OF_THREE
        assert held(bad, site_x, single) == TWO_OF_THREE
        assert held(bad, site_y, copied) == COMPLETE, "the other copy is untouched"
        assert held(bad, site_x, untouched) == COMPLETE
        assert source.calls_last_fetch["list_parent_dids"] == 2
        again = source.fetch(FetchContext(now=now))
        assert again.replicas == bad.replicas, "stays while listed"
        assert "list_parent_dids" not in source.calls_last_fetch, "parents kept"

        started = time.monotonic()
        running_rucio.run_daemon("rucio-necromancer")
        necromancer_s = time.monotonic() - started
        after_necromancer = source.fetch(FetchContext(now=now))
        assert held(after_necromancer, site_x, copied) == TWO_OF_THREE
        running_rucio.run_abacus()
        assert summary_row(rucio_admin, a, scope, copied) == ("UNAVAILABLE", 2, 3)
        after = source.fetch(FetchContext(now=now))
        # the replica is COPYING again (its rule replicating): still 2 of 3 files present
        assert held(after, site_x, copied) == TWO_OF_THREE
        # no other copy: the necromancer declared the file lost and detached it, so Rucio
        # now holds a dataset of two files, both present
        assert held(after, site_x, single) == COMPLETE
        files = [f["name"] for f in rucio_admin.client.list_files(scope, single)]
        assert files == [f"{single}.f000", f"{single}.f002"]
        assert held(after, site_y, copied) == COMPLETE
        print(f"necromancer --run-once took {necromancer_s:.1f} s")
    finally:
        source.close()


def pfn_of(admin: RucioAdmin, scope: str, name: str, rse: str) -> str:
    (record,) = admin.client.list_replicas([{"scope": scope, "name": name}], schemes=["file"])
    return str(record["rses"][rse][0])


def test_a_temporarily_unavailable_file_makes_its_dataset_partial_until_it_expires(
    running_rucio: RucioServer, rucio_admin: RucioAdmin
) -> None:
    tag = unique("tu").lower()
    site = f"SITE-{tag}"
    a = rucio_admin.rse(site, attributes={"fed": tag})
    scope = rucio_admin.scope()
    name = rucio_admin.dataset(scope, 3, at=[a])
    rucio_admin.rule(scope, name, a)
    running_rucio.run_abacus()
    source = RucioSource(
        source_config(running_rucio, rse_expression=f"rse_type=DISK&fed={tag}"), {}
    )
    try:
        now = datetime.now(UTC)
        assert held(source.fetch(FetchContext(now=now)), site, name) == COMPLETE
        expires = datetime.now(UTC).replace(tzinfo=None) + timedelta(seconds=40)
        rucio_admin.client.add_bad_pfns(
            [pfn_of(rucio_admin, scope, f"{name}.f002", a)],
            "storage maintenance (hydrator test)",
            state="TEMPORARY_UNAVAILABLE",
            expires_at=expires.strftime("%Y-%m-%dT%H:%M:%S.%f"),
        )
        assert held(source.fetch(FetchContext(now=now)), site, name) == COMPLETE, (
            "a bad PFN waits for rucio-minos"
        )
        started = time.monotonic()
        running_rucio.run_daemon("rucio-minos")
        minos_s = time.monotonic() - started
        unavailable = source.fetch(FetchContext(now=now))
        assert held(unavailable, site, name) == TWO_OF_THREE
        assert summary_row(rucio_admin, a, scope, name) == ("AVAILABLE", 3, 3), "row never moves"
        running_rucio.run_abacus()
        assert held(source.fetch(FetchContext(now=now)), site, name) == TWO_OF_THREE

        time.sleep(max(0.0, (expires - datetime.now(UTC).replace(tzinfo=None)).total_seconds()))
        running_rucio.run_daemon("rucio-minos-temporary-expiration")
        back = source.fetch(FetchContext(now=now))
        assert held(back, site, name) == COMPLETE
        print(f"rucio-minos --run-once took {minos_s:.1f} s")
    finally:
        source.close()
