"""Publish site ClassAds into an HTCondor collector (the one module that advertises with htcondor2).

Two kinds of update, both through ``htcondor2.Collector.advertise`` (site ads and slot
merges), then four rules for when and by whom slots are merged:

* **site ads**: one generic ad per site, ``MyType = "DataLocality"``, ``Name`` = the site, with
  the site ClassAd's attributes (:func:`hydrator.core.render.site_classad`), so that
  ``condor_status -any -constraint 'MyType == "DataLocality"'`` shows what the pool knows.
  Sent (``UPDATE_AD_GENERIC``) when missing, different, or not refreshed for ``refresh_s``;
  they carry ``ClassAdLifetime`` so they expire if the hydrator stops. A site that went away is
  withdrawn with ``INVALIDATE_ADS_GENERIC``.
* **slot merges**: ``MERGE_STARTD_AD`` adds the site's attributes to every slot ad (static,
  partitionable, dynamic) whose ``slot_site_attribute`` names the site. The collector matches by
  ``Name`` only, and the startd's next update wipes merged attributes (docs/platform.md), so
  each cycle re-merges exactly the slots whose digest attribute is missing or differs, or whose
  updated attribute is older than ``refresh_s`` while a newer value exists; a current slot gets
  nothing.
  A slot that carries the site's current digest and only needs a newer updated value gets the digest
  and updated attributes alone (:func:`~hydrator.core.collector_merges.slim_merge`): the digest
  covers every list the ad carries, and a startd update wipes all merged attributes at once, so
  the lists it already carries are the ones it would be sent again (a 60 kB merge becomes a
  ~100-byte one).
* **merge budget** (``merge_budget_bytes_per_s``): full merges that replace a slot's lists with its
  site's new ones are charged their bytes against a token bucket (:mod:`hydrator.core.merge_budget`,
  :func:`~hydrator.core.collector_merges.within_budget`); what does not fit is deferred to the
  next repair looks.
  Merges into bare slots (wiped, new) and slim merges are free. A change thus reaches every slot of
  its site at once while the bucket holds it, and the collector's load under changes everywhere all
  the time is the budget's rate (docs/coverage.md, "The merge budget").
* **per-slot window** (``merge_min_interval_s``, 0 by default: off): every full merge also writes
  ``DataLocalityMerged`` (:data:`MERGED_ATTRIBUTE`, epoch seconds of the last change of the lists it
  carries: the merge's own time when it changes them, the time the site's current lists were first
  published when it re-sends them to a bare slot,
  :func:`~hydrator.core.collector_merges.merged_value`), which the startd's next update wipes
  with the rest. A slot that carries it and an older digest was merged by us and not wiped
  since: it is re-merged only once that value is ``merge_min_interval_s`` old
  (:func:`defer_merges`), by the next cycle or the next repair look, whichever comes first (the
  trailing edge). The value is read back from the collector each cycle, so a restarted daemon keeps
  the same pace. Slots without it (new glideins and dynamic slots, wiped ones, or slots a hook alone
  fed) are merged at once; site ads and the hook's HTTP files follow every cycle. ``refresh_s``
  keeps its promise: a deferred slot whose ``DataLocalityUpdated`` is older than ``refresh_s`` while
  a newer one exists is re-merged anyway.
* **repair looks** (:meth:`CollectorPublisher.repair`, called by the runtime's repair watch
  between cycles): one query for the slot ads of the last published sites that lack their
  site's current digest (:meth:`CollectorPublisher._stale_slots`), then the merges above into
  exactly those slots, from the last cycle's rendered ads; no catalogue read. What a look
  works from and decides is :mod:`hydrator.adapters.htcondor.slot_repairs`.
* **the looks deliver** (:meth:`CollectorPublisher.hand_merges_to_repairs`, called when the
  daemon schedules its repair watch): from then on a publish sends site ads and takes its
  census but merges into no slot; what it finds stale is *handed* to the next look
  (:func:`cycle_share`), with the slim merges due (:func:`refreshes_due`). A cycle thus never
  waits for slot merges, and one path sends them. Without the call (no watch) a publish
  merges as above.

Cost: ``advertise`` deep-copies each ad (``ClassAd::CopyFrom`` in htcondor2's
``collector.cpp``) and serialises it, which costs client CPU per ad and per call, and
copying a site's attributes into a new ad costs about as much again (the figures:
docs/performance.md). Because ``advertise`` copies each ad as it sends it, an ad may be
changed once the call returns: each site's merges reuse at most ``batch_size`` ads, built once
per cycle, changing only ``Name`` between calls (:func:`named_batches`).

Every call is preceded by a collector query, so a collector that is down fails the cycle quickly
(connection refused, or ``QUERY_TIMEOUT`` = ``timeout_s``) with :class:`PublishError`; the
daemon retries on its next cycle. ``htcondor2`` raises builtin exceptions (``RuntimeError``,
``OSError``, ``ValueError``, ``HTCondorException``); all of them become ``PublishError`` here.
Authentication: an IDTOKEN in ``token_dir`` (``SEC_TOKEN_DIRECTORY``), whose identity the
collector authorizes for ADVERTISE and NEGOTIATOR (MERGE_STARTD_AD needs NEGOTIATOR).

The decisions named above (:func:`~hydrator.core.collector_merges.slim_merge`,
:func:`~hydrator.core.collector_merges.within_budget`, :func:`defer_merges`, :func:`cycle_share`,
:func:`~hydrator.core.collector_merges.merged_value`, which ads are current) are pure and live in
:mod:`hydrator.core.collector_merges`; this module reads, builds ads and sends, for the cycles
and for the repair looks.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any, TypeVar

import classad2
import htcondor2

from hydrator.adapters.htcondor.condor_queue import HTCONDOR_ERRORS
from hydrator.adapters.htcondor.slot_repairs import SlotRepairs
from hydrator.adapters.retry import RetryPolicy, call_with_retries
from hydrator.config import ClassAdConfig, CollectorConfig
from hydrator.core.collector_merges import (
    Rendered,
    Target,
    as_target,
    cycle_share,
    defer_merges,
    merge_bytes,
    merge_groups,
    plan_merges,
    plan_site_ads,
    refreshes_due,
)
from hydrator.core.merge_budget import MergeBudget
from hydrator.core.ports import PublishReport
from hydrator.core.render import published_updated, site_classad
from hydrator.core.slot_coverage import (
    Current,
    RepairReport,
    SiteCoverage,
    SlotSeen,
    census,
    stale_constraint,
)
from hydrator.domain import Site, SiteView
from hydrator.errors import PublishError

log = logging.getLogger(__name__)

SITE_AD_TYPE = "DataLocality"
MERGED_ATTRIBUTE = "DataLocalityMerged"
"""Slot attribute: epoch seconds of the cycle that last merged the site's whole ad into it."""
ADVERTISE_ATTEMPTS = 2
SLOT_PROJECTION_EXTRA = ("LastHeardFrom",)
T = TypeVar("T")


def ad_of(exprs: Iterable[tuple[str, Any]]) -> classad2.ClassAd:
    """A new ad holding ``exprs`` (each expression copied in by classad2)."""
    ad = classad2.ClassAd()
    for key, expr in exprs:
        ad[key] = expr
    return ad


def batches(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    """``items`` in consecutive slices of at most ``size``."""
    for start in range(0, len(items), size):
        yield items[start : start + size]


def named_batches(
    template: Sequence[tuple[str, Any]], names: Sequence[str], size: int
) -> Iterator[list[classad2.ClassAd]]:
    """``names`` in batches of at most ``size`` ads, each ``template``'s attributes plus
    ``Name``. Only ``min(len(names), size)`` ads are built: each batch reuses them, so a
    batch must be consumed (sent) before the next is asked for."""
    ads: list[classad2.ClassAd] = []
    for chunk in batches(names, size):
        while len(ads) < len(chunk):
            ads.append(ad_of(template))
        for ad, name in zip(ads, chunk, strict=False):
            ad["Name"] = name
        yield ads[: len(chunk)]


class CollectorPublisher:
    """:class:`~hydrator.core.ports.Publisher` into one collector (see the module doc)."""

    def __init__(
        self,
        config: CollectorConfig,
        attrs: ClassAdConfig,
        collector: htcondor2.Collector | None = None,
    ) -> None:
        self.config = config
        self.attrs = attrs
        self._collector = collector if collector is not None else connect(config)
        self._rendered: dict[Site, Rendered] = {}
        """Last cycle's rendered ads, keyed by (digest, published updated), which determine
        the ad: an unchanged site is not rendered again."""
        self._lock = threading.Lock()  # a cycle's publish and a repair look, one at a time
        self._budget = MergeBudget(config.merge_budget_bytes_per_s)  # change merges' bytes
        self._handed_to_repairs = False  # the repair looks alone deliver slot merges
        self._repairs = SlotRepairs(config, self._budget, self._stale_slots, self._merge)

    @property
    def name(self) -> str:
        return "collector"

    @property
    def collector(self) -> htcondor2.Collector:
        """The connection (with ``QUERY_TIMEOUT``), shared with the pool probe."""
        return self._collector

    def publish(
        self, sites: Mapping[Site, SiteView], removed: frozenset[Site], now: datetime
    ) -> PublishReport:
        """Bring site ads and slot ads in line with ``sites``; withdraw ``removed``.

        Raises :class:`PublishError` if the collector cannot be queried or an update cannot be
        delivered (nothing is retried within a cycle: the next cycle re-sends what is missing).
        """
        with self._lock:
            return self._publish(sites, removed, now)

    def _publish(
        self, sites: Mapping[Site, SiteView], removed: frozenset[Site], now: datetime
    ) -> PublishReport:
        rendered = self._render_all(sites)
        now_s = now.timestamp()
        self._repairs.note_current(rendered, now_s)
        sent: dict[str, int] = {}
        current = 0
        if self.config.site_ads:
            send, gone, current_ads = plan_site_ads(
                self._site_ads(), rendered, now_s, self.config.refresh_s
            )
            gone = sorted(set(gone) | (removed - rendered.keys()))
            sent["site_ad"] = self._advertise_site_ads(send, rendered)
            sent["invalidate"] = self._invalidate(gone)
            current += current_ads
        slots = PublishReport()
        if self.config.merge_slots:
            slots = self._publish_slots(rendered, now_s)
            sent["merge"] = slots.sent["merge"]
        return PublishReport(
            sent={k: v for k, v in sent.items() if v},
            skipped_current=current + slots.skipped_current,
            deferred=slots.deferred,
            handed=slots.handed,
        )

    def _publish_slots(self, rendered: Mapping[Site, Rendered], now_s: float) -> PublishReport:
        """The cycle's part in the slot ads: one query of every slot ad (the census), then
        the merges it sends itself (none once handed to the repair looks). ``sent`` holds
        ``merge`` only."""
        refresh_s = self.config.refresh_s
        seen = self._slots()
        targets = [t for t in map(as_target, seen) if t is not None]
        stale, current = plan_merges(targets, rendered, now_s, refresh_s)
        due, deferred = defer_merges(
            stale, rendered, now_s, refresh_s, self.config.merge_min_interval_s
        )
        self._repairs.take_census(seen, stale, due)
        todo, held, handed = cycle_share(
            due, rendered, self._budget, now_s, self._handed_to_repairs
        )
        self._repairs.hand_refreshes(refreshes_due(handed, rendered, frozenset()))
        merges, merged_bytes = self._merge(todo, rendered, now_s)
        self._repairs.count_cycle_bytes(merged_bytes)
        return PublishReport({"merge": merges}, {}, current, deferred + held, len(handed))

    def hand_merges_to_repairs(self) -> None:
        """From now on a publish merges into no slot: the repair looks deliver every slot
        merge (:class:`~hydrator.core.ports.RepairsSlots`; the module doc)."""
        with self._lock:
            self._handed_to_repairs = True

    def close(self) -> None:
        """Nothing to release: htcondor2 opens a connection per call."""

    # -- rendering ------------------------------------------------------------------------------

    def _render_all(self, sites: Mapping[Site, SiteView]) -> dict[Site, Rendered]:
        """Each site's ad, rendered again only when its digest or published updated value
        changed since the last cycle (the ads are never modified once rendered)."""
        out: dict[Site, Rendered] = {}
        for site, view in sites.items():
            ad = self._rendered.get(site)
            if (
                ad is None
                or ad.digest != view.digest
                or ad.updated != published_updated(view, self.attrs)
            ):
                ad = self._render(view)
            out[site] = ad
        self._rendered = out
        return out

    def _render(self, view: SiteView) -> Rendered:
        ad = site_classad(view, self.attrs, says_available=True)  # a merged reason is reset
        return Rendered(ad, view.digest, int(ad[self.attrs.updated_attribute]))

    # -- queries --------------------------------------------------------------------------------

    def _query(self, ad_type: Any, constraint: str, projection: list[str]) -> list[Any]:
        try:
            ads: list[Any] = self._collector.query(ad_type, constraint, projection)
        except HTCONDOR_ERRORS as exc:
            raise PublishError(f"collector {self._where()}: query failed: {exc}") from exc
        return ads

    def _slot_projection(self) -> list[str]:
        return [
            "Name",
            self.config.slot_site_attribute,
            self.attrs.digest_attribute,
            self.attrs.updated_attribute,
            MERGED_ATTRIBUTE,
            *SLOT_PROJECTION_EXTRA,
        ]

    def _slots(self, constraint: str = "true") -> list[SlotSeen]:
        """Every slot ad matching ``constraint`` (by default all, so that slots without a
        site attribute are counted), projected to what merges and coverage need."""
        ads = self._query(htcondor2.AdType.Slot, constraint, self._slot_projection())
        return [s for s in map(self._seen, ads) if s is not None]

    def _seen(self, ad: Any) -> SlotSeen | None:
        name = ad.get("Name")
        if not isinstance(name, str):
            return None
        site, digest = ad.get(self.config.slot_site_attribute), ad.get(self.attrs.digest_attribute)
        updated, merged, heard = (
            ad.get(self.attrs.updated_attribute),
            ad.get(MERGED_ATTRIBUTE),
            ad.get("LastHeardFrom"),
        )
        return SlotSeen(
            name,
            site if isinstance(site, str) else None,
            digest if isinstance(digest, str) else None,
            merged if isinstance(merged, int) else None,
            heard if isinstance(heard, int) else None,
            updated if isinstance(updated, int) else None,
        )

    def _site_ads(self) -> list[Target]:
        ads = self._query(
            htcondor2.AdType.Any,
            f"MyType == {classad2.quote(SITE_AD_TYPE)}",
            ["Name", self.attrs.digest_attribute, self.attrs.updated_attribute, "LastHeardFrom"],
        )
        return [t for t in (self._target(ad, "Name") for ad in ads) if t is not None]

    def _target(self, ad: Any, site_attr: str) -> Target | None:
        name, site = ad.get("Name"), ad.get(site_attr)
        if not isinstance(name, str) or not isinstance(site, str):
            return None
        digest = ad.get(self.attrs.digest_attribute)
        updated = ad.get(self.attrs.updated_attribute)
        heard = ad.get("LastHeardFrom")
        merged = ad.get(MERGED_ATTRIBUTE)
        return Target(
            name,
            Site(site),
            digest if isinstance(digest, str) else None,
            updated if isinstance(updated, int) else None,
            heard if isinstance(heard, int) else None,
            merged if isinstance(merged, int) else None,
        )

    # -- updates --------------------------------------------------------------------------------

    def _advertise(
        self, items: Sequence[T], build: Callable[[T], classad2.ClassAd], command: str
    ) -> int:
        """Send one ad per item, built batch by batch."""
        size = self.config.batch_size
        built = ([build(item) for item in batch] for batch in batches(items, size))
        return self._send_batches(built, len(items), command)

    def _send_batches(
        self, ad_batches: Iterable[list[classad2.ClassAd]], total: int, command: str
    ) -> int:
        """One advertise call per batch, each batch built only when the previous one was sent
        (ads of up to ``max_ad_bytes`` for 20k slots would hold gigabytes); ``total`` ads in
        all, for the error message. Returns the number of ads sent."""
        sent = 0
        for batch in ad_batches:
            try:
                self._send(batch, command)
            except HTCONDOR_ERRORS as exc:
                raise PublishError(
                    f"collector {self._where()}: {command} failed after {sent} of {total} "
                    f"ads: {exc}"
                ) from exc
            sent += len(batch)
        return sent

    def _send(self, batch: list[classad2.ClassAd], command: str) -> None:
        """One advertise call, tried twice: the first call after a collector restart fails on
        the security session cached for the old collector, and that failure drops the session
        (seen with 25.14.1); the second negotiates a new one."""
        call_with_retries(
            lambda _: self._collector.advertise(batch, command, True),
            RetryPolicy(ADVERTISE_ATTEMPTS, backoff_s=0),
            logger=log,
            retry_on=HTCONDOR_ERRORS,
        )

    def _advertise_site_ads(self, sites: list[Site], rendered: Mapping[Site, Rendered]) -> int:
        lifetime = int(2 * self.config.refresh_s + 60)

        def site_ad(site: Site) -> classad2.ClassAd:
            ad = ad_of(rendered[site].exprs)
            ad["MyType"] = SITE_AD_TYPE
            ad["Name"] = str(site)
            ad["ClassAdLifetime"] = lifetime
            return ad

        return self._advertise(sites, site_ad, "UPDATE_AD_GENERIC")

    def _invalidate(self, sites: Sequence[Site]) -> int:
        def query(site: Site) -> classad2.ClassAd:
            ad = classad2.ClassAd({"MyType": "Query", "TargetType": SITE_AD_TYPE})
            ad["Name"] = str(site)
            ad["Requirements"] = classad2.ExprTree(
                f"MyType == {classad2.quote(SITE_AD_TYPE)} && Name == {classad2.quote(site)}"
            )
            return ad

        return self._advertise(sites, query, "INVALIDATE_ADS_GENERIC")

    def _merge(
        self, slots: Sequence[Target], rendered: Mapping[Site, Rendered], now_s: float
    ) -> tuple[int, int]:
        """Merge each slot's site attributes into it: per site, kind (full, with
        :data:`MERGED_ATTRIBUTE`, or digest and updated alone:
        :func:`~hydrator.core.collector_merges.slim_merge`) and merge time
        (:func:`~hydrator.core.collector_merges.merged_value`) one template, whose ads are reused
        across that group's batches (:func:`named_batches`). Returns (ads sent, their old-syntax
        bytes)."""
        groups = merge_groups(slots, rendered, self._repairs.current, now_s)
        slim_keys = {self.attrs.digest_attribute, self.attrs.updated_attribute}

        def template(site: Site, slim: bool, merged_s: int) -> list[tuple[str, Any]]:
            if slim:
                return [(k, e) for k, e in rendered[site].exprs if k in slim_keys]
            return [*rendered[site].exprs, (MERGED_ATTRIBUTE, merged_s)]

        built = (
            batch
            for key, names in sorted(groups.items())
            for batch in named_batches(template(*key), names, self.config.batch_size)
        )
        sent = self._send_batches(built, len(slots), "MERGE_STARTD_AD")
        return sent, merge_bytes(groups, rendered)

    # -- coverage and repair looks --------------------------------------------------------------

    def coverage_now(
        self, digests: Mapping[Site, str]
    ) -> tuple[dict[Site, SiteCoverage], int, int]:
        """One look at every slot ad now (``hydrator show``): coverage per site of
        ``digests``, slot ads without a site attribute, naming no site of ours. A site's
        current digest is its DataLocality ad's (what the daemon published), else the one
        given; slots held back by ``merge_min_interval_s`` count as stale here. Raises
        :class:`PublishError` when the collector cannot be queried."""
        published = {t.site: t.digest for t in self._site_ads() if t.digest is not None}
        current = {site: Current(published.get(site, d), 0.0) for site, d in digests.items()}
        return census(self._slots(), current, {})

    def repair(self, now: datetime, interval_s: float) -> RepairReport:
        """One repair look (docs/coverage.md): one query for the slot ads of our sites that
        lack their site's current digest (those held back by ``merge_min_interval_s`` left
        out), then the same merges a cycle makes, into exactly those slots (a slot whose
        earlier repair was not kept waits a back-off from ``interval_s`` up to
        :data:`~hydrator.adapters.htcondor.slot_repairs.MAX_REPAIR_BACKOFF_S`). No catalogue
        read; sites are those of the last publish. Raises :class:`PublishError` when the
        collector cannot be queried or a merge cannot be delivered."""
        with self._lock:
            return self._repairs.look(now, interval_s, self._rendered)

    def _stale_slots(self, current: Mapping[Site, Current], now_s: float) -> list[SlotSeen]:
        """A repair look's query: the slot ads of ``current``'s sites that lack their site's
        digest, those held back by ``merge_min_interval_s`` left out."""
        interval = self.config.merge_min_interval_s
        after = int(now_s - interval) if interval > 0 else None
        return self._slots(
            stale_constraint(
                self.config.slot_site_attribute,
                self.attrs.digest_attribute,
                MERGED_ATTRIBUTE,
                current,
                after,
            )
        )

    def _where(self) -> str:
        return self.config.pool or "(local configuration)"


def connect(config: CollectorConfig) -> htcondor2.Collector:
    """Point the HTCondor library at the token directory and timeout, then make a Collector."""
    if config.token_dir is not None:
        htcondor2.param["SEC_TOKEN_DIRECTORY"] = str(config.token_dir)
    htcondor2.param["QUERY_TIMEOUT"] = str(max(1, int(config.timeout_s)))
    try:
        return htcondor2.Collector(config.pool)
    except HTCONDOR_ERRORS as exc:
        raise PublishError(f"collector {config.pool}: {exc}") from exc


def build(config: CollectorConfig, attrs: ClassAdConfig) -> CollectorPublisher:
    """The publisher for ``[collector]`` (called by :mod:`hydrator.runtime.wiring`)."""
    return CollectorPublisher(config, attrs)
