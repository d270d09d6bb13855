"""Site views for pool tests, built the way the core builds them."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

from hydrator.core.index import merge_replicas
from hydrator.core.views import site_contents
from hydrator.domain import DatasetId, Replica, ReplicaState, Site, SiteView


def views(
    available: Mapping[str, Sequence[str]], now: datetime | None = None
) -> dict[Site, SiteView]:
    """``{"SITE_A": ["ska:obs_1"]}`` -> site views with those datasets AVAILABLE, updated now."""
    now = now or datetime.now(UTC)
    replicas = [
        Replica(DatasetId.parse(name), Site(site), ReplicaState.AVAILABLE)
        for site, names in available.items()
        for name in names
    ]
    sites = frozenset(Site(s) for s in available)
    return {
        site: dataclasses.replace(view, updated=now)
        for site, view in site_contents(merge_replicas(replicas), sites).items()
    }
