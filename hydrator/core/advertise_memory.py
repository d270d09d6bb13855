"""What advertising remembers between cycles (pure): each site's last
:func:`~.advertise.advertise` answer, reused while its inputs are the same
(:class:`LastAdvertised`), and which sites started or stopped being cut to fit
(:func:`over_size_news`; the daemon logs each change once). How big an ad is:
:mod:`.adsize`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from hydrator.core.advertise import Advertised
from hydrator.domain import DatasetId, Site, SiteView


def stamp_width(view: SiteView) -> int:
    """Characters the ``updated`` time takes in an ad (0: none); the ad's size changes with
    it, so :class:`LastAdvertised` compares it."""
    return 0 if view.updated is None else len(str(int(view.updated.timestamp())))


class LastAdvertised:
    """A site's :func:`~.advertise.advertise` answer, reused while its inputs are the same: an equal
    unstamped view (the core hands on an unchanged site's view as is, so the comparison meets the
    same objects item by item and costs little), the same demand, the same storage statuses and
    reasons, and an ``updated`` time of the same width in the ad (the size checks see the rendered
    ad), and the same bytes of lines added outside the lists (``extra_bytes``: the near line).
    Everything else :func:`~.advertise.advertise` reads is fixed per service (policy, configuration)
    or follows from the view (the held replicas of its site). Saves re-rendering over-size ads each
    cycle to find how much fits."""

    __slots__ = ("advertised", "contents", "extra_bytes", "stamp_width", "stated", "wanted")

    def __init__(
        self,
        contents: SiteView,
        view: SiteView,
        wanted: dict[DatasetId, int],
        advertised: Advertised,
        extra_bytes: int = 0,
    ) -> None:
        self.contents = contents
        self.stamp_width = stamp_width(view)
        self.wanted = wanted
        self.advertised = advertised
        self.stated = (view.storages, view.unavailable)  # storage and drains
        self.extra_bytes = extra_bytes

    def fits(
        self,
        contents: SiteView,
        view: SiteView,
        wanted: Mapping[DatasetId, int],
        extra_bytes: int = 0,
    ) -> bool:
        """The remembered answer holds for ``view`` (whose unstamped contents are
        ``contents``) under the demand ``wanted``, with ``extra_bytes`` of other lines."""
        return (
            contents == self.contents
            and extra_bytes == self.extra_bytes
            and stamp_width(view) == self.stamp_width
            and wanted == self.wanted
            and (view.storages, view.unavailable) == self.stated
        )

    def stamped(self, view: SiteView) -> Advertised:
        """The remembered answer for the (equal) ``view`` with its ``updated`` time."""
        known = self.advertised
        return replace(known, view=replace(known.view, updated=view.updated))


@dataclass(frozen=True)
class OverSizeNews:
    """Sites whose ads are cut to fit now (``over``), those newly cut (``started``, with how
    many datasets each leaves out) and those that fit again (``ended``), both by name."""

    over: frozenset[Site]
    started: tuple[tuple[Site, int], ...]
    ended: tuple[Site, ...]


def over_size_news(before: frozenset[Site], advertised: Mapping[Site, Advertised]) -> OverSizeNews:
    """Compare the sites cut to fit ``before`` with this cycle's ``advertised``."""
    over = frozenset(site for site, a in advertised.items() if a.over_size)
    started = tuple((site, advertised[site].over_size) for site in sorted(over - before))
    return OverSizeNews(over, started, tuple(sorted(before - over)))
