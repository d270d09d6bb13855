"""Ask the pool's schedds for a negotiation cycle (``Schedd.reschedule()``, the command
``condor_reschedule`` sends): each schedd then asks the negotiator to start one, which it does
unless it is busy or inside ``NEGOTIATOR_MIN_INTERVAL``. The schedds are those named in
``[jobs] schedds``, else every one the collector knows, located each time. Authentication: the
IDTOKEN in ``[collector] token_dir``; the identity needs WRITE on the schedds.
"""

from __future__ import annotations

from collections.abc import Sequence

import classad2
import htcondor2

from hydrator.adapters.htcondor.collector import connect
from hydrator.adapters.htcondor.condor_queue import HTCONDOR_ERRORS
from hydrator.config import CollectorConfig
from hydrator.errors import PoolError, PublishError


class ScheddReschedule:
    """One call: every schedd asked once. Raises PoolError naming the schedds that could
    not be located or asked (the others are still asked)."""

    def __init__(self, config: CollectorConfig, names: Sequence[str] = ()) -> None:
        self.config, self.names = config, tuple(names)

    def __call__(self) -> int:
        """Ask every schedd; returns how many were asked."""
        try:  # the token directory and QUERY_TIMEOUT, as merges
            collector = connect(self.config)
        except PublishError as exc:  # connect is the publisher's; here it fails a request
            raise PoolError(str(exc)) from exc
        try:
            found: list[classad2.ClassAd | None] = (
                [collector.locate(htcondor2.DaemonType.Schedd, n) for n in self.names]
                if self.names
                else list(collector.locateAll(htcondor2.DaemonType.Schedd))
            )
        except HTCONDOR_ERRORS as exc:
            raise PoolError(f"cannot locate the schedds: {exc}") from None
        named = zip(self.names, found, strict=False)  # no names: every schedd located
        failed = [f"{n}: not in the collector" for n, ad in named if ad is None]
        for ad in (ad for ad in found if ad is not None):
            try:
                htcondor2.Schedd(ad).reschedule()
            except HTCONDOR_ERRORS as exc:
                failed.append(f"{ad.get('Name', '?')}: {exc}")
        if failed:
            raise PoolError("cannot ask every schedd: " + "; ".join(failed))
        return len(found)
