"""Slot coverage: which slot ads carry their site's current lists, and which to repair.

Pure: the collector adapter queries and merges, the runtime's repair watch repeats it
(docs/coverage.md). A slot ad *covers* its site when it carries the site's current digest
attribute (the digest names every list of the ad). A startd's own update replaces its slot
ads and so wipes what was merged into them: the slot is then *bare* until merged again. A
slot carrying another digest of its site is *stale*; one held back by ``[collector]
merge_min_interval_s`` (it carries our earlier merge, made less than that long ago) is
*deferred*.

When a slot went without its lists (the repair delay): a bare slot since its ``LastHeardFrom``
(the collector stamps it on each startd update, the update that wiped the merge or, for a
new slot, its first one; merges do not change it); a stale slot since the later of its
``LastHeardFrom`` and the time its site's current digest was first published. Both are
epoch seconds of the collector's clock compared with the daemon's: delays are clamped at 0.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, replace

import classad2

from hydrator.domain import Site

_ATTRIBUTE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,99}")


@dataclass(frozen=True)
class SlotSeen:
    """One slot ad as a coverage query returns it. ``site`` is the raw value of the slot's
    site attribute (None: missing or not a string); ``digest`` its digest attribute;
    ``merged_s`` our last full merge into it (epoch seconds); ``heard_s`` its LastHeardFrom;
    ``updated`` its updated attribute."""

    name: str
    site: str | None
    digest: str | None
    merged_s: int | None = None
    heard_s: int | None = None
    updated: int | None = None


@dataclass(frozen=True)
class Current:
    """A site's current digest and since when it is published (epoch seconds)."""

    digest: str
    since_s: float


@dataclass(frozen=True)
class SiteCoverage:
    """A site's slot ads at one look: ``slots`` in all, of which ``current`` carry its current
    digest, ``bare`` none, ``stale`` another one (to repair), ``deferred`` another one held
    back by ``merge_min_interval_s``."""

    slots: int = 0
    current: int = 0
    bare: int = 0
    stale: int = 0
    deferred: int = 0

    @property
    def ratio(self) -> float:
        """Share of the site's slots carrying its current lists (1.0 when it has none)."""
        return self.current / self.slots if self.slots else 1.0


@dataclass(frozen=True)
class Pending:
    """A slot merged by a repair, remembered until a look finds it covered or gone: if it is
    found uncovered again with the same ``heard_s`` while its site's digest is still the
    ``digest`` merged, the collector did not keep the merge (the slot vanished, or the merge
    was refused). ``attempts``: merges so far; ``retry_s``: not merged again before this
    time (epoch seconds)."""

    heard_s: int | None
    attempts: int
    retry_s: float
    digest: str = ""


@dataclass(frozen=True)
class Repair:
    """One slot to merge now and since when it went without its current lists."""

    slot: SlotSeen
    since_s: float


@dataclass(frozen=True)
class RepairPlan:
    """What one look decided: the slots to merge, the counts of newly found bare and stale
    slots per site (each slot once per episode), merges found not kept (``refused``), slots
    waiting out their back-off, slots of no site of ours, what to remember, and per site
    the slots with older lists the merge budget held back (``held``: deferred)."""

    merge: tuple[Repair, ...] = ()
    found_bare: Mapping[Site, int] = field(default_factory=dict)
    found_stale: Mapping[Site, int] = field(default_factory=dict)
    uncovered: Mapping[Site, tuple[int, int]] = field(default_factory=dict)
    refused: Mapping[Site, int] = field(default_factory=dict)
    backed_off: int = 0
    unknown: int = 0
    pending: Mapping[str, Pending] = field(default_factory=dict)
    held: Mapping[Site, int] = field(default_factory=dict)


def stale_constraint(
    site_attribute: str,
    digest_attribute: str,
    merged_attribute: str,
    current: Mapping[Site, Current],
    deferred_after_s: int | None,
) -> str:
    """A collector constraint selecting the slot ads of ``current``'s sites that lack their
    site's current digest, leaving out those merged by us at or after ``deferred_after_s``
    (epoch seconds; None: leave none out) that still carry a digest (held back by
    ``merge_min_interval_s``). Values are quoted with classad2; attribute names are checked.

    Two list lookups per ad, whatever the number of sites: the site among ours, then
    site and digest joined by a newline among the current pairs (the collector evaluates
    this against every slot ad at every look: one clause per site cost it several times
    more; docs/coverage.md). ``identicalMember`` compares strings case-sensitively, as the
    publisher matches sites."""
    for name in (site_attribute, digest_attribute, merged_attribute):
        if not _ATTRIBUTE.fullmatch(name):
            raise ValueError(f"{name!r} is not a ClassAd attribute name")
    if not current:
        return "false"
    ordered = sorted(current.items())
    sites = ", ".join(classad2.quote(str(site)) for site, _ in ordered)
    pairs = ", ".join(classad2.quote(f"{site}\n{want.digest}") for site, want in ordered)
    covered = (
        f"isString({digest_attribute})"
        f' && identicalMember(strcat({site_attribute}, "\\n", {digest_attribute}), {{{pairs}}})'
    )
    ours = f"identicalMember({site_attribute}, {{{sites}}}) && !({covered})"
    if deferred_after_s is None:
        return ours
    recent = (
        f"{digest_attribute} isnt undefined && {merged_attribute} isnt undefined"
        f" && {merged_attribute} >= {int(deferred_after_s)}"
    )
    return f"({ours}) && !({recent})"


def since_s(slot: SlotSeen, want: Current, now_s: float) -> float:
    """When ``slot`` went without ``want``'s lists (module doc); ``now_s`` when unknown."""
    heard = float(slot.heard_s) if slot.heard_s is not None else None
    if slot.digest is None:
        return heard if heard is not None else now_s
    return max(heard if heard is not None else want.since_s, want.since_s)


def plan_repairs(
    found: Sequence[SlotSeen],
    current: Mapping[Site, Current],
    pending: Mapping[str, Pending],
    now_s: float,
    backoff_s: tuple[float, float],
    *,
    held: AbstractSet[str] = frozenset(),
) -> RepairPlan:
    """Decide one look's repairs from the uncovered slots ``found``; those named in ``held``
    (older lists the merge budget does not let this look replace) are left for a later look
    and counted per site as deferred (``RepairPlan.held``).

    A slot not merged before (or wiped again since: another ``heard_s``; or its site's
    lists changed since: another digest) starts an episode:
    it is counted as found bare or stale and merged. A slot merged by an earlier look and
    found uncovered with the same ``heard_s`` was not kept: counted once as refused, then
    merged again only after a back-off doubling from ``backoff_s[0]`` up to ``backoff_s[1]``
    seconds, so one slot never costs a merge per look. Slots of no site in ``current`` are
    counted in ``unknown``, never merged."""
    merge: list[Repair] = []
    bare: dict[Site, int] = {}
    stale: dict[Site, int] = {}
    uncovered: dict[Site, tuple[int, int]] = {}
    refused: dict[Site, int] = {}
    deferred: dict[Site, int] = {}
    remember: dict[str, Pending] = {}
    waiting = unknown = 0
    for slot in found:
        want = current.get(Site(slot.site)) if slot.site is not None else None
        if want is None or slot.digest == want.digest:
            unknown += want is None
            continue
        site = Site(str(slot.site))
        if slot.name in held:
            deferred[site] = deferred.get(site, 0) + 1
            continue
        b, s = uncovered.get(site, (0, 0))
        uncovered[site] = (b + (slot.digest is None), s + (slot.digest is not None))
        before = pending.get(slot.name)
        if before is None or (before.heard_s, before.digest) != (slot.heard_s, want.digest):
            counts = bare if slot.digest is None else stale
            counts[site] = counts.get(site, 0) + 1
            merge.append(Repair(slot, since_s(slot, want, now_s)))
            remember[slot.name] = Pending(slot.heard_s, 1, now_s + backoff_s[0], want.digest)
            continue
        if before.attempts == 1:
            refused[site] = refused.get(site, 0) + 1
        if now_s < before.retry_s:
            waiting += 1
            remember[slot.name] = before
            continue
        delay = min(backoff_s[1], backoff_s[0] * 2**before.attempts)
        merge.append(Repair(slot, since_s(slot, want, now_s)))
        remember[slot.name] = replace(before, attempts=before.attempts + 1, retry_s=now_s + delay)
    return RepairPlan(
        tuple(merge), bare, stale, uncovered, refused, waiting, unknown, remember, deferred
    )


def census(
    slots: Sequence[SlotSeen], current: Mapping[Site, Current], deferred: Mapping[Site, int]
) -> tuple[dict[Site, SiteCoverage], int, int]:
    """Every slot ad a full look returned, counted per site of ``current``: (coverage per
    site, slots without a site attribute, slots naming no site of ours). ``deferred``: per
    site, the stale slots held back by ``merge_min_interval_s`` (they count as deferred, not
    stale; those the merge budget holds back are counted by each look)."""
    counts: dict[Site, list[int]] = {site: [0, 0, 0, 0] for site in current}
    no_site = unknown = 0
    for slot in slots:
        if slot.site is None:
            no_site += 1
            continue
        want = current.get(Site(slot.site))
        if want is None:
            unknown += 1
            continue
        row = counts[Site(slot.site)]
        row[0] += 1
        if slot.digest == want.digest:
            row[1] += 1
        elif slot.digest is None:
            row[2] += 1
        else:
            row[3] += 1
    out = {}
    for site, (total, ok, bare, other) in counts.items():
        held = min(other, deferred.get(site, 0))
        out[site] = SiteCoverage(total, ok, bare, other - held, held)
    return out, no_site, unknown


def after_look(
    last: Mapping[Site, SiteCoverage],
    uncovered: Mapping[Site, tuple[int, int]],
    held: Mapping[Site, int] | None = None,
) -> dict[Site, SiteCoverage]:
    """Each site's coverage at a repair look, from the last full census ``last``, the
    (bare, stale) slots the look found and those it ``held`` back under the merge budget:
    the look sees only uncovered slots, so the total is the census's (or more, if the look
    found more); deferred slots are the census's (the per-slot window) and the held ones."""
    held = held or {}
    out = {}
    for site in last.keys() | uncovered.keys() | held.keys():
        before = last.get(site, SiteCoverage())
        bare, stale = uncovered.get(site, (0, 0))
        deferred = before.deferred + held.get(site, 0)
        total = max(before.slots, bare + stale + deferred)
        current = max(0, total - bare - stale - deferred)
        out[site] = SiteCoverage(total, current, bare, stale, deferred)
    return out


@dataclass(frozen=True)
class RepairReport:
    """One repair look (``looked`` false: nothing published yet, or merges are off).
    ``returned``: slot ads the query returned; ``merged``/``merge_bytes``: merges sent per
    site and their size (old-syntax bytes); ``delays_s``: per site, how long each merged slot
    went without its lists; ``coverage``: per site at this look; ``without_site`` and
    ``unknown_site``: slot ads without a site attribute, and naming no site of ours, at the
    last full census; ``cycle_merge_bytes``: bytes the cycles' merges sent since the last
    report; ``merge_s``: wall seconds the look spent sending its merges (its query aside)."""

    looked: bool = False
    returned: int = 0
    plan: RepairPlan = RepairPlan()
    merged: Mapping[Site, int] = field(default_factory=dict)
    merge_bytes: Mapping[Site, int] = field(default_factory=dict)
    delays_s: Mapping[Site, tuple[float, ...]] = field(default_factory=dict)
    coverage: Mapping[Site, SiteCoverage] = field(default_factory=dict)
    without_site: int = 0
    unknown_site: int = 0
    cycle_merge_bytes: int = 0
    merge_s: float = 0.0
