"""End to end: ``hydrator run`` as a real process reloads its configuration
on SIGHUP: a valid change takes effect, an invalid one is refused with one line naming the
problem while the daemon keeps serving; it stops cleanly afterwards."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.support.daemon import Daemon
from tests.support.fake_dmapi import FakeSrcnet
from tests.support.wait import wait_for

pytestmark = pytest.mark.slow

ONE_SOURCE = """
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
SECOND_SOURCE = """
[[sources]]
type = "static"
name = "second"
path = "second.toml"
settle_s = 0
"""


class Running:
    """The daemon and the reload steps of these tests."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon, self.base = daemon, daemon.url

    @property
    def proc(self) -> subprocess.Popen[bytes]:
        assert self.daemon.proc is not None
        return self.daemon.proc

    def log(self) -> str:
        return self.daemon.output()

    def status(self, site: str) -> int:
        return requests.get(f"{self.base}/v1/sites/{site}/classad", timeout=5).status_code

    def hup(self, config: str) -> int:
        """Write ``config``, send SIGHUP; the log's length before (to read what follows)."""
        (self.daemon.directory / "hydrator.toml").write_text(config)
        mark = len(self.log())
        self.proc.send_signal(signal.SIGHUP)
        return mark


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Running]:
    (tmp_path / "first.toml").write_text('[storage.A]\nsite = "SITE_A"\navailable = ["ska:a"]\n')
    (tmp_path / "second.toml").write_text('[storage.B]\nsite = "SITE_B"\navailable = ["ska:b"]\n')
    with Daemon(tmp_path) as process:
        (tmp_path / "hydrator.toml").write_text(ONE_SOURCE.format(port=process.port))
        process.start(tmp_path / "hydrator.toml", ready_timeout_s=20.0)
        running = Running(process)
        wait_for(
            "SITE_A served",
            lambda: running.status("SITE_A") == 200,
            timeout_s=20.0,
            ignore=(requests.RequestException,),
        )
        yield running


def test_sighup_applies_a_valid_config_and_refuses_an_invalid_one(daemon: Running) -> None:
    config = ONE_SOURCE.format(port=daemon.base.rsplit(":", 1)[1])
    assert daemon.status("SITE_B") == 404

    mark = daemon.hup(config.replace("interval_s = 1", "interval_s = 0"))
    wait_for(
        "reload refused",
        lambda: "reload refused" in daemon.log()[mark:],
        timeout_s=20.0,
        ignore=(requests.RequestException,),
    )
    time.sleep(2.5)  # two cycles of the running configuration
    refused = [line for line in daemon.log()[mark:].splitlines() if "reload" in line]
    assert len(refused) == 2, refused  # "received SIGHUP", then the one refusal
    assert (
        "ERROR" in refused[1]
        and "daemon.interval_s: Input should be greater than 0" in (refused[1])
    )
    assert daemon.proc.poll() is None and daemon.status("SITE_A") == 200

    # valid TOML and keys, but no service can be built from it: refused after the build
    mark = daemon.hup(config + SECOND_SOURCE + '[classad]\nadvertise = "demand"\n')
    wait_for(
        "reload refused",
        lambda: "reload refused" in daemon.log()[mark:],
        timeout_s=20.0,
        ignore=(requests.RequestException,),
    )
    assert "classad.advertise" in daemon.log()[mark:]
    wait_for(
        "SITE_A served",
        lambda: daemon.status("SITE_A") == 200,
        timeout_s=20.0,
        ignore=(requests.RequestException,),
    )
    assert daemon.status("SITE_B") == 404 and daemon.proc.poll() is None

    mark = daemon.hup(config + SECOND_SOURCE)
    wait_for(
        "SITE_B served",
        lambda: daemon.status("SITE_B") == 200,
        timeout_s=20.0,
        ignore=(requests.RequestException,),
    )
    assert "reloaded: 2 source(s)" in daemon.log()[mark:]
    assert '"ska:b"' in requests.get(f"{daemon.base}/v1/sites/SITE_B/classad", timeout=5).text
    assert daemon.status("SITE_A") == 200

    daemon.proc.send_signal(signal.SIGTERM)
    assert daemon.proc.wait(timeout=20) == 0
    assert "Traceback" not in daemon.log()


def series_of(daemon: Daemon, source: str) -> list[str]:
    """Every exported sample labelled ``source="<source>"``."""
    return sorted(name for name, labels in daemon.metrics() if ("source", source) in labels)


def ok_cycles(daemon: Running) -> float:
    return daemon.daemon.metric("hydrator_cycles_total", outcome="ok") or 0.0


def reload_to_one_source(daemon: Running, config: str) -> float:
    """Reload to ``config`` (one source) and wait for two ok cycles of it; the ok cycles
    counted when the reload was logged."""
    mark = daemon.hup(config)
    wait_for(
        "reloaded with one source",
        lambda: "reloaded: 1 source(s)" in daemon.log()[mark:],
        timeout_s=20.0,
    )
    cycles = ok_cycles(daemon)
    wait_for(
        "two cycles of the reloaded configuration",
        lambda: ok_cycles(daemon) >= cycles + 2,
        timeout_s=20.0,
        ignore=(requests.RequestException,),
    )
    return cycles


def test_a_source_removed_by_reload_leaves_no_series_in_metrics(daemon: Running) -> None:
    """Reload leaves no ghosts: a stale source removed by SIGHUP takes every labelled series
    with it (``hydrator_source_stale`` would otherwise fire ``HydratorSourceStale`` until a
    restart), while the source that stays keeps its own."""
    config = ONE_SOURCE.format(port=daemon.base.rsplit(":", 1)[1])
    mark = daemon.hup(config + SECOND_SOURCE)
    wait_for(
        "reloaded with two sources",
        lambda: "reloaded: 2 source(s)" in daemon.log()[mark:],
        timeout_s=20.0,
    )
    (daemon.daemon.directory / "second.toml").write_text("not toml [")  # the source fails
    wait_for(
        "the second source stale",
        lambda: daemon.daemon.metric("hydrator_source_stale", source="second") == 1.0,
        timeout_s=20.0,
        ignore=(requests.RequestException,),
    )
    assert "hydrator_source_requests_total" in series_of(daemon.daemon, "second")

    reload_to_one_source(daemon, config)
    assert series_of(daemon.daemon, "second") == []
    assert daemon.daemon.metric("hydrator_source_stale", source="first") == 0.0
    daemon.proc.send_signal(signal.SIGTERM)
    assert daemon.proc.wait(timeout=20) == 0


DMAPI_SOURCE = """
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


def connections_to(port: int) -> int:
    """Established TCP connections (IPv4, this network namespace) whose far end is ``port``:
    the clients of the fake SRCNet, which only the daemon talks to."""
    count = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[3] == "01" and int(fields[2].rsplit(":", 1)[1], 16) == port:  # ESTABLISHED
            count += 1
    return count


@pytest.fixture
def fake() -> Iterator[FakeSrcnet]:
    server = FakeSrcnet()
    with server.running():
        yield server


def test_a_dmapi_source_removed_by_reload_closes_its_connections_and_series(
    daemon: Running, fake: FakeSrcnet
) -> None:
    """A source that holds connections (DMAPI, against the fake SRCNet), added then removed by
    SIGHUP: its connections close, its series leave /metrics, it sends nothing more."""
    directory = daemon.daemon.directory
    (directory / "client-id").write_text(fake.client_id)
    (directory / "client-secret").write_text(fake.client_secret)
    fake.add_dataset("ska", "obs_1", ("CH_DISK", None))
    fake_port = int(fake.root_url.rsplit(":", 1)[1])
    config = ONE_SOURCE.format(port=daemon.base.rsplit(":", 1)[1])
    daemon.hup(config + DMAPI_SOURCE.format(base_url=fake.base_url, token_url=fake.token_url))
    wait_for(
        "the DMAPI source's answer in use",
        lambda: daemon.daemon.metric("hydrator_source_stale", source="dmapi") == 0.0,
        timeout_s=20.0,
        ignore=(requests.RequestException,),
    )
    assert connections_to(fake_port) >= 1, "keep-alive connections to the DMAPI"

    cycles = reload_to_one_source(daemon, config)
    assert connections_to(fake_port) == 0
    assert series_of(daemon.daemon, "dmapi") == []
    located = fake.counts["locate"]
    wait_for(
        "one more cycle",
        lambda: ok_cycles(daemon) >= cycles + 3,
        timeout_s=20.0,
        ignore=(requests.RequestException,),
    )
    assert fake.counts["locate"] == located, "nothing of the removed source still runs"
    daemon.proc.send_signal(signal.SIGTERM)
    assert daemon.proc.wait(timeout=20) == 0
