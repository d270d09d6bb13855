"""Presence and transfer through the command line: two sources, one sees the files, the other
a stuck transfer towards the same site (as a DMAPI and a Rucio source may)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hydrator.runtime.cli import main


@pytest.fixture()
def config(tmp_path: Path) -> Path:
    (tmp_path / "seen.toml").write_text(
        '[storage.CH_DISK]\nsite = "CH"\npartial = { "ska:x" = 0.5 }\navailable = ["ska:y"]\n'
    )
    (tmp_path / "rules.toml").write_text('[storage.CH_DISK]\nsite = "CH"\nstuck = ["ska:x"]\n')
    path = tmp_path / "hydrator.toml"
    path.write_text(
        '[daemon]\nstate_path = "state.sqlite"\n'
        '[[sources]]\ntype = "static"\nname = "seen"\npath = "seen.toml"\nsettle_s = 0\n'
        '[[sources]]\ntype = "static"\nname = "rules"\npath = "rules.toml"\nsettle_s = 0\n'
    )
    return path


def test_a_stuck_transfer_never_hides_files_that_are_there(
    config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["once", "--config", str(config)]) == 0
    assert "+ CH ska:x partial+stuck" in capsys.readouterr().out.splitlines()

    assert main(["show", "--config", str(config)]) == 0
    shown = capsys.readouterr().out.splitlines()
    assert 'PartialDatasets = { "ska:x" }' in shown
    assert "# stuck transfers (not advertised): ska:x" in shown

    assert main(["once", "--json", "--config", str(config)]) == 0
    site = json.loads(capsys.readouterr().out)["sites"]["CH"]
    assert site["partial"] == [
        {"dataset": "ska:x", "fraction": 0.5, "bytes_fraction": 0.5, "transfer": "stuck"}
    ]
    assert site["stuck"] == ["ska:x"] and site["available"] == ["ska:y"]
