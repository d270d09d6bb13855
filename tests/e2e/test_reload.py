"""End to end (issue 26 item 9): ``hydrator run`` as a real process reloads its configuration
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

    mark = daemon.hup(config)
    wait_for(
        "reloaded with one source",
        lambda: "reloaded: 1 source(s)" in daemon.log()[mark:],
        timeout_s=20.0,
    )
    cycles = daemon.daemon.metric("hydrator_cycles_total", outcome="ok") or 0.0
    wait_for(
        "two cycles of the reloaded configuration",
        lambda: (daemon.daemon.metric("hydrator_cycles_total", outcome="ok") or 0.0) >= cycles + 2,
        timeout_s=20.0,
        ignore=(requests.RequestException,),
    )
    assert series_of(daemon.daemon, "second") == []
    assert daemon.daemon.metric("hydrator_source_stale", source="first") == 0.0
    daemon.proc.send_signal(signal.SIGTERM)
    assert daemon.proc.wait(timeout=20) == 0
