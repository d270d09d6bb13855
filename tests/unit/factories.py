"""Tiny builders for domain objects in unit tests."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hydrator.domain import DatasetId, Replica, ReplicaState, Site, Snapshot, SourceFailure

T0 = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


def t(minutes: int) -> datetime:
    return T0 + timedelta(minutes=minutes)


def rep(site: str, name: str, state: str = "available", fraction: float = 1.0) -> Replica:
    return Replica(DatasetId("ska", name), Site(site), ReplicaState(state), fraction)


def snap(source: str, *replicas: Replica, sites: tuple[str, ...] = ()) -> Snapshot:
    return Snapshot.of(source, replicas, sites=[Site(s) for s in sites])


def fail(source: str, error: str = "connection refused") -> SourceFailure:
    return SourceFailure(source, error)
