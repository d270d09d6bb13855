"""The site JSON files the HTTP endpoint writes: a file patched from the last one is byte for
byte the file ``site_json`` gives."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from hydrator.domain import DatasetId, Site, SiteView
from hydrator.runtime.http_endpoint import site_file_bytes
from hydrator.runtime.json_views import site_json
from tests.pool.views import views

T0 = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)


def formatted(view: SiteView) -> bytes:
    """``site_json`` of ``view`` as the endpoint writes it: compact JSON and a newline."""
    return json.dumps(site_json(view), separators=(",", ":")).encode() + b"\n"


def returning(data: bytes) -> Callable[[], bytes]:
    """A reader of an old file that returns ``data``."""
    return lambda: data


def view(names: list[str], when: datetime) -> SiteView:
    return views({"SITE_A": names}, now=when)[Site("SITE_A")]


def test_each_next_view_gives_the_file_site_json_gives() -> None:
    first = view(["ska:a", "ska:b"], T0)
    later = dataclasses.replace(first, updated=T0 + timedelta(seconds=60))  # nothing else moved
    progress = dataclasses.replace(later, replicating=((DatasetId.parse("ska:c"), 0.5),))
    moved = dataclasses.replace(progress, replicating=((DatasetId.parse("ska:c"), 0.7),))
    changed = view(["ska:a"], T0 + timedelta(seconds=120))
    never = dataclasses.replace(changed, updated=None)
    again = dataclasses.replace(never, updated=T0 + timedelta(seconds=180))
    old: SiteView | None = None
    body = b""
    for new in (first, later, progress, moved, changed, never, again):
        made = site_file_bytes(new, old, returning(body))
        assert made == formatted(new)
        assert json.loads(made) == site_json(new)
        assert site_file_bytes(new, new, returning(made)) is None  # same view: nothing to write
        old, body = new, made


def test_an_unreadable_or_foreign_old_file_is_formatted_again() -> None:
    first = view(["ska:a", "ska:b"], T0)
    later = dataclasses.replace(first, updated=T0 + timedelta(seconds=60))

    def gone() -> bytes:
        raise FileNotFoundError("site/SITE_A.json")

    assert site_file_bytes(later, first, gone) == formatted(later)
    assert site_file_bytes(later, first, lambda: b'{"other":1}\n') == formatted(later)
