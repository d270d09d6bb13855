"""``hydrator drain`` as an operator runs it (the command as a process, against the state file
that ``hydrator once`` wrote), on README's own setup: a DMAPI source whose storage elements
are mapped to sites by ``[sites]``. A drain either does what it says (the next cycle leaves
out what only that storage element holds, and the ad says why) or is refused in one line
with exit status 2, saving nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.fake_dmapi import FakeSrcnet

CONFIG = """
[daemon]
state_path = "state.sqlite"

[[sources]]
type = "dmapi"
base_url = "{base_url}"
token_url = "{token_url}"
client_id_file = "client-id"
client_secret_file = "client-secret"
datasets = ["ska:on_scratch", "ska:on_disk"]

[sites]
CH_DISK = "SRCNET_CH"
CH_SCRATCH = "SRCNET_CH"
"""


def hydrator(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hydrator", *args, "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def once(config: Path) -> dict[str, Any]:
    done = hydrator(config, "once", "--json")
    assert done.returncode == 0, done.stderr
    sites: dict[str, Any] = json.loads(done.stdout)["sites"]
    return sites


@pytest.fixture
def config(tmp_path: Path, fake: FakeSrcnet) -> Path:
    (tmp_path / "client-id").write_text(fake.client_id)
    (tmp_path / "client-secret").write_text(fake.client_secret)
    fake.add_dataset("ska", "on_scratch", ("CH_SCRATCH", None))
    fake.add_dataset("ska", "on_disk", ("CH_DISK", None))
    path = tmp_path / "hydrator.toml"
    path.write_text(CONFIG.format(base_url=fake.base_url, token_url=fake.token_url))
    before = once(path)["SRCNET_CH"]
    assert before["available"] == ["ska:on_disk", "ska:on_scratch"]
    return path


def test_a_drain_of_a_storage_element_mapped_by_sites_applies_at_the_next_cycle(
    config: Path,
) -> None:
    done = hydrator(config, "drain", "SRCNET_CH", "--storage", "CH_SCRATCH", "--reason", "swap")
    assert done.returncode == 0, done.stderr
    assert "warning" not in done.stdout + done.stderr

    ch = once(config)["SRCNET_CH"]
    assert ch["available"] == ["ska:on_disk"], "what only CH_SCRATCH holds leaves the site"
    assert ch["unavailable"] == ["storage CH_SCRATCH: drained by the operator: swap"]
    shown = hydrator(config, "show", "SRCNET_CH")
    assert (
        'DataLocalityUnavailable = "storage CH_SCRATCH: drained by the operator: swap"'
        in shown.stdout
    )

    assert hydrator(config, "undrain", "SRCNET_CH", "--storage", "CH_SCRATCH").returncode == 0
    assert once(config)["SRCNET_CH"]["available"] == ["ska:on_disk", "ska:on_scratch"]


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["SRCNET_XX"], "SRCNET_XX"),  # a site nothing ever reported
        (["SRCNET_CH", "--storage", "XX_DISK"], "XX_DISK"),  # storage no source states there
        (["SRCNET_CH", "--storage", "CH_DISK_TYPO"], "CH_DISK_TYPO"),
        (["SRCNET_CH", "--until", "99999999999999d"], "--until"),  # beyond any date
        (["SRCNET_CH", "--until", "9999999999999999999999h"], "--until"),
        (["SRCNET_CH", "--until", "9999-12-31T23:59-02:00"], "--until"),  # past year 9999 in UTC
        (["SRCNET_CH", "--until", "400d"], "--until"),  # over the longest drain with an end
    ],
)
def test_a_drain_that_cannot_do_what_it_says_is_refused_in_one_line(
    config: Path, args: list[str], names: str
) -> None:
    done = hydrator(config, "drain", *args, "--reason", "test")
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert line.startswith("hydrator: ") and names in line
    assert "Traceback" not in done.stderr
    shown = hydrator(config, "show")
    assert "# drain" not in shown.stdout, "nothing saved"
    assert once(config)["SRCNET_CH"]["available"] == ["ska:on_disk", "ska:on_scratch"]
