"""The static inventory source: mapping, invalid records, unreadable files."""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest

from hydrator.adapters.sources.static import StaticSource
from hydrator.core.ports import FetchContext
from hydrator.domain import ReplicaState, Transfer
from hydrator.errors import PermanentSourceError, TransientSourceError

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


def test_invalid_records_are_counted_skipped_and_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    inventory = source(
        tmp_path,
        '[storage.A]\nsite = "A"\navailable = ["ska:ok", "ska:bad name", "noscope", "ska:q\\"x"]\n'
        'partial = { "ska:p" = 1.5 }\nbogus = 1\n'
        '[storage.NOSITE]\navailable = ["ska:z"]\n'
        '[storage.B]\nsite = "bad site"\navailable = ["ska:y"]\n'
        '[storage.N]\nsite = 7\navailable = ["ska:x"]\n',
    )
    with caplog.at_level(logging.WARNING, logger="hydrator.adapters.sources.static"):
        snap = inventory.fetch(CTX)
        logged_first = [r.getMessage() for r in caplog.records]
        again = inventory.fetch(CTX)
    for snapshot in (snap, again):
        assert [str(r.dataset) for r in snapshot.replicas] == ["ska:ok"]
        assert snapshot.invalid == 5
        assert snapshot.unmapped == {"NOSITE", "B", "N"}
    assert "invalid dataset name 'ska':'bad name'" in caplog.text
    assert f"{inventory.path}: storage.B: invalid site name 'bad site'" in logged_first
    assert f"{inventory.path}: storage.N: invalid site name 7" in logged_first
    assert len(caplog.records) == len(logged_first)  # the second cycle repeats no warning


@pytest.mark.parametrize(
    ("text", "message"), [("[storage.A\n", "not valid TOML"), ("x = 1\n", r"no \[storage")]
)
def test_unusable_file_is_a_permanent_source_error(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(PermanentSourceError, match=message):
        source(tmp_path, text).fetch(CTX)


def test_missing_file_is_a_permanent_source_error(tmp_path: Path) -> None:
    with pytest.raises(PermanentSourceError, match="cannot read"):
        StaticSource("inv", tmp_path / "gone.toml", {}).fetch(CTX)


# A writer that rewrites the inventory in place, as `cat new > inventory.toml` or an editor
# saving over the file does: truncate, then one storage table at a time.
IN_PLACE_WRITER = """
import sys, time
path, tables, pause_s, until = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
body = [f'[storage.E{i}]\\nsite = "S{i}"\\navailable = [' + ", ".join(
    f'"ska:d{i}_{j}"' for j in range(200)) + "]\\n" for i in range(tables)]
print("writing", flush=True)
while time.time() < until:
    with open(path, "r+") as f:
        f.truncate(0)
        for table in body:
            f.write(table)
            f.flush()
            time.sleep(pause_s)
"""


def inventory(path: Path, tables: int) -> None:
    path.write_text(
        "".join(
            f'[storage.E{i}]\nsite = "S{i}"\navailable = ['
            + ", ".join(f'"ska:d{i}_{j}"' for j in range(200))
            + "]\n"
            for i in range(tables)
        )
    )


def rewrite_in_place(
    path: Path, tables: int, pause_s: float, for_s: float
) -> subprocess.Popen[str]:
    writer = subprocess.Popen(
        [
            sys.executable,
            "-c",
            IN_PLACE_WRITER,
            str(path),
            str(tables),
            str(pause_s),
            str(time.time() + for_s),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert writer.stdout is not None and writer.stdout.readline() == "writing\n"
    return writer


def test_a_file_rewritten_in_place_is_never_used_half_written(tmp_path: Path) -> None:
    path = tmp_path / "inv.toml"
    inventory(path, 20)
    os.utime(path, (time.time() - 60, time.time() - 60))
    static = StaticSource("inv", path, {}, settle_s=1.0)  # far above the writer's pauses
    full = len(static.fetch(CTX).replicas)
    assert full == 20 * 200
    writer = rewrite_in_place(path, 20, pause_s=0.02, for_s=1.5)
    seen: list[str] = []
    try:
        while writer.poll() is None:
            try:
                seen.append(f"{len(static.fetch(CTX).replicas)} replicas")
            except TransientSourceError as exc:
                seen.append("deferred" if "re-read next cycle" in str(exc) else str(exc))
            time.sleep(0.01)
    finally:
        writer.kill()
        writer.wait()
    assert "deferred" in seen
    assert set(seen) <= {"deferred", f"{full} replicas"}, sorted(set(seen))
    time.sleep(1.1)  # the settle time passes: the next cycle uses the complete file
    assert len(static.fetch(CTX).replicas) == full


# Rewrites a 4 MiB file in place without pause: a read of it overlaps some of the writes.
CONTINUOUS_WRITER = """
import sys, time
path, until = sys.argv[1], float(sys.argv[2])
body = '[storage.E]\\nsite = "S"\\navailable = ["ska:d"]\\n' + ("#" + "x" * 65534 + "\\n") * 64
print("writing", flush=True)
with open(path, "r+") as f:
    while time.time() < until:
        f.seek(0)
        f.truncate()
        for i in range(0, len(body), 65536):
            f.write(body[i : i + 65536])
            f.flush()
"""


def test_a_change_during_the_read_is_detected_even_without_a_settle_time(tmp_path: Path) -> None:
    path = tmp_path / "inv.toml"
    inventory(path, 1)
    static = StaticSource("inv", path, {}, settle_s=0)
    writer = subprocess.Popen(
        [sys.executable, "-c", CONTINUOUS_WRITER, str(path), str(time.time() + 10)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert writer.stdout is not None and writer.stdout.readline() == "writing\n"
    try:
        with pytest.raises(TransientSourceError, match="changed while being read"):
            while writer.poll() is None:
                # a read between two writes may be cut mid-table: not valid TOML
                with contextlib.suppress(PermanentSourceError):
                    static.fetch(CTX)
    finally:
        writer.kill()
        writer.wait()


def test_a_young_file_is_used_once_it_has_settled(tmp_path: Path) -> None:
    path = tmp_path / "inv.toml"
    inventory(path, 1)
    mtime = path.stat().st_mtime
    now = [mtime + 1.0]
    static = StaticSource("inv", path, {}, settle_s=2.0, clock=lambda: now[0])
    with pytest.raises(TransientSourceError, match=r"modified 1\.0 s ago.*settle_s = 2"):
        static.fetch(CTX)
    now[0] = mtime + 2.5
    assert len(static.fetch(CTX).replicas) == 200
    now[0] = mtime - 3600  # an mtime an hour ahead (clock skew) does not block it for good
    assert len(static.fetch(CTX).replicas) == 200


def test_an_inventory_with_a_byte_order_mark_is_read(tmp_path: Path) -> None:
    path = tmp_path / "inv.toml"
    path.write_bytes(b'\xef\xbb\xbf[storage.A]\nsite = "A"\navailable = ["ska:x"]\n')
    assert [str(r.dataset) for r in StaticSource("inv", path, {}).fetch(CTX).replicas] == ["ska:x"]


# ---- inputs that are not files, sizes, a fresh inventory


@pytest.mark.parametrize(
    ("make", "kind"),
    [(os.mkfifo, "a FIFO"), (lambda p: p.symlink_to("/dev/zero"), "a character device")],
    ids=["fifo", "dev-zero"],
)
def test_a_path_that_is_not_a_regular_file_fails_at_once_naming_it(
    tmp_path: Path, make: Callable[[Path], object], kind: str
) -> None:
    """Unchecked, a FIFO blocks the read (SIGTERM ignored) and /dev/zero grows memory by GBs."""
    path = tmp_path / "inv.toml"
    make(path)
    t0 = time.monotonic()
    expected = f"inv.toml: cannot read: not a regular file \\({kind}\\)"
    with pytest.raises(PermanentSourceError, match=expected):
        StaticSource("inv", path, {}, settle_s=0).fetch(CTX)
    assert time.monotonic() - t0 < 1.0


def test_an_inventory_over_its_size_cap_fails_the_source(tmp_path: Path) -> None:
    path = tmp_path / "inv.toml"
    path.write_text('[storage.A]\nsite = "A"\navailable = ["ska:x"]\n' + "#" * 2000 + "\n")
    with pytest.raises(PermanentSourceError, match="larger than the limit of 1000 bytes"):
        StaticSource("inv", path, {}, max_bytes=1000).fetch(CTX)


def test_a_fresh_inventory_is_read_as_soon_as_it_has_settled(tmp_path: Path) -> None:
    """Item 11: a file younger than settle_s is read once it has settled, in the same fetch
    (within its deadline), instead of a whole interval later."""
    path = tmp_path / "inv.toml"
    path.write_text('[storage.A]\nsite = "A"\navailable = ["ska:x"]\n')
    static = StaticSource("inv", path, {}, settle_s=1.0, deadline_s=30.0)
    t0 = time.monotonic()
    assert [str(r.dataset) for r in static.fetch(CTX).replicas] == ["ska:x"]
    assert 0.8 <= time.monotonic() - t0 < 3.0
    short = StaticSource("inv", path, {}, settle_s=60.0, deadline_s=30.0)
    with pytest.raises(TransientSourceError, match="less than settle_s = 60"):
        short.fetch(CTX)  # a wait past the deadline is not started
