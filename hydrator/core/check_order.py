"""Which datasets a source's bounded budget checks first (pure): the order of the Rucio
source's exact checks and of the DMAPI source's locates of known datasets.

* **Rucio's deep checks** (``deep_check_limit`` per fetch, one call each):
  :func:`deep_check_order`. Datasets with a bad or unavailable replica listed come first
  (their summary rows may say complete wrongly), then the most wanted by queued jobs, then
  those no rule's locks vouch for (their only count is the lagging summary), then by scope
  and name. The order without demand (:func:`standing_order`) stands while the pending
  datasets and their rules do, so the source keeps it between fetches.
* **DMAPI's relocates** (``max_relocates_per_cycle`` per fetch): :func:`relocate_order`.
  A dataset never located is located at once; of those located before, the longest
  unchecked go first, the others keep their last answer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import islice
from typing import NamedTuple

from hydrator.domain import DatasetId

# -- Rucio: the deep checks ------------------------------------------------------------------


def standing_order(vouched: Mapping[DatasetId, bool]) -> list[DatasetId]:
    """The pending datasets (``vouched``: each -> whether some rule's OK locks show files at
    one of its pending sites) in deep-check order without demand or listed bad replicas:
    those nothing vouches for first, then by scope and name."""
    return sorted(vouched, key=_standing_key(vouched))


def _standing_key(
    vouched: Mapping[DatasetId, bool],
) -> Callable[[DatasetId], tuple[bool, str, str]]:
    """The sort key of :func:`standing_order`: not vouched for first, then scope and name."""
    return lambda dataset: (vouched[dataset], dataset.scope, dataset.name)


def deep_check_order(
    vouched: Mapping[DatasetId, bool],
    listed_bad: Iterable[DatasetId],
    wanted: Mapping[DatasetId, int],
    limit: int,
    standing: Sequence[DatasetId] | None = None,
) -> list[DatasetId]:
    """The first ``limit`` pending datasets to check exactly: those ``listed_bad`` (a bad or
    unavailable replica of theirs is listed), then those ``wanted`` (dataset -> queued jobs
    wanting it), most wanted first, then the rest in :func:`standing_order`. Each group is
    in that order within itself (ties of demand too).

    ``vouched`` holds the pending datasets (each -> vouched for, as :func:`standing_order`
    takes it); the others of ``listed_bad`` and ``wanted`` are left out. ``standing`` is
    ``standing_order(vouched)`` when the caller keeps it between fetches (then only the
    wanted and listed ones are sorted here)."""

    key = _standing_key(vouched)
    demand = {d: count for d, count in wanted.items() if count > 0 and d in vouched}
    forced = {d for d in listed_bad if d in vouched}
    head = sorted(forced, key=key)
    head += sorted(demand.keys() - forced, key=lambda d: (-demand[d], *key(d)))
    first = forced | demand.keys()
    order = standing_order(vouched) if standing is None else standing
    rest = (d for d in order if d not in first)
    return head[:limit] + list(islice(rest, max(0, limit - len(head))))


# -- DMAPI: the relocates --------------------------------------------------------------------


class Relocations(NamedTuple):
    """What one DMAPI fetch locates, and how many known datasets wait for a later one."""

    due: list[DatasetId]  # every dataset never located, then the known ones within the budget
    deferred: int  # known datasets over the budget: they keep their last answer


def relocate_order(
    wanted: Sequence[DatasetId], located_in: Mapping[DatasetId, int], budget: int
) -> Relocations:
    """The datasets to locate of ``wanted``: every one not in ``located_in`` (dataset -> the
    fetch, counted up, that last located it), in ``wanted``'s order; then at most ``budget``
    (0: all) of the others, longest-unchecked first (ties in ``wanted``'s order)."""
    new = [d for d in wanted if d not in located_in]
    known = sorted((d for d in wanted if d in located_in), key=located_in.__getitem__)
    deferred = max(0, len(known) - budget) if budget else 0
    if deferred:
        known = known[:budget]
    return Relocations(new + known, deferred)
