"""End to end: ``hydrator run`` on the shipped demo configuration, as a subprocess."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.support.daemon import Daemon
from tests.support.wait import wait_for

REPO = Path(__file__).parents[2]
pytestmark = pytest.mark.slow


@pytest.fixture
def demo(tmp_path: Path) -> Iterator[Daemon]:
    """The demo config, copied so the test can edit its inventory, on a free port; ready."""
    for name in ("demo.toml", "demo-inventory.toml"):
        shutil.copy2(REPO / "config" / name, tmp_path / name)  # keeps the old mtime
    daemon = Daemon(tmp_path)
    text = (tmp_path / "demo.toml").read_text()
    text = text.replace('listen = "127.0.0.1:9620"', f'listen = "{daemon.target}"')
    text = text.replace("interval_s = 10", "interval_s = 1")
    text = text.replace("updated_resolution_s = 60", "updated_resolution_s = 86400")
    (tmp_path / "demo.toml").write_text(text)
    with daemon:
        daemon.start(tmp_path / "demo.toml", ready_timeout_s=20.0)
        yield daemon


def children(pid: int) -> list[int]:
    """Pids whose parent is ``pid`` (from /proc/*/stat)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def gone(pid: int) -> bool:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return True
    return fields[0] == "Z"  # exited, not yet reaped by whoever adopted it


def classad(base: str, site: str) -> requests.Response:
    return requests.get(f"{base}/v1/sites/{site}/classad", timeout=5)


def test_daemon_serves_follows_the_inventory_and_stops_cleanly(demo: Daemon) -> None:
    base, config_dir, proc = demo.url, demo.directory, demo.proc
    assert proc is not None

    first = classad(base, "SRCNET_ES")
    assert first.status_code == 200
    assert 'AvailableDatasets = { "ska:skymodel_v3" }' in first.text.splitlines()
    tag = first.headers["ETag"]
    time.sleep(2.5)  # two more cycles with no change
    assert classad(base, "SRCNET_ES").headers["ETag"] == tag, "no change, same ETag"
    unchanged = requests.get(
        f"{base}/v1/sites/SRCNET_ES/classad", headers={"If-None-Match": tag}, timeout=5
    )
    assert unchanged.status_code == 304

    inventory = config_dir / "demo-inventory.toml"
    inventory.write_text(
        inventory.read_text().replace(
            'available = ["ska:skymodel_v3"]', 'available = ["ska:skymodel_v3", "ska:obs_9999"]'
        )
    )
    wait_for(
        "SRCNET_ES lists ska:obs_9999",
        lambda: classad(base, "SRCNET_ES").text,
        done=lambda text: "ska:obs_9999" in text,
        timeout_s=10.0,
        ignore=(requests.RequestException,),
    )
    changed = requests.get(
        f"{base}/v1/sites/SRCNET_ES/classad", headers={"If-None-Match": tag}, timeout=5
    )
    assert changed.status_code == 200 and changed.headers["ETag"] != tag
    assert classad(base, "NO_SUCH_SITE").status_code == 404

    (front,) = children(proc.pid)  # the HTTP server (hydrator.adapters.http.server)
    assert demo.stop(timeout_s=20.0) == 0  # SIGTERM
    assert gone(front)
    log = demo.output()
    assert "received SIGTERM, stopping" in log and "Traceback" not in log


def test_a_killed_daemon_leaves_no_http_server_or_files_behind(demo: Daemon) -> None:
    base, proc = demo.url, demo.proc
    assert proc is not None
    (front,) = children(proc.pid)
    args = Path(f"/proc/{front}/cmdline").read_bytes().split(b"\0")
    served = Path(args[args.index(b"--dir") + 1].decode())
    assert (served / "status.json").exists()
    proc.kill()  # no chance to stop the server: it sees its stdin close
    proc.wait()
    wait_for(f"HTTP server {front} gone", lambda: gone(front), timeout_s=5.0)
    assert not served.exists(), "the served files are removed with the server"
    with pytest.raises(requests.ConnectionError):
        requests.get(f"{base}/healthz", timeout=2)


def test_a_busy_listen_address_is_one_line_and_exit_2(tmp_path: Path) -> None:
    for name in ("demo.toml", "demo-inventory.toml"):
        shutil.copy(REPO / "config" / name, tmp_path / name)
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        text = (tmp_path / "demo.toml").read_text()
        (tmp_path / "demo.toml").write_text(
            text.replace('listen = "127.0.0.1:9620"', f'listen = "127.0.0.1:{port}"')
        )
        result = subprocess.run(
            [sys.executable, "-m", "hydrator", "run", "--config", str(tmp_path / "demo.toml")],
            check=False,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode == 2
    (line,) = result.stderr.splitlines()
    assert "http.listen" in line and f"127.0.0.1:{port}" in line and "in use" in line


def test_once_json_reports_sites_by_state_and_changes(tmp_path: Path) -> None:
    for name in ("demo.toml", "demo-inventory.toml"):
        shutil.copy2(REPO / "config" / name, tmp_path / name)  # keeps the old mtime
    config = str(tmp_path / "demo.toml")
    cmd = [sys.executable, "-m", "hydrator", "once", "--json", "--config", config]

    first = json.loads(subprocess.run(cmd, check=True, capture_output=True).stdout)
    ch = first["sites"]["SRCNET_CH"]
    assert ch["available"] == ["lofar:L654321_SB001", "ska:obs_1234", "ska:skymodel_v3"]
    assert ch["partial"] == [
        {"dataset": "ska:obs_1300", "fraction": 0.4, "bytes_fraction": 0.4, "transfer": "none"}
    ]
    uk = first["sites"]["SRCNET_UK"]
    assert uk["replicating"] == [{"dataset": "ska:obs_1400", "progress": 0.25}]
    assert first["sites"]["SRCNET_ES"]["stuck"] == ["ska:obs_1500"]
    assert len(first["changes"]) == first["summary"]["added"] == 11
    second = json.loads(subprocess.run(cmd, check=True, capture_output=True).stdout)
    assert second["changes"] == [] and second["summary"]["rows_written"] == 0
    dry = subprocess.run([*cmd[:4], "--dry-run", *cmd[4:]], check=True, capture_output=True)
    assert json.loads(dry.stdout)["changes"] == []

    shown = subprocess.run(
        [sys.executable, "-m", "hydrator", "show", "SRCNET_AU", "--config", config],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert 'AvailableDatasets = { "ska:obs_1400" }' in shown.splitlines()
    assert shown.splitlines()[-1] == "- update:true"


def test_json_logs_carry_one_object_per_line_with_the_cycle_counts(tmp_path: Path) -> None:
    for name in ("demo.toml", "demo-inventory.toml"):
        shutil.copy2(REPO / "config" / name, tmp_path / name)  # keeps the old mtime
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "hydrator",
            "--log-format",
            "json",
            "once",
            "--config",
            str(tmp_path / "demo.toml"),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    records = [json.loads(line) for line in result.stderr.splitlines()]
    (cycle,) = [r for r in records if r["logger"] == "hydrator.cycle"]
    assert cycle["outcome"] == "ok" and cycle["added"] == 11 and cycle["sites"] == 4
    assert cycle["duration_s"] >= 0
