"""Catalogue sources: each turns one external system into a :class:`~hydrator.domain.Snapshot`.

A source is one adapter module (``static``, ``rucio``, ``dmapi``); only that module imports its
library. It raises :class:`~hydrator.errors.TransientSourceError` or
:class:`~hydrator.errors.PermanentSourceError` when it has no usable answer; it never returns a
partial answer as if it were complete. Records it cannot use (malformed, invalid names, storage
elements with no site) are counted in ``Snapshot.invalid`` / ``Snapshot.unmapped`` and skipped.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from hydrator.domain import DatasetId, Snapshot


@dataclass(frozen=True)
class FetchContext:
    """What a source may use in one cycle.

    ``now`` is the cycle's start (UTC). ``wanted`` counts, per dataset, the queued jobs that
    declare it in ``RequiredDatasets`` (empty when no demand provider is configured).
    """

    now: datetime
    wanted: Mapping[DatasetId, int] = field(default_factory=dict)


class Source(Protocol):
    """A catalogue adapter."""

    @property
    def name(self) -> str: ...

    def fetch(self, context: FetchContext) -> Snapshot:
        """Answer for this cycle, or raise a SourceError subclass."""
        ...

    def close(self) -> None:
        """Release connections; called once at shutdown."""
        ...
