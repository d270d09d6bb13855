"""The state store alone: first save, load, churn save, and a schema-2 migration.

``python -m benchmarks.state_store --replicas 1000000 [--json out.json] [--dir DIR]`` builds
the generated federation of :mod:`benchmarks.generate` (one source), plans its first cycle from
an empty state and times, in seconds (wall clock; ``*_cpu_s`` the process's CPU seconds):

``first_save_s``       :meth:`SqliteStateStore.save` of that first cycle (every replica new)
``load_s``             a restarted writer's :meth:`SqliteStateStore.load` of that file
``churn_save_s``       the save of a cycle after 1 % churn
``migrate_2_to_3_s``   opening (as a writer) a schema-2 copy of the same state: the upgrade to
                       schema 3 in one transaction (:func:`downgrade_to_schema_2` writes it)
``load_migrated_s``    the load after that upgrade; ``same_after_migration`` checks it equals
                       the state the schema-3 file holds

Single runs (not medians) on whatever else the machine runs: ``load_average`` says how busy it
was. The files go to a temporary directory unless ``--dir`` is given (1M replicas: ~140 MB).
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import TypeVar

from benchmarks.conditions import emit
from benchmarks.generate import SOURCE, Federation, Scale
from hydrator.adapters.state.sqlite import SqliteStateStore
from hydrator.core.plan import GuardPolicy, plan_cycle
from hydrator.domain import State
from hydrator.runtime.memory import collector_paused
from tests.support.state_files import downgrade_to_schema_2

T = TypeVar("T")
T0 = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


def timed(call: Callable[[], T], into: dict[str, object], name: str) -> T:
    """``call()``, its wall-clock and CPU seconds put in ``into`` as ``<name>_s`` and
    ``<name>_cpu_s``, run as the daemon runs its startup and cycles: without garbage-collector
    passes (:func:`~hydrator.runtime.memory.collector_paused`; its one pass after is untimed)."""
    with collector_paused():
        wall, cpu = time.perf_counter(), time.process_time()
        result = call()
        into[f"{name}_s"] = time.perf_counter() - wall
        into[f"{name}_cpu_s"] = time.process_time() - cpu
    return result


def run(replicas: int, workdir: Path) -> dict[str, object]:
    figures: dict[str, object] = {"replicas": replicas}
    federation = Federation(Scale(replicas=replicas))
    path = workdir / "state.sqlite"
    first = plan_cycle(State(), {SOURCE: federation.snapshot()}, T0, GuardPolicy())
    store = SqliteStateStore(path)
    timed(partial(store.save, first), figures, "first_save")
    store.close()
    del first
    store = SqliteStateStore(path)
    loaded = timed(store.load, figures, "load")
    federation.churn()
    later = T0 + timedelta(minutes=1)
    churned = plan_cycle(loaded, {SOURCE: federation.snapshot()}, later, GuardPolicy())
    timed(partial(store.save, churned), figures, "churn_save")
    store.close()
    del loaded
    saved = churned.state
    del churned
    old = workdir / "state-v2.sqlite"
    shutil.copy(path, old)
    downgrade_to_schema_2(old)
    migrating = timed(partial(SqliteStateStore, old), figures, "migrate_2_to_3")
    migrated = timed(migrating.load, figures, "load_migrated")
    times = SqliteStateStore(path, read_only=True)
    figures["same_after_migration"] = (
        migrated.sources == saved.sources and migrating.first_seen() == times.first_seen()
    )
    times.close()
    migrating.close()
    figures["file_mib"] = path.stat().st_size / 2**20
    figures["load_average"] = os.getloadavg()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=100_000)
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--dir", type=Path, help="keep the files here (default: temporary)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        if args.dir is not None:
            args.dir.mkdir(parents=True, exist_ok=True)
        figures = run(args.replicas, args.dir or Path(workdir))
    emit(figures, args.json)


if __name__ == "__main__":
    main()
