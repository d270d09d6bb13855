"""The fast paths outside ``core/model.py`` against the plain code they replace, in one run.

``python -m benchmarks fast-paths --site-datasets 100000 --ids 1000000 --replicas 1000000
--repetitions 7 [--json out.json]`` times, wall seconds, each trick and its plain code
alternately (the order reversed every other repetition), each call without
garbage-collector passes as the daemon runs its cycles, and counts bytes with tracemalloc
(Python's own allocations, not the C heap's slack):

``render``     ``core/render.py`` ``safe_names``: one regex over ``scope:name`` built inline
               (``one_pattern``) against a regex for the scope and one for the name and then
               ``str(d)`` (``two_patterns``, the code it replaced), over the four lists of one
               site of ``--site-datasets`` datasets (``names``), and the whole site ad
               (``site_classad``) with either
``intern``     ``domain.py`` ``DatasetId``: the scope interned (``interned``) against kept as
               parsed (``plain``, :class:`NotInterned`: the same construction without
               ``sys.intern``), for ``--ids`` ids made from a parsed JSON answer (every
               scope string a separate object, as ``json`` parsing gives): the bytes the ids
               hold once the answer is dropped, the time to make them (``make``), and the time
               to compare an equal answer's ids with them as a set (``compare``)
``towards``    ``core/presence.py`` ``RuleTransfers``: a dataset's rule transfers as a tuple
               scanned by :func:`~hydrator.core.presence.towards` (``tuples``) against a dict
               per dataset (``dicts``, the code it replaced), for the rules of the generated
               federation at ``--replicas`` (one rule towards each replicating or stuck
               replica's site): the map's bytes, the time to build it (``build``) and one
               lookup for every replica's (dataset, site) pair, as settling a first fetch does
               (``lookups``)
``json``       ``runtime/http_endpoint.py``'s served files: compact JSON, the C encoder
               (``compact``), against ``indent=1`` (``indent``, the code it replaced, the
               pure-Python encoder) and default separators (``default_separators``, the C
               encoder too) for the site of ``render``; ``file`` adds the document's making
               (``site_json``) to each, the whole of a changed site's file

Each figure: every repetition's seconds, the median and the max; ``saving_pct`` has, for
each trick against the code without it (``<trick>_vs_<without>``), the saving of the
median, in % of the median without it (of bytes, for ``bytes``). The machine, its load
averages before and after, and the code's commit are recorded
(:func:`benchmarks.conditions.machine`).
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any
from unittest import mock

from benchmarks.conditions import emit, machine
from benchmarks.generate import SCOPES, Federation, Scale
from benchmarks.model_tricks import commit, compare, held_bytes
from hydrator.config import ClassAdConfig
from hydrator.core import render
from hydrator.core.model import views_of
from hydrator.core.presence import (
    SiteTransfer,
    merge_transfers,
    rule_transfers,
    towards,
)
from hydrator.domain import DatasetId, Site, SiteView, Transfer
from hydrator.names import NAME_PATTERN, SCOPE_PATTERN, InvalidNameError
from hydrator.runtime.http_endpoint import site_file_bytes
from hydrator.runtime.json_views import site_json

T0 = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
ATTRS = ClassAdConfig()
log = logging.getLogger(__name__)


def saving(trick: float, plain: float) -> float:
    """``trick`` against ``plain``: the saving in % of ``plain``."""
    return round(100.0 * (1.0 - trick / plain), 2)


# -- render: safe_names ----------------------------------------------------------------------


def safe_names_two_patterns(datasets: Iterable[DatasetId]) -> list[str]:
    """``safe_names`` as it was: the scope's and the name's regex, then ``str(d)``."""
    out: list[str] = []
    for d in datasets:
        if SCOPE_PATTERN.fullmatch(d.scope) and NAME_PATTERN.fullmatch(d.name):
            out.append(str(d))
        else:
            log.error("refusing to render invalid dataset name %r", str(d))
    return out


def site_of_size(datasets: int) -> SiteView:
    """One site holding ``datasets`` datasets in the generated federation's mix of states."""
    federation = Federation(Scale(replicas=datasets, sites=1, datasets=datasets))
    snapshot = federation.snapshot()
    (site,) = snapshot.sites
    return replace(views_of(snapshot.replicas, frozenset({site}))[site], updated=T0)


def every_list(view: SiteView, names: Callable[[Iterable[DatasetId]], list[str]]) -> object:
    """``names`` over the site's lists, as ``site_classad`` calls ``safe_names``."""
    return (
        names(view.available),
        names(d for d, _ in view.partial),
        names(d for d, _ in view.replicating),
        names(view.stuck),
    )


def render_part(view: SiteView, repetitions: int) -> dict[str, Any]:
    assert every_list(view, render.safe_names) == every_list(view, safe_names_two_patterns)

    def classad_two_patterns() -> object:
        with mock.patch.object(render, "safe_names", safe_names_two_patterns):
            return render.site_classad(view, ATTRS)

    with mock.patch.object(render, "safe_names", safe_names_two_patterns):
        plain_text = render.site_classad(view, ATTRS).printOld()
    assert render.site_classad(view, ATTRS).printOld() == plain_text
    trick = [("one_pattern", "two_patterns")]
    return {
        "datasets": sum(map(len, (view.available, view.partial, view.replicating, view.stuck))),
        "lists": {
            "available": len(view.available),
            "partial": len(view.partial),
            "replicating": len(view.replicating),
            "stuck": len(view.stuck),
        },
        "names": compare(
            {
                "two_patterns": lambda: every_list(view, safe_names_two_patterns),
                "one_pattern": lambda: every_list(view, render.safe_names),
            },
            repetitions,
            trick,
        ),
        "site_classad": compare(
            {
                "two_patterns": classad_two_patterns,
                "one_pattern": lambda: render.site_classad(view, ATTRS),
            },
            repetitions,
            trick,
        ),
    }


# -- intern: DatasetId's scope ---------------------------------------------------------------


class NotInterned(DatasetId):
    """:class:`DatasetId` made as it was: the same checks and the same call path (a class
    whose ``__new__`` is a Python method), the scope kept as given."""

    __slots__ = ()

    def __new__(cls, scope: str, name: str) -> NotInterned:
        if not isinstance(scope, str) or not SCOPE_PATTERN.fullmatch(scope):
            raise InvalidNameError("invalid dataset scope")
        if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
            raise InvalidNameError("invalid dataset name")
        return tuple.__new__(cls, (scope, name))


def answer_text(ids: int) -> str:
    """A parsed catalogue answer's text: ``ids`` rows of ``scope`` and ``name``."""
    rows = [
        {"scope": SCOPES[i % len(SCOPES)], "name": f"obs_{i:07d}", "bytes": 1000 + i}
        for i in range(ids)
    ]
    return json.dumps(rows)


def made(rows: list[dict[str, Any]], make: Callable[[str, str], DatasetId]) -> list[DatasetId]:
    return [make(row["scope"], row["name"]) for row in rows]


def parsed_and_made(text: str, make: Callable[[str, str], DatasetId]) -> list[DatasetId]:
    """The ids of the answer ``text``, the parsed answer dropped once they are made."""
    return made(json.loads(text), make)


def equal_as_sets(held: frozenset[DatasetId], new: list[DatasetId]) -> bool:
    return held == frozenset(new)


def intern_part(ids: int, repetitions: int) -> dict[str, Any]:
    text = answer_text(ids)
    rows, again = json.loads(text), json.loads(text)
    if ids > len(SCOPES):  # json gives each row its own string (it memoizes only keys)
        assert rows[0]["scope"] == rows[len(SCOPES)]["scope"]
        assert rows[0]["scope"] is not rows[len(SCOPES)]["scope"]
    variants: dict[str, Callable[[str, str], DatasetId]] = {
        "plain": NotInterned,
        "interned": DatasetId,
    }
    assert made(rows, DatasetId) == made(rows, NotInterned)
    assert made(rows, DatasetId)[-1][0] is made(again, DatasetId)[-1][0]
    assert made(rows, NotInterned)[-1][0] is not made(again, NotInterned)[-1][0]
    out: dict[str, Any] = {"ids": ids, "scopes": len(SCOPES)}
    held = {
        name: held_bytes(partial(parsed_and_made, text, make)) for name, make in variants.items()
    }
    out["bytes"] = held
    out["bytes_per_id"] = {name: round(b["held"] / ids, 2) for name, b in held.items()}
    out["bytes_saving_pct"] = saving(held["interned"]["held"], held["plain"]["held"])
    out["make"] = compare(
        {name: partial(made, rows, make) for name, make in variants.items()},
        repetitions,
        [("interned", "plain")],
    )
    sets = {name: frozenset(made(rows, make)) for name, make in variants.items()}
    news = {name: made(again, make) for name, make in variants.items()}
    out["compare"] = compare(
        {name: partial(equal_as_sets, sets[name], news[name]) for name in variants},
        repetitions,
        [("interned", "plain")],
    )
    return out


# -- towards: a dataset's rule transfers -----------------------------------------------------


@dataclass(frozen=True)
class BenchRule:
    """A rule as :func:`rule_transfers` reads it."""

    expression: str
    transfer: Transfer
    progress: float


def rule_transfers_as_dict(
    rules: Iterable[BenchRule], resolved: Mapping[str, frozenset[str]], sites: Mapping[str, Site]
) -> dict[Site, SiteTransfer]:
    """``rule_transfers`` as it was: site -> transfer, the dict it builds kept."""
    transfers: dict[Site, SiteTransfer] = {}
    for rule in rules:
        rses = resolved[rule.expression]
        at = {sites[rse] for rse in rses}
        single = len(at) == 1
        for site in at:
            new = SiteTransfer(
                site,
                rule.transfer,
                rule.progress,
                rule.progress if single else 0.0,
                rses if single else None,
            )
            old = transfers.get(site)
            transfers[site] = new if old is None else merge_transfers(old, new)
    return transfers


def lookups_in_tuples(
    moving: dict[DatasetId, tuple[SiteTransfer, ...]], pairs: list[tuple[DatasetId, Site]]
) -> int:
    covering, found = moving.get, 0
    for dataset, site in pairs:
        if towards(covering(dataset), site) is not None:
            found += 1
    return found


def lookups_in_dicts(
    moving: dict[DatasetId, dict[Site, SiteTransfer]], pairs: list[tuple[DatasetId, Site]]
) -> int:
    covering, found = moving.get, 0
    for dataset, site in pairs:
        covered = covering(dataset)
        if (None if covered is None else covered.get(site)) is not None:
            found += 1
    return found


def towards_part(replicas: int, repetitions: int) -> dict[str, Any]:
    federation = Federation(Scale(replicas=replicas))
    snapshot = federation.snapshot(intern=True)
    rse_of = {site: f"{site}_DISK0" for site in federation.sites}
    resolved = {rse: frozenset({rse}) for rse in rse_of.values()}
    sites = {rse: Site(site) for site, rse in rse_of.items()}
    rules: dict[DatasetId, list[BenchRule]] = {}
    pairs: list[tuple[DatasetId, Site]] = []
    for replica in snapshot.replicas:
        pairs.append((replica.dataset, replica.site))
        if replica.transfer is not Transfer.NONE:
            rule = BenchRule(rse_of[replica.site], replica.transfer, replica.progress)
            rules.setdefault(replica.dataset, []).append(rule)
    del snapshot
    pairs.sort()

    def tuples() -> dict[DatasetId, tuple[SiteTransfer, ...]]:
        return {d: rule_transfers(found, resolved, sites) for d, found in rules.items()}

    def dicts() -> dict[DatasetId, dict[Site, SiteTransfer]]:
        return {d: rule_transfers_as_dict(found, resolved, sites) for d, found in rules.items()}

    as_tuples, as_dicts = tuples(), dicts()
    assert {d: {t.site: t for t in ts} for d, ts in as_tuples.items()} == as_dicts
    assert lookups_in_tuples(as_tuples, pairs) == lookups_in_dicts(as_dicts, pairs)
    held = {"dicts": held_bytes(dicts), "tuples": held_bytes(tuples)}
    datasets = len(rules)
    return {
        "replicas": len(pairs),
        "datasets_with_rules": datasets,
        "transfers": sum(map(len, as_tuples.values())),
        "bytes": held,
        "bytes_per_dataset": {name: round(b["held"] / datasets, 2) for name, b in held.items()},
        "bytes_saving_pct": saving(held["tuples"]["held"], held["dicts"]["held"]),
        "build": compare({"dicts": dicts, "tuples": tuples}, repetitions, [("tuples", "dicts")]),
        "lookups": compare(
            {
                "dicts": lambda: lookups_in_dicts(as_dicts, pairs),
                "tuples": lambda: lookups_in_tuples(as_tuples, pairs),
            },
            repetitions,
            [("tuples", "dicts")],
        ),
    }


# -- json: the served files ------------------------------------------------------------------


def compact(doc: Any) -> bytes:
    """The served files' encoding (``http_endpoint``'s, checked equal below)."""
    return json.dumps(doc, separators=(",", ":")).encode() + b"\n"


def indented(doc: Any) -> bytes:
    """The code it replaced."""
    return json.dumps(doc, indent=1).encode() + b"\n"


def default_separators(doc: Any) -> bytes:
    return json.dumps(doc).encode() + b"\n"


def made_file(encode: Callable[[Any], bytes], view: SiteView) -> bytes:
    return encode(site_json(view))


def json_part(view: SiteView, repetitions: int) -> dict[str, Any]:
    doc = site_json(view)
    assert site_file_bytes(view, None, lambda: b"") == compact(doc)
    encoders = {"indent": indented, "default_separators": default_separators, "compact": compact}
    for encode in encoders.values():
        assert json.loads(encode(doc)) == doc
    pairs = [("compact", "indent"), ("compact", "default_separators")]
    return {
        "datasets": len(view.available) + len(view.partial) + len(view.replicating),
        "bytes": {name: len(encode(doc)) for name, encode in encoders.items()},
        "encode": compare(
            {name: partial(encode, doc) for name, encode in encoders.items()},
            repetitions,
            pairs,
        ),
        "file": compare(
            {name: partial(made_file, encode, view) for name, encode in encoders.items()},
            repetitions,
            pairs,
        ),
    }


def run(site_datasets: int, ids: int, replicas: int, repetitions: int) -> dict[str, Any]:
    figures: dict[str, Any] = {
        "scenario": "fast-paths",
        "site_datasets": site_datasets,
        "ids": ids,
        "replicas": replicas,
        "repetitions": repetitions,
        "code": commit(),
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine_before": machine(),
    }
    view = site_of_size(site_datasets)
    figures["render"] = render_part(view, repetitions)
    figures["json"] = json_part(view, repetitions)
    del view
    figures["intern"] = intern_part(ids, repetitions)
    figures["towards"] = towards_part(replicas, repetitions)
    figures["ended"] = datetime.now(UTC).isoformat(timespec="seconds")
    figures["machine_after"] = machine()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--site-datasets", type=int, default=100_000)
    parser.add_argument("--ids", type=int, default=1_000_000)
    parser.add_argument("--replicas", type=int, default=1_000_000)
    parser.add_argument("--repetitions", type=int, default=7)
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()
    if min(args.site_datasets, args.ids, args.replicas, args.repetitions) < 1:
        parser.error("--site-datasets, --ids, --replicas and --repetitions must be at least 1")
    figures = run(args.site_datasets, args.ids, args.replicas, args.repetitions)
    emit(figures, args.json)


if __name__ == "__main__":
    main()
