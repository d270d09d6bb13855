"""What each site's ad carries, cycle after cycle: the service's side of
:func:`hydrator.core.advertise.advertise`.

:class:`Advertising` holds what it remembers between cycles: each site's last answer
(:class:`~hydrator.core.advertise_memory.LastAdvertised`, reused while its inputs hold), the
sites whose ads are cut to fit (a warning when one starts, a line when it fits again) and the
bytes each ad's near line adds (``[distances]``, counted in ``max_ad_bytes``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from functools import partial

from hydrator.config import ClassAdConfig
from hydrator.core.adsize import ad_size
from hydrator.core.advertise import Advertised, AdvertisePolicy, advertise
from hydrator.core.advertise_memory import LastAdvertised, over_size_news
from hydrator.core.near import near_line_bytes
from hydrator.core.plan import Plan
from hydrator.domain import DatasetId, Site, SiteView
from hydrator.runtime.outcome import SiteAd

log = logging.getLogger(__name__)


class Advertising:
    """Chooses each site's advertised lists under ``policy``, rendering ads with ``attrs``
    only to measure them (:func:`~hydrator.core.adsize.ad_size`)."""

    def __init__(self, policy: AdvertisePolicy, attrs: ClassAdConfig) -> None:
        self.policy, self.attrs = policy, attrs
        self._last: dict[Site, LastAdvertised] = {}  # last cycle's answer, per site
        self._over_size: frozenset[Site] = frozenset()  # sites whose ads were cut to fit
        self._near_bytes: Mapping[Site, int] = {}  # what each ad's near line adds, bytes

    def near(self, near: Mapping[Site, tuple[Site, ...]]) -> None:
        """This cycle's near sites (``[distances]``; empty when off): their lines' bytes
        count in each site's ``max_ad_bytes``."""
        attribute = self.attrs.near_attribute
        self._near_bytes = {site: near_line_bytes(n, attribute) for site, n in near.items()}

    def choose(
        self,
        plan: Plan,
        wanted: Mapping[DatasetId, int],
        published: Mapping[Site, SiteAd],
    ) -> dict[Site, Advertised]:
        """Each of ``plan``'s sites' advertised lists under the demand ``wanted``; a site
        whose inputs are those of last cycle gets last cycle's answer
        (:class:`~hydrator.core.advertise_memory.LastAdvertised` compares each site's lists
        before storage, drains and read times apply: :attr:`~hydrator.core.plan.Plan.contents`).
        ``published``: the ads served until now (an unchanged site's size is its body's
        length)."""
        contents = plan.contents
        policy, size = self.policy, partial(self._ad_size, published)
        last = self._last
        demand = dict(
            wanted
        )  # a copy each LastAdvertised keeps, whatever the caller does with its own
        advertised: dict[Site, Advertised] = {}
        for site, view in plan.sites.items():
            known, near = last.get(site), self._near_bytes.get(site, 0)
            if known is not None and known.fits(contents[site], view, wanted, near):
                advertised[site] = known.stamped(view)
                continue
            advertised[site] = advertise(view, wanted, policy, size)
            last[site] = LastAdvertised(contents[site], view, demand, advertised[site], near)
        for site in last.keys() - plan.sites.keys():
            del last[site]
        self._warn_over_size(advertised)
        return advertised

    def _ad_size(self, published: Mapping[Site, SiteAd], view: SiteView) -> int:
        """:func:`~hydrator.core.adsize.ad_size`, or the ``published`` body's length when the
        site's lists are unchanged; plus its near line (``[distances]``)."""
        near = self._near_bytes.get(view.site, 0)
        old = published.get(view.site)
        if not near and old is not None and old.view.digest == view.digest:
            return len(old.body)
        return ad_size(view, self.attrs, self.policy.max_ad_bytes) + near

    def _warn_over_size(self, advertised: Mapping[Site, Advertised]) -> None:
        """One warning when a site's ad starts being cut to fit, one line when it fits again."""
        news = over_size_news(self._over_size, advertised)
        limit = self.policy.max_ad_bytes
        for site, left_out in news.started:
            log.warning(
                "site %s: its ad would exceed [classad] max_ad_bytes = %d; leaving out %d "
                "dataset(s), least demanded first (hydrator_datasets_unadvertised"
                '{reason="over_size"}); /v1/sites still lists them all',
                site,
                limit,
                left_out,
            )
        for site in news.ended:
            log.info("site %s: its ad fits max_ad_bytes = %d again", site, limit)
        self._over_size = news.over
