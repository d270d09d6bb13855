"""The static inventory source: mapping, invalid records, unreadable files."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from hydrator.domain import ReplicaState, Transfer
from hydrator.errors import PermanentSourceError
from hydrator.sources import FetchContext
from hydrator.sources.static import StaticSource

CTX = FetchContext(now=datetime(2026, 11, 22, tzinfo=UTC))


def source(tmp_path: Path, text: str, sites: dict[str, str] | None = None) -> StaticSource:
    path = tmp_path / "inv.toml"
    path.write_text(text)
    return StaticSource("inv", path, sites or {})


def test_elements_map_to_sites_and_states(tmp_path: Path) -> None:
    snap = source(
        tmp_path,
        '[storage.CH_DISK]\navailable = ["ska:a"]\npartial = { "ska:b" = 0.25 }\n'
        '[storage.CH_TAPE2]\nreplicating = { "ska:a" = 0.5 }\n'
        '[storage.X]\nsite = "SITE_X"\nstuck = ["ska:c"]\n',
        {"CH_DISK": "CH", "CH_TAPE2": "CH"},
    ).fetch(CTX)
    got = {
        (r.site, str(r.dataset), r.state, r.fraction, r.transfer, r.progress) for r in snap.replicas
    }
    assert got == {
        # complete at one element of CH while a transfer to another one runs: both facts kept
        ("CH", "ska:a", ReplicaState.AVAILABLE, 1.0, Transfer.REPLICATING, 0.5),
        ("CH", "ska:b", ReplicaState.PARTIAL, 0.25, Transfer.NONE, 0.0),
        ("SITE_X", "ska:c", ReplicaState.STUCK, 0.0, Transfer.STUCK, 0.0),
    }
    assert snap.sites == {"CH", "SITE_X"} and snap.invalid == 0


def test_invalid_records_are_counted_and_skipped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    snap = source(
        tmp_path,
        '[storage.A]\nsite = "A"\navailable = ["ska:ok", "ska:bad name", "noscope", "ska:q\\"x"]\n'
        'partial = { "ska:p" = 1.5 }\nbogus = 1\n'
        '[storage.NOSITE]\navailable = ["ska:z"]\n'
        '[storage.B]\nsite = "bad site"\navailable = ["ska:y"]\n',
    ).fetch(CTX)
    assert [str(r.dataset) for r in snap.replicas] == ["ska:ok"]
    assert snap.invalid == 5
    assert snap.unmapped == {"NOSITE", "B"}
    assert "invalid dataset name 'ska':'bad name'" in caplog.text


@pytest.mark.parametrize(
    ("text", "message"), [("[storage.A\n", "not valid TOML"), ("x = 1\n", r"no \[storage")]
)
def test_unusable_file_is_a_permanent_source_error(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(PermanentSourceError, match=message):
        source(tmp_path, text).fetch(CTX)


def test_missing_file_is_a_permanent_source_error(tmp_path: Path) -> None:
    with pytest.raises(PermanentSourceError, match="cannot read"):
        StaticSource("inv", tmp_path / "gone.toml", {}).fetch(CTX)
