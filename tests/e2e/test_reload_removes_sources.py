"""Reload leaves no ghosts, with a source that holds connections: ``hydrator run`` as a process
with a static source and a DMAPI source (against the fake SRCNet); a SIGHUP whose
configuration drops the DMAPI source closes its connections and takes its series out of
``/metrics``."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.support.daemon import Daemon
from tests.support.fake_dmapi import FakeSrcnet
from tests.support.wait import wait_for

pytestmark = pytest.mark.slow

STATIC = """
[daemon]
interval_s = 1
jitter_s = 0
state_path = "state.sqlite"

[http]
listen = "127.0.0.1:{port}"

[[sources]]
type = "static"
name = "first"
path = "first.toml"
settle_s = 0
"""
DMAPI = """
[[sources]]
type = "dmapi"
name = "dmapi"
base_url = "{base_url}"
token_url = "{token_url}"
client_id_file = "client-id"
client_secret_file = "client-secret"
datasets = ["ska:obs_1"]

[sites]
CH_DISK = "SITE_C"
"""
ESTABLISHED = "01"


def connections_to(port: int) -> int:
    """Established TCP connections (IPv4, this network namespace) whose far end is ``port``:
    the clients of the fake SRCNet, which only the daemon talks to."""
    count = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[3] == ESTABLISHED and int(fields[2].rsplit(":", 1)[1], 16) == port:
            count += 1
    return count


@pytest.fixture
def fake() -> Iterator[FakeSrcnet]:
    server = FakeSrcnet()
    with server.running():
        yield server


def test_a_dmapi_source_removed_by_reload_closes_its_connections_and_series(
    tmp_path: Path, fake: FakeSrcnet
) -> None:
    (tmp_path / "first.toml").write_text('[storage.A]\nsite = "SITE_A"\navailable = ["ska:a"]\n')
    (tmp_path / "client-id").write_text(fake.client_id)
    (tmp_path / "client-secret").write_text(fake.client_secret)
    fake.add_dataset("ska", "obs_1", ("CH_DISK", None))
    fake_port = int(fake.root_url.rsplit(":", 1)[1])
    with Daemon(tmp_path) as daemon:
        static = STATIC.format(port=daemon.port)
        config = tmp_path / "hydrator.toml"
        config.write_text(static + DMAPI.format(base_url=fake.base_url, token_url=fake.token_url))
        daemon.start(config, ready_timeout_s=30.0)
        wait_for(
            "the DMAPI source's answer in use",
            lambda: daemon.metric("hydrator_source_stale", source="dmapi") == 0.0,
            timeout_s=20.0,
            ignore=(requests.RequestException,),
        )
        assert connections_to(fake_port) >= 1, "keep-alive connections to the DMAPI"

        config.write_text(static)
        mark = len(daemon.output())
        assert daemon.proc is not None
        daemon.proc.send_signal(signal.SIGHUP)
        wait_for(
            "reloaded with one source",
            lambda: "reloaded: 1 source(s)" in daemon.output()[mark:],
            timeout_s=20.0,
        )
        cycles = daemon.metric("hydrator_cycles_total", outcome="ok") or 0.0
        wait_for(
            "two cycles of the reloaded configuration",
            lambda: (daemon.metric("hydrator_cycles_total", outcome="ok") or 0.0) >= cycles + 2,
            timeout_s=20.0,
            ignore=(requests.RequestException,),
        )
        assert connections_to(fake_port) == 0
        assert not [name for name, labels in daemon.metrics() if ("source", "dmapi") in labels]
        located = fake.counts["locate"]
        wait_for(
            "one more cycle",
            lambda: (daemon.metric("hydrator_cycles_total", outcome="ok") or 0.0) >= cycles + 3,
            timeout_s=20.0,
            ignore=(requests.RequestException,),
        )
        assert fake.counts["locate"] == located, "nothing of the removed source still runs"
        daemon.proc.send_signal(signal.SIGTERM)
        assert daemon.proc.wait(timeout=20) == 0
