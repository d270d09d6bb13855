"""What a DMAPI answer says, checked: locate entries (:func:`parse_location`), the Site
Capabilities ``/nodes`` map (:func:`parse_nodes`), which storage areas can serve
(:func:`storage_statuses`; the ``[sites]`` elements: :func:`mapped_statuses`), and when a
fetch's answers, all together, are no answer.

Of the two facts the hydrator keeps per (dataset, site), the API answers only presence, and
only as "listed or not": an entry with replica URLs is reported complete (AVAILABLE), one
without is absent; it reports no completeness, rule or transfer state, so the transfer is
always none and this source never produces PARTIAL, REPLICATING or STUCK entries.

What counts as an answer: a 200 must say it is JSON (``Content-Type``
``application/json`` or ``+json``); an HTML page from a gateway is not an empty list
(:func:`json_body`). A fetch whose every locate answered 404, or whose every entry is
malformed, fails (PermanentSourceError, :func:`check_answers`): a wrong ``base_url`` or a
broken ingress looks exactly like that, and must not empty the sites. A single 404 among
datasets that were found is "located nowhere".
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from hydrator.adapters.sources import site_or_none
from hydrator.adapters.sources.dmapi.client import Answer
from hydrator.adapters.sources.dmapi.site_capabilities import children, storage_statements
from hydrator.core.storage import Drain, Statement, judge
from hydrator.domain import DatasetId, Site, StorageStatus
from hydrator.errors import PermanentSourceError
from hydrator.names import STORAGE_PATTERN

MAX_NAME_CHARS = 200  # of a server-given name in a list or a log line


@dataclass(frozen=True)
class Location:
    """One entry of a locate answer that names a storage element holding replicas."""

    identifier: str  # the RSE name
    storage_area_id: str | None
    has_replicas: bool


def parse_location(entry: object) -> Location | None:
    """A locate entry as a :class:`Location`, or None when it is malformed."""
    if not isinstance(entry, dict):
        return None
    identifier = entry.get("identifier")
    area = entry.get("associated_storage_area_id")
    replicas = entry.get("replicas")
    if not isinstance(identifier, str) or not identifier:
        return None
    if area is not None and not isinstance(area, str):
        return None
    if not isinstance(replicas, list) or not all(isinstance(r, str) for r in replicas):
        return None
    return Location(identifier, area or None, bool(replicas))


@dataclass(frozen=True)
class Rejected:
    """A locate the API refused for this dataset alone (HTTP 4xx other than 401, 404, 408, 429)."""

    status: int


@dataclass(frozen=True)
class NotFound:
    """A locate answered 404: the DID is unknown, located nowhere."""


NOT_FOUND = NotFound()
LocateResult = list[Location | None] | Rejected | NotFound  # None: a malformed entry


def check_answers(located: Mapping[DatasetId, LocateResult]) -> None:
    """Raise PermanentSourceError when this fetch's locates, all of them, answered 404, or
    every entry they listed is malformed: no catalogue answer looks like that."""
    if not located:
        return
    if all(isinstance(r, NotFound) for r in located.values()):
        raise PermanentSourceError(
            f"every locate ({len(located)}) answered HTTP 404: a wrong base_url or a broken "
            "gateway? (taken as no answer, not as an empty catalogue)"
        )
    entries = [e for r in located.values() if isinstance(r, list) for e in r]
    if entries and all(e is None for e in entries):
        raise PermanentSourceError(
            f"every locate entry ({len(entries)}) is malformed (taken as no answer)"
        )


def check_not_all_refused(results: Mapping[DatasetId, LocateResult]) -> None:
    """One refused dataset is skipped; every one refused is an access problem of ours."""
    rejected = [r.status for r in results.values() if isinstance(r, Rejected)]
    if results and len(rejected) == len(results):
        raise PermanentSourceError(
            f"every locate was refused (HTTP {sorted(set(rejected))}); check access"
        )


def json_body(resp: Answer, label: str) -> Any:
    """The answer's JSON body; PermanentSourceError if it is not JSON or not labelled JSON
    (a gateway's HTML error page with status 200 is no answer)."""
    kind = resp.headers.get("Content-Type", "").partition(";")[0].strip().lower()
    structured = kind.startswith("application/") and kind.endswith("+json")  # RFC 6839
    if kind != "application/json" and not structured:
        raise PermanentSourceError(
            f"{label}: HTTP {resp.status_code} answer is {kind[:60] or 'untyped'!r}, not JSON"
        )
    try:
        return resp.json()
    except ValueError as exc:  # JSONDecodeError is a ValueError
        raise PermanentSourceError(f"{label}: HTTP {resp.status_code} body is not JSON") from exc


@dataclass(frozen=True)
class NodesMap:
    """Storage-area id -> site from /nodes, plus site names that were not valid sites; and per
    storage-area id what the API states of its availability (:func:`storage_statements`), with
    the entries that could not be read."""

    areas: Mapping[str, Site]
    bad_sites: frozenset[str]
    statements: Mapping[str, Statement] = field(default_factory=dict)
    bad_downtimes: frozenset[str] = frozenset()


def parse_nodes(body: object) -> NodesMap:
    """Map every storage area id listed under nodes -> sites -> storages -> areas to its site.

    Pieces of the wrong type are skipped; a site name that is not a valid :data:`Site` is
    reported in ``bad_sites`` and its areas left unmapped. Raise PermanentSourceError if the
    answer is not a list.
    """
    if not isinstance(body, list):
        raise PermanentSourceError("site capabilities /nodes: answer is not a JSON list")
    areas: dict[str, Site] = {}
    bad: set[str] = set()
    for site in children(body, "sites"):
        site_name = site_or_none(site.get("name"))
        if site_name is None:
            bad.add(repr(site.get("name")))
            continue
        for storage in children(site.get("storages"), None):
            for area in children(storage.get("areas"), None):
                if isinstance(area.get("id"), str) and area["id"]:
                    areas[area["id"]] = site_name
    statements, bad_downtimes = storage_statements(body)
    return NodesMap(areas, frozenset(bad), statements, frozenset(bad_downtimes))


# ---- availability: what /nodes states is read by .site_capabilities


def storage_statuses(
    nodes: NodesMap | None,
    results: Mapping[DatasetId, LocateResult],
    wanted: Container[DatasetId],
    drains: Iterable[Drain],
    now: datetime,
) -> tuple[StorageStatus, ...]:
    """Every storage area /nodes lists, judged at ``now`` (UTC) with the operator's
    ``drains`` (:func:`hydrator.core.storage.judge`); an unavailable one counts the
    ``wanted`` datasets it holds."""
    if nodes is None:
        return ()
    held: dict[str, set[DatasetId]] = {}
    for dataset, result in results.items():
        if isinstance(result, list) and dataset in wanted:
            for location in result:
                if location is not None and location.storage_area_id is not None:
                    held.setdefault(location.storage_area_id, set()).add(dataset)
    return tuple(
        judge(stated, drains, now, len(held.get(area_id, ())))
        for area_id, stated in nodes.statements.items()
    )


def mapped_element(location: Location, overrides: Mapping[str, Site]) -> str | None:
    """The ``[sites]`` key a located replica's site comes from (its RSE name, else its
    storage-area id), or None when ``[sites]`` does not map it."""
    for key in (location.identifier, location.storage_area_id):
        if key is not None and key in overrides:
            return key
    return None


def mapped_statuses(
    overrides: Mapping[str, Site],
    stated: Iterable[StorageStatus],
    results: Mapping[DatasetId, LocateResult],
    context: tuple[Container[DatasetId], Iterable[Drain], datetime],
) -> tuple[StorageStatus, ...]:
    """Each storage element ``[sites]`` maps (``overrides``) and ``stated`` does not already
    state at its site, judged at ``now`` with the operator's ``drains`` (``context``: wanted,
    drains, now): no catalogue states anything of it, so only a drain takes it out; an
    unavailable one counts the ``wanted`` datasets located there. A key that is no valid
    storage element name is left out (a drain cannot name it)."""
    wanted, drains, now = context
    drains = list(drains)
    said = {(s.site, s.storage) for s in stated}
    held: dict[str, set[DatasetId]] = {}
    for dataset, result in results.items():
        if isinstance(result, list) and dataset in wanted:
            for location in result:
                key = None if location is None else mapped_element(location, overrides)
                if key is not None:
                    held.setdefault(key, set()).add(dataset)
    return tuple(
        judge(Statement(site, key), drains, now, len(held.get(key, ())))
        for key, site in sorted(overrides.items())
        if (site, key) not in said and STORAGE_PATTERN.fullmatch(key)
    )


def element_of(location: Location, nodes: NodesMap | None, overrides: Mapping[str, Site]) -> str:
    """The storage element a located replica is on, named as its storage status names it:
    its storage area's name where ``/nodes`` states the area, else the ``[sites]`` key that
    maps it, else the entry's RSE name."""
    area = location.storage_area_id
    stated = nodes.statements.get(area) if nodes is not None and area is not None else None
    if stated is not None:
        return stated.storage
    return mapped_element(location, overrides) or location.identifier


def unavailable_areas(
    nodes: NodesMap | None, statuses: tuple[StorageStatus, ...]
) -> frozenset[str]:
    """Ids of the storage areas ``statuses`` says cannot serve."""
    if nodes is None:
        return frozenset()
    down = {(s.site, s.storage) for s in statuses if not s.available}
    return frozenset(
        area_id for area_id, st in nodes.statements.items() if (st.site, st.storage) in down
    )


def cut(text: str) -> str:
    """``text``, or its first ``MAX_NAME_CHARS`` characters and an ellipsis."""
    return text if len(text) <= MAX_NAME_CHARS else text[:MAX_NAME_CHARS] + "…"
