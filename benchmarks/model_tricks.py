"""The tricks of ``hydrator/core/model.py`` against the plain code, in one run.

``python -m benchmarks model-tricks --replicas 1000000 --repetitions 7 [--json out.json]``
builds the generated federation of :mod:`benchmarks.generate` (one source, 50 sites), its
answer before and after one churn (1 %) and the source's delta between them
(:meth:`Model.delta <hydrator.core.model.Model.delta>`), then times, wall seconds, each pair
of variants alternately (the plain one first in odd repetitions, second in even ones), each
call without garbage-collector passes as the daemon runs its cycles
(:func:`~hydrator.runtime.memory.collector_paused`):

``site_counts``  the per-site counts the site guard reads: the model's, last cycle's counts
                 patched by the delta (``model_patch.recounted``), against recounting them from the
                 replicas (``Counter(map(site_of, replicas))``, the model's first build);
                 context: ``plan_churn_s``, the whole churn plan of that source with the
                 memo carried (:func:`~hydrator.core.plan.planned`), the loop they are in
``site_views``   the churn's touched sites' views patched by its changes, as the model does
                 (``model_patch.patched_view`` per touched site, from the views before the
                 churn), against rebuilding those sites' views from the replicas
                 (``views_of`` over the source's set, what a one-source model builds from);
                 with ``touched_sites`` and ``changes``
``index_of``     the model's ``index_of`` (fields read by name, ``attribute``) against the
                 same loop reading them by position (``positional``, the trick it dropped)
``views_of``     the model's ``views_of`` (by name; available replicas with no detail, most
                 of them, appended straight to their list: ``attribute``) against the same
                 loop with every replica through ``SiteLists.add`` (``no_shortcut``) and
                 against it read by position (``positional``, the trick it dropped)
``one_source_index``  a one-source model holds no index: the bytes an index of the churned
                 answer takes (``index_bytes``, tracemalloc, the replicas already held), and
                 the plans timed without an index (the model's) against with one, as several
                 sources carry it (the plan, then the index built: ``first_plan``; the churn
                 plan, then the index patched by its delta: ``churn_plan``)
``identity_reuse``  the answer's own objects kept: the delta of last cycle's very set
                 (``same_set``, ``before is after``) against the two set differences of the
                 code without that test (``differences``) and against an equal answer of new
                 objects (``new_objects``); several sources' index patched by a delta whose
                 answer holds the held objects (``patch``) against built afresh
                 (``rebuild``); and the bytes the daemon would hold more without it, a
                 second object a replica (``second_object_bytes``) and a second set
                 (``second_set_bytes``), tracemalloc
``first_changes``  a first cycle's changes made only while iterated: counted
                 (``Changes.all_added``, ``lazy``) against every change built and held
                 (``built``), time alternately and the bytes held (tracemalloc)

Each figure: every repetition's seconds, the median and the max; ``saving_pct`` has, for
each trick against the code without it (``<trick>_vs_<without>``), the saving of the
median, in % of the median without it. The machine, its load averages before and after, and
the code's commit are recorded (:func:`benchmarks.conditions.machine`). The model's
functions are imported by their private names (its patch helpers from
:mod:`hydrator.core.model_patch`): this scenario measures exactly the code the model runs.
"""

from __future__ import annotations

import argparse
import subprocess
import time
import tracemalloc
from collections import Counter
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from statistics import median
from typing import Any

from benchmarks.conditions import emit, machine
from benchmarks.generate import SOURCE, Federation, Scale
from hydrator.core.changes import Changes
from hydrator.core.index import Index
from hydrator.core.model import Model, index_of, views_of
from hydrator.core.model_patch import holds_objects_of, patched_index, patched_view, recounted
from hydrator.core.plan import GuardPolicy, planned
from hydrator.core.views import SiteLists
from hydrator.domain import (
    Change,
    Replica,
    ReplicaState,
    Site,
    SiteView,
    Snapshot,
    State,
    site_of,
)
from hydrator.runtime.memory import collector_paused

T0 = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
ROOT = Path(__file__).resolve().parents[1]


def index_by_position(replicas: Iterable[Replica]) -> Index:
    """``index_of``'s loop reading the replica's fields by position."""
    index: Index = {}
    at_site = index.get
    for replica in replicas:
        found = at_site(replica[1])
        if found is None:
            found = index[replica[1]] = {}
        found[replica[0]] = replica
    return index


def views_by_position(replicas: Iterable[Replica], sites: frozenset[Site]) -> dict[Site, SiteView]:
    """``views_of``'s loop by position, available replicas with no detail (most) appended
    straight to their list."""
    lists = {site: SiteLists() for site in sites}
    at_site, available = lists.get, ReplicaState.AVAILABLE
    for replica in replicas:
        found = at_site(replica[1])
        if found is None:
            continue
        if replica[2] is available and replica[4] is None:
            found.available.append(replica[0])
        else:
            found.add(replica[0], replica)
    return {site: lists[site].view(site) for site in sorted(sites)}


def views_without_shortcut(
    replicas: Iterable[Replica], sites: frozenset[Site]
) -> dict[Site, SiteView]:
    """``views_of``'s loop with every replica through :meth:`SiteLists.add`."""
    lists = {site: SiteLists() for site in sites}
    at_site = lists.get
    for replica in replicas:
        found = at_site(replica.site)
        if found is not None:
            found.add(replica.dataset, replica)
    return {site: lists[site].view(site) for site in sorted(sites)}


def timed(call: Callable[[], object]) -> float:
    """Wall seconds of ``call()``, without collector passes (the one pass after is untimed)."""
    with collector_paused():
        start = time.perf_counter()
        call()
        return time.perf_counter() - start


def held_bytes(call: Callable[[], object]) -> dict[str, int]:
    """The bytes that ``call()``'s result holds once made (``held``), and the most allocated
    while it was made (``peak``), beyond what was allocated before: tracemalloc, which
    counts Python's own allocations (the objects, sets and dicts), not the C heap's slack."""
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        result = call()
        held, peak = tracemalloc.get_traced_memory()
        del result
    finally:
        tracemalloc.stop()
    return {"held": held - base, "peak": peak - base}


def copies(replicas: Iterable[Replica]) -> frozenset[Replica]:
    """Equal replicas made of new objects (as a source that builds its answer every fetch
    hands over); their fields stay shared, as equal strings from one parse would not be."""
    return frozenset(tuple.__new__(Replica, tuple(r)) for r in replicas)


def summary(runs: list[float]) -> dict[str, Any]:
    return {"runs": runs, "median": median(runs), "max": max(runs)}


def compare(
    variants: dict[str, Callable[[], object]], repetitions: int, tricks: list[tuple[str, str]]
) -> dict[str, Any]:
    """Each variant timed ``repetitions`` times, the order reversed every other repetition;
    ``saving_pct`` of each (trick, without it) pair of ``tricks`` (by median)."""
    runs: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for i in range(repetitions):
        for name in names if i % 2 == 0 else reversed(names):
            runs[name].append(timed(variants[name]))
    out: dict[str, Any] = {f"{name}_s": summary(r) for name, r in runs.items()}
    out["saving_pct"] = {
        f"{trick}_vs_{plain}": round(100.0 * (1.0 - median(runs[trick]) / median(runs[plain])), 2)
        for trick, plain in tricks
    }
    return out


def commit() -> str:
    """The worktree's commit (``+dirty`` when it differs), or ``unknown``."""
    found = subprocess.run(
        ["git", "-C", str(ROOT), "describe", "--always", "--dirty=+dirty", "--abbrev=12"],
        capture_output=True,
        text=True,
        check=False,
    )
    return found.stdout.strip() or "unknown"


def run(replicas: int, repetitions: int) -> dict[str, Any]:
    figures: dict[str, Any] = {
        "scenario": "model-tricks",
        "replicas": replicas,
        "repetitions": repetitions,
        "code": commit(),
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine_before": machine(),
    }
    federation = Federation(Scale(replicas=replicas))
    first = federation.snapshot()
    before = first.replicas
    sites = frozenset(first.sites)
    plan, memo = planned(State(), {SOURCE: first}, T0, GuardPolicy())
    state, views = plan.state, dict(plan.contents)
    del plan
    federation.churn()
    churned = federation.snapshot()
    after = churned.replicas
    delta = Model.of(state, memo).delta(SOURCE, after)
    figures["sites"] = len(sites)
    figures["delta"] = {"added": len(delta.added), "removed": len(delta.removed)}
    counts = Counter(map(site_of, before))
    assert recounted(counts, delta) == Counter(map(site_of, after)), "patched != recounted"
    later = T0 + timedelta(minutes=1)
    figures["site_counts"] = compare(
        {
            "recount": lambda: Counter(map(site_of, after)),
            "patch": lambda: recounted(counts, delta),
        },
        repetitions,
        [("patch", "recount")],
    )
    churn_plan = partial(planned, state, {SOURCE: churned}, later, GuardPolicy(), model=memo)
    figures["plan_churn_s"] = summary([timed(churn_plan) for _ in range(repetitions)])
    churned_plan, _ = churn_plan()
    touched: dict[Site, list[Change]] = {}
    for change in churned_plan.changes:
        touched.setdefault(change.site, []).append(change)
    touched_sites = frozenset(touched)

    def patch() -> dict[Site, SiteView]:
        return {site: patched_view(views[site], found) for site, found in touched.items()}

    patched = patch()
    assert patched == views_of(after, touched_sites), "patched != rebuilt"
    assert patched == {site: churned_plan.contents[site] for site in touched}
    del churned_plan
    figures["site_views"] = {
        "touched_sites": len(touched),
        "changes": sum(map(len, touched.values())),
        **compare(
            {"rebuild": lambda: views_of(after, touched_sites), "patch": patch},
            repetitions,
            [("patch", "rebuild")],
        ),
    }
    assert index_of(after) == index_by_position(after)
    figures["index_of"] = compare(
        {"attribute": lambda: index_of(after), "positional": lambda: index_by_position(after)},
        repetitions,
        [("positional", "attribute")],
    )
    assert views_of(after, sites) == views_without_shortcut(after, sites)
    assert views_by_position(after, sites) == views_without_shortcut(after, sites)
    figures["views_of"] = compare(
        {
            "no_shortcut": lambda: views_without_shortcut(after, sites),
            "attribute": lambda: views_of(after, sites),
            "positional": lambda: views_by_position(after, sites),
        },
        repetitions,
        [("attribute", "no_shortcut"), ("positional", "attribute")],
    )
    figures.update(later_tricks(first, churned, state, memo, repetitions))
    figures["ended"] = datetime.now(UTC).isoformat(timespec="seconds")
    figures["machine_after"] = machine()
    return figures


def later_tricks(
    first: Snapshot, churned: Snapshot, state: State, memo: Model, repetitions: int
) -> dict[str, Any]:
    """The three tricks whose figure had no measurement against the plain code: a one-source
    model without an index, identity reuse and a first cycle's changes made while iterated."""
    before, after = first.replicas, churned.replicas
    later = T0 + timedelta(minutes=1)
    delta = Model.of(state, memo).delta(SOURCE, after)
    count = len(after)
    out: dict[str, Any] = {}

    first_plan = partial(planned, State(), {SOURCE: first}, T0, GuardPolicy())
    churn_plan = partial(planned, state, {SOURCE: churned}, later, GuardPolicy(), model=memo)
    index = index_of(before)
    # the churn's answer made of the held objects where unchanged, as a source keeping its
    # answer between fetches hands over: an index of several sources is patched then
    reusing = (before - delta.removed) | delta.added
    assert reusing == after and holds_objects_of(index, delta, reusing)
    assert patched_index(index, delta) == index_of(reusing)

    def churn_with_index() -> object:
        churn_plan()
        return patched_index(index, delta) if holds_objects_of(index, delta, reusing) else None

    index_bytes = held_bytes(lambda: index_of(after))
    out["one_source_index"] = {
        "index_bytes": index_bytes,
        "index_bytes_per_replica": round(index_bytes["held"] / count, 2),
        "first_plan": compare(
            {
                "without_index": first_plan,
                "with_index": lambda: (first_plan(), index_of(first.replicas)),
            },
            repetitions,
            [("without_index", "with_index")],
        ),
        "churn_plan": compare(
            {"without_index": churn_plan, "with_index": churn_with_index},
            repetitions,
            [("without_index", "with_index")],
        ),
    }

    held_set = state.sources[SOURCE].replicas
    copies_of_state = copies(held_set)
    assert copies_of_state == held_set and Model.of(state, memo).delta(SOURCE, held_set) == (
        Model.of(state, memo).delta(SOURCE, copies_of_state)
    )
    second_object = held_bytes(lambda: copies(after))  # the objects and their set
    second_set = held_bytes(lambda: frozenset(iter(after)))  # frozenset(after) is after
    out["identity_reuse"] = {
        "second_object_bytes": second_object,
        "second_set_bytes": second_set,
        "second_object_bytes_per_replica": round(
            (second_object["held"] - second_set["held"]) / count, 2
        ),
        "second_set_bytes_per_replica": round(second_set["held"] / count, 2),
        "delta": compare(
            {
                "same_set": lambda: Model.of(state, memo).delta(SOURCE, held_set),
                "differences": lambda: (held_set - held_set, held_set - held_set),
                "new_objects": lambda: Model.of(state, memo).delta(SOURCE, copies_of_state),
            },
            repetitions,
            [("same_set", "differences"), ("same_set", "new_objects")],
        ),
        "index": compare(
            {"rebuild": lambda: index_of(reusing), "patch": lambda: patched_index(index, delta)},
            repetitions,
            [("patch", "rebuild")],
        ),
    }

    lazy = Changes.all_added(first.replicas)
    assert Changes(lazy) == lazy
    lazy_bytes = held_bytes(lambda: len(Changes.all_added(first.replicas)))
    built_bytes = held_bytes(lambda: Changes(Changes.all_added(first.replicas)))
    out["first_changes"] = {
        "changes": len(lazy),
        "lazy_bytes": lazy_bytes,
        "built_bytes": built_bytes,
        "built_bytes_per_change": round(built_bytes["held"] / len(lazy), 2),
        **compare(
            {
                "lazy": lambda: len(Changes.all_added(first.replicas)),
                "built": lambda: len(Changes(Changes.all_added(first.replicas))),
            },
            repetitions,
            [("lazy", "built")],
        ),
    }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=1_000_000)
    parser.add_argument("--repetitions", type=int, default=7)
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()
    if args.replicas < 1 or args.repetitions < 1:
        parser.error("--replicas and --repetitions must be at least 1")
    figures = run(args.replicas, args.repetitions)
    emit(figures, args.json)


if __name__ == "__main__":
    main()
