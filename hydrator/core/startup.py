"""What the daemon serves from its saved state before its first cycle, and what ``hydrator
show`` prints from it (pure)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from functools import partial
from typing import NamedTuple

from hydrator.core.adsize import ad_size
from hydrator.core.advertise import AdvertisePolicy, advertise
from hydrator.core.model import Model
from hydrator.core.render import AdAttributes
from hydrator.core.storage import Drain
from hydrator.domain import Replica, Site, SiteView, State


class Startup(NamedTuple):
    """What the daemon starts from (:func:`startup_from`): the saved state's
    :class:`~hydrator.core.model.Model`, which the runtime holds and hands to its first plan;
    the views advertised until the first cycle (:func:`startup_views`); and every site's full
    lists with their ``updated`` times, which the JSON views serve (empty when nothing is
    advertised)."""

    model: Model
    advertised: dict[Site, SiteView]
    full: dict[Site, SiteView]


def startup_from(
    state: State,
    drains: Iterable[Drain],
    now: datetime,
    policy: AdvertisePolicy,
    attrs: AdAttributes,
    *,
    as_read: Mapping[str, Sequence[Replica]] | None = None,
) -> Startup:
    """The :class:`Startup` from the saved ``state`` (``as_read``: per source, its replicas
    in the order the store read them, which builds a one-source state's views without
    sorting) with the active ``drains`` at ``now``. In demand mode nothing is advertised nor
    built (the demand is not known yet; hooks keep their last good copy)."""
    model = Model.of(state, as_read=as_read)
    if policy.demand_only:
        return Startup(model, {}, {})
    advertised = startup_views(model.served_now(drains, now), policy, attrs)
    return Startup(model, advertised, model.stamped_views() if advertised else {})


def saved_views(state: State, drains: Iterable[Drain], now: datetime) -> dict[Site, SiteView]:
    """The saved ``state``'s views as the daemon serves them at ``now``: every source's
    storage statuses and the ``drains`` active then applied (``hydrator show``)."""
    return Model.of(state).served_now(drains, now)


def startup_views(
    served: Mapping[Site, SiteView], policy: AdvertisePolicy, attrs: AdAttributes
) -> dict[Site, SiteView]:
    """The ``served`` views (the saved ones with the saved storage statuses and the drains
    active now: a drained site must not be advertised again by a restart), cut to size as
    :func:`advertise` cuts them with no demand; :func:`startup_from` calls it only outside demand
    mode."""
    size = partial(ad_size, attrs=attrs, max_ad_bytes=policy.max_ad_bytes)
    return {s: advertise(v, {}, policy, size).view for s, v in served.items()}
