"""Catalogue sources: each turns one external system into a :class:`~hydrator.domain.Snapshot`,
behind the :class:`~hydrator.core.ports.Source` port.

A source is an adapter module (``static``) or package (``rucio``, ``dmapi``); its library is
imported there only, and in a package by one part of it: Rucio's ``wire`` (rucio-clients and
requests, a contract in ``pyproject.toml``), DMAPI's ``client`` (requests). It raises
:class:`~hydrator.errors.TransientSourceError` or :class:`~hydrator.errors.PermanentSourceError`
when it has no usable answer; it never returns a partial answer as if it were complete. Records
it cannot use (malformed, invalid names, storage elements with no site) are counted in
``Snapshot.invalid`` / ``Snapshot.unmapped`` and skipped; a source logs such a problem once
per process (a :class:`~hydrator.logs.ProblemLog` with ``once_per_process``). The helper below
reads a site name from an untrusted record (:func:`site_or_none`). The sources' HTTP shares
two modules: ``call_counts`` (the requests one fetch sent, counted by name) and ``_deadline``
(a fetch's total deadline over every request it makes, on requests' extension points).
"""

from __future__ import annotations

from hydrator.domain import Site, check_site
from hydrator.names import InvalidNameError


def site_or_none(name: object) -> Site | None:
    """``name`` as a :data:`Site`, or None when it is not a string or not a valid site name
    (the caller decides whether that record is unmapped or invalid, and logs it)."""
    if not isinstance(name, str):
        return None
    try:
        return check_site(name)
    except InvalidNameError:
        return None
