"""Names from outside: a rejected name is quoted bounded, and site names
that differ only in case (ClassAd ``==`` ignores case) are refused."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest

from hydrator.adapters.sources.static import StaticSource
from hydrator.core.ports import FetchContext
from hydrator.domain import DatasetId, Site, StorageStatus, check_site
from hydrator.names import InvalidNameError
from hydrator.runtime.cli import main

LONG = "x" * 10_000


@pytest.mark.parametrize(
    "make",
    [
        lambda: DatasetId("ska", LONG + " "),
        lambda: DatasetId(LONG, "obs_1"),
        lambda: DatasetId.parse(LONG),
        lambda: check_site(LONG),
        lambda: StorageStatus(Site("SITE_A"), LONG + " "),
    ],
)
def test_an_invalid_name_is_quoted_as_a_prefix_and_its_length(make: Callable[[], object]) -> None:
    with pytest.raises(InvalidNameError) as caught:
        make()
    message = str(caught.value)
    assert len(message) < 300, message[:400]
    assert "characters)" in message and "'xxxxxxxx" in message


def test_a_static_source_logs_a_10_kb_dataset_name_in_one_short_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "inv.toml"
    path.write_text(f'[storage.CH_DISK]\navailable = ["ska:{LONG}!", "ska:ok"]\n')
    with caplog.at_level(logging.WARNING):
        snap = StaticSource("inv", path, {"CH_DISK": "CH"}).fetch(
            FetchContext(now=datetime(2026, 11, 26, tzinfo=UTC))
        )
    assert snap.invalid == 1 and len(snap.replicas) == 1
    (line,) = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert len(line) < 400 and "(10001 characters)" in line


def test_sites_differing_only_in_case_in_the_config_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "h.toml"
    path.write_text(
        '[[sources]]\ntype = "static"\npath = "inv.toml"\n'
        '[sites]\nCH_DISK = "SRCNET_CH"\nCH_TAPE = "srcnet_ch"\n'
    )
    assert main(["check-config", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "sites: CH_TAPE: site srcnet_ch differs only in case from SRCNET_CH" in err
