"""One writer per state, state checked on load, start-up failures as one line with exit 2.

Real ``python -m hydrator`` processes on a copy of the demo configuration.
"""

from __future__ import annotations

import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.privileges import file_modes_enforced

REPO = Path(__file__).parents[2]
pytestmark = pytest.mark.slow


@pytest.fixture
def demo(tmp_path: Path) -> Path:
    """The demo configuration in ``tmp_path``, cycling every second, without the HTTP server;
    its inventory keeps the shipped file's old mtime (past the static source's settle time)."""
    for name in ("demo.toml", "demo-inventory.toml"):
        shutil.copy2(REPO / "config" / name, tmp_path / name)
    text = (tmp_path / "demo.toml").read_text()
    text = text.replace('listen = "127.0.0.1:9620"', "enabled = false")
    text = text.replace("interval_s = 10", "interval_s = 1")
    (tmp_path / "demo.toml").write_text(text)
    return tmp_path / "demo.toml"


def hydrator(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "hydrator", args[0], "--config", str(config), *args[1:]]
    return subprocess.run(
        command, capture_output=True, text=True, timeout=60, cwd=REPO, check=False
    )


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    """The single stderr line of a refused start (no traceback)."""
    assert result.stderr.count("\n") == 1, result.stderr
    assert "Traceback" not in result.stderr
    return result.stderr


@pytest.fixture
def daemon(demo: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``hydrator run`` on the demo, once it holds the lock and has saved a first cycle."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "hydrator", "run", "--config", str(demo)],
        stderr=subprocess.DEVNULL,
        cwd=REPO,
    )
    try:
        lock = demo.parent / "demo-state.sqlite.lock"
        deadline = time.monotonic() + 20
        while not (lock.exists() and lock.read_text().strip() == str(proc.pid)) or (
            hydrator(demo, "show").returncode != 0
        ):
            assert proc.poll() is None, "the daemon exited"
            assert time.monotonic() < deadline, "the daemon never took the lock"
            time.sleep(0.2)
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def test_a_second_writer_is_refused_naming_the_holder(
    demo: Path, daemon: subprocess.Popen[bytes]
) -> None:
    for args in (["once"], ["run"], ["once", "--reset-state"]):
        refused = hydrator(demo, *args)
        assert refused.returncode == 2, refused.stderr
        assert f"in use by another hydrator (pid {daemon.pid}" in one_line(refused)
    assert daemon.poll() is None


def test_readers_work_beside_the_daemon_and_write_nothing(
    demo: Path, daemon: subprocess.Popen[bytes]
) -> None:
    state = demo.parent / "demo-state.sqlite"
    shown = hydrator(demo, "show", "SRCNET_CH")
    assert shown.returncode == 0, shown.stderr
    assert 'DataLocalitySite = "SRCNET_CH"' in shown.stdout
    dry = hydrator(demo, "once", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    daemon.send_signal(signal.SIGTERM)
    assert daemon.wait(timeout=20) == 0
    before = state.read_bytes()
    assert hydrator(demo, "once", "--dry-run").returncode == 0
    assert hydrator(demo, "show").returncode == 0
    assert state.read_bytes() == before, "a reader changed the state"
    assert hydrator(demo, "once").returncode == 0, "the lock was released by the stop"


def test_the_lock_dies_with_a_killed_holder(demo: Path, daemon: subprocess.Popen[bytes]) -> None:
    daemon.send_signal(signal.SIGKILL)
    daemon.wait(timeout=20)
    after = hydrator(demo, "once")
    assert after.returncode == 0, after.stderr


@pytest.mark.parametrize(
    ("content", "problem"),
    [(b"", "is empty (0 bytes)"), (b"not a database" * 100, "file is not a database")],
    ids=["empty", "garbage"],
)
@pytest.mark.parametrize("command", ["run", "once", "show"])
def test_a_damaged_state_file_is_refused_naming_it(
    demo: Path, content: bytes, problem: str, command: str
) -> None:
    state = demo.parent / "demo-state.sqlite"
    state.write_bytes(content)
    refused = hydrator(demo, command)
    assert refused.returncode == 2
    line = one_line(refused)
    assert str(state) in line and problem in line
    assert "--reset-state" in line and "move it away" in line
    assert state.read_bytes() == content, "the damaged file was changed"


def test_reset_state_keeps_the_damaged_file_aside_and_starts_empty(demo: Path) -> None:
    state = demo.parent / "demo-state.sqlite"
    state.write_bytes(b"")
    reset = hydrator(demo, "once", "--reset-state")
    assert reset.returncode == 0, reset.stderr
    kept = [p for p in demo.parent.iterdir() if p.name.startswith("demo-state.sqlite.reset-")]
    assert len(kept) == 1 and kept[0].read_bytes() == b""
    assert "SRCNET_CH" in hydrator(demo, "show").stdout
    assert hydrator(demo, "once", "--dry-run", "--reset-state").returncode == 2


def test_a_missing_state_file_is_a_first_start(demo: Path) -> None:
    dry = hydrator(demo, "once", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert not (demo.parent / "demo-state.sqlite").exists(), "a dry run created the state"
    assert hydrator(demo, "once").returncode == 0
    assert "SRCNET_CH" in hydrator(demo, "show").stdout


def test_an_unusable_state_location_is_one_line_and_exit_2(demo: Path) -> None:
    text = demo.read_text()
    demo.write_text(text.replace('"demo-state.sqlite"', '"no-such-dir/state.sqlite"'))
    for command in ("run", "once"):
        refused = hydrator(demo, command)
        assert refused.returncode == 2
        assert "no-such-dir" in one_line(refused)
    demo.write_text(text)
    demo.parent.chmod(0o555)  # the daemon's user may not create files there
    try:
        argv = [sys.executable, "-m", "hydrator", "once", "--config", str(demo)]
        result = subprocess.run(
            file_modes_enforced(argv), capture_output=True, text=True, cwd=REPO, check=False
        )
    finally:
        demo.parent.chmod(0o755)
    assert result.returncode == 2
    assert str(demo.parent) in one_line(result) and "Permission denied" in result.stderr


@pytest.mark.parametrize(
    ("mode", "refused", "needed"),
    [(0o000, ["show", "once", "run"], "read"), (0o444, ["once", "run"], "read and write")],
    # a writer's message asks for "read and write" whatever is missing
    ids=["unreadable", "read-only"],
)
def test_a_state_file_the_user_may_not_use_is_one_line_and_exit_2(
    demo: Path, mode: int, refused: list[str], needed: str
) -> None:
    """A read-only state would fail every cycle's save: refused at start instead."""
    assert hydrator(demo, "once").returncode == 0
    state = demo.parent / "demo-state.sqlite"
    state.chmod(mode)
    for command in refused:
        result = subprocess.run(
            file_modes_enforced([sys.executable, "-m", "hydrator", command, "--config", str(demo)]),
            capture_output=True,
            text=True,
            cwd=REPO,
            check=False,
            timeout=60,
        )
        assert result.returncode == 2, (command, result.stderr)
        line = one_line(result)
        assert f"{state}: cannot open: Permission denied" in line
        assert f"user must {needed}" in line


def test_a_hand_edited_state_cannot_inject_classad_lines(demo: Path) -> None:
    """Rows are checked as fresh input is: an injected site or dataset name is never printed."""
    assert hydrator(demo, "once").returncode == 0
    evil_site = "SRCNET_CH\nRequirements = true"
    with sqlite3.connect(demo.parent / "demo-state.sqlite") as db:
        db.execute(
            "INSERT INTO replicas (source, site, scope, name, state, fraction)"
            " VALUES ('demo', ?, 'ska', 'obs_9', 'available', 1.0)",
            (evil_site,),
        )
        db.execute(
            "INSERT INTO replicas (source, site, scope, name, state, fraction)"
            " VALUES ('demo', 'SRCNET_UK', 'ska', ?, 'available', 1.0)",
            ('x"}\nRequirements = true\nA = {"y',),
        )
        db.execute("UPDATE sources SET sites = json_insert(sites, '$[#]', ?)", (evil_site,))
    shown = hydrator(demo, "show")
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert not [line for line in lines if line.startswith("Requirements")], shown.stdout
    assert 'DataLocalitySite = "SRCNET_CH"' in lines and 'DataLocalitySite = "SRCNET_UK"' in lines
    assert "obs_9" not in shown.stdout
    warning = one_line(shown)
    assert "3 invalid row(s) ignored" in warning and "\\nRequirements" in warning


def test_reset_state_keeps_the_operators_drains(demo: Path) -> None:
    """Resetting what the catalogues said does not undo what the operator decided."""
    assert hydrator(demo, "once").returncode == 0
    drained = hydrator(demo, "drain", "SRCNET_CH", "--reason", "disk swap", "--until", "3d")
    assert drained.returncode == 0, drained.stderr

    def drain_lines() -> list[str]:
        shown = hydrator(demo, "show", "SRCNET_CH").stdout.splitlines()
        return [line for line in shown if "disk swap" in line or "Datasets = " in line]

    before = drain_lines()
    assert len(before) == 5, before  # no dataset listed, the reason in the ad and a comment
    reset = hydrator(demo, "once", "--reset-state")
    assert reset.returncode == 0, reset.stderr
    assert "1 operator drain(s) kept" in reset.stderr
    assert [p for p in demo.parent.iterdir() if p.name.startswith("demo-state.sqlite.reset-")]
    assert drain_lines() == before
    assert hydrator(demo, "undrain", "SRCNET_CH").returncode == 0
    assert not any("disk swap" in line for line in drain_lines())
