"""Operator drain end to end: ``hydrator drain``/``undrain`` against a running
``hydrator run`` (the shipped demo configuration), effective within a cycle, kept across a
restart, visible in ``hydrator show``, ``/v1/sites``, the served ClassAd and the metrics."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.support.daemon import Daemon
from tests.support.prometheus import running_demo_daemon
from tests.support.wait import wait_for

pytestmark = pytest.mark.slow


def hydrator(daemon: Daemon, *args: str) -> subprocess.CompletedProcess[str]:
    config = daemon.directory / "demo.toml"
    return subprocess.run(
        [sys.executable, "-m", "hydrator", *args, "--config", str(config)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


def site(daemon: Daemon, name: str) -> dict[str, Any]:
    doc: dict[str, Any] = requests.get(f"http://{daemon.target}/v1/sites/{name}", timeout=5).json()
    return doc


def metric(daemon: Daemon, line: str) -> bool:
    return line in requests.get(f"http://{daemon.target}/metrics", timeout=5).text.splitlines()


def storage(doc: dict[str, Any], name: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = [s for s in doc["storages"] if s["storage"] == name]
    (one,) = found
    return one


def test_drain_and_undrain_a_storage_element_and_a_site_across_a_restart(tmp_path: Path) -> None:
    with running_demo_daemon(tmp_path) as daemon:
        uk = wait_for(
            "UK lists its data",
            lambda: site(daemon, "SRCNET_UK")["available"],
            timeout_s=20.0,
            ignore=(requests.RequestException,),
        )
        assert "lofar:L654321_SB001" in uk  # only on UK_SCRATCH
        assert "ska:obs_1234" in uk  # on UK_DISK

        done = hydrator(
            daemon, "drain", "SRCNET_UK", "--storage", "UK_SCRATCH", "--reason", "disk swap"
        )
        assert done.returncode == 0, done.stderr
        assert "drained storage element UK_SCRATCH of site SRCNET_UK" in done.stdout
        done = hydrator(daemon, "drain", "SRCNET_CH", "--until", "2h", "--reason", "cooling")
        assert done.returncode == 0, done.stderr

        doc = wait_for(
            "UK_SCRATCH's data leaves SRCNET_UK",
            lambda: site(daemon, "SRCNET_UK"),
            done=lambda doc: "lofar:L654321_SB001" not in doc["available"],
            timeout_s=10.0,
            ignore=(requests.RequestException,),
        )
        assert "ska:obs_1234" in doc["available"], "what UK_DISK holds stays"
        scratch = storage(doc, "UK_SCRATCH")
        assert (scratch["available"], scratch["reason"]) == (
            False,
            "drained by the operator: disk swap",
        )
        assert storage(doc, "UK_DISK")["available"] is True
        assert doc["unavailable"] == ["storage UK_SCRATCH: drained by the operator: disk swap"]
        ad = requests.get(f"http://{daemon.target}/v1/sites/SRCNET_UK/classad", timeout=5).text
        assert (
            'DataLocalityUnavailable = "storage UK_SCRATCH: drained by the operator: disk swap"'
            in ad
        )
        ch = wait_for(
            "SRCNET_CH lists nothing",
            lambda: site(daemon, "SRCNET_CH")["unavailable"],
            timeout_s=20.0,
            ignore=(requests.RequestException,),
        )
        assert ch[0].startswith("site SRCNET_CH: drained by the operator until ")
        assert site(daemon, "SRCNET_CH")["available"] == []
        es = site(daemon, "SRCNET_ES")
        assert es["available"] == ["ska:skymodel_v3"] and es["unavailable"] == []
        wait_for(
            "the drain metrics",
            lambda: (
                metric(daemon, 'hydrator_drains{site="SRCNET_UK",storage="UK_SCRATCH"} 1.0')
                and metric(daemon, 'hydrator_drains{site="SRCNET_CH",storage=""} 1.0')
                and metric(
                    daemon, 'hydrator_storage_available{site="SRCNET_UK",storage="UK_SCRATCH"} 0.0'
                )
            ),
            timeout_s=20.0,
            ignore=(requests.RequestException,),
        )
        shown = hydrator(daemon, "show", "SRCNET_UK")  # a reader beside the running daemon
        assert shown.returncode == 0, shown.stderr
        assert "# storage UK_SCRATCH: unavailable (drained by the operator: disk swap)" in (
            shown.stdout
        )
        assert "# drain: storage element UK_SCRATCH of site SRCNET_UK since " in shown.stdout

    with running_demo_daemon(tmp_path) as daemon:  # the same state file: a restart
        # served from the saved state before the first cycle, and after it
        doc = site(daemon, "SRCNET_UK")
        assert "lofar:L654321_SB001" not in doc["available"]
        assert site(daemon, "SRCNET_CH")["available"] == []
        undone = hydrator(daemon, "undrain", "SRCNET_UK", "--storage", "UK_SCRATCH")
        assert undone.returncode == 0, undone.stderr
        wait_for(
            "UK_SCRATCH's data back at SRCNET_UK",
            lambda: "lofar:L654321_SB001" in site(daemon, "SRCNET_UK")["available"],
            timeout_s=10.0,
            ignore=(requests.RequestException,),
        )
        assert site(daemon, "SRCNET_UK")["unavailable"] == []
        assert site(daemon, "SRCNET_CH")["available"] == [], "the other drain stays"
        assert hydrator(daemon, "undrain", "SRCNET_CH").returncode == 0
        wait_for(
            "SRCNET_CH back",
            lambda: site(daemon, "SRCNET_CH")["available"],
            timeout_s=10.0,
            ignore=(requests.RequestException,),
        )
        wait_for(
            "no drain metric left",
            lambda: (
                "hydrator_drains{"
                not in requests.get(f"http://{daemon.target}/metrics", timeout=5).text
            ),
            timeout_s=20.0,
            ignore=(requests.RequestException,),
        )
