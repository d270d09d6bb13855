"""The SQLite state store: round trips, restarts, schema versions, and kills mid-write."""

from __future__ import annotations

import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from hydrator.adapters.sources.static import StaticSource
from hydrator.adapters.state.sqlite import SqliteStateStore, StateLock
from hydrator.config import Config, load_config
from hydrator.core.index import merge_replicas, merged_snapshot
from hydrator.core.model import Model
from hydrator.core.plan import GuardPolicy, SourceDelta, plan_cycle, planned
from hydrator.core.presence import holding
from hydrator.domain import DatasetId, Replica, ReplicaState, Site, State, Transfer
from hydrator.errors import StateError
from hydrator.runtime.cli import main as cli_main
from hydrator.runtime.wiring import assemble
from tests.support.state_files import downgrade_to_schema_2, old_state_config
from tests.unit.factories import fail, flat, rep, snap, t

POLICY = GuardPolicy()
Key = tuple[Site, DatasetId]


def merged(state: State) -> dict[Key, Replica]:
    """``state``'s merged view by (site, dataset), the plain way: every source's replicas
    merged (:func:`merge_replicas`, the sources in name order)."""
    ordered = [state.sources[name] for name in sorted(state.sources)]
    return flat(merge_replicas(r for source in ordered for r in source.replicas))


def stamped(state: State, when: datetime) -> dict[Key, datetime]:
    """Every (site, dataset) of ``state`` first seen at ``when``."""
    return dict.fromkeys(merged(state), when)


def first_seen(path: Path) -> dict[Key, datetime]:
    """The first-seen times the state file at ``path`` holds, read by a reader."""
    return SqliteStateStore(path, read_only=True).first_seen()


def test_round_trip_and_restart_produce_zero_changes(tmp_path: Path) -> None:
    outcome = {
        "r": snap("r", rep("A", "x"), rep("B", "y", "partial", 0.25), sites=("C",)),
        "d": snap("d", rep("A", "z", "replicating", 0.5)),
    }
    store = SqliteStateStore(tmp_path / "s.sqlite")
    plan = plan_cycle(State(), outcome, t(0), POLICY)
    assert store.save(plan) == 3  # one row per replica, its pair's first-seen time in it
    store.close()

    reopened = SqliteStateStore(tmp_path / "s.sqlite")
    loaded = reopened.load()
    assert loaded.sources == plan.state.sources
    assert reopened.first_seen() == stamped(plan.state, t(0))
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
    with pytest.raises(StateError, match="schema version 99; this hydrator reads version 4"):
        SqliteStateStore(path)


def test_unwritable_location_is_a_state_error(tmp_path: Path) -> None:
    with pytest.raises(StateError, match="no-such-dir"):
        SqliteStateStore(tmp_path / "no-such-dir" / "s.sqlite")


def kill_after_start(delay_s: float, script: str, started: str, *args: str) -> None:
    """Run ``script`` in a fresh interpreter, wait for its ``started`` line, then SIGKILL it
    ``delay_s`` later (a daemon killed part way through a write)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", script, *args],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).parents[4],
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == started
    time.sleep(delay_s)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()


WRITER = textwrap.dedent(
    """
    import sys
    from hydrator.core.plan import GuardPolicy, plan_cycle
    from hydrator.adapters.state.sqlite import SqliteStateStore
    from tests.unit.factories import rep, snap, t
    store = SqliteStateStore(__import__("pathlib").Path(sys.argv[1]))
    n = int(sys.argv[2])
    outcome = {"r": snap("r", *(rep(f"S{i % 50}", f"new{i}") for i in range(n)))}
    plan = plan_cycle(store.load(), outcome, t(5), GuardPolicy(accept_drop_after_cycles=1))
    print("writing", flush=True)
    store.save(plan)
    print("done", flush=True)
    """
)


def test_a_load_gives_each_source_s_replicas_as_read_for_the_same_views(tmp_path: Path) -> None:
    """The replicas handed in row order are the state's, and the site views a model builds
    from them are those built from the state's sets (and those the plan saved had)."""
    path = tmp_path / "s.sqlite"
    store = SqliteStateStore(path)
    outcome = {"r": snap("r", rep("A", "x"), rep("B", "y", "partial", 0.5), rep("A", "z"))}
    plan = planned(State(), outcome, t(0), POLICY).plan
    store.save(plan)
    store.close()
    loaded, as_read = SqliteStateStore(path, read_only=True).load_in_order()
    assert {n: (len(rs), frozenset(rs)) for n, rs in as_read.items()} == {
        "r": (3, plan.state.sources["r"].replicas)
    }
    fast = Model.of(loaded, as_read=as_read).contents
    assert fast == Model.of(loaded).contents == plan.contents
    assert list(fast) == list(plan.contents)


@pytest.mark.parametrize("delay_s", [0.0, 0.05, 0.2, 0.5])
def test_a_kill_mid_write_leaves_the_old_or_the_new_state(tmp_path: Path, delay_s: float) -> None:
    path = tmp_path / "s.sqlite"
    store = SqliteStateStore(path)
    old = snap("r", *(rep("A", f"old{i}") for i in range(100)))
    store.save(plan_cycle(State(), {"r": old}, t(0), POLICY))
    store.close()
    n = 60_000
    kill_after_start(delay_s, WRITER, "writing", str(path), str(n))
    store = SqliteStateStore(path)
    loaded = store.load()
    names = {r.dataset.name for r in loaded.sources["r"].replicas}
    assert names in ({f"old{i}" for i in range(100)}, {f"new{i}" for i in range(n)})
    assert store.first_seen() == stamped(loaded, t(0) if len(names) == 100 else t(5))


def _saved(path: Path) -> None:
    store = SqliteStateStore(path)
    outcome = {"r": snap("r", rep("A", "x"), rep("B", "y", "partial", 0.5))}
    store.save(plan_cycle(State(), outcome, t(0), POLICY))
    store.close()


def _loaded_after(path: Path, sql: str) -> tuple[SqliteStateStore, State]:
    """A reader of :func:`_saved`'s state after ``sql`` changed its file, and what it loads."""
    _saved(path)
    with sqlite3.connect(path) as db:
        db.execute(sql)
    store = SqliteStateStore(path, read_only=True)
    return store, store.load()


INSERT_REPLICA = "INSERT INTO replicas (source, site, scope, name, state, fraction) VALUES "


@pytest.mark.parametrize(
    ("sql", "table"),
    [
        (INSERT_REPLICA + "('r', 'A\nB = 1', 'ska', 'z', 'available', 1.0)", "replicas"),
        (INSERT_REPLICA + "('r', 'A', 'ska', 'z\"', 'available', 1.0)", "replicas"),
        (INSERT_REPLICA + "('r', 'A', 'ska', 'z', 'everywhere', 1.0)", "replicas"),
        (INSERT_REPLICA + "('r', 'A', 'ska', 'z', 'partial', 7.5)", "replicas"),
        (INSERT_REPLICA + "('r', 'A', 'ska', 'z', 'partial', 'half')", "replicas"),
        (INSERT_REPLICA + "('r', X'41', 'ska', 'z', 'available', 1.0)", "replicas"),
        ("UPDATE replicas SET first_seen = 1e300 WHERE name = 'x'", "first_seen"),
        ("UPDATE replicas SET first_seen = 'noon' WHERE name = 'y'", "first_seen"),
        (
            INSERT_REPLICA.replace("fraction)", "fraction, first_seen)")
            + "('r\nX', 'A', 'ska', 'z', 'available', 1.0, 'noon')",
            "first_seen",
        ),
        ('UPDATE sources SET sites = \'["A", "B C"]\'', "sources"),
        ("INSERT INTO sources VALUES ('R\nX', 0, 0, 0, NULL, 0, '[]')", "sources"),
        ("INSERT INTO sources VALUES ('q', 0, 0, 0, NULL, 0, 'not json')", "sources"),
        ("INSERT INTO sources VALUES ('q', 0, 0, 5, NULL, -1, '[]')", "sources"),
    ],
)
def test_invalid_rows_are_counted_and_left_out(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, sql: str, table: str
) -> None:
    """Rows are checked on load with the rules fresh input meets."""
    store, loaded = _loaded_after(tmp_path / "s.sqlite", sql)
    expected = {"replicas": 0, "sources": 0, "first_seen": 0, "drains": 0, table: 1}
    assert store.rejected_rows == expected
    replicas = loaded.sources["r"].replicas
    assert {(r.site, r.dataset.name) for r in replicas} == {("A", "x"), ("B", "y")}
    assert {str(site) for view in [Model.of(loaded).stamped_views()] for site in view} <= {
        "A",
        "B",
    }
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "1 invalid row(s) ignored" in warnings[0].getMessage()
    assert "\n" not in warnings[0].getMessage()


def test_rejected_rows_are_exported_by_the_service(tmp_path: Path) -> None:
    from hydrator.config import parse_config
    from hydrator.runtime.wiring import assemble

    path = tmp_path / "s.sqlite"
    _saved(path)
    with sqlite3.connect(path) as db:
        db.execute("UPDATE replicas SET first_seen = 'noon' WHERE name = 'x'")
    config = parse_config(
        {"daemon": {"state_path": str(path)}, "sources": [{"type": "static", "path": "i"}]},
        tmp_path,
    )
    metrics = assemble(
        config, sources=[], store=SqliteStateStore(path, read_only=True)
    ).instruments.metrics
    sample = metrics.registry.get_sample_value
    assert sample("hydrator_state_rejected_rows", {"table": "first_seen"}) == 1
    assert sample("hydrator_state_rejected_rows", {"table": "replicas"}) == 0


def test_a_reader_creates_nothing_and_cannot_save(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite"
    reader = SqliteStateStore(path, read_only=True)
    assert reader.load() == State() and not path.exists()
    with pytest.raises(StateError, match="read-only"):
        reader.save(plan_cycle(State(), {"r": snap("r", rep("A", "x"))}, t(0), POLICY))
    _saved(path)
    reader = SqliteStateStore(path, read_only=True)
    with pytest.raises(StateError, match="read-only"):
        reader.save(plan_cycle(State(), {"r": snap("r", rep("A", "x"))}, t(0), POLICY))


def test_a_second_lock_names_the_first_holder(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite"
    first = StateLock(path)
    assert (tmp_path / "s.sqlite.lock").read_text() == f"{os.getpid()}\n"
    with pytest.raises(StateError, match=rf"in use by another hydrator \(pid {os.getpid()}"):
        StateLock(path)
    first.release()
    StateLock(path).release()


def test_a_new_database_appears_complete_or_not_at_all(tmp_path: Path) -> None:
    """Created under a temporary name and renamed: no 0-byte file is ever left behind."""
    path = tmp_path / "s.sqlite"
    SqliteStateStore(path).close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.sqlite"]
    assert SqliteStateStore(path, read_only=True).load() == State()


def test_a_database_of_another_program_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "other.sqlite"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE t (x)")
    with pytest.raises(StateError, match="is not a hydrator state; move it away"):
        SqliteStateStore(path)


# data/state-v1.sqlite: written by the release before schema 2 (f139dde) with
# `hydrator once` on data/inventory.toml (the demo inventory: available, partial 0.4,
# replicating 0.25 and stuck entries); data/show-v1.txt: that release's `hydrator show`.
DATA = Path(__file__).parent / "data"
V1_WRITTEN = datetime.fromtimestamp(1795432204.683547, tz=UTC)
V1_DIGESTS = {
    "SRCNET_AU": "9e96ba9605f59826",
    "SRCNET_CH": "fade787841d02b65",
    "SRCNET_ES": "2a22a40070bb6c85",
    "SRCNET_UK": "40c47bae9a79691d",
}


def v1_config(tmp_path: Path) -> Config:
    """The v1 state file, its inventory and a config like the one that wrote them."""
    shutil.copy(DATA / "state-v1.sqlite", tmp_path / "state.sqlite")
    shutil.copy(DATA / "inventory.toml", tmp_path / "inventory.toml")
    path = tmp_path / "hydrator.toml"
    path.write_text(
        '[daemon]\nstate_path = "state.sqlite"\n'
        '[[sources]]\ntype = "static"\nname = "demo"\npath = "inventory.toml"\n'
        '[sites]\nCH_DISK = "SRCNET_CH"\nUK_DISK = "SRCNET_UK"\nUK_SCRATCH = "SRCNET_UK"\n'
        'ES_DISK = "SRCNET_ES"\n'
    )
    return load_config(path)


def test_a_version_1_state_file_is_migrated_without_changing_any_ad(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = v1_config(tmp_path)
    assert cli_main(["show", "--config", str(tmp_path / "hydrator.toml")]) == 0
    shown = capsys.readouterr().out
    old = (DATA / "show-v1.txt").read_text().splitlines()
    assert [line for line in shown.splitlines() if not line.startswith("#")] == old
    assert "# stuck transfers (not advertised): ska:obs_1500" in shown.splitlines()
    with sqlite3.connect(config.daemon.state_path) as db:  # a reader migrates nothing
        assert db.execute("SELECT value FROM meta").fetchone() == ("1",)

    store = SqliteStateStore(config.daemon.state_path)
    held = merged(store.load())
    uk, es = Site("SRCNET_UK"), Site("SRCNET_ES")
    moving = held[(uk, DatasetId("ska", "obs_1400"))]
    assert (moving.state, moving.fraction, moving.transfer, moving.progress) == (
        ReplicaState.REPLICATING,
        0.0,
        Transfer.REPLICATING,
        0.25,
    )
    assert held[(es, DatasetId("ska", "obs_1500"))].transfer is Transfer.STUCK
    partial = held[(Site("SRCNET_CH"), DatasetId("ska", "obs_1300"))]
    assert (partial.fraction, partial.bytes_fraction) == (0.4, 0.4)
    with sqlite3.connect(config.daemon.state_path) as db:
        assert db.execute("SELECT value FROM meta").fetchone() == ("4",)


def test_the_first_cycle_after_upgrading_changes_only_the_ads_whose_lists_change(
    tmp_path: Path,
) -> None:
    config = v1_config(tmp_path)
    inventory = tmp_path / "inventory.toml"
    # one real change: obs_1400 now has half its files at UK_DISK (was replicating there)
    text = inventory.read_text().replace(
        'replicating = { "ska:obs_1400" = 0.25 }', 'partial = { "ska:obs_1400" = 0.5 }'
    )
    inventory.write_text(text)
    service = assemble(
        config,
        sources=[StaticSource("demo", inventory, config.sites)],
        store=SqliteStateStore(config.daemon.state_path),
        publishers=[],
        clock=lambda: V1_WRITTEN + timedelta(seconds=30),  # same DataLocalityUpdated window
    ).service
    before = {site: (ad.view.digest, ad.etag) for site, ad in service.published.ads.items()}
    assert {site: digest for site, (digest, _) in before.items()} == V1_DIGESTS
    report = service.run_cycle()
    assert report.plan is not None and report.outcome == "ok"
    assert report.plan.changed_sites == {"SRCNET_UK"}
    after = {site: (ad.view.digest, ad.etag) for site, ad in service.published.ads.items()}
    assert {site for site in after if after[site] != before[site]} == {"SRCNET_UK"}
    # the stuck entry's progress is new information (1.0 in v1's list form, 0 now): a row
    # changes, no list does
    changed = {(c.site, str(c.dataset)): c.kind.value for c in report.plan.changes}
    assert changed == {
        ("SRCNET_UK", "ska:obs_1400"): "changed",
        ("SRCNET_ES", "ska:obs_1500"): "changed",
    }
    service.close()


# data/state-v2.sqlite: written by the last release of schema 2 (befc475) with its Service on
# data/inventory.toml (source "demo", at T0) and then also data/inventory-extra.toml (source
# "extra", 5 minutes later: SRCNET_CH ska:obs_1234 reported by both, first seen at T0);
# data/show-v2.txt: that release's `hydrator show` of it.
def v2_config(tmp_path: Path) -> Path:
    """The v2 state file, its inventories and a config like the one that wrote them."""
    return old_state_config(tmp_path, "state-v2.sqlite")


def _tables(path: Path) -> dict[str, list[tuple[object, ...]]]:
    """Every table of ``path`` with its columns as SQLite describes them."""
    with sqlite3.connect(path) as db:
        names = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        return {n: db.execute(f"PRAGMA table_xinfo({n})").fetchall() for n in sorted(names)}


def test_a_version_2_state_file_is_migrated_with_every_row_and_time(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = v2_config(tmp_path)
    state_path = tmp_path / "state.sqlite"
    with sqlite3.connect(state_path) as db:
        old_rows = db.execute("SELECT * FROM replicas ORDER BY 1, 2, 3, 4").fetchall()
        old_times = {
            (s, f"{sc}:{n}"): at for s, sc, n, at in db.execute("SELECT * FROM first_seen")
        }
    assert cli_main(["show", "--config", str(config)]) == 0  # a reader of the v2 file
    assert capsys.readouterr().out == (DATA / "show-v2.txt").read_text()
    with sqlite3.connect(state_path) as db:  # a reader migrates nothing
        assert db.execute("SELECT value FROM meta").fetchone() == ("2",)

    store = SqliteStateStore(state_path)
    with sqlite3.connect(state_path) as db:
        assert db.execute("SELECT value FROM meta").fetchone() == ("4",)
        new_rows = db.execute("SELECT * FROM replicas").fetchall()
    assert set(_tables(state_path)) == {"meta", "sources", "replicas", "drains", "storages"}
    assert [row[:-1] for row in new_rows] == old_rows
    assert [row[-1] for row in new_rows] == [old_times[(r[1], f"{r[2]}:{r[3]}")] for r in old_rows]
    assert {(s, str(d)): when.timestamp() for (s, d), when in store.first_seen().items()} == (
        old_times
    )
    assert cli_main(["show", "--config", str(config)]) == 0  # the same ads from version 4
    assert capsys.readouterr().out == (DATA / "show-v2.txt").read_text()


def test_the_schema_2_writer_of_the_benchmark_writes_what_the_release_wrote(
    tmp_path: Path,
) -> None:
    """:func:`tests.support.state_files.downgrade_to_schema_2` (the migration benchmark's, and
    the kill test's, schema-2 files) makes the tables of the real schema-2 file."""
    path = tmp_path / "s.sqlite"
    _saved(path)
    downgrade_to_schema_2(path)
    assert _tables(path) == _tables(DATA / "state-v2.sqlite")


def test_a_migration_that_fails_leaves_the_version_2_file_as_it_was(tmp_path: Path) -> None:
    """A failure after the rows were copied and the old tables dropped (the rename refuses a
    view left broken by the drop) rolls everything back: the file stays version 2, readable."""
    v2_config(tmp_path)
    path = tmp_path / "state.sqlite"
    with sqlite3.connect(path) as db:
        db.execute("CREATE VIEW times AS SELECT * FROM first_seen")
        before = list(db.iterdump())
    expected = SqliteStateStore(path, read_only=True).load()
    times = first_seen(path)
    assert len(times) == len(merged(expected))
    with pytest.raises(StateError, match=r"state database .*: error in view times: .*first_seen"):
        SqliteStateStore(path)
    with sqlite3.connect(path) as db:
        assert list(db.iterdump()) == before
    loaded = SqliteStateStore(path, read_only=True).load()
    assert loaded.sources == expected.sources and first_seen(path) == times
    with sqlite3.connect(path) as db:
        db.execute("DROP VIEW times")
    assert SqliteStateStore(path).first_seen() == times


MIGRATOR = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from hydrator.adapters.state.sqlite import SqliteStateStore
    print("migrating", flush=True)
    SqliteStateStore(Path(sys.argv[1])).close()
    print("done", flush=True)
    """
)


@pytest.mark.parametrize("delay_s", [0.0, 0.05, 0.15])
def test_a_kill_mid_migration_leaves_version_2_or_4_of_the_same_state(
    tmp_path: Path, delay_s: float
) -> None:
    path = tmp_path / "s.sqlite"
    store = SqliteStateStore(path)
    outcome = {"r": snap("r", *(rep(f"S{i % 50}", f"obs{i}") for i in range(60_000)))}
    plan = plan_cycle(State(), outcome, t(0), POLICY)
    store.save(plan)
    store.close()
    downgrade_to_schema_2(path)
    kill_after_start(delay_s, MIGRATOR, "migrating", str(path))
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT value FROM meta").fetchone() in (("2",), ("4",))
    store = SqliteStateStore(path)  # migrated now if it was not
    loaded = store.load()
    assert loaded.sources == plan.state.sources
    assert store.first_seen() == stamped(plan.state, t(0))
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT value FROM meta").fetchone() == ("4",)


def _random_holdings(rng: random.Random, count: int) -> list[Replica]:
    """``count`` replicas over 30 sites and 3 scopes in every form a record takes: complete,
    partial with or without their own bytes share, absent, each with or without a transfer."""
    out: list[Replica] = []
    while len(out) < count:
        dataset = DatasetId(rng.choice(("ska", "ska_low", "x.y")), f"obs_{rng.randrange(10**6)}")
        files = rng.choice((1.0, 0.0, rng.random()))
        made = holding(
            dataset,
            Site(f"S{rng.randrange(30)}"),
            files,
            rng.choice((files, rng.random())),
            transfer=rng.choice(list(Transfer)),
            progress=rng.random(),
        )
        if made is not None:
            out.append(made)
    return out


def test_random_replicas_of_every_form_survive_saves_and_restarts(tmp_path: Path) -> None:
    """10k replicas in all states and transfers from two sources, then a churn (removed,
    changed, added): each save, loaded back, is the plan's state exactly, and a restart
    plans no change."""
    rng = random.Random(15)
    pool = _random_holdings(rng, 12_000)
    a, b = pool[:6000], pool[5000:10_000]  # 1000 (site, dataset) pairs reported by both
    assert {r.state for r in a} == set(ReplicaState) and {r.transfer for r in a} == set(Transfer)
    path = tmp_path / "s.sqlite"
    store = SqliteStateStore(path)
    outcomes = {"a": merged_snapshot("a", a), "b": merged_snapshot("b", b)}
    plan = planned(State(), outcomes, t(0), POLICY).plan
    store.save(plan)
    half = [holding(r.dataset, r.site, 0.5, 0.25) for r in b[:500]]  # changed or new in "a"
    churned = a[1000:] + pool[10_000:] + [r for r in half if r is not None]
    outcomes["a"] = merged_snapshot("a", churned)
    second = planned(plan.state, outcomes, t(1), POLICY).plan
    assert second.changes and store.save(second) > 0
    store.close()

    loaded, as_read = SqliteStateStore(path, read_only=True).load_in_order()
    assert loaded.sources == second.state.sources
    # a pair keeps its first time while any source reports it, changed or not
    old = merged(plan.state)
    times = {k: t(0) if k in old else t(1) for k in merged(second.state)}
    assert first_seen(path) == times
    assert {t(0), t(1)} == set(times.values())
    model = Model.of(loaded, as_read=as_read)  # the loaded state's: the same answers
    assert model.contents == second.contents and model.entries == second.entries
    assert model.entries == len(times)
    again = planned(loaded, outcomes, t(2), POLICY, model=model).plan
    assert again.changes == () and again.source_deltas == {}


def test_a_save_that_fails_midway_leaves_the_saved_state_and_the_store_usable(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.sqlite"
    store = SqliteStateStore(path)
    first = plan_cycle(State(), {"r": snap("r", rep("A", "x"))}, t(0), POLICY)
    store.save(first)
    second = plan_cycle(first.state, {"r": snap("r", rep("A", "x"), rep("A", "y"))}, t(1), POLICY)
    # a record whose detail is no Detail: fails after the row of ska:y (plain) was written
    bad = Replica._make((DatasetId("ska", "z"), Site("A"), ReplicaState.PARTIAL, 0.5, "noon"))
    added = second.source_deltas["r"].added | {bad}
    broken = replace(second, source_deltas={"r": SourceDelta(added=added)})
    with pytest.raises(AttributeError):
        store.save(broken)
    assert SqliteStateStore(path, read_only=True).load().sources == first.state.sources
    assert first_seen(path) == stamped(first.state, t(0))
    assert store.save(second) == 1
    assert first_seen(path) == {
        **stamped(first.state, t(0)),
        (Site("A"), DatasetId("ska", "y")): t(1),
    }


@pytest.mark.parametrize(
    ("sql", "first_seen", "rejected"),
    [
        ("UPDATE replicas SET first_seen = NULL WHERE name = 'y'", {"A/x"}, 0),
        ("UPDATE replicas SET first_seen = 'noon' WHERE name = 'y'", {"A/x"}, 1),
        ("UPDATE replicas SET first_seen = -1e300 WHERE name = 'y'", {"A/x"}, 1),
    ],
)
def test_a_replica_row_without_a_valid_first_seen_time_loads_without_one(
    tmp_path: Path, sql: str, first_seen: set[str], rejected: int
) -> None:
    """A NULL time is no time; an invalid one is counted: the replica loads either way."""
    store, loaded = _loaded_after(tmp_path / "s.sqlite", sql)
    assert store.rejected_rows["first_seen"] == rejected
    times = store.first_seen()
    assert {f"{site}/{d.name}" for site, d in times} == first_seen
    assert times[(Site("A"), DatasetId("ska", "x"))] == t(0)
    assert {(r.site, r.dataset.name) for r in loaded.sources["r"].replicas} == {
        ("A", "x"),
        ("B", "y"),
    }


def test_a_pair_without_a_time_keeps_none_when_its_row_is_written_again(tmp_path: Path) -> None:
    """The rows of a save take their pair's time from the state, none where it has none, also
    when every time the state holds is the same one."""
    path = tmp_path / "s.sqlite"
    _saved(path)
    with sqlite3.connect(path) as db:
        db.execute("UPDATE replicas SET first_seen = NULL WHERE name = 'y'")
    store = SqliteStateStore(path)
    loaded = store.load()
    outcome = {"r": snap("r", rep("A", "x"), rep("B", "y", "partial", 0.25))}
    changed = plan_cycle(loaded, outcome, t(1), POLICY)
    assert [c.kind.value for c in changed.changes] == ["changed"]
    assert store.save(changed) == 2  # y's row deleted and written again
    with sqlite3.connect(path) as db:
        rows = db.execute("SELECT name, fraction, first_seen FROM replicas").fetchall()
    assert rows == [("x", 1.0, t(0).timestamp()), ("y", 0.25, None)]


@pytest.mark.parametrize(("minutes", "loaded_minutes"), [(-5, -5), (5, 0)])
def test_a_pair_whose_rows_hold_several_times_loads_the_earliest(
    tmp_path: Path, minutes: int, loaded_minutes: int
) -> None:
    """Every source's row of a pair is written with the pair's one time; a file edited to
    hold two loads the earliest."""
    at = t(minutes).timestamp()
    sql = INSERT_REPLICA.replace("fraction)", "fraction, first_seen)")
    store, _ = _loaded_after(
        tmp_path / "s.sqlite", sql + f"('q', 'A', 'ska', 'x', 'available', 1.0, {at})"
    )
    assert store.first_seen()[(Site("A"), DatasetId("ska", "x"))] == t(loaded_minutes)
    assert store.first_seen()[(Site("B"), DatasetId("ska", "y"))] == t(0)


def test_two_sources_of_a_pair_write_its_first_time_and_load_it_back(tmp_path: Path) -> None:
    """A pair first seen from one source keeps that time when a second source reports it
    later, in the second source's row too (the pair's time, not the row's)."""
    path = tmp_path / "s.sqlite"
    store = SqliteStateStore(path)
    first = plan_cycle(State(), {"a": snap("a", rep("A", "x")), "b": snap("b")}, t(0), POLICY)
    store.save(first)
    outcomes = {"a": snap("a", rep("A", "x")), "b": snap("b", rep("A", "x", "partial", 0.5))}
    second = plan_cycle(first.state, outcomes, t(1), POLICY)
    assert store.save(second) == 1
    with sqlite3.connect(path) as db:
        rows = db.execute("SELECT source, first_seen FROM replicas").fetchall()
    assert rows == [("a", t(0).timestamp()), ("b", t(0).timestamp())]
    assert first_seen(path) == {(Site("A"), DatasetId("ska", "x")): t(0)}


@pytest.mark.parametrize(
    ("before", "after"),
    [("available", "partial"), ("replicating", "available"), ("stuck", "partial")],
)
def test_a_changed_replica_keeps_its_first_seen_time(
    tmp_path: Path, before: str, after: str
) -> None:
    """A replica whose state changes is written again with its pair's first time."""
    frac = {"partial": 0.5, "replicating": 0.2, "stuck": 0.2}
    path = tmp_path / "s.sqlite"
    store = SqliteStateStore(path)
    first = plan_cycle(
        State(), {"r": snap("r", rep("A", "x", before, frac.get(before, 1.0)))}, t(0), POLICY
    )
    store.save(first)
    outcome = {"r": snap("r", rep("A", "x", after, frac.get(after, 1.0)))}
    second = plan_cycle(first.state, outcome, t(1), POLICY)
    assert [c.kind.value for c in second.changes] == ["changed"] and store.save(second) == 2
    assert first_seen(path) == {(Site("A"), DatasetId("ska", "x")): t(0)}


def test_a_pair_keeps_its_time_while_any_source_reports_it_and_loses_it_after(
    tmp_path: Path,
) -> None:
    """A pair that moves from one source to another in one cycle keeps its first time; once
    no source reports it, it has none, and it is new again when a source reports it later."""
    path = tmp_path / "s.sqlite"
    store = SqliteStateStore(path)
    x, y = (Site("A"), DatasetId("ska", "x")), (Site("A"), DatasetId("ska", "y"))
    cycles = [
        {"a": snap("a", rep("A", "x"), rep("A", "y")), "b": snap("b")},
        {"a": snap("a", rep("A", "y")), "b": snap("b", rep("A", "x", "partial", 0.5))},
        {"a": snap("a", rep("A", "y")), "b": snap("b")},
        {"a": snap("a", rep("A", "y")), "b": snap("b", rep("A", "x"))},
    ]
    expected = [{x: t(0), y: t(0)}, {x: t(0), y: t(0)}, {y: t(0)}, {x: t(3), y: t(0)}]
    state = State()
    for i, outcomes in enumerate(cycles):
        plan = plan_cycle(state, outcomes, t(i), GuardPolicy(drop_min_entries=10))
        store.save(plan)
        assert first_seen(path) == expected[i], i
        state = plan.state
