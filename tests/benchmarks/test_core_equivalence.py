"""The contract of :mod:`hydrator.core.model`: the model's answers equal the plain computation.

``plan_cycle`` derives the merged view, the changes and the site views through the previous
state's :class:`~hydrator.core.model.Model` and the sources' deltas. The model is read through
its public entry, and what it built but no answer shows (its indexes) through its one
test-facing accessor, ``built_for_tests``. Here random cycle
sequences (several sources, failures, sources dropped, sites appearing and vanishing) are
checked against the straightforward definition:
merge every source's replicas, diff everything, rebuild every site. Each plan is saved, and
the first-seen times the store derives from the saves are checked against their definition:
a pair keeps the time of the cycle that first saw it while any source reports it.
"""

from __future__ import annotations

import shutil
import tempfile
from collections import Counter
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hydrator.adapters.state.sqlite import SqliteStateStore
from hydrator.core.index import Index, merge_replicas, merged_snapshot
from hydrator.core.model import Model
from hydrator.core.plan import GuardPolicy, planned
from hydrator.core.presence import holding
from hydrator.core.views import site_contents
from hydrator.domain import (
    ChangeKind,
    DatasetId,
    Site,
    Snapshot,
    SourceFailure,
    SourceOutcome,
    State,
    Transfer,
)
from tests.unit.factories import by_key, flat, t

POLICY = GuardPolicy(max_drop_fraction=0.5, drop_min_entries=4, accept_drop_after_cycles=2)
SITES = [Site(s) for s in ("A", "B", "C")]
DATASETS = [DatasetId(scope, name) for scope in ("ska", "lsst") for name in ("x", "y", "z")]

replicas = st.builds(
    holding,
    st.sampled_from(DATASETS),
    st.sampled_from(SITES),
    st.sampled_from([0.0, 0.25, 0.5, 1.0]),  # files present
    st.sampled_from([0.0, 0.3, 1.0]),  # bytes present
    transfer=st.sampled_from(list(Transfer)),
    progress=st.sampled_from([0.0, 0.5]),
).filter(lambda r: r is not None)
snapshots = st.builds(
    lambda name, rs, sites: merged_snapshot(name, rs, sites=sites),
    st.just(""),
    st.lists(replicas, max_size=12),
    st.lists(st.sampled_from(SITES), max_size=2),
)
outcome = st.one_of(snapshots, st.just(None))  # None: the source failed
cycles = st.lists(
    st.dictionaries(st.sampled_from(["r", "d", "s"]), outcome, max_size=3), min_size=1, max_size=6
)


def full_merge(state: State) -> Index:
    ordered = [state.sources[n] for n in sorted(state.sources)]
    return merge_replicas(r for s in ordered for r in s.replicas)


def as_outcomes(
    raw: Mapping[str, Snapshot | None], state: State, reuse: bool
) -> dict[str, SourceOutcome]:
    """The cycle's answers; with ``reuse``, as a source that keeps its answer by pair hands
    them: last cycle's very objects where a replica is unchanged, in a set passed as is."""
    out: dict[str, SourceOutcome] = {}
    for name, snap in raw.items():
        if snap is None:
            out[name] = SourceFailure(name, "down")
        elif reuse:
            kept = state.sources[name].replicas if name in state.sources else frozenset()
            held = {r: r for r in kept}
            same = frozenset(held.get(r, r) for r in snap.replicas)
            out[name] = Snapshot.of(name, same, sites=snap.sites)
        else:
            out[name] = merged_snapshot(name, snap.replicas, sites=snap.sites)
    return out


@pytest.fixture(scope="module")
def empty_state(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new state file, copied for each example (cheaper than creating one)."""
    path = tmp_path_factory.mktemp("state") / "empty.sqlite"
    SqliteStateStore(path).close()
    return path


@settings(max_examples=300, deadline=None)
@given(sequence=cycles, reuse=st.booleans())
def test_incremental_views_equal_a_full_recomputation(
    empty_state: Path, sequence: list[dict[str, Snapshot | None]], reuse: bool
) -> None:
    with tempfile.TemporaryDirectory() as workdir:
        path = Path(workdir) / "s.sqlite"
        shutil.copy(empty_state, path)
        store = SqliteStateStore(path)
        try:
            check_cycles(sequence, reuse, store)
        finally:
            store.close()


def check_cycles(
    sequence: list[dict[str, Snapshot | None]], reuse: bool, store: SqliteStateStore
) -> None:
    state, first_seen = State(), dict[tuple[Site, DatasetId], datetime]()
    held = Model.of(state)  # carried from plan to plan, as the service does
    for i, raw in enumerate(sequence):
        before = flat(full_merge(state))
        plan, memo = planned(state, as_outcomes(raw, state, reuse), t(i), POLICY, model=held)
        model = Model.of(plan.state, memo)  # the memo planned returns: the core's model
        merged = full_merge(plan.state)
        built = model.built_for_tests()  # not asked for: asking builds what a plan may skip
        assert built.merged is None or built.merged == merged
        after = flat(merged)
        assert model.entries == len(after)
        expected = sorted(
            (k, "added" if k not in before else "removed" if k not in after else "changed")
            for k in before.keys() | after.keys()
            if before.get(k) != after.get(k)
        )
        assert [((c.site, c.dataset), c.kind.value) for c in plan.changes] == expected
        assert all(c.kind is not ChangeKind.CHANGED or c.old != c.new for c in plan.changes)
        assert all(c.new == after.get((c.site, c.dataset)) for c in plan.changes)
        kinds = Counter(c.kind for c in plan.changes)
        assert plan.changes.counts == kinds and len(plan.changes) == len(expected)
        covered = frozenset(s for source in plan.state.sources.values() for s in source.sites)
        rebuilt = site_contents(merged, covered)
        assert model.contents == rebuilt
        assert list(model.contents) == list(rebuilt)
        for name, index in built.indexes.items():  # built only where several sources merge
            if index is None:
                continue
            replicas = plan.state.sources[name].replicas
            assert index == by_key(replicas), name
            # one object per replica, to save memory: the index holds the set's own objects
            assert all(index[r.site][r.dataset] is r for r in replicas), name
        store.save(plan)
        first_seen = {k: first_seen.get(k, t(i)) for k in after}
        assert store.first_seen() == first_seen
        state, held = plan.state, model
