"""Tiny builders for domain objects in unit tests."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

from hydrator.core.index import Index, merge_replicas, merged_snapshot
from hydrator.core.presence import holding
from hydrator.core.views import content_digest, site_contents
from hydrator.domain import (
    DatasetId,
    Replica,
    ReplicaState,
    Site,
    SiteView,
    Snapshot,
    SourceFailure,
    Transfer,
)

T0 = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


def flat(index: Index) -> dict[tuple[Site, DatasetId], Replica]:
    """An :data:`~hydrator.core.index.Index` keyed by (site, dataset), as tests compare pairs."""
    return {(site, d): r for site, held in index.items() for d, r in held.items()}


def by_key(replicas: Iterable[Replica]) -> Index:
    """The index of ``replicas`` spelled out (one per (site, dataset)), to check an index."""
    index: Index = {}
    for r in replicas:
        index.setdefault(r.site, {})[r.dataset] = r
    return index


def t(minutes: int) -> datetime:
    return T0 + timedelta(minutes=minutes)


def rep(
    site: str,
    name: str,
    state: str = "available",
    fraction: float = 1.0,
    transfer: str | None = None,
    progress: float = 0.0,
) -> Replica:
    """A replica in the list ``state``. For ``replicating``/``stuck`` (absent) ``fraction`` is
    the transfer's progress, as in the static inventory; ``transfer`` adds one to a present
    replica."""
    dataset, where, kind = DatasetId("ska", name), Site(site), ReplicaState(state)
    if kind is ReplicaState.REPLICATING or kind is ReplicaState.STUCK:
        made = holding(dataset, where, 0.0, 0.0, transfer=Transfer(state), progress=fraction)
    else:
        moving = Transfer.NONE if transfer is None else Transfer(transfer)
        made = holding(dataset, where, fraction, fraction, transfer=moving, progress=progress)
    assert made is not None and made.state is kind
    return made


def snap(source: str, *replicas: Replica, sites: tuple[str, ...] = ()) -> Snapshot:
    return merged_snapshot(source, replicas, sites=[Site(s) for s in sites])


def fail(source: str, error: str = "connection refused") -> SourceFailure:
    return SourceFailure(source, error)


# A holds x and y; B holds x, part of y; C receives y (and part of x); D holds nothing: the
# sites the job-annotation tests decide over (core/jobs.py, runtime/annotate_jobs.py)
def sized_view(
    count: int, name_length: int = 8, updated: datetime | None = None, site: str = "S"
) -> SiteView:
    """A site with ``count`` names of ``name_length`` characters, a third in each list
    (available, partial, replicating): a view of a known size for the ad-size tests."""
    names = [DatasetId("ska", f"{i:0{name_length}d}") for i in range(count)]
    available = tuple(names[0::3])
    partial = tuple((d, 0.5) for d in names[1::3])
    replicating = tuple((d, 0.25) for d in names[2::3])
    digest = content_digest(Site(site), available, partial, replicating)
    return SiteView(Site(site), available, partial, replicating, (), updated, digest)


ANNOTATION_VIEWS = site_contents(
    merge_replicas(
        [
            rep("A", "x"),
            rep("A", "y"),
            rep("B", "x"),
            rep("B", "y", "partial", 0.5),
            rep("C", "y", "replicating", 0.1),
            rep("C", "x", "partial", 0.2),
        ]
    ),
    frozenset({Site("A"), Site("B"), Site("C"), Site("D")}),
)
