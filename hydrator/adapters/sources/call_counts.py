"""The requests one fetch (or targeted read) of a source sent, counted by name:
:class:`CallCounts`, the one counter both the DMAPI and the Rucio source use.

Each fetch's :class:`~._deadline.Run` holds a new one; the source copies :meth:`CallCounts.counts`
into ``calls_last_fetch`` (or ``calls_last_read``) when the fetch ends, which the runtime reads
into ``hydrator_source_calls_total`` (:class:`~hydrator.core.ports.CountsCalls`).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable


class CallCounts:
    """Requests sent, retries included, by name (a client method such as ``list_rses``, or one
    name for every request such as DMAPI's ``request``). Thread-safe: a fetch may send its
    requests from several threads.

    The ``names`` given are counted from zero (they are in :meth:`counts` even when no request
    was made); any other name is there from its first request on, in the order first counted.
    """

    def __init__(self, names: Iterable[str] = ()) -> None:
        self._counts = dict.fromkeys(names, 0)
        self._lock = threading.Lock()

    def count(self, name: str) -> None:
        """One more request named ``name``."""
        with self._lock:
            self._counts[name] = self._counts.get(name, 0) + 1

    def counts(self) -> dict[str, int]:
        """Name -> requests so far (a copy)."""
        with self._lock:
            return dict(self._counts)
