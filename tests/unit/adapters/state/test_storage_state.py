"""The state store's part in storage that cannot serve: storage statuses and operator drains
are kept across restarts, a file of the previous release (schema 3) loads and upgrades, and
what is read back is checked like fresh input."""

from __future__ import annotations

import sqlite3
from datetime import timedelta
from pathlib import Path

import pytest

from hydrator.adapters.state.drains import remove_drain, set_drain
from hydrator.adapters.state.sqlite import SqliteStateStore, StateLock
from hydrator.core.index import merged_snapshot
from hydrator.core.plan import GuardPolicy, plan_cycle
from hydrator.core.storage import Drain
from hydrator.domain import Site, State, StorageStatus
from hydrator.errors import StateError
from hydrator.runtime.cli import main as cli_main
from tests.support.state_files import old_state_config
from tests.unit.factories import rep, t

DATA = Path(__file__).parent / "data"
A = Site("SITE_A")


def _v3(tmp_path: Path) -> Path:
    """The state file the previous release (schema 3) wrote, with the config that wrote it."""
    return old_state_config(tmp_path, "state-v3.sqlite")


def _site_of(ad: str) -> str:
    return ad.split('DataLocalitySite = "')[1].split('"')[0]


def test_a_version_3_file_loads_as_it_was_and_upgrades_to_hold_drains(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _v3(tmp_path)
    state = tmp_path / "state.sqlite"
    assert cli_main(["show", "--config", str(config)]) == 0  # a reader: nothing written
    assert capsys.readouterr().out == (DATA / "show-v2.txt").read_text()
    reader = SqliteStateStore(state, read_only=True)
    assert reader.drains() == []
    assert all(not s.storages for s in reader.load().sources.values())
    reader.close()
    with sqlite3.connect(state) as db:
        assert db.execute("SELECT value FROM meta").fetchone() == ("3",)
    # the drain command upgrades a file no daemon holds, then saves the drain
    argv = ["drain", "SRCNET_CH", "--reason", "cooling failure", "--config", str(config)]
    assert cli_main(argv) == 0
    assert "drained site SRCNET_CH until `hydrator undrain`" in capsys.readouterr().out
    with sqlite3.connect(state) as db:
        assert db.execute("SELECT value FROM meta").fetchone() == ("4",)
    assert cli_main(["show", "--config", str(config)]) == 0
    shown = capsys.readouterr().out
    ads = {_site_of(ad): ad for ad in shown.split("- update:true")[:-1]}
    assert "AvailableDatasets = {  }" in ads["SRCNET_CH"], "a drained site lists nothing"
    assert (
        'DataLocalityUnavailable = "site SRCNET_CH: drained by the operator: cooling failure"'
        in ads["SRCNET_CH"]
    )
    assert "# drain: site SRCNET_CH since " in shown
    assert "AvailableDatasets = {  }" not in ads["SRCNET_UK"], "other sites keep theirs"
    undrain = ["undrain", "SRCNET_CH", "--config", str(config)]
    assert cli_main(undrain) == 0
    assert cli_main(undrain) == 1, "nothing left to undrain"
    capsys.readouterr()
    assert cli_main(["show", "--config", str(config)]) == 0
    assert capsys.readouterr().out == (DATA / "show-v2.txt").read_text()


def test_storage_statuses_outlive_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite"
    stated = (
        StorageStatus(A, "X_DISK", "RSE", False, "availability_read false", t(60), None, 2),
        StorageStatus(A, "Y_DISK", "RSE", upcoming="downtime from ... to ..."),
    )
    answer = merged_snapshot("r", [rep("SITE_A", "a")], [A], storages=stated)
    plan = plan_cycle(State(), {"r": answer}, t(0), GuardPolicy())
    store = SqliteStateStore(path)
    store.save(plan)
    store.close()
    loaded = SqliteStateStore(path, read_only=True).load()
    assert loaded.sources["r"].storages == stated
    again = plan_cycle(loaded, {}, t(1), GuardPolicy())  # the source dropped: its statuses go too
    store = SqliteStateStore(path)
    store.save(again)
    store.close()
    assert SqliteStateStore(path, read_only=True).load().sources == {}


def test_drains_are_saved_while_the_writer_holds_the_lock(tmp_path: Path) -> None:
    """The daemon holds the writer lock for its whole run; the drain commands write their
    own table beside it, and the daemon's store reads them at its next cycle."""
    path = tmp_path / "s.sqlite"
    daemon = SqliteStateStore(path, lock=StateLock(path))
    with pytest.raises(StateError, match="in use by another hydrator"):
        StateLock(path)
    set_drain(path, Drain(A, None, "network", t(0), t(120)))
    set_drain(path, Drain(A, "X_DISK", 'say "why"', t(1)))
    set_drain(path, Drain(A, "X_DISK", "RAID rebuild", t(2)))  # replaces the first one
    assert daemon.drains() == [
        Drain(A, None, "network", t(0), t(120)),
        Drain(A, "X_DISK", "RAID rebuild", t(2)),
    ]
    assert remove_drain(path, A, None) == 1 and remove_drain(path, A, None) == 0
    assert [d.storage for d in daemon.drains()] == ["X_DISK"]
    daemon.close()


@pytest.mark.parametrize(
    "row",
    [
        ("bad site", "", "r", 0.0, None),
        ("SITE_A", 'X"', "r", 0.0, None),
        ("SITE_A", "", b"\x00", 0.0, None),
        ("SITE_A", "", "r", "noon", None),
        ("SITE_A", "", "r", 0.0, 1e300),
    ],
)
def test_invalid_drain_rows_are_counted_and_left_out(
    tmp_path: Path, row: tuple[object, ...]
) -> None:
    path = tmp_path / "s.sqlite"
    SqliteStateStore(path).close()
    set_drain(path, Drain(A, "GOOD", "kept", t(0)))
    with sqlite3.connect(path) as db:
        db.execute("INSERT INTO drains VALUES (?, ?, ?, ?, ?)", row)
    store = SqliteStateStore(path, read_only=True)
    assert [d.reason for d in store.drains()] == ["kept"]
    assert store.rejected_rows["drains"] == 1


def test_invalid_storage_statuses_are_counted_and_left_out(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite"
    stated = (StorageStatus(A, "X_DISK", "RSE", False, "down"),)
    answer = merged_snapshot("r", [rep("SITE_A", "a")], [A], storages=stated)
    store = SqliteStateStore(path)
    store.save(plan_cycle(State(), {"r": answer}, t(0), GuardPolicy()))
    store.close()
    with sqlite3.connect(path) as db:
        (text,) = db.execute("SELECT statuses FROM storages").fetchone()
        bad = text[:-1] + ', {"site": "SITE_A", "storage": "a b"}]'
        db.execute("UPDATE storages SET statuses = ?", (bad,))
    reader = SqliteStateStore(path, read_only=True)
    assert reader.load().sources["r"].storages == stated
    assert reader.rejected_rows["sources"] == 1


def test_drain_times_are_checked(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    config = _v3(tmp_path)
    for until in ("yesterday", "2020-01-01T00:00Z", "2030-01-01T00:00"):
        argv = ["drain", "SRCNET_CH", "--until", until, "--reason", "x", "--config", str(config)]
        assert cli_main(argv) == 2
        assert "--until" in capsys.readouterr().err
    argv = ["drain", "SRCNET_CH", "--until", "90m", "--reason", "x", "--config", str(config)]
    assert cli_main(argv) == 0
    assert "warning" not in capsys.readouterr().out
    typo = ["drain", "SRCNET_CH", "--storage", "CH_DSIK", "--reason", "x", "--config", str(config)]
    assert cli_main(typo) == 2  # a drain that could never apply is refused, nothing saved
    assert "no source states a storage element CH_DSIK" in capsys.readouterr().err
    assert remove_drain(tmp_path / "state.sqlite", Site("SRCNET_CH"), "CH_DSIK") == 0
    store = SqliteStateStore(tmp_path / "state.sqlite", read_only=True)
    (made,) = store.drains()
    assert made.until is not None
    assert timedelta(minutes=89) < made.until - made.since <= timedelta(minutes=90)
