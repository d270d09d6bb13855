"""What the SKA SRCNet Site Capabilities API states of its storage's availability, read from a
``/nodes`` answer: one :class:`~hydrator.core.storage.Statement` per storage area.
Pure parsing for :mod:`hydrator.adapters.sources.dmapi`; the core judges the statements.

Sites, storages and storage areas each carry ``downtime`` (a list of ``{"date_range":
"2025-03-04T00:00:00.000Z to 2025-03-30T00:00:00.000Z", "type": "Planned"|"Unplanned",
"reason": ...}``) and ``is_force_disabled`` (a boolean): ska-telescope/src-site-directory,
``etc/schemas/{site,storage,storage-area,downtime}.json`` and ``models/storage.py``. The API
itself drops an element in a current downtime (``start < now < end``) or force-disabled from
its answers unless asked ``include_inactive=true`` (``rest/routers/nodes.py``,
``backend/mongo.py`` ``_remove_inactive_elements``), so /nodes is asked with it and each
storage area gets the statements of itself, its storage and its site: a downtime or
force-disable of a site covers all its storage. An unreadable ``date_range`` is skipped
(reported once); a time without offset is taken as UTC, as the API writes UTC (``Z``), and
one with another offset is converted to UTC.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from hydrator.adapters.sources import site_or_none
from hydrator.core.storage import Downtime, Statement, clean_text
from hydrator.names import STORAGE_PATTERN

NODES_QUERY = "?include_inactive=true"
"""Asked with /nodes: the elements in downtime or force-disabled too, to apply (and report)
their state here rather than have their storage areas vanish unmapped."""


def storage_statements(body: object) -> tuple[dict[str, Statement], set[str]]:
    """Storage-area id -> what /nodes states of its availability; and the downtime entries
    that could not be read."""
    out: dict[str, Statement] = {}
    bad: set[str] = set()
    for site in children(body, "sites"):
        site_name = site_or_none(site.get("name"))
        if site_name is None:
            continue
        site_said = _stated(site, f"site {site_name}", bad)
        for storage in children(site.get("storages"), None):
            store_said = _stated(storage, f"storage {_storage_label(storage)}", bad)
            for area in children(storage.get("areas"), None):
                name = _area_name(area)
                if name is None:
                    continue
                area_said = _stated(area, "", bad)
                disabled = next(
                    (d for d, _ in (site_said, store_said, area_said) if d is not None), None
                )
                downtimes = site_said[1] + store_said[1] + area_said[1]
                out[area["id"]] = Statement(site_name, name, "storage area", disabled, downtimes)
    return out, bad


def _stated(
    element: dict[str, Any], on: str, bad: set[str]
) -> tuple[str | None, tuple[Downtime, ...]]:
    """An element's ``is_force_disabled`` (as the text a reason carries) and downtimes;
    ``on`` names the element when it is above the storage area (empty for the area)."""
    disabled = (
        f"{on} is_force_disabled".strip() if element.get("is_force_disabled") is True else None
    )
    downtimes: list[Downtime] = []
    for entry in children(element.get("downtime"), None):
        period = _period(entry.get("date_range"))
        if period is None:
            bad.add(f"{on or 'storage area'}: date_range {entry.get('date_range')!r:.80}")
            continue
        kind, reason = entry.get("type"), entry.get("reason")
        downtimes.append(
            Downtime(
                period[0],
                period[1],
                clean_text(kind, 20) if isinstance(kind, str) else "",
                clean_text(reason) if isinstance(reason, str) else "",
                on,
            )
        )
    return disabled, tuple(downtimes)


def _period(text: object) -> tuple[datetime, datetime] | None:
    """``"<ISO> to <ISO>"`` as two UTC times (start before end), or None; a time with another
    offset is converted to UTC."""
    if not isinstance(text, str) or text.count(" to ") != 1 or len(text) > 100:
        return None
    try:
        start, end = (
            datetime.fromisoformat(p.strip().replace("Z", "+00:00")) for p in text.split(" to ")
        )
    except ValueError:
        return None
    start, end = (t.astimezone(UTC) if t.tzinfo else t.replace(tzinfo=UTC) for t in (start, end))
    return (start, end) if start < end else None


def _area_name(area: dict[str, Any]) -> str | None:
    """A storage area's name as the hydrator shows it (its ``name``, else its ``id``); None
    for an area without a usable id or name."""
    area_id = area.get("id")
    if not isinstance(area_id, str) or not area_id:
        return None
    name = area.get("name")
    for candidate in (name, area_id):
        if isinstance(candidate, str) and STORAGE_PATTERN.fullmatch(candidate):
            return candidate
    return None


def _storage_label(storage: dict[str, Any]) -> str:
    """A storage's name in reasons: its ``name``, else its ``host``, else its ``id``."""
    for key in ("name", "host", "id"):
        value = storage.get(key)
        if isinstance(value, str) and value:
            return clean_text(value, 100)
    return "(unnamed)"


def children(items: object, key: str | None) -> Iterable[dict[str, Any]]:
    """Dict items of a list; with ``key``, the dict items of each item's ``key`` list."""
    for item in items if isinstance(items, list) else ():
        if not isinstance(item, dict):
            continue
        if key is None:
            yield item
        else:
            yield from children(item.get(key), None)
