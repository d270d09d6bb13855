"""Which collector ads a cycle or a repair look merges into (pure): which site ads and slot ads
are updated, which wait (the per-slot window, the byte budget of :mod:`.merge_budget`), and
how each merge is grouped and what it weighs. No I/O and no call into the HTCondor library
(a site's ad is a ``classad2`` value, as :mod:`.render` builds it): the collector publisher,
:mod:`hydrator.adapters.htcondor.collector`, reads the collector, asks these and sends.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

from hydrator.core.merge_budget import MergeBudget
from hydrator.core.slot_coverage import Current, SlotSeen
from hydrator.domain import Site

if TYPE_CHECKING:
    import classad2


@dataclass(frozen=True)
class Target:
    """An ad in the collector that should carry a site's attributes (a slot or a site ad).

    ``digest``/``updated`` are what it carries now (None when missing); ``heard_s`` is the
    collector's ``LastHeardFrom`` (epoch seconds), used to keep site ads alive; ``merged_s``
    its ``DataLocalityMerged`` (:data:`~hydrator.adapters.htcondor.collector.MERGED_ATTRIBUTE`:
    epoch seconds of our last full merge into it, None when missing: never merged, or wiped
    since).
    """

    name: str
    site: Site
    digest: str | None
    updated: int | None
    heard_s: int | None = None
    merged_s: int | None = None


@dataclass(frozen=True)
class Rendered:
    """A site's attributes as sent, with the digest and updated value they carry."""

    ad: classad2.ClassAd
    digest: str
    updated: int

    @cached_property
    def exprs(self) -> list[tuple[str, Any]]:
        """The ad's attributes as (name, expression), looked up once: a lookup copies the
        expression (docs/performance.md), and site ads and merges both need them."""
        return [(key, self.ad.lookup(key)) for key in self.ad]

    @cached_property
    def size_bytes(self) -> int:
        """The ad's old-syntax length: what one full merge of it carries, ``Name`` aside."""
        return len(self.ad.printOld().encode("utf-8"))


def is_current(target: Target, want: Rendered, now_s: float, refresh_s: float) -> bool:
    """True if ``target`` needs no update: same digest, and its updated value is not older than
    ``refresh_s`` while a newer one exists."""
    if target.digest != want.digest or target.updated is None:
        return False
    return target.updated >= want.updated or now_s - target.updated < refresh_s


def plan_merges(
    slots: Sequence[Target], rendered: Mapping[Site, Rendered], now_s: float, refresh_s: float
) -> tuple[list[Target], int]:
    """Slots to merge into (those of a known site that are not current), and how many are
    current. Slots of unknown sites are left alone."""
    todo: list[Target] = []
    current = 0
    for slot in slots:
        want = rendered.get(slot.site)
        if want is None:
            continue
        if is_current(slot, want, now_s, refresh_s):
            current += 1
        else:
            todo.append(slot)
    return todo, current


def may_merge_now(
    slot: Target, want: Rendered, now_s: float, refresh_s: float, min_interval_s: float
) -> bool:
    """False if ``slot`` (not current) waits for a later cycle: it carries our earlier merge
    (``merged_s``) of other lists (an older digest), made less than ``min_interval_s`` ago,
    and its updated value is not older than ``refresh_s`` while ``want``'s is newer. A
    ``merged_s`` in the future (the clock went back) is not trusted: merge now."""
    if slot.merged_s is None or slot.digest is None or slot.digest == want.digest:
        return True
    if not 0 <= now_s - slot.merged_s < min_interval_s:
        return True
    return slot.updated is None or (
        slot.updated < want.updated and now_s - slot.updated >= refresh_s
    )


def defer_merges(
    todo: Sequence[Target],
    rendered: Mapping[Site, Rendered],
    now_s: float,
    refresh_s: float,
    min_interval_s: float,
) -> tuple[list[Target], int]:
    """The slots of ``todo`` (from :func:`plan_merges`) to merge this cycle, and how many
    wait (:func:`may_merge_now`); ``min_interval_s`` 0 defers none."""
    now = [t for t in todo if may_merge_now(t, rendered[t.site], now_s, refresh_s, min_interval_s)]
    return now, len(todo) - len(now)


def within_budget(
    todo: Sequence[Target], rendered: Mapping[Site, Rendered], budget: MergeBudget, now_s: float
) -> tuple[list[Target], int]:
    """The slots of ``todo`` to merge now under the change-merge ``budget``, and how many
    wait: merges into bare slots and slim merges are free; full merges replacing other lists
    are charged their ad's bytes, in order, until the budget is spent."""
    free: list[Target] = []
    charged: list[Target] = []
    for t in todo:
        (free if t.digest is None or slim_merge(t, rendered[t.site]) else charged).append(t)
    allowed = budget.allow([rendered[t.site].size_bytes for t in charged], now_s)
    return free + charged[:allowed], len(charged) - allowed


def cycle_share(
    due: Sequence[Target],
    rendered: Mapping[Site, Rendered],
    budget: MergeBudget,
    now_s: float,
    handed_to_repairs: bool,
) -> tuple[list[Target], int, list[Target]]:
    """Which of the slots ``due`` (not current, not held by the per-slot window) a cycle
    merges itself: (slots to merge, how many the ``budget`` holds back, slots handed to the
    repair looks). Handed to the looks, none is merged nor charged: the next look finds them
    and applies the budget itself (:func:`held_by_budget`), or merges them from the cycle's
    list (:func:`refreshes_due`)."""
    if handed_to_repairs:
        return [], 0, list(due)
    todo, held = within_budget(due, rendered, budget, now_s)
    return todo, held, []


def refreshes_due(
    handed: Sequence[Target], rendered: Mapping[Site, Rendered], found: AbstractSet[str]
) -> list[Target]:
    """Of the slots a cycle handed to the looks, those that carry their site's current lists
    (``rendered``) and need only a newer updated value (:func:`slim_merge`). A look's query
    selects slots by digest and never returns them, so the look merges them from this list;
    left out are slots whose site's lists changed since and those the look ``found`` (by
    name: wiped since, merged in full)."""
    return [
        t
        for t in handed
        if t.name not in found
        and (want := rendered.get(t.site)) is not None
        and slim_merge(t, want)
    ]


def held_by_budget(
    found: Sequence[SlotSeen],
    current: Mapping[Site, Current],
    rendered: Mapping[Site, Rendered],
    budget: MergeBudget,
    now_s: float,
) -> frozenset[str]:
    """Names of the slots a repair look found with older lists of their site (not bare) that
    the change-merge ``budget`` does not let it merge now (:func:`within_budget`)."""
    stale: list[tuple[str, int]] = []
    for slot in found:
        if slot.site is None or slot.digest is None:
            continue
        site = Site(slot.site)
        want = current.get(site)
        if want is not None and slot.digest != want.digest and site in rendered:
            stale.append((slot.name, rendered[site].size_bytes))
    allowed = budget.allow([size for _name, size in stale], now_s)
    return frozenset(name for name, _size in stale[allowed:])


def plan_site_ads(
    existing: Sequence[Target], rendered: Mapping[Site, Rendered], now_s: float, refresh_s: float
) -> tuple[list[Site], list[Site], int]:
    """(sites to advertise, site ads to invalidate, site ads current).

    A site ad is re-sent when missing or not current, and also when the collector last heard
    of it ``refresh_s`` ago (so it never reaches its ``ClassAdLifetime`` while we run). Ads of
    sites no longer in ``rendered`` are invalidated.
    """
    have = {t.site: t for t in existing}
    send: list[Site] = []
    current = 0
    for site, want in sorted(rendered.items()):
        ad = have.get(site)
        fresh = ad is not None and ad.heard_s is not None and now_s - ad.heard_s < refresh_s
        if ad is not None and fresh and is_current(ad, want, now_s, refresh_s):
            current += 1
        else:
            send.append(site)
    gone = sorted(site for site in have if site not in rendered)
    return send, gone, current


def slim_merge(slot: Target, want: Rendered) -> bool:
    """True if ``slot`` already carries ``want``'s lists (same digest, an updated value
    present), so that a merge of the digest and updated attributes alone brings it to
    ``want``. The digest covers every list and the site; merged attributes arrive and are
    wiped together, never one by one."""
    return slot.digest == want.digest and slot.updated is not None


def merged_value(slot: Target, current: Mapping[Site, Current], now_s: float) -> int:
    """The ``DataLocalityMerged`` a full merge into ``slot`` carries
    (:data:`~hydrator.adapters.htcondor.collector.MERGED_ATTRIBUTE`): ``now_s`` when the
    merge changes the lists the slot carries (it starts the ``merge_min_interval_s``
    window); for a bare slot (wiped by its startd's update, or new) the time its site's
    current lists were first published, so that re-sending the same lists after a wipe does
    not hold back the next change any longer than the slots that were never wiped."""
    want = current.get(slot.site)
    if slot.digest is not None or want is None:
        return int(now_s)
    return int(min(want.since_s, now_s))


def merge_groups(
    slots: Sequence[Target],
    rendered: Mapping[Site, Rendered],
    current: Mapping[Site, Current],
    now_s: float,
) -> dict[tuple[Site, bool, int], list[str]]:
    """Slot names by (site, slim, merge time): one template each (:func:`slim_merge`,
    :func:`merged_value`; a slim merge carries no merge time, 0 here)."""
    groups: dict[tuple[Site, bool, int], list[str]] = {}
    for slot in slots:
        slim = slim_merge(slot, rendered[slot.site])
        merged_s = 0 if slim else merged_value(slot, current, now_s)
        groups.setdefault((slot.site, slim, merged_s), []).append(slot.name)
    return groups


SLIM_MERGE_BYTES = 100
"""About what a merge of the digest and updated attributes alone carries (old syntax)."""


def merge_bytes(
    groups: Mapping[tuple[Site, bool, int], Sequence[str]], rendered: Mapping[Site, Rendered]
) -> int:
    """Old-syntax bytes of the merges of ``groups``: each ad's template and its Name."""
    total = 0
    for (site, slim, _), names in groups.items():
        body = SLIM_MERGE_BYTES if slim else rendered[site].size_bytes
        total += sum(body + len(name) for name in names)
    return total


def by_site(targets: Sequence[Target]) -> dict[Site, list[Target]]:
    out: dict[Site, list[Target]] = {}
    for target in targets:
        out.setdefault(target.site, []).append(target)
    return out


def as_target(slot: SlotSeen) -> Target | None:
    """A slot ad with a site attribute as a merge target (None without one)."""
    if slot.site is None:
        return None
    site = Site(slot.site)
    return Target(slot.name, site, slot.digest, slot.updated, slot.heard_s, slot.merged_s)
