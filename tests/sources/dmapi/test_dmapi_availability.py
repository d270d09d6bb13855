"""SRCNet downtimes and force-disabled storage: the DMAPI source against the
fake Site Capabilities API, which answers /nodes as the real one does (elements in downtime or
force-disabled dropped unless ``include_inactive=true``)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone

import requests

from hydrator.config import ClassAdConfig
from hydrator.core.plan import GuardPolicy, plan_cycle
from hydrator.core.ports import FetchContext
from hydrator.core.storage import Drain
from hydrator.domain import DatasetId, ElementCount, Site, Snapshot, State, StorageStatus
from hydrator.runtime.json_views import site_json
from hydrator.runtime.outcome import render_ads
from tests.support.dmapi import MakeSource
from tests.support.fake_dmapi import FakeSrcnet, area, downtime, node, site, storage

NOW = datetime.now(UTC).replace(microsecond=0)  # the fake judges /nodes on the real clock
HOUR = timedelta(hours=1)
AREA_A1 = "0a1b2c3d-0000-4000-8000-00000000a001"
AREA_A2 = "0a1b2c3d-0000-4000-8000-00000000a002"
AREA_B1 = "0a1b2c3d-0000-4000-8000-00000000b001"
AREA_C1 = "0a1b2c3d-0000-4000-8000-00000000c001"
DATASETS = ["ska:only_a1", "ska:a1_and_a2", "ska:only_b1", "ska:only_c1"]


def federation(
    fake: FakeSrcnet,
    *,
    a1_downtimes: list[dict[str, object]] | None = None,
    b_disabled: bool = False,
    c_site_downtimes: list[dict[str, object]] | None = None,
) -> None:
    """SITE_A: one storage with areas A1 and A2; SITE_B: a storage with B1; SITE_C: C1."""
    fake.nodes = [
        node(
            "NODE",
            [
                site(
                    "SITE_A",
                    [
                        storage(
                            [
                                area(AREA_A1, "SITE_A_XRD", downtimes=a1_downtimes),
                                area(AREA_A2, "SITE_A_STORM"),
                            ]
                        )
                    ],
                ),
                site(
                    "SITE_B",
                    [storage([area(AREA_B1, "SITE_B_XRD")], "B_STORE", disabled=b_disabled)],
                ),
                site("SITE_C", [storage([area(AREA_C1, "SITE_C_XRD")])], c_site_downtimes),
            ],
        )
    ]
    fake.add_dataset("ska", "only_a1", ("SITE_A_XRD", AREA_A1))
    fake.add_dataset("ska", "a1_and_a2", ("SITE_A_XRD", AREA_A1), ("SITE_A_STORM", AREA_A2))
    fake.add_dataset("ska", "only_b1", ("SITE_B_XRD", AREA_B1))
    fake.add_dataset("ska", "only_c1", ("SITE_C_XRD", AREA_C1))


def pairs(snapshot: Snapshot) -> set[tuple[str, str]]:
    return {(r.site, r.dataset.name) for r in snapshot.replicas}


def status(snapshot: Snapshot, name: str) -> StorageStatus:
    (found,) = [s for s in snapshot.storages if s.storage == name]
    return found


ALL = {
    ("SITE_A", "only_a1"),
    ("SITE_A", "a1_and_a2"),
    ("SITE_B", "only_b1"),
    ("SITE_C", "only_c1"),
}


def test_a_storage_area_in_a_current_downtime_serves_nothing(
    fake: FakeSrcnet, make_source: MakeSource
) -> None:
    current = downtime(NOW - HOUR, NOW + 2 * HOUR, "Unplanned", "RAID rebuild")
    federation(fake, a1_downtimes=[current])
    wanted = {DatasetId("ska", "only_a1"): 4, DatasetId("ska", "a1_and_a2"): 1}
    snapshot = make_source(datasets=DATASETS).fetch(FetchContext(now=NOW, wanted=wanted))
    assert pairs(snapshot) == ALL - {("SITE_A", "only_a1")}, "also held by A2: stays"
    a1 = status(snapshot, "SITE_A_XRD")
    assert not a1.available and a1.kind == "storage area"
    assert a1.reason is not None and a1.reason.startswith("downtime (Unplanned) until ")
    assert a1.reason.endswith(": RAID rebuild") and a1.until == NOW + 2 * HOUR
    assert a1.wanted == 2, "the wanted datasets it holds (only_a1 and a1_and_a2 are wanted)"
    assert status(snapshot, "SITE_A_STORM").available
    assert "include_inactive=true" in fake.nodes_queries[-1]
    assert Site("SITE_A") in snapshot.sites and snapshot.unmapped == frozenset()


def test_a_future_downtime_is_reported_and_not_applied(
    fake: FakeSrcnet, make_source: MakeSource
) -> None:
    federation(fake, a1_downtimes=[downtime(NOW + 3 * HOUR, NOW + 5 * HOUR)])
    snapshot = make_source(datasets=DATASETS).fetch(FetchContext(now=NOW))
    assert pairs(snapshot) == ALL
    a1 = status(snapshot, "SITE_A_XRD")
    assert a1.available and a1.upcoming is not None
    assert a1.upcoming.startswith("downtime (Planned) from ")


def test_a_force_disabled_storage_and_a_site_downtime_cover_their_areas(
    fake: FakeSrcnet, make_source: MakeSource
) -> None:
    federation(fake, b_disabled=True, c_site_downtimes=[downtime(NOW - HOUR, NOW + HOUR)])
    snapshot = make_source(datasets=DATASETS).fetch(FetchContext(now=NOW))
    assert pairs(snapshot) == {("SITE_A", "only_a1"), ("SITE_A", "a1_and_a2")}
    assert status(snapshot, "SITE_B_XRD").reason == "storage B_STORE is_force_disabled"
    c1 = status(snapshot, "SITE_C_XRD").reason
    assert c1 is not None and c1.startswith("downtime (Planned) of site SITE_C until ")
    assert {Site("SITE_B"), Site("SITE_C")} <= snapshot.sites, "the emptied sites stay known"


def test_the_api_own_answer_drops_inactive_elements(fake: FakeSrcnet) -> None:
    """Why the source asks include_inactive=true: the API's default answer leaves a storage
    in downtime out altogether (its areas would be unmapped, their drop unexplained)."""
    federation(fake, b_disabled=True, a1_downtimes=[downtime(NOW - HOUR, NOW + HOUR)])
    token = fake.issue_token("site-capabilities-api", "site-capabilities-api-service")
    headers = {"Authorization": f"Bearer {token}"}
    default = requests.get(f"{fake.base_url}/nodes", headers=headers, timeout=5).json()
    sites = {s["name"]: s for s in default[0]["sites"]}
    assert "storages" not in sites["SITE_B"], "the disabled storage is gone"
    areas = [a["name"] for a in sites["SITE_A"]["storages"][0]["areas"]]
    assert areas == ["SITE_A_STORM"]


def test_downtime_ending_and_a_drain_of_a_storage_area_through_the_core(
    fake: FakeSrcnet, make_source: MakeSource
) -> None:
    """Cycle by cycle: A1 in downtime (only_a1 leaves SITE_A at once, no shrink-guard hold),
    the downtime over (back), then drained by the operator (gone again)."""
    end = NOW + HOUR
    federation(fake, a1_downtimes=[downtime(NOW - HOUR, end)])
    source = make_source(datasets=DATASETS)
    policy = GuardPolicy(drop_min_entries=1, max_drop_fraction=0.1)
    drain = Drain(Site("SITE_A"), "SITE_A_XRD", "checksum errors", NOW)
    contexts = [
        FetchContext(now=NOW - 2 * HOUR),  # before the downtime
        FetchContext(now=NOW),
        FetchContext(now=end),
        FetchContext(now=end + HOUR, drains=[drain]),
    ]
    state, seen = State(), []
    for context in contexts:
        plan = plan_cycle(state, {"dmapi": source.fetch(context)}, context.now, policy, [drain])
        state = plan.state
        view = plan.sites[Site("SITE_A")]
        seen.append(([d.name for d in view.available], view.unavailable))
    assert seen[0] == (["a1_and_a2", "only_a1"], ())
    assert seen[1][0] == ["a1_and_a2"] and seen[1][1][0].startswith("storage area SITE_A_XRD: ")
    assert seen[2] == (["a1_and_a2", "only_a1"], ())
    assert seen[3] == (
        ["a1_and_a2"],
        ("storage area SITE_A_XRD: drained by the operator: checksum errors",),
    )
    assert fake.counts["nodes"] == 4, "one /nodes read per cycle"


def test_a_storage_area_whose_datasets_vanish_holds_its_site_back_through_the_core(
    fake: FakeSrcnet, make_source: MakeSource
) -> None:
    """SITE_A has A1 (6 datasets) and A2 (14): A1's vanish from the answers while the site as
    a whole loses 30 %, under the site guard's 50 %; A1's own count (6 to 0) holds SITE_A's
    entries back, as a static inventory's table would (``Snapshot.elements``)."""
    federation(fake)
    on_a1 = [f"on_a1_{i}" for i in range(6)]
    for name in on_a1:
        fake.add_dataset("ska", name, ("SITE_A_XRD", AREA_A1))
    on_a2 = [f"on_a2_{i}" for i in range(14)]
    for name in on_a2:
        fake.add_dataset("ska", name, ("SITE_A_STORM", AREA_A2))
    source = make_source(datasets=[f"ska:{n}" for n in on_a1 + on_a2])
    policy = GuardPolicy(site_drop_min_entries=5, site_max_drop_fraction=0.5)
    context = FetchContext(now=NOW)
    first = source.fetch(context)
    assert first.elements == {
        "SITE_A_XRD": ElementCount(Site("SITE_A"), 6),
        "SITE_A_STORM": ElementCount(Site("SITE_A"), 14),
    }
    state = plan_cycle(State(), {"dmapi": first}, NOW, policy, []).state

    for name in on_a1:
        fake.add_dataset("ska", name)  # known, located nowhere now
    second = source.fetch(context)
    assert second.elements == {"SITE_A_STORM": ElementCount(Site("SITE_A"), 14)}
    plan = plan_cycle(state, {"dmapi": second}, NOW, policy, [])
    view = plan.sites[Site("SITE_A")]
    assert sorted(d.name for d in view.available) == sorted(on_a1 + on_a2), "held back"
    (status,) = plan.sources
    assert "storage element SITE_A_XRD: 0 entries against 6" in status.held_sites[Site("SITE_A")]


def offset_downtime(start: datetime, end: datetime, reason: str) -> dict[str, object]:
    """A downtime whose ``date_range`` is written with a +02:00 offset, not in UTC."""
    plus_two = timezone(timedelta(hours=2))
    written = " to ".join(
        t.astimezone(plus_two).isoformat(timespec="minutes") for t in (start, end)
    )
    return {"date_range": written, "type": "Unplanned", "reason": reason, "id": "dt-offset"}


def test_a_downtime_given_with_an_offset_is_shown_in_utc_in_the_ad_and_in_v1(
    fake: FakeSrcnet, make_source: MakeSource
) -> None:
    """A1 down from an hour ago until 10:00 UTC tomorrow, written as 12:00+02:00: the ad's
    reason, /v1/sites' reason and ``until`` all say 10:00 UTC; a future downtime (C's site,
    also written +02:00) says UTC in ``upcoming``."""
    end = (NOW + timedelta(days=1)).replace(hour=10, minute=0, second=0)
    later = end + timedelta(days=2)
    federation(
        fake,
        a1_downtimes=[offset_downtime(NOW - HOUR, end, "power cut")],
        c_site_downtimes=[offset_downtime(later, later + HOUR, "upgrade")],
    )
    snapshot = make_source(datasets=DATASETS).fetch(FetchContext(now=NOW))
    plan = plan_cycle(State(), {"dmapi": snapshot}, NOW, GuardPolicy(), [])
    utc_end = end.strftime("%Y-%m-%dT%H:%MZ")
    expected = f"storage area SITE_A_XRD: downtime (Unplanned) until {utc_end}: power cut"

    ad = render_ads(plan.sites, ClassAdConfig())[Site("SITE_A")].body.decode()
    assert f'DataLocalityUnavailable = "{expected}"' in ad

    doc = json.loads(json.dumps(site_json(plan.sites[Site("SITE_A")])))  # as /v1/sites/SITE_A
    assert doc["unavailable"] == [expected]
    (a1,) = [s for s in doc["storages"] if s["storage"] == "SITE_A_XRD"]
    assert a1["until"] == end.isoformat() and a1["until"].endswith("+00:00")
    (c1,) = site_json(plan.sites[Site("SITE_C")])["storages"]
    start_c = later.strftime("%Y-%m-%dT%H:%MZ")
    assert c1["upcoming"].startswith(f"downtime (Unplanned) of site SITE_C from {start_c} to ")


def test_a_force_disable_and_a_new_downtime_take_effect_in_the_next_cycle(
    fake: FakeSrcnet, make_source: MakeSource
) -> None:
    """Availability statements are fresh within a cycle: with the default configuration, a
    storage force-disabled and a downtime declared between two cycles are in the second
    cycle's ads (not a /nodes cache later); one /nodes request per cycle."""
    federation(fake)
    source = make_source(datasets=DATASETS)  # site_capabilities_ttl_s as configured by default
    state, ads = State(), []
    for cycle in range(2):
        if cycle == 1:  # between the cycles, an unplanned outage and a force-disable
            federation(
                fake,
                a1_downtimes=[downtime(NOW - HOUR, NOW + HOUR, "Unplanned", "flood")],
                b_disabled=True,
            )
        plan = plan_cycle(
            state, {"dmapi": source.fetch(FetchContext(now=NOW))}, NOW, GuardPolicy(), []
        )
        state = plan.state
        ads.append(
            {s: ad.body.decode() for s, ad in render_ads(plan.sites, ClassAdConfig()).items()}
        )
    assert '"ska:only_a1"' in ads[0][Site("SITE_A")] and '"ska:only_b1"' in ads[0][Site("SITE_B")]
    assert '"ska:only_a1"' not in ads[1][Site("SITE_A")], "the new downtime applies"
    assert "downtime (Unplanned) until" in ads[1][Site("SITE_A")]
    assert '"ska:only_b1"' not in ads[1][Site("SITE_B")], "the force-disable applies"
    assert "storage B_STORE is_force_disabled" in ads[1][Site("SITE_B")]
    assert fake.counts["nodes"] == 2
