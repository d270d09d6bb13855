"""A Rucio server's distances between RSEs, as the near sites need them (docs/near.md).

Rucio keeps one distance per ordered pair of RSEs (its ``distances`` table). Its REST API
reads them one pair at a time (``GET /rses/<source>/distances/<destination>``, what
rucio-clients' ``get_distance`` sends): n x n requests for n RSEs. Its export
(``GET /export/?distance=True``) answers every RSE, with its attributes, and every distance
in one request, so a refresh costs one request, whatever the number of RSEs. The export is
allowed to the accounts the server's policy lets export (root, in the generic policy); an
account without it is refused, which the caller counts and answers with the last good lists.

Each RSE's site is its ``[sites]`` entry, else its ``site_attribute``, as for the source.
The distances are handed on unchecked: :mod:`hydrator.core.near` checks them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hydrator.adapters.sources import site_or_none
from hydrator.adapters.sources.rucio.wire import RucioWire
from hydrator.config import RucioSourceConfig
from hydrator.core.near import ElementDistances
from hydrator.domain import Site, check_site
from hydrator.errors import TransientSourceError


class RucioDistances:
    """Reads one Rucio server's distances (the ``DistanceReader`` port), with a wire of its
    own: each read is one ``export_data`` call within the source's ``deadline_s``."""

    def __init__(
        self,
        config: RucioSourceConfig,
        sites: Mapping[str, str],
        max_bytes: int,
        wire: RucioWire | None = None,
    ) -> None:
        self.config = config
        self.overrides = {rse: check_site(site) for rse, site in sites.items()}
        self.max_bytes = max_bytes
        self.wire = wire or RucioWire(config)

    @property
    def requests(self) -> int:
        """Requests the last read made (retries included)."""
        return sum(self.wire.calls.values())

    def read_distances(self) -> ElementDistances:
        """Every RSE with a site and every distance between RSEs, as read; raises a
        ``SourceError`` when the server refuses or fails the read."""
        self.wire.begin(self.config.deadline_s)
        try:
            document = self.wire.export(self.max_bytes)
        finally:
            self.wire.end()
        if not isinstance(document, dict):
            raise TransientSourceError("rucio: export_data: the answer is not a JSON object")
        return ElementDistances(self._sites(document.get("rses")), _entries(document))

    def _sites(self, rses: Any) -> dict[str, Site]:
        """RSE -> site: ``[sites]`` first, else the RSE's site attribute when valid."""
        out = dict(self.overrides)
        if not isinstance(rses, dict):
            return out
        for name, record in rses.items():
            attributes = record.get("attributes") if isinstance(record, dict) else None
            if name in out or not isinstance(attributes, dict):
                continue
            site = site_or_none(attributes.get(self.config.site_attribute))
            if site is not None:
                out[str(name)] = site
        return out

    def close(self) -> None:
        self.wire.close()


def _entries(document: Mapping[str, Any]) -> list[tuple[str, str, object]]:
    """``(source, destination, distance)`` of the export's ``distances``; a row that is not
    a record gives a distance that is not a number (counted as such by the core)."""
    table = document.get("distances")
    if not isinstance(table, dict):
        return []
    entries: list[tuple[str, str, object]] = []
    for source, row in table.items():
        if not isinstance(row, dict):
            continue
        for destination, record in row.items():
            value = record.get("distance") if isinstance(record, dict) else record
            entries.append((str(source), str(destination), value))
    return entries
