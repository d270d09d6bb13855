"""The Rucio source's rules: the REPLICATING and STUCK replication rules, read line by line
against the last answer, and each dataset's rules turned into the transfer towards each site
(:func:`hydrator.core.presence.rule_transfers`).

``list_replication_rules({"state": "R"})`` and ``{"state": "S"}`` give exact lock counts
(``locks_ok_cnt`` ...) kept by the rule engine; ``list_rses(expr)`` is called once per fetch
for each distinct expression of the rules that concern a listed dataset and are not simply
the name of a mapped RSE.

An event cycle reads one dataset's rules as they are now (:func:`dataset_rule_transfers`:
``list_did_rules``), read as the full read reads its lines, so that a rule done or deleted
since the last full read moves nothing.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping
from functools import partial
from itertools import repeat
from typing import cast

from hydrator.adapters.sources.rucio.book import Book, Cycle, Dataset, Dirty, Rule, move
from hydrator.adapters.sources.rucio.listing import (
    RULE_LINES,
    Lines,
    Mark,
    New,
    RuleRow,
    new_positions,
    parse_lines,
)
from hydrator.adapters.sources.rucio.wire import InvalidExpression, RucioWire
from hydrator.core.presence import RuleTransfers, lock_progress, rule_transfer, rule_transfers
from hydrator.domain import DatasetId, Transfer

_Read = tuple[Lines[Rule | Mark], list[Rule | Mark], list[Rule | Mark]]


def read_rules(wire: RucioWire, book: Book, cycle: Cycle, dirty: Dirty) -> None:
    """The REPLICATING and STUCK rules (state filter by one-letter code), line by line
    against the last answer: the rules of new lines join their dataset's, those of lines
    gone leave it, and those datasets' rules are applied again (:func:`apply_rules`)."""
    for code in ("R", "S"):
        old = book.rule_lines.get(code)
        read = partial(_rule_lines, code=code, old=old, known=book.datasets)
        lines, added, gone = wire.rules(code, read)
        book.rule_lines[code] = lines
        cycle.invalid += lines.invalid
        for rule in added:
            if isinstance(rule, Rule):
                book.rules_of.setdefault(rule.key, []).append(rule)
                dirty.rule_keys.add(rule.key)
        for rule in gone:
            if isinstance(rule, Rule):
                rules = book.rules_of[rule.key]
                rules.remove(rule)
                if not rules:
                    del book.rules_of[rule.key]
                dirty.rule_keys.add(rule.key)


def _rule_lines(
    blocks: Iterator[list[bytes]],
    code: str,
    old: Lines[Rule | Mark] | None,
    known: Mapping[tuple[str, str], Dataset],
) -> _Read:
    """The rules in state ``code`` as lines, with what the new lines give and what the
    lines gone gave; read a block at a time as the answer streams in (a million rules are
    about a gigabyte of JSON), parsing only lines not in ``old``."""
    index = dict(zip(old.hashes, old.values, strict=True)) if old is not None else {}
    lines: Lines[Rule | Mark] = Lines()
    seen: set[int] = set()
    added: list[Rule | Mark] = []
    for block in blocks:
        distinct = dict(zip(map(hash, block), block, strict=True))  # identical lines once
        if not seen.isdisjoint(distinct):
            distinct = {h: line for h, line in distinct.items() if h not in seen}
        seen.update(distinct)
        hashes = list(distinct)
        values: list[Rule | Mark | New] = list(map(index.get, hashes, repeat(New.LINE)))
        fresh = new_positions(values)
        new = [distinct[hashes[i]] for i in fresh]
        parsed = parse_lines(RULE_LINES, new, f"rules in state {code} (list_replication_rules)")
        for i, row in zip(fresh, parsed, strict=True):
            values[i] = rule_value(row, code, known)
            added.append(values[i])  # type: ignore[arg-type]  # parsed: no New
        lines.hashes.extend(hashes)
        lines.values += cast(list[Rule | Mark], values)
    gone = [index[h] for h in index.keys() - seen]
    return lines, added, gone


def rule_value(
    row: RuleRow | Mark, code: str, known: Mapping[tuple[str, str], Dataset]
) -> Rule | Mark:
    """What a rule line gives: an active or stuck dataset rule, or a mark (malformed:
    counted; a container rule, whose datasets get a deep check, or a finished one: skipped).
    The transfer follows the lock counts (:func:`~hydrator.core.presence.rule_transfer`)."""
    if isinstance(row, Mark):
        return row
    if row["did_type"] != "DATASET":
        return Mark.SKIPPED
    ok, replicating = row["locks_ok_cnt"], row["locks_replicating_cnt"]
    stuck = row["locks_stuck_cnt"]
    transfer = rule_transfer(ok, replicating, stuck, listed_stuck=code == "S")
    if transfer is Transfer.NONE:
        return Mark.SKIPPED
    key = (row["scope"], row["name"])
    found = known.get(key)
    key = key if found is None else found.key  # the dataset's own strings: less memory
    progress = lock_progress(ok, replicating, stuck)
    return Rule(key, sys.intern(row["rse_expression"]), transfer, progress)


def apply_rules(wire: RucioWire, book: Book, cycle: Cycle, dirty: Dirty) -> None:
    """Each rule's transfer towards the sites its expression covers, re-applied for the
    datasets whose rules changed, that gained or lost every summary row, or (after a
    change of the RSE -> site map or of an expression's RSEs) that have rules at all.

    Only rules on datasets with a summary row at a mapped RSE count. An expression that
    is just an RSE name needs no call; the others are resolved once each per fetch.
    """
    relevant = {
        rule.expression
        for key, rules in book.rules_of.items()
        if (found := book.datasets.get(key)) is not None and found.at
        for rule in rules
    }
    resolved = {e: _resolve(wire, e, cycle) for e in sorted(relevant)}
    moved = {e for e, rses in resolved.items() if book.resolved.get(e, rses) != rses}
    book.resolved = resolved
    keys = dirty.rule_keys
    if dirty.remapped or moved:
        keys = keys | {
            key
            for key, rules in book.rules_of.items()
            if dirty.remapped or any(rule.expression in moved for rule in rules)
        }
    datasets = dirty.datasets | {found for k in keys if (found := book.datasets.get(k))}
    for dataset in datasets:
        rules = book.rules_of.get(dataset.key, []) if dataset.at else []
        move(book, dataset, rule_transfers(rules, resolved, cycle.sites), dirty)


LISTED_STATES = {"REPLICATING": "R", "STUCK": "S"}
"""A rule's state as ``list_did_rules`` names it -> the code the full read lists it by (a rule
in another state, OK, SUSPENDED ..., is in neither listing)."""


def dataset_rule_transfers(
    wire: RucioWire,
    book: Book,
    cycle: Cycle,
    dataset: DatasetId,
    resolved: dict[str, frozenset[str]],
) -> RuleTransfers:
    """The transfer towards each site of ``dataset``'s rules as Rucio has them now: one
    ``list_did_rules`` call, its REPLICATING and STUCK dataset rules on this very dataset read
    as the full read reads its lines (:func:`rule_value`; malformed: counted in
    ``cycle.invalid``). Expressions resolve as :func:`apply_rules` does, taken from the last
    full read's (``book.resolved``, never changed) where it resolved them, else one
    ``list_rses`` each, kept in ``resolved`` for the rest of the caller's read."""
    what = f"the rules of {dataset} (list_did_rules)"
    rows = wire.did_rules(dataset, partial(parse_lines, RULE_LINES, what=what))
    rules: list[Rule] = []
    for row in rows:
        if isinstance(row, Mark):
            cycle.invalid += row is Mark.INVALID
            continue
        code = LISTED_STATES.get(row["state"])
        if code is None or (row["scope"], row["name"]) != (dataset.scope, dataset.name):
            continue  # not active, or (a server's odd answer) another DID's rule
        value = rule_value(row, code, {})
        if isinstance(value, Rule):
            rules.append(value)
    for rule in rules:
        if rule.expression not in resolved:
            known = book.resolved.get(rule.expression)
            found = known if known is not None else _resolve(wire, rule.expression, cycle)
            resolved[rule.expression] = found
    return rule_transfers(rules, resolved, cycle.sites)


def _resolve(wire: RucioWire, expression: str, cycle: Cycle) -> frozenset[str]:
    """The mapped RSEs an expression covers (none when the server no longer knows it)."""
    table = cycle.table
    if expression in table.sites or expression in table.unmapped:
        return frozenset({expression} & table.sites.keys())
    try:
        found = wire.list_rses(expression)
    except InvalidExpression:
        return frozenset()  # the rule targets RSEs that no longer exist
    names = {r.get("rse") for r in found if isinstance(r, dict)}
    return frozenset(rse for rse in names if isinstance(rse, str) and rse in table.sites)
