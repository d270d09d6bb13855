"""Catalogue sources: each turns one external system into a :class:`~hydrator.domain.Snapshot`,
behind the :class:`~hydrator.core.ports.Source` port.

A source is one adapter module (``static``, ``rucio``, ``dmapi``); only that module imports its
library. It raises :class:`~hydrator.errors.TransientSourceError` or
:class:`~hydrator.errors.PermanentSourceError` when it has no usable answer; it never returns a
partial answer as if it were complete. Records it cannot use (malformed, invalid names, storage
elements with no site) are counted in ``Snapshot.invalid`` / ``Snapshot.unmapped`` and skipped.
The helpers below are what the sources share for that: :func:`site_or_none` for a site name read
from an untrusted record, :class:`OnceLog` to log each such problem once per process. The
sources' HTTP shares two modules: ``call_counts`` (the requests one fetch sent, counted by name) and
``_deadline`` (a fetch's total deadline over every request it makes).
"""

from __future__ import annotations

import logging

from hydrator.domain import Site, check_site
from hydrator.logs import MAX_PROBLEMS, ProblemLog
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


class OnceLog(ProblemLog[str]):
    """The sources' :class:`~hydrator.logs.ProblemLog`: a warning about a record the first time
    its ``key`` is seen, so that a bad record repeated in every answer is logged once per
    process, not once per cycle (thread-safe; past ``limit`` keys new ones are not logged,
    the caller still counts them)."""

    def __init__(self, logger: logging.Logger, limit: int = MAX_PROBLEMS) -> None:
        super().__init__(logger, limit=limit, once_per_process=True)

    def warn(self, key: str, message: str, *args: object) -> None:
        """``logger.warning(message, *args)`` unless ``key`` was seen before (or the limit hit)."""
        self.problem(key, message, *args)
