"""Near sites from the real Rucio server's distances: one request per refresh whatever the
number of RSEs, the nearest pair of RSEs making two sites' distance, and a server that
refuses the read (an account without the export permission) keeping the last good lists."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from hydrator.adapters.sources.rucio.distances import RucioDistances
from hydrator.config import DistancesConfig
from hydrator.domain import Site
from hydrator.runtime.metrics import Metrics
from hydrator.runtime.near_sites import NearSites
from tests.support.rucio_server import RucioAdmin, RucioServer, source_config, unique

pytestmark = pytest.mark.rucio


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def plain_user(admin: RucioAdmin, tmp_path: Path) -> tuple[str, Path]:
    """A USER account (no export permission) with a userpass identity; its password file."""
    account = unique("reader").lower()[:25]
    password = unique("pw")
    admin.client.add_account(account, "USER", "reader@example.org")
    admin.client.add_identity(
        account, account, "USERPASS", "reader@example.org", default=True, password=password
    )
    path = tmp_path / "reader-password"
    path.write_text(password + "\n")
    path.chmod(0o600)
    return account, path


def test_distances_make_near_sites_in_one_request_and_a_refusal_keeps_them(
    running_rucio: RucioServer, rucio_admin: RucioAdmin, tmp_path: Path
) -> None:
    tag = unique("near").upper()
    a, b, c = (Site(f"S{x}_{tag}") for x in "ABC")
    a1, a2 = rucio_admin.rse(a), rucio_admin.rse(a)
    b1, c1 = rucio_admin.rse(b), rucio_admin.rse(c)
    client = rucio_admin.client
    client.add_distance(a1, b1, {"distance": 7}, bidirectional=True)
    client.add_distance(a2, b1, {"distance": 2}, bidirectional=True)  # the nearest pair
    client.add_distance(a1, c1, {"distance": 5}, bidirectional=True)
    client.add_distance(b1, c1, {"distance": 1})
    client.add_distance(c1, b1, {"distance": 4})  # asymmetric: neither value is trusted

    config = DistancesConfig(enabled=True, source="rucio", max_distance=2, refresh_s=60)
    metrics, clock = Metrics(CollectorRegistry()), Clock()
    reader = RucioDistances(source_config(running_rucio), {}, config.max_answer_bytes)
    near = NearSites(config, metrics, reader, clock)

    def sample(name: str, **labels: str) -> float:
        return metrics.registry.get_sample_value(name, labels) or 0.0

    try:
        lists = near.current([a, b, c])
        assert (lists[a], lists[b], lists[c]) == ((b,), (a,), ())
        # one API request for every RSE's distances (besides the client's login)
        assert {k: v for k, v in reader.wire.calls.items() if k not in ("connect", "auth")} == {
            "export_data": 1
        }
        asymmetric = sample("hydrator_near_problems_total", kind="asymmetric")
        assert asymmetric >= 1
        near.current([a, b, c])  # within refresh_s: no read
        assert sample("hydrator_near_reads_total", outcome="ok") == 1

        account, password = plain_user(rucio_admin, tmp_path)
        refused = RucioDistances(
            source_config(running_rucio, account=account, username=account, password_file=password),
            {},
            config.max_answer_bytes,
        )
        near.reader = refused
        client.update_distance(a2, b1, {"distance": 9}, bidirectional=True)
        clock.now = 60.0
        lists = near.current([a, b, c])
        assert (lists[a], lists[b], lists[c]) == ((b,), (a,), ())  # the last good lists
        assert sample("hydrator_near_reads_total", outcome="failed") == 1
        assert sample("hydrator_near_problems_total", kind="refused") == 1
        assert sample("hydrator_near_problems_total", kind="asymmetric") == asymmetric  # not again

        refused.close()  # its private token directory goes with it
        near.reader = reader
        clock.now = 120.0
        lists = near.current([a, b, c])
        assert (lists[a], lists[b]) == ((), ())  # a2 -> b1 is 9 now: nothing within 2
    finally:
        near.close()
