"""The collector publisher against the real pool: site ads, slot merges, withdrawals, outages.

The pool's startds normally update every 5 s, and each update wipes merged attributes
(docs/platform.md). These tests slow the updates to 600 s so that what they check cannot be wiped
under them, and speed them up again where a wipe is the point.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import classad2
import htcondor2
import pytest

from hydrator.adapters.htcondor.collector import (
    MERGED_ATTRIBUTE,
    SITE_AD_TYPE,
    CollectorPublisher,
    build,
)
from hydrator.config import ClassAdConfig, CollectorConfig
from hydrator.core.ports import PublishReport
from hydrator.core.render import site_classad
from hydrator.domain import Site, SiteView
from hydrator.errors import PublishError
from tests.pool.views import views
from tests.support.pool import IDLE, RUNNING, SLOT_SITES, Pool
from tests.support.wait import wait_for

pytestmark = pytest.mark.pool

ATTRS = ClassAdConfig()
CONTENT = {
    "SITE_A": ["ska:obs_1"],
    "SITE_B": ["ska:obs_2", "ska:skymodel_v3"],
    "SITE_C": ["ska:obs_3"],
}
UPDATES_FRAGMENT = "10-update-interval"


def set_update_interval(pool: Pool, seconds: int) -> None:
    pool.write_config(UPDATES_FRAGMENT, f"UPDATE_INTERVAL = {seconds}\n")
    pool.reconfig()


def wait_until_quiet(pool: Pool, quiet_s: float = 6.0, timeout_s: float = 60.0) -> None:
    """Wait until merged attributes survive ``quiet_s``: the startd has stopped updating (state
    changes, and an update timer armed with the old 5 s interval, wipe merges); ``quiet_s`` is
    longer than that old interval."""
    deadline = time.monotonic() + timeout_s
    for probe in range(1_000_000):
        names = [str(ad["Name"]) for ad in pool.slot_ads()]
        pool.advertise(
            [classad2.ClassAd({"Name": n, "HydratorTestProbe": probe}) for n in names],
            "MERGE_STARTD_AD",
        )
        time.sleep(quiet_s)
        ads = pool.slot_ads(["HydratorTestProbe"])
        if all(ad.get("HydratorTestProbe") == probe for ad in ads):
            return
        assert time.monotonic() < deadline, "the startd keeps updating its ads"


def site_ads(pool: Pool) -> dict[str, classad2.ClassAd]:
    ads = pool.collector.query(
        htcondor2.AdType.Any, f'MyType == "{SITE_AD_TYPE}"', ["Name", "AvailableDatasets"]
    )
    return {str(ad["Name"]): ad for ad in ads}


@pytest.fixture(scope="module")
def dynamic_slot(condor_pool: Pool) -> Iterator[str]:
    """A job running in the partitionable slot4, so that a dynamic slot exists."""
    cluster = condor_pool.submit(
        "executable = /bin/sleep\narguments = 600\noutput = /dev/null\nerror = /dev/null\n"
        'requirements = TARGET.GLIDEIN_Site == "SITE_C" && TARGET.PartitionableSlot =?= true\n'
        "queue\n"
    )
    name = str(condor_pool.wait_for_job_state(cluster, [RUNNING], timeout_s=60)["RemoteHost"])
    condor_pool.wait_for_slots(f"Name == {classad2.quote(name)}", count=1)
    yield name
    condor_pool.run_in_chroot(["condor_rm", str(cluster)], user="submitter", check=False)


@pytest.fixture(scope="module")
def slow_updates(condor_pool: Pool, dynamic_slot: str) -> Iterator[Pool]:
    set_update_interval(condor_pool, 600)
    wait_until_quiet(condor_pool)
    yield condor_pool
    condor_pool.remove_config(UPDATES_FRAGMENT)
    condor_pool.reconfig()
    build(_config(condor_pool), ATTRS).publish({}, frozenset(map(Site, CONTENT)), _now())


def _config(pool: Pool, **overrides: object) -> CollectorConfig:
    """The publisher's configuration; merge_min_interval_s 0 (every cycle) unless overridden."""
    return CollectorConfig.model_validate(
        {"merge_min_interval_s": 0.0, **overrides}
        | {"enabled": True, "pool": pool.collector_address, "token_dir": pool.token_dir}
    )


def _now() -> datetime:
    return datetime.now(UTC)


@pytest.fixture
def publisher(slow_updates: Pool) -> CollectorPublisher:
    return build(_config(slow_updates), ATTRS)


def merged(pool: Pool) -> dict[str, list[str] | None]:
    """Slot name -> its AvailableDatasets (None when missing)."""
    ads = pool.slot_ads(["AvailableDatasets", "DataLocalityDigest"])
    return {str(ad["Name"]): ad.get("AvailableDatasets") for ad in ads}


def landed(
    pool: Pool,
    sites: dict[Site, SiteView],
    looks: CollectorPublisher | None = None,
    since: datetime | None = None,
) -> dict[str, tuple[dict[str, object], ...]]:
    """:func:`carried` once every slot carries its site's attributes (a publish landed).

    With ``looks``, each read follows one of its repair looks (2 s apart, after ``since``), as
    the daemon's watch would: a startd's own update may wipe every merge between the look that
    delivered them and the read."""
    times = itertools.count(2.0, 2.0)

    def read() -> dict[str, tuple[dict[str, object], ...]]:
        if looks is not None:
            looks.repair((since or _now()) + timedelta(seconds=next(times)), 0.5)
        return carried(pool, sites)

    slots = wait_for(
        "every slot carries its site's attributes",
        read,
        done=lambda s: all(h == w for h, w in s.values()),
        timeout_s=10.0,
    )
    for name, (has, want) in slots.items():
        assert has == want, name
    return slots


def test_site_ads_and_every_slot_carry_the_site_lists(
    slow_updates: Pool, publisher: CollectorPublisher, dynamic_slot: str
) -> None:
    pool = slow_updates
    report = publisher.publish(views(CONTENT), frozenset(), _now())

    def lists() -> dict[str, list[str]]:
        return {name: list(ad["AvailableDatasets"]) for name, ad in site_ads(pool).items()}

    assert wait_for("site ads' lists", lists, done=CONTENT.__eq__, timeout_s=10.0) == CONTENT
    shown = pool.run_in_chroot(
        ["condor_status", "-any", "-constraint", 'MyType == "DataLocality"', "-af", "Name"]
    ).stdout.split()
    assert sorted(shown) == sorted(CONTENT)

    slots = wait_for(
        "every slot merged", lambda: merged(pool), done=lambda s: all(s.values()), timeout_s=10.0
    )
    assert dynamic_slot in slots  # slot4_1@host, carved out of the partitionable slot4
    for name, available in slots.items():
        site = SLOT_SITES[name.split("@")[0].split("_")[0]]
        assert available == CONTENT[site], name
    assert report.sent == {"site_ad": 3, "merge": len(slots)}


def slot_site(name: str) -> Site:
    return Site(SLOT_SITES[name.split("@")[0].split("_")[0]])


def carried(pool: Pool, sites: dict[Site, SiteView]) -> dict[str, tuple[dict[str, object], ...]]:
    """Slot name -> (the site attributes it carries, those of its site's rendered ad)."""
    want = {site: site_classad(view, ATTRS) for site, view in sites.items()}
    keys = sorted({k for ad in want.values() for k in ad})
    out: dict[str, tuple[dict[str, object], ...]] = {}
    for ad in pool.slot_ads(keys):
        name = str(ad["Name"])
        site_ad = want[slot_site(name)]
        out[name] = ({k: ad.get(k) for k in keys}, {k: site_ad.get(k) for k in keys})
    return out


def test_merges_from_reused_ads_carry_exactly_the_rendered_attributes(
    slow_updates: Pool, dynamic_slot: str
) -> None:
    """batch_size 2: SITE_C's three slots (slot3, slot4, slot4_1) take two advertise calls
    that send the same two ads, the second time under another Name."""
    publisher = build(_config(slow_updates, batch_size=2), ATTRS)
    sites = views({site: [*names, "ska:obs_reused"] for site, names in CONTENT.items()})
    report = publisher.publish(sites, frozenset(), _now())
    slots = landed(slow_updates, sites)
    assert report.sent == {"site_ad": 3, "merge": len(slots)}
    assert sum(slot_site(n) == "SITE_C" for n in slots) == 3


def test_refresh_of_an_unchanged_site_moves_updated_and_keeps_its_lists(
    slow_updates: Pool, publisher: CollectorPublisher, dynamic_slot: str
) -> None:
    """A slot that carries the site's digest is sent the digest and updated value only."""
    pool = slow_updates
    content = {site: [*names, "ska:obs_refresh"] for site, names in CONTENT.items()}
    before = _now() - timedelta(seconds=3000)
    before_s = int(before.timestamp()) // ATTRS.updated_resolution_s * ATTRS.updated_resolution_s
    publisher.publish(first := views(content, now=before), frozenset(), before)
    landed(pool, first)
    # another writer changes slot1's list behind the digest: a slim refresh does not restore it
    # (a startd update, or the site's next change, does)
    one = next(n for n in merged(pool) if n.startswith("slot1@"))
    pool.advertise(
        [classad2.ClassAd({"Name": one, "AvailableDatasets": ["ska:other"]})], "MERGE_STARTD_AD"
    )
    assert wait_for(
        "the foreign merge", lambda: merged(pool)[one], done=["ska:other"].__eq__, timeout_s=10.0
    ) == ["ska:other"]
    sites = views(content)
    report = publisher.publish(sites, frozenset(), _now())

    def refreshed(slots: dict[str, tuple[dict[str, object], ...]]) -> bool:
        return all(
            has[ATTRS.updated_attribute] == want[ATTRS.updated_attribute]
            for has, want in slots.values()
        )

    slots = wait_for(
        "every slot refreshed", lambda: carried(pool, sites), done=refreshed, timeout_s=10.0
    )
    assert report.sent == {"site_ad": 3, "merge": len(slots)}
    for name, (has, want) in slots.items():
        assert has[ATTRS.updated_attribute] == want[ATTRS.updated_attribute] != before_s, name
        if name == one:
            assert has == dict(want, AvailableDatasets=["ska:other"])
        else:
            assert has == want, name


def test_second_publish_without_change_sends_nothing(
    slow_updates: Pool, publisher: CollectorPublisher, dynamic_slot: str
) -> None:
    sites = views(CONTENT)
    publisher.publish(sites, frozenset(), _now())
    landed(slow_updates, sites)
    again = publisher.publish(sites, frozenset(), _now())
    assert again.sent == {}
    assert again.skipped_current == len(merged(slow_updates)) + len(CONTENT)


def test_changed_site_re_merges_only_its_slots(
    slow_updates: Pool, publisher: CollectorPublisher, dynamic_slot: str
) -> None:
    publisher.publish(sites := views(CONTENT), frozenset(), _now())
    landed(slow_updates, sites)
    changed = dict(CONTENT, SITE_A=["ska:obs_1", "ska:obs_9"])
    report = publisher.publish(sites := views(changed), frozenset(), _now())
    assert report.sent == {"site_ad": 1, "merge": 1}  # slot1 is SITE_A's only slot
    slot1 = next(n for n in merged(slow_updates) if n.startswith("slot1@"))
    assert landed(slow_updates, sites)[slot1][0]["AvailableDatasets"] == changed["SITE_A"]


def wipe_merges(pool: Pool) -> dict[str, list[str] | None]:
    """Let the startd update its ads once (which wipes every merged attribute), then slow it
    down again; returns :func:`merged` afterwards (every value None)."""
    set_update_interval(pool, 5)
    deadline = time.monotonic() + 30
    while any(merged(pool).values()) and time.monotonic() < deadline:
        time.sleep(0.5)
    set_update_interval(pool, 600)
    wait_until_quiet(pool)
    wiped = merged(pool)
    assert not any(wiped.values())
    return wiped


def test_slots_wiped_by_the_startd_update_are_re_merged(
    slow_updates: Pool, publisher: CollectorPublisher, dynamic_slot: str
) -> None:
    pool = slow_updates
    sites = views(CONTENT)
    publisher.publish(sites, frozenset(), _now())
    landed(pool, sites)
    one = next(n for n in merged(pool) if n.startswith("slot2@"))
    # another writer left an outdated digest in slot2 only
    pool.advertise(
        [classad2.ClassAd({"Name": one, "DataLocalityDigest": "outdated"})], "MERGE_STARTD_AD"
    )

    def digest() -> object:
        return carried(pool, sites)[one][0][ATTRS.digest_attribute]

    assert (
        wait_for("the outdated digest", digest, done="outdated".__eq__, timeout_s=10.0)
        == "outdated"
    )
    assert publisher.publish(sites, frozenset(), _now()).sent == {"merge": 1}

    wiped = wipe_merges(pool)
    report = publisher.publish(sites, frozenset(), _now())
    assert report.sent == {"merge": len(wiped)}
    # (whether they still carry them a moment later depends on the startd's next update; the
    # first test shows merges landing)


INTERVAL_S = 300


def publish_at(pool: Pool, content: dict[str, list[str]], at: datetime) -> PublishReport:
    """One cycle at ``at`` by a new publisher with merge_min_interval_s = INTERVAL_S, as a
    restarted daemon: when it last merged a slot it learns from the collector alone."""
    publisher = build(_config(pool, merge_min_interval_s=INTERVAL_S), ATTRS)
    return publisher.publish(views(content, now=at), frozenset(), at)


def slot_lists(pool: Pool, prefix: str) -> tuple[list[str] | None, int | None]:
    """(AvailableDatasets, DataLocalityMerged) of the slot whose name starts with ``prefix``."""
    ad = next(
        a
        for a in pool.slot_ads(["AvailableDatasets", MERGED_ATTRIBUTE])
        if a["Name"].startswith(prefix)
    )
    available = ad.get("AvailableDatasets")
    return (list(available) if available is not None else None), ad.get(MERGED_ATTRIBUTE)


def test_interval_defers_a_changed_slot_until_it_has_passed(
    slow_updates: Pool, dynamic_slot: str
) -> None:
    """SITE_A changes 60 s after slot1 was merged: its site ad follows at once, slot1 keeps
    the old lists until merge_min_interval_s after its merge, then gets the new ones."""
    pool = slow_updates
    before = {site: [*names, "ska:obs_interval"] for site, names in CONTENT.items()}
    after = dict(before, SITE_A=[*before["SITE_A"], "ska:obs_new"])
    t0 = _now().replace(microsecond=0)
    build(_config(pool), ATTRS).publish(first := views(before, now=t0), frozenset(), t0)
    landed(pool, first)  # every slot
    assert slot_lists(pool, "slot1@") == (before["SITE_A"], int(t0.timestamp()))

    soon = publish_at(pool, after, t0 + timedelta(seconds=60))
    assert (soon.sent, soon.deferred) == ({"site_ad": 1}, 1)

    def site_a() -> list[str]:
        return list(site_ads(pool)["SITE_A"]["AvailableDatasets"])

    assert (
        wait_for("SITE_A's site ad list", site_a, done=after["SITE_A"].__eq__, timeout_s=10.0)
        == after["SITE_A"]
    )
    assert slot_lists(pool, "slot1@") == (before["SITE_A"], int(t0.timestamp()))

    almost = publish_at(pool, after, t0 + timedelta(seconds=INTERVAL_S - 1))
    assert (almost.sent, almost.deferred) == ({}, 1)
    due = t0 + timedelta(seconds=INTERVAL_S)
    report = publish_at(pool, after, due)
    assert (report.sent, report.deferred) == ({"merge": 1}, 0)
    merged_due = (after["SITE_A"], int(due.timestamp()))
    assert (
        wait_for(
            "slot1 merged at the due time",
            lambda: slot_lists(pool, "slot1@"),
            done=merged_due.__eq__,
            timeout_s=10.0,
        )
        == merged_due
    )


def test_interval_merges_wiped_slots_at_once(slow_updates: Pool, dynamic_slot: str) -> None:
    """Within the interval a changed slot waits; once its startd's update wiped it, it is
    merged at the next cycle with the current lists, like every other wiped slot."""
    pool = slow_updates
    before = {site: [*names, "ska:obs_wipe"] for site, names in CONTENT.items()}
    after = dict(before, SITE_B=["ska:obs_wipe_new"])
    t0 = _now().replace(microsecond=0)
    build(_config(pool), ATTRS).publish(first := views(before, now=t0), frozenset(), t0)
    landed(pool, first)
    assert publish_at(pool, after, t0 + timedelta(seconds=10)).deferred == 1  # slot2 waits

    wiped = wipe_merges(pool)
    report = publish_at(pool, after, t0 + timedelta(seconds=20))
    assert (report.sent, report.deferred) == ({"merge": len(wiped)}, 0)
    assert dynamic_slot in wiped
    # the startd is slow again (600 s), so what was merged is still there
    want = {name: after[slot_site(name)] for name in wiped}
    assert (
        wait_for(
            "the wiped slots merged again", lambda: merged(pool), done=want.__eq__, timeout_s=10.0
        )
        == want
    )


def test_a_repaired_wipe_does_not_hold_back_the_next_change(
    slow_updates: Pool, dynamic_slot: str
) -> None:
    """A repair look gives a wiped slot back the lists it lost; that is no change of its
    lists, so the next change still reaches it merge_min_interval_s after the change that
    put those lists there, not after the repair (and then from a repair look: the trailing
    edge, with no cycle in between)."""
    pool = slow_updates
    before = {site: [*names, "ska:obs_repaired"] for site, names in CONTENT.items()}
    after = dict(before, SITE_A=[*before["SITE_A"], "ska:obs_repaired_new"])
    t0 = _now().replace(microsecond=0)
    publisher = build(_config(pool, merge_min_interval_s=INTERVAL_S), ATTRS)
    publisher.publish(first := views(before, now=t0), frozenset(), t0)
    landed(pool, first)

    wiped = wipe_merges(pool)
    repaired = publisher.repair(t0 + timedelta(seconds=20), 1.0)
    assert sum(repaired.merged.values()) == len(wiped)
    kept = (before["SITE_A"], int(t0.timestamp()))  # the lists' own time, not the repair's
    assert (
        wait_for(
            "slot1 repaired", lambda: slot_lists(pool, "slot1@"), done=kept.__eq__, timeout_s=10.0
        )
        == kept
    )

    changed = views(after, now=t0 + timedelta(seconds=60))
    soon = publisher.publish(changed, frozenset(), t0 + timedelta(seconds=60))
    assert (soon.sent, soon.deferred) == ({"site_ad": 1}, 1)
    due = t0 + timedelta(seconds=INTERVAL_S + 1)  # the first look with the window over
    assert sum(publisher.repair(due - timedelta(seconds=1), 1.0).merged.values()) == 0
    assert publisher.repair(due, 1.0).merged == {Site("SITE_A"): 1}
    merged_due = (after["SITE_A"], int(due.timestamp()))
    assert (
        wait_for(
            "slot1 changed",
            lambda: slot_lists(pool, "slot1@"),
            done=merged_due.__eq__,
            timeout_s=10.0,
        )
        == merged_due
    )


def test_interval_jobs_match_what_the_slot_ads_say(slow_updates: Pool, dynamic_slot: str) -> None:
    """As documented (deploy/README.md): within the interval a job needing a dataset that
    SITE_A just lost still matches SITE_A's slot, and one needing a dataset SITE_B just gained
    waits for slot2's re-merge, then runs there."""
    pool = slow_updates
    before = {"SITE_A": ["ska:obs_going"], "SITE_B": ["ska:obs_2"], "SITE_C": ["ska:obs_3"]}
    after = dict(before, SITE_A=["ska:obs_1"], SITE_B=["ska:obs_2", "ska:obs_coming"])
    t0 = _now().replace(microsecond=0)
    build(_config(pool), ATTRS).publish(first := views(before, now=t0), frozenset(), t0)
    landed(pool, first)
    assert publish_at(pool, after, t0 + timedelta(seconds=10)).deferred == 2
    job = "executable = /bin/sleep\narguments = 600\noutput = /dev/null\nerror = /dev/null\n"
    need = 'requirements = identicalMember("{}", TARGET.AvailableDatasets)\nqueue\n'
    going = pool.submit(job + need.format("ska:obs_going"))
    coming = pool.submit(job + need.format("ska:obs_coming"))
    try:
        ran = pool.wait_for_job_state(going, [RUNNING], timeout_s=60)
        assert pool.job_site(ran) == "SITE_A"  # the slot ad still lists what SITE_A lost
        rejected = wait_for_rejection(pool, coming)
        assert int(rejected["JobStatus"]) == IDLE  # nothing lists obs_coming yet

        publish_at(pool, after, t0 + timedelta(seconds=INTERVAL_S))
        ran = pool.wait_for_job_state(coming, [RUNNING], timeout_s=60)
        assert pool.job_site(ran) == "SITE_B"
    finally:
        for cluster in (going, coming):
            pool.run_in_chroot(["condor_rm", str(cluster)], user="submitter", check=False)
        released = 'regexp("^slot[12]@", Name) && State == "Unclaimed"'
        pool.wait_for_slots(released, count=2, timeout_s=60)
        wait_until_quiet(pool)


def wait_for_rejection(pool: Pool, cluster: int, timeout_s: float = 60.0) -> classad2.ClassAd:
    """The job's ad once a negotiation cycle found no slot for it (``LastRejMatchTime``)."""
    ad = wait_for(
        f"a negotiation cycle rejecting job {cluster}",
        lambda: pool.job_ad(cluster, ["LastRejMatchTime"]),
        done=lambda ad: ad is not None and ad.get("LastRejMatchTime") is not None,
        timeout_s=timeout_s,
        interval_s=0.5,
    )
    assert ad is not None
    return ad


def test_removed_site_ad_is_invalidated(slow_updates: Pool, publisher: CollectorPublisher) -> None:
    publisher.publish(views(CONTENT), frozenset(), _now())
    assert wait_for(
        "every site ad",
        lambda: sorted(site_ads(slow_updates)),
        done=[*CONTENT].__eq__,
        timeout_s=10.0,
    ) == [*CONTENT]
    without_b = {k: v for k, v in CONTENT.items() if k != "SITE_B"}
    report = publisher.publish(views(without_b), frozenset({Site("SITE_B")}), _now())
    assert report.sent.get("invalidate") == 1
    left = ["SITE_A", "SITE_C"]
    assert (
        wait_for(
            "SITE_B's site ad invalidated",
            lambda: sorted(site_ads(slow_updates)),
            done=left.__eq__,
            timeout_s=10.0,
        )
        == left
    )


def test_publish_without_token_is_refused(slow_updates: Pool) -> None:
    """A MERGE without NEGOTIATOR authorization fails loudly instead of vanishing.

    Runs in a fresh process: this one caches security sessions made with the token."""
    script = (
        "from datetime import UTC, datetime\n"
        "from hydrator.config import ClassAdConfig, CollectorConfig\n"
        "from hydrator.errors import PublishError\n"
        "from hydrator.adapters.htcondor.collector import build\n"
        "from tests.pool.views import views\n"
        f"config = CollectorConfig(enabled=True, pool={slow_updates.collector_address!r},"
        " token_dir='/nonexistent', site_ads=False, merge_min_interval_s=0)\n"
        "try:\n"
        "    build(config, ClassAdConfig()).publish(views({'SITE_A': ['ska:x']}), frozenset(),"
        " datetime.now(UTC))\n"
        "except PublishError as exc:\n"
        "    print('refused:', exc)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if not k.startswith("_CONDOR_")},
    ).stdout
    assert out.startswith("refused: "), out
    assert "MERGE_STARTD_AD" in out


def test_collector_down_raises_publish_error_promptly(
    slow_updates: Pool, publisher: CollectorPublisher
) -> None:
    pool = slow_updates
    pool.daemon_off("collector")
    try:
        started = time.monotonic()
        with pytest.raises(PublishError):
            publisher.publish(views(CONTENT), frozenset(), _now())
        assert time.monotonic() - started < 5
    finally:
        set_update_interval(pool, 5)  # so the startd re-advertises soon after the restart
        pool.daemon_on("collector")
        pool.wait_for_slots("true", timeout_s=60)
        set_update_interval(pool, 600)
    # the first publish after the restart works, although sessions cached for the old
    # collector are stale
    assert publisher.publish(views(CONTENT), frozenset(), _now()).sent.get("site_ad") == 3


def _defaults(pool: Pool, **overrides: object) -> CollectorConfig:
    """The publisher's configuration at the shipped defaults (window, budget), but for the
    pool's address and token."""
    return CollectorConfig.model_validate(
        {**overrides, "enabled": True, "pool": pool.collector_address, "token_dir": pool.token_dir}
    )


def test_at_the_defaults_a_change_soon_after_the_last_reaches_the_slots_at_once(
    slow_updates: Pool, dynamic_slot: str
) -> None:
    """Events change a site's lists seconds apart. At the shipped defaults the second change
    is merged into the slots at once (no per-slot window holds it back), with the startd not
    updating in between (600 s), as a production startd at UPDATE_INTERVAL 300 s would not."""
    pool = slow_updates
    before = {site: [*names, "ska:obs_soon"] for site, names in CONTENT.items()}
    after = dict(before, SITE_A=[*before["SITE_A"], "ska:obs_soon_new"])
    t0 = _now().replace(microsecond=0)
    publisher = build(_defaults(pool), ATTRS)
    publisher.publish(first := views(before, now=t0), frozenset(), t0)
    landed(pool, first)
    t1 = t0 + timedelta(seconds=10)
    report = publisher.publish(views(after, now=t1), frozenset(), t1)
    assert (report.sent, report.deferred) == ({"site_ad": 1, "merge": 1}, 0)
    want = (after["SITE_A"], int(t1.timestamp()))
    assert (
        wait_for(
            "slot1 changed", lambda: slot_lists(pool, "slot1@"), done=want.__eq__, timeout_s=10.0
        )
        == want
    )


def test_the_merge_budget_spreads_a_change_over_the_looks_after_it_refilled(
    slow_updates: Pool, dynamic_slot: str
) -> None:
    """A budget whose minute's worth is one and a half SITE_C ads: the change's cycle merges
    one of SITE_C's three slots and holds two back (deferred); the looks after it merge one
    more each time the bucket has refilled to a whole ad (0.025 ads a second: at 30 s and
    70 s after the cycle, none at 10 s and 50 s); then every slot carries the new lists."""
    pool = slow_updates
    before = {site: [*names, "ska:obs_budget"] for site, names in CONTENT.items()}
    after = dict(before, SITE_C=[*before["SITE_C"], "ska:obs_budget_new"])
    t0 = _now().replace(microsecond=0)
    build(_config(pool), ATTRS).publish(first := views(before, now=t0), frozenset(), t0)
    landed(pool, first)
    t1 = t0 + timedelta(seconds=10)
    changed = views(after, now=t1)
    size = len(site_classad(changed[Site("SITE_C")], ATTRS, says_available=True).printOld())
    publisher = build(_defaults(pool, merge_budget_bytes_per_s=1.5 * size / 60), ATTRS)
    report = publisher.publish(changed, frozenset(), t1)
    assert (report.sent, report.deferred) == ({"site_ad": 1, "merge": 1}, 2)
    looks = [publisher.repair(t1 + timedelta(seconds=s), 1.0) for s in (10, 30, 50, 70)]
    assert [sum(look.merged.values()) for look in looks] == [0, 1, 0, 1]
    on_c = [name for name in merged(pool) if slot_site(name) == "SITE_C"]
    want = dict.fromkeys(on_c, after["SITE_C"])
    assert (
        wait_for(
            "every SITE_C slot changed",
            lambda: {n: merged(pool)[n] for n in on_c},
            done=want.__eq__,
            timeout_s=10.0,
        )
        == want
    )


def digests(pool: Pool) -> dict[str, object]:
    """Slot name -> the digest attribute it carries (None when missing)."""
    return {
        str(ad["Name"]): ad.get(ATTRS.digest_attribute)
        for ad in pool.slot_ads([ATTRS.digest_attribute])
    }


def site_ad_digest(pool: Pool, site: str) -> object:
    ads = pool.collector.query(
        htcondor2.AdType.Any,
        f"MyType == {classad2.quote(SITE_AD_TYPE)} && Name == {classad2.quote(site)}",
        ["Name", ATTRS.digest_attribute],
    )
    return ads[0].get(ATTRS.digest_attribute) if ads else None


@pytest.mark.parametrize("handed", [True, False], ids=["handed-to-looks", "cycle-merges"])
def test_handed_to_the_looks_a_change_reaches_the_slots_by_the_next_look_not_the_cycle(
    slow_updates: Pool, dynamic_slot: str, handed: bool
) -> None:
    """With the repair watch scheduled (``hand_merges_to_repairs``) a publish sends site ads
    and no slot merge: right after a publish that changes SITE_C's lists its site ad carries
    the new digest and its slots (slot3, slot4, slot4_1) the old one; the next repair look
    merges them all. Without the hand-over (``hydrator once``, no watch) the publish merges
    them itself and the look after it finds nothing to do."""
    pool = slow_updates
    before = {site: [*names, f"ska:obs_handed_{handed}"] for site, names in CONTENT.items()}
    after = dict(before, SITE_C=[*before["SITE_C"], "ska:obs_handed_new"])
    on_c = sorted(n for n in merged(pool) if slot_site(n) == "SITE_C")
    assert len(on_c) == 3
    t0 = _now().replace(microsecond=0)
    publisher = build(_defaults(pool), ATTRS)
    if handed:
        publisher.hand_merges_to_repairs()
    first = publisher.publish(views(before, now=t0), frozenset(), t0)
    count = len(merged(pool))
    if not handed:
        # The collector may answer a query before it applied merges sent just before it: the
        # look must find the cycle's own merges there, or it repeats them. (The daemon runs
        # looks only with the hand-over, so a cycle's merges never meet a look.)
        landed(pool, views(before, now=t0))
    look = publisher.repair(t0 + timedelta(seconds=0.5), 0.5)
    assert (first.sent.get("merge", 0), first.handed) == ((0, count) if handed else (count, 0))
    assert sum(look.merged.values()) == (count if handed else 0)
    landed(pool, views(before, now=t0))

    t1 = t0 + timedelta(seconds=10)
    changed = views(after, now=t1)
    new, old = changed[Site("SITE_C")].digest, views(before, now=t0)[Site("SITE_C")].digest
    report = publisher.publish(changed, frozenset(), t1)
    if handed:
        assert (report.sent, report.deferred, report.handed) == ({"site_ad": 1}, 0, 3)
        wait_for(
            "SITE_C's new site ad",
            lambda: site_ad_digest(pool, "SITE_C"),
            done=new.__eq__,
            timeout_s=10.0,
        )
        assert {n: digests(pool)[n] for n in on_c} == dict.fromkeys(on_c, old)
    else:
        assert (report.sent, report.deferred, report.handed) == ({"site_ad": 1, "merge": 3}, 0, 0)
        wait_for(
            "the cycle's merges into SITE_C's slots",
            lambda: {n: digests(pool)[n] for n in on_c},
            done=dict.fromkeys(on_c, new).__eq__,
            timeout_s=10.0,
        )
    look = publisher.repair(t1 + timedelta(seconds=0.5), 0.5)
    assert look.merged == ({Site("SITE_C"): 3} if handed else {})
    wanted = dict.fromkeys(on_c, new)
    assert (
        wait_for(
            "SITE_C's slots carry the new digest",
            lambda: {n: digests(pool)[n] for n in on_c},
            done=wanted.__eq__,
            timeout_s=10.0,
        )
        == wanted
    )
    landed(pool, changed, looks=publisher, since=t1)


def test_handed_to_the_looks_a_refresh_of_an_unchanged_site_is_sent_by_the_next_look(
    slow_updates: Pool, dynamic_slot: str
) -> None:
    """The slots carry the site's current lists with an updated value older than refresh_s:
    the publish (hand-over on) sends the site ads only; the look's query does not return
    these slots (they carry the current digest), and the look sends their slim merges from
    the cycle's list: every slot then carries the new updated value."""
    pool = slow_updates
    content = {site: [*names, "ska:obs_handed_refresh"] for site, names in CONTENT.items()}
    before = _now() - timedelta(seconds=3000)
    build(_config(pool), ATTRS).publish(first := views(content, now=before), frozenset(), before)
    landed(pool, first)
    publisher = build(_defaults(pool), ATTRS)
    publisher.hand_merges_to_repairs()
    t1 = _now()
    report = publisher.publish(sites := views(content, now=t1), frozenset(), t1)
    count = len(merged(pool))
    assert (report.sent, report.handed) == ({"site_ad": 3}, count)
    look = publisher.repair(t1 + timedelta(seconds=0.5), 0.5)
    assert (look.returned, sum(look.merged.values())) == (0, count)
    landed(pool, sites, looks=publisher, since=t1)
