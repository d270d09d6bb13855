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
    progress: float | None = None,
) -> Replica:
    """A replica in the list ``state``. For ``replicating``/``stuck`` (absent) ``fraction`` is
    the transfer's progress, as in the static inventory; ``transfer`` adds one to a present
    replica (``progress`` default 0)."""
    kind = ReplicaState(state)
    if kind is ReplicaState.REPLICATING or kind is ReplicaState.STUCK:
        return Replica(
            DatasetId("ska", name), Site(site), kind, 0.0, Transfer(state), fraction, 0.0
        )
    moving = Transfer.NONE if transfer is None else Transfer(transfer)
    return Replica(
        DatasetId("ska", name), Site(site), kind, fraction, moving, progress or 0.0, fraction
    )


def snap(source: str, *replicas: Replica, sites: tuple[str, ...] = ()) -> Snapshot:
    return Snapshot.of(source, replicas, sites=[Site(s) for s in sites])


def fail(source: str, error: str = "connection refused") -> SourceFailure:
    return SourceFailure(source, error)
