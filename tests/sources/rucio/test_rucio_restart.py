"""A restart against a real Rucio server: the first fetch hands back the objects the daemon
loaded from its state for every replica that did not change (``FetchContext.previous``), so
loaded and fetched replicas are never both held; what it answers is what a full fetch does.
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest

from hydrator.adapters.sources.rucio import RucioSource
from hydrator.config import parse_config
from hydrator.core.ports import FetchContext
from hydrator.domain import Replica, ReplicaState, Transfer
from hydrator.runtime.service import Service
from hydrator.runtime.wiring import build_service
from tests.support.rucio_server import RucioAdmin, RucioServer, source_config, unique

pytestmark = pytest.mark.rucio


@dataclass(frozen=True)
class Moving:
    """A federation of its own (``fed=tag``): three complete datasets at S, two replicating
    from S to X (their files COPYING at X)."""

    tag: str
    scope: str
    x: str  # the RSE of site X
    moving: list[str]

    def arrive(self, admin: RucioAdmin) -> set[tuple[str, str]]:
        """A file of the first replicating dataset arrives at X; the (site, dataset) moved."""
        files = admin.files(self.scope, self.moving[0])
        admin.set_file_states(self.x, self.scope, files[:1], "A")
        return {(f"SITE-X-{self.tag}", self.moving[0])}


@pytest.fixture()
def moving(rucio_admin: RucioAdmin) -> Moving:
    tag = unique("rs").lower()
    src = rucio_admin.rse(f"SITE-S-{tag}", attributes={"fed": tag})
    x = rucio_admin.rse(f"SITE-X-{tag}", attributes={"fed": tag})
    scope = rucio_admin.scope()
    rucio_admin.many_datasets(scope, 3, src)
    names = [rucio_admin.dataset(scope, 2, at=[src]) for _ in range(2)]
    for name in names:
        rucio_admin.rule(scope, name, src)
        rucio_admin.rule(scope, name, x)
    return Moving(tag, scope, x, names)


def fetch(
    server: RucioServer, tag: str, previous: frozenset[Replica] | None = None
) -> set[Replica]:
    """The answer of a new source (a restarted daemon's) on the federation ``fed=tag``."""
    source = RucioSource(source_config(server, rse_expression=f"fed={tag}"), {})
    held = {} if previous is None else {"rucio": previous}
    try:
        return set(source.fetch(FetchContext(now=datetime.now(UTC), previous=held)).replicas)
    finally:
        source.close()


def assert_kept(
    held: AbstractSet[Replica], now: AbstractSet[Replica], moved: set[tuple[str, str]]
) -> None:
    """Every replica of ``now`` outside the ``moved`` pairs is ``held``'s very object, the
    others are new objects; at least one kept replica is not a plain complete one."""
    changed = {r for r in now if (r.site, r.dataset.name) in moved}
    assert changed and all(r is not o for r in changed for o in held)
    ids = {r.dataset: r.dataset for r in held}  # one object per dataset: the held one
    assert all(ids[r.dataset] is r.dataset for r in changed)
    same = {r: r for r in held}
    unchanged = set(now) - changed
    assert len(unchanged) == 6 and all(same[r] is r for r in unchanged)
    assert any(r.transfer is Transfer.REPLICATING for r in unchanged)


def test_a_restarted_source_keeps_the_held_object_of_each_unchanged_replica(
    rucio_admin: RucioAdmin, rucio_server: RucioServer, moving: Moving
) -> None:
    held = frozenset(fetch(rucio_server, moving.tag))
    moved = moving.arrive(rucio_admin)  # while the daemon was down

    answer = fetch(rucio_server, moving.tag, previous=held)
    assert answer == fetch(rucio_server, moving.tag)  # what a full fetch answers
    assert [(r.state, r.fraction, r.transfer) for r in answer - held] == [
        (ReplicaState.PARTIAL, 0.5, Transfer.REPLICATING)
    ]
    assert_kept(held, answer, moved)


def service_for(server: RucioServer, tag: str, state_dir: Path) -> Service:
    source = source_config(server, rse_expression=f"fed={tag}")
    config = parse_config(
        {
            "daemon": {"state_path": str(state_dir / "state.sqlite")},
            "sources": [source.model_dump(mode="json", exclude_none=True)],
        },
        state_dir,
    )
    return build_service(config)


def test_the_cycle_after_a_restart_keeps_the_replicas_loaded_from_the_state(
    rucio_admin: RucioAdmin, rucio_server: RucioServer, moving: Moving, tmp_path: Path
) -> None:
    service = service_for(rucio_server, moving.tag, tmp_path)
    assert service.run_cycle().outcome == "ok"
    service.close()
    moved = moving.arrive(rucio_admin)

    restarted = service_for(rucio_server, moving.tag, tmp_path)
    loaded = restarted.state.sources["rucio"].replicas  # read back from the SQLite file
    try:
        report = restarted.run_cycle()
        assert report.outcome == "ok" and report.plan is not None
        assert len(report.plan.changes) == 1
        assert_kept(loaded, restarted.state.sources["rucio"].replicas, moved)
    finally:
        restarted.close()
