"""The SQLite state store: round trips, restarts, schema versions, and kills mid-write."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from hydrator.core import Policy, plan_cycle
from hydrator.domain import State
from hydrator.errors import StateError
from hydrator.state import SqliteStateStore
from tests.unit.factories import fail, rep, snap, t

POLICY = Policy()


def test_round_trip_and_restart_produce_zero_changes(tmp_path: Path) -> None:
    outcome = {
        "r": snap("r", rep("A", "x"), rep("B", "y", "partial", 0.25), sites=("C",)),
        "d": snap("d", rep("A", "z", "replicating", 0.5)),
    }
    store = SqliteStateStore(tmp_path / "s.sqlite")
    plan = plan_cycle(State(), outcome, t(0), POLICY)
    assert store.save(plan) == 3 + 3  # replica rows + first-seen rows
    store.close()

    reopened = SqliteStateStore(tmp_path / "s.sqlite")
    loaded = reopened.load()
    assert loaded.sources == plan.state.sources
    assert loaded.first_seen == plan.state.first_seen
    again = plan_cycle(loaded, outcome, t(1), POLICY)
    assert again.changes == () and again.changed_sites == frozenset()
    assert reopened.save(again) == 0, "a cycle with no change writes no replica rows"


def test_failed_source_state_survives_a_restart(tmp_path: Path) -> None:
    store = SqliteStateStore(tmp_path / "s.sqlite")
    first = plan_cycle(State(), {"r": snap("r", rep("A", "x"))}, t(0), POLICY)
    store.save(first)
    second = plan_cycle(first.state, {"r": fail("r", "HTTP 503")}, t(1), POLICY)
    store.save(second)
    loaded = SqliteStateStore(tmp_path / "s.sqlite").load()
    source = loaded.sources["r"]
    assert source.stale and source.error == "HTTP 503"
    assert source.last_success == t(0) and source.last_attempt == t(1)
    assert [str(r.dataset) for r in source.replicas] == ["ska:x"]


def test_unknown_schema_version_is_refused_with_the_versions(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite"
    SqliteStateStore(path).close()
    with sqlite3.connect(path) as db:
        db.execute("UPDATE meta SET value='99' WHERE key='schema_version'")
    with pytest.raises(StateError, match="schema version 99; this hydrator reads version 2"):
        SqliteStateStore(path)


def test_unwritable_location_is_a_state_error(tmp_path: Path) -> None:
    with pytest.raises(StateError, match="no-such-dir"):
        SqliteStateStore(tmp_path / "no-such-dir" / "s.sqlite")


WRITER = textwrap.dedent(
    """
    import sys
    from hydrator.core import Policy, plan_cycle
    from hydrator.state import SqliteStateStore
    from tests.unit.factories import rep, snap, t
    store = SqliteStateStore(__import__("pathlib").Path(sys.argv[1]))
    n = int(sys.argv[2])
    outcome = {"r": snap("r", *(rep(f"S{i % 50}", f"new{i}") for i in range(n)))}
    plan = plan_cycle(store.load(), outcome, t(5), Policy(accept_drop_after_cycles=1))
    print("writing", flush=True)
    store.save(plan)
    print("done", flush=True)
    """
)


@pytest.mark.parametrize("delay_s", [0.0, 0.05, 0.2, 0.5])
def test_a_kill_mid_write_leaves_the_old_or_the_new_state(tmp_path: Path, delay_s: float) -> None:
    path = tmp_path / "s.sqlite"
    store = SqliteStateStore(path)
    old = snap("r", *(rep("A", f"old{i}") for i in range(100)))
    store.save(plan_cycle(State(), {"r": old}, t(0), POLICY))
    store.close()
    n = 60_000
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path), str(n)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).parents[2],
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "writing"
    time.sleep(delay_s)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    loaded = SqliteStateStore(path).load()
    names = {r.dataset.name for r in loaded.sources["r"].replicas}
    assert names in ({f"old{i}" for i in range(100)}, {f"new{i}" for i in range(n)})
    assert len(loaded.first_seen) in (100, n)
