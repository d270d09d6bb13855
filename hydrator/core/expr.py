"""Job-side expressions: ``requirements`` and ``rank`` for a job that needs some datasets.

ClassAds have no ``subset()`` or ``intersection()`` (docs/platform.md); the working forms are a
conjunction of ``identicalMember`` (case-sensitive, unlike ``member``) and, for ranking, the sum
of a list of booleans (0 when the slot has no such attribute; ``a + b`` would be UNDEFINED).
Names are validated :class:`~hydrator.domain.DatasetId` objects and are quoted with
``classad2.quote``, never pasted in raw.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import classad2

from hydrator.core.render import AdAttributes
from hydrator.domain import DatasetId


@dataclass(frozen=True)
class JobExpressions:
    required: str  # value of RequiredDatasets, a ClassAd list
    requirements: str
    rank: str
    generic_requirements: str  # the same test driven by MY.RequiredDatasets


def _member(dataset: DatasetId, attribute: str) -> str:
    return f"identicalMember({classad2.quote(str(dataset))}, TARGET.{attribute})"


def job_expressions(
    datasets: Sequence[DatasetId],
    attrs: AdAttributes,
    partial_ok: bool = False,
    fallback_after_s: int | None = None,
) -> JobExpressions:
    """Expressions for a job needing every dataset in ``datasets`` (in order, deduplicated).

    ``partial_ok`` also accepts a site holding part of a dataset (for jobs that can fetch the
    rest). ``rank`` counts the datasets a slot's site holds completely, plus half for partial.
    ``fallback_after_s`` (seconds, > 0) makes both requirements true anywhere once the job has
    been queued longer than that: ``(<test>) || (time() - MY.QDate > N)``; the negotiator
    evaluates ``time()`` at each match, so the job waits for a local slot for N seconds plus
    up to one negotiation cycle, then runs wherever ``rank`` finds the best free slot.
    """
    unique = list(dict.fromkeys(datasets))
    if not unique:
        raise ValueError("at least one dataset is needed")
    if fallback_after_s is not None and fallback_after_s <= 0:
        raise ValueError(f"fallback after {fallback_after_s} s: must be a positive number")
    avail, part = attrs.available_attribute, attrs.partial_attribute
    terms = []
    for d in unique:
        term = _member(d, avail)
        terms.append(f"({term} || {_member(d, part)})" if partial_ok else term)
    rank = "sum({" + ", ".join(_member(d, avail) for d in unique) + "})"
    if partial_ok:
        rank += " + 0.5 * sum({" + ", ".join(_member(d, part) for d in unique) + "})"
    generic = f'stringListSubsetMatch(join(",", MY.RequiredDatasets), join(",", TARGET.{avail}))'
    required = "{" + ", ".join(classad2.quote(str(d)) for d in unique) + "}"
    requirements = " && ".join(terms)
    if fallback_after_s is not None:
        waited = f"(time() - MY.QDate > {fallback_after_s})"
        requirements, generic = f"({requirements}) || {waited}", f"({generic}) || {waited}"
    return JobExpressions(required, requirements, rank, generic)


def _pairs(expr: JobExpressions, generic: bool, rank_only: bool) -> list[tuple[str, str]]:
    """(name, value) of RequiredDatasets, requirements (unless ``rank_only``) and rank."""
    requirements = expr.generic_requirements if generic else expr.requirements
    pairs = [("RequiredDatasets", expr.required), ("requirements", requirements)]
    return [*pairs[: 1 if rank_only else 2], ("rank", expr.rank)]


def submit_lines(expr: JobExpressions, generic: bool = False, rank_only: bool = False) -> str:
    """Lines for an HTCondor submit file (``rank_only``: no requirements line, the job may
    run anywhere and prefers its data's sites)."""
    return "".join(
        f"{'My.' if name == 'RequiredDatasets' else ''}{name} = {value}\n"
        for name, value in _pairs(expr, generic, rank_only)
    )


def toil_params(expr: JobExpressions, generic: bool = False, rank_only: bool = False) -> str:
    """A shell line setting ``TOIL_HTCONDOR_PARAMS`` for Toil's HTCondor batch system.

    Toil splits the value on ``;`` and each pair on its first ``=`` (toil/batchSystems/htcondor.py),
    and applies it to every job of the run. Dataset names never contain ``;`` or ``'``.
    """
    pairs = [
        f"{'+' if name == 'RequiredDatasets' else ''}{name} = {value}"
        for name, value in _pairs(expr, generic, rank_only)
    ]
    return "export TOIL_HTCONDOR_PARAMS='" + "; ".join(pairs) + "'\n"


LOCAL_LIMIT = "hydrator_local"
"""The concurrency limit a job reading locally names: never capped (the deployment sets its
limit far above any pool). Not the empty string: the negotiator rejects a match whose limits
evaluate to "" (docs/near.md)."""
REMOTE_SET = "remote"
"""Remote readers of a data site S hold the limit ``remote.S``; the negotiator caps the set
with ``CONCURRENCY_LIMIT_DEFAULT_REMOTE`` (deploy/condor/60-hydrator-near.conf)."""


@dataclass(frozen=True)
class NearExpressions:
    """A job that runs where its data is, or at a site near it, within the remote budget."""

    requirements: str
    rank: str
    concurrency_limits_expr: str


def near_expressions(
    attrs: AdAttributes, *, sites_attribute: str, slot_site_attribute: str
) -> NearExpressions:
    """Requirements "local, or near", a rank of local (2) over near (1) over far (0), and the
    concurrency limits that make a remote reader count against its data sites' budget.

    Every attribute name is the caller's (the configuration's, which the core does not read):
    ``attrs`` gives the slot's ``available_attribute`` and ``near_attribute`` (``[classad]``).

    Until the job is annotated it is local where the slot's ``available_attribute`` lists all
    its ``RequiredDatasets``: the negotiation cycle ``condor_submit`` asks for runs before the
    daemon annotates the job, and without this branch the job could not match in it (its
    limits are then UNDEFINED, so it holds none: the negotiator skips no candidate for them).

    ``sites_attribute`` is the job's annotation (the sites holding all its data, written by
    ``[jobs] annotate``: ``[jobs] sites_attribute``); ``near_attribute`` the slot's near sites;
    ``slot_site_attribute`` the slot's own site (``[collector] slot_site_attribute``), which
    the startd knows itself (the limits are evaluated by the startd too, which never sees
    collector-merged attributes). Local: ``member`` of the slot's site in the annotation,
    UNDEFINED when the job is evaluated alone, which makes the negotiator evaluate the limits
    against each candidate slot instead of once per job (docs/near.md). A remote reader holds
    ``remote.S`` for every site S of its annotation."""
    near_attribute, available_attribute = attrs.near_attribute, attrs.available_attribute
    for name in (sites_attribute, near_attribute, slot_site_attribute, available_attribute):
        if not name.isidentifier():
            raise ValueError(f"{name!r} is not a ClassAd attribute name")
    local = f"member(TARGET.{slot_site_attribute}, MY.{sites_attribute})"
    near = (
        f'stringListsIntersect(join(",", MY.{sites_attribute}), join(",", TARGET.{near_attribute}))'
    )
    subset = (
        'stringListSubsetMatch(join(",", MY.RequiredDatasets), '
        f'join(",", TARGET.{available_attribute}))'
    )
    before = f"(MY.{sites_attribute} =?= UNDEFINED && {subset} =?= True)"  # not yet annotated
    requirements = f"({local} =?= True) || ({near} =?= True) || {before}"
    rank = f"ifThenElse(({local} =?= True) || {before}, 2, ifThenElse({near} =?= True, 1, 0))"
    remote = f'strcat("{REMOTE_SET}.", join(",{REMOTE_SET}.", MY.{sites_attribute}))'
    limits = f'ifThenElse({local}, "{LOCAL_LIMIT}", {remote})'
    return NearExpressions(requirements, rank, limits)


def near_submit_lines(expr: NearExpressions) -> str:
    """Submit-file lines (after the job's ``My.RequiredDatasets``, so that the annotator
    writes its sites attribute, ``[jobs] sites_attribute``)."""
    return (
        f"requirements = {expr.requirements}\n"
        f"rank = {expr.rank}\n"
        f"concurrency_limits_expr = {expr.concurrency_limits_expr}\n"
    )
