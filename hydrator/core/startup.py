"""What the daemon serves from its saved state before its first cycle (pure)."""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial

from hydrator.core.adsize import ad_size
from hydrator.core.advertise import AdvertisePolicy, advertise
from hydrator.core.render import AdAttributes
from hydrator.domain import Site, SiteView


def startup_views(
    served: Mapping[Site, SiteView], policy: AdvertisePolicy, attrs: AdAttributes
) -> dict[Site, SiteView]:
    """Nothing in demand mode (the demand is not known yet; hooks keep their last good
    copy); else the ``served`` views (the saved ones with the saved storage statuses and the
    drains active now: a drained site must not be advertised again by a restart), cut to
    size as :func:`advertise` cuts them with no demand."""
    if policy.demand_only:
        return {}
    size = partial(ad_size, attrs=attrs, max_ad_bytes=policy.max_ad_bytes)
    return {s: advertise(v, {}, policy, size).view for s, v in served.items()}
