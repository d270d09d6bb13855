"""How big a site's ad is (pure).

:func:`~.advertise.advertise` cuts a view to ``[classad] max_ad_bytes`` by asking a
``size`` function; :func:`ad_size` is the one the daemon gives it (cheap bounds from the names,
a rendering only between them). What is kept of cutting ads between cycles is in
:mod:`.advertise_memory`.
"""

from __future__ import annotations

from dataclasses import replace
from itertools import chain
from operator import itemgetter

from hydrator.core.advertise import MIN_NAME_BYTES
from hydrator.core.render import AdAttributes, render_cron
from hydrator.domain import SiteView

_first = itemgetter(0)


def ad_size(view: SiteView, attrs: AdAttributes, max_ad_bytes: int) -> int:
    """Bytes of ``view``'s ad as the hook gets it (:func:`~hydrator.core.render.render_cron`), or a
    bound on the same side of ``max_ad_bytes`` (all :func:`~.advertise.advertise` compares it with):
    bounds from the names over the empty ad (each name costs its length and two quotes, plus at most
    a comma; so at least ``MIN_NAME_BYTES``, which settles a long list at once); a rendering only
    between the bounds."""
    count = len(view.available) + len(view.partial) + len(view.replicating)
    if MIN_NAME_BYTES * count > max_ad_bytes:  # too many names to fit, whatever their length
        return MIN_NAME_BYTES * count
    empty = replace(view, available=(), partial=(), replicating=())
    names = chain(view.available, map(_first, view.partial), map(_first, view.replicating))
    # len("scope:name") + 2 quotes per name, summed in C (DatasetId is the tuple)
    text = sum(map(len, map(":".join, names))) + 2 * count
    lower = len(render_cron(empty, attrs).encode("utf-8")) + text
    upper = lower + count
    if upper <= max_ad_bytes:
        return upper
    if lower > max_ad_bytes:
        return lower
    return len(render_cron(view, attrs).encode("utf-8"))
