"""Tiny builders for domain objects in unit tests."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hydrator.domain import (
    DatasetId,
    Replica,
    ReplicaState,
    Site,
    Snapshot,
    SourceFailure,
    Transfer,
    holding,
)

T0 = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


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
    return Snapshot.of(source, replicas, sites=[Site(s) for s in sites])


def fail(source: str, error: str = "connection refused") -> SourceFailure:
    return SourceFailure(source, error)
