"""The Rucio source's RSEs and their sites: which RSEs count (``list_rses(rse_expression)``) and
the site each belongs to, ``[sites]`` first, else the RSE's site attribute.

:class:`Rse` is one RSE as a fetch knows it (name, site, attributes and when they were read);
:class:`RseTable` is every RSE of one fetch. :class:`SiteMap` reads the table: an RSE named
in ``[sites]`` needs no call; the others' attributes (``list_rse_attributes``) are read again
once they are ``rse_attributes_max_age_s`` old or more (a new RSE at once), so a site attribute
changed on the server is seen within that time. An RSE with neither is logged once, listed
in ``Snapshot.unmapped`` and ignored.

Availability: an RSE whose ``availability_read`` is false, or that the operator
drained (``hydrator drain SITE --storage RSE``), cannot serve. ``list_rses(expression)``
answers names only, and an expression such as ``...&availability_read=True`` would leave such
an RSE out silently (and raise ``InvalidRSEExpression`` when it leaves out all): so the
attribute is read from one ``list_rses()`` with no expression per fetch (every RSE's record,
``availability_read`` included; docs/platform.md). An unavailable RSE stays in the table, with its
site, but out of :attr:`RseTable.sites`: its rows go as an RSE leaving the expression does
(:func:`~.book.remap`), so a dataset it alone holds leaves its site while one also complete at
another RSE of the site stays; :attr:`RseTable.statuses` says why, and the site stays covered
(:attr:`RseTable.covered`). A mapped RSE gone from the expression since the last fetch
(deleted, or out of the expression) is reported unavailable for that one fetch, so that its
datasets leave explicitly.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from types import MappingProxyType
from typing import Any

from hydrator.adapters.sources import site_or_none
from hydrator.adapters.sources.rucio.wire import InvalidExpression, RucioWire
from hydrator.config import RucioSourceConfig
from hydrator.core.storage import Drain, Statement, judge
from hydrator.domain import Site, StorageStatus
from hydrator.errors import PermanentSourceError
from hydrator.logs import ProblemLog
from hydrator.names import STORAGE_PATTERN

log = logging.getLogger("hydrator.adapters.sources.rucio")

_NO_ATTRIBUTES: Mapping[str, Any] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Rse:
    """One RSE of the source's expression, as a fetch knows it.

    ``site`` is None when the RSE is unmapped (no ``[sites]`` entry and no valid site
    attribute). ``attributes`` are its attributes as ``list_rse_attributes`` last gave them
    (untrusted values; empty for an RSE named in ``[sites]``, whose attributes are not read),
    read at ``attributes_read_at`` (None: not read)."""

    name: str
    site: Site | None
    attributes: Mapping[str, Any] = field(default_factory=lambda: _NO_ATTRIBUTES)
    attributes_read_at: datetime | None = None


@dataclass(frozen=True)
class RseTable:
    """Every RSE one fetch's expression listed, by name, and how many records had no name
    (``invalid``). The names of mapped RSEs are interned (one object per name: the source's
    per-dataset rows hold them)."""

    rses: Mapping[str, Rse] = field(default_factory=dict)
    invalid: int = 0
    statuses: tuple[StorageStatus, ...] = ()  # of the mapped RSEs (and those just gone)

    @cached_property
    def down(self) -> frozenset[str]:
        """The RSEs that cannot serve (unavailable by their catalogue, a drain, or gone)."""
        return frozenset(s.storage for s in self.statuses if not s.available)

    @cached_property
    def sites(self) -> dict[str, Site]:
        """Mapped RSE name -> its site, for the RSEs that can serve."""
        down = self.down
        return {
            name: rse.site
            for name, rse in self.rses.items()
            if rse.site is not None and name not in down
        }

    @cached_property
    def covered(self) -> frozenset[Site]:
        """Every site an RSE maps to, whether it can serve or not (an RSE going down empties
        its site's lists; it does not make the site unknown)."""
        return frozenset(s.site for s in self.statuses) | frozenset(self.sites.values())

    @cached_property
    def unmapped(self) -> frozenset[str]:
        """The names of the RSEs without a site."""
        return frozenset(name for name, rse in self.rses.items() if rse.site is None)

    @cached_property
    def site_rses(self) -> dict[Site, tuple[str, ...]]:
        """Site -> its mapped RSEs, sorted."""
        out: dict[Site, list[str]] = {}
        for rse in sorted(self.sites):
            out.setdefault(self.sites[rse], []).append(rse)
        return {site: tuple(rses) for site, rses in out.items()}


class SiteMap:
    """Reads the :class:`RseTable` of a fetch (see the module docstring)."""

    def __init__(self, config: RucioSourceConfig, overrides: Mapping[str, Site]) -> None:
        self.config = config
        self.overrides = overrides  # ``[sites]``: RSE -> site, checked
        self._unmapped: ProblemLog[str] = ProblemLog(log, once_per_process=True)

    def read(
        self, wire: RucioWire, last: RseTable, now: datetime, drains: Sequence[Drain] = ()
    ) -> RseTable:
        """The RSEs of ``rse_expression`` and their sites, reusing ``last``'s attributes
        while younger than ``rse_attributes_max_age_s`` (by ``now``), with their availability
        (:func:`availability`) judged at ``now`` with the operator's ``drains``."""
        expression = self.config.rse_expression
        try:
            found = wire.list_rses(expression)
        except InvalidExpression as exc:
            raise PermanentSourceError(
                f"rucio: rse_expression {expression!r} is invalid or matches no RSE"
            ) from exc.__cause__
        rses: dict[str, Rse] = {}
        invalid = 0
        for record in found:
            name = record.get("rse") if isinstance(record, dict) else None
            if not isinstance(name, str):
                invalid += 1
                continue
            rse = self._rse(wire, sys.intern(name), last.rses.get(name), now)
            if rse.site is None:
                self._log_unmapped(name)
            rses[rse.name] = rse
        statuses = availability(wire, rses, last, now, drains)
        return RseTable(rses, invalid, statuses)

    def _rse(self, wire: RucioWire, name: str, last: Rse | None, now: datetime) -> Rse:
        """One RSE: its ``[sites]`` entry, else its attributes as last read when young
        enough, else read now."""
        site = self.overrides.get(name)
        if site is not None:
            return Rse(name, site)
        max_age_s = self.config.rse_attributes_max_age_s
        read_at = None if last is None else last.attributes_read_at
        if last is not None and read_at is not None and younger(read_at, now, max_age_s):
            return last
        attributes = wire.rse_attributes(name)
        if not isinstance(attributes, dict):
            return Rse(name, None, _NO_ATTRIBUTES, now)
        return Rse(name, self._site(name, attributes), MappingProxyType(dict(attributes)), now)

    def _site(self, rse: str, attributes: Mapping[str, Any]) -> Site | None:
        """The site an RSE's ``site_attribute`` names; None (logged) when absent or invalid."""
        value = attributes.get(self.config.site_attribute)
        if value is None:
            return None
        site = site_or_none(str(value))
        if site is None:
            log.warning(
                "rucio: RSE %s has an invalid %s attribute %r; ignoring the RSE",
                rse,
                self.config.site_attribute,
                value,
            )
        return site

    def _log_unmapped(self, rse: str) -> None:
        self._unmapped.problem(
            rse,
            "rucio: RSE %s has no %r attribute and no [sites] entry; its datasets are ignored",
            rse,
            self.config.site_attribute,
        )


def availability(
    wire: RucioWire,
    rses: Mapping[str, Rse],
    last: RseTable,
    now: datetime,
    drains: Sequence[Drain],
) -> tuple[StorageStatus, ...]:
    """Each mapped RSE's status: ``availability_read`` from one ``list_rses()`` (every RSE's
    record; an RSE missing from it states nothing), a drain, and the mapped RSEs of ``last``
    gone from the expression (unavailable for this fetch)."""
    disabled: dict[str, str] = {}
    for record in wire.list_rses(None):
        if isinstance(record, dict) and record.get("availability_read") is False:
            disabled[str(record.get("rse"))] = "availability_read false"
    named = STORAGE_PATTERN.fullmatch  # an RSE whose name no status can carry: always serves
    out = [
        judge(Statement(rse.site, name, "RSE", disabled.get(name)), drains, now)
        for name, rse in sorted(rses.items())
        if rse.site is not None and named(name)
    ]
    gone = "no longer listed by rse_expression (deleted, or out of the expression)"
    out += [
        StorageStatus(rse.site, name, "RSE", available=False, reason=gone)
        for name, rse in sorted(last.rses.items())
        if rse.site is not None and name not in rses and named(name)
    ]
    return tuple(out)


def younger(at: datetime, now: datetime, max_age_s: float) -> bool:
    """True if what was read ``at`` is less than ``max_age_s`` old at ``now`` (a time in the
    future, the clock having gone back, is not trusted: False)."""
    return 0 <= (now - at).total_seconds() < max_age_s
