"""The site JSON files the HTTP endpoint writes: reused lists give exactly ``site_json``."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

from hydrator.domain import DatasetId, Site, SiteView
from hydrator.runtime.http import _site_doc
from hydrator.runtime.report import site_json
from tests.pool.views import views

T0 = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)


def view(names: list[str], when: datetime) -> SiteView:
    return views({"SITE_A": names}, now=when)[Site("SITE_A")]


def test_each_next_view_gives_the_document_site_json_gives() -> None:
    first = view(["ska:a", "ska:b"], T0)
    later = dataclasses.replace(first, updated=T0 + timedelta(seconds=60))  # nothing else moved
    progress = dataclasses.replace(later, replicating=((DatasetId.parse("ska:c"), 0.5),))
    moved = dataclasses.replace(progress, replicating=((DatasetId.parse("ska:c"), 0.7),))
    changed = view(["ska:a"], T0 + timedelta(seconds=120))
    never = dataclasses.replace(changed, updated=None)
    old: SiteView | None = None
    doc: dict[str, object] = {}
    for new in (first, later, progress, moved, changed, never):
        made = _site_doc(new, old, doc)
        assert made == site_json(new)
        assert _site_doc(new, new, made) is None  # the same view: nothing to write
        old, doc = new, made
