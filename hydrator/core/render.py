"""Site ClassAds, rendered with the real ``classad2`` bindings (never by string concatenation).

One ad per site::

    AvailableDatasets = { "ska:obs_1234","ska:skymodel_v3" }
    PartialDatasets = { "ska:obs_1300" }
    ReplicatingDatasets = { }
    StuckDatasets = { "ska:obs_1500" }        (only with [classad] advertise_stuck)
    DataLocalitySite = "SRCNET_CH"
    DataLocalityUpdated = 1732300000
    DataLocalityDigest = "3f5a…"
    DataLocalityUnavailable = "RSE X_DISK: availability_read false"   (see site_classad)
    DataLocalityNearSites = { "SRCNET_UK" }   (only with [distances]; docs/near.md)

Old syntax (:func:`render_old`) is what STARTD_CRON hooks must print; new syntax
(:func:`site_classad`) is what collector updates carry. Names reaching this module are
:class:`~hydrator.domain.DatasetId` objects, valid by construction; :func:`safe_names` checks
them again so that a bug upstream can never put a malformed string into an ad.

It logs what it refuses, the one log call of the core: a refusal is a bug upstream, and
handing it back would change what every renderer returns to their callers in the runtime and
the collector adapter, for a branch no checked name reaches.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Iterable
from typing import Protocol

import classad2

from hydrator.core.storage import unavailable_text
from hydrator.domain import DatasetId, SiteView, check_site
from hydrator.names import NAME_PATTERN, SCOPE_PATTERN

log = logging.getLogger(__name__)

CRON_UPDATE_LINE = "- update:true"


class AdAttributes(Protocol):
    """The attribute names an ad is written with, and how it is written: what the core reads
    of ``[classad]``. The configuration's ``ClassAdConfig`` is one; the core does not import
    the configuration (its validation and defaults are the config layer's business)."""

    @property
    def available_attribute(self) -> str: ...
    @property
    def partial_attribute(self) -> str: ...
    @property
    def replicating_attribute(self) -> str: ...
    @property
    def stuck_attribute(self) -> str: ...
    @property
    def advertise_stuck(self) -> bool: ...
    @property
    def site_attribute(self) -> str: ...
    @property
    def updated_attribute(self) -> str: ...
    @property
    def digest_attribute(self) -> str: ...
    @property
    def updated_resolution_s(self) -> int: ...
    @property
    def unavailable_attribute(self) -> str: ...
    @property
    def near_attribute(self) -> str: ...


# ``scope:name`` as one pattern: neither part may contain a colon, so this accepts exactly the
# pairs whose scope matches SCOPE_PATTERN and name matches NAME_PATTERN: one regex call per
# name instead of two, and no ``str(d)`` method call (what that saves: docs/performance.md).
_DID_PATTERN = re.compile(f"(?:{SCOPE_PATTERN.pattern}):(?:{NAME_PATTERN.pattern})")


def safe_names(datasets: Iterable[DatasetId]) -> list[str]:
    """``scope:name`` strings of the valid datasets; an invalid one is logged and left out.

    Defence in depth: it guards the ads against a ``DatasetId`` built without its checks
    (``tuple.__new__``, the way fast paths build other tuples)."""
    out: list[str] = []
    valid = _DID_PATTERN.fullmatch
    for d in datasets:
        text = f"{d.scope}:{d.name}"  # str(d)
        if valid(text):
            out.append(text)
        else:  # only a DatasetId built without its checks gets here
            log.error("refusing to render invalid dataset name %r", text)
    return out


def published_updated(view: SiteView, attrs: AdAttributes) -> int:
    """``DataLocalityUpdated`` as published: epoch seconds rounded down to the resolution."""
    if view.updated is None:
        return 0
    resolution = attrs.updated_resolution_s
    return int(view.updated.timestamp()) // resolution * resolution


def site_classad(
    view: SiteView, attrs: AdAttributes, *, says_available: bool = False
) -> classad2.ClassAd:
    """The site's attributes as a ClassAd (lists of strings, site, epoch, digest), and why
    some of its storage cannot serve (``unavailable_attribute``) when that is so.

    ``says_available``: write that attribute as ``""`` when all storage can serve, rather
    than leave it out. Collector merges need it (a merge only adds attributes: a reason merged
    earlier would stay in the slot ad until its startd's next update); the execute-node
    hook's answer leaves it out, so that hooks of earlier releases, which refuse attributes
    they do not know, keep working while all storage can serve."""
    updated = published_updated(view, attrs)
    ad = classad2.ClassAd()
    ad[attrs.available_attribute] = safe_names(view.available)
    ad[attrs.partial_attribute] = safe_names(d for d, _ in view.partial)
    ad[attrs.replicating_attribute] = safe_names(d for d, _ in view.replicating)
    if attrs.advertise_stuck:
        ad[attrs.stuck_attribute] = safe_names(view.stuck)
    ad[attrs.site_attribute] = str(view.site)
    ad[attrs.updated_attribute] = updated
    ad[attrs.digest_attribute] = view.digest
    if view.unavailable or says_available:
        ad[attrs.unavailable_attribute] = unavailable_text(view.unavailable)
    if view.near is not None:  # the sites it reads from cheaply ([distances]): names checked
        ad[attrs.near_attribute] = [str(check_site(site)) for site in view.near]
    return ad


def render_old(view: SiteView, attrs: AdAttributes) -> str:
    """Old-syntax ``Attr = value`` lines, one per attribute, newline-terminated."""
    text: str = site_classad(view, attrs).printOld()
    return text


def render_cron(view: SiteView, attrs: AdAttributes) -> str:
    """What a STARTD_CRON job prints: the old-syntax lines, then ``- update:true``.

    ``- update:true`` ends the ad and asks the startd for an immediate collector update
    (docs/platform.md, "STARTD_CRON output").
    """
    return render_old(view, attrs) + CRON_UPDATE_LINE + "\n"


def etag(body: str) -> str:
    """A strong HTTP entity tag for a response body."""
    return '"' + hashlib.sha256(body.encode("utf-8")).hexdigest()[:32] + '"'
